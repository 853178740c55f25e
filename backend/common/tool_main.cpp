// The exit statuses of every backend executable; see tool_main.hpp.
#include "backend/common/tool_main.hpp"

#include <spdlog/spdlog.h>

#include <exception>
#include <iostream>

#include "backend/common/error.hpp"

namespace common {

int run_tool(const std::function<int()>& body, const std::function<int(int)>& on_failure) {
  int status = 0;
  try {
    return body();
  } catch (const common::Error& error) {
    std::cout.flush();
    spdlog::error("{}", error.what());
    status = 2;
  } catch (const std::exception& error) {
    std::cout.flush();
    spdlog::critical("internal error (please report): {}", error.what());
    status = 3;
  }
  return on_failure ? on_failure(status) : status;
}

}  // namespace common
