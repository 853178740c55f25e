// The benchmark table from benchmark.json files, and the errors for missing or bad files.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "backend/common/error.hpp"
#include "launcher/run_report.hpp"

using namespace launcher;
namespace fs = std::filesystem;

TEST_CASE("runs are tabulated side by side — missing and malformed reports are named") {
  const fs::path base = fs::temp_directory_path() / "run_report_test";
  fs::remove_all(base);
  for (const auto& [name, ms] : {std::pair{"gpt3_126m", 812.5}, std::pair{"gpt3_126m_mbs8", 1500.0}}) {
    fs::create_directories(base / name / "results");
    std::ofstream(base / name / "results" / "benchmark.json") << fmt::format(
        R"({{"model": {{"num_layers": 12, "hidden_size": 768, "seq_length": 256}},
            "batch": {{"micro_batch_size": 4, "global_batch_size": 8}},
            "parallel": {{"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                          "data_parallel_size": 1}},
            "device": "cpu", "median_step_ms": {}, "tokens_per_second": 2520.6,
            "tflops_per_device": 0.123, "mfu": 0.71, "peak_memory_bytes": 2.5e9}})",
        ms);
  }
  std::ostringstream table;
  print_report({find_benchmark_file(base / "gpt3_126m"), find_benchmark_file(base / "gpt3_126m_mbs8")},
               table);
  CHECK(table.str().find("| gpt3_126m | 12 × 768 | 256 | 4 / 8 | 1 × 1 × 1 | cpu | 812.5 | 2520.6 | "
                         "0.123 | 71.0% | 2.50 GB |") != std::string::npos);
  CHECK(table.str().find("| gpt3_126m_mbs8 |") != std::string::npos);

  fs::create_directories(base / "no_benchmark");
  CHECK_THROWS_WITH_AS(find_benchmark_file(base / "no_benchmark"),
                       doctest::Contains("data_impl=mock"), common::Error);
  std::ofstream(base / "broken.json") << R"({"model": {}})";
  std::ostringstream ignored;
  CHECK_THROWS_WITH_AS(print_report({base / "broken.json"}, ignored),
                       doctest::Contains("not a benchmark report"), common::Error);
  fs::remove_all(base);
}
