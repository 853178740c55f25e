// Keeps launch_main's logging quiet while a test launches in-process, and drops the
// launcher.log sinks each launch adds (they point into the test's temporary directories).
#pragma once

#include <spdlog/spdlog.h>

#include <cstddef>

namespace test_support {

struct QuietLogger {
  spdlog::level::level_enum level = spdlog::default_logger()->level();
  std::size_t sinks = spdlog::default_logger()->sinks().size();
  QuietLogger() { spdlog::default_logger()->set_level(spdlog::level::off); }
  ~QuietLogger() {
    drop_added_sinks();
    spdlog::default_logger()->set_level(level);
  }
  QuietLogger(const QuietLogger&) = delete;
  QuietLogger& operator=(const QuietLogger&) = delete;
  void drop_added_sinks() { spdlog::default_logger()->sinks().resize(sinks); }
};

}  // namespace test_support
