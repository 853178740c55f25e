// The one logging setup (spdlog) for every executable. Diagnostics go through spdlog with
// a timestamped pattern; the program's own output lines (Megatron's iteration lines,
// validation blocks) are printed verbatim by the code that owns that format, not through
// this logger, because users and tools parse them.
#pragma once

#include <spdlog/spdlog.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace common {

// Sets the default logger: stderr, "[YYYY-MM-DD HH:MM:SS] [name] [level] message".
// `level` is one of trace, debug, info, warn, error (unknown → common::Error).
void setup_logging(std::string_view program_name, std::string_view level = "info");

// Also write every log line to `file` (appending), e.g. results/<run>/launcher.log.
void add_log_file(const std::filesystem::path& file);

// On ranks other than the first of a multi-process run: info lines are left out, warnings
// and errors still logged. Megatron prints its setup lines on rank 0 alone (print_rank_0), so
// N ranks do not say the same thing N times; a rank's own trouble still shows.
void log_warnings_only();
// While a step whose warnings every rank derives alike runs (the flags' checks), ranks other
// than the first log errors only: rank 0 says each warning once; log_warnings_only() after.
void log_errors_only();

// Prints `lines` (each ended by '\n') to stdout in one write(2), after flushing what std::cout
// and stdio hold. A block such as the arguments dump, printed line by line through a buffered
// stdout, left it in pieces when the buffer filled, and log lines written to stderr in between
// (one file, in a Slurm job's output) landed inside it; one write keeps it whole.
void print_lines(const std::vector<std::string>& lines);

}  // namespace common
