// write_script: a job script appears whole or not at all, also when several writers (threads
// here, launcher processes in tests/e2e/launcher_concurrency_test.cpp) write the same script at
// once; a fixed "<script>.tmp" name used to let one writer rename another's file away.
#include "launcher/clusters/script_template.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/common/error.hpp"
#include "temporary_directory.hpp"

namespace fs = std::filesystem;

TEST_CASE("concurrent write_script calls of one script each leave a whole script, never fail") {
  test_support::TemporaryDirectory temporary;
  const fs::path script = temporary.path / "job_submission.sh";
  constexpr int kWriters = 8;
  constexpr int kWrites = 40;
  std::vector<std::string> texts;
  for (int writer = 0; writer < kWriters; ++writer) {
    // Large enough that writes overlap; each writer's text is recognisable throughout.
    texts.push_back("#!/usr/bin/env bash\n" + std::string(64 * 1024, static_cast<char>('a' + writer)) +
                    "\n");
  }
  std::vector<std::string> failures(kWriters);
  std::vector<std::thread> threads;
  for (int writer = 0; writer < kWriters; ++writer) {
    threads.emplace_back([&, writer] {
      for (int i = 0; i < kWrites; ++i) {
        try {
          launcher::write_script(script, texts[writer]);
        } catch (const std::exception& error) {
          failures[writer] = error.what();
          return;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& failure : failures) CHECK(failure.empty());
  std::ifstream in(script);
  std::stringstream written;
  written << in.rdbuf();
  bool whole = false;
  for (const auto& text : texts) whole = whole || written.str() == text;
  CHECK(whole);
  CHECK((fs::status(script).permissions() & fs::perms::owner_exec) != fs::perms::none);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(temporary.path)) {
    names.push_back(entry.path().filename().string());
  }
  CHECK(names == std::vector<std::string>{"job_submission.sh"});  // no temporary file left
}

TEST_CASE("write_script into a directory that does not exist names the script") {
  test_support::TemporaryDirectory temporary;
  const fs::path script = temporary.path / "missing" / "job_submission.sh";
  CHECK_THROWS_WITH_AS(launcher::write_script(script, "x"),
                       doctest::Contains(("cannot write " + script.string()).c_str()),
                       common::Error);
}
