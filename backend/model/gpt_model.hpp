// A GPT-2/GPT-3 or Llama-style decoder as Megatron-LM builds it (megatron/core/models/gpt/
// gpt_model.py with the local transformer layer spec), fp32 or fp64 on the CPU, forward and
// backward written by hand (llm.c style):
//   x = dropout_h(word_embeddings[tokens] + position_embeddings[0..T))
//   per layer:  x = x + dropout_h(linear_proj(attention(rope(linear_qkv(input_layernorm(x))))))
//               x = x + dropout_h(linear_fc2(act(linear_fc1(pre_mlp_layernorm(x)))))
//   logits = final_layernorm(x) · W^T,   W = word_embeddings (tied) or output_layer.weight
//   loss   = mean over B·T of cross_entropy(logits over the padded vocabulary, labels), the
//            positions labelled kIgnoredLabel (ops/cross_entropy.hpp; Megatron's loss mask of 0,
//            --eod-mask-loss) left out of the sum and of the count
// Dimensions: B batch, T sequence, C hidden, NH heads, HD = C / NH, F ffn, V padded vocab.
//
// The GptConfig switches (Megatron's flags; the defaults are GPT-2):
//   position_embedding_type  learned_absolute: the position table above, rope() the identity;
//                            rope: no position table, and rope() rotates the q and k heads
//                            (ops/rope.hpp, Megatron core's non-interleaved RoPE)
//   normalization            the three norms are LayerNorm (weight, bias) or RMSNorm (weight)
//   swiglu                   act = gelu_tanh on F features, or linear_fc1 gives 2F features
//                            [a | b] and act = silu(a) · b (ops/swiglu.hpp)
//   add_bias_linear          false: no bias on linear_qkv, linear_proj, linear_fc1, linear_fc2
//   num_query_groups         NG < NH: grouped-query attention, NG key/value heads each shared
//                            by NH/NG query heads (ops/attention.hpp)
//   share_embeddings_and_output_weights  false: the logits use output_layer.weight
//
// Dropout, at Megatron core's four sites: dropout_h, with p = hidden_dropout, after the
// embedding sum (Megatron's embedding_dropout) and in the two bias-dropout-adds (x = residual
// + dropout(linear output + bias)); inside attention, the probabilities after the causal
// softmax are dropped with p = attention_dropout. Inverted dropout (backend/ops/dropout.hpp):
// kept elements are scaled by 1/(1 − p). It applies in training mode only; with p = 0, or in
// evaluation mode, the forward and backward are the dropout-free computation, bit for bit.
// The masks are never stored: element i of a mask is a function of (dropout seed, dropout
// step, site, layer, i) alone (a counter-based generator), so the backward regenerates the
// forward's masks, and neither depends on the thread count.
//
// Activation recompute (GptConfig::recompute_*, Megatron's --recompute-*) trades time for
// memory without changing a bit of the loss or the gradients: selective drops each layer's
// attention softmax statistics (log-sum-exp; the blockwise attention keeps no probabilities,
// so this saves little) and the backward runs the attention core again from the stored qkv; full
// drops whole layers (uniform: chunks of recompute_num_layers layers, storing each chunk's input;
// block: the first recompute_num_layers layers, one by one) and the backward runs the chunk's
// forward again before its backward. The ops are deterministic and the dropout masks are keyed by
// the last forward's step, so the recomputation is the forward.
//
// Parameters live in one flat buffer (and gradients in a second one of the same layout) so
// the optimizer, gradient clipping, checkpoints and, later, data-parallel all-reduce see one
// contiguous array. Tensor names, order and layouts follow Megatron core's state dict, so
// checkpoint conversion is a renaming; the bracketed tensors exist only with the switch noted:
//   embedding.word_embeddings.weight                  (V, C)
//   [embedding.position_embeddings.weight]            (max_position_embeddings, C)  learned
//   decoder.layers.{i}.input_layernorm.weight         (C)
//   [decoder.layers.{i}.input_layernorm.bias]         (C)      LayerNorm
//   decoder.layers.{i}.self_attention.linear_qkv.weight (QKV, C), QKV = (NH + 2·NG)·HD, rows
//       per query group: [NH/NG query heads | key | value] (Megatron's interleaving; with
//       NG = NH, (3C, C) and per head [q | k | v])
//   [decoder.layers.{i}.self_attention.linear_qkv.bias] (QKV)    bias
//   decoder.layers.{i}.self_attention.linear_proj.weight (C, C)
//   [decoder.layers.{i}.self_attention.linear_proj.bias] (C)     bias
//   decoder.layers.{i}.pre_mlp_layernorm.weight       (C)
//   [decoder.layers.{i}.pre_mlp_layernorm.bias]       (C)      LayerNorm
//   decoder.layers.{i}.mlp.linear_fc1.weight          (F, C), or (2F, C) rows [gate | linear]
//   [decoder.layers.{i}.mlp.linear_fc1.bias]          (F or 2F) bias
//   decoder.layers.{i}.mlp.linear_fc2.weight          (C, F)
//   [decoder.layers.{i}.mlp.linear_fc2.bias]          (C)      bias
//   decoder.final_layernorm.weight                    (C)
//   [decoder.final_layernorm.bias]                    (C)      LayerNorm
//   [output_layer.weight]                             (V, C)   untied
// (Megatron keeps the names input_layernorm / pre_mlp_layernorm / final_layernorm for RMSNorm.)
// Linear weights are (out, in), y = x · W^T + b, as torch.nn.Linear and Megatron store them.
//
// Contract: backward() accumulates into the parameter gradients (+=), so gradient
// accumulation over micro batches is "zero_gradients(); for each micro batch: forward,
// backward(1/num_micro_batches)".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/device/device.hpp"
#include "backend/dist/communicator.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/model/model_parallelism.hpp"
#include "backend/model/parameter_layout.hpp"
#include "backend/model/parameter_store.hpp"
#include "backend/model/pipeline_stage.hpp"
#include "backend/ops/cross_entropy.hpp"

