// GptModel: the CPU reference forward and backward of the decoder that gpt_model.hpp
// describes, composed from the ops in backend/ops (llm.c's gpt2_forward / gpt2_backward,
// with Megatron core's parameter names, layouts and initialisation).
//
// Initialisation (Megatron's init_method_normal / scaled_init_method_normal): every weight
// element, including both embedding tables, is N(0, init_method_std); linear_proj and
// linear_fc2 weights are N(0, init_method_std / sqrt(2 · num_layers)); biases are 0 and
// layernorm weights 1. The normal deviates come from a counter-based generator, so element i
// of the flat buffer depends only on (seed, i), never on the thread count or the order in
// which tensors are filled: two splitmix64 outputs (Steele, Lea & Flood 2014) at counters
// 2i and 2i+1 of a stream keyed by splitmix64(seed) give two uniforms for one Box–Muller
// transform (the cosine half). It is computed in double and rounded to Scalar, so a float
// and a double model with the same seed hold the same parameters up to float rounding.
//
// Dropout (gpt_model.hpp) draws from the same generator, keyed by backend::dropout_key(dropout
// seed, dropout step, site, layer): the embedding is site 0 (layer 0), the attention
// probabilities of layer l site 1, linear_proj's bias-dropout-add site 2, linear_fc2's site 3.
// Mask indices are row-major element indices of the dropped tensor: (B, T, C) for the hidden
// sites, (B, NH, T, T) for the probabilities (an index space only: the blockwise attention
// draws the elements of the blocks it computes, attention.hpp). Nothing is generated for a
// p = 0 site. Attention runs with NG = NH query groups (multi-head attention).
#include "backend/model/gpt_model.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <unordered_map>
#include <utility>

#include "backend/common/error.hpp"
#include "backend/common/splitmix64.hpp"
#include "backend/ops/attention.hpp"
#include "backend/ops/cross_entropy.hpp"
#include "backend/ops/dropout.hpp"
#include "backend/ops/embedding.hpp"
#include "backend/ops/gelu.hpp"
#include "backend/ops/layernorm.hpp"
#include "backend/ops/linear.hpp"
#include "backend/ops/residual.hpp"

namespace backend {
namespace {

using common::splitmix64_at;
using common::splitmix64_mix;

// Standard normal deviates 2·pair and 2·pair + 1 of the stream keyed by `key`: Box–Muller
// turns one pair of uniforms into two independent normals (cos and sin), so every deviate
// still depends only on (key, index), never on which thread computed it.
std::pair<double, double> standard_normal_pair(uint64_t key, uint64_t pair) {
  constexpr double kTwoToMinus53 = 0x1.0p-53;
  // u1 in (0, 1] keeps the logarithm finite; u2 in [0, 1).
  const double u1 = static_cast<double>((splitmix64_at(key, 2 * pair) >> 11) + 1) * kTwoToMinus53;
  const double u2 = static_cast<double>(splitmix64_at(key, 2 * pair + 1) >> 11) * kTwoToMinus53;
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * std::numbers::pi * u2;
  return {radius * std::cos(angle), radius * std::sin(angle)};
}

enum class Init { normal, scaled_normal, zeros, ones };

// Where a dropout mask applies; part of its key.
enum class DropoutSite : uint64_t {
  embedding = 0,
  attention = 1,
  attention_output = 2,
  mlp_output = 3
};

// Offsets into the flat parameter (and gradient) buffer of one transformer layer's tensors.
struct LayerParameters {
  int64_t input_norm_weight, input_norm_bias;
  int64_t qkv_weight, qkv_bias;
  int64_t proj_weight, proj_bias;
  int64_t mlp_norm_weight, mlp_norm_bias;
  int64_t fc1_weight, fc1_bias;
  int64_t fc2_weight, fc2_bias;
};

// What one layer's forward keeps for its backward. Its input is the previous layer's
// `output` (or the embedding output for layer 0).
template <typename Scalar>
struct LayerActivations {
  std::vector<Scalar> input_norm, input_norm_mean, input_norm_rstd;  // (B,T,C), (B,T), (B,T)
  std::vector<Scalar> qkv;                                           // (B, T, 3C)
  std::vector<Scalar> attention_logsumexp;                           // (B, NH, T)
  std::vector<Scalar> context;                                       // (B, T, C)
  std::vector<Scalar> attention_residual;                            // (B, T, C)
  std::vector<Scalar> mlp_norm, mlp_norm_mean, mlp_norm_rstd;        // (B,T,C), (B,T), (B,T)
  std::vector<Scalar> fc1;                                           // (B, T, F) before gelu
  std::vector<Scalar> gelu;                                          // (B, T, F)
  std::vector<Scalar> output;                                        // (B, T, C)
};

}  // namespace

template <typename Scalar>
struct GptModel<Scalar>::State {
  GptConfig config;
  std::vector<ParameterTensor> tensors;
  std::vector<Init> tensor_init;  // parallel to `tensors`
  std::unordered_map<std::string, size_t> tensor_index;
  std::vector<Scalar> parameters;
  std::vector<Scalar> gradients;

