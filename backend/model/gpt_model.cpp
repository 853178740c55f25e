// GptModel: the forward and backward of the decoder that gpt_model.hpp describes, composed
// once from the Device's ops (device/device.hpp; llm.c's gpt2_forward / gpt2_backward, with
// Megatron core's parameter names, layouts and initialisation). The parameter layout and its
// initialisation are parameter_layout.cpp's, the activation buffers and the recompute schedule
// activation_plan.cpp's; this file is the order of the ops.
//
// Dropout (gpt_model.hpp) draws from a counter-based generator (splitmix64), keyed by backend::dropout_key(dropout
// seed, dropout step, site, layer): the embedding is site 0 (layer 0), the attention
// probabilities of layer l site 1, linear_proj's bias-dropout-add site 2, linear_fc2's site 3.
// Mask indices are row-major element indices of the dropped tensor: (B, T, C) for the hidden
// sites, (B, NH, T, T) for the probabilities (an index space only: the blockwise attention
// draws the elements of the blocks it computes, attention.hpp). Nothing is generated for a
// p = 0 site.
//
// The Llama switches change the composition, not the ops' contracts: a tensor the
// configuration leaves out (position table with RoPE, norm biases with RMSNorm, linear biases
// with --disable-bias-linear) has no entry in the flat buffer at all, and its place in the
// op calls is an empty View. RoPE rotates the q and k heads of the fused qkv activation in place
// after linear_qkv, so the stored qkv is what attention saw, and the backward rotates dqkv
// back before linear_qkv's backward.
#include "backend/model/gpt_model.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/arena.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/model/activation_plan.hpp"

namespace backend {
namespace {

// Where a dropout mask applies; part of its key.
enum class DropoutSite : uint64_t {
  embedding = 0,
  attention = 1,
  attention_output = 2,
  mlp_output = 3
};

// One layer's buffers (activation_plan.hpp's LayerActivationRegions, as views).
struct LayerActivations {
  View input_norm, input_norm_mean, input_norm_rstd;
  View qkv;
  View attention_logsumexp;
  View context;
  View attention_residual;
  View mlp_norm, mlp_norm_mean, mlp_norm_rstd;
  View fc1;
  View activation;
  View output;
};

LayerActivations layer_views(const Arena& arena, const LayerActivationRegions& r) {
  return {arena.view(r.input_norm), arena.view(r.input_norm_mean), arena.view(r.input_norm_rstd),
          arena.view(r.qkv),        arena.view(r.attention_logsumexp), arena.view(r.context),
          arena.view(r.attention_residual), arena.view(r.mlp_norm), arena.view(r.mlp_norm_mean),
          arena.view(r.mlp_norm_rstd), arena.view(r.fc1), arena.view(r.activation),
          arena.view(r.output)};
}

}  // namespace

template <typename Scalar>
struct GptModel<Scalar>::State {
  State(const GptConfig& model_config, Device* borrowed)
      : config(model_config), layout(config), schedule(config) {
    if (borrowed == nullptr) {
      owned_device = std::make_unique<CpuDevice>();
      borrowed = owned_device.get();
    }
    device = borrowed;
    // Parameters and gradients: one arena of two regions of the same layout.
    ArenaLayout parameter_layout;
    const int64_t count = layout.numel();
    const int64_t parameter_region = parameter_layout.add("parameters", kElementType, count);
    const int64_t gradient_region = parameter_layout.add("gradients", kElementType, count);
    parameter_arena = Arena(*device, std::move(parameter_layout), "parameters");
    parameters = parameter_arena.view(parameter_region);
    gradients = parameter_arena.view(gradient_region);
  }

  static constexpr ElementType kElementType = element_type_of<Scalar>();

  GptConfig config;
  ParameterLayout layout;
  RecomputeSchedule schedule;
  std::unique_ptr<Device> owned_device;  // the CpuDevice of GptModel(config)
  Device* device = nullptr;
  Arena parameter_arena;
  View parameters, gradients;

  // Dropout: the mode and the generator's state for the next forward, and what the last
  // forward used (the backward regenerates its masks from these).
  bool training = true;
  uint64_t dropout_seed = 0;
  uint64_t dropout_step = 0;
  bool forward_training = false;
  uint64_t forward_dropout_seed = 0;
  uint64_t forward_dropout_step = 0;

