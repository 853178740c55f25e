// Where a training step's time goes, op by op, on the CPU or a GPU: the gpt3/126m shape (12
// layers, hidden 768, 12 heads, padded vocabulary 50304; GPT-2 124M) runs forward + backward on
// a Device that wraps the real one and observes every op (Device's OpObserver: each op of
// backend/ops/ reports its start and its queueing, with its FLOPs), not instrumentation in the
// model. On a GPU each op is followed by a wait for the device, so its
// time is its own plus one launch and wait (some microseconds); the last line is the same
// steps run again without the waits, as training runs them.
// Linear ops and attention are reported with their rate (the FLOPs the ops report: 2·rows·in·out
// per product, two products per backward; causal attention 2·B·T²·hidden forward, 2.5× that
// backward) beside
// the GEMM peak measured in the same run: OpenBLAS's 2048³ sgemm on the CPU, or the device's
// 8192³ GEMM in the run's precision, the peaks pretrain_gpt's MFU is quoted against. AdamW and
// the gradient norm are outside the model and not timed here (see docs/benchmarks.md).
// Usage: op_profile_bench [seq] [micro-batch] [steps] [cpu|cuda] [fp32|bf16|fp16] [backend]
// (backend: the CUDA device's --attention-backend, auto|fused|flash|unfused|local; local, the
// CUDA-core kernel, by default. auto without cuDNN is an error here, not flash.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/arena.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/device/cuda_device.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/train/log/benchmark_report.hpp"

namespace {

using backend::DeviceMemory;
using backend::MemoryKind;
using backend::View;
using Clock = std::chrono::steady_clock;

struct OpTotals {
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;
};

class TimingDevice final : public backend::Device, public backend::OpObserver {
 public:
  explicit TimingDevice(backend::Device& inner)
      : inner_(inner), wait_arena_(inner, wait_layout(), "the profiler's wait") {
    set_observer(this);
  }

  std::map<std::string, OpTotals> totals;
  bool timing = true;  // false: the ops run as they would, queued without waits

  template <typename Function>
  void timed(const char* op, Function&& function) {
    op_started(op);
    function();
    op_queued(op, 0);
  }
  // copy_to_host waits for the device's queued work.
  void wait() {
    int32_t value = 0;
    inner_.copy_to_host(&value, wait_arena_.view(0));
  }

  // The ops (backend/ops/) tell their observer, this device, when each starts and is queued.
  void op_started(std::string_view /*op*/) override { start_ = Clock::now(); }
  void op_queued(std::string_view op, double flops) override {
    if (!timing) return;
    wait();
    OpTotals& entry = totals[std::string(op)];
    entry.calls += 1;
    entry.seconds += std::chrono::duration<double>(Clock::now() - start_).count();
    entry.flops += flops;
  }

  std::string name() const override { return inner_.name(); }
  MemoryKind memory_kind() const override { return inner_.memory_kind(); }
  backend::MemoryUsage memory_usage() const override { return inner_.memory_usage(); }
  DeviceMemory allocate_zeroed(int64_t bytes, std::string_view what) override {
    return inner_.allocate_zeroed(bytes, what);
  }
  DeviceMemory allocate_pinned_host(int64_t bytes, std::string_view what) override {
    return inner_.allocate_pinned_host(bytes, what);
  }
  void copy_from_host(View destination, const void* source) override {
    return inner_.copy_from_host(destination, source);
  }
  void synchronize() override { inner_.synchronize(); }
  backend::DeviceMark mark() override { return inner_.mark(); }
  void wait_for(backend::DeviceMark mark) override { inner_.wait_for(mark); }
  void copy_to_host(void* destination, View source) override {
    return inner_.copy_to_host(destination, source);
  }
  void queue_copy_to_host(void* destination, View source) override {
    inner_.queue_copy_to_host(destination, source);
  }
  void fill_zero(View values) override {
    timed("fill_zero", [&] { inner_.fill_zero(values); });
  }
  void copy(View destination, View source) override {
    timed("copy", [&] { inner_.copy(destination, source); });
  }
  void* scratch(int64_t bytes, std::string_view op) override { return inner_.scratch(bytes, op); }
  const backend::CudaContext& cuda_context() override { return inner_.cuda_context(); }

