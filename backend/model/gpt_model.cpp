// GptModel: the forward and backward of the decoder that gpt_model.hpp describes, composed
// once from the ops over a Device (backend/ops/; llm.c's gpt2_forward / gpt2_backward, with
// Megatron core's parameter names, layouts and initialisation). This file is the order of the
// ops; the parameter layout and its initialisation are parameter_layout.cpp's, the flat
// parameter and gradient buffers (with ZeRO-3's units and the mixed-precision working copy)
// parameter_store.cpp's, the tensor- and sequence-parallel collectives
// tensor_parallel_region.cpp's, the activation buffers micro_batch_activations.cpp's and their
// plan and recompute schedule activation_plan.cpp's.
//
// Dropout (gpt_model.hpp) draws from a counter-based generator (splitmix64), keyed by
// backend::dropout_key(dropout seed, dropout step, site, layer): the embedding is site 0 (layer
// 0), the attention probabilities of layer l site 1, linear_proj's bias-dropout-add site 2,
// linear_fc2's site 3.
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
// finalize_gradients() (Megatron's allreduce of the sequence-parallel layernorm grads). The
// gathered norm outputs are kept for the backward (Megatron gathers them again there): this
// saves the residual stream's memory, not theirs.
//
// Pipeline parallelism (pipeline_stage.hpp; Narayanan et al. 2021): the model holds its stage's
// tensors and runs one chunk of one micro batch at a time (forward_chunk / backward_chunk); the
// schedule (train/pipeline_schedule.hpp) moves the activations and gradients between stages
// through the chunks' input, output and output-gradient buffers. Each micro batch in flight has
// its own kept buffers (a slot: one arena of activation_plan.hpp's per-micro-batch part), and
// its own dropout key; the scratch is shared. Dropout masks are keyed by the global layer index,
// so a stage draws the masks those layers draw in one process.
//
// Mixed precision (GptConfig::mixed_precision, Megatron's --bf16 or --fp16): the ops read a
// bf16 or fp16 working copy of the fp32 parameters (parameter_store.hpp, converted before the
// first forward after any write of the parameters) and keep activations of that type with fp32
// statistics (activation_plan.hpp); the parameter gradients stay fp32, so the optimizer,
// clipping and checkpoints see the fp32 path's buffers.
#include "backend/model/gpt_model.hpp"
#include "backend/ops/attention.hpp"
#include "backend/ops/cross_entropy.hpp"
#include "backend/ops/dropout.hpp"
#include "backend/ops/gelu.hpp"
#include "backend/ops/layernorm.hpp"
#include "backend/ops/linear.hpp"
#include "backend/ops/reduction.hpp"
#include "backend/ops/residual.hpp"
#include "backend/ops/rmsnorm.hpp"
#include "backend/ops/rope.hpp"
#include "backend/ops/swiglu.hpp"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/splitmix64.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/model/activation_plan.hpp"
#include "backend/model/micro_batch_activations.hpp"
#include "backend/model/parameter_store.hpp"
#include "backend/model/tensor_parallel_region.hpp"
#include "backend/ops/embedding.hpp"

namespace backend {
namespace {

// Where a dropout mask applies; part of its key.
enum class DropoutSite : uint64_t {
  embedding = 0,
  attention = 1,
  attention_output = 2,
  mlp_output = 3
};

// A tensor-parallel group (and --sequence-parallel) alone.
ModelParallelism tensor_parallelism(Communicator& group, bool sequence_parallel) {
  ModelParallelism parallelism;
  parallelism.tensor_parallel = &group;
  parallelism.sequence_parallel = sequence_parallel;
  return parallelism;
}

}  // namespace

template <typename Scalar>
struct GptModel<Scalar>::State {
  static constexpr ElementType kElementType = element_type_of<Scalar>();

  State(const GptConfig& model_config, Device* borrowed, const ModelParallelism& parallelism)
      : config(model_config),
        tensor_parallel(parallelism.tensor_parallel, parallelism.sequence_parallel),
        shard(tensor_parallel.active() ? tensor_parallel_shard(config, tensor_parallel.size())
                                       : config),
        stage(parallelism.pipeline),
        layout(config, tensor_parallel.size(), tensor_parallel.rank(), stage),
        chunks(layout.chunks()),
        schedule(config, chunks),
        embedding_group(parallelism.embedding),
        owned_pipeline_group(parallelism.pipeline_parallel == nullptr
                                 ? make_single_process_communicator("pipeline model parallel")
                                 : nullptr),
        pipeline_group(parallelism.pipeline_parallel != nullptr ? parallelism.pipeline_parallel
                                                                : owned_pipeline_group.get()),
        vocab_start(tensor_parallel.rank() * shard.padded_vocab_size),
        norm_ranges(backend::gradient_norm_ranges(layout.tensors(), tensor_parallel.rank())),
        owned_device(borrowed == nullptr ? std::make_unique<CpuDevice>() : nullptr),
        device(borrowed != nullptr ? borrowed : owned_device.get()),
        store((check_layout(parallelism), layout), *device, activation_type(),
              !config.inference_only, parallelism.sharded_data_parallel),
        micro_batches(shard, schedule, stage, std::ssize(chunks), activation_type(),
                      tensor_parallel.size(), tensor_parallel.sequence_parallel(), *device) {}

