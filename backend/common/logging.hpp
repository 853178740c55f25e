// The one logging setup (spdlog) for every executable. Diagnostics go through spdlog with
// a timestamped pattern; the program's own output lines (Megatron's iteration lines,
// validation blocks) are printed verbatim by the code that owns that format, not through
// this logger, because users and tools parse them.
#pragma once

#include <spdlog/spdlog.h>

#include <filesystem>
#include <string_view>

namespace common {

// Sets the default logger: stderr, "[YYYY-MM-DD HH:MM:SS] [name] [level] message".
// `level` is one of trace, debug, info, warn, error (unknown → common::Error).
void setup_logging(std::string_view program_name, std::string_view level = "info");

// Also write every log line to `file` (appending), e.g. results/<run>/launcher.log.
void add_log_file(const std::filesystem::path& file);

}  // namespace common