  int64_t word_embeddings = 0;
  int64_t position_embeddings = 0;
  std::vector<LayerParameters> layer_parameters;
  int64_t final_norm_weight = 0;
  int64_t final_norm_bias = 0;

  // Dropout: the mode and the generator's state for the next forward, and what the last
  // forward used (the backward regenerates its masks from these).
  bool training = true;
  uint64_t dropout_seed = 0;
  uint64_t dropout_step = 0;
  bool forward_training = false;
  uint64_t forward_dropout_seed = 0;
  uint64_t forward_dropout_step = 0;

  // Activations of the last forward, sized for (batch_size, seq_length).
  int64_t batch_size = 0;
  int64_t seq_length = 0;
  bool has_forward = false;
  std::vector<int32_t> tokens, labels;  // (B, T)
  std::vector<Scalar> embedded;         // (B, T, C)
  std::vector<LayerActivations<Scalar>> layers;
  std::vector<Scalar> final_norm, final_norm_mean, final_norm_rstd;  // (B,T,C), (B,T), (B,T)
  std::vector<Scalar> logits;                                        // (B, T, V)
  std::vector<Scalar> losses, logsumexp;                             // (B, T)
  std::vector<Scalar> branch;  // (B, T, C) linear_proj / fc2 out

  // Backward scratch, same (B, T). The logits stay intact so backward() can be repeated.
  std::vector<Scalar> dlogits;    // (B, T, V)
  std::vector<Scalar> dresidual;  // (B, T, C) residual stream
  std::vector<Scalar> dbranch;    // (B, T, C)
  std::vector<Scalar> dnorm;      // (B, T, C)
  std::vector<Scalar> dqkv;       // (B, T, 3C)
  std::vector<Scalar> dhidden;    // (B, T, F)

  int64_t add_tensor(std::string name, std::vector<int64_t> shape, Init init) {
    int64_t numel = 1;
    for (int64_t extent : shape) numel *= extent;
    const int64_t offset = tensors.empty() ? 0 : tensors.back().offset + tensors.back().numel;
    // Megatron's default: no weight decay on biases and norm parameters (the 1-D tensors).
    const bool weight_decay = shape.size() > 1;
    tensor_index.emplace(name, tensors.size());
    tensors.push_back({std::move(name), std::move(shape), offset, numel, weight_decay});
    tensor_init.push_back(init);
    return offset;
  }

  Scalar* parameter(int64_t offset) { return parameters.data() + offset; }
  Scalar* gradient(int64_t offset) { return gradients.data() + offset; }

  // The last forward's mask at a site: inactive (p = 0) in evaluation mode or for p = 0.
  Dropout dropout(DropoutSite site, int64_t layer) const {
    const double probability =
        site == DropoutSite::attention ? config.attention_dropout : config.hidden_dropout;
    if (!forward_training || probability == 0) return {};
    return {probability, dropout_key(forward_dropout_seed, forward_dropout_step,
                                     static_cast<uint64_t>(site), static_cast<uint64_t>(layer))};
  }