  // The layouts the model refuses, by name, before any memory is carved.
  void check_layout(const ModelParallelism& parallelism) const {
    if (pipeline_group->size() != stage.pipeline_parallel) {
      common::fail("GptModel: a pipeline of {} stages over a pipeline group of {} ranks",
                   stage.pipeline_parallel, pipeline_group->size());
    }
    if (tied_copies() && embedding_group == nullptr) {
      common::fail("GptModel: pipeline stage {} of {} holds a tied word embedding but no "
                   "embedding group was given to keep it equal to its copy",
                   stage.rank, stage.pipeline_parallel);
    }
    if (mixed_precision()) check_mixed_precision_layout(parallelism);
    if (parallelism.sharded_data_parallel != nullptr &&
        (tensor_parallel.active() || !stage.whole_model())) {
      common::fail("ZeRO stage 3 with tensor or pipeline parallelism is not built yet "
                   "(--tensor-model-parallel-size {}, --pipeline-model-parallel-size {}); use "
                   "both 1, or ZeRO stage 1 or 2 (--use-distributed-optimizer)",
                   tensor_parallel.size(), stage.pipeline_parallel);
    }
  }

  // What --bf16 and --fp16 are built for, refused by name otherwise (rather than computed in
  // fp32 behind the user's back): GptModel<float> on a device with bf16 and fp16 ops, one rank's
  // whole model.
  void check_mixed_precision_layout(const ModelParallelism& parallelism) const {
    const std::string_view half = element_name(activation_type());
    if (kElementType != ElementType::f32) {
      common::fail("GptModel: {} mixed precision keeps fp32 master weights; a model of {} "
                   "parameters cannot use it",
                   half, element_name(kElementType));
    }
    if (device->memory_kind() != MemoryKind::cuda) {
      common::fail("GptModel: {} activations need a device with {} ops (--device cuda); {} "
                   "computes in fp32 or fp64",
                   half, half, device->name());
    }
    if (tensor_parallel.active() || !stage.whole_model() ||
        parallelism.sharded_data_parallel != nullptr) {
      common::fail("GptModel: {} mixed precision is built for one rank's whole model (data "
                   "parallelism included); tensor parallelism ({}), pipeline parallelism ({}) "
                   "and ZeRO-3 ({}) with {} are not built yet: train them in fp32",
                   half, tensor_parallel.size(), stage.pipeline_parallel,
                   parallelism.sharded_data_parallel != nullptr ? "on" : "off", half);
    }
  }

  bool mixed_precision() const { return config.mixed_precision != MixedPrecision::none; }
  // The activations' type: bf16 or fp16 under GptConfig::mixed_precision, else the parameters'.
  ElementType activation_type() const {
    return working_type(config.mixed_precision, kElementType);
  }

  GptConfig config;
  TensorParallelRegion tensor_parallel;
  GptConfig shard;  // this rank's part of config (config itself without tensor parallelism)
  PipelineStage stage;
  ParameterLayout layout;
  std::vector<LayerRange> chunks;  // the stage's model chunks
  RecomputeSchedule schedule;
  Communicator* embedding_group = nullptr;  // first and last stage (tied embeddings, pp > 1)
  std::unique_ptr<Communicator> owned_pipeline_group;  // a group of one, when none was given
  Communicator* pipeline_group = nullptr;
  int64_t vocab_start = 0;  // the first vocabulary row of this rank's shard
  std::vector<BufferRange> norm_ranges;
  std::unique_ptr<Device> owned_device;  // the CpuDevice of GptModel(config)
  Device* device = nullptr;
  ParameterStore<Scalar> store;
  MicroBatchActivations micro_batches;
  MicroBatchBuffers* batch = nullptr;  // the selected slot (select()), which the ops below use

  // Dropout: the mode and the generator's state for the next forward (the last forward's are
  // its slot's: the backward regenerates the masks from them).
  bool training = true;
  uint64_t dropout_seed = 0;
  uint64_t dropout_step = 0;

  View parameter(int64_t offset) const { return store.parameter(offset); }
  View gradient(int64_t offset) const { return store.gradient(offset); }
  // A parameter that the sum over the tensor-parallel group must hold once (a row-parallel
  // bias, the position table): rank 0's, an empty view elsewhere.
  View added_once(int64_t offset) const {
    return tensor_parallel.rank() == 0 ? parameter(offset) : store.absent();
  }
  const SharedActivations& work() const { return micro_batches.shared(); }
  int64_t batch_size() const { return micro_batches.batch_size(); }
  int64_t seq_length() const { return micro_batches.seq_length(); }
  int64_t rows() const { return micro_batches.rows(); }
  bool rms_norm() const { return config.normalization == Normalization::rms_norm; }
  bool rope() const { return config.position_embedding_type == PositionEmbeddingType::rope; }
  // LayerNorm scales by weight + 1 with --apply-layernorm-1p (the weight is γ − 1).
  double norm_weight_offset() const { return config.apply_layernorm_1p ? 1.0 : 0.0; }

