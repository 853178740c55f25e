// Megatron's train_step on one process; see train_step.hpp.
#include "backend/train/train_step.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"
#include "backend/dist/captured_collectives.hpp"
#include "backend/ops/reduction.hpp"
#include "backend/ops/step_scalars.hpp"
#include "backend/train/buffer_buckets.hpp"
#include "backend/train/pipeline_execution.hpp"

namespace backend {

namespace {

// A sum over every element of the model once of `measure` (an op writing one f64 of the device
// from a view), into `total` (one f64 of the device), from `values` (this rank's `held` range of
// the flat buffer, on the device): the whole buffer with neither tensor nor pipeline
// parallelism; otherwise the tensors every tensor-parallel rank holds whole on its rank 0 only
// (gradient_norm_ranges), the shards everywhere, a tied embedding's copy on the last stage
// nowhere, each range's into `partial` and added in order, then added over the tensor- and
// pipeline-parallel groups, and over the data-parallel group when `held` is a data-parallel
// shard. Megatron's get_grad_norm_fp32, calc_params_l2_norm and count_zeros_fp32 count the same
// elements. Nothing is read back: the host's additions of before, made on the device.
template <typename Measure>
void model_total(const GptModel<float>& model, View values, ShardRange held,
                 bool data_parallel_shard, Communicator& data_parallel, View total, View partial,
                 Measure measure) {
  Device& device = model.device();
  Communicator& tensor_parallel = model.tensor_parallel_group();
  Communicator& pipeline = model.pipeline_parallel_group();
  if (tensor_parallel.size() == 1 && pipeline.size() == 1) {
    measure(total, values);
  } else {
    device.fill_zero(total);
    for (const BufferRange& range : model.gradient_norm_ranges()) {
      const int64_t begin = std::max(range.offset, held.offset);
      const int64_t end = std::min(range.offset + range.numel, held.offset + held.numel);
      if (begin >= end) continue;
      measure(partial, values.slice(begin - held.offset, end - begin));
      ops::add(device, total, partial);
    }
  }
  for (Communicator* group :
       {data_parallel_shard ? &data_parallel : nullptr, &tensor_parallel, &pipeline}) {
    if (group != nullptr && group->size() > 1) group->all_reduce(total, ReduceOperation::sum);
  }
}

// The sum of squares of the model's `values` (gradients or parameters) into `total`.
void model_sum_of_squares(const GptModel<float>& model, View values, ShardRange held,
                          bool data_parallel_shard, Communicator& data_parallel,
                          const AdamW::StepScalars& scalars, View total) {
  model_total(model, values, held, data_parallel_shard, data_parallel, total, scalars.partial,
              [&](View out, View part) { ops::sum_of_squares(model.device(), out, part); });
}

// --log-params-norm: Megatron's calc_params_l2_norm after the step, into the logged total: the
// fp32 master weights here (the model's parameters), every rank's whole copy, or a ZeRO-3
// rank's range summed over the group.
void queue_params_sum_of_squares(const GptModel<float>& model, Communicator& data_parallel,
                                 const AdamW::StepScalars& scalars) {
  const View parameters = model.parameter_buffer();
  model_sum_of_squares(model, parameters, ShardRange{0, parameters.numel},
                       model.sharded_over_data_parallel(), data_parallel, scalars,
                       scalars.logged_total);
}

// The step's scalars as the host reads them, in one copy, once the step is queued.
struct StepScalarValues {
  double loss_total = 0;
  double sum_of_squares = 0;
  double logged_total = 0;
  bool skip = false;
  double zeros_in_grad = 0;
};

// The seven doubles of AdamW::StepScalars::all as copied to the host.
StepScalarValues step_scalar_values(const double* values) {
  return {.loss_total = values[0],
          .sum_of_squares = values[1],
          .logged_total = values[2],
          .skip = values[5] != 0.0,
          .zeros_in_grad = values[6]};
}

// The step's decision on the device, the eager and the staged step's alike: the global norm,
// reduced there (of the whole buffer, or the shards' sums of squares added over the group), then
// ops::decide_step, which every rank makes alike from the same totals (with a loss scaler,
// Megatron's found_inf: any non-finite gradient makes the norm so; without one a non-finite
// loss skips too, the update it would have made dropped whole). Then --log-num-zeros-in-grad
// (Megatron's count_zeros_fp32, after clipping): the gradients' elements that are zero once
// multiplied by the decision's clipping factor, in AdamW's precision, so that a gradient the
// factor underflows counts, each element of the model once whatever the layout; into the step's
// scalars, read with them.
void queue_decision(GptModel<float>& model, const StepGradients& gradients,
                    Communicator& data_parallel, const AdamW::StepScalars& scalars,
                    const TrainStepOptions& options, bool loss_scaler) {
  Device& device = model.device();
  model_sum_of_squares(model, gradients.held, gradients.range, gradients.data_parallel_share,
                       data_parallel, scalars, scalars.sum_of_squares);
  ops::decide_step(device, scalars.control, loss_scaler ? View{} : scalars.loss_total,
                   scalars.sum_of_squares, options.clip_grad);
  if (!options.log_num_zeros_in_grad) return;
  const View clipping_factor = scalars.control.slice(0, 1);
  model_total(model, gradients.held, gradients.range, gradients.data_parallel_share, data_parallel,
              scalars.zeros_in_grad, scalars.partial,
              [&](View out, View part) { ops::count_zeros(device, out, part, clipping_factor); });
}

// What the host knows of this rank's losses of a step (their sum is on the device: the model adds
// each micro batch's mean, Megatron's default, or with --calculate-per-token-loss its token
// losses' sum, to the step's loss total): with --calculate-per-token-loss how many token losses
// there were (labels not kIgnoredLabel; on a pipeline, the last stage's).
struct LocalLosses {
  int64_t scored_positions = 0;
  int64_t gradient_buckets = 0;  // --overlap-grad-reduce's buckets started (0: not overlapped)
};

// Where micro batch m of this rank reads its samples and which dropout masks it meets: keyed by
// its place in the global batch (m·D + r), not by this rank's count, so that each sample meets
// the mask it would meet on one process and data parallelism changes the order of sums only,
// dropout or not.
struct MicroBatchPlace {
  const GlobalBatch& batch;
  int64_t micro_batch_size;
  int64_t dp_rank;
  int64_t dp_size;
  uint64_t first_dropout_step;

