// The data side of Megatron's pretrain() for GPT: the samples each split needs
// (megatron/training/training.py get_train_valid_test_num_samples), the datasets built from the
// data flags (pretrain_gpt.py's train_valid_test_datasets_provider over
// backend/data/gpt_dataset_builder.hpp), and the BatchSource the trainer reads them through.
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>

#include "backend/data/data_blend.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/batch_source.hpp"

namespace backend {

// (train, validation, test) samples: train_samples or train_iters × global batch;
// (train_iters // eval_interval + 1) × eval_iters × global batch; eval_iters × global batch.
std::array<int64_t, 3> train_valid_test_num_samples(const TrainingArguments& arguments);

// The data sources the flags name (reads --data-args-path, --data-file-list and
// --per-split-data-args-path).
DataSources data_sources(const TrainingArguments& arguments);

// Builds (or loads from the cache) the datasets the flags name, printing Megatron's lines to
// `out`, and returns a source of their batches. Token ids are checked against `vocab_size`.
// A test split the data gives nothing (--split 98,2,0) is skipped with a log line, as Megatron
// skips it; `test_split_skipped`, when given, is set to whether that happened.
BatchSource build_dataset_batch_source(const TrainingArguments& arguments, int64_t vocab_size,
                                       std::ostream& out, bool* test_split_skipped = nullptr);

}  // namespace backend