namespace backend {

template <typename Scalar>
struct GptModelState;  // gpt_model_state.hpp

template <typename Scalar>
class GptModel {
 public:
  // Validates config; parameters zeroed. The first form runs on a CpuDevice of its own, the
  // second on `device`, which must outlive the model. Scalar is the element type of the
  // parameters, gradients and activations (fp32, or fp64 for gradient checks); with
  // config.mixed_precision (GptModel<float> on a CUDA device) the ops read a bf16 or fp16
  // working copy of the parameters and keep activations of that type, the parameters and
  // gradients staying fp32.
  explicit GptModel(const GptConfig& config);
  GptModel(const GptConfig& config, Device& device);
  // One rank of a tensor-parallel group (tensor_parallel_region.hpp): the model holds this
  // rank's shards (parameter_layout.hpp) and computes with the group's collectives; the group,
  // like the device, must outlive the model. A group of one is the whole model.
  // sequence_parallel (Megatron's --sequence-parallel; no effect with a group of one) shards the
  // residual stream over the group too; the sequence length must then be divisible by the
  // group's size.
  GptModel(const GptConfig& config, Device& device, Communicator& tensor_parallel,
           bool sequence_parallel = false);
  // Any model-parallel layout: the stage's tensors (pipeline_stage.hpp) of the rank's shards.
  GptModel(const GptConfig& config, Device& device, const ModelParallelism& parallelism);
  ~GptModel();
  GptModel(GptModel&&) noexcept;
  GptModel& operator=(GptModel&&) noexcept;

