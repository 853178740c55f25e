// Megatron's train_step on one process; see train_step.hpp.
#include "backend/train/train_step.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"
#include "backend/ops/reduction.hpp"
#include "backend/train/buffer_buckets.hpp"
#include "backend/train/pipeline_execution.hpp"

namespace backend {

namespace {

// A sum over every element of the model once of `measure` (a device reduction of a view),
// from `values` (this rank's `held` range of the flat buffer, on the device): the whole buffer
// with neither tensor nor pipeline parallelism; otherwise the tensors every tensor-parallel
// rank holds whole on its rank 0 only (gradient_norm_ranges), the shards everywhere, a tied
// embedding's copy on the last stage nowhere, added over the tensor- and pipeline-parallel
// groups, and over the data-parallel group when `held` is a data-parallel shard. Megatron's
// get_grad_norm_fp32, calc_params_l2_norm and count_zeros_fp32 count the same elements.
template <typename Measure>
double model_total(const GptModel<float>& model, View values, ShardRange held,
                   bool data_parallel_shard, Communicator& data_parallel, Measure measure) {
  Communicator& tensor_parallel = model.tensor_parallel_group();
  Communicator& pipeline = model.pipeline_parallel_group();
  double total = 0;
  if (tensor_parallel.size() == 1 && pipeline.size() == 1) {
    total = measure(values);
  } else {
    for (const BufferRange& range : model.gradient_norm_ranges()) {
      const int64_t begin = std::max(range.offset, held.offset);
      const int64_t end = std::min(range.offset + range.numel, held.offset + held.numel);
      if (begin < end) total += measure(values.slice(begin - held.offset, end - begin));
    }
  }
  if (data_parallel_shard) total = all_reduce_sum(data_parallel, total);
  if (tensor_parallel.size() > 1) total = all_reduce_sum(tensor_parallel, total);
  if (pipeline.size() > 1) total = all_reduce_sum(pipeline, total);
  return total;
}

double model_sum_of_squares(const GptModel<float>& model, AdamW& optimizer, View values,
                            ShardRange held, bool data_parallel_shard,
                            Communicator& data_parallel) {
  return model_total(model, values, held, data_parallel_shard, data_parallel,
                     [&](View part) { return optimizer.sum_of_squares(part); });
}

// This rank's losses of a step: the sum of its micro batches' mean losses (Megatron's default),
// or with --calculate-per-token-loss the sum of its token losses and how many there were
// (labels not kIgnoredLabel; on a pipeline, the last stage's).
struct LocalLosses {
  double sum = 0;
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
std::vector<ArrivingParameters> start_parameter_gathers(const GptModel<float>& model,
                                                        Communicator& group, View parameters,
                                                        ShardRange shard, int64_t bucket_size) {
  std::vector<ArrivingParameters> arrivals;
  BufferBuckets buckets(bucket_size, [&](BufferRange bucket) {
    const std::vector<int64_t> counts = bucket_counts(parameters.numel, group, bucket);
    const int64_t own = counts[static_cast<size_t>(group.rank())];
    const View part = parameters.slice(shard.offset + part_in_shard(bucket, shard, own), own);
    arrivals.push_back({bucket, group.start_all_gather(
                                    parameters.slice(bucket.offset, bucket.numel), part, counts)});
  });
  for (const BufferRange& unit : model.parameter_units()) buckets.add(unit);
  buckets.flush();
  return arrivals;
}

int64_t bucket_size_of(const TrainStepOptions& options, const Communicator& group) {
  return options.ddp_bucket_size > 0 ? options.ddp_bucket_size
                                     : default_ddp_bucket_size(group.size());
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
  local.sum = run_pipeline_steps(
      model, pipeline_schedule(stage.pipeline_parallel, stage.rank, stage.virtual_chunks, count),
      inputs, backward_scale, options.micro_batch_size, options.seq_length);
  if (stage.last()) {
    for (const int64_t positions : scored) local.scored_positions += positions;
  }
  return local;
}

// The whole model on this rank: each micro batch's forward and backward in turn.
LocalLosses sequential_forward_backward(GptModel<float>& model, const BatchSource& source,
                                        const MicroBatchPlace& place,
                                        const TrainStepOptions& options, double loss_scale,
                                        float mean_scale, OverlappedReduction* overlapped) {
  const int64_t micro_tokens = common::checked_multiply(
      options.micro_batch_size, options.seq_length, "--micro-batch-size × --seq-length");
  std::vector<int32_t> tokens(micro_tokens), labels(micro_tokens);
  const bool per_token = options.calculate_per_token_loss;
  LocalLosses local;
  for (int64_t m = 0; m < place.batch.num_micro_batches; ++m) {
    model.set_dropout_step(place.dropout_step(m));
    source(Split::train, place.first_sample(m), options.micro_batch_size, tokens, labels);
    const int64_t scored = per_token ? scored_label_count(labels) : 0;
    // Per token: the model's backward is of its mean, so scale × count makes it the sum's
    // (exactly: a power of two times an integer below 2^24, divided by that integer). Known
    // before the forward, which therefore computes the head's gradient too (fused classifier).
    const float backward_scale =
        per_token ? static_cast<float>(loss_scale) * static_cast<float>(scored) : mean_scale;
    const double loss =
        model.forward(tokens, labels, options.micro_batch_size, options.seq_length, backward_scale);
    local.sum += per_token ? loss * static_cast<double>(scored) : loss;
    local.scored_positions += scored;
    // --overlap-grad-reduce: in the last micro batch each bucket's reduction starts as soon as
    // the backward has finished its units (the earlier micro batches only accumulate, as under
    // Megatron's no_sync).
    const bool last = m + 1 == place.batch.num_micro_batches;
    if (last && overlapped != nullptr) {
      model.set_gradients_ready(overlapped->ready());
      model.backward(backward_scale);
      model.set_gradients_ready({});
    } else {
      model.backward(backward_scale);
    }
  }
  return local;
}

// This rank's share of the global batch: its micro batches' gradients accumulate, each backward
// scaled by loss_scale / (num_micro_batches · D), or with --calculate-per-token-loss by
// loss_scale × its scored positions (the gradient of the sum of its token losses, which
// train_step divides by the global batch's scored positions once summed, as Megatron's
// finalize_model_grads).
LocalLosses forward_backward(GptModel<float>& model, const BatchSource& source,
                             const GlobalBatch& batch, double loss_scale,
                             const TrainStepOptions& options, int64_t dp_rank, int64_t dp_size,
                             OverlappedReduction* overlapped) {
  // Without a scaler (scale 1) the mean's factor is 1/num_micro_batches exactly as before; a
  // power-of-two scale multiplies it exactly.
  const float mean_scale =
      static_cast<float>(loss_scale) / static_cast<float>(batch.num_micro_batches * dp_size);
  const MicroBatchPlace place{.batch = batch,
                              .micro_batch_size = options.micro_batch_size,
                              .dp_rank = dp_rank,
                              .dp_size = dp_size,
                              .first_dropout_step = model.dropout_step()};
  LocalLosses local =
      model.pipeline_stage().whole_model()
          ? sequential_forward_backward(model, source, place, options, loss_scale, mean_scale,
                                        overlapped)
          : pipeline_forward_backward(
                model, source, place, options,
                options.calculate_per_token_loss ? static_cast<float>(loss_scale) : mean_scale,
                overlapped);
  if (overlapped != nullptr) local.gradient_buckets = overlapped->finish(model.parameter_units());
  model.set_dropout_step(place.after_last_dropout_step());
  return local;
}

// The gradients this rank updates from, reduced over the data-parallel group the way the layout
// keeps them: all of them, or its shard (distributed optimizer); ZeRO-3's already summed.
struct StepGradients {
  View held;                 // all, or this rank's shard of it
  ShardRange range;          // held's place in the flat buffer
  bool data_parallel_share;  // held is this rank's share of the group's (ZeRO-1 or ZeRO-3)
};

StepGradients reduce_gradients(GptModel<float>& model, Communicator& data_parallel,
                               const GradientShard* shard, bool overlapped) {
  const View all = model.gradient_buffer();
  const bool sharded = model.sharded_over_data_parallel();
  if (sharded && shard != nullptr) {
    common::fail("train_step: a ZeRO-3 model holds its own shard; no distributed-optimizer "
                 "shard goes with it");
  }
  const StepGradients gradients{.held = shard != nullptr ? shard->gradients : all,
                                .range = shard != nullptr ? shard->range : ShardRange{0, all.numel},
                                .data_parallel_share = shard != nullptr || sharded};
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

// The loss the log shows, and the factor the summed gradients are multiplied by: the loss
// scale's inverse, and with --calculate-per-token-loss one over the global batch's scored
// positions.
struct StepLoss {
  double lm_loss = 0;
  double gradient_factor = 1;
};

StepLoss reduce_loss(const LocalLosses& local, const GlobalBatch& batch,
                     const TrainStepOptions& options, double inverse_loss_scale,
                     Communicator& data_parallel, Communicator& pipeline) {
  StepLoss loss{.lm_loss = 0, .gradient_factor = inverse_loss_scale};
  if (options.calculate_per_token_loss) {
    // Megatron's finalize_model_grads with num_tokens: the global batch's scored positions
    // (the last stage's count to every stage, summed over the data-parallel group) divide the
    // summed gradients; the logged loss is the token losses' sum over the same count.
    double sums[2] = {local.sum, static_cast<double>(local.scored_positions)};
    const View both = host_view(std::span<double>(sums));
    if (pipeline.size() > 1) pipeline.broadcast(both, pipeline.size() - 1);
    data_parallel.all_reduce(both, ReduceOperation::sum);
    const double scored_positions = sums[1];
    loss.lm_loss = scored_positions > 0 ? sums[0] / scored_positions : 0.0;
    if (scored_positions > 0) loss.gradient_factor /= scored_positions;
  } else {
    // The loss averaged for the log (average_losses_across_data_parallel_group).
    loss.lm_loss = local.sum / static_cast<double>(batch.num_micro_batches);
    loss.lm_loss =
        all_reduce_sum(data_parallel, loss.lm_loss) / static_cast<double>(data_parallel.size());
    // Only the last pipeline stage computed it; every stage decides on it alike.
    if (pipeline.size() > 1) {
      pipeline.broadcast(host_view(std::span(&loss.lm_loss, 1)), pipeline.size() - 1);
    }
  }
  return loss;
}

// Whether the update is skipped, from the loss and the norm every rank holds alike.
void decide_skip(TrainStepResult& result, LossScaler& scaler) {
  if (scaler.enabled()) {
    // Megatron's mixed-precision step: look for inf/nan in the unscaled gradients (here: a
    // norm that is not finite, which any non-finite gradient makes it), tell the scaler, and
    // skip the update when one was found. The loss itself does not decide: a non-finite loss
    // with finite gradients is a nan iteration that still updates, as in Megatron.
    const bool found_inf = !std::isfinite(result.grad_norm);
    scaler.update(found_inf);
    result.skipped = found_inf;
  } else {
    // In fp32 there is no loss scale to back off: a non-finite loss or norm is the only reason
    // to skip, and the update it would have made is dropped whole.
    result.skipped = !std::isfinite(result.lm_loss) || !std::isfinite(result.grad_norm);
  }
  result.nan = !std::isfinite(result.lm_loss) || (!scaler.enabled() && result.skipped);
  result.loss_scale = scaler.scale();
}

// Clip, count the zeros (--log-num-zeros-in-grad), AdamW over the held range, the parameters
// back to every rank, the schedule's step.
void apply_update(GptModel<float>& model, AdamW& optimizer, LearningRateScheduler& scheduler,
                  const StepGradients& gradients, const GlobalBatch& batch,
                  const TrainStepOptions& options, Communicator& data_parallel,
                  const GradientShard* shard, TrainStepResult& result) {
  // Clipping's coefficient is folded into the step (AdamW reads the gradients scaled, the bits
  // of scaling them first), except where the zeros are counted after clipping, as Megatron's
  // count_zeros_fp32 does (a gradient the coefficient underflows to 0 counts).
  double gradient_scale = 1.0;
  if (options.log_num_zeros_in_grad) {
    optimizer.clip_gradients(gradients.held, result.grad_norm, options.clip_grad);
    result.num_zeros_in_grad =
        model_total(model, gradients.held, gradients.range, gradients.data_parallel_share,
                    data_parallel, [&](View part) { return optimizer.count_zeros(part); });
  } else if (const auto coefficient = clip_coefficient(result.grad_norm, options.clip_grad)) {
    gradient_scale = *coefficient;
  }
  // The model's parameters are the fp32 master weights. A whole model's bf16 or fp16 working
  // copy is written in the same pass; a distributed optimizer's rank updates its range only,
  // and the copy is remade from the gathered parameters before the next forward.
  const View parameters = model.parameter_buffer();
  const View updated =
      shard != nullptr ? parameters.slice(shard->range.offset, shard->range.numel) : parameters;
  const View working_copy = shard != nullptr ? View{} : model.working_copy_buffer();
  optimizer.step(updated, working_copy, gradients.held, result.learning_rate,
                 scheduler.weight_decay(), gradient_scale);
  // Every rank's range back to every rank (Megatron's parameter all-gather): at once, or with
  // --overlap-param-gather started in buckets that the next forward waits for unit by unit. A
  // ZeRO-3 model gathers each unit when it next uses it.
  std::vector<ArrivingParameters> arrivals;
  if (shard != nullptr && options.overlap_param_gather && data_parallel.size() > 1) {
    arrivals = start_parameter_gathers(model, data_parallel, parameters, shard->range,
                                       bucket_size_of(options, data_parallel));
  } else if (shard != nullptr) {
    data_parallel.all_gather(parameters, updated);
  }
  model.parameters_updated(/*working_copy_written=*/!working_copy.empty());
  if (!arrivals.empty()) model.parameters_arriving(std::move(arrivals));
  scheduler.step(batch.global_batch_size);
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

}  // namespace

TrainStepResult train_step(GptModel<float>& model, AdamW& optimizer,
                           LearningRateScheduler& scheduler, const BatchSource& source,
                           const GlobalBatch& batch, const TrainStepOptions& options) {
  const auto one_process = make_single_process_communicator("data parallel");
  return train_step(model, optimizer, scheduler, source, batch, options, *one_process);
}

TrainStepResult train_step(GptModel<float>& model, AdamW& optimizer,
                           LearningRateScheduler& scheduler, const BatchSource& source,
                           const GlobalBatch& batch, const TrainStepOptions& options,
                           Communicator& data_parallel, const GradientShard* shard,
                           double learning_rate_factor) {
  // Two CPU devices share the host's memory; a GPU's memory is that GPU's alone.
  if (optimizer.device().name() != model.device().name()) {
    common::fail("train_step: the model is on {} but the optimizer's state on {}",
                 model.device().name(), optimizer.device().name());
  }
  LossScaler& scaler = optimizer.loss_scaler();
  model.zero_gradients();
  // --overlap-grad-reduce: the buckets' all-reduce (DDP) or reduce-scatter into the shards
  // (distributed optimizer) start during the backward, except in the layouts
  // overlapped_gradient_reduction leaves out (arguments.cpp warns).
  const bool overlap = overlapped_gradient_reduction(options, model, data_parallel, shard);
  std::vector<std::unique_ptr<Communicator::PendingCollective>> pending;
  std::optional<OverlappedReduction> overlapped;
  if (overlap) {
    overlapped.emplace(data_parallel, model.gradient_buffer(), shard,
                       bucket_size_of(options, data_parallel), pending);
  }
  const LocalLosses local =
      forward_backward(model, source, batch, scaler.scale(), options, data_parallel.rank(),
                       data_parallel.size(), overlapped ? &*overlapped : nullptr);
  // Every reduction finished before anything reads or adds to the gradients.
  for (const auto& reduction : pending) reduction->wait();
  // The model-parallel sums (sequence parallelism's norms): on the whole buffer before the
  // data-parallel reduction, or on this rank's shard of it where the buckets already
  // reduce-scattered it.
  if (overlap && shard != nullptr) {
    model.finalize_gradients(shard->gradients, shard->range);
  } else {
    model.finalize_gradients();
  }
  const StepGradients gradients = reduce_gradients(model, data_parallel, shard, overlap);
  const StepLoss loss = reduce_loss(local, batch, options, scaler.inverse_scale(), data_parallel,
                                    model.pipeline_parallel_group());
  TrainStepResult result;
  result.lm_loss = loss.lm_loss;
  result.gradient_buckets = local.gradient_buckets;
  result.learning_rate = scheduler.learning_rate() * learning_rate_factor;
  // With a loss scaler the gradients are unscaled first (a factor of 1 changes nothing).
  if (loss.gradient_factor != 1.0) {
    ops::scale(optimizer.device(), gradients.held, loss.gradient_factor);
  }
  // The global norm, reduced on the device (the host reads one double, and decides as every
  // rank will): of the whole buffer, or the shards' sums of squares added over the group.
  result.grad_norm =
      std::sqrt(model_sum_of_squares(model, optimizer, gradients.held, gradients.range,
                                     gradients.data_parallel_share, data_parallel));
  decide_skip(result, scaler);
  if (!result.skipped) {
    apply_update(model, optimizer, scheduler, gradients, batch, options, data_parallel, shard,
                 result);
  }
  if (options.log_params_norm) {
    // Megatron's calc_params_l2_norm after the step: the fp32 master weights here (the model's
    // parameters), every rank's whole copy, or a ZeRO-3 rank's range summed over the group.
    const View parameters = model.parameter_buffer();
    result.params_norm = std::sqrt(
        model_sum_of_squares(model, optimizer, parameters, ShardRange{0, parameters.numel},
                             model.sharded_over_data_parallel(), data_parallel));
  }
  return result;
}

}  // namespace backend