  // The activations of the reserved shape (reserve()), and whether the last forward completed.
  ActivationPlan plan;
  Arena activation_arena;
  int64_t batch_size = 0;
  int64_t seq_length = 0;
  bool has_forward = false;
  std::vector<LayerActivations> layers;
  std::vector<LayerActivations> recompute_slots;
  View tokens, labels, embedded, recomputed_logsumexp, final_norm, final_norm_mean,
      final_norm_rstd, logits, losses, logsumexp, loss_total, branch, rope_cos, rope_sin;
  View dlogits, dresidual, dbranch, dnorm, dqkv, dhidden, dfc1;

  Device& ops() { return *device; }

  // A parameter tensor (or its gradient) by offset: an empty view for an absent one.
  View parameter(int64_t offset) const { return tensor_view(parameters, offset); }
  View gradient(int64_t offset) const { return tensor_view(gradients, offset); }
  View tensor_view(View buffer, int64_t offset) const {
    if (offset == kAbsentTensor) return View{nullptr, 0, kElementType, buffer.on};
    return buffer.slice(offset, numel_at(offset));
  }
  // The element count of the tensor at `offset` (the word embedding serves two roles when
  // tied, so offsets, not names, identify the tensors here; they increase in table order).
  int64_t numel_at(int64_t offset) const {
    const auto& tensors = layout.tensors();
    const auto found = std::lower_bound(
        tensors.begin(), tensors.end(), offset,
        [](const ParameterTensor& tensor, int64_t value) { return tensor.offset < value; });
    if (found == tensors.end() || found->offset != offset) {
      common::fail("no parameter tensor starts at offset {}", offset);
    }
    return found->numel;
  }

  int64_t rows() const { return batch_size * seq_length; }
  bool rms_norm() const { return config.normalization == Normalization::rms_norm; }
  bool rope() const { return config.position_embedding_type == PositionEmbeddingType::rope; }

  // One of the model's three norms (--normalization); mean is unused by RMSNorm.
  void norm_forward(View output, View mean, View rstd, View input, int64_t weight, int64_t bias) {
    if (rms_norm()) {
      ops().rmsnorm_forward(output, rstd, input, parameter(weight), config.layernorm_epsilon,
                            rows(), config.hidden_size);
    } else {
      ops().layernorm_forward(output, mean, rstd, input, parameter(weight), parameter(bias),
                              config.layernorm_epsilon, rows(), config.hidden_size);
    }
  }
  void norm_backward(View dinput, int64_t weight, int64_t bias, View doutput, View input,
                     View mean, View rstd) {
    if (rms_norm()) {
      ops().rmsnorm_backward(dinput, gradient(weight), doutput, input, parameter(weight), rstd,
                             rows(), config.hidden_size);
    } else {
      ops().layernorm_backward(dinput, gradient(weight), gradient(bias), doutput, input,
                               parameter(weight), mean, rstd, rows(), config.hidden_size);
    }
  }

  // RoPE on the q and k heads of a fused qkv activation (B, T, QKV), in place: per query
  // group the layout is [NH/NG query heads | key | value], so the first NH/NG + 1 heads of
  // every group rotate (with NG = NH: q and k of every [q | k | v]). The backward rotates a
  // gradient back.
  void rotate_queries_and_keys(View qkv, bool backward) {
    const int64_t HD = config.head_dim();
    const int64_t rotated = config.num_attention_heads / config.query_groups() + 1;
    const int64_t group_width = (rotated + 1) * HD;
    for (int64_t g = 0; g < config.query_groups(); ++g) {
      const View group = qkv.tail(g * group_width);
      if (backward) {
        ops().rope_backward(group, group, rope_cos, rope_sin, batch_size, seq_length, rotated, HD,
                            config.rotary_dim(), config.qkv_features());
      } else {
        ops().rope_forward(group, group, rope_cos, rope_sin, batch_size, seq_length, rotated, HD,
                           config.rotary_dim(), config.qkv_features());
      }
    }
  }

  // The last forward's mask at a site: inactive (p = 0) in evaluation mode or for p = 0.
  Dropout dropout(DropoutSite site, int64_t layer) const {
    const double probability =
        site == DropoutSite::attention ? config.attention_dropout : config.hidden_dropout;
    if (!forward_training || probability == 0) return {};
    return {probability, dropout_key(forward_dropout_seed, forward_dropout_step,
                                     static_cast<uint64_t>(site), static_cast<uint64_t>(layer))};
  }

