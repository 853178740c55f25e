// Where a CPU training step's time goes, op by op: the gpt3/126m shape (12 layers, hidden 768,
// 12 heads, padded vocabulary 50304) runs forward + backward on a Device that wraps the
// CpuDevice and times every call (the seam makes this a decorator, not instrumentation in the
// model). Linear ops are reported with their GFLOP/s (2·rows·in·out per product, three products
// per backward) beside an OpenBLAS sgemm of 2048³ measured in the same run, the peak
// pretrain_gpt's MFU is quoted against. AdamW and the gradient norm are outside the model and
// not timed here (see docs/benchmarks.md for their share).
// Usage: op_profile_bench [seq] [micro-batch] [steps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/device/cpu_device.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/train/benchmark_report.hpp"

namespace {

using backend::Dropout;
using backend::View;
using Clock = std::chrono::steady_clock;

struct OpTotals {
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;
};

class TimingDevice final : public backend::CpuDevice {
 public:
  std::map<std::string, OpTotals> totals;

  template <typename Function>
  void timed(const char* op, double flops, Function&& function) {
    const auto start = Clock::now();
    function();
    OpTotals& entry = totals[op];
    entry.calls += 1;
    entry.seconds += std::chrono::duration<double>(Clock::now() - start).count();
    entry.flops += flops;
  }

