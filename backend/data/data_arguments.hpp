// The training data's flags as one value: Megatron-LM's data arguments (megatron/training/
// arguments.py: _add_data_args; --calculate-per-token-loss from _add_training_args, since it
// decides how the batch's tokens count) under its dest names. pretrain_gpt's parser fills it
// from kDataFlags (backend/train/arguments.cpp) beside the tokenizer's flags, which fill
// TokenizerOptions (tokenizer.hpp) directly; the trainer's dataset provider
// (backend/train/dataset_provider.hpp) reads it. docs/data.md says what each source means.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/common/enum_names.hpp"

namespace backend {

// Megatron-DeepSpeed's and older Megatron's --data-impl: how the .bin/.idx pair is read. Only
// the memory-mapped reader is built; infer finds mmap in every .idx this backend reads, and
// lazy and cached are refused (validate_arguments).
enum class DataImplementation { mmap, infer, lazy, cached };
constexpr common::EnumName<DataImplementation> kDataImplementationNames[] = {
    {DataImplementation::mmap, "mmap"},
    {DataImplementation::infer, "infer"},
    {DataImplementation::lazy, "lazy"},
    {DataImplementation::cached, "cached"}};
constexpr std::span<const common::EnumName<DataImplementation>> enum_names(DataImplementation) {
  return kDataImplementationNames;
}

struct DataArguments {
  bool mock_data = false;
  // Real data: one blend split by --split, or a blend per split.
  std::vector<std::string> data_path;  // --data-path: prefix, or weight prefix ...
  std::string data_args_path;          // --data-args-path: a file holding --data-path's words
  std::string data_file_list;          // --data-file-list (ALCF): "weight prefix [corpus]" lines
  std::string split;                   // --split; "" → Megatron's legacy "969, 30, 1"
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string per_split_data_args_path;     // JSON {"train": [...], "valid": [...], "test": [...]}
  std::string data_cache_path;              // where the index arrays are cached
  int64_t num_dataset_builder_threads = 0;  // 0: one per core
  bool eod_mask_loss = false;  // --eod-mask-loss: no loss on positions whose input token is EOD
  // --calculate-per-token-loss: the loss and gradient over the global batch's scored tokens
  bool calculate_per_token_loss = false;
  DataImplementation data_impl = DataImplementation::mmap;  // --data-impl (recorded)
};

}  // namespace backend
