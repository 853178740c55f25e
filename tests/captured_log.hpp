// Routes spdlog's default logger into a string for a test's duration, so that a test can check
// what a function logged ("[level] message" lines), and restores the previous logger after.
#pragma once

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>

namespace test_support {

struct CapturedLog {
  std::ostringstream text;
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  CapturedLog() {
    auto logger = std::make_shared<spdlog::logger>(
        "captured", std::make_shared<spdlog::sinks::ostream_sink_mt>(text));
    logger->set_pattern("[%l] %v");
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
};

}  // namespace test_support
