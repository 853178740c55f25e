// One training iteration, Megatron-LM's train_step (megatron/training/training.py), on one
// process:
//   zero the gradients
//   forward_backward: for each micro batch of the global batch, forward and
//                     backward(1 / num_micro_batches), accumulating the gradients
//                     (Megatron's forward_backward_no_pipelining); loss = mean over them.
//                     --calculate-per-token-loss: backward of each micro batch's token-loss
//                     sum, the summed gradients divided by the global batch's scored tokens,
//                     loss = the token losses' sum over that count (Megatron core's
//                     finalize_model_grads with num_tokens)
//   with a loss scaler (--fp16; optimizer.loss_scaler()): the backward is scaled by the loss
//           scale, the gradients are unscaled, found_inf = norm not finite updates the scaler,
//           skipped = found_inf (Megatron's MixedPrecisionOptimizer.step)
//   norm    = global L2 norm of the gradients (before clipping)
//   skipped = loss or norm not finite (without a scaler)
//   unless skipped: clip to --clip-grad, AdamW step at the scheduler's rate and weight decay,
//                   scheduler step by the global batch size
// Data parallelism: the gradient all-reduce comes after forward_backward, before the norm.
// Later parallelism has its place between these: a pipeline schedule replaces forward_backward.
// Where it runs (issue 39, item 4): the losses, the norm, the clipping factor and the skip
// decision stay on the model's device (ops/step_scalars.hpp; the forwards add their losses to a
// total there, the update reads the decision there and skips itself), and the host reads them
// through a queued copy once the step is queued: the device never waits for the host within a
// step, and the trainer queues the next step's forward and backward before it waits for that
// copy (QueuedStep below). The host then applies what only it holds: the loss scaler's update,
// the scheduler's step and the optimizer's step count (taken back when the device skipped).
// --log-num-zeros-in-grad reads the decision before the update (the zeros are counted after
// clipping).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "backend/device/device.hpp"
#include "backend/device/pinned_upload_ring.hpp"
#include "backend/dist/communicator.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/batch_source.hpp"

