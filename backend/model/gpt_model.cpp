// GptModel: the CPU reference forward and backward of the decoder that gpt_model.hpp
// describes, composed from the ops in backend/ops (llm.c's gpt2_forward / gpt2_backward,
// with Megatron core's parameter names, layouts and initialisation).
//
// Initialisation (Megatron's init_method_normal / scaled_init_method_normal): every weight
// element, including both embedding tables and the untied output_layer.weight (Megatron's
// ColumnParallelLinear with config.init_method), is N(0, init_method_std); linear_proj and
// linear_fc2 weights are N(0, init_method_std / sqrt(2 · num_layers)); biases are 0 and norm
// weights 1. The normal deviates come from a counter-based generator, so element i of the
// flat buffer depends only on (seed, i), never on the thread count or the order in which
// tensors are filled: element i is Φ⁻¹ of a uniform made from splitmix64 output i (Steele,
// Lea & Flood 2014) of a stream keyed by splitmix64(seed), by Wichura's AS 241
// (common/inverse_normal_cdf.hpp; it replaced a Box–Muller transform, whose logarithm and
// sine/cosine per pair made the 126M model's initialisation take seconds). It is computed in
// double and rounded to Scalar, so a float and a double model with the same seed hold the same
// parameters up to float rounding.
//
// Dropout (gpt_model.hpp) draws from the same generator, keyed by backend::dropout_key(dropout
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
// op calls is a nullptr. RoPE rotates the q and k heads of the fused qkv activation in place
// after linear_qkv, so the stored qkv is what attention saw, and the backward rotates dqkv
// back before linear_qkv's backward.
#include "backend/model/gpt_model.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"
#include "backend/common/inverse_normal_cdf.hpp"
#include "backend/common/lazy_zero_allocator.hpp"
#include "backend/common/splitmix64.hpp"
#include "backend/ops/attention.hpp"
#include "backend/ops/cross_entropy.hpp"
#include "backend/ops/dropout.hpp"
#include "backend/ops/embedding.hpp"
#include "backend/ops/gelu.hpp"
#include "backend/ops/layernorm.hpp"
#include "backend/ops/linear.hpp"
#include "backend/ops/residual.hpp"
#include "backend/ops/rmsnorm.hpp"
#include "backend/ops/rope.hpp"
#include "backend/ops/swiglu.hpp"

namespace backend {
namespace {

using common::splitmix64_mix;

// The model's buffers start as zeros without a pass writing them (lazy_zero_allocator.hpp);
// they are resized only by replacing them with a fresh one.
template <typename Scalar>
using Buffer = std::vector<Scalar, common::LazyZeroAllocator<Scalar>>;

enum class Init { normal, scaled_normal, zeros, ones };

// values[j] = Scalar(scale · deviate first + j of the stream keyed by `key`), j < count ≤
// kNormalBlock: common::standard_normal_at, in two passes so the common case vectorises: the
// central rational function for every element (85 % need nothing else), then the tails
// (|p − 1/2| > 0.425, a logarithm and a square root) one by one.
constexpr int64_t kNormalBlock = 512;
template <typename Scalar>
void fill_normal_block(Scalar* values, int64_t count, uint64_t key, uint64_t first, double scale) {
  double deviates[kNormalBlock];
  double uniforms[kNormalBlock];
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) {
    uniforms[j] = common::normal_uniform_at(key, first + static_cast<uint64_t>(j));
    deviates[j] = common::central_inverse_normal_cdf(uniforms[j] - 0.5);
  }
  for (int64_t j = 0; j < count; ++j) {
    if (std::abs(uniforms[j] - 0.5) > common::kCentralHalfWidth) {
      deviates[j] = common::inverse_normal_cdf(uniforms[j]);
    }
  }
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) values[j] = static_cast<Scalar>(scale * deviates[j]);
}

// Where a dropout mask applies; part of its key.
enum class DropoutSite : uint64_t {
  embedding = 0,
  attention = 1,
  attention_output = 2,
  mlp_output = 3
};

// The offset of a tensor the configuration leaves out; State::parameter() maps it to nullptr.
constexpr int64_t kAbsent = -1;

