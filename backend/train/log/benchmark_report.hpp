// Benchmark mode's result file (--benchmark-output FILE, our extension; the launcher passes it
// when a run uses mock data and no validation, Megatron's "benchmark mode"): one JSON object
// with the median step time over the iterations after the first (warm-up), tokens/s, model
// TFLOP/s per device by Megatron's num_floating_point_operations, MFU against the device's
// measured peak, peak resident memory and the parallel layout. `launcher report` tabulates
// these files side by side.
//
// Megatron's FLOPs per iteration for a dense GPT (forward + backward):
//   12·B·s·L·h²·[(1 + g/a + s/(2h))·(kv·a/h) + (ffn/h)·(1.5 if SwiGLU else 1)] + 6·B·s·h·V
// with B the global batch, g/a query groups over heads (1 for MHA), kv·a/h = 1 for MHA.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"
#include "backend/model/model_arguments.hpp"
#include "backend/train/log/logging_arguments.hpp"

namespace backend {

// Model FLOPs of one iteration (global batch) by Megatron's formula.
double megatron_flops_per_iteration(const ModelArguments& model, int64_t global_batch_size,
                                    int64_t padded_vocab_size);

// Megatron's "throughput per GPU (TFLOP/s/GPU)" (--log-throughput): the FLOPs of one
// iteration of `batch_size` samples (the formula is linear in the batch, so a ramp-up batch
// scales it) over the seconds per iteration, 10^12 and the run's world size.
double megatron_throughput_tflops_per_gpu(const LoggedRun& run, int64_t batch_size,
                                          double seconds_per_iteration);

// Single-precision GEMM throughput of this CPU through the same OpenBLAS path the model uses
// (a 2048³ sgemm, best of three), in FLOP/s: the peak MFU is measured against.
double measure_cpu_sgemm_peak();

// The GEMM throughput of `device` in `type` through its linear op (cuBLASLt on a GPU): an
// 8192 × 8192 × 8192 product, as PyTorch's peak in tests/bench/pytorch_gpu_reference.py, on
// non-zero values (zeros run faster than data), the best of three rounds of four after a
// warm-up, in FLOP/s. Allocates its three matrices for the measurement only: call it at setup.
double measure_device_gemm_peak(Device& device, ElementType type);

struct BenchmarkSummary {
  double median_step_ms = 0;
  double tokens_per_second = 0;
  double tflops_per_device = 0;
  double mfu = 0;  // fraction of peak
  double peak_flops = 0;
  double peak_memory_bytes = 0;
  int64_t iterations_measured = 0;
};

BenchmarkSummary summarize_benchmark(const LoggedRun& run, const std::vector<double>& step_ms,
                                     double peak_flops);

// Writes the JSON file (through a temporary file and a rename).
void write_benchmark_json(const std::filesystem::path& file, const LoggedRun& run,
                          int64_t parameter_count, const BenchmarkSummary& summary);

}  // namespace backend
