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
//
// Tensor parallelism (Megatron's tensor_parallel layers; Shoeybi et al. 2019): each of the tp
// ranks of the group holds the shards parameter_layout.hpp describes and computes
//   embedding    its vocabulary rows' word vectors (0 for other tokens; rank 0 adds the
//                position rows), all-reduced: VocabParallelEmbedding
//   linear_qkv, linear_fc1, output_layer   its output features (column-parallel: the input is
//                whole, the input gradient is all-reduced in the backward)
//   attention    its NH/tp heads, whole query groups
//   linear_proj, linear_fc2   its input features, the partial outputs all-reduced
//                (row-parallel; the bias is added once, by rank 0, so the sum holds it once)
//   loss         vocab-parallel cross-entropy: each rank's log-sum-exp over its vocabulary
//                shard is all-gathered and combined, the label's logit all-reduced
// The norms, residuals and hidden dropout work on the whole (identical) activations on every
// rank, so replicated parameters get identical gradients without communication. Hidden
// dropout masks are those of one rank; attention-probability masks are keyed by the rank too
// (each rank drops its own heads), as Megatron's model-parallel RNG tracker does.
//
// Sequence parallelism (--sequence-parallel; Korthikanti et al. 2022) shards the residual
// stream instead of repeating it: each rank holds rows [r·R/tp, (r+1)·R/tp) of the (R = B·T, C)
// embedding output, residuals and layer outputs, runs the norms and hidden dropout on them
// (mask indices offset by the first row, so the masks are one rank's), all-gathers a norm's
// output before a column-parallel layer and reduce-scatters a row-parallel layer's partial
// outputs (an all-reduce is exactly that pair). The backward mirrors it: the output gradient of
// a row-parallel layer is all-gathered, a column-parallel input gradient reduce-scattered. The
// norms' weight gradients then cover this rank's rows only and are summed over the group by
// finalize_gradients() (Megatron's allreduce of the sequence-parallel layernorm grads). Our rows
// are the flat (B·T) rows (batch-major), where Megatron's are sequence positions of its [s, b,
// h] layout: the same arithmetic, on another cut. The gathered norm outputs are kept for the
// backward (Megatron gathers them again there): this saves the residual stream's memory, not
// theirs.
#include "backend/model/gpt_model.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/splitmix64.hpp"
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
  State(const GptConfig& model_config, Device* borrowed, Communicator* group,
        bool sequence_parallel_requested)
      : config(model_config),
        tensor_parallel_size(group != nullptr ? group->size() : 1),
        tensor_parallel_rank(group != nullptr ? group->rank() : 0),
        shard(tensor_parallel_size > 1 ? tensor_parallel_shard(config, tensor_parallel_size)
                                       : config),
        layout(config, tensor_parallel_size, tensor_parallel_rank),
        schedule(config),
        vocab_start(tensor_parallel_rank * shard.padded_vocab_size),
        norm_ranges(backend::gradient_norm_ranges(layout.tensors(), tensor_parallel_rank)) {
    if (group == nullptr) {
      owned_group = make_single_process_communicator("tensor parallel");
      group = owned_group.get();
    }
    tensor_parallel = group;
    sequence_parallel = sequence_parallel_requested && tensor_parallel_size > 1;
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
  int64_t tensor_parallel_size = 1;
  int64_t tensor_parallel_rank = 0;
  GptConfig shard;  // this rank's part of config (config itself without tensor parallelism)
  ParameterLayout layout;
  RecomputeSchedule schedule;
  int64_t vocab_start = 0;  // the first vocabulary row of this rank's shard
  std::vector<BufferRange> norm_ranges;
  std::unique_ptr<Communicator> owned_group;  // a group of one, when none was given
  Communicator* tensor_parallel = nullptr;
  bool sequence_parallel = false;  // the residual stream sharded over the group (tp > 1 only)
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
      final_norm_rstd, logits, losses, logsumexp, loss_total, branch, rope_cos, rope_sin,
      logsumexp_parts, target_logit, branch_shard, dnorm_shard;
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
  bool tensor_parallel_active() const { return tensor_parallel_size > 1; }
  // Rows of the residual stream this rank holds: all, or its share under sequence parallelism.
  int64_t stream_rows() const { return sequence_parallel ? rows() / tensor_parallel_size : rows(); }
  // This rank's rows of a whole (rows, width) buffer; the whole buffer without sequence
  // parallelism.
  View own_rows(View whole, int64_t width) const {
    if (!sequence_parallel) return whole;
    return whole.slice(tensor_parallel_rank * stream_rows() * width, stream_rows() * width);
  }
  // Megatron's reduce_from_tensor_model_parallel_region: a row-parallel layer's partial
  // outputs, or a column-parallel layer's partial input gradients, in `partial` (rows, C),
  // summed over the group: all-reduced in place, or reduce-scattered into `shard` (this rank's
  // rows) under sequence parallelism. Returns where the sum is.
  View sum_over_tensor_parallel(View partial, View shard) {
    if (sequence_parallel) {
      tensor_parallel->reduce_scatter(shard, partial);
      return shard;
    }
    if (tensor_parallel_active()) tensor_parallel->all_reduce(partial, ReduceOperation::sum);
    return partial;
  }
  // A gradient of the residual stream as the whole (rows, C) one a row-parallel layer's backward
  // takes: all-gathered into `whole` under sequence parallelism, else `stream` itself.
  View whole_rows(View stream, View whole) {
    if (!sequence_parallel) return stream;
    tensor_parallel->all_gather(whole, stream);
    return whole;
  }
  // A parameter that the sum over the group must hold once (a row-parallel bias, the position
  // table): rank 0's, an empty view elsewhere.
  View added_once(int64_t offset) const {
    return tensor_parallel_rank == 0 ? parameter(offset) : tensor_view(parameters, kAbsentTensor);
  }
  bool rms_norm() const { return config.normalization == Normalization::rms_norm; }
  bool rope() const { return config.position_embedding_type == PositionEmbeddingType::rope; }

  // One of the model's three norms (--normalization) over the residual stream's rows; mean is
  // unused by RMSNorm. `output` is whole (rows, C): under sequence parallelism this rank
  // normalises its rows into its part of it and the parts are all-gathered (Megatron's
  // gather_from_sequence_parallel_region before a column-parallel layer).
  void norm_forward(View output, View mean, View rstd, View input, int64_t weight, int64_t bias) {
    const View own = own_rows(output, config.hidden_size);
    if (rms_norm()) {
      ops().rmsnorm_forward(own, rstd, input, parameter(weight), config.layernorm_epsilon,
                            stream_rows(), config.hidden_size);
    } else {
      ops().layernorm_forward(own, mean, rstd, input, parameter(weight), parameter(bias),
                              config.layernorm_epsilon, stream_rows(), config.hidden_size);
    }
    if (sequence_parallel) tensor_parallel->all_gather(output, own);
  }
  // doutput, input and dinput are the residual stream's rows.
  void norm_backward(View dinput, int64_t weight, int64_t bias, View doutput, View input,
                     View mean, View rstd) {
    if (rms_norm()) {
      ops().rmsnorm_backward(dinput, gradient(weight), doutput, input, parameter(weight), rstd,
                             stream_rows(), config.hidden_size);
    } else {
      ops().layernorm_backward(dinput, gradient(weight), gradient(bias), doutput, input,
                               parameter(weight), mean, rstd, stream_rows(), config.hidden_size);
    }
  }

  // RoPE on the q and k heads of a fused qkv activation (B, T, QKV), in place: per query
  // group the layout is [NH/NG query heads | key | value], so the first NH/NG + 1 heads of
  // every group rotate (with NG = NH: q and k of every [q | k | v]). The backward rotates a
  // gradient back.
  void rotate_queries_and_keys(View qkv, bool backward) {
    const int64_t HD = shard.head_dim();
    const int64_t rotated = shard.num_attention_heads / shard.query_groups() + 1;
    const int64_t group_width = (rotated + 1) * HD;
    for (int64_t g = 0; g < shard.query_groups(); ++g) {
      const View group = qkv.tail(g * group_width);
      if (backward) {
        ops().rope_backward(group, group, rope_cos, rope_sin, batch_size, seq_length, rotated, HD,
                            shard.rotary_dim(), shard.qkv_features());
      } else {
        ops().rope_forward(group, group, rope_cos, rope_sin, batch_size, seq_length, rotated, HD,
                           shard.rotary_dim(), shard.qkv_features());
      }
    }
  }

  // The last forward's mask at a site: inactive (p = 0) in evaluation mode or for p = 0.
  Dropout dropout(DropoutSite site, int64_t layer) const {
    const double probability =
        site == DropoutSite::attention ? config.attention_dropout : config.hidden_dropout;
    if (!forward_training || probability == 0) return {};
    uint64_t key = dropout_key(forward_dropout_seed, forward_dropout_step,
                               static_cast<uint64_t>(site), static_cast<uint64_t>(layer));
    if (site == DropoutSite::attention) {
      if (tensor_parallel_active()) {
        key = common::splitmix64_at(key, static_cast<uint64_t>(tensor_parallel_rank));
      }
      return {probability, key};
    }
    // A hidden site: element i of this rank's rows is element first + i of the whole tensor.
    const auto first = static_cast<uint64_t>(sequence_parallel ? tensor_parallel_rank *
                                                                     stream_rows() *
                                                                     config.hidden_size
                                                               : 0);
    return {probability, key, first};
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
  if (sequence_parallel && new_seq_length % tensor_parallel_size != 0) {
    common::fail("--seq-length {} must be divisible by --tensor-model-parallel-size {} with "
                 "--sequence-parallel (each rank holds an equal share of the sequence)",
                 new_seq_length, tensor_parallel_size);
  }
  ActivationPlan new_plan =
      plan_activations(shard, schedule, new_batch_size, new_seq_length, kElementType,
                       tensor_parallel_size, sequence_parallel);
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
  logsumexp_parts = a.view(plan.logsumexp_parts);
  target_logit = a.view(plan.target_logit);
  branch_shard = a.view(plan.branch_shard);
  dnorm_shard = a.view(plan.dnorm_shard);
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
    ops().rope_tables(rope_cos, rope_sin, seq_length, shard.rotary_dim(),
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
  // This rank's heads and MLP features (all of them without tensor parallelism).
  const int64_t A = shard.attention_features();
  const int64_t F = shard.ffn_hidden_size;
  const int64_t NH = shard.num_attention_heads;
  Device& d = ops();

  norm_forward(a.input_norm, a.input_norm_mean, a.input_norm_rstd, input, p.input_norm_weight,
               p.input_norm_bias);
  d.linear_forward(a.qkv, a.input_norm, parameter(p.qkv_weight), parameter(p.qkv_bias), rows(), C,
                   shard.qkv_features());
  if (rope()) rotate_queries_and_keys(a.qkv, false);
  d.attention_forward(a.context, attention_logsumexp(a), a.qkv, batch_size, seq_length, A, NH,
                      shard.query_groups(), dropout(DropoutSite::attention, l));
  d.linear_forward(branch, a.context, parameter(p.proj_weight), added_once(p.proj_bias), rows(), A,
                   C);
  const View attention_output = sum_over_tensor_parallel(branch, branch_shard);
  if (const Dropout mask = dropout(DropoutSite::attention_output, l); mask.active()) {
    d.dropout_forward(attention_output, attention_output, mask);
  }
  d.residual_forward(a.attention_residual, input, attention_output);

  norm_forward(a.mlp_norm, a.mlp_norm_mean, a.mlp_norm_rstd, a.attention_residual,
               p.mlp_norm_weight, p.mlp_norm_bias);
  d.linear_forward(a.fc1, a.mlp_norm, parameter(p.fc1_weight), parameter(p.fc1_bias), rows(), C,
                   shard.fc1_features());
  if (config.swiglu) {
    d.swiglu_forward(a.activation, a.fc1, rows(), F);
  } else {
    d.gelu_forward(a.activation, a.fc1);
  }
  d.linear_forward(branch, a.activation, parameter(p.fc2_weight), added_once(p.fc2_bias), rows(), F,
                   C);
  const View mlp_output = sum_over_tensor_parallel(branch, branch_shard);
  if (const Dropout mask = dropout(DropoutSite::mlp_output, l); mask.active()) {
    d.dropout_forward(mlp_output, mlp_output, mask);
  }
  d.residual_forward(output, a.attention_residual, mlp_output);
}

// The backward of layer_forward(l): on entry dresidual holds the gradient of the layer's
// output, on return that of its input; parameter gradients accumulate.
template <typename Scalar>
void GptModel<Scalar>::State::layer_backward(int64_t l) {
  const LayerParameters& p = layout.layer(l);
  LayerActivations& a = activations(l);
  const View input = layer_input(l);
  const int64_t C = config.hidden_size;
  const int64_t A = shard.attention_features();
  const int64_t F = shard.ffn_hidden_size;
  const int64_t NH = shard.num_attention_heads;
  Device& d = ops();

  // MLP block; dresidual is the gradient of both the block output and the dropped fc2
  // output, whose mask turns it into fc2's output gradient (in dbranch, free until the
  // norm backward below).
  View dmlp_output = dresidual;
  if (const Dropout mask = dropout(DropoutSite::mlp_output, l); mask.active()) {
    d.dropout_backward(dbranch, dresidual, mask);
    dmlp_output = dbranch;
  }
  // (`branch` is free in the backward: the whole output gradient under sequence parallelism.)
  d.linear_backward(dhidden, gradient(p.fc2_weight), gradient(p.fc2_bias),
                    whole_rows(dmlp_output, branch), a.activation, parameter(p.fc2_weight), rows(),
                    F, C);
  if (config.swiglu) {
    d.swiglu_backward(dfc1, dhidden, a.fc1, rows(), F);
  } else {
    d.gelu_backward(dfc1, dhidden, a.fc1);
  }
  d.linear_backward(dnorm, gradient(p.fc1_weight), gradient(p.fc1_bias), dfc1, a.mlp_norm,
                    parameter(p.fc1_weight), rows(), C, shard.fc1_features());
  norm_backward(dbranch, p.mlp_norm_weight, p.mlp_norm_bias,
                sum_over_tensor_parallel(dnorm, dnorm_shard), a.attention_residual,
                a.mlp_norm_mean, a.mlp_norm_rstd);
  d.residual_forward(dresidual, dresidual, dbranch);

  // Attention block, the same way.
  View dattention_output = dresidual;
  if (const Dropout mask = dropout(DropoutSite::attention_output, l); mask.active()) {
    d.dropout_backward(dbranch, dresidual, mask);
    dattention_output = dbranch;
  }
  // The row-parallel bias's gradient comes from the whole output gradient, the same on every
  // rank, so every rank's copy stays the same.
  d.linear_backward(dnorm, gradient(p.proj_weight), gradient(p.proj_bias),
                    whole_rows(dattention_output, branch), a.context, parameter(p.proj_weight),
                    rows(), A, C);
  if (schedule.selective()) {
    // The attention core again, from the stored qkv and with the forward's mask key: the
    // same log-sum-exp, and the same context bits (linear_proj's backward is done with it).
    d.attention_forward(a.context, attention_logsumexp(a), a.qkv, batch_size, seq_length, A, NH,
                        shard.query_groups(), dropout(DropoutSite::attention, l));
  }
  d.attention_backward(dqkv, dnorm, a.qkv, a.context, attention_logsumexp(a), batch_size,
                       seq_length, A, NH, shard.query_groups(),
                       dropout(DropoutSite::attention, l));
  if (rope()) rotate_queries_and_keys(dqkv, true);
  d.linear_backward(dnorm, gradient(p.qkv_weight), gradient(p.qkv_bias), dqkv, a.input_norm,
                    parameter(p.qkv_weight), rows(), C, shard.qkv_features());
  norm_backward(dbranch, p.input_norm_weight, p.input_norm_bias,
                sum_over_tensor_parallel(dnorm, dnorm_shard), input, a.input_norm_mean,
                a.input_norm_rstd);
  d.residual_forward(dresidual, dresidual, dbranch);
}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config)
    : state_((validate(config), std::make_unique<State>(config, nullptr, nullptr, false))) {}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config, Device& device)
    : state_((validate(config), std::make_unique<State>(config, &device, nullptr, false))) {}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config, Device& device, Communicator& tensor_parallel,
                           bool sequence_parallel)
    : state_((validate(config), std::make_unique<State>(config, &device, &tensor_parallel,
                                                        sequence_parallel))) {}

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
Communicator& GptModel<Scalar>::tensor_parallel_group() const {
  return *state_->tensor_parallel;
}