// Offsets into the flat parameter (and gradient) buffer of one transformer layer's tensors.
// The norm biases are kAbsent with RMSNorm, the linear biases with --disable-bias-linear.
struct LayerParameters {
  int64_t input_norm_weight, input_norm_bias;
  int64_t qkv_weight, qkv_bias;
  int64_t proj_weight, proj_bias;
  int64_t mlp_norm_weight, mlp_norm_bias;
  int64_t fc1_weight, fc1_bias;
  int64_t fc2_weight, fc2_bias;
};

// What one layer's forward keeps for its backward. Its input is the previous layer's
// `output` (or the embedding output for layer 0). With recompute some of these stay empty
// (State::resize_activations says which).
template <typename Scalar>
struct LayerActivations {
  // The norms' means are left empty with RMSNorm, which does not centre.
  Buffer<Scalar> input_norm, input_norm_mean, input_norm_rstd;  // (B,T,C), (B,T), (B,T)
  Buffer<Scalar> qkv;  // (B, T, QKV = (NH + 2·NG)·HD), q and k rotated with RoPE
  Buffer<Scalar> attention_logsumexp;  // (B, NH, T), the attention core's softmax stats
  Buffer<Scalar> context;              // (B, T, C)
  Buffer<Scalar> attention_residual;   // (B, T, C)
  Buffer<Scalar> mlp_norm, mlp_norm_mean, mlp_norm_rstd;  // (B,T,C), (B,T), (B,T)
  Buffer<Scalar> fc1;         // (B, T, F), or (B, T, 2F) [gate | linear] with SwiGLU
  Buffer<Scalar> activation;  // (B, T, F): gelu(fc1) or swiglu(fc1)
  Buffer<Scalar> output;      // (B, T, C)
};

}  // namespace

template <typename Scalar>
struct GptModel<Scalar>::State {
  GptConfig config;
  std::vector<ParameterTensor> tensors;
  std::vector<Init> tensor_init;  // parallel to `tensors`
  std::unordered_map<std::string, size_t> tensor_index;
  Buffer<Scalar> parameters;
  Buffer<Scalar> gradients;

  int64_t word_embeddings = 0;
  int64_t position_embeddings = kAbsent;  // learned absolute positions only
  std::vector<LayerParameters> layer_parameters;
  int64_t final_norm_weight = 0;
  int64_t final_norm_bias = kAbsent;
  // The logits' weight: output_layer.weight when untied, else the word embedding.
  int64_t output_weight = 0;

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
  Buffer<Scalar> embedded;         // (B, T, C)
  // layers[l] holds layer l's activations, or, for a layer the backward recomputes, at most
  // its output (when the next layer's recompute, or the final norm, starts from it); the
  // recomputed layers of one chunk run in recompute_slots[0..chunk size).
  std::vector<LayerActivations<Scalar>> layers;
  std::vector<LayerActivations<Scalar>> recompute_slots;
  Buffer<Scalar> recomputed_logsumexp;  // (B, NH, T), selective recompute only
  Buffer<Scalar> final_norm, final_norm_mean, final_norm_rstd;  // (B,T,C), (B,T), (B,T)
  Buffer<Scalar> logits;                                        // (B, T, V)
  Buffer<Scalar> losses, logsumexp;                             // (B, T)
  Buffer<Scalar> branch;              // (B, T, C) linear_proj / fc2 out
  Buffer<Scalar> rope_cos, rope_sin;  // (T, rotary_dim / 2), RoPE only

  // Backward scratch, same (B, T). The logits stay intact so backward() can be repeated.
  Buffer<Scalar> dlogits;    // (B, T, V)
  Buffer<Scalar> dresidual;  // (B, T, C) residual stream
  Buffer<Scalar> dbranch;    // (B, T, C)
  Buffer<Scalar> dnorm;      // (B, T, C)
  Buffer<Scalar> dqkv;       // (B, T, QKV)
  Buffer<Scalar> dhidden;    // (B, T, F) gradient of the activation's output
  Buffer<Scalar> dfc1;       // (B, T, F or 2F) gradient of linear_fc1's output