 private:
  static backend::ArenaLayout wait_layout() {
    backend::ArenaLayout layout;
    layout.add("one element to wait on", backend::ElementType::i32, 1);
    return layout;
  }
  backend::Device& inner_;
  backend::Arena wait_arena_;
  Clock::time_point start_;
};

// One profile: the model on the device, the timed and queued steps, the table.
void profile(int64_t seq, int64_t mbs, int steps, const std::string& device_name,
             const std::string& precision, const std::string& attention) {
  backend::GptConfig config;
  config.num_layers = 12;
  config.hidden_size = 768;
  config.num_attention_heads = 12;
  config.ffn_hidden_size = 4 * 768;
  config.vocab_size = 50257;
  config.padded_vocab_size = 50304;
  config.max_position_embeddings = std::max<int64_t>(2048, seq);
  config.hidden_dropout = 0;
  config.attention_dropout = 0;
  config.mixed_precision = precision == "bf16"   ? backend::MixedPrecision::bf16
                           : precision == "fp16" ? backend::MixedPrecision::fp16
                                                 : backend::MixedPrecision::none;
  const std::unique_ptr<backend::Device> inner =
      device_name == "cuda"
          ? backend::make_cuda_device(
                0, {.attention_backend =
                        attention.empty()
                            ? backend::AttentionBackend::local
                            : *common::enum_from_name<backend::AttentionBackend>(attention)})
          : std::unique_ptr<backend::Device>(std::make_unique<backend::CpuDevice>());
  TimingDevice device(*inner);
  backend::GptModel<float> model(config, device);
  model.init_parameters(1234);
  model.reserve(mbs, seq);
  std::mt19937 generator(7);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size) - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(mbs * seq)), labels(tokens.size());
  // Steps with every op waited for and timed, then the same number as they run (queued).
  auto run_steps = [&](bool timing) {
    device.timing = timing;
    double seconds = 0;
    for (int step = 0; step <= steps; ++step) {
      for (auto& t : tokens) t = token(generator);
      for (auto& l : labels) l = token(generator);
      if (step == 1 && timing)
        device.totals.clear();  // the first step warms up (page faults, plans)
      const auto start = Clock::now();
      model.zero_gradients();
      model.forward(tokens, labels, mbs, seq);  // reads the loss back
      model.backward(1.0f);
      device.wait();
      if (step >= 1) seconds += std::chrono::duration<double>(Clock::now() - start).count();
    }
    return seconds;
  };
  const double step_seconds = run_steps(true);
  const double queued_seconds = run_steps(false);
  const bool on_gpu = device_name == "cuda";
  const double peak =
      on_gpu ? backend::measure_device_gemm_peak(
                   *inner, backend::working_type(config.mixed_precision, backend::ElementType::f32))
             : backend::measure_cpu_sgemm_peak();
  const std::string peak_name =
      on_gpu ? precision + " GEMM 8192^3 peak" : std::string("sgemm 2048^3 peak");
  double timed_seconds = 0;
  for (const auto& [name, entry] : device.totals) timed_seconds += entry.seconds;
  std::printf(
      "gpt3/126m shape on %s, %s%s, seq %lld, micro batch %lld, %d steps after one "
      "warm-up; %s %.1f TFLOP/s\n",
      inner->name().c_str(), precision.c_str(),
      attention == "flash" ? " (--use-flash-attn)" : "", static_cast<long long>(seq),
      static_cast<long long>(mbs), steps, peak_name.c_str(), peak / 1e12);
  std::printf("| op | calls/step | ms/step | share of step | TFLOP/s | of the peak |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::vector<std::pair<std::string, OpTotals>> sorted(device.totals.begin(), device.totals.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  for (const auto& [name, entry] : sorted) {
    const double rate = entry.flops > 0 ? entry.flops / entry.seconds : 0;
    char rate_cell[32] = "", share_cell[32] = "";
    if (rate > 0) {
      std::snprintf(rate_cell, sizeof rate_cell, "%.3f", rate / 1e12);
      std::snprintf(share_cell, sizeof share_cell, "%.0f %%", 100 * rate / peak);
    }
    std::printf("| %s | %lld | %.3f | %.1f %% | %s | %s |\n", name.c_str(),
                static_cast<long long>(entry.calls / steps), 1000 * entry.seconds / steps,
                100 * entry.seconds / step_seconds, rate_cell, share_cell);
  }
  std::printf("| (between ops: loss sum, copies, model bookkeeping) | | %.3f | %.1f %% | | |\n",
              1000 * (step_seconds - timed_seconds) / steps,
              100 * (step_seconds - timed_seconds) / step_seconds);
  std::printf("| forward + backward, each op waited for | | %.3f | 100 %% | | |\n",
              1000 * step_seconds / steps);
  std::printf("| forward + backward as it runs (no waits between ops) | | %.3f | | | |\n",
              1000 * queued_seconds / steps);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t seq = argc > 1 ? std::atoll(argv[1]) : 256;
  const int64_t mbs = argc > 2 ? std::atoll(argv[2]) : 4;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 3;
  const std::string device_name = argc > 4 ? argv[4] : "cpu";
  const std::string precision = argc > 5 ? argv[5] : "fp32";
  const std::string attention = argc > 6 ? argv[6] : "";
  if ((device_name != "cpu" && device_name != "cuda") ||
      (precision != "fp32" && precision != "bf16" && precision != "fp16") ||
      (precision != "fp32" && device_name == "cpu") ||
      (!attention.empty() &&
       (!common::enum_from_name<backend::AttentionBackend>(attention) || device_name != "cuda"))) {
    std::fprintf(stderr,
                 "usage: op_profile_bench [seq] [micro-batch] [steps] [cpu|cuda] "
                 "[fp32|bf16|fp16] [auto|fused|flash|unfused|local] (bf16, fp16 and the "
                 "attention backend on cuda only; default local)\n");
    return 2;
  }
  // A machine without a GPU or driver says so in one line, as the tools do.
  try {
    profile(seq, mbs, steps, device_name, precision, attention);
  } catch (const common::Error& error) {
    std::fprintf(stderr, "op_profile_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
