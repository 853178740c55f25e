// Job records round-trip, malformed records are named, local job states come from the
// recorded exit status, and run directories are found by path or by name.
#include <doctest/doctest.h>

#include "temporary_directory.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/common/error.hpp"
#include "launcher/run_status.hpp"

using namespace launcher;
namespace fs = std::filesystem;

namespace {
using test_support::TemporaryDirectory;
}  // namespace

TEST_CASE("job records are appended and read back in order") {
  TemporaryDirectory base;
  const fs::path run = base.path / "gpt3_126m";
  fs::create_directories(run);
  append_job_record(run, {"training", "local", "4242", run / "s.sh", run / "log-x_4242.out", 0, 100});
  append_job_record(run, {"conversion", "local", "4243", run / "c.sh", run / "log-c_4243.out", 127, 200});
  append_job_record(run, {"training", "bcm", "17", run / "s.sh", run / "log-x_17.out", std::nullopt, 300});
  const auto records = read_job_records(run);
  REQUIRE(records.size() == 3);
  CHECK(records[0].job_id == "4242");
  CHECK(records[1].exit_code == 127);
  CHECK_FALSE(records[2].exit_code.has_value());
  CHECK(records[2].submitted_at == 300);
  CHECK(query_job_state(records[0]) == "COMPLETED");
  CHECK(query_job_state(records[1]) == "FAILED (exit 127)");

  CHECK(resolve_run_dir("gpt3_126m", base.path) == run);
  CHECK(resolve_run_dir(run.string(), "/nowhere") == run);
  CHECK(find_run_dirs(base.path) == std::vector<fs::path>{run});
  CHECK_THROWS_WITH_AS(resolve_run_dir("gpt3_5b", base.path),
                       doctest::Contains("runs there: gpt3_126m"), common::Error);

  std::ostringstream table;
  print_status({run}, table);
  CHECK(table.str().find("conversion") != std::string::npos);
  CHECK(table.str().find("FAILED (exit 127)") != std::string::npos);
}

TEST_CASE("a malformed record names its file and line — logs need a log file") {
  TemporaryDirectory base;
  std::ofstream(base.path / "jobs.jsonl") << "{\"stage\": \"training\"}\n";
  CHECK_THROWS_WITH_AS(read_job_records(base.path), doctest::Contains("jobs.jsonl:1: not a job record"),
                       common::Error);
  CHECK_THROWS_WITH_AS(read_job_records(base.path / "missing"), doctest::Contains("no job records"),
                       common::Error);
  std::ofstream(base.path / "jobs.jsonl", std::ios::trunc)
      << "{\"stage\":\"training\",\"cluster\":\"k8s\",\"job_id\":\"j\",\"script\":\"s\","
         "\"log_file\":\"\",\"submitted_at\":1}\n";
  std::ostringstream out;
  CHECK_THROWS_WITH_AS(print_logs(base.path, false, out), doctest::Contains("no job of this run has a log"),
                       common::Error);
}

TEST_CASE("run names the file system refuses and bytes that are not UTF-8 are no internal error") {
  TemporaryDirectory base;
  const std::string long_name(100'000, 'a');
  CHECK_THROWS_WITH_AS(resolve_run_dir(long_name, base.path),
                       doctest::Contains("is neither a results directory"), common::Error);
  // A path from an environment variable (${oc.env:...}) need not be UTF-8; JSON must be.
  const fs::path run = base.path / "run";
  fs::create_directories(run);
  append_job_record(run, {"training", "local", "1", run / "s\xff.sh", run / "log.out", 0, 1});
  const auto records = read_job_records(run);
  REQUIRE(records.size() == 1);
  CHECK(records[0].script == run / "s\xef\xbf\xbd.sh");  // U+FFFD, as JSON writers replace it
  JobRecord weird{"training", "local", long_name, run / "s.sh", {}, std::nullopt, 1};
  CHECK(query_job_state(weird).starts_with("unknown"));
}
