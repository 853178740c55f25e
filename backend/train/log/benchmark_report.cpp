// Benchmark summary and its JSON file; see benchmark_report.hpp.
#include "backend/ops/linear.hpp"
#include "backend/train/log/benchmark_report.hpp"

#include <cblas.h>
#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/device/arena.hpp"

namespace backend {

double megatron_flops_per_iteration(const ModelArguments& model, int64_t global_batch_size,
                                    int64_t padded_vocab_size) {
  const double B = static_cast<double>(global_batch_size);
  const double s = static_cast<double>(model.seq_length);
  const double L = static_cast<double>(model.num_layers);
  const double h = static_cast<double>(model.hidden_size);
  const double ffn = static_cast<double>(model.ffn_hidden_size);
  // g/a: query groups over heads (1 without --group-query-attention); kv·a/h = 1.
  const double groups_over_heads = model.group_query_attention
                                       ? static_cast<double>(model.num_query_groups) /
                                             static_cast<double>(model.num_attention_heads)
                                       : 1.0;
  const double attention = 1.0 + groups_over_heads + s / (2.0 * h);
  const double mlp = ffn / h * (model.swiglu ? 1.5 : 1.0);  // SwiGLU: fc1 twice as wide
  return 12.0 * B * s * L * h * h * (attention + mlp) +
         6.0 * B * s * h * static_cast<double>(padded_vocab_size);
}

double megatron_throughput_tflops_per_gpu(const LoggedRun& run, int64_t batch_size,
                                          double seconds_per_iteration) {
  const double flops =
      megatron_flops_per_iteration(run.model, run.global_batch_size, run.padded_vocab_size) *
      static_cast<double>(batch_size) / static_cast<double>(run.global_batch_size);
  return flops / (seconds_per_iteration * 1e12 * static_cast<double>(run.parallelism.world_size));
}

double measure_cpu_sgemm_peak() {
  constexpr int n = 2048;
  std::vector<float> a(static_cast<size_t>(n) * n, 1.0f), b(a.size(), 0.5f), c(a.size(), 0.0f);
  double best = 0;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                n, 0.0f, c.data(), n);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * n * n * static_cast<double>(n) / seconds);
  }
  return best;
}

double measure_device_gemm_peak(Device& device, ElementType type) {
  constexpr int64_t n = 8192;
  ArenaLayout layout;
  const int64_t a = layout.add("GEMM peak: A", type, n * n);
  const int64_t b = layout.add("GEMM peak: B", type, n * n);
  const int64_t c = layout.add("GEMM peak: C", type, n * n);
  Arena arena(device, std::move(layout), "the GEMM peak measurement");
  // Values in [-1, 1) from the index (a cheap hash; any non-zero data will do).
  auto fill = [&](View view, uint64_t salt) {
    auto value = [salt](int64_t i) {
      const uint64_t h = (static_cast<uint64_t>(i) + salt) * 0x9E3779B97F4A7C15ull;
      return static_cast<float>(h >> 40) / static_cast<float>(1 << 23) - 1.0f;
    };
    if (type == ElementType::bf16) {
      std::vector<bfloat16> host(static_cast<size_t>(n * n));
      for (int64_t i = 0; i < n * n; ++i) host[static_cast<size_t>(i)] = to_bfloat16(value(i));
      device.copy_from_host(view, host.data());
    } else if (type == ElementType::f16) {
      std::vector<float16> host(static_cast<size_t>(n * n));
      for (int64_t i = 0; i < n * n; ++i) host[static_cast<size_t>(i)] = to_float16(value(i));
      device.copy_from_host(view, host.data());
    } else if (type == ElementType::f32) {
      std::vector<float> host(static_cast<size_t>(n * n));
      for (int64_t i = 0; i < n * n; ++i) host[static_cast<size_t>(i)] = value(i);
      device.copy_from_host(view, host.data());
    } else {
      common::fail("measure_device_gemm_peak: {} GEMMs are not measured (fp32, bf16 or fp16)",
                   element_name(type));
    }
  };
  fill(arena.view(a), 1);
  fill(arena.view(b), 2);
  const View output = arena.view(c);
  const View no_bias{nullptr, 0, type, output.on};
  // copy_to_host waits for the device's work: the clock reads finished products.
  std::vector<std::byte> first(static_cast<size_t>(element_size(type)));
  auto finish = [&] { device.copy_to_host(first.data(), output.slice(0, 1)); };
  ops::linear_forward(device, output, arena.view(a), arena.view(b), no_bias, n, n, n);
  finish();
  constexpr int kProducts = 4;
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < kProducts; ++k) {
      ops::linear_forward(device, output, arena.view(a), arena.view(b), no_bias, n, n, n);
    }
    finish();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, kProducts * 2.0 * static_cast<double>(n * n) * n / seconds);
  }
  return best;
}