  const GptConfig& config() const;
  // The tensors of this rank's layout (its shards under tensor parallelism).
  const std::vector<ParameterTensor>& tensors() const;
  Communicator& tensor_parallel_group() const;
  Communicator& pipeline_parallel_group() const;
  // The group a tied word embedding's two gradients are summed over (finalize_gradients) where
  // its two uses sit on two pipeline stages, else nullptr.
  const Communicator* embedding_group() const;
  // ZeRO-3: whether the parameters and gradients are sharded over the data-parallel group. Then
  // the flat buffers below (parameter_buffer(), gradient_buffer(), parameters(), the host
  // copies) hold this rank's range of the layout, parameter_shard_range(), whose gradients
  // arrive summed over the group by the end of backward(); tensors() is the whole layout.
  bool sharded_over_data_parallel() const;
  // The group a ZeRO-3 model is sharded over (its gathers and gradient sums), else nullptr.
  const Communicator* sharded_data_parallel_group() const;
  ShardRange parameter_shard_range() const;  // the whole buffer when not sharded
  // After parameter_buffer() was written in place (an optimizer step): a sharded model gathers
  // the new values when it next uses them, and a mixed-precision model rewrites its working copy
  // before the next forward, unless `working_copy_written` says the optimizer wrote
  // working_copy_buffer() from the same values (in its pass: AdamW::step's `weights`).
  void parameters_updated(bool working_copy_written = false);
  // The bf16 or fp16 working copy of parameter_buffer(), element for element, which the forward
  // reads under mixed precision (GptConfig::mixed_precision); empty in fp32 and under ZeRO-3.
  View working_copy_buffer() const;
  // Megatron's --overlap-grad-reduce: during backward() / backward_chunk(), `callback` is told
  // each unit's range of the flat gradient buffer (the embedding, a transformer layer, the head)
  // as soon as the unit's gradients of that micro batch are complete, in the order the backward
  // completes them, so their reduction can start while the rest of the backward runs. An empty
  // function (the default) tells nothing. Not with ZeRO-3 (whose units reduce themselves).
  void set_gradients_ready(std::function<void(BufferRange)> callback);
  // The units' ranges of the flat buffers (the embedding, each transformer layer, the head), in
  // the order the forward first uses them.
  std::vector<BufferRange> parameter_units() const;
  // Megatron's --overlap-param-gather, after parameters_updated(): the ranges of
  // parameter_buffer() still arriving (started all-gathers of the distributed optimizer's
  // shards, each a run of whole units). The forward waits for each unit's range before its
  // first use of it (and then makes that unit's part of the working copy); parameter_buffer(),
  // parameters() and the host copies wait for all first. Not with ZeRO-3.
  void parameters_arriving(std::vector<ArrivingParameters> arrivals);
  // --overlap-param-gather under captured steps (parameter_store.hpp), whose graphs join what
  // they start: after parameters_updated(), the rest of parameter_buffer() is owed, gathered by
  // the next captured step's start_parameter_gathers or, for any other use before it, at once
  // through `group` (a collective, which every rank of it must reach alike); a step's start,
  // whatever preceded it; and after a replayed step, what its graph did: every parameter
  // arrived and the working copy made.
  void parameters_owed(Communicator& group, ParameterGathers gathers);
  void start_parameter_gathers(Communicator& group, const ParameterGathers& gathers);
  void parameters_arrived();
  // After a failed capture: the gathers it started dropped unwaited.
  void abandon_parameter_gathers();
  // Every parameter in place: the arriving ones waited for, owed ones gathered (a collective of
  // their group then: every rank of it calls this alike).
  void finish_parameter_gathers();
  // The ranges of the flat gradient buffer that count towards the global gradient norm on this
  // rank (parameter_layout.hpp's gradient_norm_ranges), computed once.
  const std::vector<BufferRange>& gradient_norm_ranges() const;
  const ParameterTensor& tensor(const std::string& name) const;  // common::Error if unknown
  // The flat buffers in place: only for a model on host memory (the CPU device); on a GPU
  // they are common::Error, and the copies below are the way in and out.
  std::span<Scalar> parameters();
  std::span<const Scalar> parameters() const;
  std::span<Scalar> gradients();
  std::span<const Scalar> gradients() const;
  // The flat buffers as views on the model's device, on any device: what the optimizer (and
  // the data-parallel reduction) works on in place.
  View parameter_buffer() const;
  View gradient_buffer() const;
  Device& device() const;
  // Copies of the whole flat buffers (tensors()' layout) between the device and the host, on
  // any device; `host` holds exactly as many elements as the model has parameters.
  void copy_parameters_from_host(std::span<const Scalar> host);
  void copy_parameters_to_host(std::span<Scalar> host) const;
  void copy_gradients_to_host(std::span<Scalar> host) const;

  // Megatron's initialisation: weights (output_layer's too) ~ N(0, init_method_std), the
  // output projections (linear_proj, linear_fc2) ~ N(0, init_method_std / sqrt(2 ·
  // num_layers)), biases 0, norm weights 1. Deterministic given the seed, independent of thread
  // count and device (on a GPU the values are made on the host and copied).
  void init_parameters(uint64_t seed);

  // Carves the activations of micro batches of (batch_size, seq_length) and the backward's
  // scratch (activation_plan.hpp), so that no forward or backward of that shape allocates:
  // `micro_batch_slots` micro batches' kept buffers (those a pipeline schedule holds in flight)
  // and one shared scratch. forward() calls it when the shape changes; the trainer calls it at
  // setup.
  void reserve(int64_t batch_size, int64_t seq_length, int64_t micro_batch_slots = 1);
  int64_t micro_batch_slots() const;