  int64_t first_sample(int64_t m) const {
    return batch.first_sample + (m * dp_size + dp_rank) * micro_batch_size;
  }
  uint64_t dropout_step(int64_t m) const {
    return first_dropout_step + static_cast<uint64_t>(m) * static_cast<uint64_t>(dp_size) +
           static_cast<uint64_t>(dp_rank);
  }
  uint64_t after_last_dropout_step() const {
    return first_dropout_step +
           static_cast<uint64_t>(batch.num_micro_batches) * static_cast<uint64_t>(dp_size);
  }
};

// The distributed optimizer's share of a bucket of the flat buffer: each member's count is the
// part of the bucket inside its shard_range of the whole buffer (`numel` elements). (Megatron
// shards each bucket evenly over the ranks instead; here the shards are the whole buffer's
// ranges, so a bucket's parts are uneven, and many are empty.)
std::vector<int64_t> bucket_counts(int64_t numel, const Communicator& group, BufferRange bucket) {
  const int64_t bucket_end = bucket.offset + bucket.numel;
  std::vector<int64_t> counts(static_cast<size_t>(group.size()));
  for (int64_t r = 0; r < group.size(); ++r) {
    const ShardRange range = shard_range(numel, group.size(), r);
    counts[static_cast<size_t>(r)] =
        std::max<int64_t>(0, std::min(bucket_end, range.offset + range.numel) -
                                 std::max(bucket.offset, range.offset));
  }
  return counts;
}

// Where this rank's part of a bucket starts in its shard (0 when it has none).
int64_t part_in_shard(BufferRange bucket, ShardRange shard, int64_t own) {
  return own > 0 ? std::max(bucket.offset, shard.offset) - shard.offset : 0;
}

// A bucket's gradients summed into the shards, this rank's part landing at its place in the
// shard's gradients.
std::unique_ptr<Communicator::PendingCollective> start_bucket_reduce_scatter(
    Communicator& group, View all_gradients, BufferRange bucket, const GradientShard& shard) {
  const std::vector<int64_t> counts = bucket_counts(all_gradients.numel, group, bucket);
  const int64_t own = counts[static_cast<size_t>(group.rank())];
  return group.start_reduce_scatter(
      shard.gradients.slice(part_in_shard(bucket, shard.range, own), own),
      all_gradients.slice(bucket.offset, bucket.numel), counts);
}

// --overlap-param-gather: the updated shards back to every rank in buckets of whole units, in
// the forward's order (the embedding's bucket first), each rank's part gathered in place from
// its own range of the parameters.
ParameterGathers parameter_gathers(const GptModel<float>& model, ShardRange shard,
                                   int64_t bucket_size) {
  return [units = model.parameter_units(), shard, bucket_size](Communicator& group,
                                                               View parameters) {
    std::vector<ArrivingParameters> arrivals;
    BufferBuckets buckets(bucket_size, [&](BufferRange bucket) {
      const std::vector<int64_t> counts = bucket_counts(parameters.numel, group, bucket);
      const int64_t own = counts[static_cast<size_t>(group.rank())];
      const View part = parameters.slice(shard.offset + part_in_shard(bucket, shard, own), own);
      arrivals.push_back(
          {bucket,
           group.start_all_gather(parameters.slice(bucket.offset, bucket.numel), part, counts)});
    });
    for (const BufferRange& unit : units) buckets.add(unit);
    buckets.flush();
    return arrivals;
  };
}

int64_t bucket_size_of(const TrainStepOptions& options, const Communicator& group) {
  return options.ddp_bucket_size > 0 ? options.ddp_bucket_size
                                     : default_ddp_bucket_size(group.size());
}

// Whether the distributed optimizer's updated shards come back in --overlap-param-gather's
// buckets rather than in one all-gather.
bool overlapped_parameter_gathers(const TrainStepOptions& options,
                                  const Communicator& data_parallel, const GradientShard* shard) {
  return shard != nullptr && options.overlap_param_gather && data_parallel.size() > 1;
}

// Whether they do so in a captured (staged) step, where the next step's forward starts those
// buckets (a graph joins what it starts, so the update's could not overlap them with anything:
// parameter_store.hpp). With --log-params-norm, whose norm reads every parameter after the
// update, the update's graph gathers them whole instead.
bool staged_parameter_gathers(const TrainStepOptions& options, const Communicator& data_parallel,
                              const GradientShard* shard) {
  return overlapped_parameter_gathers(options, data_parallel, shard) && !options.log_params_norm;
}

// --overlap-grad-reduce's reductions of one step (Megatron's DDP buckets): the units the last
// micro batch's backward finishes (of each chunk, on a pipeline) fill buckets, each started as
// it closes: an all-reduce, or with the distributed optimizer a reduce-scatter into the shards.
// finish() starts the rest, with any unit the backward did not announce (none is expected; one
// left out would never be reduced).
class OverlappedReduction {
 public:
  OverlappedReduction(Communicator& group, View all_gradients, const GradientShard* shard,
                      int64_t bucket_size,
                      std::vector<std::unique_ptr<Communicator::PendingCollective>>& pending)
      : group_(group),
        all_gradients_(all_gradients),
        shard_(shard),
        pending_(pending),
        buckets_(bucket_size, [this](BufferRange bucket) { start(bucket); }) {}
  OverlappedReduction(const OverlappedReduction&) = delete;
  OverlappedReduction& operator=(const OverlappedReduction&) = delete;

  // What the model is told (GptModel::set_gradients_ready); valid while this object lives.
  std::function<void(BufferRange)> ready() {
    return [this](BufferRange unit) {
      announced_.push_back(unit.offset);
      buckets_.add(unit);
    };
  }
  // The buckets started in all.
  int64_t finish(const std::vector<BufferRange>& units) {
    for (const BufferRange& unit : units) {
      if (std::ranges::find(announced_, unit.offset) == announced_.end()) buckets_.add(unit);
    }
    buckets_.flush();
    return buckets_.started();
  }

 private:
  void start(BufferRange bucket) {
    pending_.push_back(
        shard_ != nullptr
            ? start_bucket_reduce_scatter(group_, all_gradients_, bucket, *shard_)
            : group_.start_all_reduce(all_gradients_.slice(bucket.offset, bucket.numel),
                                      ReduceOperation::sum));
  }

