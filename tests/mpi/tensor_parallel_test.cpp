// Tensor parallelism on real ranks (mpirun -np 3): a GptModel<double> whose tensor-parallel group
// is ranks {0, 1} (TP=2; rank 2 alone is a group of one) or all three ranks (TP=3) computes
// what one process computes with the whole model: the same initial values in every shard, the
// same loss and, shard by shard, the same gradients (fp64, to 1e-12), for a GPT-2-style model
// (LayerNorm, biases, learned positions, hidden dropout) and a Llama-style one (GQA, SwiGLU,
// RoPE, RMSNorm, no biases, untied output layer), with and without sequence parallelism. The reference model runs on every rank, so
// each rank checks its own shards (parameter_layout.hpp's shard_pieces).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/model/gpt_model.hpp"
#include "mpi/mpi_test_world.hpp"

using backend::GptConfig;
using backend::GptModel;

namespace {

GptConfig tensor_parallel_gpt2_config(int64_t tensor_parallel) {
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 48;
  config.num_attention_heads = 6;
  config.ffn_hidden_size = 48;
  config.max_position_embeddings = 16;
  config.vocab_size = 97;
  config.padded_vocab_size = backend::padded_vocab_size(97, 4, tensor_parallel);
  config.hidden_dropout = 0.1;  // one rank's masks: the activations are whole on every rank
  return config;
}

GptConfig tensor_parallel_llama_config(int64_t tensor_parallel) {
  GptConfig config = tensor_parallel_gpt2_config(tensor_parallel);
  config.num_attention_heads = 12;
  config.num_query_groups = 6;
  config.swiglu = true;
  config.position_embedding_type = backend::PositionEmbeddingType::rope;
  config.normalization = backend::Normalization::rms_norm;
  config.add_bias_linear = false;
  config.share_embeddings_and_output_weights = false;
  config.hidden_dropout = 0;
  return config;
}

struct Batch {
  std::vector<int32_t> tokens, labels;
  int64_t batch_size = 3, seq_length = 12;  // divisible by 2 and 3: sequence parallelism
};

Batch make_batch(int64_t vocab_size) {
  Batch batch;
  for (int64_t i = 0; i < batch.batch_size * batch.seq_length; ++i) {
    batch.tokens.push_back(static_cast<int32_t>((i * 37 + 5) % vocab_size));
    batch.labels.push_back(static_cast<int32_t>((i * 53 + 11) % vocab_size));
  }
  return batch;
}

// max |shard − whole at the shard's elements| over every tensor, relative to the whole's
// largest magnitude; `values` picks parameters or gradients.
template <typename Values>
double shard_difference(const GptModel<double>& shard_model, const GptModel<double>& whole_model,
                        Values values) {
  const auto& group = shard_model.tensor_parallel_group();
  double worst = 0, scale = 0;
  for (const auto& tensor : shard_model.tensors()) {
    const auto& whole = whole_model.tensor(tensor.name);
    CHECK(whole.shape == tensor.full_shape);
    const double* shard_values = values(shard_model).data() + tensor.offset;
    const double* whole_values = values(whole_model).data() + whole.offset;
    for (const auto& piece : backend::shard_pieces(tensor, group.size(), group.rank())) {
      for (int64_t i = 0; i < piece.numel; ++i) {
        const double expected = whole_values[piece.full_offset + i];
        worst = std::max(worst, std::fabs(shard_values[piece.shard_offset + i] - expected));
        scale = std::max(scale, std::fabs(expected));
      }
    }
  }
  return worst / std::max(scale, 1e-300);
}

void check_against_one_process(const GptConfig& config, backend::Communicator& group,
                               bool sequence_parallel) {
  backend::CpuDevice device;
  GptModel<double> whole(config);
  GptModel<double> shard(config, device, group, sequence_parallel);
  whole.init_parameters(42);
  shard.init_parameters(42);
  const auto parameters = [](const GptModel<double>& model) { return model.parameters(); };
  const auto gradients = [](const GptModel<double>& model) { return model.gradients(); };
  CHECK(shard_difference(shard, whole, parameters) == 0);  // the same values, exactly

  const Batch batch = make_batch(config.vocab_size);
  for (GptModel<double>* model : {&whole, &shard}) {
    model->set_dropout_seed(9);
    model->set_dropout_step(3);
  }
  // Two micro batches accumulate, as a training step does.
  for (int micro = 0; micro < 2; ++micro) {
    CAPTURE(micro);
    const double expected =
        whole.forward(batch.tokens, batch.labels, batch.batch_size, batch.seq_length);
    const double loss =
        shard.forward(batch.tokens, batch.labels, batch.batch_size, batch.seq_length);
    CHECK(std::fabs(loss - expected) <= 1e-12 * std::fabs(expected));
    whole.backward(0.5);
    shard.backward(0.5);
  }
  whole.finalize_gradients();
  shard.finalize_gradients();
  CHECK(shard_difference(shard, whole, gradients) <= 1e-12);

  // Evaluation mode (no dropout) as well.
  whole.set_training(false);
  shard.set_training(false);
  const double expected =
      whole.forward(batch.tokens, batch.labels, batch.batch_size, batch.seq_length);
  const double loss = shard.forward(batch.tokens, batch.labels, batch.batch_size, batch.seq_length);
  CHECK(std::fabs(loss - expected) <= 1e-12 * std::fabs(expected));
}

}  // namespace

