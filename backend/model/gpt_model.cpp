// GptModel: the forward and backward of the decoder that gpt_model.hpp describes, composed
// once from the ops over a Device (backend/ops/; llm.c's gpt2_forward / gpt2_backward, with
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
// bf16 or fp16 working copy of the fp32 parameters (`weights`, made by ops::convert before the
// first forward after any write of the parameters) and keep activations of that type with fp32
// statistics (activation_plan.hpp); the parameter gradients stay fp32, so the optimizer,
// clipping and checkpoints see the fp32 path's buffers.
#include "backend/model/gpt_model.hpp"
#include "backend/ops/attention.hpp"
#include "backend/ops/convert.hpp"
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
#include <array>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/splitmix64.hpp"
#include "backend/device/arena.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/model/activation_plan.hpp"
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
  State(const GptConfig& model_config, Device* borrowed, const ModelParallelism& parallelism)
      : config(model_config),
        tensor_parallel_size(parallelism.tensor_parallel != nullptr
                                 ? parallelism.tensor_parallel->size()
                                 : 1),
        tensor_parallel_rank(parallelism.tensor_parallel != nullptr
                                 ? parallelism.tensor_parallel->rank()
                                 : 0),
        shard(tensor_parallel_size > 1 ? tensor_parallel_shard(config, tensor_parallel_size)
                                       : config),
        stage(parallelism.pipeline),
        layout(config, tensor_parallel_size, tensor_parallel_rank, stage),
        chunks(layout.chunks()),
        schedule(config, chunks),
        embedding_group(parallelism.embedding),
        vocab_start(tensor_parallel_rank * shard.padded_vocab_size),
        norm_ranges(backend::gradient_norm_ranges(layout.tensors(), tensor_parallel_rank)) {
    tensor_parallel = parallelism.tensor_parallel;
    if (tensor_parallel == nullptr) {
      owned_group = make_single_process_communicator("tensor parallel");
      tensor_parallel = owned_group.get();
    }
    pipeline_group = parallelism.pipeline_parallel;
    if (pipeline_group == nullptr) {
      owned_pipeline_group = make_single_process_communicator("pipeline model parallel");
      pipeline_group = owned_pipeline_group.get();
    }
    if (pipeline_group->size() != stage.pipeline_parallel) {
      common::fail("GptModel: a pipeline of {} stages over a pipeline group of {} ranks",
                   stage.pipeline_parallel, pipeline_group->size());
    }
    sequence_parallel = parallelism.sequence_parallel && tensor_parallel_size > 1;
    if (tied_copies() && embedding_group == nullptr) {
      common::fail("GptModel: pipeline stage {} of {} holds a tied word embedding but no "
                   "embedding group was given to keep it equal to its copy",
                   stage.rank, stage.pipeline_parallel);
    }
    if (borrowed == nullptr) {
      owned_device = std::make_unique<CpuDevice>();
      borrowed = owned_device.get();
    }
    device = borrowed;
    if (mixed_precision()) check_mixed_precision_layout(parallelism);
    held = ShardRange{0, layout.numel()};
    build_units();
    if (parallelism.sharded_data_parallel != nullptr) shard_over(*parallelism.sharded_data_parallel);
    // Parameters and gradients: one arena of two regions of the same layout (this rank's range
    // of it when sharded), and under mixed precision a third, the working copy the ops read.
    ArenaLayout parameter_layout;
    const int64_t count = held.numel;
    const int64_t parameter_region = parameter_layout.add("parameters", kElementType, count);
    const int64_t gradient_region =
        parameter_layout.add("gradients", kElementType, config.inference_only ? 0 : count);
    const int64_t weight_region = parameter_layout.add(
        fmt::format("{} working weights", element_name(activation_type())), activation_type(),
        mixed_precision() ? count : 0);
    parameter_arena = Arena(*device, std::move(parameter_layout), "parameters");
    parameters = parameter_arena.view(parameter_region);
    gradients = parameter_arena.view(gradient_region);
    weights = mixed_precision() ? parameter_arena.view(weight_region) : parameters;
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
    if (tensor_parallel_size > 1 || !stage.whole_model() ||
        parallelism.sharded_data_parallel != nullptr) {
      common::fail("GptModel: {} mixed precision is built for one rank's whole model (data "
                   "parallelism included); tensor parallelism ({}), pipeline parallelism ({}) "
                   "and ZeRO-3 ({}) with {} are not built yet: train them in fp32",
                   half, tensor_parallel_size, stage.pipeline_parallel,
                   parallelism.sharded_data_parallel != nullptr ? "on" : "off", half);
    }
  }

  static constexpr ElementType kElementType = element_type_of<Scalar>();
  bool mixed_precision() const { return config.mixed_precision != MixedPrecision::none; }
  // The activations' type: bf16 or fp16 under GptConfig::mixed_precision, else the parameters'.
  ElementType activation_type() const {
    return working_type(config.mixed_precision, kElementType);
  }

  GptConfig config;
  int64_t tensor_parallel_size = 1;
  int64_t tensor_parallel_rank = 0;
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

  // ZeRO-3 (sharded_group set): this rank holds `held` of the flat layout; the tensors are used
  // from working slots, one per kind of unit (the embedding, a layer, the head), each gathered
  // over the group when first used after a change (gather_parameters) and its gradients summed
  // into the held range when the unit's backward is done (flush_gradients).
  struct Unit {
    int64_t begin = 0, end = 0;  // flat offsets
    int kind = 0;                // its working slot
  };
  struct WorkingSlot {
    View parameters, gradients;
    int64_t parameter_unit = -1, gradient_unit = -1;  // what they hold now
  };
  Communicator* sharded_group = nullptr;
  ShardRange held;
  std::vector<Unit> units;
  std::vector<int64_t> layer_units;  // by global layer index
  int64_t embedding_unit = -1, head_unit = -1;
  Arena working_arena;
  std::array<WorkingSlot, 3> working;
  std::unique_ptr<Communicator> owned_group;  // a group of one, when none was given
  Communicator* tensor_parallel = nullptr;
  bool sequence_parallel = false;  // the residual stream sharded over the group (tp > 1 only)
  std::unique_ptr<Device> owned_device;  // the CpuDevice of GptModel(config)
  Device* device = nullptr;
  Arena parameter_arena;
  // weights: what the ops read, the parameters themselves or (bf16) their working copy, made
  // from the parameters before a forward whenever they changed since (weights_stale).
  View parameters, gradients, weights;
  bool weights_stale = true;
  void refresh_weights() {
    if (!mixed_precision() || !weights_stale) return;
    ops::convert(*device, weights, parameters);
    weights_stale = false;
  }

  // Dropout: the mode and the generator's state for the next forward, and what the last
  // forward used (the backward regenerates its masks from these).
  bool training = true;
  uint64_t dropout_seed = 0;
  uint64_t dropout_step = 0;
  bool forward_training = false;
  uint64_t forward_dropout_seed = 0;
  uint64_t forward_dropout_step = 0;

  // One micro batch's kept buffers (a slot), whether each chunk's forward completed, and the
  // dropout key its forward used (the backward regenerates the masks from it).
  struct MicroBatchBuffers {
    Arena arena;
    std::vector<LayerActivations> layers;
    View tokens, token_index, labels, embedded, final_norm, final_norm_mean, final_norm_rstd,
        logits, losses, logsumexp;
    std::vector<View> chunk_inputs, output_gradients;
    std::vector<bool> forward_done;
    bool forward_training = false;
    uint64_t forward_dropout_seed = 0;
    uint64_t forward_dropout_step = 0;
    // The labels' positions that are not kIgnoredLabel: the loss is their mean (counted on
    // the host at upload, so no count is read back from the device).
    int64_t scored_positions = 0;
  };

  // The activations of the reserved shape (reserve()): the slots, the shared scratch, and the
  // selected slot's views (select()), which the composition below reads.
  ActivationPlan plan;
  std::vector<MicroBatchBuffers> micro_batches;
  Arena shared_arena;
  int64_t batch_size = 0;
  int64_t seq_length = 0;
  std::vector<LayerActivations> layers;
  std::vector<LayerActivations> recompute_slots;
  View tokens, token_index, labels, embedded, recomputed_logsumexp, final_norm, final_norm_mean,
      final_norm_rstd, logits, losses, logsumexp, loss_total, branch, rope_cos, rope_sin,
      logsumexp_parts, target_logit, branch_shard, dnorm_shard;
  std::vector<View> chunk_inputs;
  View dlogits, dresidual, dbranch, dnorm, dqkv, dhidden, dfc1;


  // The host's index of the tokens being uploaded (token_index_elements(rows), made at
  // reserve()): built here and copied with them, so the embedding backward never reads the
  // tokens back from the device.
  std::vector<int32_t> host_token_index;
  void upload_tokens(const MicroBatchBuffers& buffers, std::span<const int32_t> host_tokens) {
    device->copy_from_host(buffers.tokens, host_tokens.data());
    if (buffers.token_index.empty()) return;
    index_tokens(host_tokens.data(), std::ssize(host_tokens), host_token_index.data());
    device->copy_from_host(buffers.token_index, host_token_index.data());
  }

  // A parameter tensor (or its gradient) by offset: an empty view for an absent one.
  View parameter(int64_t offset) const {
    return sharded_group != nullptr ? working_view(offset, false) : tensor_view(weights, offset);
  }
  View gradient(int64_t offset) const {
    return sharded_group != nullptr ? working_view(offset, true) : tensor_view(gradients, offset);
  }

  void shard_over(Communicator& group);
  void build_units();
  // --overlap-grad-reduce: told each unit's range once its gradients of the micro batch are done.
  std::function<void(BufferRange)> gradients_ready;
  void unit_done(int64_t u) {
    if (!gradients_ready || u < 0) return;
    const Unit& unit = units[static_cast<size_t>(u)];
    gradients_ready({unit.begin, unit.end - unit.begin});
  }
  int64_t unit_of(int64_t offset) const {
    const auto found = std::upper_bound(units.begin(), units.end(), offset,
                                        [](int64_t value, const Unit& unit) { return value < unit.begin; });
    return std::distance(units.begin(), found) - 1;
  }
  // A tensor of a gathered unit (or its gradient, of a unit whose backward is running).
  View working_view(int64_t offset, bool gradient_of) const {
    if (offset == kAbsentTensor) return View{nullptr, 0, kElementType, parameters.on};
    const int64_t u = unit_of(offset);
    const WorkingSlot& slot = working[static_cast<size_t>(units[static_cast<size_t>(u)].kind)];
    if ((gradient_of ? slot.gradient_unit : slot.parameter_unit) != u) {
      common::fail("GptModel: a {} of sharded unit {} was used before it was gathered",
                   gradient_of ? "gradient" : "parameter", u);
    }
    return (gradient_of ? slot.gradients : slot.parameters)
        .slice(offset - units[static_cast<size_t>(u)].begin, numel_at(offset));
  }
  // This rank's part of unit u: [begin, end) of the flat layout, possibly empty.
  std::pair<int64_t, int64_t> held_part(const Unit& unit) const {
    return {std::max(unit.begin, held.offset), std::min(unit.end, held.offset + held.numel)};
  }
  // DeepSpeed's all-gather of a partitioned unit: each rank's part into zeros, summed over the
  // group (every element held by one rank: the sum is that rank's value, exactly).
  void gather_parameters(int64_t u) {
    if (sharded_group == nullptr || u < 0) return;
    const Unit& unit = units[static_cast<size_t>(u)];
    WorkingSlot& slot = working[static_cast<size_t>(unit.kind)];
    if (slot.parameter_unit == u) return;
    const View whole = slot.parameters.slice(0, unit.end - unit.begin);
    device->fill_zero(whole);
    const auto [begin, end] = held_part(unit);
    if (begin < end) {
      device->copy(whole.slice(begin - unit.begin, end - begin),
                 parameters.slice(begin - held.offset, end - begin));
    }
    sharded_group->all_reduce(whole, ReduceOperation::sum);
    slot.parameter_unit = u;
  }
  void begin_gradients(int64_t u) {
    if (sharded_group == nullptr || u < 0) return;
    const Unit& unit = units[static_cast<size_t>(u)];
    WorkingSlot& slot = working[static_cast<size_t>(unit.kind)];
    device->fill_zero(slot.gradients.slice(0, unit.end - unit.begin));
    slot.gradient_unit = u;
  }
  // The unit's gradients summed over the group, this rank's part added to its held gradients.
  void flush_gradients(int64_t u) {
    if (sharded_group == nullptr || u < 0) return;
    const Unit& unit = units[static_cast<size_t>(u)];
    WorkingSlot& slot = working[static_cast<size_t>(unit.kind)];
    const View whole = slot.gradients.slice(0, unit.end - unit.begin);
    sharded_group->all_reduce(whole, ReduceOperation::sum);
    const auto [begin, end] = held_part(unit);
    if (begin < end) {
      const View mine = gradients.slice(begin - held.offset, end - begin);
      ops::residual_forward(*device, mine, mine, whole.slice(begin - unit.begin, end - begin));
    }
    slot.gradient_unit = -1;
  }
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
  // LayerNorm scales by weight + 1 with --apply-layernorm-1p (the weight is γ − 1).
  double norm_weight_offset() const { return config.apply_layernorm_1p ? 1.0 : 0.0; }

  // One of the model's three norms (--normalization) over the residual stream's rows; mean is
  // unused by RMSNorm. `output` is whole (rows, C): under sequence parallelism this rank
  // normalises its rows into its part of it and the parts are all-gathered (Megatron's
  // gather_from_sequence_parallel_region before a column-parallel layer).
  void norm_forward(View output, View mean, View rstd, View input, int64_t weight, int64_t bias) {
    const View own = own_rows(output, config.hidden_size);
    if (rms_norm()) {
      ops::rmsnorm_forward(*device, own, rstd, input, parameter(weight), config.layernorm_epsilon,
                           stream_rows(), config.hidden_size);
    } else {
      ops::layernorm_forward(*device, own, mean, rstd, input, parameter(weight), parameter(bias),
                             norm_weight_offset(), config.layernorm_epsilon, stream_rows(),
                             config.hidden_size);
    }
    if (sequence_parallel) tensor_parallel->all_gather(output, own);
  }
  // doutput, input and dinput are the residual stream's rows.
  void norm_backward(View dinput, int64_t weight, int64_t bias, View doutput, View input,
                     View mean, View rstd) {
    if (rms_norm()) {
      ops::rmsnorm_backward(*device, dinput, gradient(weight), doutput, input, parameter(weight),
                            rstd, stream_rows(), config.hidden_size);
    } else {
      ops::layernorm_backward(*device, dinput, gradient(weight), gradient(bias), doutput, input,
                              parameter(weight), norm_weight_offset(), mean, rstd, stream_rows(),
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
    for (int64_t g = 0; g < shard.query_groups(); ++g) {
      const View group = qkv.tail(g * group_width);
      if (backward) {
        ops::rope_backward(*device, group, group, rope_cos, rope_sin, batch_size, seq_length,
                           rotated, HD, shard.rotary_dim(), shard.qkv_features());
      } else {
        ops::rope_forward(*device, group, group, rope_cos, rope_sin, batch_size, seq_length,
                          rotated, HD, shard.rotary_dim(), shard.qkv_features());
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
  // The input of layer l: its chunk's input for a chunk's first layer (the embedding output for
  // the first), else layer l − 1's output.
  View layer_input(int64_t l) {
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (chunks[c].begin == l) return c == 0 ? embedded : chunk_inputs[c];
    }
    return layer_output(l - 1);
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
  void select(int64_t slot);
  void check_slot(int64_t slot, int64_t chunk, const char* what) const;
  Scalar forward_chunk(int64_t slot, int64_t chunk);
  void backward_chunk(int64_t slot, int64_t chunk, Scalar grad_scale);
  View attention_logsumexp(const LayerActivations& a) const {
    return schedule.selective() ? recomputed_logsumexp : a.attention_logsumexp;
  }

  void reserve(int64_t new_batch_size, int64_t new_seq_length, int64_t slots);
  // After the parameters were written: gathered units and the bf16 working copy are stale.
  void parameters_changed() {
    for (WorkingSlot& slot : working) slot.parameter_unit = -1;
    weights_stale = true;
  }
  void layer_forward(int64_t l);
  void layer_backward(int64_t l);
};

template <typename Scalar>
void GptModel<Scalar>::State::reserve(int64_t new_batch_size, int64_t new_seq_length,
                                      int64_t slots) {
  if (new_batch_size == batch_size && new_seq_length == seq_length &&
      slots == static_cast<int64_t>(micro_batches.size())) {
    return;
  }
  if (slots < 1) common::fail("GptModel::reserve: {} micro-batch slots; at least 1", slots);
  if (sequence_parallel && new_seq_length % tensor_parallel_size != 0) {
    common::fail("--seq-length {} must be divisible by --tensor-model-parallel-size {} with "
                 "--sequence-parallel (each rank holds an equal share of the sequence)",
                 new_seq_length, tensor_parallel_size);
  }
  // The per-micro-batch and the shared part carve the same regions (each with the other's
  // left empty), so one plan's indices serve both arenas.
  ActivationPlan kept_plan =
      plan_activations(shard, schedule, new_batch_size, new_seq_length, activation_type(),
                       tensor_parallel_size, sequence_parallel, stage,
                       ActivationPart::per_micro_batch);
  const ActivationPlan shared_plan =
      plan_activations(shard, schedule, new_batch_size, new_seq_length, activation_type(),
                       tensor_parallel_size, sequence_parallel, stage, ActivationPart::shared);
  // The old arenas go first: a smaller shape gives its memory back, a larger one does not
  // need both at once.
  batch_size = seq_length = 0;
  micro_batches.clear();
  shared_arena = Arena();
  shared_arena = Arena(*device, shared_plan.layout, "activations shared by the micro batches");
  for (int64_t k = 0; k < slots; ++k) {
    MicroBatchBuffers buffers;
    buffers.arena = Arena(*device, kept_plan.layout,
                          slots == 1 ? std::string("activations")
                                     : "activations of micro-batch slot " + std::to_string(k));
    const Arena& a = buffers.arena;
    for (const auto& regions : kept_plan.layers) buffers.layers.push_back(layer_views(a, regions));
    buffers.tokens = a.view(kept_plan.tokens);
    buffers.token_index = a.view(kept_plan.token_index);
    buffers.labels = a.view(kept_plan.labels);
    buffers.embedded = a.view(kept_plan.embedded);
    buffers.final_norm = a.view(kept_plan.final_norm);
    buffers.final_norm_mean = a.view(kept_plan.final_norm_mean);
    buffers.final_norm_rstd = a.view(kept_plan.final_norm_rstd);
    buffers.logits = a.view(kept_plan.logits);
    buffers.losses = a.view(kept_plan.losses);
    buffers.logsumexp = a.view(kept_plan.logsumexp);
    for (const int64_t region : kept_plan.chunk_inputs) buffers.chunk_inputs.push_back(a.view(region));
    for (const int64_t region : kept_plan.output_gradients) {
      buffers.output_gradients.push_back(a.view(region));
    }
    buffers.forward_done.assign(chunks.size(), false);
    micro_batches.push_back(std::move(buffers));
  }
  host_token_index.assign(static_cast<size_t>(micro_batches.front().token_index.numel), 0);
  plan = std::move(kept_plan);
  batch_size = new_batch_size;
  seq_length = new_seq_length;
  const Arena& a = shared_arena;
  recompute_slots.clear();
  for (const auto& regions : plan.recompute_slots) recompute_slots.push_back(layer_views(a, regions));
  recomputed_logsumexp = a.view(plan.recomputed_logsumexp);
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
    ops::rope_tables(*device, rope_cos, rope_sin, seq_length, shard.rotary_dim(),
                     static_cast<double>(config.rotary_base), config.rope_scaling);
  }
  select(0);
}

// The units of the layout: the embedding, each layer, the head (final norm and an untied output
// layer), each a contiguous run of tensors; what ZeRO-3 gathers and --overlap-grad-reduce
// reduces as one bucket.
template <typename Scalar>
void GptModel<Scalar>::State::build_units() {
  std::string current;
  for (const ParameterTensor& tensor : layout.tensors()) {
    std::string key = "head";
    int kind = 2;
    if (tensor.name.starts_with("embedding.")) {
      key = "embedding";
      kind = 0;
    } else if (tensor.name.starts_with("decoder.layers.")) {
      key = tensor.name.substr(0, tensor.name.find('.', std::string("decoder.layers.").size()));
      kind = 1;
    }
    if (units.empty() || key != current) {
      units.push_back({tensor.offset, tensor.offset, kind});
      current = key;
    }
    units.back().end = tensor.offset + tensor.numel;
  }
  embedding_unit = stage.first() ? unit_of(layout.word_embeddings()) : -1;
  head_unit = stage.last() ? unit_of(layout.final_norm_weight()) : -1;
  layer_units.assign(static_cast<size_t>(config.num_layers), -1);
  for (const LayerRange& chunk : chunks) {
    for (int64_t l = chunk.begin; l < chunk.end; ++l) {
      layer_units[static_cast<size_t>(l)] = unit_of(layout.layer(l).input_norm_weight);
    }
  }
}

// ZeRO-3's partition (Rajbhandari et al. 2020, DeepSpeed's stage 3): this rank's contiguous range
// of the flat layout, as the distributed optimizer's, and the units gathered whole for use: the
// embedding, each layer, the head (final norm and an untied output layer), each a contiguous run
// of tensors in the layout.
template <typename Scalar>
void GptModel<Scalar>::State::shard_over(Communicator& group) {
  if (tensor_parallel_size > 1 || !stage.whole_model()) {
    common::fail("ZeRO stage 3 with tensor or pipeline parallelism is not built yet "
                 "(--tensor-model-parallel-size {}, --pipeline-model-parallel-size {}); use "
                 "both 1, or ZeRO stage 1 or 2 (--use-distributed-optimizer)",
                 tensor_parallel_size, stage.pipeline_parallel);
  }
  sharded_group = &group;
  held = shard_range(layout.numel(), group.size(), group.rank());
  std::array<int64_t, 3> widest{};
  for (const Unit& unit : units) {
    widest[static_cast<size_t>(unit.kind)] =
        std::max(widest[static_cast<size_t>(unit.kind)], unit.end - unit.begin);
  }
  ArenaLayout slots;
  std::array<std::array<int64_t, 2>, 3> regions{};
  for (size_t kind = 0; kind < 3; ++kind) {
    regions[kind][0] = slots.add("gathered parameters", kElementType, widest[kind]);
    regions[kind][1] = slots.add("gathered gradients", kElementType, widest[kind]);
  }
  working_arena = Arena(*device, std::move(slots), "ZeRO-3 working set");
  for (size_t kind = 0; kind < 3; ++kind) {
    working[kind].parameters = working_arena.view(regions[kind][0]);
    working[kind].gradients = working_arena.view(regions[kind][1]);
  }
}

// Points the composition's views at slot `slot`'s buffers and dropout key.
template <typename Scalar>
void GptModel<Scalar>::State::select(int64_t slot) {
  const MicroBatchBuffers& b = micro_batches[static_cast<size_t>(slot)];
  layers = b.layers;
  tokens = b.tokens;
  token_index = b.token_index;
  labels = b.labels;
  embedded = b.embedded;
  final_norm = b.final_norm;
  final_norm_mean = b.final_norm_mean;
  final_norm_rstd = b.final_norm_rstd;
  logits = b.logits;
  losses = b.losses;
  logsumexp = b.logsumexp;
  chunk_inputs = b.chunk_inputs;
  forward_training = b.forward_training;
  forward_dropout_seed = b.forward_dropout_seed;
  forward_dropout_step = b.forward_dropout_step;
}

template <typename Scalar>
void GptModel<Scalar>::State::check_slot(int64_t slot, int64_t chunk, const char* what) const {
  if (micro_batches.empty()) {
    common::fail("GptModel::{}: no micro-batch shape reserved; call reserve() first", what);
  }
  if (slot < 0 || slot >= static_cast<int64_t>(micro_batches.size())) {
    common::fail("GptModel::{}: micro-batch slot {} is outside the {} reserved", what, slot,
                 micro_batches.size());
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
  if (sharded_group != nullptr) gather_parameters(layer_units[static_cast<size_t>(l)]);
  const LayerParameters& p = layout.layer(l);
  LayerActivations& a = activations(l);
  const View input = layer_input(l);
  const View output = layer_output(l);
  const int64_t C = config.hidden_size;
  // This rank's heads and MLP features (all of them without tensor parallelism).
  const int64_t A = shard.attention_features();
  const int64_t F = shard.ffn_hidden_size;
  const int64_t NH = shard.num_attention_heads;
  Device& d = *device;

  norm_forward(a.input_norm, a.input_norm_mean, a.input_norm_rstd, input, p.input_norm_weight,
               p.input_norm_bias);
  ops::linear_forward(d, a.qkv, a.input_norm, parameter(p.qkv_weight), parameter(p.qkv_bias),
                      rows(), C, shard.qkv_features());
  if (rope()) rotate_queries_and_keys(a.qkv, false);
  ops::attention_forward(d, a.context, attention_logsumexp(a), a.qkv, batch_size, seq_length, A, NH,
                         shard.query_groups(), dropout(DropoutSite::attention, l));
  ops::linear_forward(d, branch, a.context, parameter(p.proj_weight), added_once(p.proj_bias),
                      rows(), A, C);
  const View attention_output = sum_over_tensor_parallel(branch, branch_shard);
  if (const Dropout mask = dropout(DropoutSite::attention_output, l); mask.active()) {
    ops::dropout_forward(d, attention_output, attention_output, mask);
  }
  ops::residual_forward(d, a.attention_residual, input, attention_output);

  norm_forward(a.mlp_norm, a.mlp_norm_mean, a.mlp_norm_rstd, a.attention_residual,
               p.mlp_norm_weight, p.mlp_norm_bias);
  ops::linear_forward(d, a.fc1, a.mlp_norm, parameter(p.fc1_weight), parameter(p.fc1_bias), rows(),
                      C, shard.fc1_features());
  if (config.swiglu) {
    ops::swiglu_forward(d, a.activation, a.fc1, rows(), F);
  } else {
    ops::gelu_forward(d, a.activation, a.fc1);
  }
  ops::linear_forward(d, branch, a.activation, parameter(p.fc2_weight), added_once(p.fc2_bias),
                      rows(), F, C);
  const View mlp_output = sum_over_tensor_parallel(branch, branch_shard);
  if (const Dropout mask = dropout(DropoutSite::mlp_output, l); mask.active()) {
    ops::dropout_forward(d, mlp_output, mlp_output, mask);
  }
  ops::residual_forward(d, output, a.attention_residual, mlp_output);
}

// The backward of layer_forward(l): on entry dresidual holds the gradient of the layer's
// output, on return that of its input; parameter gradients accumulate.
template <typename Scalar>
void GptModel<Scalar>::State::layer_backward(int64_t l) {
  const int64_t unit = sharded_group != nullptr ? layer_units[static_cast<size_t>(l)] : -1;
  gather_parameters(unit);
  begin_gradients(unit);
  const LayerParameters& p = layout.layer(l);
  LayerActivations& a = activations(l);
  const View input = layer_input(l);
  const int64_t C = config.hidden_size;
  const int64_t A = shard.attention_features();
  const int64_t F = shard.ffn_hidden_size;
  const int64_t NH = shard.num_attention_heads;
  Device& d = *device;

  // MLP block; dresidual is the gradient of both the block output and the dropped fc2
  // output, whose mask turns it into fc2's output gradient (in dbranch, free until the
  // norm backward below).
  View dmlp_output = dresidual;
  if (const Dropout mask = dropout(DropoutSite::mlp_output, l); mask.active()) {
    ops::dropout_backward(d, dbranch, dresidual, mask);
    dmlp_output = dbranch;
  }
  // (`branch` is free in the backward: the whole output gradient under sequence parallelism.)
  ops::linear_backward(d, dhidden, gradient(p.fc2_weight), gradient(p.fc2_bias),
                       whole_rows(dmlp_output, branch), a.activation, parameter(p.fc2_weight),
                       rows(), F, C);
  if (config.swiglu) {
    ops::swiglu_backward(d, dfc1, dhidden, a.fc1, rows(), F);
  } else {
    ops::gelu_backward(d, dfc1, dhidden, a.fc1);
  }
  ops::linear_backward(d, dnorm, gradient(p.fc1_weight), gradient(p.fc1_bias), dfc1, a.mlp_norm,
                       parameter(p.fc1_weight), rows(), C, shard.fc1_features());
  norm_backward(dbranch, p.mlp_norm_weight, p.mlp_norm_bias,
                sum_over_tensor_parallel(dnorm, dnorm_shard), a.attention_residual,
                a.mlp_norm_mean, a.mlp_norm_rstd);
  ops::residual_forward(d, dresidual, dresidual, dbranch);

  // Attention block, the same way.
  View dattention_output = dresidual;
  if (const Dropout mask = dropout(DropoutSite::attention_output, l); mask.active()) {
    ops::dropout_backward(d, dbranch, dresidual, mask);
    dattention_output = dbranch;
  }
  // The row-parallel bias's gradient comes from the whole output gradient, the same on every
  // rank, so every rank's copy stays the same.
  ops::linear_backward(d, dnorm, gradient(p.proj_weight), gradient(p.proj_bias),
                       whole_rows(dattention_output, branch), a.context, parameter(p.proj_weight),
                       rows(), A, C);
  if (schedule.selective()) {
    // The attention core again, from the stored qkv and with the forward's mask key: the
    // same log-sum-exp, and the same context bits (linear_proj's backward is done with it).
    ops::attention_forward(d, a.context, attention_logsumexp(a), a.qkv, batch_size, seq_length, A,
                           NH, shard.query_groups(), dropout(DropoutSite::attention, l));
  }
  ops::attention_backward(d, dqkv, dnorm, a.qkv, a.context, attention_logsumexp(a), batch_size,
                          seq_length, A, NH, shard.query_groups(),
                          dropout(DropoutSite::attention, l));
  if (rope()) rotate_queries_and_keys(dqkv, true);
  ops::linear_backward(d, dnorm, gradient(p.qkv_weight), gradient(p.qkv_bias), dqkv, a.input_norm,
                       parameter(p.qkv_weight), rows(), C, shard.qkv_features());
  norm_backward(dbranch, p.input_norm_weight, p.input_norm_bias,
                sum_over_tensor_parallel(dnorm, dnorm_shard), input, a.input_norm_mean,
                a.input_norm_rstd);
  ops::residual_forward(d, dresidual, dresidual, dbranch);
  flush_gradients(unit);
  unit_done(layer_units[static_cast<size_t>(l)]);
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
bool GptModel<Scalar>::sharded_over_data_parallel() const {
  return state_->sharded_group != nullptr;
}

template <typename Scalar>
ShardRange GptModel<Scalar>::parameter_shard_range() const {
  return state_->held;
}

template <typename Scalar>
void GptModel<Scalar>::set_gradients_ready(std::function<void(BufferRange)> callback) {
  state_->gradients_ready = std::move(callback);
}

template <typename Scalar>
void GptModel<Scalar>::parameters_updated() {
  state_->parameters_changed();
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
  state_->parameters_changed();
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
  if (s.sharded_group != nullptr) {
    // The whole model's values, this rank's range kept.
    std::vector<Scalar> staged(static_cast<size_t>(s.layout.numel()));
    s.layout.init_parameters(staged.data(), seed);
    s.device->copy_from_host(s.parameters, staged.data() + s.held.offset);
    s.parameters_changed();
    return;
  }
  if (s.parameters.on == MemoryKind::host) {
    // In place: the threads that draw the values first-touch the pages.
    s.layout.init_parameters(s.parameters.template as<Scalar>(), seed);
  } else {
    std::vector<Scalar> staged(static_cast<size_t>(s.parameters.numel));
    s.layout.init_parameters(staged.data(), seed);
    s.device->copy_from_host(s.parameters, staged.data());
  }
  s.parameters_changed();
}

template <typename Scalar>
void GptModel<Scalar>::reserve(int64_t batch_size, int64_t seq_length, int64_t micro_batch_slots) {
  State& s = *state_;
  check_micro_batch_shape(s.config, batch_size, seq_length);
  s.reserve(batch_size, seq_length, micro_batch_slots);
}

namespace {

// A micro batch's token or label ids: B·T of them, each in the vocabulary; labels may also be
// kIgnoredLabel. Returns how many ids are not.
int64_t check_ids(const GptConfig& config, std::span<const int32_t> ids, const char* what,
                  int64_t batch_size, int64_t seq_length, bool ignored_allowed) {
  const int64_t rows = batch_size * seq_length;
  if (static_cast<int64_t>(ids.size()) != rows) {
    common::fail("{} has {} entries, expected batch size {} × sequence length {} = {}", what,
                 ids.size(), batch_size, seq_length, rows);
  }
  int64_t scored = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t id = ids[static_cast<size_t>(i)];
    if (ignored_allowed && id == kIgnoredLabel) continue;
    if (id < 0 || id >= config.vocab_size) {
      common::fail("{} value {} at index {} (batch row {}, position {}) is outside the "
                   "vocabulary [0, {}){}",
                   what, id, i, i / seq_length, i % seq_length, config.vocab_size,
                   ignored_allowed ? fmt::format(" and is not {} (ignored)", kIgnoredLabel) : "");
    }
    ++scored;
  }
  return scored;
}

void check_token_ids(const GptConfig& config, std::span<const int32_t> tokens, int64_t batch_size,
                     int64_t seq_length) {
  check_ids(config, tokens, "tokens", batch_size, seq_length, false);
}

int64_t check_labels(const GptConfig& config, std::span<const int32_t> labels, int64_t batch_size,
                     int64_t seq_length) {
  return check_ids(config, labels, "labels", batch_size, seq_length, true);
}

}  // namespace

// One chunk's forward on the selected slot's buffers (tokens and labels already there): the
// embedding on the first virtual stage, the chunk's layers, the head on the last. Returns the
// mean loss on the last virtual stage, else 0.
template <typename Scalar>
Scalar GptModel<Scalar>::State::forward_chunk(int64_t slot, int64_t chunk) {
  MicroBatchBuffers& buffers = micro_batches[static_cast<size_t>(slot)];
  buffers.forward_done[static_cast<size_t>(chunk)] = false;
  buffers.forward_training = training;
  buffers.forward_dropout_seed = dropout_seed;
  buffers.forward_dropout_step = dropout_step;
  select(slot);
  refresh_weights();
  Device& d = *device;
  const int64_t C = config.hidden_size;
  const int64_t V = shard.padded_vocab_size;  // this rank's vocabulary rows
  const int64_t R = rows();

  if (first_virtual_stage(chunk)) {
    gather_parameters(embedding_unit);
    // Each rank's vocabulary rows (and rank 0's positions), summed over the group: in place, or
    // through `branch` into this rank's rows.
    const View embedding_partial = sequence_parallel ? branch : embedded;
    ops::embedding_forward(d, embedding_partial, tokens, parameter(layout.word_embeddings()),
                           added_once(layout.position_embeddings()), batch_size, seq_length, C,
                           vocab_start);
    sum_over_tensor_parallel(embedding_partial, embedded);
    if (const Dropout mask = dropout(DropoutSite::embedding, 0); mask.active()) {
      ops::dropout_forward(d, embedded, embedded, mask);
    }
  }
  const LayerRange& layers_of_chunk = chunks[static_cast<size_t>(chunk)];
  for (int64_t l = layers_of_chunk.begin; l < layers_of_chunk.end; ++l) layer_forward(l);
  if (!last_virtual_stage(chunk)) {
    buffers.forward_done[static_cast<size_t>(chunk)] = true;
    return 0;
  }
  gather_parameters(head_unit);
  if (config.share_embeddings_and_output_weights) gather_parameters(embedding_unit);
  norm_forward(final_norm, final_norm_mean, final_norm_rstd, layer_output(layers_of_chunk.end - 1),
               layout.final_norm_weight(), layout.final_norm_bias());
  // logits = final_norm · W^T with W the word embedding (tied) or output_layer.weight.
  ops::linear_forward(d, logits, final_norm, parameter(layout.output_weight()),
                      View{nullptr, 0, logits.type, logits.on}, R, C, V);
  if (tensor_parallel_active()) {
    // Megatron's vocab_parallel_cross_entropy: the shards' log-sum-exps side by side (the
    // all-gather fills the other ranks' rows around this rank's), the label's logit from the
    // rank that holds it.
    const View own_part = logsumexp_parts.slice(tensor_parallel_rank * R, R);
    ops::vocab_parallel_cross_entropy_partial(d, own_part, target_logit, logits, labels, R, V,
                                              vocab_start);
    tensor_parallel->all_gather(logsumexp_parts, own_part);
    tensor_parallel->all_reduce(target_logit, ReduceOperation::sum);
    ops::vocab_parallel_cross_entropy_combine(d, losses, logsumexp, logsumexp_parts, target_logit,
                                              labels, R, tensor_parallel_size);
  } else {
    ops::cross_entropy_forward(d, losses, logsumexp, logits, labels, R, V);
  }
  buffers.forward_done[static_cast<size_t>(chunk)] = true;

  // Summed on the device in a fixed order (and in double), so the loss does not depend on the
  // thread count; the one value read back per micro batch. Ignored positions add 0 and are not
  // counted; a micro batch without a scored position has loss 0 (Megatron divides 0 by 0).
  ops::sum(d, loss_total, losses);
  double total = 0;
  d.copy_to_host(&total, loss_total);
  if (buffers.scored_positions == 0) return 0;
  return static_cast<Scalar>(total / static_cast<double>(buffers.scored_positions));
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
  MicroBatchBuffers& buffers = micro_batches[static_cast<size_t>(slot)];
  if (!buffers.forward_done[static_cast<size_t>(chunk)]) {
    common::fail(
        "GptModel::backward() called without a completed forward(); run forward() on "
        "the micro batch first");
  }
  select(slot);
  const int64_t R = rows();
  const int64_t C = config.hidden_size;
  const int64_t V = shard.padded_vocab_size;
  Device& d = *device;
  const LayerRange& layers_of_chunk = chunks[static_cast<size_t>(chunk)];

  if (sharded_group != nullptr) {
    // The whole model (ZeRO-3 runs without a pipeline): the embedding's gradients collect
    // from the head (tied) and the embedding backward, the head's from the head.
    begin_gradients(embedding_unit);
    begin_gradients(head_unit);
    gather_parameters(head_unit);
    gather_parameters(embedding_unit);
  }
  if (last_virtual_stage(chunk)) {
    // d(mean loss)/dlogits · grad_scale: every later gradient is linear in dlogits, so the
    // scale is applied once here (computed in Scalar, as the CPU twin takes it). The mean is
    // over the scored positions; ignored ones get a zero row whatever the scale.
    const Scalar scale = buffers.scored_positions == 0
                             ? Scalar{0}
                             : grad_scale / static_cast<Scalar>(buffers.scored_positions);
    ops::cross_entropy_backward(d, dlogits, logits, logsumexp, labels, static_cast<double>(scale),
                                R, V, vocab_start);
    ops::linear_backward(d, dnorm, gradient(layout.output_weight()),
                         View{nullptr, 0, kElementType, dnorm.on}, dlogits, final_norm,
                         parameter(layout.output_weight()), R, C, V);
    norm_backward(dresidual, layout.final_norm_weight(), layout.final_norm_bias(),
                  sum_over_tensor_parallel(dnorm, dnorm_shard),
                  layer_output(layers_of_chunk.end - 1), final_norm_mean, final_norm_rstd);
    flush_gradients(head_unit);
    unit_done(head_unit);
  } else {
    d.copy(dresidual, buffers.output_gradients[static_cast<size_t>(chunk)]);
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
    d.copy(chunk == 0 ? embedded : chunk_inputs[static_cast<size_t>(chunk)], dresidual);
    return;
  }
  if (const Dropout mask = dropout(DropoutSite::embedding, 0); mask.active()) {
    ops::dropout_backward(d, dresidual, dresidual, mask);
  }
  // Every rank holds the whole embedding gradient: its vocabulary rows take their tokens', and
  // the position table (whole on every rank) the same gradient everywhere.
  ops::embedding_backward(d, gradient(layout.word_embeddings()),
                          gradient(layout.position_embeddings()), whole_rows(dresidual, branch),
                          token_index, batch_size, seq_length, C, vocab_start);
  flush_gradients(embedding_unit);
  unit_done(embedding_unit);
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
  for (auto& buffers : s.micro_batches) buffers.forward_done.assign(s.chunks.size(), false);
  check_micro_batch_shape(s.config, batch_size, seq_length);
  check_token_ids(s.config, tokens, batch_size, seq_length);
  const int64_t scored_positions = check_labels(s.config, labels, batch_size, seq_length);
  s.reserve(batch_size, seq_length, std::max<int64_t>(1, std::ssize(s.micro_batches)));
  Device& d = *s.device;
  auto& buffers = s.micro_batches.front();
  s.upload_tokens(buffers, tokens);
  d.copy_from_host(buffers.labels, labels.data());
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
  if (!s.stage.whole_model() || s.tensor_parallel_size > 1) {
    common::fail("GptModel::{}: needs the whole model on one rank (this one holds stage {} of {} "
                 "and tensor-parallel shard of {})",
                 what, s.stage.rank, s.stage.pipeline_parallel, s.tensor_parallel_size);
  }
  if (s.micro_batches.empty() || s.micro_batches.front().forward_done.empty() ||
      !s.micro_batches.front().forward_done.front()) {
    common::fail("GptModel::{}: no finished forward() to read", what);
  }
}

// Activations copied to the host as Scalar: bf16 and fp16 ones (GptConfig::mixed_precision)
// widened, exactly.
template <typename Narrow, typename Scalar>
void widen_to_host(Device& device, Scalar* host, View source) {
  std::vector<Narrow> narrow(static_cast<size_t>(source.numel));
  device.copy_to_host(narrow.data(), source);
  std::transform(narrow.begin(), narrow.end(), host,
                 [](Narrow value) { return static_cast<Scalar>(to_float(value)); });
}
template <typename Scalar>
void copy_activations_to_host(Device& device, Scalar* host, View source) {
  switch (source.type) {
    case ElementType::bf16: widen_to_host<bfloat16>(device, host, source); return;
    case ElementType::f16: widen_to_host<float16>(device, host, source); return;
    default: device.copy_to_host(host, source); return;
  }
}

}  // namespace

template <typename Scalar>
std::vector<Scalar> GptModel<Scalar>::last_position_losses() const {
  State& s = *state_;
  check_last_forward(s, "last_position_losses");
  const View losses = s.micro_batches.front().losses.slice(0, s.rows());
  std::vector<Scalar> host(static_cast<size_t>(s.rows()));
  s.device->copy_to_host(host.data(), losses);
  return host;
}

template <typename Scalar>
std::vector<int32_t> GptModel<Scalar>::last_position_argmax() const {
  State& s = *state_;
  check_last_forward(s, "last_position_argmax");
  const int64_t rows = s.rows();
  const int64_t vocabulary = s.shard.padded_vocab_size;
  const View logits = s.micro_batches.front().logits;
  // Row blocks of at most ~16 MiB on the host, whatever the vocabulary and batch.
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 22) / vocabulary);
  std::vector<Scalar> values(static_cast<size_t>(std::min(block, rows) * vocabulary));
  std::vector<int32_t> argmax(static_cast<size_t>(rows));
  for (int64_t first = 0; first < rows; first += block) {
    const int64_t count = std::min(block, rows - first);
    copy_activations_to_host(*s.device, values.data(),
                             logits.slice(first * vocabulary, count * vocabulary));
    for (int64_t r = 0; r < count; ++r) {
      const Scalar* row = values.data() + r * vocabulary;
      // std::max_element returns the first of equal maxima.
      argmax[static_cast<size_t>(first + r)] =
          static_cast<int32_t>(std::max_element(row, row + vocabulary) - row);
    }
  }
  return argmax;
}

template <typename Scalar>
std::vector<Scalar> GptModel<Scalar>::last_position_logits(int64_t row, int64_t position) const {
  State& s = *state_;
  check_last_forward(s, "last_position_logits");
  if (row < 0 || row >= s.batch_size || position < 0 || position >= s.seq_length) {
    common::fail("GptModel::last_position_logits: (row {}, position {}) is outside the last "
                 "forward's batch of {} rows of {} positions",
                 row, position, s.batch_size, s.seq_length);
  }
  const int64_t vocabulary = s.shard.padded_vocab_size;
  const View logits = s.micro_batches.front().logits;
  std::vector<Scalar> host(static_cast<size_t>(vocabulary));
  copy_activations_to_host(*s.device, host.data(),
                           logits.slice((row * s.seq_length + position) * vocabulary, vocabulary));
  return host;
}

template <typename Scalar>
void GptModel<Scalar>::backward(Scalar grad_scale) {
  State& s = *state_;
  if (s.micro_batches.empty() || !s.stage.whole_model()) {
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
  auto& buffers = s.micro_batches[static_cast<size_t>(slot)];
  buffers.forward_done[static_cast<size_t>(chunk)] = false;
  Device& d = *s.device;
  if (s.first_virtual_stage(chunk)) {
    check_token_ids(s.config, tokens, s.batch_size, s.seq_length);
    s.upload_tokens(buffers, tokens);
  }
  if (s.last_virtual_stage(chunk)) {
    buffers.scored_positions = check_labels(s.config, labels, s.batch_size, s.seq_length);
    d.copy_from_host(buffers.labels, labels.data());
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
  const auto& buffers = s.micro_batches[static_cast<size_t>(slot)];
  return chunk == 0 ? buffers.embedded : buffers.chunk_inputs[static_cast<size_t>(chunk)];
}

template <typename Scalar>
View GptModel<Scalar>::chunk_output(int64_t slot, int64_t chunk) const {
  const State& s = *state_;
  s.check_slot(slot, chunk, "chunk_output");
  const int64_t last = s.chunks[static_cast<size_t>(chunk)].end - 1;
  return s.micro_batches[static_cast<size_t>(slot)].layers[static_cast<size_t>(last)].output;
}

template <typename Scalar>
View GptModel<Scalar>::chunk_output_gradient(int64_t slot, int64_t chunk) const {
  const State& s = *state_;
  s.check_slot(slot, chunk, "chunk_output_gradient");
  return s.micro_batches[static_cast<size_t>(slot)].output_gradients[static_cast<size_t>(chunk)];
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
  return std::ssize(state_->micro_batches);
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
  if (!s.sequence_parallel) return;
  // The norms ran on this rank's rows: their gradients are partial sums over the group.
  auto sum = [&](int64_t offset) {
    if (offset != kAbsentTensor) s.tensor_parallel->all_reduce(s.gradient(offset), ReduceOperation::sum);
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
  return s.batch_size == 0 ? 0 : s.plan.kept_bytes * std::ssize(s.micro_batches);
}

template <typename Scalar>
void GptModel<Scalar>::zero_gradients() {
  state_->device->fill_zero(state_->gradients);
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