  // One micro batch through the whole model (no pipeline parallelism). tokens and labels are
  // (B, T) row-major with values in [0, vocab_size), labels also kIgnoredLabel;
  // 1 ≤ T ≤ max_position_embeddings. Returns the mean cross-entropy over the positions whose
  // label is not ignored (0 when every one is).
  // Given the scale of the backward that will follow (training: the trainer knows it before the
  // forward), the head computes the loss and the logits' gradient in one pass (the fused
  // classifier), writing it over the logits: the backward must then be given the same scale
  // (common::Error otherwise; it may be repeated), and the logits can no longer be read
  // (last_position_argmax and last_position_logits refuse). The gradients are the same bits as
  // without it on the CPU.
  Scalar forward(std::span<const int32_t> tokens, std::span<const int32_t> labels,
                 int64_t batch_size, int64_t seq_length,
                 std::optional<Scalar> backward_scale = std::nullopt);

  // forward() in two parts, for a captured training step (docs/step_on_device.md, item 5):
  // stage_micro_batch uploads micro batch `index` of the step (its ids checked as forward()
  // checks them, the shape reserved as forward() reserves it) into memory of its own, outside
  // the capture, with what its forward reads as values that change from step to step: the
  // dropout keys of the index-th forward from now (at the dropout step index ×
  // `dropout_step_stride` after the current one: data-parallel ranks take turns, so each rank's
  // forwards are D steps apart), the scored count and the fused classifier's scale for
  // `backward_scale`. forward_staged(index, backward_scale) copies the ids into the
  // activations on the device and runs the forward reading those values from the staged
  // memory, which a capture can hold (the same work and bits as forward() after the copy); it
  // refuses a micro batch staged for another dropout step, mode or backward scale. forward_staged
  // runs a whole model; a pipeline stage's staged micro batches run through
  // forward_chunk_staged. stage_micro_batch returns the labels' scored positions.
  int64_t stage_micro_batch(int64_t index, std::span<const int32_t> tokens,
                            std::span<const int32_t> labels, int64_t batch_size, int64_t seq_length,
                            std::optional<Scalar> backward_scale = std::nullopt,
                            uint64_t dropout_step_stride = 1);
  Scalar forward_staged(int64_t index, std::optional<Scalar> backward_scale = std::nullopt);
  // Changes whenever the activations (and staged inputs) move to new memory (reserve of another
  // shape): a captured step is replayed only over the generation it was captured on.
  int64_t activations_generation() const;

  // The last forward()'s per-position results, copied to the host on any device, for evaluation
  // tools (eval/zero_shot_tasks.hpp, whose metrics need each position, not the mean): the
  // cross-entropy loss of each of the B·T positions (row-major, the values whose mean forward()
  // returned), and the index of each position's largest logit over the padded vocabulary (the
  // lowest index among equal maxima, as torch.argmax; Megatron's LAMBADA accuracy takes the
  // argmax over the gathered, padded vocabulary too). A whole model only (no tensor or pipeline
  // parallelism), after a forward(): common::Error otherwise.
  std::vector<Scalar> last_position_losses() const;
  std::vector<int32_t> last_position_argmax() const;
  // The last forward()'s logits at one position (batch row `row`, position `position` of its
  // sequence) over the padded vocabulary, copied to the host on any device: what text
  // generation samples the next token from (serve/generation.hpp). The entries beyond
  // config().vocab_size are the padding rows' logits; the caller masks them. Same conditions as
  // the two above; a row or position outside the last forward's shape is common::Error.
  std::vector<Scalar> last_position_logits(int64_t row, int64_t position) const;

  // Training's losses kept on the device (issue 39, item 4): while `total` is set (one f64 of
  // the model's device), each forward that computes the loss (forward(), the last virtual
  // stage's forward_chunk) adds its micro batch's mean to it, times its scored positions when
  // `weighted_by_scored_positions` (--calculate-per-token-loss; ops::accumulate_loss: the sums
  // the host formed from the returned means, the same bits), and returns 0: the host reads
  // nothing back. An empty total (the default) returns the mean again.
  struct LossAccumulation {
    View total;
    bool weighted_by_scored_positions = false;
  };
  void set_loss_accumulation(LossAccumulation accumulation);

  // Backward of the last forward: gradients += grad_scale · d(mean loss)/d(parameters) (the
  // mean forward() returned: ignored positions contribute nothing).
  // It uses the last forward's dropout masks, whatever set_training, set_dropout_seed or
  // set_dropout_step did since.
  void backward(Scalar grad_scale);

  void zero_gradients();

