// run_tool: the exit statuses and messages every backend executable ends with.
#include "backend/common/tool_main.hpp"

#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <stdexcept>

#include "backend/common/error.hpp"
#include "captured_log.hpp"

using test_support::CapturedLog;

TEST_CASE("run_tool passes the body's status through and logs nothing") {
  CapturedLog log;
  CHECK(common::run_tool([] { return 0; }) == 0);
  CHECK(common::run_tool([] { return 1; }) == 1);
  CHECK(log.text.str().empty());
}

TEST_CASE("run_tool: a user error is status 2 with its message, a bug is status 3") {
  CapturedLog log;
  CHECK(common::run_tool([]() -> int { common::fail("--lr must be > 0, got {}", -1); }) == 2);
  CHECK(log.text.str() == "[error] --lr must be > 0, got -1\n");
  log.text.str("");
  CHECK(common::run_tool([]() -> int { throw std::logic_error("index 7 out of range"); }) == 3);
  CHECK(log.text.str() == "[critical] internal error (please report): index 7 out of range\n");
}

TEST_CASE("run_tool hands the failure status to on_failure, whose return is the status") {
  CapturedLog log;
  int seen = -1;
  const auto abort_job = [&seen](int status) {
    seen = status;
    return status + 10;
  };
  CHECK(common::run_tool([]() -> int { common::fail("bad"); }, abort_job) == 12);
  CHECK(seen == 2);
  seen = -1;
  CHECK(common::run_tool([] { return 0; }, abort_job) == 0);
  CHECK(seen == -1);  // not called on success
}