  Communicator& group_;
  View all_gradients_;
  const GradientShard* shard_;
  std::vector<std::unique_ptr<Communicator::PendingCollective>>& pending_;
  BufferBuckets buckets_;
  std::vector<int64_t> announced_;  // the units' offsets
};

// A pipeline stage's share: the schedule runs the same micro batches with the same masks and
// scale; the loss sum is the last stage's, and so are the scored positions (the stages that
// read labels count them; the others keep 0).
LocalLosses pipeline_forward_backward(GptModel<float>& model, const BatchSource& source,
                                      const MicroBatchPlace& place, const TrainStepOptions& options,
                                      float backward_scale, OverlappedReduction* overlapped) {
  const PipelineStage& stage = model.pipeline_stage();
  const bool per_token = options.calculate_per_token_loss;
  const int64_t count = place.batch.num_micro_batches;
  std::vector<int64_t> scored(static_cast<size_t>(count), 0);
  PipelineMicroBatches inputs{
      .count = count,
      .read =
          [&](int64_t m, std::span<int32_t> micro_tokens, std::span<int32_t> micro_labels) {
            source(Split::train, place.first_sample(m), options.micro_batch_size, micro_tokens,
                   micro_labels);
            if (per_token) scored[static_cast<size_t>(m)] = scored_label_count(micro_labels);
          },
      .dropout_step = [&](int64_t m) { return place.dropout_step(m); },
      .loss_weight = {}};
  if (per_token) {
    inputs.loss_weight = [&](int64_t m) {
      return static_cast<double>(scored[static_cast<size_t>(m)]);
    };
  }
  if (overlapped != nullptr) inputs.last_gradients_ready = overlapped->ready();
  LocalLosses local;
  run_pipeline_steps(model,
                     pipeline_schedule(stage.pipeline_parallel, stage.rank, stage.virtual_chunks,
                                       count, options.overlap_p2p_communication),
                     inputs, backward_scale, options.micro_batch_size, options.seq_length);
  if (stage.last()) {
    for (const int64_t positions : scored) local.scored_positions += positions;
  }
  return local;
}

// A micro batch's backward; given `overlapped` (--overlap-grad-reduce, the step's last micro
// batch) each bucket's reduction starts as soon as the backward has finished its units (the
// earlier micro batches only accumulate, as under Megatron's no_sync).
void backward_of_micro_batch(GptModel<float>& model, float backward_scale,
                             OverlappedReduction* overlapped) {
  if (overlapped == nullptr) {
    model.backward(backward_scale);
    return;
  }
  model.set_gradients_ready(overlapped->ready());
  model.backward(backward_scale);
  model.set_gradients_ready({});
}

// A micro batch's backward scale: the loss scale (1 without a scaler) over the global batch's
// M·D micro batches (without a scaler exactly 1/(M·D); a power-of-two scale multiplies it
// exactly), or with --calculate-per-token-loss the loss scale times its scored positions (the
// model's backward is of its mean, so scale × count makes it the sum's: exactly, a power of two
// times an integer below 2^24, divided by that integer). The eager and the staged step's one.
float micro_batch_backward_scale(double loss_scale, const TrainStepOptions& options,
                                 int64_t scored_positions, int64_t micro_batches, int64_t dp_size) {
  if (options.calculate_per_token_loss) {
    return static_cast<float>(loss_scale) * static_cast<float>(scored_positions);
  }
  return static_cast<float>(loss_scale) / static_cast<float>(micro_batches * dp_size);
}

// The whole model on this rank: each micro batch's forward and backward in turn.
LocalLosses sequential_forward_backward(GptModel<float>& model, const BatchSource& source,
                                        const MicroBatchPlace& place,
                                        const TrainStepOptions& options, double loss_scale,
                                        OverlappedReduction* overlapped) {
  const int64_t micro_tokens = common::checked_multiply(
      options.micro_batch_size, options.seq_length, "--micro-batch-size × --seq-length");
  std::vector<int32_t> tokens(micro_tokens), labels(micro_tokens);
  const bool per_token = options.calculate_per_token_loss;
  LocalLosses local;
  for (int64_t m = 0; m < place.batch.num_micro_batches; ++m) {
    model.set_dropout_step(place.dropout_step(m));
    source(Split::train, place.first_sample(m), options.micro_batch_size, tokens, labels);
    const int64_t scored = per_token ? scored_label_count(labels) : 0;
    // Known before the forward, which therefore computes the head's gradient too (fused
    // classifier).
    const float backward_scale = micro_batch_backward_scale(
        loss_scale, options, scored, place.batch.num_micro_batches, place.dp_size);
    model.forward(tokens, labels, options.micro_batch_size, options.seq_length, backward_scale);
    local.scored_positions += scored;
    backward_of_micro_batch(model, backward_scale,
                            m + 1 == place.batch.num_micro_batches ? overlapped : nullptr);
  }
  return local;
}

// The model adds its losses to `loss_total` (zeroed here) while this lives: during a step's
// forwards only, even when one throws.
class LossAccumulationScope {
 public:
  LossAccumulationScope(GptModel<float>& model, View loss_total, bool per_token) : model_(model) {
    model.device().fill_zero(loss_total);
    model.set_loss_accumulation({.total = loss_total, .weighted_by_scored_positions = per_token});
  }
  ~LossAccumulationScope() { model_.set_loss_accumulation({}); }
  LossAccumulationScope(const LossAccumulationScope&) = delete;
  LossAccumulationScope& operator=(const LossAccumulationScope&) = delete;