  int64_t add_tensor(std::string name, std::vector<int64_t> shape, Init init) {
    // validate() checked the whole layout's sizes; these checks keep each step honest too.
    int64_t numel = 1;
    for (int64_t extent : shape) numel = common::checked_multiply(numel, extent, name);
    const int64_t offset =
        tensors.empty() ? 0 : common::checked_add(tensors.back().offset, tensors.back().numel, name);
    // Megatron's default: no weight decay on biases and norm parameters (the 1-D tensors).
    const bool weight_decay = shape.size() > 1;
    tensor_index.emplace(name, tensors.size());
    tensors.push_back({std::move(name), std::move(shape), offset, numel, weight_decay});
    tensor_init.push_back(init);
    return offset;
  }

  Scalar* parameter(int64_t offset) {
    return offset == kAbsent ? nullptr : parameters.data() + offset;
  }
  Scalar* gradient(int64_t offset) {
    return offset == kAbsent ? nullptr : gradients.data() + offset;
  }

  bool rms_norm() const { return config.normalization == Normalization::rms_norm; }
  bool rope() const { return config.position_embedding_type == PositionEmbeddingType::rope; }

  // One of the model's three norms (--normalization); mean is unused by RMSNorm.
  void norm_forward(Scalar* output, Scalar* mean, Scalar* rstd, const Scalar* input, int64_t weight,
                    int64_t bias, int64_t rows) {
    const auto epsilon = static_cast<Scalar>(config.layernorm_epsilon);
    if (rms_norm()) {
      cpu::rmsnorm_forward(output, rstd, input, parameter(weight), epsilon, rows,
                           config.hidden_size);
    } else {
      cpu::layernorm_forward(output, mean, rstd, input, parameter(weight), parameter(bias), epsilon,
                             rows, config.hidden_size);
    }
  }
  void norm_backward(Scalar* dinput, int64_t weight, int64_t bias, const Scalar* doutput,
                     const Scalar* input, const Scalar* mean, const Scalar* rstd, int64_t rows) {
    if (rms_norm()) {
      cpu::rmsnorm_backward(dinput, gradient(weight), doutput, input, parameter(weight), rstd, rows,
                            config.hidden_size);
    } else {
      cpu::layernorm_backward(dinput, gradient(weight), gradient(bias), doutput, input,
                              parameter(weight), mean, rstd, rows, config.hidden_size);
    }
  }

