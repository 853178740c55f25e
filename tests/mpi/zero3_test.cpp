// ZeRO-3 on real ranks (mpirun -np 3): a GptModel<double> sharded over a data-parallel group of
// three holds its range of the one-process parameters, gathers each unit for use, and by the end
// of its backward holds its range of the gradients summed over the group: each rank's micro
// batch scaled by 1/3 gives, range by range, the gradients one process accumulates over the
// three micro batches (fp64, to 1e-12), for a GPT-2-style model (tied embeddings, dropout,
// recompute) and a Llama-style one. After the parameters change in place, the next forward uses
// the new values. Under mixed precision the gathered units are the working copy's bf16 or fp16
// values, moved as such.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/device/cpu_device.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/model/parameter_store.hpp"
#include "mpi/mpi_test_world.hpp"

using backend::GptConfig;
using backend::GptModel;

namespace {

GptConfig zero3_config(const std::string& style) {
  GptConfig config;
  config.num_layers = 3;
  config.hidden_size = 32;
  config.num_attention_heads = 4;
  config.ffn_hidden_size = 48;
  config.max_position_embeddings = 16;
  config.vocab_size = 97;
  config.padded_vocab_size = 100;
  if (style == "llama") {
    config.num_attention_heads = 8;
    config.num_query_groups = 2;
    config.swiglu = true;
    config.position_embedding_type = backend::PositionEmbeddingType::rope;
    config.normalization = backend::Normalization::rms_norm;
    config.add_bias_linear = false;
    config.share_embeddings_and_output_weights = false;
  } else {
    config.hidden_dropout = 0.1;
    config.attention_dropout = 0.1;
    config.recompute_granularity = backend::RecomputeGranularity::full;
    config.recompute_method = backend::RecomputeMethod::uniform;
    config.recompute_num_layers = 2;
  }
  return config;
}

void micro_batch(int64_t vocab_size, int64_t m, std::vector<int32_t>& tokens,
                 std::vector<int32_t>& labels) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto k = static_cast<int64_t>(i);
    tokens[i] = static_cast<int32_t>((k * 37 + 5 + m * 13) % vocab_size);
    labels[i] = static_cast<int32_t>((k * 53 + 11 + m * 7) % vocab_size);
  }
}

double range_difference(std::span<const double> shard, std::span<const double> whole,
                        backend::ShardRange range) {
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < range.numel; ++i) {
    const double expected = whole[static_cast<size_t>(range.offset + i)];
    worst = std::max(worst, std::fabs(shard[static_cast<size_t>(i)] - expected));
    scale = std::max(scale, std::fabs(expected));
  }
  return worst / std::max(scale, 1e-300);
}

}  // namespace

TEST_CASE("ZeRO-3 over three ranks holds each rank's range of one process's gradients") {
  auto& world = mpi_test::world();
  REQUIRE(world.size() == 3);
  for (const std::string style : {"gpt2", "llama"}) {
    CAPTURE(style);
    const GptConfig config = zero3_config(style);
    backend::CpuDevice device;
    GptModel<double> whole(config);
    backend::ModelParallelism parallelism;
    parallelism.sharded_data_parallel = &world;
    GptModel<double> sharded(config, device, parallelism);
    REQUIRE(sharded.sharded_over_data_parallel());
    const backend::ShardRange range = sharded.parameter_shard_range();
    CHECK(range.numel == static_cast<int64_t>(sharded.parameters().size()));
    whole.init_parameters(42);
    sharded.init_parameters(42);
    CHECK(range_difference(sharded.parameters(), whole.parameters(), range) == 0);

    const int64_t B = 2, T = 8;
    std::vector<int32_t> tokens(B * T), labels(B * T);
    whole.set_dropout_seed(5);
    sharded.set_dropout_seed(5);
    for (int step = 0; step < 2; ++step) {
      CAPTURE(step);
      whole.zero_gradients();
      sharded.zero_gradients();
      double expected = 0;
      for (int64_t m = 0; m < 3; ++m) {
        micro_batch(config.vocab_size, m + 10 * step, tokens, labels);
        whole.set_dropout_step(static_cast<uint64_t>(m));
        expected += whole.forward(tokens, labels, B, T);
        whole.backward(1.0 / 3);
      }
      micro_batch(config.vocab_size, world.rank() + 10 * step, tokens, labels);
      sharded.set_dropout_step(static_cast<uint64_t>(world.rank()));
      double loss = sharded.forward(tokens, labels, B, T);
      sharded.backward(1.0 / 3);
      world.all_reduce(backend::host_view(std::span(&loss, 1)), backend::ReduceOperation::sum);
      CHECK(std::fabs(loss - expected) <= 1e-12 * std::fabs(expected));
      CHECK(range_difference(sharded.gradients(), whole.gradients(), range) <= 1e-12);
      // A step of plain gradient descent on both, in place; the sharded model is told.
      for (size_t i = 0; i < whole.parameters().size(); ++i) {
        whole.parameters()[i] -= 0.1 * whole.gradients()[i];
      }
      for (size_t i = 0; i < sharded.parameters().size(); ++i) {
        sharded.parameters()[i] -= 0.1 * whole.gradients()[static_cast<size_t>(range.offset) + i];
      }
      sharded.parameters_updated();
    }
  }
}

TEST_CASE("ZeRO-3 under mixed precision gathers each unit in bf16 and fp16, as the working copy") {
  // The store as a bf16 (fp16) GptModel<float> holds it, on the CPU device (whose conversion
  // twin makes the same bits as the GPU's): each gathered unit is element for element the
  // one-process parameters rounded to the working type, although every rank converted only
  // its range and the 16-bit parts were summed over Open MPI (in fp32, exactly: one nonzero
  // term per element).
  auto& world = mpi_test::world();
  const backend::ParameterLayout layout(zero3_config("gpt"));
  std::vector<float> whole(static_cast<size_t>(layout.numel()));
  layout.init_parameters(whole.data(), 11);
  for (const backend::ElementType type : {backend::ElementType::bf16, backend::ElementType::f16}) {
    CAPTURE(backend::element_name(type));
    backend::CpuDevice device;
    backend::ParameterStore<float> store(layout, device, type, true, &world);
    store.init_parameters(11);
    CHECK(store.working_copy().empty());
    int64_t checked = 0;
    for (const backend::ParameterTensor& tensor : layout.tensors()) {
      // One working slot per kind of unit: each tensor's unit gathered as it comes.
      const std::string layers = "decoder.layers.";
      if (tensor.name.starts_with("embedding.")) {
        store.gather(store.embedding_unit());
      } else if (tensor.name.starts_with(layers)) {
        store.gather(store.layer_unit(std::stoll(tensor.name.substr(layers.size()))));
      } else {
        store.gather(store.head_unit());
      }
      const backend::View gathered = store.parameter(tensor.offset);
      REQUIRE(gathered.type == type);
      REQUIRE(gathered.numel == tensor.numel);
      const auto* words = static_cast<const uint16_t*>(gathered.data);
      int64_t wrong = 0;
      for (int64_t i = 0; i < tensor.numel; ++i) {
        const float value = whole[static_cast<size_t>(tensor.offset + i)];
        const uint16_t expected = type == backend::ElementType::bf16
                                      ? backend::to_bfloat16(value).bits
                                      : backend::to_float16(value).bits;
        wrong += words[i] != expected ? 1 : 0;
      }
      CAPTURE(tensor.name);
      CHECK(wrong == 0);
      ++checked;
    }
    CHECK(checked == static_cast<int64_t>(layout.tensors().size()));
  }
}