  // One of the model's three norms (--normalization) over the residual stream's rows; mean is
  // unused by RMSNorm. `output` is whole (rows, C): under sequence parallelism this rank
  // normalises its rows into its part of it and the parts are all-gathered (Megatron's
  // gather_from_sequence_parallel_region before a column-parallel layer).
  void norm_forward(View output, View mean, View rstd, View input, int64_t weight, int64_t bias) {
    const View own = tensor_parallel.own_rows(output, config.hidden_size);
    const int64_t stream_rows = tensor_parallel.stream_rows();
    if (rms_norm()) {
      ops::rmsnorm_forward(*device, own, rstd, input, parameter(weight), config.layernorm_epsilon,
                           stream_rows, config.hidden_size);
    } else {
      ops::layernorm_forward(*device, own, mean, rstd, input, parameter(weight), parameter(bias),
                             norm_weight_offset(), config.layernorm_epsilon, stream_rows,
                             config.hidden_size);
    }
    tensor_parallel.gather(own, output);
  }
  // doutput, input and dinput are the residual stream's rows.
  void norm_backward(View dinput, int64_t weight, int64_t bias, View doutput, View input,
                     View mean, View rstd) {
    const int64_t stream_rows = tensor_parallel.stream_rows();
    if (rms_norm()) {
      ops::rmsnorm_backward(*device, dinput, gradient(weight), doutput, input, parameter(weight),
                            rstd, stream_rows, config.hidden_size);
    } else {
      ops::layernorm_backward(*device, dinput, gradient(weight), gradient(bias), doutput, input,
                              parameter(weight), norm_weight_offset(), mean, rstd, stream_rows,
                              config.hidden_size);
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
    const SharedActivations& w = work();
    for (int64_t g = 0; g < shard.query_groups(); ++g) {
      const View group = qkv.tail(g * group_width);
      if (backward) {
        ops::rope_backward(*device, group, group, w.rope_cos, w.rope_sin, batch_size(),
                           seq_length(), rotated, HD, shard.rotary_dim(), shard.qkv_features());
      } else {
        ops::rope_forward(*device, group, group, w.rope_cos, w.rope_sin, batch_size(),
                          seq_length(), rotated, HD, shard.rotary_dim(), shard.qkv_features());
      }
    }
  }

  // The selected micro batch's mask at a site: inactive (p = 0) in evaluation mode or for
  // p = 0.
  Dropout dropout(DropoutSite site, int64_t layer) const {
    const double probability =
        site == DropoutSite::attention ? config.attention_dropout : config.hidden_dropout;
    const ForwardDropout& drawn = batch->dropout;
    if (!drawn.training || probability == 0) return {};
    uint64_t key = dropout_key(drawn.seed, drawn.step, static_cast<uint64_t>(site),
                               static_cast<uint64_t>(layer));
    if (site == DropoutSite::attention) {
      if (tensor_parallel.active()) {
        key = common::splitmix64_at(key, static_cast<uint64_t>(tensor_parallel.rank()));
      }
      return {probability, key};
    }
    // A hidden site: element i of this rank's rows is element first + i of the whole tensor.
    const auto first =
        static_cast<uint64_t>(tensor_parallel.first_own_element(config.hidden_size));
    return {probability, key, first};
  }

  const LayerActivations& layer_activations(int64_t l) const {
    return schedule.recomputed(l)
               ? work().recompute_slots[static_cast<size_t>(l - schedule.chunk_begin(l))]
               : batch->layers[static_cast<size_t>(l)];
  }
  View layer_output(int64_t l) {
    const View kept = batch->layers[static_cast<size_t>(l)].output;
    return kept.empty() ? layer_activations(l).output : kept;
  }
  // The input of layer l: its chunk's input for a chunk's first layer (the embedding output for
  // the first), else layer l − 1's output.
  View layer_input(int64_t l) {
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (chunks[c].begin == l) return c == 0 ? batch->embedded : batch->chunk_inputs[c];
    }
    return layer_output(l - 1);
  }
  View attention_logsumexp(const LayerActivations& a) const {
    return schedule.selective() ? work().recomputed_logsumexp : a.attention_logsumexp;
  }
  bool first_virtual_stage(int64_t chunk) const { return stage.first() && chunk == 0; }
  bool last_virtual_stage(int64_t chunk) const {
    return stage.last() && chunk + 1 == static_cast<int64_t>(chunks.size());
  }
  // The last stage's copy of a tied word embedding (pipeline_stage.hpp), or the first stage's
  // original: kept equal over the embedding group.
  bool tied_copies() const {
    return !stage.whole_model() && config.share_embeddings_and_output_weights &&
           (stage.first() || stage.last());
  }
  void select(int64_t slot) { batch = &micro_batches.slot(slot); }
  void check_slot(int64_t slot, int64_t chunk, const char* what) const;
  void reserve(int64_t batch_size, int64_t seq_length, int64_t slots);
  void layer_forward(int64_t l);
  void layer_backward(int64_t l);
  Scalar forward_chunk(int64_t slot, int64_t chunk);
  void backward_chunk(int64_t slot, int64_t chunk, Scalar grad_scale);
};

template <typename Scalar>
void GptModel<Scalar>::State::reserve(int64_t new_batch_size, int64_t new_seq_length,
                                      int64_t slots) {
  if (!micro_batches.reserve(new_batch_size, new_seq_length, slots)) return;
  tensor_parallel.set_rows(rows());
  if (rope()) {
    ops::rope_tables(*device, work().rope_cos, work().rope_sin, seq_length(), shard.rotary_dim(),
                     static_cast<double>(config.rotary_base), config.rope_scaling);
  }
  select(0);
}

template <typename Scalar>
void GptModel<Scalar>::State::check_slot(int64_t slot, int64_t chunk, const char* what) const {
  if (!micro_batches.reserved()) {
    common::fail("GptModel::{}: no micro-batch shape reserved; call reserve() first", what);
  }
  if (slot < 0 || slot >= micro_batches.slots()) {
    common::fail("GptModel::{}: micro-batch slot {} is outside the {} reserved", what, slot,
                 micro_batches.slots());
  }
  if (chunk < 0 || chunk >= static_cast<int64_t>(chunks.size())) {
    common::fail("GptModel::{}: model chunk {} is outside this stage's {}", what, chunk,
                 chunks.size());
  }
}

// One transformer layer of the reserved shape: reads the previous layer's output (or the
// embedding) and fills its activations.
template <typename Scalar>
void GptModel<Scalar>::State::layer_forward(int64_t l) {
  store.gather(store.layer_unit(l));
  const LayerParameters& p = layout.layer(l);
  const LayerActivations& a = layer_activations(l);
  const SharedActivations& w = work();
  const View input = layer_input(l);
  const View output = layer_output(l);
  const int64_t C = config.hidden_size;
  // This rank's heads and MLP features (all of them without tensor parallelism).
  const int64_t A = shard.attention_features();
  const int64_t F = shard.ffn_hidden_size;
  const int64_t NH = shard.num_attention_heads;
  const int64_t R = rows();
  Device& d = *device;

  norm_forward(a.input_norm, a.input_norm_mean, a.input_norm_rstd, input, p.input_norm_weight,
               p.input_norm_bias);
  ops::linear_forward(d, a.qkv, a.input_norm, parameter(p.qkv_weight), parameter(p.qkv_bias), R,
                      C, shard.qkv_features());
  if (rope()) rotate_queries_and_keys(a.qkv, false);
  ops::attention_forward(d, a.context, attention_logsumexp(a), a.qkv, batch_size(), seq_length(),
                         A, NH, shard.query_groups(), dropout(DropoutSite::attention, l));
  ops::linear_forward(d, w.branch, a.context, parameter(p.proj_weight), added_once(p.proj_bias),
                      R, A, C);
  const View attention_output = tensor_parallel.reduce(w.branch, w.branch_shard);
  if (const Dropout mask = dropout(DropoutSite::attention_output, l); mask.active()) {
    ops::dropout_forward(d, attention_output, attention_output, mask);
  }
  ops::residual_forward(d, a.attention_residual, input, attention_output);

  norm_forward(a.mlp_norm, a.mlp_norm_mean, a.mlp_norm_rstd, a.attention_residual,
               p.mlp_norm_weight, p.mlp_norm_bias);
  ops::linear_forward(d, a.fc1, a.mlp_norm, parameter(p.fc1_weight), parameter(p.fc1_bias), R, C,
                      shard.fc1_features());
  if (config.swiglu) {
    ops::swiglu_forward(d, a.activation, a.fc1, R, F);
  } else {
    ops::gelu_forward(d, a.activation, a.fc1);
  }
  ops::linear_forward(d, w.branch, a.activation, parameter(p.fc2_weight), added_once(p.fc2_bias),
                      R, F, C);
  const View mlp_output = tensor_parallel.reduce(w.branch, w.branch_shard);
  if (const Dropout mask = dropout(DropoutSite::mlp_output, l); mask.active()) {
    ops::dropout_forward(d, mlp_output, mlp_output, mask);
  }
  ops::residual_forward(d, output, a.attention_residual, mlp_output);
}

// The backward of layer_forward(l): on entry dresidual holds the gradient of the layer's
// output, on return that of its input; parameter gradients accumulate.
template <typename Scalar>
void GptModel<Scalar>::State::layer_backward(int64_t l) {
  const int64_t unit = store.layer_unit(l);
  store.gather(unit);
  store.begin_gradients(unit);
  const LayerParameters& p = layout.layer(l);
  const LayerActivations& a = layer_activations(l);
  const SharedActivations& w = work();
  const View input = layer_input(l);
  const int64_t C = config.hidden_size;
  const int64_t A = shard.attention_features();
  const int64_t F = shard.ffn_hidden_size;
  const int64_t NH = shard.num_attention_heads;
  const int64_t R = rows();
  Device& d = *device;

  // MLP block; dresidual is the gradient of both the block output and the dropped fc2
  // output, whose mask turns it into fc2's output gradient (in dbranch, free until the
  // norm backward below).
  View dmlp_output = w.dresidual;
  if (const Dropout mask = dropout(DropoutSite::mlp_output, l); mask.active()) {
    ops::dropout_backward(d, w.dbranch, w.dresidual, mask);
    dmlp_output = w.dbranch;
  }
  // (`branch` is free in the backward: the whole output gradient under sequence parallelism.)
  ops::linear_backward(d, w.dhidden, gradient(p.fc2_weight), gradient(p.fc2_bias),
                       tensor_parallel.gather(dmlp_output, w.branch), a.activation,
                       parameter(p.fc2_weight), R, F, C);
  if (config.swiglu) {
    ops::swiglu_backward(d, w.dfc1, w.dhidden, a.fc1, R, F);
  } else {
    ops::gelu_backward(d, w.dfc1, w.dhidden, a.fc1);
  }
  ops::linear_backward(d, w.dnorm, gradient(p.fc1_weight), gradient(p.fc1_bias), w.dfc1,
                       a.mlp_norm, parameter(p.fc1_weight), R, C, shard.fc1_features());
  norm_backward(w.dbranch, p.mlp_norm_weight, p.mlp_norm_bias,
                tensor_parallel.reduce(w.dnorm, w.dnorm_shard), a.attention_residual,
                a.mlp_norm_mean, a.mlp_norm_rstd);
  ops::residual_forward(d, w.dresidual, w.dresidual, w.dbranch);

  // Attention block, the same way.
  View dattention_output = w.dresidual;
  if (const Dropout mask = dropout(DropoutSite::attention_output, l); mask.active()) {
    ops::dropout_backward(d, w.dbranch, w.dresidual, mask);
    dattention_output = w.dbranch;
  }
  // The row-parallel bias's gradient comes from the whole output gradient, the same on every
  // rank, so every rank's copy stays the same.
  ops::linear_backward(d, w.dnorm, gradient(p.proj_weight), gradient(p.proj_bias),
                       tensor_parallel.gather(dattention_output, w.branch), a.context,
                       parameter(p.proj_weight), R, A, C);
  if (schedule.selective()) {
    // The attention core again, from the stored qkv and with the forward's mask key: the
    // same log-sum-exp, and the same context bits (linear_proj's backward is done with it).
    ops::attention_forward(d, a.context, attention_logsumexp(a), a.qkv, batch_size(),
                           seq_length(), A, NH, shard.query_groups(),
                           dropout(DropoutSite::attention, l));
  }
  ops::attention_backward(d, w.dqkv, w.dnorm, a.qkv, a.context, attention_logsumexp(a),
                          batch_size(), seq_length(), A, NH, shard.query_groups(),
                          dropout(DropoutSite::attention, l));
  if (rope()) rotate_queries_and_keys(w.dqkv, true);
  ops::linear_backward(d, w.dnorm, gradient(p.qkv_weight), gradient(p.qkv_bias), w.dqkv,
                       a.input_norm, parameter(p.qkv_weight), R, C, shard.qkv_features());
  norm_backward(w.dbranch, p.input_norm_weight, p.input_norm_bias,
                tensor_parallel.reduce(w.dnorm, w.dnorm_shard), input, a.input_norm_mean,
                a.input_norm_rstd);
  ops::residual_forward(d, w.dresidual, w.dresidual, w.dbranch);
  store.flush_gradients(unit);
  store.gradients_done(unit);
}

// One chunk's forward on slot `slot`'s buffers (tokens and labels already there): the
// embedding on the first virtual stage, the chunk's layers, the head on the last. Returns the
// mean loss on the last virtual stage, else 0.
template <typename Scalar>
Scalar GptModel<Scalar>::State::forward_chunk(int64_t slot, int64_t chunk) {
  select(slot);
  MicroBatchBuffers& b = *batch;
  b.forward_done[static_cast<size_t>(chunk)] = false;
  b.dropout = {training, dropout_seed, dropout_step};
  store.refresh_weights();
  const SharedActivations& w = work();
  Device& d = *device;
  const int64_t C = config.hidden_size;
  const int64_t V = shard.padded_vocab_size;  // this rank's vocabulary rows
  const int64_t R = rows();

  if (first_virtual_stage(chunk)) {
    store.gather(store.embedding_unit());
    // Each rank's vocabulary rows (and rank 0's positions), summed over the group: in place, or
    // through `branch` into this rank's rows.
    const View embedding_partial = tensor_parallel.sequence_parallel() ? w.branch : b.embedded;
    ops::embedding_forward(d, embedding_partial, b.tokens, parameter(layout.word_embeddings()),
                           added_once(layout.position_embeddings()), batch_size(), seq_length(),
                           C, vocab_start);
    tensor_parallel.reduce(embedding_partial, b.embedded);
    if (const Dropout mask = dropout(DropoutSite::embedding, 0); mask.active()) {
      ops::dropout_forward(d, b.embedded, b.embedded, mask);
    }
  }
  const LayerRange& layers_of_chunk = chunks[static_cast<size_t>(chunk)];
  for (int64_t l = layers_of_chunk.begin; l < layers_of_chunk.end; ++l) layer_forward(l);
  if (!last_virtual_stage(chunk)) {
    b.forward_done[static_cast<size_t>(chunk)] = true;
    return 0;
  }
  store.gather(store.head_unit());
  if (config.share_embeddings_and_output_weights) store.gather(store.embedding_unit());
  norm_forward(b.final_norm, b.final_norm_mean, b.final_norm_rstd,
               layer_output(layers_of_chunk.end - 1), layout.final_norm_weight(),
               layout.final_norm_bias());
  // logits = final_norm · W^T with W the word embedding (tied) or output_layer.weight.
  ops::linear_forward(d, b.logits, b.final_norm, parameter(layout.output_weight()),
                      View{nullptr, 0, b.logits.type, b.logits.on}, R, C, V);
  tensor_parallel.cross_entropy(d, b.losses, b.logsumexp, w.logsumexp_parts, w.target_logit,
                                b.logits, b.labels, R, V, vocab_start);
  b.forward_done[static_cast<size_t>(chunk)] = true;

  // Summed on the device in a fixed order (and in double), so the loss does not depend on the
  // thread count; the one value read back per micro batch. Ignored positions add 0 and are not
  // counted; a micro batch without a scored position has loss 0 (Megatron divides 0 by 0).
  ops::sum(d, w.loss_total, b.losses);
  double total = 0;
  d.copy_to_host(&total, w.loss_total);
  if (b.scored_positions == 0) return 0;
  return static_cast<Scalar>(total / static_cast<double>(b.scored_positions));
}

// The backward of forward_chunk(slot, chunk): from the loss on the last virtual stage, else
// from the output gradient received into the slot; leaves the input's gradient in the chunk's
// input buffer (off the first virtual stage), and adds to the parameter gradients.
template <typename Scalar>
void GptModel<Scalar>::State::backward_chunk(int64_t slot, int64_t chunk, Scalar grad_scale) {
  if (config.inference_only) {
    common::fail("GptModel::backward(): this model was made for inference only "
                 "(GptConfig::inference_only: no gradient buffer); a training model computes "
                 "gradients");
  }
  if (!micro_batches.slot(slot).forward_done[static_cast<size_t>(chunk)]) {
    common::fail(
        "GptModel::backward() called without a completed forward(); run forward() on "
        "the micro batch first");
  }
  select(slot);
  const MicroBatchBuffers& b = *batch;
  const SharedActivations& w = work();
  const int64_t R = rows();
  const int64_t C = config.hidden_size;
  const int64_t V = shard.padded_vocab_size;
  Device& d = *device;
  const LayerRange& layers_of_chunk = chunks[static_cast<size_t>(chunk)];

  if (store.sharded()) {
    // The whole model (ZeRO-3 runs without a pipeline): the embedding's gradients collect
    // from the head (tied) and the embedding backward, the head's from the head.
    store.begin_gradients(store.embedding_unit());
    store.begin_gradients(store.head_unit());
    store.gather(store.head_unit());
    store.gather(store.embedding_unit());
  }
  if (last_virtual_stage(chunk)) {
    // d(mean loss)/dlogits · grad_scale: every later gradient is linear in dlogits, so the
    // scale is applied once here (computed in Scalar, as the CPU twin takes it). The mean is
    // over the scored positions; ignored ones get a zero row whatever the scale.
    const Scalar scale = b.scored_positions == 0
                             ? Scalar{0}
                             : grad_scale / static_cast<Scalar>(b.scored_positions);
    ops::cross_entropy_backward(d, w.dlogits, b.logits, b.logsumexp, b.labels,
                                static_cast<double>(scale), R, V, vocab_start);
    ops::linear_backward(d, w.dnorm, gradient(layout.output_weight()),
                         View{nullptr, 0, kElementType, w.dnorm.on}, w.dlogits, b.final_norm,
                         parameter(layout.output_weight()), R, C, V);
    norm_backward(w.dresidual, layout.final_norm_weight(), layout.final_norm_bias(),
                  tensor_parallel.reduce(w.dnorm, w.dnorm_shard),
                  layer_output(layers_of_chunk.end - 1), b.final_norm_mean, b.final_norm_rstd);
    store.flush_gradients(store.head_unit());
    store.gradients_done(store.head_unit());
  } else {
    d.copy(w.dresidual, b.output_gradients[static_cast<size_t>(chunk)]);
  }
  for (int64_t l = layers_of_chunk.end - 1; l >= layers_of_chunk.begin;) {
    if (!schedule.recomputed(l)) {
      layer_backward(l--);
      continue;
    }
    // A recomputed chunk ending at l: its forward again from the chunk's stored input (the
    // dropout masks are keyed by the last forward's step, so they are the forward's), then
    // its backward.
    const int64_t begin = schedule.chunk_begin(l);
    for (int64_t k = begin; k <= l; ++k) layer_forward(k);
    for (int64_t k = l; k >= begin; --k) layer_backward(k);
    l = begin - 1;
  }
  if (!first_virtual_stage(chunk)) {
    // The input's gradient, for the previous virtual stage; the input itself is spent.
    d.copy(chunk == 0 ? b.embedded : b.chunk_inputs[static_cast<size_t>(chunk)], w.dresidual);
    return;
  }
  if (const Dropout mask = dropout(DropoutSite::embedding, 0); mask.active()) {
    ops::dropout_backward(d, w.dresidual, w.dresidual, mask);
  }
  // Every rank holds the whole embedding gradient: its vocabulary rows take their tokens', and
  // the position table (whole on every rank) the same gradient everywhere.
  ops::embedding_backward(d, gradient(layout.word_embeddings()),
                          gradient(layout.position_embeddings()),
                          tensor_parallel.gather(w.dresidual, w.branch), b.token_index,
                          batch_size(), seq_length(), C, vocab_start);
  store.flush_gradients(store.embedding_unit());
  store.gradients_done(store.embedding_unit());
}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config)
    : state_((validate(config), std::make_unique<State>(config, nullptr, ModelParallelism()))) {}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config, Device& device)
    : state_((validate(config), std::make_unique<State>(config, &device, ModelParallelism()))) {}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config, Device& device, Communicator& tensor_parallel,
                           bool sequence_parallel)
    : state_((validate(config),
              std::make_unique<State>(config, &device,
                                      tensor_parallelism(tensor_parallel, sequence_parallel)))) {}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config, Device& device,
                           const ModelParallelism& parallelism)
    : state_((validate(config), std::make_unique<State>(config, &device, parallelism))) {}

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
  return host_span<Scalar>(state_->store.parameters(), *state_->device, "parameters");
}
template <typename Scalar>
std::span<const Scalar> GptModel<Scalar>::parameters() const {
  return host_span<Scalar>(state_->store.parameters(), *state_->device, "parameters");
}
template <typename Scalar>
std::span<Scalar> GptModel<Scalar>::gradients() {
  return host_span<Scalar>(state_->store.gradients(), *state_->device, "gradients");
}
template <typename Scalar>
std::span<const Scalar> GptModel<Scalar>::gradients() const {
  return host_span<Scalar>(state_->store.gradients(), *state_->device, "gradients");
}