  LayerActivations& activations(int64_t l) {
    return schedule.recomputed(l)
               ? recompute_slots[static_cast<size_t>(l - schedule.chunk_begin(l))]
               : layers[static_cast<size_t>(l)];
  }
  View layer_output(int64_t l) {
    const View kept = layers[static_cast<size_t>(l)].output;
    return kept.empty() ? activations(l).output : kept;
  }
  // The input of layer l: the embedding output for layer 0, else layer l − 1's output.
  View layer_input(int64_t l) { return l == 0 ? embedded : layer_output(l - 1); }
  View attention_logsumexp(const LayerActivations& a) const {
    return schedule.selective() ? recomputed_logsumexp : a.attention_logsumexp;
  }

  void reserve(int64_t new_batch_size, int64_t new_seq_length);
  void layer_forward(int64_t l);
  void layer_backward(int64_t l);
};

template <typename Scalar>
void GptModel<Scalar>::State::reserve(int64_t new_batch_size, int64_t new_seq_length) {
  if (new_batch_size == batch_size && new_seq_length == seq_length) return;
  ActivationPlan new_plan =
      plan_activations(config, schedule, new_batch_size, new_seq_length, kElementType);
  // The old arena goes first: a smaller shape gives its memory back, a larger one does not
  // need both at once.
  has_forward = false;
  batch_size = seq_length = 0;
  activation_arena = Arena();
  activation_arena = Arena(ops(), new_plan.layout, "activations");
  plan = std::move(new_plan);
  batch_size = new_batch_size;
  seq_length = new_seq_length;
  const Arena& a = activation_arena;
  layers.clear();
  for (const auto& regions : plan.layers) layers.push_back(layer_views(a, regions));
  recompute_slots.clear();
  for (const auto& regions : plan.recompute_slots) recompute_slots.push_back(layer_views(a, regions));
  tokens = a.view(plan.tokens);
  labels = a.view(plan.labels);
  embedded = a.view(plan.embedded);
  recomputed_logsumexp = a.view(plan.recomputed_logsumexp);
  final_norm = a.view(plan.final_norm);
  final_norm_mean = a.view(plan.final_norm_mean);
  final_norm_rstd = a.view(plan.final_norm_rstd);
  logits = a.view(plan.logits);
  losses = a.view(plan.losses);
  logsumexp = a.view(plan.logsumexp);
  loss_total = a.view(plan.loss_total);
  branch = a.view(plan.branch);
  rope_cos = a.view(plan.rope_cos);
  rope_sin = a.view(plan.rope_sin);
  dlogits = a.view(plan.dlogits);
  dresidual = a.view(plan.dresidual);
  dbranch = a.view(plan.dbranch);
  dnorm = a.view(plan.dnorm);
  dqkv = a.view(plan.dqkv);
  dhidden = a.view(plan.dhidden);
  dfc1 = a.view(plan.dfc1);
  if (rope()) {
    ops().rope_tables(rope_cos, rope_sin, seq_length, config.rotary_dim(),
                      static_cast<double>(config.rotary_base));
  }
}

// One transformer layer of the reserved shape: reads the previous layer's output (or the
// embedding) and fills its activations.
template <typename Scalar>
void GptModel<Scalar>::State::layer_forward(int64_t l) {
  const LayerParameters& p = layout.layer(l);
  LayerActivations& a = activations(l);
  const View input = layer_input(l);
  const View output = layer_output(l);
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t NH = config.num_attention_heads;
  Device& d = ops();

  norm_forward(a.input_norm, a.input_norm_mean, a.input_norm_rstd, input, p.input_norm_weight,
               p.input_norm_bias);
  d.linear_forward(a.qkv, a.input_norm, parameter(p.qkv_weight), parameter(p.qkv_bias), rows(), C,
                   config.qkv_features());
  if (rope()) rotate_queries_and_keys(a.qkv, false);
  d.attention_forward(a.context, attention_logsumexp(a), a.qkv, batch_size, seq_length, C, NH,
                      config.query_groups(), dropout(DropoutSite::attention, l));
  d.linear_forward(branch, a.context, parameter(p.proj_weight), parameter(p.proj_bias), rows(), C,
                   C);
  if (const Dropout mask = dropout(DropoutSite::attention_output, l); mask.active()) {
    d.dropout_forward(branch, branch, mask);
  }
  d.residual_forward(a.attention_residual, input, branch);

  norm_forward(a.mlp_norm, a.mlp_norm_mean, a.mlp_norm_rstd, a.attention_residual,
               p.mlp_norm_weight, p.mlp_norm_bias);
  d.linear_forward(a.fc1, a.mlp_norm, parameter(p.fc1_weight), parameter(p.fc1_bias), rows(), C,
                   config.fc1_features());
  if (config.swiglu) {
    d.swiglu_forward(a.activation, a.fc1, rows(), F);
  } else {
    d.gelu_forward(a.activation, a.fc1);
  }
  d.linear_forward(branch, a.activation, parameter(p.fc2_weight), parameter(p.fc2_bias), rows(), F,
                   C);
  if (const Dropout mask = dropout(DropoutSite::mlp_output, l); mask.active()) {
    d.dropout_forward(branch, branch, mask);
  }
  d.residual_forward(output, a.attention_residual, branch);
}

// The backward of layer_forward(l): on entry dresidual holds the gradient of the layer's
// output, on return that of its input; parameter gradients accumulate.
template <typename Scalar>
void GptModel<Scalar>::State::layer_backward(int64_t l) {
  const LayerParameters& p = layout.layer(l);
  LayerActivations& a = activations(l);
  const View input = layer_input(l);
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t NH = config.num_attention_heads;
  Device& d = ops();

  // MLP block; dresidual is the gradient of both the block output and the dropped fc2
  // output, whose mask turns it into fc2's output gradient (in dbranch, free until the
  // norm backward below).
  View dmlp_output = dresidual;
  if (const Dropout mask = dropout(DropoutSite::mlp_output, l); mask.active()) {
    d.dropout_backward(dbranch, dresidual, mask);
    dmlp_output = dbranch;
  }
  d.linear_backward(dhidden, gradient(p.fc2_weight), gradient(p.fc2_bias), dmlp_output,
                    a.activation, parameter(p.fc2_weight), rows(), F, C);
  if (config.swiglu) {
    d.swiglu_backward(dfc1, dhidden, a.fc1, rows(), F);
  } else {
    d.gelu_backward(dfc1, dhidden, a.fc1);
  }
  d.linear_backward(dnorm, gradient(p.fc1_weight), gradient(p.fc1_bias), dfc1, a.mlp_norm,
                    parameter(p.fc1_weight), rows(), C, config.fc1_features());
  norm_backward(dbranch, p.mlp_norm_weight, p.mlp_norm_bias, dnorm, a.attention_residual,
                a.mlp_norm_mean, a.mlp_norm_rstd);
  d.residual_forward(dresidual, dresidual, dbranch);

  // Attention block, the same way.
  View dattention_output = dresidual;
  if (const Dropout mask = dropout(DropoutSite::attention_output, l); mask.active()) {
    d.dropout_backward(dbranch, dresidual, mask);
    dattention_output = dbranch;
  }
  d.linear_backward(dnorm, gradient(p.proj_weight), gradient(p.proj_bias), dattention_output,
                    a.context, parameter(p.proj_weight), rows(), C, C);
  if (schedule.selective()) {
    // The attention core again, from the stored qkv and with the forward's mask key: the
    // same log-sum-exp, and the same context bits (linear_proj's backward is done with it).
    d.attention_forward(a.context, attention_logsumexp(a), a.qkv, batch_size, seq_length, C, NH,
                        config.query_groups(), dropout(DropoutSite::attention, l));
  }
  d.attention_backward(dqkv, dnorm, a.qkv, a.context, attention_logsumexp(a), batch_size,
                       seq_length, C, NH, config.query_groups(),
                       dropout(DropoutSite::attention, l));
  if (rope()) rotate_queries_and_keys(dqkv, true);
  d.linear_backward(dnorm, gradient(p.qkv_weight), gradient(p.qkv_bias), dqkv, a.input_norm,
                    parameter(p.qkv_weight), rows(), C, config.qkv_features());
  norm_backward(dbranch, p.input_norm_weight, p.input_norm_bias, dnorm, input, a.input_norm_mean,
                a.input_norm_rstd);
  d.residual_forward(dresidual, dresidual, dbranch);
}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config)
    : state_((validate(config), std::make_unique<State>(config, nullptr))) {}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config, Device& device)
    : state_((validate(config), std::make_unique<State>(config, &device))) {}

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
  return state_->layout.tensors();
}

