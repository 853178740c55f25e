// The benchmark table; see run_report.hpp.
#include "launcher/run_report.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>


#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"

namespace launcher {

namespace fs = std::filesystem;

fs::path find_benchmark_file(const fs::path& run_dir) {
  std::error_code error;  // a path the file system refuses is reported below as having no report
  if (fs::is_regular_file(run_dir, error)) return run_dir;
  if (fs::is_regular_file(run_dir / "results" / "benchmark.json", error)) {
    return run_dir / "results" / "benchmark.json";
  }
  fs::path newest;
  fs::file_time_type newest_time{};
  for (auto it = fs::recursive_directory_iterator(run_dir, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (it.depth() > 3) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->path().filename() != "benchmark.json") continue;
    std::error_code time_error;
    const fs::file_time_type time = it->last_write_time(time_error);
    if (!time_error && time > newest_time) {
      newest = it->path();
      newest_time = time;
    }
  }
  if (newest.empty()) {
    common::fail("{}: no benchmark.json (a benchmark run uses training.model.data.data_impl=mock "
                 "and training.trainer.limit_val_batches=0)", run_dir.string());
  }
  return newest;
}

BenchmarkResult read_benchmark(const fs::path& file) {
  const std::string text = common::read_small_file(file, "the benchmark report");
  BenchmarkResult result;
  try {
    const nlohmann::json report = nlohmann::json::parse(text);
    const auto& model = report.at("model");
    const auto& batch = report.at("batch");
    const auto& parallel = report.at("parallel");
    const fs::path run = file.parent_path().filename() == "results" ? file.parent_path().parent_path()
                                                                    : file.parent_path();
    result.run = run.filename().string();
    result.num_layers = model.at("num_layers").get<int64_t>();
    result.hidden_size = model.at("hidden_size").get<int64_t>();
    result.seq_length = model.at("seq_length").get<int64_t>();
    result.micro_batch_size = batch.at("micro_batch_size").get<int64_t>();
    result.global_batch_size = batch.at("global_batch_size").get<int64_t>();
    result.tensor_parallel = parallel.at("tensor_model_parallel_size").get<int64_t>();
    result.pipeline_parallel = parallel.at("pipeline_model_parallel_size").get<int64_t>();
    result.data_parallel = parallel.at("data_parallel_size").get<int64_t>();
    result.device = report.at("device").get<std::string>();
    result.median_step_ms = report.at("median_step_ms").get<double>();
    result.tokens_per_second = report.at("tokens_per_second").get<double>();
    result.tflops_per_device = report.at("tflops_per_device").get<double>();
    result.mfu = report.at("mfu").get<double>();
    result.peak_memory_bytes = report.at("peak_memory_bytes").get<double>();
  } catch (const nlohmann::json::exception& error) {
    common::fail("{}: not a benchmark report: {}", file.string(), error.what());
  }
  return result;
}

void print_report(const std::vector<fs::path>& files, std::ostream& out) {
  out << "| run | layers × hidden | seq | mbs / gbs | tp × pp × dp | device | ms / iteration | "
         "tokens/s | TFLOP/s / device | MFU | peak memory |\n";
  out << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& file : files) {
    const BenchmarkResult result = read_benchmark(file);
    out << fmt::format(
        "| {} | {} × {} | {} | {} / {} | {} × {} × {} | {} | {:.1f} | {:.1f} | {:.3f} | {:.1f}% | "
        "{:.2f} GB |\n",
        result.run, result.num_layers, result.hidden_size, result.seq_length,
        result.micro_batch_size, result.global_batch_size, result.tensor_parallel,
        result.pipeline_parallel, result.data_parallel, result.device, result.median_step_ms,
        result.tokens_per_second, result.tflops_per_device, 100.0 * result.mfu,
        result.peak_memory_bytes / 1e9);
  }
}

}  // namespace launcher