template <typename Scalar>
Communicator& GptModel<Scalar>::tensor_parallel_group() const {
  return state_->tensor_parallel.group();
}

template <typename Scalar>
bool GptModel<Scalar>::sharded_over_data_parallel() const {
  return state_->store.sharded();
}

template <typename Scalar>
ShardRange GptModel<Scalar>::parameter_shard_range() const {
  return state_->store.held();
}

template <typename Scalar>
void GptModel<Scalar>::set_gradients_ready(std::function<void(BufferRange)> callback) {
  state_->store.set_gradients_ready(std::move(callback));
}

template <typename Scalar>
void GptModel<Scalar>::parameters_updated() {
  state_->store.parameters_changed();
}

template <typename Scalar>
Communicator& GptModel<Scalar>::pipeline_parallel_group() const {
  return *state_->pipeline_group;
}

template <typename Scalar>
const std::vector<BufferRange>& GptModel<Scalar>::gradient_norm_ranges() const {
  return state_->norm_ranges;
}

template <typename Scalar>
View GptModel<Scalar>::parameter_buffer() const {
  return state_->store.parameters();
}
template <typename Scalar>
View GptModel<Scalar>::gradient_buffer() const {
  return state_->store.gradients();
}
template <typename Scalar>
Device& GptModel<Scalar>::device() const {
  return *state_->device;
}