template <typename Scalar>
const ParameterTensor& GptModel<Scalar>::tensor(const std::string& name) const {
  return state_->layout.tensor(name);
}

namespace {

// A micro batch's shape as reserve() and forward() accept it.
void check_micro_batch_shape(const GptConfig& config, int64_t batch_size, int64_t seq_length) {
  if (batch_size < 1) common::fail("batch size must be at least 1, got {}", batch_size);
  if (seq_length < 1 || seq_length > config.max_position_embeddings) {
    common::fail("sequence length {} is outside [1, {}] (--max-position-embeddings)", seq_length,
                 config.max_position_embeddings);
  }
}

// A host span over a buffer of the model, refused for device memory the host cannot touch.
template <typename Scalar>
std::span<Scalar> host_span(View buffer, const Device& device, const char* what) {
  if (buffer.on != MemoryKind::host) {
    common::fail("GptModel::{}(): the model's buffers live on {}, not in host memory; copy them "
                 "with copy_{}_to_host",
                 what, device.name(), what);
  }
  return {buffer.template as<Scalar>(), static_cast<size_t>(buffer.numel)};
}

void check_host_size(size_t size, int64_t numel, const char* what) {
  if (static_cast<int64_t>(size) != numel) {
    common::fail("GptModel::{}: the host buffer has {} elements, the model {}", what, size, numel);
  }
}

}  // namespace

