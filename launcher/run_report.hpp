// `launcher report <run> [<run> ...]`: the benchmark.json files that benchmark-mode runs leave
// (backend/train/log/benchmark_report.hpp) as one table, runs side by side: shape, batch,
// parallel layout, median step time, tokens/s, TFLOP/s per device, MFU, peak memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

namespace launcher {

// The benchmark.json below a run directory (results/benchmark.json, or the newest one found
// up to three levels down, e.g. a multirun's <run>/<k>/results/); common::Error if none.
std::filesystem::path find_benchmark_file(const std::filesystem::path& run_dir);

// One benchmark.json's numbers (the fields backend/train/log/benchmark_report.cpp writes).
struct BenchmarkResult {
  std::string run;  // the directory above results/
  int64_t num_layers = 0, hidden_size = 0, seq_length = 0;
  int64_t micro_batch_size = 0, global_batch_size = 0;
  int64_t tensor_parallel = 0, pipeline_parallel = 0, data_parallel = 0;
  std::string device;
  double median_step_ms = 0, tokens_per_second = 0, tflops_per_device = 0, mfu = 0;
  double peak_memory_bytes = 0;
};

// common::Error naming the file when it cannot be read or is not a benchmark report.
BenchmarkResult read_benchmark(const std::filesystem::path& benchmark_file);

void print_report(const std::vector<std::filesystem::path>& benchmark_files, std::ostream& out);

}  // namespace launcher