template <typename Scalar>
void GptModel<Scalar>::copy_parameters_from_host(std::span<const Scalar> host) {
  const View parameters = state_->store.parameters();
  check_host_size(host.size(), parameters.numel, "copy_parameters_from_host");
  state_->device->copy_from_host(parameters, host.data());
  state_->store.parameters_changed();
}
template <typename Scalar>
void GptModel<Scalar>::copy_parameters_to_host(std::span<Scalar> host) const {
  const View parameters = state_->store.parameters();
  check_host_size(host.size(), parameters.numel, "copy_parameters_to_host");
  state_->device->copy_to_host(host.data(), parameters);
}
template <typename Scalar>
void GptModel<Scalar>::copy_gradients_to_host(std::span<Scalar> host) const {
  const View gradients = state_->store.gradients();
  check_host_size(host.size(), gradients.numel, "copy_gradients_to_host");
  state_->device->copy_to_host(host.data(), gradients);
}

template <typename Scalar>
void GptModel<Scalar>::init_parameters(uint64_t seed) {
  state_->store.init_parameters(seed);
}

template <typename Scalar>
void GptModel<Scalar>::reserve(int64_t batch_size, int64_t seq_length, int64_t micro_batch_slots) {
  State& s = *state_;
  check_micro_batch_shape(s.config, batch_size, seq_length);
  s.reserve(batch_size, seq_length, micro_batch_slots);
}