template <typename Scalar>
std::span<Scalar> GptModel<Scalar>::parameters() {
  return host_span<Scalar>(state_->parameters, *state_->device, "parameters");
}
template <typename Scalar>
std::span<const Scalar> GptModel<Scalar>::parameters() const {
  return host_span<Scalar>(state_->parameters, *state_->device, "parameters");
}
template <typename Scalar>
std::span<Scalar> GptModel<Scalar>::gradients() {
  return host_span<Scalar>(state_->gradients, *state_->device, "gradients");
}
template <typename Scalar>
std::span<const Scalar> GptModel<Scalar>::gradients() const {
  return host_span<Scalar>(state_->gradients, *state_->device, "gradients");
}

template <typename Scalar>
View GptModel<Scalar>::parameter_buffer() const {
  return state_->parameters;
}
template <typename Scalar>
View GptModel<Scalar>::gradient_buffer() const {
  return state_->gradients;
}
template <typename Scalar>
Device& GptModel<Scalar>::device() const {
  return *state_->device;
}

template <typename Scalar>
void GptModel<Scalar>::copy_parameters_from_host(std::span<const Scalar> host) {
  check_host_size(host.size(), state_->parameters.numel, "copy_parameters_from_host");
  state_->device->copy_from_host(state_->parameters, host.data());
}
template <typename Scalar>
void GptModel<Scalar>::copy_parameters_to_host(std::span<Scalar> host) const {
  check_host_size(host.size(), state_->parameters.numel, "copy_parameters_to_host");
  state_->device->copy_to_host(host.data(), state_->parameters);
}
template <typename Scalar>
void GptModel<Scalar>::copy_gradients_to_host(std::span<Scalar> host) const {
  check_host_size(host.size(), state_->gradients.numel, "copy_gradients_to_host");
  state_->device->copy_to_host(host.data(), state_->gradients);
}

template <typename Scalar>
void GptModel<Scalar>::init_parameters(uint64_t seed) {
  State& s = *state_;
  if (s.parameters.on == MemoryKind::host) {
    // In place: the threads that draw the values first-touch the pages.
    s.layout.init_parameters(s.parameters.template as<Scalar>(), seed);
    return;
  }
  std::vector<Scalar> staged(static_cast<size_t>(s.parameters.numel));
  s.layout.init_parameters(staged.data(), seed);
  s.device->copy_from_host(s.parameters, staged.data());
}

template <typename Scalar>
void GptModel<Scalar>::reserve(int64_t batch_size, int64_t seq_length) {
  State& s = *state_;
  check_micro_batch_shape(s.config, batch_size, seq_length);
  s.reserve(batch_size, seq_length);
}