 private:
  GptModel<float>& model_;
};

// This rank's share of the global batch: its micro batches' gradients accumulate, each backward
// scaled by loss_scale / (num_micro_batches · D), or with --calculate-per-token-loss by
// loss_scale × its scored positions (the gradient of the sum of its token losses, which
// train_step divides by the global batch's scored positions once summed, as Megatron's
// finalize_model_grads). The losses add up in `loss_total` on the device (zeroed here).
LocalLosses forward_backward(GptModel<float>& model, const BatchSource& source,
                             const GlobalBatch& batch, double loss_scale,
                             const TrainStepOptions& options, int64_t dp_rank, int64_t dp_size,
                             OverlappedReduction* overlapped, View loss_total) {
  const LossAccumulationScope accumulating(model, loss_total, options.calculate_per_token_loss);
  const MicroBatchPlace place{.batch = batch,
                              .micro_batch_size = options.micro_batch_size,
                              .dp_rank = dp_rank,
                              .dp_size = dp_size,
                              .first_dropout_step = model.dropout_step()};
  LocalLosses local =
      model.pipeline_stage().whole_model()
          ? sequential_forward_backward(model, source, place, options, loss_scale, overlapped)
          : pipeline_forward_backward(
                model, source, place, options,
                // Per token the schedule weighs each micro batch by its count.
                micro_batch_backward_scale(loss_scale, options, 1, batch.num_micro_batches,
                                           dp_size),
                overlapped);
  if (overlapped != nullptr) local.gradient_buckets = overlapped->finish(model.parameter_units());
  model.set_dropout_step(place.after_last_dropout_step());
  return local;
}

// The gradients the update reads once reduce_gradients has run: the whole buffer, this rank's
// distributed-optimizer shard, or a ZeRO-3 model's own range.
StepGradients held_gradients(const GptModel<float>& model, const GradientShard* shard) {
  const View all = model.gradient_buffer();
  const bool sharded = model.sharded_over_data_parallel();
  if (sharded && shard != nullptr) {
    common::fail("train_step: a ZeRO-3 model holds its own shard; no distributed-optimizer "
                 "shard goes with it");
  }
  return {.held = shard != nullptr ? shard->gradients : all,
          .range = shard != nullptr ? shard->range : ShardRange{0, all.numel},
          .data_parallel_share = shard != nullptr || sharded};
}

StepGradients reduce_gradients(GptModel<float>& model, Communicator& data_parallel,
                               const GradientShard* shard, bool overlapped) {
  const View all = model.gradient_buffer();
  const bool sharded = model.sharded_over_data_parallel();
  const StepGradients gradients = held_gradients(model, shard);
  if (sharded) {
    // ZeRO-3: the backward summed each unit's gradients over the group into this rank's range.
  } else if (shard != nullptr) {
    // Megatron's DistributedOptimizer: the sums of this rank's range only (already there when
    // the buckets reduce-scattered them during the backward).
    if (!overlapped) data_parallel.reduce_scatter(gradients.held, all);
  } else if (data_parallel.size() > 1 && !overlapped) {
    // Megatron's DDP: the gradients summed over the group (each already carries 1/D).
    data_parallel.all_reduce(gradients.held, ReduceOperation::sum);
  }
  return gradients;
}

// The step's loss total made every rank's (summed over the data-parallel group, then the last
// pipeline stage's to every stage: Megatron's average_losses_across_data_parallel_group, where
// only the last stage computed it), on the device; what the host divides it by for the log; and
// the factor the summed gradients are multiplied by: the loss scale's inverse, and with
// --calculate-per-token-loss one over the global batch's scored positions.
struct StepLoss {
  double divisor = 1;
  double gradient_factor = 1;
};

// The host's part, from the global batch's scored positions where --calculate-per-token-loss
// counts them (Megatron's finalize_model_grads with num_tokens: they divide the summed
// gradients, and the logged loss is the token losses' sum over the same count; none scored
// divides by nothing), else the mean over the micro batches, averaged over the group. The
// eager and the staged step's one.
StepLoss step_loss(const TrainStepOptions& options, int64_t micro_batches, int64_t dp_size,
                   double inverse_loss_scale, double global_scored_positions) {
  StepLoss loss{.divisor = 1, .gradient_factor = inverse_loss_scale};
  if (!options.calculate_per_token_loss) {
    loss.divisor = static_cast<double>(micro_batches) * static_cast<double>(dp_size);
  } else if (global_scored_positions > 0) {
    loss.divisor = global_scored_positions;
    loss.gradient_factor /= global_scored_positions;
  }
  return loss;
}

StepLoss reduce_loss(const LocalLosses& local, const GlobalBatch& batch,
                     const TrainStepOptions& options, double inverse_loss_scale,
                     Communicator& data_parallel, Communicator& pipeline, View loss_total) {
  if (data_parallel.size() > 1) data_parallel.all_reduce(loss_total, ReduceOperation::sum);
  if (pipeline.size() > 1) pipeline.broadcast(loss_total, pipeline.size() - 1);
  double scored_positions = 0;
  if (options.calculate_per_token_loss) {
    // The last stage's count to every stage, summed over the data-parallel group (a count the
    // host holds, over the host channel).
    scored_positions = static_cast<double>(local.scored_positions);
    if (pipeline.size() > 1) {
      pipeline.broadcast(host_view(std::span(&scored_positions, 1)), pipeline.size() - 1);
    }
    scored_positions = all_reduce_sum(data_parallel, scored_positions);
  }
  return step_loss(options, batch.num_micro_batches, data_parallel.size(), inverse_loss_scale,
                   scored_positions);
}

// What an update writes. The model's parameters are the fp32 master weights. A whole model's
// bf16 or fp16 working copy is written in the same pass; a distributed optimizer's rank updates
// its range only, and the copy is remade from the gathered parameters before the next forward.
struct UpdateTarget {
  View parameters;    // the whole flat buffer
  View updated;       // the range this rank updates
  View working_copy;  // written with it, or empty
};
UpdateTarget update_target(GptModel<float>& model, const GradientShard* shard) {
  const View parameters = model.parameter_buffer();
  if (shard != nullptr) {
    return {parameters, parameters.slice(shard->range.offset, shard->range.numel), View{}};
  }
  return {parameters, parameters, model.working_copy_buffer()};
}

// AdamW over the held range, clipped, and the parameters back to every rank. `control`: the
// device's decision (ops::decide_step), which gives the clipping factor and may skip the update
// there.
void apply_update(GptModel<float>& model, AdamW& optimizer, const LearningRateScheduler& scheduler,
                  const StepGradients& gradients, const TrainStepOptions& options,
                  Communicator& data_parallel, const GradientShard* shard, double learning_rate,
                  View control) {
  const auto [parameters, updated, working_copy] = update_target(model, shard);
  optimizer.step(updated, working_copy, gradients.held, learning_rate, scheduler.weight_decay(),
                 1.0, control);
  // Every rank's range back to every rank (Megatron's parameter all-gather): at once, or with
  // --overlap-param-gather started in buckets that the next forward waits for unit by unit. A
  // ZeRO-3 model gathers each unit when it next uses it. (An update the device skipped gathers
  // the unchanged parameters.)
  std::vector<ArrivingParameters> arrivals;
  if (overlapped_parameter_gathers(options, data_parallel, shard)) {
    arrivals = parameter_gathers(model, shard->range, bucket_size_of(options, data_parallel))(
        data_parallel, parameters);
  } else if (shard != nullptr) {
    data_parallel.all_gather(parameters, updated);
  }
  model.parameters_updated(/*working_copy_written=*/!working_copy.empty());
  if (!arrivals.empty()) model.parameters_arriving(std::move(arrivals));
}

// Whether --overlap-grad-reduce starts the data-parallel reduction during the backward
// (reduction_after_backward says where it cannot).
bool overlapped_gradient_reduction(const TrainStepOptions& options, const GptModel<float>& model,
                                   const Communicator& data_parallel, const GradientShard* shard) {
  const bool tied_embedding_across_stages =
      !model.pipeline_stage().whole_model() && model.config().share_embeddings_and_output_weights;
  return options.overlap_grad_reduce && data_parallel.size() > 1 &&
         !reduction_after_backward(model.sharded_over_data_parallel(), shard != nullptr,
                                   tied_embedding_across_stages);
}

// A step's gradient reduction up to its norm, the overlapped part included: with
// --overlap-grad-reduce (where overlapped_gradient_reduction allows it) the buckets' all-reduces
// or reduce-scatters start during the last micro batch's backward (`during_backward()` goes to
// it); finish() waits for them, makes the model-parallel sums (sequence parallelism's norms: on
// the whole buffer before the data-parallel reduction, or on this rank's shard of it where the
// buckets already reduce-scattered it) and the data-parallel reduction left to do. The eager
// and the staged step share it, so they queue the same collectives in the same order.
class StepGradientReduction {
 public:
  StepGradientReduction(GptModel<float>& model, const TrainStepOptions& options,
                        Communicator& data_parallel, const GradientShard* shard)
      : model_(model),
        data_parallel_(data_parallel),
        shard_(shard),
        overlap_(overlapped_gradient_reduction(options, model, data_parallel, shard)) {
    if (overlap_) {
      overlapped_.emplace(data_parallel, model.gradient_buffer(), shard,
                          bucket_size_of(options, data_parallel), pending_);
    }
  }
  StepGradientReduction(const StepGradientReduction&) = delete;
  StepGradientReduction& operator=(const StepGradientReduction&) = delete;