  void resize_activations(int64_t new_batch_size, int64_t new_seq_length);
};

template <typename Scalar>
void GptModel<Scalar>::State::resize_activations(int64_t new_batch_size, int64_t new_seq_length) {
  if (new_batch_size == batch_size && new_seq_length == seq_length) return;
  batch_size = new_batch_size;
  seq_length = new_seq_length;
  const auto rows = static_cast<size_t>(batch_size * seq_length);
  const auto C = static_cast<size_t>(config.hidden_size);
  const auto F = static_cast<size_t>(config.ffn_hidden_size);
  const auto V = static_cast<size_t>(config.padded_vocab_size);
  const auto NH = static_cast<size_t>(config.num_attention_heads);
  const auto T = static_cast<size_t>(seq_length);
  // Swap in a fresh vector rather than resize(): a smaller shape gives its memory back too.
  auto size = [](std::vector<Scalar>& buffer, size_t count) {
    std::vector<Scalar>(count).swap(buffer);
  };
  size(embedded, rows * C);
  layers.resize(static_cast<size_t>(config.num_layers));
  for (LayerActivations<Scalar>& layer : layers) {
    size(layer.input_norm, rows * C);
    size(layer.input_norm_mean, rows);
    size(layer.input_norm_rstd, rows);
    size(layer.qkv, rows * 3 * C);
    size(layer.attention_logsumexp, static_cast<size_t>(batch_size) * NH * T);
    size(layer.context, rows * C);
    size(layer.attention_residual, rows * C);
    size(layer.mlp_norm, rows * C);
    size(layer.mlp_norm_mean, rows);
    size(layer.mlp_norm_rstd, rows);
    size(layer.fc1, rows * F);
    size(layer.gelu, rows * F);
    size(layer.output, rows * C);
  }
  size(final_norm, rows * C);
  size(final_norm_mean, rows);
  size(final_norm_rstd, rows);
  size(logits, rows * V);
  size(losses, rows);
  size(logsumexp, rows);
  size(branch, rows * C);
  size(dlogits, rows * V);
  size(dresidual, rows * C);
  size(dbranch, rows * C);
  size(dnorm, rows * C);
  size(dqkv, rows * 3 * C);
  size(dhidden, rows * F);
}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config) : state_(std::make_unique<State>()) {
  validate(config);
  State& s = *state_;
  s.config = config;
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  s.word_embeddings =
      s.add_tensor("embedding.word_embeddings.weight", {config.padded_vocab_size, C}, Init::normal);
  s.position_embeddings = s.add_tensor("embedding.position_embeddings.weight",
                                       {config.max_position_embeddings, C}, Init::normal);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string prefix = "decoder.layers." + std::to_string(i) + ".";
    LayerParameters layer{};
    layer.input_norm_weight = s.add_tensor(prefix + "input_layernorm.weight", {C}, Init::ones);
    layer.input_norm_bias = s.add_tensor(prefix + "input_layernorm.bias", {C}, Init::zeros);
    layer.qkv_weight =
        s.add_tensor(prefix + "self_attention.linear_qkv.weight", {3 * C, C}, Init::normal);
    layer.qkv_bias = s.add_tensor(prefix + "self_attention.linear_qkv.bias", {3 * C}, Init::zeros);
    layer.proj_weight =
        s.add_tensor(prefix + "self_attention.linear_proj.weight", {C, C}, Init::scaled_normal);
    layer.proj_bias = s.add_tensor(prefix + "self_attention.linear_proj.bias", {C}, Init::zeros);
    layer.mlp_norm_weight = s.add_tensor(prefix + "pre_mlp_layernorm.weight", {C}, Init::ones);
    layer.mlp_norm_bias = s.add_tensor(prefix + "pre_mlp_layernorm.bias", {C}, Init::zeros);
    layer.fc1_weight = s.add_tensor(prefix + "mlp.linear_fc1.weight", {F, C}, Init::normal);
    layer.fc1_bias = s.add_tensor(prefix + "mlp.linear_fc1.bias", {F}, Init::zeros);
    layer.fc2_weight = s.add_tensor(prefix + "mlp.linear_fc2.weight", {C, F}, Init::scaled_normal);
    layer.fc2_bias = s.add_tensor(prefix + "mlp.linear_fc2.bias", {C}, Init::zeros);
    s.layer_parameters.push_back(layer);
  }
  s.final_norm_weight = s.add_tensor("decoder.final_layernorm.weight", {C}, Init::ones);
  s.final_norm_bias = s.add_tensor("decoder.final_layernorm.bias", {C}, Init::zeros);
  const auto total = static_cast<size_t>(s.tensors.back().offset + s.tensors.back().numel);
  s.parameters.assign(total, Scalar{0});
  s.gradients.assign(total, Scalar{0});
}

