// One logging setup for all executables; see logging.hpp.
#include "backend/common/logging.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>

#include "backend/common/error.hpp"

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

void print_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text.append(line).push_back('\n');
  std::cout.flush();
  std::fflush(stdout);
  const char* data = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t written = ::write(STDOUT_FILENO, data, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;  // a closed stdout loses the output, as std::cout would
    data += written;
    left -= static_cast<size_t>(written);
  }
}

}  // namespace common
