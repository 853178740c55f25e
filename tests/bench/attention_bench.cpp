// Attention alone on one GPU: causal forward and backward of the GPU benchmark's three shapes
// (tests/bench/gpu_vs_pytorch_bench.sh) in bf16, through each --attention-backend asked for,
// timed as training runs them (queued; the device waited for once per repetition), for
// attention_vs_sdpa_bench.sh to put beside PyTorch's scaled_dot_product_attention on the same
// card in the same call (issue 39's target: within 10 % of it). The same FLOPs as the op
// profile: causal 2·B·T²·C forward (Q·Kᵀ and P·V over the lower triangle), 2.5 times that
// backward. Prints one JSON line per shape and backend.
// Usage: attention_bench [repetitions] [backend ...]   (backends: auto fused flash local;
//        default auto flash)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/common/enum_names.hpp"
#include "backend/common/error.hpp"
#include "backend/device/arena.hpp"
#include "backend/device/cuda_device.hpp"
#include "backend/ops/attention.hpp"

namespace {

struct BenchShape {
  const char* name;
  int64_t batch, seq, heads, groups, head_dim;
};

// The benchmark's shapes: GPT-2 124M and 350M (multi-head), Llama-style 1B (8 KV heads).
constexpr BenchShape kShapes[] = {{"gpt2-124m", 16, 1024, 12, 12, 64},
                                  {"gpt2-350m", 8, 1024, 16, 16, 64},
                                  {"llama-1b", 4, 2048, 32, 8, 64}};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void run(const BenchShape& s, backend::AttentionBackend choice, int repetitions) {
  const backend::AttentionShape shape{.batch_size = s.batch,
                                      .seq_length = s.seq,
                                      .hidden_size = s.heads * s.head_dim,
                                      .num_heads = s.heads,
                                      .num_query_groups = s.groups};
  auto device = backend::make_cuda_device(0, {.attention_backend = choice});
  const auto bf16 = backend::ElementType::bf16;
  const int64_t rows = s.batch * s.seq;
  backend::ArenaLayout layout;
  const int64_t qkv = layout.add("qkv", bf16, rows * shape.qkv_row_width());
  const int64_t dqkv = layout.add("dqkv", bf16, rows * shape.qkv_row_width());
  const int64_t output = layout.add("output", bf16, rows * shape.hidden_size);
  const int64_t doutput = layout.add("doutput", bf16, rows * shape.hidden_size);
  const int64_t logsumexp =
      layout.add("logsumexp", backend::ElementType::f32, s.batch * s.heads * s.seq);
  const int64_t flag = layout.add("wait", backend::ElementType::i32, 1);
  backend::Arena arena(*device, std::move(layout), "the attention benchmark");
  // Values of a trained model's order of magnitude: all-zero inputs would make every score
  // equal, which no kernel's timing depends on, but NaN-free inputs keep the backward honest.
  std::vector<uint16_t> ones(static_cast<size_t>(rows * shape.qkv_row_width()), 0x3c00);
  device->copy_from_host(arena.view(qkv), ones.data());
  device->copy_from_host(arena.view(doutput), ones.data());
  const auto wait = [&] {
    int32_t value = 0;
    device->copy_to_host(&value, arena.view(flag));
  };
  const auto forward = [&] {
    backend::ops::attention_forward(*device, arena.view(output), arena.view(logsumexp),
                                    arena.view(qkv), shape, {});
  };
  const auto backward = [&] {
    backend::ops::attention_backward(*device, arena.view(dqkv), arena.view(doutput),
                                     arena.view(qkv), arena.view(output), arena.view(logsumexp),
                                     shape, {});
  };
  forward();  // builds the plans (cuDNN) and warms the caches
  backward();
  wait();
  auto start = Clock::now();
  for (int i = 0; i < repetitions; ++i) forward();
  wait();
  const double forward_seconds = seconds_since(start) / repetitions;
  start = Clock::now();
  for (int i = 0; i < repetitions; ++i) backward();
  wait();
  const double backward_seconds = seconds_since(start) / repetitions;
  const double forward_flops = 2.0 * static_cast<double>(s.batch) * static_cast<double>(s.seq) *
                               static_cast<double>(s.seq) * static_cast<double>(shape.hidden_size);
  std::printf(
      "{\"shape\": \"%s\", \"backend\": \"%s\", \"forward_ms\": %.4f, \"backward_ms\": "
      "%.4f, \"forward_tflops\": %.2f, \"backward_tflops\": %.2f}\n",
      s.name, std::string(common::enum_name(choice)).c_str(), forward_seconds * 1e3,
      backward_seconds * 1e3, forward_flops / forward_seconds / 1e12,
      2.5 * forward_flops / backward_seconds / 1e12);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 20;
  std::vector<backend::AttentionBackend> choices;
  for (int i = 2; i < argc; ++i) {
    const auto choice = common::enum_from_name<backend::AttentionBackend>(argv[i]);
    if (!choice) {
      std::fprintf(stderr,
                   "attention_bench: backend '%s' is not one of auto, fused, flash, "
                   "unfused, local\n",
                   argv[i]);
      return 2;
    }
    choices.push_back(*choice);
  }
  if (choices.empty())
    choices = {backend::AttentionBackend::automatic, backend::AttentionBackend::flash};
  if (repetitions < 1) {
    std::fprintf(stderr, "usage: attention_bench [repetitions >= 1] [backend ...]\n");
    return 2;
  }
  try {
    for (const BenchShape& shape : kShapes) {
      for (const auto choice : choices) run(shape, choice, repetitions);
    }
  } catch (const common::Error& error) {
    std::fprintf(stderr, "attention_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
