// Local wall-clock time as text, for log lines and directory names: the one strftime wrapper.
#pragma once

#include <ctime>
#include <string>

namespace common {

// strftime(format) of `time` in the local time zone, e.g. "%Y-%m-%d %H:%M:%S" as Megatron's
// datetime.now().strftime prints it.
std::string format_local_time(std::time_t time, const char* format = "%Y-%m-%d %H:%M:%S");

}  // namespace common