template <typename Scalar>
GptModel<Scalar>::~GptModel() = default;
template <typename Scalar>
GptModel<Scalar>::GptModel(GptModel&&) noexcept = default;
template <typename Scalar>
GptModel<Scalar>& GptModel<Scalar>::operator=(GptModel&&) noexcept = default;

template <typename Scalar>
const GptConfig& GptModel<Scalar>::config() const {
  return state_->config;
}

template <typename Scalar>
const std::vector<ParameterTensor>& GptModel<Scalar>::tensors() const {
  return state_->tensors;
}

template <typename Scalar>
const ParameterTensor& GptModel<Scalar>::tensor(const std::string& name) const {
  const State& s = *state_;
  const auto found = s.tensor_index.find(name);
  if (found == s.tensor_index.end()) {
    const auto& t = s.tensors;
    common::fail(
        "unknown parameter tensor '{}'; this model has {} tensors, e.g. {}, {}, {}, {}, "
        "decoder.layers.{{0..{}}}.mlp.linear_fc1.weight",
        name, t.size(), t[0].name, t[1].name, t[2].name, t.back().name, s.config.num_layers - 1);
  }
  return s.tensors[found->second];
}

template <typename Scalar>
std::span<Scalar> GptModel<Scalar>::parameters() {
  return state_->parameters;
}
template <typename Scalar>
std::span<const Scalar> GptModel<Scalar>::parameters() const {
  return state_->parameters;
}
template <typename Scalar>
std::span<Scalar> GptModel<Scalar>::gradients() {
  return state_->gradients;
}
template <typename Scalar>
std::span<const Scalar> GptModel<Scalar>::gradients() const {
  return state_->gradients;
}

template <typename Scalar>
void GptModel<Scalar>::init_parameters(uint64_t seed) {
  State& s = *state_;
  const uint64_t key = splitmix64_mix(seed);
  const double base_std = s.config.init_method_std;
  const double scaled_std = base_std / std::sqrt(2.0 * static_cast<double>(s.config.num_layers));
  for (size_t t = 0; t < s.tensors.size(); ++t) {
    const ParameterTensor& tensor = s.tensors[t];
    Scalar* values = s.parameter(tensor.offset);
    const Init init = s.tensor_init[t];
    if (init == Init::zeros || init == Init::ones) {
      std::fill_n(values, tensor.numel, static_cast<Scalar>(init == Init::ones ? 1 : 0));
      continue;
    }
    const double tensor_std = init == Init::scaled_normal ? scaled_std : base_std;
    // Deviate g of the whole buffer is element g % 2 of pair g / 2.
    const int64_t first_pair = tensor.offset / 2;
    const int64_t last_pair = (tensor.offset + tensor.numel - 1) / 2;
#pragma omp parallel for if (tensor.numel > (1 << 14))
    for (int64_t pair = first_pair; pair <= last_pair; ++pair) {
      const auto [even, odd] = standard_normal_pair(key, static_cast<uint64_t>(pair));
      for (int64_t g = 2 * pair; g <= 2 * pair + 1; ++g) {
        const int64_t i = g - tensor.offset;
        if (i >= 0 && i < tensor.numel) {
          values[i] = static_cast<Scalar>(tensor_std * (g % 2 == 0 ? even : odd));
        }
      }
    }
  }
}