namespace backend {

// One iteration's samples: first_sample .. first_sample + global_batch_size − 1 of the training
// split, read as num_micro_batches micro batches of --micro-batch-size. During
// --rampup-batch-size both sizes come from the schedule at the consumed samples.
struct GlobalBatch {
  int64_t first_sample = 0;
  int64_t global_batch_size = 0;
  int64_t num_micro_batches = 0;
};

// What a step reads of the flags (trainer.hpp's train_step_options makes it from the arguments).
struct TrainStepOptions {
  int64_t micro_batch_size = 0;           // --micro-batch-size
  int64_t seq_length = 0;                 // --seq-length
  bool calculate_per_token_loss = false;  // --calculate-per-token-loss
  double clip_grad = 1.0;                 // --clip-grad
  bool overlap_grad_reduce = false;       // --overlap-grad-reduce
  bool overlap_param_gather = false;      // --overlap-param-gather (distributed optimizer)
  // The interleaved pipeline schedule's transfers overlapped with its computes
  // (ParallelismArguments::overlap_p2p_communication)
  bool overlap_p2p_communication = false;
  int64_t ddp_bucket_size = 0;            // --ddp-bucket-size; 0: Megatron's default
  bool log_params_norm = false;           // --log-params-norm
  bool log_num_zeros_in_grad = false;     // --log-num-zeros-in-grad
};

struct TrainStepResult {
  double lm_loss = 0;        // mean over the micro batches
  double grad_norm = 0;      // before clipping
  double learning_rate = 0;  // the rate the update used (or would have used, when skipped)
  bool skipped = false;      // no update: parameters, optimizer and scheduler are unchanged
  bool nan = false;          // the loss was not finite (without a scaler: or the norm)
  double loss_scale = 1.0;   // the optimizer's loss scale after this step's update
  std::optional<double> params_norm{};  // --log-params-norm: after the update
  // --log-num-zeros-in-grad: the zeros of the (unscaled, clipped) gradients; none when skipped
  std::optional<double> num_zeros_in_grad{};
  // --overlap-grad-reduce: the buckets whose reductions started during the backward (0: the
  // reduction ran after it)
  int64_t gradient_buckets = 0;
};

// --use-distributed-optimizer (Megatron's DistributedOptimizer, ZeRO-1): this rank's range of
// the flat buffers (shard_range over the data-parallel group) and a buffer of that many fp32
// gradients on the model's device. The optimizer then holds the moments of the range only.
struct GradientShard {
  ShardRange range;
  View gradients;
};

// The gradients a step updates from, reduced over the data-parallel group the way the layout
// keeps them: all of them, or this rank's shard (distributed optimizer); ZeRO-3's already summed.
struct StepGradients {
  View held;                         // all, or this rank's shard of it
  ShardRange range;                  // held's place in the flat buffer
  bool data_parallel_share = false;  // held is this rank's share of the group's (ZeRO-1 or ZeRO-3)
};

// How a queued step ran its device work (--cuda-graph-impl local; StepGraphs below): one by one
// (eager, with the reason when graphs were asked for), captured into graphs at this step (and
// then replayed once), or replayed from the graphs of an earlier step.
enum class StepExecution { eager, captured, replayed };

// --cuda-graph-impl local (docs/step_on_device.md, item 5): a step's forward, backward, norm and
// decision (queue_gradients' device work) and its update (queue_update's) captured into two
// graphs once per shape and replayed every step after; the inputs (GptModel::stage_micro_batch:
// the ids, and what the ops read that changes from step to step: dropout keys, scored counts,
// the classifier's scales) and AdamW's coefficients (AdamW::stage_step) are uploaded before each
// replay, the scalars read after it as before. Two graphs, so that the rate staged for step k+1's
// update is the one after step k's finish (a skipped step does not move the schedule) while step
// k+1's gradients may be queued before it. The first `warmup_steps` steps of a shape run eagerly
// through the same staged path (they build the GEMM and attention plans and grow the workspaces,
// which a capture cannot hold). A step a graph cannot hold runs eagerly, its reason in the
// QueuedStep: `unavailable` (the trainer's, for the whole run) or a layout or option graphs do not
// cover yet. A capture that fails (the device refused a call, the driver invalidated it) leaves
// graphs off for that shape, with the error as the reason.
struct StepGraphs {
  int64_t warmup_steps = 3;  // --cuda-graph-warmup-steps
  std::string unavailable;   // nonempty: never capture, this is why
  // The shape the graphs hold, with the activations' generation they were captured over.
  int64_t num_micro_batches = 0;
  int64_t micro_batch_size = 0;
  int64_t seq_length = 0;
  int64_t activations_generation = -1;
  int64_t eager_steps = 0;  // staged steps of this shape run eagerly so far
  std::unique_ptr<DeviceGraph> gradients, update;
  std::string refusal;  // a capture of this shape failed: why
  // --calculate-per-token-loss's factor for the summed gradients (1 / the step's scored
  // positions), staged before each per-token step: one f64 of the device's memory, made at the
  // first and kept by reset (a graph holds its address).
  DeviceMemory gradient_factor_memory;
  PinnedUploadRing gradient_factor_uploads;
  // Forgets the graphs (the next steps warm up and capture again).
  void reset();
};

// A step in three parts, so that the host can queue the next step's forward and backward before
// it reads this one's scalars (docs/step_on_device.md, item 3; trainer.cpp decides when):
//   queue_gradients  zero, forward and backward, the reductions, the loss total, the norm and
//                    the device's decision: queued, nothing read (but for the host's
//                    --calculate-per-token-loss count)
//   queue_update     clip and AdamW at the scheduler's current rate, the parameters back to
//                    every rank, --log-params-norm's total, then a queued copy of the step's
//                    scalars into page-locked memory and a mark after it
//   finish_step      wait for that mark (not for what was queued since), read the scalars and
//                    apply what only the host holds: the loss scaler, the scheduler's step, the
//                    optimizer's step count
// The rate queue_update takes and the loss scale queue_gradients takes are the host's after the
// steps finished so far, so step k+1's queue_gradients may run before step k's finish_step, but
// its queue_update only after it; with a loss scaler (--fp16), whose scale the backward takes,
// they run in order.
struct QueuedStep {
  GlobalBatch batch;
  StepGradients gradients;
  double loss_divisor = 1;
  int64_t gradient_buckets = 0;
  double learning_rate = 0;         // set by queue_update
  bool zeros_counted = false;       // --log-num-zeros-in-grad's count is in the scalars
  bool params_norm_logged = false;  // --log-params-norm's total is in the scalars
  bool update_queued = false;
  DeviceMark scalars_copied;
  // With StepGraphs: whether the inputs were staged (the update then goes through
  // AdamW::stage_step) and how the device work ran; `execution_note` the eager reason, or
  // the captured graph's node count.
  bool staged = false;
  StepExecution execution = StepExecution::eager;
  std::string execution_note;
};

QueuedStep queue_gradients(GptModel<float>& model, AdamW& optimizer, const BatchSource& source,
                           const GlobalBatch& batch, const TrainStepOptions& options,
                           Communicator& data_parallel, const GradientShard* shard = nullptr,
                           StepGraphs* graphs = nullptr);
void queue_update(QueuedStep& step, GptModel<float>& model, AdamW& optimizer,
                  const LearningRateScheduler& scheduler, const TrainStepOptions& options,
                  Communicator& data_parallel, const GradientShard* shard = nullptr,
                  double learning_rate_factor = 1.0, StepGraphs* graphs = nullptr);
TrainStepResult finish_step(QueuedStep& step, GptModel<float>& model, AdamW& optimizer,
                            LearningRateScheduler& scheduler);

// The three in order. With a data-parallel
// group of D ranks, `batch.num_micro_batches` is this rank's (global / (micro × D)), micro batch
// m of rank r reads samples first + (m·D + r)·micro .. + micro (Megatron's
// MegatronPretrainingSampler: each step of D micro batches is cut into the ranks' slices), the
// gradients are summed over the group after the backward (each rank's scaled by 1/(M·D)), and
// the loss is averaged over it: every rank then holds the same gradients, norm and decision.
// A ZeRO-3 model (GptModel::sharded_over_data_parallel) brings its range's gradients already
// summed over the group: each rank unscales, clips and updates that range, and the model gathers
// the new parameters where it uses them. With a `shard`, the gradients are reduce-scattered
// instead: each rank unscales, clips and updates its range (the norm's sum of squares added over
// the group), and the parameters are all-gathered back.
TrainStepResult train_step(GptModel<float>& model, AdamW& optimizer,
                           LearningRateScheduler& scheduler, const BatchSource& source,
                           const GlobalBatch& batch, const TrainStepOptions& options,
                           Communicator& data_parallel, const GradientShard* shard = nullptr,
                           double learning_rate_factor = 1.0);
// `learning_rate_factor` multiplies the scheduler's rate for the update (--spike-lr-factor after
// rollbacks, trainer.cpp); the scheduler itself, and so its checkpointed state, is unchanged.
// One process: a data-parallel group of one.
TrainStepResult train_step(GptModel<float>& model, AdamW& optimizer,
                           LearningRateScheduler& scheduler, const BatchSource& source,
                           const GlobalBatch& batch, const TrainStepOptions& options);

}  // namespace backend
