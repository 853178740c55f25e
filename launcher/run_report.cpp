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

void print_report(const std::vector<fs::path>& files, std::ostream& out) {
  out << "| run | layers × hidden | seq | mbs / gbs | tp × pp × dp | device | ms / iteration | "
         "tokens/s | TFLOP/s / device | MFU | peak memory |\n";
  out << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& file : files) {
    const std::string text = common::read_small_file(file, "the benchmark report");
    nlohmann::json report;
    try {
      report = nlohmann::json::parse(text);
      const auto& model = report.at("model");
      const auto& batch = report.at("batch");
      const auto& parallel = report.at("parallel");
      // The run's name: the directory above results/.
      const fs::path run = file.parent_path().filename() == "results" ? file.parent_path().parent_path()
                                                                      : file.parent_path();
      out << fmt::format(
          "| {} | {} × {} | {} | {} / {} | {} × {} × {} | {} | {:.1f} | {:.1f} | {:.3f} | {:.1f}% | "
          "{:.2f} GB |\n",
          run.filename().string(), model.at("num_layers").get<int64_t>(),
          model.at("hidden_size").get<int64_t>(), model.at("seq_length").get<int64_t>(),
          batch.at("micro_batch_size").get<int64_t>(), batch.at("global_batch_size").get<int64_t>(),
          parallel.at("tensor_model_parallel_size").get<int64_t>(),
          parallel.at("pipeline_model_parallel_size").get<int64_t>(),
          parallel.at("data_parallel_size").get<int64_t>(), report.at("device").get<std::string>(),
          report.at("median_step_ms").get<double>(), report.at("tokens_per_second").get<double>(),
          report.at("tflops_per_device").get<double>(), 100.0 * report.at("mfu").get<double>(),
          report.at("peak_memory_bytes").get<double>() / 1e9);
    } catch (const nlohmann::json::exception& error) {
      common::fail("{}: not a benchmark report: {}", file.string(), error.what());
    }
  }
}

}  // namespace launcher