  // RoPE on the q and k heads of a fused qkv activation (B, T, QKV), in place: per query
  // group the layout is [NH/NG query heads | key | value], so the first NH/NG + 1 heads of
  // every group rotate (with NG = NH: q and k of every [q | k | v]). The backward rotates a
  // gradient back.
  void rotate_queries_and_keys(Scalar* qkv, bool backward) {
    const int64_t HD = config.head_dim();
    const int64_t rotated = config.num_attention_heads / config.query_groups() + 1;
    const int64_t group_width = (rotated + 1) * HD;
    for (int64_t g = 0; g < config.query_groups(); ++g) {
      Scalar* group = qkv + g * group_width;
      if (backward) {
        cpu::rope_backward(group, group, rope_cos.data(), rope_sin.data(), batch_size, seq_length,
                           rotated, HD, config.rotary_dim(), config.qkv_features());
      } else {
        cpu::rope_forward(group, group, rope_cos.data(), rope_sin.data(), batch_size, seq_length,
                          rotated, HD, config.rotary_dim(), config.qkv_features());
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

  // Recompute: whether layer l's activations are recomputed in the backward, and the first
  // layer of its chunk (the layers recomputed together, from the chunk's stored input).
  bool recomputed(int64_t l) const {
    if (config.recompute_granularity != RecomputeGranularity::full) return false;
    return config.recompute_method == RecomputeMethod::uniform || l < config.recompute_num_layers;
  }
  int64_t chunk_begin(int64_t l) const {
    if (config.recompute_method == RecomputeMethod::block) return l;
    return l / config.recompute_num_layers * config.recompute_num_layers;
  }
  bool last_of_chunk(int64_t l) const {
    return l + 1 == config.num_layers || !recomputed(l + 1) || chunk_begin(l + 1) == l + 1;
  }
  LayerActivations<Scalar>& activations(int64_t l) {
    return recomputed(l) ? recompute_slots[static_cast<size_t>(l - chunk_begin(l))]
                         : layers[static_cast<size_t>(l)];
  }
  Scalar* layer_output(int64_t l) {
    auto& kept = layers[static_cast<size_t>(l)].output;
    return kept.empty() ? activations(l).output.data() : kept.data();
  }
  // The input of layer l: the embedding output for layer 0, else layer l − 1's output.
  const Scalar* layer_input(int64_t l) { return l == 0 ? embedded.data() : layer_output(l - 1); }
  Scalar* attention_logsumexp(LayerActivations<Scalar>& a) {
    return config.recompute_granularity == RecomputeGranularity::selective
               ? recomputed_logsumexp.data()
               : a.attention_logsumexp.data();
  }

  void resize_activations(int64_t new_batch_size, int64_t new_seq_length);
  void layer_forward(int64_t l);
  void layer_backward(int64_t l);
};

template <typename Scalar>
void GptModel<Scalar>::State::resize_activations(int64_t new_batch_size, int64_t new_seq_length) {
  if (new_batch_size == batch_size && new_seq_length == seq_length) return;
  // Every buffer's element count, checked: rows × the widest feature count (the logits'
  // padded vocabulary, or linear_qkv's and linear_fc1's features) must fit, and
  // B · NH · T for the attention statistics.
  const int64_t checked_rows =
      common::checked_multiply(new_batch_size, new_seq_length, "micro batch × sequence length");
  for (const int64_t width : {config.padded_vocab_size, config.qkv_features(), config.fc1_features(),
                              config.hidden_size}) {
    common::checked_multiply(checked_rows, width,
                             "the activations (micro batch × sequence length × features)");
  }
  common::checked_multiply({checked_rows, config.num_attention_heads},
                           "the attention statistics (micro batch × sequence length × heads)");
  batch_size = new_batch_size;
  seq_length = new_seq_length;
  const auto rows = static_cast<size_t>(checked_rows);
  const auto C = static_cast<size_t>(config.hidden_size);
  const auto F = static_cast<size_t>(config.ffn_hidden_size);
  const auto F1 = static_cast<size_t>(config.fc1_features());
  const auto QKV = static_cast<size_t>(config.qkv_features());
  const auto V = static_cast<size_t>(config.padded_vocab_size);
  const auto NH = static_cast<size_t>(config.num_attention_heads);
  const auto T = static_cast<size_t>(seq_length);
  const size_t norm_means = rms_norm() ? 0 : rows;
  // Swap in a fresh vector rather than resize(): a smaller shape gives its memory back too.
  auto size = [](Buffer<Scalar>& buffer, size_t count) {
    Buffer<Scalar>(count).swap(buffer);
  };
  size(embedded, rows * C);
  const bool selective = config.recompute_granularity == RecomputeGranularity::selective;
  const size_t logsumexp_count = static_cast<size_t>(batch_size) * NH * T;
  auto size_layer = [&](LayerActivations<Scalar>& layer, bool internals, bool output) {
    const size_t n = internals ? rows : 0;
    size(layer.input_norm, n * C);
    size(layer.input_norm_mean, internals ? norm_means : 0);
    size(layer.input_norm_rstd, n);
    size(layer.qkv, n * QKV);
    size(layer.attention_logsumexp, internals && !selective ? logsumexp_count : 0);
    size(layer.context, n * C);
    size(layer.attention_residual, n * C);
    size(layer.mlp_norm, n * C);
    size(layer.mlp_norm_mean, internals ? norm_means : 0);
    size(layer.mlp_norm_rstd, n);
    size(layer.fc1, n * F1);
    size(layer.activation, n * F);
    size(layer.output, output ? rows * C : 0);
  };
  layers.resize(static_cast<size_t>(config.num_layers));
  // Slot j serves the j-th layer of every recomputed chunk; it needs an output buffer only
  // where such a layer's output is not kept in layers[l] (not the last of its chunk).
  std::vector<bool> slot_needs_output;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const bool dropped = recomputed(l);
    size_layer(layers[static_cast<size_t>(l)], !dropped, !dropped || last_of_chunk(l));
    if (!dropped) continue;
    const auto slot = static_cast<size_t>(l - chunk_begin(l));
    if (slot_needs_output.size() <= slot) slot_needs_output.resize(slot + 1, false);
    if (!last_of_chunk(l)) slot_needs_output[slot] = true;
  }
  recompute_slots.resize(slot_needs_output.size());
  for (size_t j = 0; j < recompute_slots.size(); ++j) {
    size_layer(recompute_slots[j], true, slot_needs_output[j]);
  }
  size(recomputed_logsumexp, selective ? logsumexp_count : 0);
  size(final_norm, rows * C);
  size(final_norm_mean, norm_means);
  size(final_norm_rstd, rows);
  size(logits, rows * V);
  size(losses, rows);
  size(logsumexp, rows);
  size(branch, rows * C);
  size(dlogits, rows * V);
  size(dresidual, rows * C);
  size(dbranch, rows * C);
  size(dnorm, rows * C);
  size(dqkv, rows * QKV);
  size(dhidden, rows * F);
  size(dfc1, rows * F1);
  if (rope()) {
    const auto half = static_cast<size_t>(config.rotary_dim() / 2);
    size(rope_cos, T * half);
    size(rope_sin, T * half);
    cpu::rope_tables(rope_cos.data(), rope_sin.data(), seq_length, config.rotary_dim(),
                     static_cast<double>(config.rotary_base));
  }
}

// One transformer layer of the last forward's shape: reads the previous layer's output (or
// the embedding) and fills layers[l].
template <typename Scalar>
void GptModel<Scalar>::State::layer_forward(int64_t l) {
  const LayerParameters& p = layer_parameters[static_cast<size_t>(l)];
  LayerActivations<Scalar>& a = activations(l);
  const Scalar* input = layer_input(l);
  Scalar* output = layer_output(l);
  const int64_t rows = batch_size * seq_length;
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t NH = config.num_attention_heads;

  norm_forward(a.input_norm.data(), a.input_norm_mean.data(), a.input_norm_rstd.data(), input,
               p.input_norm_weight, p.input_norm_bias, rows);
  cpu::linear_forward(a.qkv.data(), a.input_norm.data(), parameter(p.qkv_weight),
                      parameter(p.qkv_bias), rows, C, config.qkv_features());
  if (rope()) rotate_queries_and_keys(a.qkv.data(), false);
  cpu::attention_forward(a.context.data(), attention_logsumexp(a), a.qkv.data(), batch_size,
                         seq_length, C, NH, config.query_groups(),
                         dropout(DropoutSite::attention, l));
  cpu::linear_forward(branch.data(), a.context.data(), parameter(p.proj_weight),
                      parameter(p.proj_bias), rows, C, C);
  if (const Dropout d = dropout(DropoutSite::attention_output, l); d.active()) {
    cpu::dropout_forward(branch.data(), branch.data(), rows * C, d);
  }
  cpu::residual_forward(a.attention_residual.data(), input, branch.data(), rows * C);

  norm_forward(a.mlp_norm.data(), a.mlp_norm_mean.data(), a.mlp_norm_rstd.data(),
               a.attention_residual.data(), p.mlp_norm_weight, p.mlp_norm_bias, rows);
  cpu::linear_forward(a.fc1.data(), a.mlp_norm.data(), parameter(p.fc1_weight),
                      parameter(p.fc1_bias), rows, C, config.fc1_features());
  if (config.swiglu) {
    cpu::swiglu_forward(a.activation.data(), a.fc1.data(), rows, F);
  } else {
    cpu::gelu_forward(a.activation.data(), a.fc1.data(), rows * F);
  }
  cpu::linear_forward(branch.data(), a.activation.data(), parameter(p.fc2_weight),
                      parameter(p.fc2_bias), rows, F, C);
  if (const Dropout d = dropout(DropoutSite::mlp_output, l); d.active()) {
    cpu::dropout_forward(branch.data(), branch.data(), rows * C, d);
  }
  cpu::residual_forward(output, a.attention_residual.data(), branch.data(), rows * C);
}

// The backward of layer_forward(l): on entry dresidual holds the gradient of the layer's
// output, on return that of its input; parameter gradients accumulate.
template <typename Scalar>
void GptModel<Scalar>::State::layer_backward(int64_t l) {
  const LayerParameters& p = layer_parameters[static_cast<size_t>(l)];
  LayerActivations<Scalar>& a = activations(l);
  const Scalar* input = layer_input(l);
  const int64_t rows = batch_size * seq_length;
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t NH = config.num_attention_heads;

  // MLP block; dresidual is the gradient of both the block output and the dropped fc2
  // output, whose mask turns it into fc2's output gradient (in dbranch, free until the
  // norm backward below).
  const Scalar* dmlp_output = dresidual.data();
  if (const Dropout d = dropout(DropoutSite::mlp_output, l); d.active()) {
    cpu::dropout_backward(dbranch.data(), dresidual.data(), rows * C, d);
    dmlp_output = dbranch.data();
  }
  cpu::linear_backward(dhidden.data(), gradient(p.fc2_weight), gradient(p.fc2_bias), dmlp_output,
                       a.activation.data(), parameter(p.fc2_weight), rows, F, C);
  if (config.swiglu) {
    cpu::swiglu_backward(dfc1.data(), dhidden.data(), a.fc1.data(), rows, F);
  } else {
    cpu::gelu_backward(dfc1.data(), dhidden.data(), a.fc1.data(), rows * F);
  }
  cpu::linear_backward(dnorm.data(), gradient(p.fc1_weight), gradient(p.fc1_bias), dfc1.data(),
                       a.mlp_norm.data(), parameter(p.fc1_weight), rows, C, config.fc1_features());
  norm_backward(dbranch.data(), p.mlp_norm_weight, p.mlp_norm_bias, dnorm.data(),
                a.attention_residual.data(), a.mlp_norm_mean.data(), a.mlp_norm_rstd.data(), rows);
  cpu::residual_forward(dresidual.data(), dresidual.data(), dbranch.data(), rows * C);

  // Attention block, the same way.
  const Scalar* dattention_output = dresidual.data();
  if (const Dropout d = dropout(DropoutSite::attention_output, l); d.active()) {
    cpu::dropout_backward(dbranch.data(), dresidual.data(), rows * C, d);
    dattention_output = dbranch.data();
  }
  cpu::linear_backward(dnorm.data(), gradient(p.proj_weight), gradient(p.proj_bias),
                       dattention_output, a.context.data(), parameter(p.proj_weight), rows, C, C);
  if (config.recompute_granularity == RecomputeGranularity::selective) {
    // The attention core again, from the stored qkv and with the forward's mask key: the
    // same log-sum-exp, and the same context bits (linear_proj's backward is done with it).
    cpu::attention_forward(a.context.data(), attention_logsumexp(a), a.qkv.data(), batch_size,
                           seq_length, C, NH, config.query_groups(),
                           dropout(DropoutSite::attention, l));
  }
  cpu::attention_backward(dqkv.data(), dnorm.data(), a.qkv.data(), a.context.data(),
                          attention_logsumexp(a), batch_size, seq_length, C, NH,
                          config.query_groups(), dropout(DropoutSite::attention, l));
  if (rope()) rotate_queries_and_keys(dqkv.data(), true);
  cpu::linear_backward(dnorm.data(), gradient(p.qkv_weight), gradient(p.qkv_bias), dqkv.data(),
                       a.input_norm.data(), parameter(p.qkv_weight), rows, C,
                       config.qkv_features());
  norm_backward(dbranch.data(), p.input_norm_weight, p.input_norm_bias, dnorm.data(), input,
                a.input_norm_mean.data(), a.input_norm_rstd.data(), rows);
  cpu::residual_forward(dresidual.data(), dresidual.data(), dbranch.data(), rows * C);
}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config) : state_(std::make_unique<State>()) {
  validate(config);
  State& s = *state_;
  s.config = config;
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t F1 = config.fc1_features();
  const int64_t QKV = config.qkv_features();
  // Optional tensors: added when the configuration has them, else kAbsent.
  auto norm_bias = [&](std::string name) {
    return s.rms_norm() ? kAbsent : s.add_tensor(std::move(name), {C}, Init::zeros);
  };
  auto linear_bias = [&](std::string name, int64_t features) {
    return config.add_bias_linear ? s.add_tensor(std::move(name), {features}, Init::zeros)
                                  : kAbsent;
  };
  s.word_embeddings =
      s.add_tensor("embedding.word_embeddings.weight", {config.padded_vocab_size, C}, Init::normal);
  if (!s.rope()) {
    s.position_embeddings = s.add_tensor("embedding.position_embeddings.weight",
                                         {config.max_position_embeddings, C}, Init::normal);
  }
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string prefix = "decoder.layers." + std::to_string(i) + ".";
    LayerParameters layer{};
    layer.input_norm_weight = s.add_tensor(prefix + "input_layernorm.weight", {C}, Init::ones);
    layer.input_norm_bias = norm_bias(prefix + "input_layernorm.bias");
    layer.qkv_weight =
        s.add_tensor(prefix + "self_attention.linear_qkv.weight", {QKV, C}, Init::normal);
    layer.qkv_bias = linear_bias(prefix + "self_attention.linear_qkv.bias", QKV);
    layer.proj_weight =
        s.add_tensor(prefix + "self_attention.linear_proj.weight", {C, C}, Init::scaled_normal);
    layer.proj_bias = linear_bias(prefix + "self_attention.linear_proj.bias", C);
    layer.mlp_norm_weight = s.add_tensor(prefix + "pre_mlp_layernorm.weight", {C}, Init::ones);
    layer.mlp_norm_bias = norm_bias(prefix + "pre_mlp_layernorm.bias");
    layer.fc1_weight = s.add_tensor(prefix + "mlp.linear_fc1.weight", {F1, C}, Init::normal);
    layer.fc1_bias = linear_bias(prefix + "mlp.linear_fc1.bias", F1);
    layer.fc2_weight = s.add_tensor(prefix + "mlp.linear_fc2.weight", {C, F}, Init::scaled_normal);
    layer.fc2_bias = linear_bias(prefix + "mlp.linear_fc2.bias", C);
    s.layer_parameters.push_back(layer);
  }
  s.final_norm_weight = s.add_tensor("decoder.final_layernorm.weight", {C}, Init::ones);
  s.final_norm_bias = norm_bias("decoder.final_layernorm.bias");
  s.output_weight =
      config.share_embeddings_and_output_weights
          ? s.word_embeddings
          : s.add_tensor("output_layer.weight", {config.padded_vocab_size, C}, Init::normal);
  const auto total = static_cast<size_t>(s.tensors.back().offset + s.tensors.back().numel);
  s.parameters = Buffer<Scalar>(total);  // zeros, faulted in by whoever writes them first
  s.gradients = Buffer<Scalar>(total);
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
    const auto first = static_cast<uint64_t>(tensor.offset);
    // Blocks at fixed offsets from the tensor's start; the static schedule gives each thread
    // one contiguous range to first-touch (the buffer's pages are faulted in here).
    const int64_t blocks = (tensor.numel + kNormalBlock - 1) / kNormalBlock;
#pragma omp parallel for schedule(static) if (tensor.numel > (1 << 14))
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t begin = block * kNormalBlock;
      fill_normal_block(values + begin, std::min(kNormalBlock, tensor.numel - begin),
                        key, first + static_cast<uint64_t>(begin), tensor_std);
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

