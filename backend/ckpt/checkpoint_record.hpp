// The record of arguments a checkpoint keeps in its metadata ("arguments": the values that
// define the shapes, the optimizer, the schedule and the data stream, by Megatron's names), and
// the part of it that says which model the checkpoint holds: CheckpointModelRecord, the model's,
// tokenizer's and parallel layout's flags, from which the tools that rebuild a model without
// its command line start (checkpoint_util's resharding and conversion, and --use-checkpoint-args,
// as Megatron's loader_megatron.py and load_args_from_checkpoint read the checkpoint's args).
//
// Each concern's record is a table of {key, field} rows that both the writing and the reading
// walk, so a field cannot be written and not read back; the trainer's own concerns (the run's
// batches, the optimizer; train/checkpoint_arguments.cpp) are tables of the same kind. An enum
// is recorded as its name (common/enum_names.hpp). Two keys are not a field as it is, and
// follow the tables both ways: disable_bias_linear (!add_bias_linear) and num_query_groups (0 for
// multi-head attention). A key that decides a tensor shape also needs its row in kShapeFlags
// (checkpoint.cpp), which names the flag when a checkpoint does not fit.
// Reference: megatron/training/checkpointing.py (the args saved into model_optim_rng.pt, and
// check_checkpoint_args); tools/checkpoint/loader_megatron.py (a model rebuilt from them).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/common/enum_flag_field.hpp"
#include "backend/common/error.hpp"
#include "backend/data/tokenizer.hpp"
#include "backend/dist/parallelism_arguments.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/model/model_arguments.hpp"

namespace backend {

// One row of a concern's record: the key, the field of the concern's struct, and whether
// checkpoints made before the flag existed may lack it.
template <typename Config>
using RecordedField =
    std::variant<int64_t Config::*, uint64_t Config::*, double Config::*, bool Config::*,
                 std::string Config::*, common::EnumFlagField<Config>>;
template <typename Config>
struct RecordedArgument {
  const char* key;
  RecordedField<Config> field;
  bool optional = false;  // absent from checkpoints made before the flag existed
};
inline constexpr bool kOptionalRecord = true;

// The rows' fields of `config` into `record`.
template <typename Config>
void record_arguments(const Config& config, std::span<const RecordedArgument<Config>> table,
                      nlohmann::json& record) {
  for (const RecordedArgument<Config>& argument : table) {
    std::visit(
        [&](auto member) {
          if constexpr (std::is_same_v<decltype(member), common::EnumFlagField<Config>>) {
            record[argument.key] = std::string(member.name(config));
          } else {
            record[argument.key] = config.*member;
          }
        },
        argument.field);
  }
}

// The rows' fields of `config` from the record `saved` (the section "arguments" of `root`, the
// metadata of `file`); a missing or mistyped key, or an enum name this backend does not know, is
// a common::Error naming `file`.
template <typename Config>
void read_recorded_arguments(const CheckpointMetadata& root, const nlohmann::json& saved,
                             const std::filesystem::path& file,
                             std::span<const RecordedArgument<Config>> table, Config& config) {
  for (const RecordedArgument<Config>& argument : table) {
    if (argument.optional && !saved.contains(argument.key)) continue;
    std::visit(
        [&](auto member) {
          if constexpr (std::is_same_v<decltype(member), common::EnumFlagField<Config>>) {
            const auto name = root.get<std::string>(saved, argument.key);
            if (!member.set(config, name)) {
              common::fail(
                  "checkpoint {}: metadata field '{}' names no setting this backend "
                  "knows ({})",
                  file.string(), argument.key, saved[argument.key].dump());
            }
          } else {
            using Value = std::remove_reference_t<decltype(config.*member)>;
            config.*member = root.get<Value>(saved, argument.key);
          }
        },
        argument.field);
  }
}

// What a checkpoint's record says of the model it holds. Fields the record does not hold keep
// their defaults.
struct CheckpointModelRecord {
  ModelArguments model;
  TokenizerOptions tokenizer;        // type, model file and --vocab-size (no vocabulary files)
  ParallelismArguments parallelism;  // tp, pp and the interleaved schedule's chunk size
};

// The model's keys of the record: num_layers, hidden_size, ..., disable_bias_linear,
// num_query_groups, tokenizer_type, vocab_size, tensor_model_parallel_size, ...
void record_model(const CheckpointModelRecord& record, nlohmann::json& arguments);

// The model's part of the record in a checkpoint's metadata (`file` for the messages).
CheckpointModelRecord read_model_record(const CheckpointMetadata& metadata,
                                        const std::filesystem::path& file);
// The model's part of the record of the checkpoint DIR's tracker names (require_checkpoint,
// whose errors begin with `option` and end with `remedy`).
CheckpointModelRecord read_saved_model_record(
    const std::filesystem::path& directory, std::string_view option,
    std::string_view remedy = "is it the --save directory of a training run?");

// The model the record describes, with its tokenizer's vocabulary (tokenizer_facts: a
// SentencePiece or Hugging Face tokenizer's file is read) padded at its tensor-parallel size.
GptConfig model_config(const CheckpointModelRecord& record);

}  // namespace backend
