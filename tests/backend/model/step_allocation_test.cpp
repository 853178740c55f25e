// Issue 10's "nothing is allocated inside a step", on the CPU device: after a first step has
// carved what the shape needs, a GPT model's forward and backward (GPT-2 style with dropout,
// and Llama style with grouped-query attention) make no heap allocation, nor does the gradient
// norm's sum of squares. Counted by replacing
// the global operator new of this test executable: it counts every allocation of the process
// while armed, from any thread (the OpenMP workers' included). OpenBLAS and libgomp allocate
// with malloc, not operator new, and are not what this checks.
#include <doctest/doctest.h>

#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <vector>

#include "backend/device/cpu_device.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/ops/reduction.hpp"
#include "tests/backend/ops/gradient_check.hpp"

namespace {

std::atomic<bool> counting{false};
std::atomic<int64_t> allocations{0};

}  // namespace

namespace {

void* counted_allocation(std::size_t size) noexcept {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1);
  return std::malloc(size == 0 ? 1 : size);
}

}  // namespace

// Every unaligned form, so that nothing allocated by one allocator is freed by another (the
// sanitized build's own operator new would otherwise serve the forms left out, and its
// alloc-dealloc-mismatch check stops the run). Not inlined: GCC would otherwise pair an
// inlined free() with the allocator's operator new and warn of a mismatch
// (-Wmismatched-new-delete) that the replacement makes correct. The aligned forms stay the
// library's: they pair only with each other.
[[gnu::noinline]] void* operator new(std::size_t size) {
  if (void* memory = counted_allocation(size)) return memory;
  throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new[](std::size_t size) {
  if (void* memory = counted_allocation(size)) return memory;
  throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return counted_allocation(size);
}
[[gnu::noinline]] void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return counted_allocation(size);
}
[[gnu::noinline]] void operator delete(void* memory) noexcept { std::free(memory); }
[[gnu::noinline]] void operator delete[](void* memory) noexcept { std::free(memory); }
[[gnu::noinline]] void operator delete(void* memory, std::size_t) noexcept {
  std::free(memory);
}
[[gnu::noinline]] void operator delete[](void* memory, std::size_t) noexcept {
  std::free(memory);
}
[[gnu::noinline]] void operator delete(void* memory, const std::nothrow_t&) noexcept {
  std::free(memory);
}
[[gnu::noinline]] void operator delete[](void* memory, const std::nothrow_t&) noexcept {
  std::free(memory);
}

namespace {

using backend::GptConfig;

GptConfig gpt2_style() {
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 128;
  config.num_attention_heads = 4;
  config.ffn_hidden_size = 512;
  config.vocab_size = 1000;
  config.padded_vocab_size = backend::padded_vocab_size(1000, 128, 1);
  config.max_position_embeddings = 128;
  config.hidden_dropout = 0.1;
  config.attention_dropout = 0.1;
  return config;
}

GptConfig llama_style() {
  GptConfig config = gpt2_style();
  config.num_attention_heads = 8;
  config.num_query_groups = 2;
  config.position_embedding_type = backend::PositionEmbeddingType::rope;
  config.normalization = backend::Normalization::rms_norm;
  config.swiglu = true;
  config.add_bias_linear = false;
  config.share_embeddings_and_output_weights = false;
  config.hidden_dropout = config.attention_dropout = 0;
  return config;
}

// Heap allocations made by the second of two forward + backward steps.
int64_t allocations_of_second_step(const GptConfig& config) {
  backend::CpuDevice device;
  backend::GptModel<float> model(config, device);
  model.init_parameters(1);
  constexpr int64_t kBatch = 2, kSeq = 128;
  model.reserve(kBatch, kSeq);
  const auto count = static_cast<size_t>(kBatch * kSeq);
  const std::vector<int32_t> tokens = backend::testing::random_ids(count, 1000, 3);
  const std::vector<int32_t> labels = backend::testing::random_ids(count, 1000, 4);
  int64_t counted = 0;
  for (int step = 0; step < 2; ++step) {
    allocations = 0;
    counting = step == 1;
    model.zero_gradients();
    model.forward(tokens, labels, kBatch, kSeq);
    model.backward(1.0f);
    counting = false;
    counted = allocations;
  }
  return counted;
}

}  // namespace

TEST_CASE("a GPT step on the CPU device allocates nothing once the first step has run") {
  CHECK(allocations_of_second_step(gpt2_style()) == 0);
  CHECK(allocations_of_second_step(llama_style()) == 0);
}

// The gradient norm's sum of squares (ops/reduction.hpp) adds its 65536-element chunks in
// chunk order, 256 chunks per pass through an array on the stack: more than one pass here, the
// same bits on one thread and on all of them, close to a long double sum, and no allocation.
TEST_CASE("the CPU sum of squares allocates nothing and does not depend on the thread count") {
  const int64_t count = 3 * 256 * 65536 + 12345;  // three passes and a partial fourth
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    values[static_cast<size_t>(i)] = static_cast<float>((i * 7919) % 2001 - 1000) * 1e-3f;
  }
  long double reference = 0;
  for (const float value : values) reference += static_cast<long double>(value) * value;

  double all_threads = 0, one_thread = 0;
  allocations = 0;
  counting = true;
  backend::cpu::sum_of_squares(&all_threads, values.data(), count);
  counting = false;
  CHECK(allocations == 0);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  backend::cpu::sum_of_squares(&one_thread, values.data(), count);
  omp_set_num_threads(threads);
  CHECK(one_thread == all_threads);
  CHECK(std::fabs(all_threads - static_cast<double>(reference)) <=
        1e-12 * static_cast<double>(reference));
}