template <typename Scalar>
Scalar GptModel<Scalar>::forward(std::span<const int32_t> tokens, std::span<const int32_t> labels,
                                 int64_t batch_size, int64_t seq_length) {
  State& s = *state_;
  const GptConfig& config = s.config;
  // A forward that fails leaves nothing to differentiate: a backward() after it must not
  // silently reuse the micro batch before.
  s.has_forward = false;
  if (batch_size < 1) common::fail("batch size must be at least 1, got {}", batch_size);
  if (seq_length < 1 || seq_length > config.max_position_embeddings) {
    common::fail("sequence length {} is outside [1, {}] (--max-position-embeddings)", seq_length,
                 config.max_position_embeddings);
  }
  const int64_t rows = batch_size * seq_length;
  auto check_ids = [&](std::span<const int32_t> ids, const char* what) {
    if (static_cast<int64_t>(ids.size()) != rows) {
      common::fail("{} has {} entries, expected batch size {} × sequence length {} = {}", what,
                   ids.size(), batch_size, seq_length, rows);
    }
    for (int64_t i = 0; i < rows; ++i) {
      const int32_t id = ids[static_cast<size_t>(i)];
      if (id < 0 || id >= config.vocab_size) {
        common::fail(
            "{} value {} at index {} (batch row {}, position {}) is outside the "
            "vocabulary [0, {})",
            what, id, i, i / seq_length, i % seq_length, config.vocab_size);
      }
    }
  };
  check_ids(tokens, "tokens");
  check_ids(labels, "labels");

  s.resize_activations(batch_size, seq_length);
  s.forward_training = s.training;
  s.forward_dropout_seed = s.dropout_seed;
  s.forward_dropout_step = s.dropout_step;
  if (s.training) ++s.dropout_step;
  s.tokens.assign(tokens.begin(), tokens.end());
  s.labels.assign(labels.begin(), labels.end());

  const int64_t B = batch_size;
  const int64_t T = seq_length;
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t V = config.padded_vocab_size;
  const int64_t NH = config.num_attention_heads;
  const auto epsilon = static_cast<Scalar>(config.layernorm_epsilon);

  cpu::embedding_forward(s.embedded.data(), s.tokens.data(), s.parameter(s.word_embeddings),
                         s.parameter(s.position_embeddings), B, T, C);
  if (const Dropout d = s.dropout(DropoutSite::embedding, 0); d.active()) {
    cpu::dropout_forward(s.embedded.data(), s.embedded.data(), rows * C, d);
  }
  const Scalar* layer_input = s.embedded.data();
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const LayerParameters& p = s.layer_parameters[static_cast<size_t>(l)];
    LayerActivations<Scalar>& a = s.layers[static_cast<size_t>(l)];
    cpu::layernorm_forward(a.input_norm.data(), a.input_norm_mean.data(), a.input_norm_rstd.data(),
                           layer_input, s.parameter(p.input_norm_weight),
                           s.parameter(p.input_norm_bias), epsilon, rows, C);
    cpu::linear_forward(a.qkv.data(), a.input_norm.data(), s.parameter(p.qkv_weight),
                        s.parameter(p.qkv_bias), rows, C, 3 * C);
    cpu::attention_forward(a.context.data(), a.attention_logsumexp.data(), a.qkv.data(), B, T, C,
                           NH, NH, s.dropout(DropoutSite::attention, l));
    cpu::linear_forward(s.branch.data(), a.context.data(), s.parameter(p.proj_weight),
                        s.parameter(p.proj_bias), rows, C, C);
    if (const Dropout d = s.dropout(DropoutSite::attention_output, l); d.active()) {
      cpu::dropout_forward(s.branch.data(), s.branch.data(), rows * C, d);
    }
    cpu::residual_forward(a.attention_residual.data(), layer_input, s.branch.data(), rows * C);
    cpu::layernorm_forward(a.mlp_norm.data(), a.mlp_norm_mean.data(), a.mlp_norm_rstd.data(),
                           a.attention_residual.data(), s.parameter(p.mlp_norm_weight),
                           s.parameter(p.mlp_norm_bias), epsilon, rows, C);
    cpu::linear_forward(a.fc1.data(), a.mlp_norm.data(), s.parameter(p.fc1_weight),
                        s.parameter(p.fc1_bias), rows, C, F);
    cpu::gelu_forward(a.gelu.data(), a.fc1.data(), rows * F);
    cpu::linear_forward(s.branch.data(), a.gelu.data(), s.parameter(p.fc2_weight),
                        s.parameter(p.fc2_bias), rows, F, C);
    if (const Dropout d = s.dropout(DropoutSite::mlp_output, l); d.active()) {
      cpu::dropout_forward(s.branch.data(), s.branch.data(), rows * C, d);
    }
    cpu::residual_forward(a.output.data(), a.attention_residual.data(), s.branch.data(), rows * C);
    layer_input = a.output.data();
  }
  cpu::layernorm_forward(s.final_norm.data(), s.final_norm_mean.data(), s.final_norm_rstd.data(),
                         layer_input, s.parameter(s.final_norm_weight),
                         s.parameter(s.final_norm_bias), epsilon, rows, C);
  // The output layer is tied to the word embedding: logits = final_norm · word_embeddings^T.
  cpu::linear_forward(s.logits.data(), s.final_norm.data(), s.parameter(s.word_embeddings), nullptr,
                      rows, C, V);
  cpu::cross_entropy_forward(s.losses.data(), s.logsumexp.data(), s.logits.data(), s.labels.data(),
                             rows, V);
  s.has_forward = true;

  // Summed in a fixed order (and in double) so the loss does not depend on the thread count.
  double total = 0;
  for (const Scalar loss : s.losses) total += static_cast<double>(loss);
  return static_cast<Scalar>(total / static_cast<double>(rows));
}

