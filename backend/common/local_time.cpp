// strftime in local time; see local_time.hpp.
#include "backend/common/local_time.hpp"

namespace common {

std::string format_local_time(std::time_t time, const char* format) {
  std::tm local{};
  localtime_r(&time, &local);
  char buffer[64];
  const size_t length = std::strftime(buffer, sizeof buffer, format, &local);
  return std::string(buffer, length);
}

}  // namespace common