  // Pipeline parallelism: one model chunk of the micro batch in slot `slot` (of the reserved
  // shape), as a pipeline schedule (train/pipeline_schedule.hpp) runs them. The first virtual
  // stage (stage 0, chunk 0) embeds `tokens`; any other reads chunk_input(slot, chunk), where
  // the previous virtual stage's chunk_output arrived. The last virtual stage computes the loss
  // from `labels` and returns the mean (0 elsewhere); the spans a chunk does not use may be
  // empty. Dropout uses the current dropout step, which forward_chunk does not advance (the
  // schedule sets it per micro batch). backward_chunk(slot, chunk) is that forward's backward:
  // from the loss, or from the output gradient received into chunk_output_gradient(slot,
  // chunk); off the first virtual stage it leaves the input's gradient in chunk_input(slot,
  // chunk), for the previous virtual stage. Parameter gradients accumulate (+=).
  const PipelineStage& pipeline_stage() const;
  int64_t num_chunks() const;
  // backward_scale on the last virtual stage: the fused classifier, as forward()'s.
  Scalar forward_chunk(int64_t slot, int64_t chunk, std::span<const int32_t> tokens,
                       std::span<const int32_t> labels,
                       std::optional<Scalar> backward_scale = std::nullopt);
  // forward_chunk of micro batch `index` as stage_micro_batch staged it (a pipeline stage may
  // stage too), for a captured step: its chunk 0 forward copies the staged ids into the slot and
  // points the slot at the staged dropout keys, count and classifier scale (refused when staged
  // for another dropout step or backward scale, as forward_staged); its later chunks find them
  // in the slot. `backward_scale` is the micro batch's (the fused classifier's on the last
  // virtual stage).
  Scalar forward_chunk_staged(int64_t slot, int64_t chunk, int64_t index, Scalar backward_scale);
  void backward_chunk(int64_t slot, int64_t chunk, Scalar grad_scale);
  View chunk_input(int64_t slot, int64_t chunk) const;
  View chunk_output(int64_t slot, int64_t chunk) const;
  View chunk_output_gradient(int64_t slot, int64_t chunk) const;

  // After the backwards of a step's micro batches, before the gradients are read: the sums over
  // the tensor-parallel group that parameters computed from each rank's own rows need (the
  // norms' weights under sequence parallelism), and the sum of a tied word embedding's two
  // gradients over the embedding group (first and last pipeline stage); Megatron's
  // finalize_model_grads. Nothing to do otherwise. Every rank of the groups calls it.
  void finalize_gradients();
  // The same sums where the distributed optimizer's buckets were reduce-scattered during the
  // backward (--overlap-grad-reduce): on the parts of the tensors inside `range` of the flat
  // buffer, which `held` holds (this rank's shard of the data-parallel sums). Sums over the
  // tensor-parallel and data-parallel groups commute, and the tensor-parallel ranks of one
  // data-parallel rank hold the same range of equally laid-out buffers, so they sum the same
  // parts. Refused for a tied embedding split over pipeline stages (its two tensors sit at
  // different offsets on the two stages): that sum needs the whole buffer.
  void finalize_gradients(View held, ShardRange range);

  // Bytes of the activations the last forward keeps for the backward: what each layer
  // stores, the recompute working space (one chunk's layers, or one layer's attention
  // log-sum-exp), the embedding, final norm, logits and losses. Backward scratch is not
  // counted. Activation recompute (GptConfig::recompute_*) lowers it; 0 before the first
  // reserve() or forward.
  int64_t activation_bytes() const;

  // Training mode (the default) applies dropout; evaluation mode (false) turns it off, as
  // torch's train() / eval(). Validation and test passes run in evaluation mode.
  void set_training(bool training);

  // The masks of a forward are keyed by (dropout seed, dropout step). The seed defaults to 0.
  void set_dropout_seed(uint64_t seed);
  uint64_t dropout_seed() const;
  // The step the next forward uses; every forward in training mode advances it by one (one
  // per micro batch), evaluation forwards leave it. With the parameters and optimizer state
  // it is the RNG state a checkpoint must save (and set_dropout_step restore) for a resumed
  // run to draw the same masks as an uninterrupted one, bit for bit.
  uint64_t dropout_step() const;
  void set_dropout_step(uint64_t step);

 private:
  using State = GptModelState<Scalar>;
  std::unique_ptr<State> state_;
};

extern template class GptModel<float>;
extern template class GptModel<double>;

}  // namespace backend