  void embedding_forward(View o, View t, View w, View p, int64_t b, int64_t s, int64_t h,
                         int64_t v0) override {
    timed("embedding_forward", 0, [&] { CpuDevice::embedding_forward(o, t, w, p, b, s, h, v0); });
  }
  void embedding_backward(View dw, View dp, View d, View t, int64_t b, int64_t s, int64_t h,
                          int64_t v0) override {
    timed("embedding_backward", 0,
          [&] { CpuDevice::embedding_backward(dw, dp, d, t, b, s, h, v0); });
  }
  void dropout_forward(View o, View i, const Dropout& d) override {
    timed("dropout_forward", 0, [&] { CpuDevice::dropout_forward(o, i, d); });
  }
  void dropout_backward(View di, View d, const Dropout& m) override {
    timed("dropout_backward", 0, [&] { CpuDevice::dropout_backward(di, d, m); });
  }
  void layernorm_forward(View o, View m, View r, View i, View w, View b, double wo, double e,
                         int64_t n, int64_t c) override {
    timed("layernorm_forward", 0,
          [&] { CpuDevice::layernorm_forward(o, m, r, i, w, b, wo, e, n, c); });
  }
  void layernorm_backward(View di, View dw, View db, View d, View i, View w, double wo, View m,
                          View r, int64_t n, int64_t c) override {
    timed("layernorm_backward", 0,
          [&] { CpuDevice::layernorm_backward(di, dw, db, d, i, w, wo, m, r, n, c); });
  }
  void linear_forward(View o, View i, View w, View b, int64_t n, int64_t in,
                      int64_t out) override {
    timed("linear_forward", 2.0 * n * in * out,
          [&] { CpuDevice::linear_forward(o, i, w, b, n, in, out); });
  }
  void linear_backward(View di, View dw, View db, View d, View i, View w, int64_t n, int64_t in,
                       int64_t out) override {
    timed("linear_backward", (di.empty() ? 2.0 : 4.0) * n * in * out,
          [&] { CpuDevice::linear_backward(di, dw, db, d, i, w, n, in, out); });
  }
  void attention_forward(View o, View l, View q, int64_t b, int64_t s, int64_t h, int64_t nh,
                         int64_t ng, const Dropout& d) override {
    timed("attention_forward", 0, [&] { CpuDevice::attention_forward(o, l, q, b, s, h, nh, ng, d); });
  }
  void attention_backward(View dq, View d, View q, View o, View l, int64_t b, int64_t s, int64_t h,
                          int64_t nh, int64_t ng, const Dropout& m) override {
    timed("attention_backward", 0,
          [&] { CpuDevice::attention_backward(dq, d, q, o, l, b, s, h, nh, ng, m); });
  }
  void residual_forward(View o, View i, View b) override {
    timed("residual_forward", 0, [&] { CpuDevice::residual_forward(o, i, b); });
  }
  void gelu_forward(View o, View i) override {
    timed("gelu_forward", 0, [&] { CpuDevice::gelu_forward(o, i); });
  }
  void gelu_backward(View di, View d, View i) override {
    timed("gelu_backward", 0, [&] { CpuDevice::gelu_backward(di, d, i); });
  }
  void cross_entropy_forward(View l, View s, View x, View y, int64_t n, int64_t v) override {
    timed("cross_entropy_forward", 0, [&] { CpuDevice::cross_entropy_forward(l, s, x, y, n, v); });
  }
  void cross_entropy_backward(View d, View x, View s, View y, double k, int64_t n, int64_t v,
                              int64_t v0) override {
    timed("cross_entropy_backward", 0,
          [&] { CpuDevice::cross_entropy_backward(d, x, s, y, k, n, v, v0); });
  }
  void fill_zero(View v) override {
    timed("fill_zero (gradients)", 0, [&] { CpuDevice::fill_zero(v); });
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t seq = argc > 1 ? std::atoll(argv[1]) : 256;
  const int64_t mbs = argc > 2 ? std::atoll(argv[2]) : 4;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 3;
  backend::GptConfig config;
  config.num_layers = 12;
  config.hidden_size = 768;
  config.num_attention_heads = 12;
  config.ffn_hidden_size = 4 * 768;
  config.vocab_size = 50257;
  config.padded_vocab_size = 50304;
  config.max_position_embeddings = 2048;
  config.hidden_dropout = 0;
  config.attention_dropout = 0;
  TimingDevice device;
  backend::GptModel<float> model(config, device);
  model.init_parameters(1234);
  model.reserve(mbs, seq);
  std::mt19937 generator(7);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size) - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(mbs * seq)), labels(tokens.size());
  double step_seconds = 0;
  for (int step = 0; step <= steps; ++step) {
    for (auto& t : tokens) t = token(generator);
    for (auto& l : labels) l = token(generator);
    if (step == 1) device.totals.clear();  // the first step warms up (page faults, threads)
    const auto start = Clock::now();
    model.zero_gradients();
    model.forward(tokens, labels, mbs, seq);
    model.backward(1.0f);
    if (step >= 1) step_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  const double peak = backend::measure_cpu_sgemm_peak();
  double timed_seconds = 0;
  for (const auto& [name, entry] : device.totals) timed_seconds += entry.seconds;
  std::printf("gpt3/126m shape, seq %lld, micro batch %lld, %d steps after one warm-up; "
              "sgemm 2048^3 peak %.1f GFLOP/s\n",
              static_cast<long long>(seq), static_cast<long long>(mbs), steps, peak / 1e9);
  std::printf("| op | calls/step | ms/step | share of step | GFLOP/s | of sgemm peak |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::vector<std::pair<std::string, OpTotals>> sorted(device.totals.begin(), device.totals.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  for (const auto& [name, entry] : sorted) {
    const double rate = entry.flops > 0 ? entry.flops / entry.seconds : 0;
    std::printf("| %s | %lld | %.1f | %.1f %% | %s | %s |\n", name.c_str(),
                static_cast<long long>(entry.calls / steps), 1000 * entry.seconds / steps,
                100 * entry.seconds / step_seconds,
                rate > 0 ? std::to_string(static_cast<int>(rate / 1e9)).c_str() : "",
                rate > 0 ? (std::to_string(static_cast<int>(100 * rate / peak)) + " %").c_str()
                         : "");
  }
  std::printf("| (between ops: loss sum, copies, model bookkeeping) | | %.1f | %.1f %% | | |\n",
              1000 * (step_seconds - timed_seconds) / steps,
              100 * (step_seconds - timed_seconds) / step_seconds);
  std::printf("| forward + backward | | %.1f | 100 %% | | |\n", 1000 * step_seconds / steps);
  return 0;
}
