// Megatron-LM's evaluate (megatron/training/training.py): the mean lm loss over --eval-iters
// global batches of one split, forward only, in evaluation mode (no dropout; the dropout step
// stays where training left it), training mode again after. The global batch is the final
// --global-batch-size, ramp-up or not, as Megatron's evaluation uses it.
#pragma once

#include <cstdint>

#include "backend/dist/communicator.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/train/batch_source.hpp"

namespace backend {

// What an evaluation reads of the flags (trainer.hpp's evaluation_options makes it from the
// arguments).
struct EvaluationOptions {
  int64_t micro_batch_size = 0;           // --micro-batch-size
  int64_t global_batch_size = 0;          // the final --global-batch-size
  int64_t seq_length = 0;                 // --seq-length
  int64_t eval_iters = 0;                 // --eval-iters: global batches per pass
  bool calculate_per_token_loss = false;  // --calculate-per-token-loss
};

struct EvaluationResult {
  // mean over all micro batches of all --eval-iters batches; --calculate-per-token-loss: the
  // token losses' sum over the scored tokens of them all
  double lm_loss = 0;
  int64_t samples = 0;  // read from the split, by which its consumed count advances
};

// Reads samples first_sample .. first_sample + samples − 1 of `split`.
EvaluationResult evaluate(GptModel<float>& model, const BatchSource& source, Split split,
                          int64_t first_sample, const EvaluationOptions& options);
// Over a data-parallel group: each rank forwards its slice of every global batch (as
// train_step reads them), the loss is averaged over all of them; `samples` counts the group's.
EvaluationResult evaluate(GptModel<float>& model, const BatchSource& source, Split split,
                          int64_t first_sample, const EvaluationOptions& options,
                          Communicator& data_parallel);

}  // namespace backend