template <typename Scalar>
void GptModel<Scalar>::backward(Scalar grad_scale) {
  State& s = *state_;
  if (!s.has_forward) {
    common::fail(
        "GptModel::backward() called without a completed forward(); run forward() on "
        "the micro batch first");
  }
  const GptConfig& config = s.config;
  const int64_t B = s.batch_size;
  const int64_t T = s.seq_length;
  const int64_t rows = B * T;
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t V = config.padded_vocab_size;
  const int64_t NH = config.num_attention_heads;

  // d(mean loss)/dlogits · grad_scale: every later gradient is linear in dlogits, so the
  // scale is applied once here.
  cpu::cross_entropy_backward(s.dlogits.data(), s.logits.data(), s.logsumexp.data(),
                              s.labels.data(), grad_scale / static_cast<Scalar>(rows), rows, V);
  cpu::linear_backward(s.dnorm.data(), s.gradient(s.word_embeddings), nullptr, s.dlogits.data(),
                       s.final_norm.data(), s.parameter(s.word_embeddings), rows, C, V);
  const Scalar* last_output = s.layers.back().output.data();  // validate(): num_layers ≥ 1
  cpu::layernorm_backward(s.dresidual.data(), s.gradient(s.final_norm_weight),
                          s.gradient(s.final_norm_bias), s.dnorm.data(), last_output,
                          s.parameter(s.final_norm_weight), s.final_norm_mean.data(),
                          s.final_norm_rstd.data(), rows, C);

  for (int64_t l = config.num_layers - 1; l >= 0; --l) {
    const LayerParameters& p = s.layer_parameters[static_cast<size_t>(l)];
    const LayerActivations<Scalar>& a = s.layers[static_cast<size_t>(l)];
    const Scalar* layer_input =
        l == 0 ? s.embedded.data() : s.layers[static_cast<size_t>(l - 1)].output.data();

    // MLP block; dresidual is the gradient of both the block output and the dropped fc2
    // output, whose mask turns it into fc2's output gradient (in dbranch, free until the
    // layernorm backward below).
    const Scalar* dmlp_output = s.dresidual.data();
    if (const Dropout d = s.dropout(DropoutSite::mlp_output, l); d.active()) {
      cpu::dropout_backward(s.dbranch.data(), s.dresidual.data(), rows * C, d);
      dmlp_output = s.dbranch.data();
    }
    cpu::linear_backward(s.dhidden.data(), s.gradient(p.fc2_weight), s.gradient(p.fc2_bias),
                         dmlp_output, a.gelu.data(), s.parameter(p.fc2_weight), rows, F, C);
    cpu::gelu_backward(s.dhidden.data(), s.dhidden.data(), a.fc1.data(), rows * F);
    cpu::linear_backward(s.dnorm.data(), s.gradient(p.fc1_weight), s.gradient(p.fc1_bias),
                         s.dhidden.data(), a.mlp_norm.data(), s.parameter(p.fc1_weight), rows, C,
                         F);
    cpu::layernorm_backward(s.dbranch.data(), s.gradient(p.mlp_norm_weight),
                            s.gradient(p.mlp_norm_bias), s.dnorm.data(),
                            a.attention_residual.data(), s.parameter(p.mlp_norm_weight),
                            a.mlp_norm_mean.data(), a.mlp_norm_rstd.data(), rows, C);
    cpu::residual_forward(s.dresidual.data(), s.dresidual.data(), s.dbranch.data(), rows * C);

    // Attention block, the same way.
    const Scalar* dattention_output = s.dresidual.data();
    if (const Dropout d = s.dropout(DropoutSite::attention_output, l); d.active()) {
      cpu::dropout_backward(s.dbranch.data(), s.dresidual.data(), rows * C, d);
      dattention_output = s.dbranch.data();
    }
    cpu::linear_backward(s.dnorm.data(), s.gradient(p.proj_weight), s.gradient(p.proj_bias),
                         dattention_output, a.context.data(), s.parameter(p.proj_weight), rows, C,
                         C);
    cpu::attention_backward(s.dqkv.data(), s.dnorm.data(), a.qkv.data(), a.context.data(),
                            a.attention_logsumexp.data(), B, T, C, NH, NH,
                            s.dropout(DropoutSite::attention, l));
    cpu::linear_backward(s.dnorm.data(), s.gradient(p.qkv_weight), s.gradient(p.qkv_bias),
                         s.dqkv.data(), a.input_norm.data(), s.parameter(p.qkv_weight), rows, C,
                         3 * C);
    cpu::layernorm_backward(s.dbranch.data(), s.gradient(p.input_norm_weight),
                            s.gradient(p.input_norm_bias), s.dnorm.data(), layer_input,
                            s.parameter(p.input_norm_weight), a.input_norm_mean.data(),
                            a.input_norm_rstd.data(), rows, C);
    cpu::residual_forward(s.dresidual.data(), s.dresidual.data(), s.dbranch.data(), rows * C);
  }

  if (const Dropout d = s.dropout(DropoutSite::embedding, 0); d.active()) {
    cpu::dropout_backward(s.dresidual.data(), s.dresidual.data(), rows * C, d);
  }
  cpu::embedding_backward(s.gradient(s.word_embeddings), s.gradient(s.position_embeddings),
                          s.dresidual.data(), s.tokens.data(), B, T, C);
}

template <typename Scalar>
void GptModel<Scalar>::zero_gradients() {
  std::fill(state_->gradients.begin(), state_->gradients.end(), Scalar{0});
}

template <typename Scalar>
void GptModel<Scalar>::set_training(bool training) {
  state_->training = training;
}

template <typename Scalar>
void GptModel<Scalar>::set_dropout_seed(uint64_t seed) {
  state_->dropout_seed = seed;
}

template <typename Scalar>
uint64_t GptModel<Scalar>::dropout_seed() const {
  return state_->dropout_seed;
}

template <typename Scalar>
uint64_t GptModel<Scalar>::dropout_step() const {
  return state_->dropout_step;
}

template <typename Scalar>
void GptModel<Scalar>::set_dropout_step(uint64_t step) {
  state_->dropout_step = step;
}

template class GptModel<float>;
template class GptModel<double>;

}  // namespace backend
