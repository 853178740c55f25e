// Megatron's iteration lines read back: the plotted values of a job log, and the progress and
// ETA that `launcher status` and `launcher logs -f` show for a running job.
#include <doctest/doctest.h>

#include "temporary_directory.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "launcher/iteration_log.hpp"
#include "launcher/run_status.hpp"

using namespace launcher;
namespace fs = std::filesystem;

namespace {

// A job log as pretrain_gpt writes it (backend/train/log/training_log.cpp, Megatron's format).
std::string iteration_line(int64_t iteration, int64_t total, double milliseconds, double loss) {
  return fmt::format(
      " [2026-11-27 13:00:{:02d}] iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time "
      "per iteration (ms): {:.1f} | throughput per GPU (TFLOP/s/GPU): 1.5 | learning rate: "
      "6.000000E-04 | global batch size:     4 | lm loss: {:.6E} | loss scale: 1.0 | grad norm: "
      "3.250 | number of skipped iterations:   0 | number of nan iterations:   1 |\n",
      iteration % 60, iteration, total, iteration * 4, milliseconds, loss);
}

const char* kThroughputLine =
    " throughput: 1520.8 tokens/s | MFU: 36.5% of the measured 0.170 TFLOP/s sgemm peak |\n";

const char* kValidationBlock =
    "-----------------------------------------------------------------------------------------\n"
    " validation loss at iteration 20 on validation set | lm loss value: 8.750000E+00 | lm loss "
    "PPL: 6.310688E+03 | \n"
    "-----------------------------------------------------------------------------------------\n";

}  // namespace

TEST_CASE("an iteration line's fields are read by Megatron's keys") {
  const auto line = parse_iteration_line(iteration_line(20, 100, 812.5, 9.123456));
  REQUIRE(line.has_value());
  CHECK(line->iteration == 20);
  CHECK(line->train_iters == 100);
  CHECK(line->fields.at("elapsed time per iteration (ms)") == 812.5);
  CHECK(line->fields.at("lm loss") == doctest::Approx(9.123456));
  CHECK(line->fields.at("learning rate") == doctest::Approx(6e-4));
  CHECK(line->fields.at("number of nan iterations") == 1);
  CHECK_FALSE(parse_iteration_line(" validation loss at iteration 20 on validation set | lm loss value: 1 |"));
  CHECK_FALSE(parse_iteration_line("building GPT model ..."));
  CHECK_FALSE(parse_iteration_line(" iteration x/y | lm loss: 1 |"));
}

TEST_CASE("a job log gives the series the report plots") {
  const std::string log = "> building GPT model ...\n" + iteration_line(10, 100, 800, 9.5) +
                          kThroughputLine + iteration_line(20, 100, 1000, 9.0) + kValidationBlock;
  const auto values = parse_job_log(log);
  auto find = [&values](const std::string& tag, int64_t iteration) -> double {
    for (const auto& value : values) {
      if (value.tag == tag && value.iteration == iteration) return value.value;
    }
    FAIL("no " << tag << " at " << iteration);
    return 0;
  };
  CHECK(find("lm loss", 10) == doctest::Approx(9.5));
  CHECK(find("lm loss", 20) == doctest::Approx(9.0));
  CHECK(find("iteration-time", 20) == doctest::Approx(1.0));
  CHECK(find("throughput", 10) == doctest::Approx(1.5));
  CHECK(find("grad-norm", 10) == doctest::Approx(3.25));
  CHECK(find("tokens/s", 10) == doctest::Approx(1520.8));
  CHECK(find("mfu", 10) == doctest::Approx(0.365));
  CHECK(find("nan iterations", 20) == 1);
  CHECK(find("lm loss validation", 20) == doctest::Approx(8.75));
}

TEST_CASE("progress: the newest iteration line and an ETA from the recent step times") {
  std::string log;
  for (int iteration = 1; iteration <= 8; ++iteration) {
    // The first lines are slow (warm-up); the ETA uses the last five: 100 ms each.
    log += iteration_line(iteration * 10, 1000, iteration <= 3 ? 5000.0 : 100.0, 9.0);
  }
  log += " [2026-11-27 13:00:00] iteration       9"; // a line still being written
  const auto progress = find_progress(log);
  REQUIRE(progress.has_value());
  CHECK(progress->iteration == 80);
  CHECK(progress->train_iters == 1000);
  REQUIRE(progress->seconds_left.has_value());
  CHECK(*progress->seconds_left == doctest::Approx(920 * 0.1));
  CHECK(format_progress(*progress) == "80/1000 (8%), ETA 1m 32s");
  CHECK(format_progress({3600, 10000, 6400.0 * 1.3}) == "3600/10000 (36%), ETA 2h 18m");
  CHECK(format_progress({5, 10, std::nullopt}) == "5/10 (50%)");
  CHECK_FALSE(find_progress("> building GPT model ...\n").has_value());
}

TEST_CASE("launcher status shows a running job's progress from its log") {
  test_support::TemporaryDirectory run;
  const fs::path log_file = run.path / "log-gpt3_126m_1.out";
  std::ofstream(log_file) << iteration_line(40, 200, 250.0, 8.0) << kThroughputLine;
  // A local job that lives (this test process) and has written no exit status: RUNNING.
  append_job_record(run.path, {"training", "local", std::to_string(getpid()), run.path / "s.sh",
                               log_file, std::nullopt, 100});
  // A finished one shows no progress.
  append_job_record(run.path, {"conversion", "local", "1", run.path / "c.sh", log_file, 0, 200});
  std::ostringstream table;
  print_status({run.path}, table);
  INFO(table.str());
  CHECK(table.str().find("progress") != std::string::npos);
  CHECK(table.str().find("RUNNING") != std::string::npos);
  CHECK(table.str().find("40/200 (20%), ETA 40s") != std::string::npos);
  CHECK(job_progress(read_job_records(run.path)[1], "COMPLETED") == "-");

  // A running job whose log has no iteration line yet (or no log at all): no progress.
  std::ofstream(log_file, std::ios::trunc) << "> building GPT model ...\n";
  CHECK(job_progress(read_job_records(run.path)[0], "RUNNING") == "-");
  fs::remove(log_file);
  CHECK(job_progress(read_job_records(run.path)[0], "RUNNING") == "-");
}