template <typename Scalar>
const std::vector<BufferRange>& GptModel<Scalar>::gradient_norm_ranges() const {
  return state_->norm_ranges;
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
  const int64_t V = s.shard.padded_vocab_size;  // this rank's vocabulary rows
  const ParameterLayout& layout = s.layout;

  // Each rank's vocabulary rows (and rank 0's positions), summed over the group: in place, or
  // through `branch` into this rank's rows.
  const View embedding_partial = s.sequence_parallel ? s.branch : s.embedded;
  d.embedding_forward(embedding_partial, s.tokens, s.parameter(layout.word_embeddings()),
                      s.added_once(layout.position_embeddings()), batch_size, seq_length, C,
                      s.vocab_start);
  s.sum_over_tensor_parallel(embedding_partial, s.embedded);
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
  if (s.tensor_parallel_active()) {
    // Megatron's vocab_parallel_cross_entropy: the shards' log-sum-exps side by side (the
    // all-gather fills the other ranks' rows around this rank's), the label's logit from the
    // rank that holds it.
    const int64_t rank = s.tensor_parallel_rank;
    const View own_part = s.logsumexp_parts.slice(rank * rows, rows);
    d.vocab_parallel_cross_entropy_partial(own_part, s.target_logit, s.logits, s.labels, rows, V,
                                           s.vocab_start);
    s.tensor_parallel->all_gather(s.logsumexp_parts, own_part);
    s.tensor_parallel->all_reduce(s.target_logit, ReduceOperation::sum);
    d.vocab_parallel_cross_entropy_combine(s.losses, s.logsumexp, s.logsumexp_parts,
                                           s.target_logit, rows, s.tensor_parallel_size);
  } else {
    d.cross_entropy_forward(s.losses, s.logsumexp, s.logits, s.labels, rows, V);
  }
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
  const int64_t V = s.shard.padded_vocab_size;
  const ParameterLayout& layout = s.layout;
  Device& d = s.ops();

  // d(mean loss)/dlogits · grad_scale: every later gradient is linear in dlogits, so the
  // scale is applied once here (computed in Scalar, as the CPU twin takes it).
  const Scalar scale = grad_scale / static_cast<Scalar>(rows);
  d.cross_entropy_backward(s.dlogits, s.logits, s.logsumexp, s.labels, static_cast<double>(scale),
                           rows, V, s.vocab_start);
  d.linear_backward(s.dnorm, s.gradient(layout.output_weight()),
                    View{nullptr, 0, State::kElementType, s.dnorm.on}, s.dlogits, s.final_norm,
                    s.parameter(layout.output_weight()), rows, C, V);
  s.norm_backward(s.dresidual, layout.final_norm_weight(), layout.final_norm_bias(),
                  s.sum_over_tensor_parallel(s.dnorm, s.dnorm_shard),
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
  // Every rank holds the whole embedding gradient: its vocabulary rows take their tokens', and
  // the position table (whole on every rank) the same gradient everywhere.
  d.embedding_backward(s.gradient(layout.word_embeddings()),
                       s.gradient(layout.position_embeddings()), s.whole_rows(s.dresidual, s.branch),
                       s.tokens, s.batch_size, s.seq_length, C, s.vocab_start);
}

template <typename Scalar>
void GptModel<Scalar>::finalize_gradients() {
  State& s = *state_;
  if (!s.sequence_parallel) return;
  // The norms ran on this rank's rows: their gradients are partial sums over the group.
  auto sum = [&](int64_t offset) {
    if (offset != kAbsentTensor) s.tensor_parallel->all_reduce(s.gradient(offset), ReduceOperation::sum);
  };
  for (int64_t l = 0; l < s.config.num_layers; ++l) {
    const LayerParameters& p = s.layout.layer(l);
    for (const int64_t offset : {p.input_norm_weight, p.input_norm_bias, p.mlp_norm_weight,
                                 p.mlp_norm_bias}) {
      sum(offset);
    }
  }
  sum(s.layout.final_norm_weight());
  sum(s.layout.final_norm_bias());
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
