// `launcher report <run> [<run> ...]`: the benchmark.json files that benchmark-mode runs leave
// (backend/train/benchmark_report.hpp) as one table, runs side by side: shape, batch,
// parallel layout, median step time, tokens/s, TFLOP/s per device, MFU, peak memory.
#pragma once

#include <filesystem>
#include <ostream>
#include <vector>

namespace launcher {

// The benchmark.json below a run directory (results/benchmark.json, or the newest one found
// up to three levels down, e.g. a multirun's <run>/<k>/results/); common::Error if none.
std::filesystem::path find_benchmark_file(const std::filesystem::path& run_dir);

void print_report(const std::vector<std::filesystem::path>& benchmark_files, std::ostream& out);

}  // namespace launcher
