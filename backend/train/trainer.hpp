// The pretraining loop of Megatron-LM's pretrain() and train() (megatron/training/training.py),
// on one process or one data-parallel rank: build the model, the optimizer and the schedule from the arguments, load a
// checkpoint if asked, then for each iteration
//   train_step (train_step.hpp)              the global batch's update
//   TrainingLog (training_log.hpp)           TensorBoard scalars, the iteration line
//   actions_after_iteration (training_cadence.hpp)
//                                            evaluate (evaluation.hpp), save, exit
// and at the end save, and validate and test once more when --eval-iters > 0, as Megatron does.
// Output lines go to `out` in Megatron's formats.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <vector>

#include "backend/device/cuda_inventory.hpp"
#include "backend/device/device.hpp"
#include "backend/dist/process_groups.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/batch_source.hpp"
#include "backend/train/log/training_log.hpp"

namespace backend {

struct TrainingResult {
  std::vector<IterationRecord> iterations;
  std::optional<double> validation_loss;  // the final validation pass, if any
  std::optional<double> test_loss;
  int64_t parameter_count = 0;
};

// What the trainer needs of the tokenizer the flags name: its vocabulary size (GPT-2: 50257;
// NullTokenizer: --vocab-size + 1 for its EOD token, as Megatron's _NullTokenizer) and its
// end-of-document id (Megatron's tokenizer.eod: GPT-2's <|endoftext|>, NullTokenizer's
// --vocab-size, a SentencePiece or Hugging Face tokenizer's end of sequence).
struct TokenizerFacts {
  int64_t vocab_size = 0;
  int32_t end_of_document = 0;
};
TokenizerFacts tokenizer_facts(const TrainingArguments& arguments);
int64_t tokenizer_vocab_size(const TrainingArguments& arguments);

// The model the arguments describe (validated): what pretrain builds, and what
// checkpoint_util rebuilds from a checkpoint's saved arguments.
GptConfig model_config(const TrainingArguments& arguments);

// The device the arguments ask for (--device): cpu; cuda, the first GPU the runtime sees
// (after CUDA_VISIBLE_DEVICES: one process per GPU, as Megatron's launchers start them); auto,
// CUDA when a GPU is visible, else the CPU. `gpu` describes the GPU chosen. --device cuda
// without a visible GPU is a common::Error.
struct SelectedDevice {
  std::unique_ptr<Device> device;
  std::optional<CudaDeviceProperties> gpu;
};
SelectedDevice select_device(const TrainingArguments& arguments);

// Runs the whole training. `source` empty: the mock dataset with --mock-data, else the datasets
// the data flags name (dataset_provider.hpp). One process, or one rank of `groups`
// (process_groups.hpp; data parallel so far): every rank calls it; rank 0 prints the setup
// and checkpoint lines and writes the checkpoints, the last rank the iteration and
// evaluation lines (Megatron's print_rank_0 / print_rank_last); the others print nothing.
TrainingResult pretrain(const TrainingArguments& arguments, std::ostream& out,
                        BatchSource source = {});
TrainingResult pretrain(const TrainingArguments& arguments, std::ostream& out, BatchSource source,
                        ProcessGroups& groups);

}  // namespace backend