  OverlappedReduction* during_backward() { return overlapped_ ? &*overlapped_ : nullptr; }

  StepGradients finish() {
    // Every reduction finished before anything reads or adds to the gradients.
    for (const auto& reduction : pending_) reduction->wait();
    if (overlap_ && shard_ != nullptr) {
      model_.finalize_gradients(shard_->gradients, shard_->range);
    } else {
      model_.finalize_gradients();
    }
    return reduce_gradients(model_, data_parallel_, shard_, overlap_);
  }

 private:
  GptModel<float>& model_;
  Communicator& data_parallel_;
  const GradientShard* shard_;
  bool overlap_;
  std::vector<std::unique_ptr<Communicator::PendingCollective>> pending_;
  std::optional<OverlappedReduction> overlapped_;
};

// ---- captured steps (StepGraphs) ----------------------------------------------------------

// Why a model's `group` (one its forward and backward call collectives through) cannot be
// captured, or nothing: it must be the trainer's captured one (made with --cuda-graph-impl),
// whose calls keep a capture's order, else they would run at capture time on the CPU device;
// and its collectives must be ones a capture on the device holds. `layout` and `noun` name it.
std::optional<std::string> model_group_refusal(const Communicator& group, const Device& device,
                                               const char* layout, const char* noun) {
  if (!keeps_capture_order(group)) {
    return fmt::format("{}: the model's {} does not keep a capture's order (the trainer's does)",
                       layout, noun);
  }
  return collectives_capture_refusal(group, device);
}

// Why no step of this layout and these options can be captured yet, or nothing.
std::optional<std::string> graphs_refusal(GptModel<float>& model,
                                          const Communicator& data_parallel) {
  const Device& device = model.device();
  // Tensor parallelism's collectives run inside the forward and backward; a pipeline's
  // schedule transfers, the loss's broadcast from the last stage and the norm's sums through
  // its group, a tied embedding's gradient sum through its embedding group; ZeRO-3's gathers
  // and gradient sums inside the forward and backward, through its sharded group.
  if (const Communicator& tensor_parallel = model.tensor_parallel_group();
      tensor_parallel.size() > 1) {
    if (auto refusal =
            model_group_refusal(tensor_parallel, device, "tensor parallelism", "group")) {
      return refusal;
    }
  }
  if (!model.pipeline_stage().whole_model()) {
    if (auto refusal = model_group_refusal(model.pipeline_parallel_group(), device,
                                           "pipeline parallelism", "group")) {
      return refusal;
    }
    if (const Communicator* embedding = model.embedding_group(); embedding != nullptr) {
      if (auto refusal =
              model_group_refusal(*embedding, device, "a word embedding tied over pipeline stages",
                                  "embedding group")) {
        return refusal;
      }
    }
  }
  if (const Communicator* sharded = model.sharded_data_parallel_group(); sharded != nullptr) {
    if (auto refusal = model_group_refusal(*sharded, device, "ZeRO-3", "group")) return refusal;
  }
  if (data_parallel.size() > 1) {
    if (auto refusal = collectives_capture_refusal(data_parallel, device)) return refusal;
  }
  return std::nullopt;
}

// `work` captured on `device` into a graph, or nullptr with `refusal` saying why the capture
// failed (nothing of it ran; the device is no longer capturing).
template <typename Work>
std::unique_ptr<DeviceGraph> capture(Device& device, Work&& work, std::string& refusal) {
  try {
    device.begin_capture();
    work();
    return device.end_capture();
  } catch (const common::Error& error) {
    device.abandon_capture();
    refusal = error.what();
    return nullptr;
  }
}

// pipeline_forward_backward over staged micro batches: the same schedule, each forward taking
// micro batch m's staged inputs (forward_chunk_staged), its backward at backward_scales[m]
// (the mean's scale, or per token the loss scale times its count: the product
// pipeline_forward_backward forms, staged as it is).
void staged_pipeline_forward_backward(GptModel<float>& model, const MicroBatchPlace& place,
                                      const TrainStepOptions& options,
                                      std::span<const float> backward_scales,
                                      OverlappedReduction* overlapped) {
  const PipelineStage& stage = model.pipeline_stage();
  PipelineMicroBatches inputs{
      .count = std::ssize(backward_scales),
      .read = {},
      .dropout_step = [&](int64_t m) { return place.dropout_step(m); },
      // Each micro batch's scale as its weight over a scale of 1 (the losses add up on the
      // device, by their staged counts, not by this weight).
      .loss_weight =
          [&](int64_t m) { return static_cast<double>(backward_scales[static_cast<size_t>(m)]); },
      .staged = true};
  if (overlapped != nullptr) inputs.last_gradients_ready = overlapped->ready();
  run_pipeline_steps(model,
                     pipeline_schedule(stage.pipeline_parallel, stage.rank, stage.virtual_chunks,
                                       inputs.count, options.overlap_p2p_communication),
                     inputs, 1.0F, options.micro_batch_size, options.seq_length);
}

// The device work of a staged step, which the gradients' graph holds: queue_gradients' (the
// same ops and collectives in the same order, so the same bits) for one rank or data-parallel
// ranks (Megatron's DDP: the gradients all-reduced; the distributed optimizer: reduce-scattered
// into this rank's `shard`; the loss summed over the group), through `data_parallel`, whose
// calls keep the device's order in a capture. Micro
// batch m, at `place`'s dropout step, has the backward scale backward_scales[m] (staged with
// it: the fp16 loss scale and --calculate-per-token-loss's count change from step to step); the
// gradients' factor (the loss scale's inverse, per token over the step's scored positions) is
// read from `gradient_factor` where there is one. With a loss scaler only non-finite gradients
// skip the step, as queue_gradients decides.
void queue_staged_work(GptModel<float>& model, const AdamW::StepScalars& scalars,
                       const MicroBatchPlace& place, std::span<const float> backward_scales,
                       View gradient_factor, bool loss_scaler, const TrainStepOptions& options,
                       Communicator& data_parallel, const GradientShard* shard,
                       int64_t& gradient_buckets) {
  // The parameters the forward reads are made alike whatever preceded a capture (an
  // evaluation's forward may have made them already, and a graph holds only what its capture
  // ran): with the distributed optimizer the update leaves the 16-bit working copy to the
  // forward, and with --overlap-param-gather the rest of the buffer too, whose buckets start
  // here, each unit's first use waiting for its own.
  if (shard != nullptr) {
    if (staged_parameter_gathers(options, data_parallel, shard)) {
      model.start_parameter_gathers(
          data_parallel,
          parameter_gathers(model, shard->range, bucket_size_of(options, data_parallel)));
    } else {
      model.parameters_updated();
    }
  }
  model.zero_gradients();
  // --overlap-grad-reduce: the buckets' reductions start during the last micro batch's
  // backward, as forward_backward starts them (in a GPU capture NCCL's kernels then run beside
  // the backward's in the graph).
  StepGradientReduction reduction(model, options, data_parallel, shard);
  OverlappedReduction* overlapped = reduction.during_backward();
  {
    const LossAccumulationScope accumulating(model, scalars.loss_total,
                                             options.calculate_per_token_loss);
    if (model.pipeline_stage().whole_model()) {
      for (size_t m = 0; m < backward_scales.size(); ++m) {
        model.set_dropout_step(place.dropout_step(static_cast<int64_t>(m)));
        model.forward_staged(static_cast<int64_t>(m), backward_scales[m]);
        backward_of_micro_batch(model, backward_scales[m],
                                m + 1 == backward_scales.size() ? overlapped : nullptr);
      }
    } else {
      staged_pipeline_forward_backward(model, place, options, backward_scales, overlapped);
    }
  }
  // Gathers a forward did not wait for (a unit it did not use) are waited for in the work.
  if (shard != nullptr) model.finish_parameter_gathers();
  if (overlapped) gradient_buckets = overlapped->finish(model.parameter_units());
  const StepGradients gradients = reduction.finish();
  // reduce_loss's device part: summed over the group, then the last stage's to every stage.
  if (data_parallel.size() > 1) data_parallel.all_reduce(scalars.loss_total, ReduceOperation::sum);
  Communicator& pipeline = model.pipeline_parallel_group();
  if (pipeline.size() > 1) pipeline.broadcast(scalars.loss_total, pipeline.size() - 1);
  if (!gradient_factor.empty()) ops::scale(model.device(), gradients.held, 1.0, gradient_factor);
  queue_decision(model, gradients, data_parallel, scalars, options, loss_scaler);
}

// A graph replayed, then handed to the watchdog of the collectives it holds: they were queued
// at capture, where nothing watches them (Communicator::watch_queued_work). One event after the
// replay covers every group's calls in it (the groups share the world's watchdog).
void replay_watched(DeviceGraph& graph, Communicator& data_parallel, const char* what) {
  graph.replay();
  data_parallel.watch_queued_work(what);
}

// queue_gradients under StepGraphs for a layout they cover: the micro batches read and staged,
// then the step's device work replayed, captured (and replayed) or queued eagerly.
QueuedStep queue_staged_gradients(GptModel<float>& model, AdamW& optimizer,
                                  const BatchSource& source, const GlobalBatch& batch,
                                  const TrainStepOptions& options, Communicator& data_parallel,
                                  const GradientShard* shard, StepGraphs& graphs) {
  const int64_t micro_batches = batch.num_micro_batches;
  const MicroBatchPlace place{.batch = batch,
                              .micro_batch_size = options.micro_batch_size,
                              .dp_rank = data_parallel.rank(),
                              .dp_size = data_parallel.size(),
                              .first_dropout_step = model.dropout_step()};
  const int64_t micro_tokens = common::checked_multiply(
      options.micro_batch_size, options.seq_length, "--micro-batch-size × --seq-length");
  std::vector<int32_t> tokens(micro_tokens), labels(micro_tokens);
  // As forward_backward's: the loss scale (1 without a scaler) over M·D, or per token the scale
  // times the micro batch's scored count.
  const LossScaler& scaler = optimizer.loss_scaler();
  const double loss_scale = scaler.scale();
  const bool per_token = options.calculate_per_token_loss;
  std::vector<float> backward_scales(static_cast<size_t>(micro_batches));
  int64_t scored_positions = 0;
  // Each micro batch staged for its forward's dropout step: this rank's m-th, D steps apart.
  model.set_dropout_step(place.dropout_step(0));
  for (int64_t m = 0; m < micro_batches; ++m) {
    source(Split::train, place.first_sample(m), options.micro_batch_size, tokens, labels);
    // Per token the scale is the count, needed before staging (as sequential_forward_backward
    // counts before its forward); otherwise staging's own count serves.
    backward_scales[static_cast<size_t>(m)] =
        micro_batch_backward_scale(loss_scale, options, per_token ? scored_label_count(labels) : 0,
                                   micro_batches, place.dp_size);
    scored_positions += model.stage_micro_batch(
        m, tokens, labels, options.micro_batch_size, options.seq_length,
        backward_scales[static_cast<size_t>(m)], static_cast<uint64_t>(place.dp_size));
  }
  // reduce_loss's gradient factor and divisor: the loss scale's inverse, per token over the
  // step's scored positions (the divisor then; over data-parallel ranks their sum, a host count
  // summed over the host channel before the step's device work, as reduce_loss sums it), the
  // factor in device memory made at the first step that needs one.
  double step_scored_positions = static_cast<double>(scored_positions);
  if (per_token) step_scored_positions = all_reduce_sum(data_parallel, step_scored_positions);
  const StepLoss loss = step_loss(options, micro_batches, data_parallel.size(),
                                  scaler.inverse_scale(), step_scored_positions);
  View gradient_factor;
  if (per_token || scaler.enabled()) {
    Device& device = model.device();
    if (graphs.gradient_factor_memory.data() == nullptr) {
      graphs.gradient_factor_memory =
          device.allocate_zeroed(sizeof(double), "the staged step's gradient factor");
      graphs.gradient_factor_uploads = PinnedUploadRing(
          device, 2, sizeof(double), "the page-locked slots of the staged gradient factor");
    }
    gradient_factor = {graphs.gradient_factor_memory.data(), 1, ElementType::f64,
                       device.memory_kind()};
    graphs.gradient_factor_uploads.upload(gradient_factor, &loss.gradient_factor);
  }
  if (graphs.num_micro_batches != micro_batches ||
      graphs.micro_batch_size != options.micro_batch_size ||
      graphs.seq_length != options.seq_length ||
      graphs.activations_generation != model.activations_generation()) {
    graphs.reset();
    graphs.num_micro_batches = micro_batches;
    graphs.micro_batch_size = options.micro_batch_size;
    graphs.seq_length = options.seq_length;
    graphs.activations_generation = model.activations_generation();
  }
  const std::unique_ptr<Communicator> collectives =
      make_captured_collectives(data_parallel, model.device());
  int64_t gradient_buckets = 0;  // known where the work is queued (eagerly or captured)
  const auto work = [&] {
    queue_staged_work(model, optimizer.step_scalars(), place, backward_scales, gradient_factor,
                      scaler.enabled(), options, *collectives, shard, gradient_buckets);
  };
  QueuedStep step;
  step.staged = true;
  constexpr const char* kGradientsGraph = "a replayed step's forward and backward";
  if (graphs.gradients) {
    replay_watched(*graphs.gradients, data_parallel, kGradientsGraph);
    // What its prologue did (queue_staged_work) unseen by the model's host state.
    if (shard != nullptr) model.parameters_arrived();
    step.execution = StepExecution::replayed;
  } else if (graphs.refusal.empty() && graphs.eager_steps >= graphs.warmup_steps) {
    graphs.gradients = capture(model.device(), work, graphs.refusal);
    if (graphs.gradients) {
      replay_watched(*graphs.gradients, data_parallel, kGradientsGraph);
      step.execution = StepExecution::captured;
      step.execution_note = fmt::format("forward and backward {} nodes", graphs.gradients->nodes());
    } else {
      // Gathers the failed capture started belong to no work: the eager one starts its own.
      model.abandon_parameter_gathers();
      work();
      step.execution_note = "the capture failed: " + graphs.refusal;
    }
  } else {
    work();
    ++graphs.eager_steps;
    step.execution_note =
        graphs.refusal.empty()
            ? fmt::format("warm-up step {} of {}", graphs.eager_steps, graphs.warmup_steps)
            : "the capture failed: " + graphs.refusal;
  }
  model.set_dropout_step(place.after_last_dropout_step());
  step.batch = batch;
  step.gradients = held_gradients(model, shard);
  step.gradient_buckets = gradient_buckets;
  step.loss_divisor = loss.divisor;
  return step;
}

// queue_update's device work for a staged step: AdamW's coefficients staged, then the update
// (apply_update's: the distributed optimizer's rank updates its range, which the all-gather
// returns to every rank, and the 16-bit working copy is remade by the next forward; and
// --log-params-norm's total) replayed, captured with the gradients' graph, or queued.
void queue_staged_update(QueuedStep& step, GptModel<float>& model, AdamW& optimizer,
                         const LearningRateScheduler& scheduler, const TrainStepOptions& options,
                         Communicator& data_parallel, const GradientShard* shard,
                         StepGraphs* graphs) {
  const AdamW::StepScalars scalars = optimizer.step_scalars();
  // Named, not bound: a lambda captures the struct (clang refuses captured bindings).
  const UpdateTarget target = update_target(model, shard);
  optimizer.stage_step(step.learning_rate, scheduler.weight_decay());
  const std::unique_ptr<Communicator> collectives =
      make_captured_collectives(data_parallel, model.device());
  // With --overlap-param-gather the next step's forward gathers the shards (owed till then).
  const bool gathers_owed = staged_parameter_gathers(options, data_parallel, shard);
  const auto work = [&] {
    optimizer.queue_step(target.updated, target.working_copy, step.gradients.held, scalars.control);
    if (shard != nullptr && !gathers_owed) {
      collectives->all_gather(target.parameters, target.updated);
    }
    if (options.log_params_norm) queue_params_sum_of_squares(model, *collectives, scalars);
  };
  constexpr const char* kUpdateGraph = "a replayed step's update";
  if (graphs != nullptr && step.execution == StepExecution::replayed && graphs->update) {
    replay_watched(*graphs->update, data_parallel, kUpdateGraph);
  } else if (graphs != nullptr && step.execution == StepExecution::captured) {
    graphs->update = capture(model.device(), work, graphs->refusal);
    if (graphs->update) {
      replay_watched(*graphs->update, data_parallel, kUpdateGraph);
      step.execution_note += fmt::format(", update {} nodes", graphs->update->nodes());
    } else {
      work();
      step.execution_note += "; the update's capture failed: " + graphs->refusal;
    }
  } else {
    work();
  }
  model.parameters_updated(/*working_copy_written=*/!target.working_copy.empty());
  if (gathers_owed) {
    model.parameters_owed(data_parallel, parameter_gathers(model, shard->range,
                                                           bucket_size_of(options, data_parallel)));
  }
}

}  // namespace

void StepGraphs::reset() {
  gradients.reset();
  update.reset();
  num_micro_batches = micro_batch_size = seq_length = 0;
  activations_generation = -1;
  eager_steps = 0;
  refusal.clear();
}

TrainStepResult train_step(GptModel<float>& model, AdamW& optimizer,
                           LearningRateScheduler& scheduler, const BatchSource& source,
                           const GlobalBatch& batch, const TrainStepOptions& options) {
  const auto one_process = make_single_process_communicator("data parallel");
  return train_step(model, optimizer, scheduler, source, batch, options, *one_process);
}

QueuedStep queue_gradients(GptModel<float>& model, AdamW& optimizer, const BatchSource& source,
                           const GlobalBatch& batch, const TrainStepOptions& options,
                           Communicator& data_parallel, const GradientShard* shard,
                           StepGraphs* graphs) {
  // Two CPU devices share the host's memory; a GPU's memory is that GPU's alone.
  if (optimizer.device().name() != model.device().name()) {
    common::fail("train_step: the model is on {} but the optimizer's state on {}",
                 model.device().name(), optimizer.device().name());
  }
  std::optional<std::string> eager_reason;
  if (graphs != nullptr) {
    eager_reason =
        graphs->unavailable.empty() ? graphs_refusal(model, data_parallel) : graphs->unavailable;
    // A capture records one device's work: an update on another would run at capture time.
    if (!eager_reason && &optimizer.device() != &model.device()) {
      eager_reason = "the optimizer's state is on another device object than the model's";
    }
    if (!eager_reason) {
      return queue_staged_gradients(model, optimizer, source, batch, options, data_parallel, shard,
                                    *graphs);
    }
  }
  LossScaler& scaler = optimizer.loss_scaler();
  const AdamW::StepScalars scalars = optimizer.step_scalars();
  Device& device = model.device();
  model.zero_gradients();
  // --overlap-grad-reduce: the buckets' all-reduce (DDP) or reduce-scatter into the shards
  // (distributed optimizer) start during the backward, except in the layouts
  // overlapped_gradient_reduction leaves out (arguments.cpp warns).
  StepGradientReduction reduction(model, options, data_parallel, shard);
  const LocalLosses local =
      forward_backward(model, source, batch, scaler.scale(), options, data_parallel.rank(),
                       data_parallel.size(), reduction.during_backward(), scalars.loss_total);
  QueuedStep step;
  step.batch = batch;
  step.gradients = reduction.finish();
  step.gradient_buckets = local.gradient_buckets;
  const StepLoss loss = reduce_loss(local, batch, options, scaler.inverse_scale(), data_parallel,
                                    model.pipeline_parallel_group(), scalars.loss_total);
  step.loss_divisor = loss.divisor;
  // With a loss scaler the gradients are unscaled first (a factor of 1 changes nothing).
  if (loss.gradient_factor != 1.0) ops::scale(device, step.gradients.held, loss.gradient_factor);
  // The host reads nothing until the whole step is queued.
  queue_decision(model, step.gradients, data_parallel, scalars, options, scaler.enabled());
  if (eager_reason) step.execution_note = *eager_reason;
  return step;
}

void queue_update(QueuedStep& step, GptModel<float>& model, AdamW& optimizer,
                  const LearningRateScheduler& scheduler, const TrainStepOptions& options,
                  Communicator& data_parallel, const GradientShard* shard,
                  double learning_rate_factor, StepGraphs* graphs) {
  if (step.update_queued) common::fail("queue_update: this step's update is queued already");
  const AdamW::StepScalars scalars = optimizer.step_scalars();
  Device& device = model.device();
  step.learning_rate = scheduler.learning_rate() * learning_rate_factor;
  step.zeros_counted = options.log_num_zeros_in_grad;
  if (step.staged) {
    queue_staged_update(step, model, optimizer, scheduler, options, data_parallel, shard, graphs);
  } else {
    apply_update(model, optimizer, scheduler, step.gradients, options, data_parallel, shard,
                 step.learning_rate, scalars.control);
  }
  if (options.log_params_norm && !step.staged) {
    queue_params_sum_of_squares(model, data_parallel, scalars);
  }
  // The step's scalars leave for the host in the device's order of work, before the next
  // step's queue_gradients writes over them.
  device.queue_copy_to_host(scalars.host, scalars.all);
  step.scalars_copied = device.mark();
  step.params_norm_logged = options.log_params_norm;
  step.update_queued = true;
}

TrainStepResult finish_step(QueuedStep& step, GptModel<float>& model, AdamW& optimizer,
                            LearningRateScheduler& scheduler) {
  if (!step.update_queued) common::fail("finish_step: the step's update was not queued");
  LossScaler& scaler = optimizer.loss_scaler();
  // The one wait of the step, for its own scalars only.
  model.device().wait_for(step.scalars_copied);
  const StepScalarValues values = step_scalar_values(optimizer.step_scalars().host);
  TrainStepResult result;
  result.gradient_buckets = step.gradient_buckets;
  result.learning_rate = step.learning_rate;
  result.lm_loss = values.loss_total / step.loss_divisor;
  result.grad_norm = std::sqrt(values.sum_of_squares);
  result.skipped = values.skip;
  if (scaler.enabled()) scaler.update(/*found_inf=*/result.skipped);
  // Megatron's nan iterations: a non-finite loss (with a scaler it still updates when the
  // gradients are finite), or without a scaler a skipped update.
  result.nan = !std::isfinite(result.lm_loss) || (!scaler.enabled() && result.skipped);
  result.loss_scale = scaler.scale();
  if (result.skipped) optimizer.step_skipped();
  if (!result.skipped) scheduler.step(step.batch.global_batch_size);
  if (step.params_norm_logged) result.params_norm = std::sqrt(values.logged_total);
  // Not for a skipped iteration, as Megatron prints none.
  if (step.zeros_counted && !result.skipped) result.num_zeros_in_grad = values.zeros_in_grad;
  return result;
}

TrainStepResult train_step(GptModel<float>& model, AdamW& optimizer,
                           LearningRateScheduler& scheduler, const BatchSource& source,
                           const GlobalBatch& batch, const TrainStepOptions& options,
                           Communicator& data_parallel, const GradientShard* shard,
                           double learning_rate_factor) {
  QueuedStep step = queue_gradients(model, optimizer, source, batch, options, data_parallel, shard);
  queue_update(step, model, optimizer, scheduler, options, data_parallel, shard,
               learning_rate_factor);
  return finish_step(step, model, optimizer, scheduler);
}

}  // namespace backend