template <typename Scalar>
Scalar GptModel<Scalar>::forward(std::span<const int32_t> tokens, std::span<const int32_t> labels,
                                 int64_t batch_size, int64_t seq_length) {
  State& s = *state_;
  if (!s.stage.whole_model()) {
    common::fail("GptModel::forward() runs the whole model; stage {} of a {}-stage pipeline runs "
                 "forward_chunk() in a pipeline schedule",
                 s.stage.rank, s.stage.pipeline_parallel);
  }
  // A forward that fails leaves nothing to differentiate: a backward() after it must not
  // silently reuse the micro batch before.
  for (int64_t k = 0; k < s.micro_batches.slots(); ++k) {
    s.micro_batches.slot(k).forward_done.assign(s.chunks.size(), false);
  }
  check_micro_batch_shape(s.config, batch_size, seq_length);
  check_token_ids(s.config, tokens, batch_size, seq_length);
  const int64_t scored_positions = check_labels(s.config, labels, batch_size, seq_length);
  s.reserve(batch_size, seq_length, std::max<int64_t>(1, s.micro_batches.slots()));
  MicroBatchBuffers& buffers = s.micro_batches.slot(0);
  s.micro_batches.upload_tokens(buffers, tokens);
  s.device->copy_from_host(buffers.labels, labels.data());
  buffers.scored_positions = scored_positions;
  const Scalar loss = s.forward_chunk(0, 0);
  if (s.training) ++s.dropout_step;
  return loss;
}