template <typename Scalar>
Scalar GptModel<Scalar>::forward(std::span<const int32_t> tokens, std::span<const int32_t> labels,
                                 int64_t batch_size, int64_t seq_length) {
  State& s = *state_;
  const GptConfig& config = s.config;
  // A forward that fails leaves nothing to differentiate: a backward() after it must not
  // silently reuse the micro batch before.
  s.has_forward = false;
  check_micro_batch_shape(config, batch_size, seq_length);
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

  s.reserve(batch_size, seq_length);
  s.forward_training = s.training;
  s.forward_dropout_seed = s.dropout_seed;
  s.forward_dropout_step = s.dropout_step;
  if (s.training) ++s.dropout_step;
  Device& d = s.ops();
  d.copy_from_host(s.tokens, tokens.data());
  d.copy_from_host(s.labels, labels.data());

  const int64_t C = config.hidden_size;
  const int64_t V = config.padded_vocab_size;
  const ParameterLayout& layout = s.layout;

  d.embedding_forward(s.embedded, s.tokens, s.parameter(layout.word_embeddings()),
                      s.parameter(layout.position_embeddings()), batch_size, seq_length, C,
                      /*vocab_start=*/0);
  if (const Dropout mask = s.dropout(DropoutSite::embedding, 0); mask.active()) {
    d.dropout_forward(s.embedded, s.embedded, mask);
  }
  for (int64_t l = 0; l < config.num_layers; ++l) s.layer_forward(l);
  s.norm_forward(s.final_norm, s.final_norm_mean, s.final_norm_rstd,
                 s.layer_output(config.num_layers - 1), layout.final_norm_weight(),
                 layout.final_norm_bias());
  // logits = final_norm · W^T with W the word embedding (tied) or output_layer.weight.
  d.linear_forward(s.logits, s.final_norm, s.parameter(layout.output_weight()),
                   View{nullptr, 0, State::kElementType, s.logits.on}, rows, C, V);
  d.cross_entropy_forward(s.losses, s.logsumexp, s.logits, s.labels, rows, V);
  s.has_forward = true;

  // Summed on the device in a fixed order (and in double), so the loss does not depend on the
  // thread count; the one value read back per micro batch.
  d.sum(s.loss_total, s.losses);
  double total = 0;
  d.copy_to_host(&total, s.loss_total);
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
  const int64_t rows = s.rows();
  const int64_t C = config.hidden_size;
  const int64_t V = config.padded_vocab_size;
  const ParameterLayout& layout = s.layout;
  Device& d = s.ops();

  // d(mean loss)/dlogits · grad_scale: every later gradient is linear in dlogits, so the
  // scale is applied once here (computed in Scalar, as the CPU twin takes it).
  const Scalar scale = grad_scale / static_cast<Scalar>(rows);
  d.cross_entropy_backward(s.dlogits, s.logits, s.logsumexp, s.labels, static_cast<double>(scale),
                           rows, V, /*vocab_start=*/0);
  d.linear_backward(s.dnorm, s.gradient(layout.output_weight()),
                    View{nullptr, 0, State::kElementType, s.dnorm.on}, s.dlogits, s.final_norm,
                    s.parameter(layout.output_weight()), rows, C, V);
  s.norm_backward(s.dresidual, layout.final_norm_weight(), layout.final_norm_bias(), s.dnorm,
                  s.layer_output(config.num_layers - 1),  // validate(): num_layers ≥ 1
                  s.final_norm_mean, s.final_norm_rstd);
  for (int64_t l = config.num_layers - 1; l >= 0;) {
    if (!s.schedule.recomputed(l)) {
      s.layer_backward(l--);
      continue;
    }
    // A recomputed chunk ending at l: its forward again from the chunk's stored input (the
    // dropout masks are keyed by the last forward's step, so they are the forward's), then
    // its backward.
    const int64_t begin = s.schedule.chunk_begin(l);
    for (int64_t k = begin; k <= l; ++k) s.layer_forward(k);
    for (int64_t k = l; k >= begin; --k) s.layer_backward(k);
    l = begin - 1;
  }

  if (const Dropout mask = s.dropout(DropoutSite::embedding, 0); mask.active()) {
    d.dropout_backward(s.dresidual, s.dresidual, mask);
  }
  d.embedding_backward(s.gradient(layout.word_embeddings()),
                       s.gradient(layout.position_embeddings()), s.dresidual, s.tokens,
                       s.batch_size, s.seq_length, C, /*vocab_start=*/0);
}

template <typename Scalar>
int64_t GptModel<Scalar>::activation_bytes() const {
  const State& s = *state_;
  return s.batch_size == 0 ? 0 : s.plan.kept_bytes;
}

template <typename Scalar>
void GptModel<Scalar>::zero_gradients() {
  state_->ops().fill_zero(state_->gradients);
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
