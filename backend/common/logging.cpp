// One logging setup for all executables; see logging.hpp.
#include "backend/common/logging.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>

#include "backend/common/error.hpp"
#include "backend/common/write_all.hpp"

namespace common {

namespace {
constexpr const char* kPattern = "[%Y-%m-%d %H:%M:%S] [%n] [%l] %v";
}

void setup_logging(std::string_view program_name, std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    fail("log level '{}' is not valid (valid: trace, debug, info, warn, error, off)", level);
  }
  auto logger = std::make_shared<spdlog::logger>(
      std::string(program_name), std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  logger->set_pattern(kPattern);
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

void add_log_file(const std::filesystem::path& file) {
  try {
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file.string(), false);
    sink->set_pattern(kPattern);
    spdlog::default_logger()->sinks().push_back(sink);
  } catch (const spdlog::spdlog_ex& e) {
    fail("cannot open log file {}: {}", file.string(), e.what());
  }
}

void log_warnings_only() { spdlog::default_logger()->set_level(spdlog::level::warn); }

void log_errors_only() {
  spdlog::default_logger()->set_level(spdlog::level::err);
}

void print_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text.append(line).push_back('\n');
  std::cout.flush();
  std::fflush(stdout);
  // A closed stdout loses the output, as std::cout would.
  (void)write_all(STDOUT_FILENO, text.data(), text.size());
}

}  // namespace common