BenchmarkSummary summarize_benchmark(const LoggedRun& run, const std::vector<double>& step_ms,
                                     double peak_flops) {
  BenchmarkSummary summary;
  // The first iteration pays for allocation and page faults: warm-up, not measured.
  std::vector<double> measured(step_ms.begin() + (step_ms.size() > 1 ? 1 : 0), step_ms.end());
  if (measured.empty()) common::fail("benchmark: no iterations to measure");
  std::sort(measured.begin(), measured.end());
  const size_t n = measured.size();
  summary.median_step_ms = n % 2 ? measured[n / 2] : 0.5 * (measured[n / 2 - 1] + measured[n / 2]);
  summary.iterations_measured = static_cast<int64_t>(n);
  const double seconds = summary.median_step_ms / 1000.0;
  summary.tokens_per_second =
      static_cast<double>(run.global_batch_size * run.model.seq_length) / seconds;
  summary.tflops_per_device =
      megatron_flops_per_iteration(run.model, run.global_batch_size, run.padded_vocab_size) /
      seconds / 1e12 / static_cast<double>(std::max<int64_t>(run.parallelism.world_size, 1));
  summary.peak_flops = peak_flops;
  summary.mfu = peak_flops > 0 ? summary.tflops_per_device * 1e12 / peak_flops : 0;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  summary.peak_memory_bytes = static_cast<double>(usage.ru_maxrss) * 1024.0;  // Linux: KiB
  return summary;
}

void write_benchmark_json(const std::filesystem::path& file, const LoggedRun& run,
                          int64_t parameter_count, const BenchmarkSummary& summary) {
  const ParallelismArguments& parallelism = run.parallelism;
  const nlohmann::json report = {
      {"model",
       {{"num_layers", run.model.num_layers},
        {"hidden_size", run.model.hidden_size},
        {"num_attention_heads", run.model.num_attention_heads},
        {"ffn_hidden_size", run.model.ffn_hidden_size},
        {"seq_length", run.model.seq_length},
        {"padded_vocab_size", run.padded_vocab_size},
        {"parameters", parameter_count}}},
      {"batch",
       {{"micro_batch_size", run.micro_batch_size}, {"global_batch_size", run.global_batch_size}}},
      {"parallel",
       {{"world_size", parallelism.world_size},
        {"tensor_model_parallel_size", parallelism.tensor_model_parallel_size},
        {"pipeline_model_parallel_size", parallelism.pipeline_model_parallel_size},
        {"data_parallel_size", parallel_layout(parallelism).data_parallel}}},
      {"device", "cpu"},
      {"precision", "fp32"},
      {"iterations_measured", summary.iterations_measured},
      {"median_step_ms", summary.median_step_ms},
      {"tokens_per_second", summary.tokens_per_second},
      {"tflops_per_device", summary.tflops_per_device},
      {"peak_tflops_measured", summary.peak_flops / 1e12},
      {"mfu", summary.mfu},
      {"peak_memory_bytes", summary.peak_memory_bytes},
  };
  std::error_code error;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), error);
  common::write_text_file_atomically(file, report.dump(2) + "\n", common::FileMode::regular,
                                     "--benchmark-output");
}

}  // namespace backend
