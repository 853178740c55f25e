// The whole GPT model on the CUDA device against the same model on the CPU device, fp32, on
// tiny GPT-2 and Llama-style shapes: the same initialisation (made on the host and copied),
// the same micro batch; the loss within 1e-5 relative, every parameter gradient within a
// normalised error of 1e-4, and a second run on the GPU giving the same bits. This is the
// model-level check of the CUDA twins composed by GptModel (docs/device.md), short of training.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/model/gpt_model.hpp"
#include "gpu_test_support.hpp"

namespace {

using backend::GptConfig;
using backend::GptModel;

GptConfig gpt_config() {
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 64;
  config.num_attention_heads = 4;
  config.ffn_hidden_size = 256;
  config.vocab_size = 100;
  config.padded_vocab_size = 128;
  config.max_position_embeddings = 40;
  return config;
}

GptConfig llama_config() {
  GptConfig config = gpt_config();
  config.position_embedding_type = backend::PositionEmbeddingType::rope;
  config.normalization = backend::Normalization::rms_norm;
  config.swiglu = true;
  config.add_bias_linear = false;
  config.num_query_groups = 2;
  config.share_embeddings_and_output_weights = false;
  return config;
}

struct Run {
  float loss = 0;
  std::vector<float> gradients;
};

Run run(const GptConfig& config, backend::Device& device, int64_t batch, int64_t seq) {
  GptModel<float> model(config, device);
  model.init_parameters(11);
  std::mt19937 generator(3);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(config.vocab_size) - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(batch * seq)), labels(tokens.size());
  for (auto& t : tokens) t = id(generator);
  for (auto& l : labels) l = id(generator);
  model.zero_gradients();
  Run result;
  result.loss = model.forward(tokens, labels, batch, seq);
  model.backward(1.0f);
  result.gradients.resize(model.tensors().back().offset + model.tensors().back().numel);
  model.copy_gradients_to_host(result.gradients);
  return result;
}

void compare(const GptConfig& config, int64_t batch, int64_t seq) {
  auto gpu = gpu_test::open_gpu_or_skip(true);
  if (!gpu) return;
  backend::CpuDevice cpu;
  const Run expected = run(config, cpu, batch, seq);
  const Run actual = run(config, *gpu, batch, seq);
  CHECK(std::abs(actual.loss - expected.loss) <= 1e-5f * std::abs(expected.loss));
  GptModel<float> layout(config);
  for (const auto& tensor : layout.tensors()) {
    CAPTURE(tensor.name);
    float worst = 0, largest = 0;
    for (int64_t i = tensor.offset; i < tensor.offset + tensor.numel; ++i) {
      const auto k = static_cast<size_t>(i);
      const float difference = std::abs(actual.gradients[k] - expected.gradients[k]);
      worst = std::isnan(difference) ? INFINITY : std::max(worst, difference);
      largest = std::max(largest, std::abs(expected.gradients[k]));
    }
    CHECK(worst / std::max(1e-6f, largest) <= 1e-4f);
  }
  const Run again = run(config, *gpu, batch, seq);
  CHECK(again.loss == actual.loss);
  CHECK(again.gradients == actual.gradients);
}

}  // namespace

TEST_CASE("the GPT-2 model on the GPU: loss and every gradient as on the CPU, run to run") {
  compare(gpt_config(), 3, 37);
}

TEST_CASE("the Llama-style model on the GPU: RoPE, RMSNorm, SwiGLU, GQA, untied output") {
  compare(llama_config(), 2, 33);
}
