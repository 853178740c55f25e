// The executor of pipeline_execution.hpp.
#include "backend/train/pipeline_execution.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"

namespace backend {

namespace {

constexpr int64_t kActivationTag = 0;
constexpr int64_t kGradientTag = 1;

PipelineStep transfer_step(const PipelineTransfer& transfer) {
  PipelineStep step;
  step.kind = PipelineStep::Kind::transfer;
  step.transfers.push_back(transfer);
  return step;
}

}  // namespace

std::vector<PipelineStep> pipeline_forward_schedule(const PipelineStage& stage,
                                                    int64_t num_micro_batches) {
  const int64_t pp = stage.pipeline_parallel;
  const int64_t vp = stage.virtual_chunks;
  const int64_t previous = (stage.rank + pp - 1) % pp;
  const int64_t next = (stage.rank + 1) % pp;
  std::vector<PipelineStep> steps;
  for (int64_t m = 0; m < num_micro_batches; ++m) {
    for (int64_t c = 0; c < vp; ++c) {
      // The first virtual stage embeds; the last one computes the loss and sends nothing.
      if (!(stage.first() && c == 0)) {
        steps.push_back(transfer_step({false, PipelineMessage::activation, m, c, previous}));
      }
      PipelineStep forward;
      forward.kind = PipelineStep::Kind::compute;
      forward.work = PipelineWork::forward;
      forward.micro_batch = m;
      forward.chunk = c;
      steps.push_back(std::move(forward));
      if (!(stage.last() && c + 1 == vp)) {
        steps.push_back(transfer_step({true, PipelineMessage::activation, m, c, next}));
      }
    }
  }
  return steps;
}

template <typename Scalar>
double run_pipeline_steps(GptModel<Scalar>& model, const std::vector<PipelineStep>& steps,
                          const PipelineMicroBatches& micro_batches, Scalar grad_scale,
                          int64_t batch_size, int64_t seq_length) {
  const int64_t needed = pipeline_slots(steps);
  if (model.micro_batch_slots() < needed) model.reserve(batch_size, seq_length, needed);
  const int64_t slots = model.micro_batch_slots();
  Communicator& pipeline = model.pipeline_parallel_group();
  const int64_t tokens_count =
      common::checked_multiply(batch_size, seq_length, "--micro-batch-size × --seq-length");
  std::vector<int32_t> tokens(static_cast<size_t>(tokens_count));
  std::vector<int32_t> labels(static_cast<size_t>(tokens_count));
  const PipelineStage& stage = model.pipeline_stage();
  const int64_t last_chunk = model.num_chunks() - 1;
  std::vector<PointToPoint> transfers;
  double loss_sum = 0;
  // A schedule with backwards (training) has the scoring forwards compute the head's gradient
  // with the loss (the fused classifier); a forward-only one (evaluation) does not.
  const bool trains = std::ranges::any_of(steps, [](const PipelineStep& step) {
    return step.kind == PipelineStep::Kind::compute && step.work == PipelineWork::backward;
  });
  // The communicator's transfers of a transfer or post step.
  const auto to_transfers = [&](const PipelineStep& step) {
    transfers.clear();
    for (const PipelineTransfer& t : step.transfers) {
      const int64_t slot = t.micro_batch % slots;
      const bool activation = t.message == PipelineMessage::activation;
      // A received gradient lands in the chunk's output-gradient buffer; a sent one leaves
      // from its input buffer, where backward_chunk put it.
      const View values = activation ? (t.send ? model.chunk_output(slot, t.chunk)
                                               : model.chunk_input(slot, t.chunk))
                                     : (t.send ? model.chunk_input(slot, t.chunk)
                                               : model.chunk_output_gradient(slot, t.chunk));
      transfers.push_back(
          {t.send ? PointToPoint::Direction::send : PointToPoint::Direction::receive, values,
           t.peer, activation ? kActivationTag : kGradientTag});
    }
    return std::span<const PointToPoint>(transfers);
  };
  // The posts in flight by handle (overlapped p2p communication). Declared after the model's
  // buffers are in reach and destroyed before the caller's: one left by an exception is finished
  // by its destructor.
  std::map<int64_t, std::unique_ptr<Communicator::PendingCollective>> posted;
  for (const PipelineStep& step : steps) {
    if (step.kind == PipelineStep::Kind::transfer) {
      pipeline.exchange(to_transfers(step));
      continue;
    }
    if (step.kind == PipelineStep::Kind::post) {
      posted[step.handle] = pipeline.start_exchange(to_transfers(step));
      continue;
    }
    if (step.kind == PipelineStep::Kind::wait) {
      const auto found = posted.find(step.handle);
      if (found == posted.end()) {
        throw std::logic_error(fmt::format(
            "pipeline schedule: wait for post {}, which is not in flight", step.handle));
      }
      found->second->wait();
      posted.erase(found);
      continue;
    }
    const int64_t slot = step.micro_batch % slots;
    // The micro batch's backward scale; its loss weight is known once its labels are read.
    const auto backward_scale = [&] {
      return micro_batches.loss_weight
                 ? grad_scale * static_cast<Scalar>(micro_batches.loss_weight(step.micro_batch))
                 : grad_scale;
    };
    if (step.work == PipelineWork::backward) {
      // A chunk's last backward finishes its units' gradients (each chunk meets its micro
      // batches in increasing order).
      const bool last =
          micro_batches.last_gradients_ready && step.micro_batch + 1 == micro_batches.count;
      if (!last) {
        model.backward_chunk(slot, step.chunk, backward_scale());
        continue;
      }
      // Told for this backward only, even when it throws.
      struct Told {
        GptModel<Scalar>& model;
        ~Told() { model.set_gradients_ready({}); }
      } told{model};
      model.set_gradients_ready(micro_batches.last_gradients_ready);
      model.backward_chunk(slot, step.chunk, backward_scale());
      continue;
    }
    if (micro_batches.dropout_step) {
      model.set_dropout_step(micro_batches.dropout_step(step.micro_batch));
    }
    double loss = 0;
    if (micro_batches.staged) {
      loss = model.forward_chunk_staged(slot, step.chunk, step.micro_batch, backward_scale());
    } else {
      const bool embeds = stage.first() && step.chunk == 0;
      const bool scores = stage.last() && step.chunk == last_chunk;
      if (embeds || scores) micro_batches.read(step.micro_batch, tokens, labels);
      // The scoring chunk computes the head's gradient with its loss (the fused classifier).
      loss = model.forward_chunk(
          slot, step.chunk, tokens, labels,
          scores && trains ? std::optional<Scalar>(backward_scale()) : std::nullopt);
    }
    // The weight is read after the forward: the read above is what gives it (the labels).
    loss_sum += micro_batches.loss_weight ? loss * micro_batches.loss_weight(step.micro_batch) : loss;
  }
  for (auto& [handle, pending] : posted) pending->wait();
  return loss_sum;
}

template double run_pipeline_steps<float>(GptModel<float>&, const std::vector<PipelineStep>&,
                                          const PipelineMicroBatches&, float, int64_t, int64_t);
template double run_pipeline_steps<double>(GptModel<double>&, const std::vector<PipelineStep>&,
                                           const PipelineMicroBatches&, double, int64_t, int64_t);

}  // namespace backend