namespace {

// The per-position accessors' precondition: a whole, unsharded model whose last forward()
// finished (a failed forward clears forward_done, so stale buffers are never read).
template <typename State>
void check_last_forward(const State& s, const char* what) {
  if (!s.stage.whole_model() || s.tensor_parallel.active()) {
    common::fail("GptModel::{}: needs the whole model on one rank (this one holds stage {} of {} "
                 "and tensor-parallel shard of {})",
                 what, s.stage.rank, s.stage.pipeline_parallel, s.tensor_parallel.size());
  }
  if (!s.micro_batches.reserved() || s.micro_batches.slot(0).forward_done.empty() ||
      !s.micro_batches.slot(0).forward_done.front()) {
    common::fail("GptModel::{}: no finished forward() to read", what);
  }
}

}  // namespace

template <typename Scalar>
std::vector<Scalar> GptModel<Scalar>::last_position_losses() const {
  State& s = *state_;
  check_last_forward(s, "last_position_losses");
  const View losses = s.micro_batches.slot(0).losses.slice(0, s.rows());
  std::vector<Scalar> host(static_cast<size_t>(s.rows()));
  s.device->copy_to_host(host.data(), losses);
  return host;
}

template <typename Scalar>
std::vector<int32_t> GptModel<Scalar>::last_position_argmax() const {
  State& s = *state_;
  check_last_forward(s, "last_position_argmax");
  return row_argmax<Scalar>(*s.device, s.micro_batches.slot(0).logits, s.rows(),
                             s.shard.padded_vocab_size);
}