  const int64_t C = config.hidden_size;
  const int64_t V = config.padded_vocab_size;

  cpu::embedding_forward(s.embedded.data(), s.tokens.data(), s.parameter(s.word_embeddings),
                         s.parameter(s.position_embeddings), batch_size, seq_length, C);
  if (const Dropout d = s.dropout(DropoutSite::embedding, 0); d.active()) {
    cpu::dropout_forward(s.embedded.data(), s.embedded.data(), rows * C, d);
  }
  for (int64_t l = 0; l < config.num_layers; ++l) s.layer_forward(l);
  const Scalar* last_output = s.layer_output(config.num_layers - 1);
  s.norm_forward(s.final_norm.data(), s.final_norm_mean.data(), s.final_norm_rstd.data(),
                 last_output, s.final_norm_weight, s.final_norm_bias, rows);
  // logits = final_norm · W^T with W the word embedding (tied) or output_layer.weight.
  cpu::linear_forward(s.logits.data(), s.final_norm.data(), s.parameter(s.output_weight), nullptr,
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
  const int64_t rows = s.batch_size * s.seq_length;
  const int64_t C = config.hidden_size;
  const int64_t V = config.padded_vocab_size;

  // d(mean loss)/dlogits · grad_scale: every later gradient is linear in dlogits, so the
  // scale is applied once here.
  cpu::cross_entropy_backward(s.dlogits.data(), s.logits.data(), s.logsumexp.data(),
                              s.labels.data(), grad_scale / static_cast<Scalar>(rows), rows, V);
  cpu::linear_backward(s.dnorm.data(), s.gradient(s.output_weight), nullptr, s.dlogits.data(),
                       s.final_norm.data(), s.parameter(s.output_weight), rows, C, V);
  s.norm_backward(s.dresidual.data(), s.final_norm_weight, s.final_norm_bias, s.dnorm.data(),
                  s.layer_output(config.num_layers - 1),  // validate(): num_layers ≥ 1
                  s.final_norm_mean.data(), s.final_norm_rstd.data(), rows);
  for (int64_t l = config.num_layers - 1; l >= 0;) {
    if (!s.recomputed(l)) {
      s.layer_backward(l--);
      continue;
    }
    // A recomputed chunk ending at l: its forward again from the chunk's stored input (the
    // dropout masks are keyed by the last forward's step, so they are the forward's), then
    // its backward.
    const int64_t begin = s.chunk_begin(l);
    for (int64_t k = begin; k <= l; ++k) s.layer_forward(k);
    for (int64_t k = l; k >= begin; --k) s.layer_backward(k);
    l = begin - 1;
  }

  if (const Dropout d = s.dropout(DropoutSite::embedding, 0); d.active()) {
    cpu::dropout_backward(s.dresidual.data(), s.dresidual.data(), rows * C, d);
  }
  cpu::embedding_backward(s.gradient(s.word_embeddings), s.gradient(s.position_embeddings),
                          s.dresidual.data(), s.tokens.data(), s.batch_size, s.seq_length, C);
}

template <typename Scalar>
int64_t GptModel<Scalar>::activation_bytes() const {
  const State& s = *state_;
  size_t count = s.embedded.size() + s.recomputed_logsumexp.size() + s.final_norm.size() +
                 s.final_norm_mean.size() + s.final_norm_rstd.size() + s.logits.size() +
                 s.losses.size() + s.logsumexp.size();
  auto add = [&](const LayerActivations<Scalar>& a) {
    for (const auto* buffer :
         {&a.input_norm, &a.input_norm_mean, &a.input_norm_rstd, &a.qkv, &a.attention_logsumexp,
          &a.context, &a.attention_residual, &a.mlp_norm, &a.mlp_norm_mean, &a.mlp_norm_rstd,
          &a.fc1, &a.activation, &a.output}) {
      count += buffer->size();
    }
  };
  for (const auto& layer : s.layers) add(layer);
  for (const auto& slot : s.recompute_slots) add(slot);
  return static_cast<int64_t>(count * sizeof(Scalar));
}

template <typename Scalar>
void GptModel<Scalar>::zero_gradients() {
  Scalar* gradients = state_->gradients.data();
  const auto count = static_cast<int64_t>(state_->gradients.size());
  // Half a gigabyte at the 126M shape: one core alone does not reach the memory bandwidth.
#pragma omp parallel for simd schedule(static) if (count > (1 << 16))
  for (int64_t i = 0; i < count; ++i) gradients[i] = Scalar{0};
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