TEST_CASE("TP=2 and TP=3, with and without sequence parallelism, compute one process's loss and gradients") {
  auto& world = mpi_test::world();
  REQUIRE(world.size() == 3);
  // TP=2 on ranks {0, 1}; rank 2's group of one is the whole model.
  const auto pair = world.split(world.rank() < 2 ? 0 : 1, world.rank(), "tensor parallel");
  const auto all = world.split(0, world.rank(), "tensor parallel");
  for (const std::string style : {"gpt2", "llama"}) {
    for (const bool sequence_parallel : {false, true}) {
      CAPTURE(style);
      CAPTURE(sequence_parallel);
      {
        INFO("TP=", pair->size());
        const GptConfig config =
            style == "gpt2" ? tensor_parallel_gpt2_config(pair->size()) : tensor_parallel_llama_config(pair->size());
        check_against_one_process(config, *pair, sequence_parallel);
      }
      {
        INFO("TP=3");
        const GptConfig config = style == "gpt2" ? tensor_parallel_gpt2_config(3) : tensor_parallel_llama_config(3);
        check_against_one_process(config, *all, sequence_parallel);
      }
    }
  }
}

TEST_CASE("sequence parallelism refuses a sequence the ranks cannot share equally") {
  auto& world = mpi_test::world();
  const auto all = world.split(0, world.rank(), "tensor parallel");
  backend::CpuDevice device;
  GptModel<double> model(tensor_parallel_gpt2_config(3), device, *all, true);
  CHECK_THROWS_WITH_AS(model.reserve(2, 10),
                       doctest::Contains("--seq-length 10 must be divisible by "
                                         "--tensor-model-parallel-size 3 with --sequence-parallel"),
                       common::Error);
}

TEST_CASE("a shape that does not divide over the tensor-parallel ranks is refused, naming the flag") {
  auto& world = mpi_test::world();
  const auto all = world.split(0, world.rank(), "tensor parallel");
  backend::CpuDevice device;
  GptConfig config = tensor_parallel_gpt2_config(3);
  config.num_attention_heads = 4;  // 4 heads over 3 ranks
  config.hidden_size = 48;
  CHECK_THROWS_WITH_AS(GptModel<double>(config, device, *all),
                       doctest::Contains("--num-attention-heads (4) must be divisible by "
                                         "--tensor-model-parallel-size (3)"),
                       common::Error);
  config = tensor_parallel_gpt2_config(3);
  config.ffn_hidden_size = 50;
  CHECK_THROWS_WITH_AS(GptModel<double>(config, device, *all),
                       doctest::Contains("--ffn-hidden-size (50)"), common::Error);
}