template <typename Scalar>
std::vector<Scalar> GptModel<Scalar>::last_position_logits(int64_t row, int64_t position) const {
  State& s = *state_;
  check_last_forward(s, "last_position_logits");
  if (row < 0 || row >= s.batch_size() || position < 0 || position >= s.seq_length()) {
    common::fail("GptModel::last_position_logits: (row {}, position {}) is outside the last "
                 "forward's batch of {} rows of {} positions",
                 row, position, s.batch_size(), s.seq_length());
  }
  const int64_t vocabulary = s.shard.padded_vocab_size;
  const View logits = s.micro_batches.slot(0).logits;
  std::vector<Scalar> host(static_cast<size_t>(vocabulary));
  copy_activations_to_host(
      *s.device, host.data(),
      logits.slice((row * s.seq_length() + position) * vocabulary, vocabulary));
  return host;
}

template <typename Scalar>
void GptModel<Scalar>::backward(Scalar grad_scale) {
  State& s = *state_;
  if (!s.micro_batches.reserved() || !s.stage.whole_model()) {
    common::fail(
        "GptModel::backward() called without a completed forward(); run forward() on "
        "the micro batch first");
  }
  s.backward_chunk(0, 0, grad_scale);
}

template <typename Scalar>
Scalar GptModel<Scalar>::forward_chunk(int64_t slot, int64_t chunk,
                                       std::span<const int32_t> tokens,
                                       std::span<const int32_t> labels) {
  State& s = *state_;
  s.check_slot(slot, chunk, "forward_chunk");
  MicroBatchBuffers& buffers = s.micro_batches.slot(slot);
  buffers.forward_done[static_cast<size_t>(chunk)] = false;
  if (s.first_virtual_stage(chunk)) {
    check_token_ids(s.config, tokens, s.batch_size(), s.seq_length());
    s.micro_batches.upload_tokens(buffers, tokens);
  }
  if (s.last_virtual_stage(chunk)) {
    buffers.scored_positions = check_labels(s.config, labels, s.batch_size(), s.seq_length());
    s.device->copy_from_host(buffers.labels, labels.data());
  }
  return s.forward_chunk(slot, chunk);
}

template <typename Scalar>
void GptModel<Scalar>::backward_chunk(int64_t slot, int64_t chunk, Scalar grad_scale) {
  State& s = *state_;
  s.check_slot(slot, chunk, "backward_chunk");
  s.backward_chunk(slot, chunk, grad_scale);
}

template <typename Scalar>
View GptModel<Scalar>::chunk_input(int64_t slot, int64_t chunk) const {
  const State& s = *state_;
  s.check_slot(slot, chunk, "chunk_input");
  const MicroBatchBuffers& buffers = s.micro_batches.slot(slot);
  return chunk == 0 ? buffers.embedded : buffers.chunk_inputs[static_cast<size_t>(chunk)];
}

template <typename Scalar>
View GptModel<Scalar>::chunk_output(int64_t slot, int64_t chunk) const {
  const State& s = *state_;
  s.check_slot(slot, chunk, "chunk_output");
  const int64_t last = s.chunks[static_cast<size_t>(chunk)].end - 1;
  return s.micro_batches.slot(slot).layers[static_cast<size_t>(last)].output;
}

template <typename Scalar>
View GptModel<Scalar>::chunk_output_gradient(int64_t slot, int64_t chunk) const {
  const State& s = *state_;
  s.check_slot(slot, chunk, "chunk_output_gradient");
  return s.micro_batches.slot(slot).output_gradients[static_cast<size_t>(chunk)];
}

template <typename Scalar>
const PipelineStage& GptModel<Scalar>::pipeline_stage() const {
  return state_->stage;
}

template <typename Scalar>
int64_t GptModel<Scalar>::num_chunks() const {
  return std::ssize(state_->chunks);
}

template <typename Scalar>
int64_t GptModel<Scalar>::micro_batch_slots() const {
  return state_->micro_batches.slots();
}

template <typename Scalar>
void GptModel<Scalar>::finalize_gradients() {
  State& s = *state_;
  if (s.tied_copies()) {
    // The word embedding's two uses, on the first and the last stage, get one gradient.
    const int64_t tied =
        s.stage.first() ? s.layout.word_embeddings() : s.layout.output_weight();
    s.embedding_group->all_reduce(s.gradient(tied), ReduceOperation::sum);
  }
  if (!s.tensor_parallel.sequence_parallel()) return;
  // The norms ran on this rank's rows: their gradients are partial sums over the group.
  auto sum = [&](int64_t offset) {
    if (offset != kAbsentTensor) {
      s.tensor_parallel.group().all_reduce(s.gradient(offset), ReduceOperation::sum);
    }
  };
  for (int64_t l = 0; l < s.config.num_layers; ++l) {
    if (!holds_layer(s.chunks, l)) continue;
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
  return s.micro_batches.kept_bytes() * s.micro_batches.slots();
}

template <typename Scalar>
void GptModel<Scalar>::zero_gradients() {
  state_->device->fill_zero(state_->store.gradients());
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
