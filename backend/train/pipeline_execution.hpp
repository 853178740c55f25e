// Runs a pipeline rank's schedule (pipeline_schedule.hpp) on its model: each compute step is a
// forward_chunk or backward_chunk of the micro batch's slot (micro batch m in slot m % slots),
// each transfer step one batch of point-to-point transfers over the pipeline group
// (Communicator::exchange, Megatron's _batched_p2p_ops): activations from a chunk's output into
// the next virtual stage's chunk input, gradients from a chunk's input gradient into the
// previous virtual stage's output gradient. Activations travel with tag 0, gradients with tag 1,
// so two transfers between one pair of ranks in one batch (the interleaved schedule's wrap from
// the last stage to the first) cannot be confused. A post step starts its batch
// (Communicator::start_exchange) and the wait step of its handle finishes it, so the computes
// between run while it travels (overlapped p2p communication).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/model/gpt_model.hpp"
#include "backend/train/pipeline_schedule.hpp"

namespace backend {

struct PipelineMicroBatches {
  int64_t count = 0;
  // Fills micro batch m's tokens and labels (B·T each).
  std::function<void(int64_t m, std::span<int32_t> tokens, std::span<int32_t> labels)> read;
  // The dropout step of micro batch m's forwards (its place in the global batch).
  std::function<uint64_t(int64_t m)> dropout_step;
  // The weight of micro batch m's loss (--calculate-per-token-loss: its scored positions, so
  // that its backward is of the sum of its token losses); empty: 1.
  std::function<double(int64_t m)> loss_weight{};
  // --overlap-grad-reduce: told each unit's range of the flat gradient buffer as the last
  // micro batch's backward of each chunk completes it (GptModel::set_gradients_ready); empty:
  // nothing told.
  std::function<void(BufferRange)> last_gradients_ready{};
  // The micro batches were staged (GptModel::stage_micro_batch, index m, each for its backward
  // scale): each forward takes micro batch m's staged inputs (forward_chunk_staged) and nothing
  // is read (`read` may be empty), for a captured step (train_step.cpp).
  bool staged = false;
};

// Forward only (evaluation, Megatron's forward_only): every micro batch through the stage's
// chunks in order, each chunk's input received before and its output sent after, one transfer
// at a time.
std::vector<PipelineStep> pipeline_forward_schedule(const PipelineStage& stage,
                                                    int64_t num_micro_batches);

// Runs `steps` (whose micro batches number micro_batches.count) with backward scale
// `grad_scale` × the micro batch's loss weight; the model has at least pipeline_slots(steps)
// slots reserved (reserve() is called with more otherwise). Returns the sum of the micro
// batches' mean losses, each times its loss weight, on the last stage, 0 on the others (and 0
// while the model adds its losses up on the device: GptModel::set_loss_accumulation).
template <typename Scalar>
double run_pipeline_steps(GptModel<Scalar>& model, const std::vector<PipelineStep>& steps,
                          const PipelineMicroBatches& micro_batches, Scalar grad_scale,
                          int64_t batch_size, int64_t seq_length);
extern template double run_pipeline_steps<float>(GptModel<float>&, const std::vector<PipelineStep>&,
                                                 const PipelineMicroBatches&, float, int64_t,
                                                 int64_t);
extern template double run_pipeline_steps<double>(GptModel<double>&,
                                                  const std::vector<PipelineStep>&,
                                                  const PipelineMicroBatches&, double, int64_t,
                                                  int64_t);

}  // namespace backend
