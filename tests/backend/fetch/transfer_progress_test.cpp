// Transfer progress: sizes and durations as printed, a log gets one line per tenth of a known
// size (not one per chunk), a terminal gets a status line redrawn in place at most ten times a
// second with the rate and ETA of the recent window, and notes erase the status line first.
#include "backend/fetch/transfer_progress.hpp"

#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

using backend::ProgressMode;
using backend::TransferProgress;

TEST_CASE("format_bytes and format_duration print as curl and wget do") {
  CHECK(backend::format_bytes(0) == "0 B");
  CHECK(backend::format_bytes(1023) == "1023 B");
  CHECK(backend::format_bytes(1024) == "1.0 KiB");
  CHECK(backend::format_bytes(int64_t(412) << 20) == "412.0 MiB");
  CHECK(backend::format_bytes(int64_t(1288490189)) == "1.2 GiB");
  CHECK(backend::format_duration(7) == "0:07");
  CHECK(backend::format_duration(83) == "1:23");
  CHECK(backend::format_duration(3723) == "1:02:03");
  CHECK(backend::format_duration(-1) == "--:--");
}

TEST_CASE("in a log, progress is one line per tenth of the file, whatever the chunk size") {
  std::ostringstream terminal;
  std::vector<std::string> lines;
  TransferProgress progress(ProgressMode::kLog, "shard.jsonl.xz", terminal,
                            [&](const std::string& line) { lines.push_back(line); });
  const int64_t total = 1000000;
  progress.start(0, total, 0.0);
  for (int64_t done = 0; done <= total; done += 997) progress.update(done, static_cast<double>(done) / 100000.0);
  progress.update(total, 10.0);
  progress.finish(total, 10.0);
  // The same transfer in 0.45 s logs no tenths: lines at most twice a second.
  std::vector<std::string> fast_lines;
  TransferProgress fast(ProgressMode::kLog, "fast", terminal,
                        [&](const std::string& line) { fast_lines.push_back(line); });
  fast.start(0, total, 0.0);
  for (int64_t done = 0; done <= total; done += 997) fast.update(done, static_cast<double>(done) / 2.2e6);
  fast.finish(total, 0.45);
  CHECK(fast_lines.size() == 1);
  CHECK(terminal.str().empty());  // nothing is redrawn in a log
  REQUIRE(lines.size() == 11);    // 10 %, 20 %, ..., 100 %, and the summary
  // The first update past 100 000 B is at 100 697 B (steps of 997), at 100 000 B/s.
  CHECK(lines[0] == "shard.jsonl.xz  98.3 KiB / 976.6 KiB  10.1%  97.7 KiB/s  ETA 0:09");
  CHECK(lines[9] == "shard.jsonl.xz  976.6 KiB / 976.6 KiB  100.0%  97.7 KiB/s  ETA 0:00");
  CHECK(lines[10] == "shard.jsonl.xz: 976.6 KiB in 0:10 (97.7 KiB/s)");
}

TEST_CASE("a resumed transfer logs from the next tenth above what is already there") {
  std::ostringstream terminal;
  std::vector<std::string> lines;
  TransferProgress progress(ProgressMode::kLog, "f", terminal, [&](const std::string& line) { lines.push_back(line); });
  progress.start(650, 1000, 0.0);
  for (int64_t done = 650; done <= 1000; done += 10) progress.update(done, static_cast<double>(done));
  REQUIRE(lines.size() == 4);  // 70 %, 80 %, 90 %, 100 %
  CHECK(lines[0].find("70.0%") != std::string::npos);
}

TEST_CASE("on a terminal the status line is redrawn in place, at most ten times a second") {
  std::ostringstream terminal;
  std::vector<std::string> lines;
  TransferProgress progress(ProgressMode::kTerminal, "f.bin", terminal,
                            [&](const std::string& line) { lines.push_back(line); });
  const int64_t total = int64_t(100) << 20;
  progress.start(0, total, 0.0);
  // 1 MiB every 10 ms for one second: 100 updates, about 10 redraws.
  for (int step = 1; step <= 100; ++step) progress.update(int64_t(step) << 20, step * 0.01);
  const std::string drawn = terminal.str();
  size_t redraws = 0;
  for (size_t at = drawn.find('\r'); at != std::string::npos; at = drawn.find('\r', at + 1)) ++redraws;
  CHECK(redraws >= 9);
  CHECK(redraws <= 11);
  CHECK(drawn.find('\n') == std::string::npos);
  // Once the window spans 0.2 s the rate is the steady 100 MiB/s, and the ETA under a second.
  CHECK(drawn.find(" / 100.0 MiB  ") != std::string::npos);
  CHECK(drawn.find("%  100.0 MiB/s  ETA 0:0") != std::string::npos);
  CHECK(lines.empty());
  progress.note("retrying");
  CHECK(terminal.str().ends_with("\r\x1b[K"));  // the status line is erased before the note
  REQUIRE(lines.size() == 1);
  progress.finish(total, 1.0);
  CHECK(terminal.str().ends_with("\rf.bin  100.0 MiB / 100.0 MiB  100.0%  100.0 MiB/s  ETA 0:00\x1b[K\n"));
}

TEST_CASE("the rate follows the recent window, so the ETA reflects the current speed") {
  std::ostringstream terminal;
  TransferProgress progress(ProgressMode::kNone, "f", terminal, [](const std::string&) {});
  progress.start(0, -1, 0.0);
  // 10 s at 1 MB/s, then 10 s at 10 MB/s: the window sees only the fast part.
  int64_t done = 0;
  for (int tick = 1; tick <= 100; ++tick) progress.update(done += 100000, tick * 0.1);
  for (int tick = 101; tick <= 200; ++tick) progress.update(done += 1000000, tick * 0.1);
  CHECK(progress.rate() == doctest::Approx(1e7).epsilon(0.05));
  CHECK(terminal.str().empty());
}
