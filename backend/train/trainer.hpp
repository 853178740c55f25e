// The pretraining loop of Megatron-LM's pretrain() (megatron/training/training.py), on one
// process for now: build the model, the optimizer and the schedule from the arguments, then
//   for each iteration: zero grads; for each micro batch: forward, backward(1/num_micro);
//                       norm = global grad norm; if finite: clip, AdamW step, schedule step;
//                       log every --log-interval; validate every --eval-interval
// and at the end validate and test once more when --eval-iters > 0, as Megatron does.
// Output lines go to `out` in Megatron's formats (training_log.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <span>
#include <vector>

#include "backend/data/mock_dataset.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/train/arguments.hpp"

namespace backend {

// Where batches come from: fills tokens and labels, each (batch_size, seq_length), with
// samples first_sample .. first_sample + batch_size − 1 of the split.
using BatchSource = std::function<void(Split split, int64_t first_sample, int64_t batch_size,
                                       std::span<int32_t> tokens, std::span<int32_t> labels)>;

struct IterationRecord {
  int64_t iteration = 0;
  double lm_loss = 0;
  double grad_norm = 0;
  double learning_rate = 0;  // the rate this iteration's update used
  bool skipped = false;
  double elapsed_ms = 0;
  int64_t global_batch_size = 0;  // grows during --rampup-batch-size
  int64_t consumed_samples = 0;   // after this iteration
};

struct TrainingResult {
  std::vector<IterationRecord> iterations;
  std::optional<double> validation_loss;  // the final validation pass, if any
  std::optional<double> test_loss;
  int64_t parameter_count = 0;
};

// The vocabulary size the tokenizer implies (GPT-2: 50257; NullTokenizer: --vocab-size + 1
// for its EOD token, as Megatron's _NullTokenizer).
int64_t tokenizer_vocab_size(const TrainingArguments& arguments);

// The model the arguments describe (validated): what pretrain builds, and what
// checkpoint_util rebuilds from a checkpoint's saved arguments.
GptConfig model_config(const TrainingArguments& arguments);

// Runs the whole training. `source` empty: the mock dataset with --mock-data, else the datasets
// the data flags name (dataset_provider.hpp).
TrainingResult pretrain(const TrainingArguments& arguments, std::ostream& out,
                        BatchSource source = {});

}  // namespace backend
