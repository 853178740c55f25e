// Megatron's checkpoint layout, crash-safe saving and validating loads; see checkpoint.hpp.
// Reference: megatron/training/checkpointing.py (get_checkpoint_name, read_metadata,
// save_checkpoint, load_checkpoint, check_checkpoint_args) and
// megatron/core/optimizer_param_scheduler.py (load_state_dict, _check_and_set).
#include "backend/ckpt/checkpoint.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <regex>
#include <span>
#include <utility>
#include <vector>

#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/ckpt/checkpoint_record.hpp"
#include "backend/ckpt/megatron_checkpoint.hpp"
#include "backend/ckpt/megatron_checkpoint_writer.hpp"
#include "backend/ckpt/megatron_dist_checkpoint.hpp"
#include "backend/ckpt/megatron_dist_checkpoint_writer.hpp"
#include "backend/ckpt/shard_file.hpp"
#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/local_time.hpp"
#include "backend/common/nemo_config_keys.hpp"
#include "backend/common/python_format.hpp"
#include "backend/common/small_file.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace backend {

using common::format_python_shape;

namespace {

constexpr const char* kTrackerName = "latest_checkpointed_iteration.txt";
constexpr const char* kFileName = "model_optim_rng.bin";
constexpr const char* kExpAvgPrefix = kCheckpointExpAvgPrefix;
constexpr const char* kExpAvgSqPrefix = kCheckpointExpAvgSqPrefix;
// The two tensors of a distrib_optim file.
constexpr const char* kMomentExpAvg = "exp_avg";
constexpr const char* kMomentExpAvgSq = "exp_avg_sq";
constexpr size_t kMismatchRowsShown = 20;

// The keys of the arguments record (CheckpointSaveOptions::arguments, the model's part made by
// checkpoint_record.cpp) that decide the tensor shapes, with their flags: a
// checkpoint that does not fit the model is explained by the ones that differ. Add a row (and
// the key to the record) for every new flag that changes a shape or adds a tensor.
struct ShapeFlag {
  const char* key;
  const char* flag;
};
constexpr ShapeFlag kShapeFlags[] = {
    {"num_layers", "--num-layers"},
    {"hidden_size", "--hidden-size"},
    {"ffn_hidden_size", "--ffn-hidden-size"},
    {"num_attention_heads", "--num-attention-heads"},
    {"max_position_embeddings", "--max-position-embeddings"},
    {"tokenizer_type", "--tokenizer-type"},
    {"vocab_size", "--vocab-size"},
    {"make_vocab_size_divisible_by", "--make-vocab-size-divisible-by"},
    {"tensor_model_parallel_size", "--tensor-model-parallel-size"},
    {"position_embedding_type", "--position-embedding-type"},
    {"normalization", "--normalization"},
    {"swiglu", "--swiglu"},
    {"disable_bias_linear", "--disable-bias-linear"},
    {"untie_embeddings_and_output_weights", "--untie-embeddings-and-output-weights"},
    {"num_query_groups", "--group-query-attention --num-query-groups"},
};

// Megatron's print_datetime / checkpoint messages: local time with microseconds.
std::string timestamp_now() {
  const auto now = std::chrono::system_clock::now();
  const auto microseconds =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  return common::format_local_time(std::chrono::system_clock::to_time_t(now)) +
         fmt::format(".{:06d}", microseconds);
}

json schedule_json(const LearningRateScheduler& scheduler) {
  const LearningRateSchedule& s = scheduler.schedule();
  return {{"max_lr", s.max_lr},
          {"min_lr", s.min_lr},
          {"init_lr", s.init_lr},
          {"warmup_steps", s.warmup_steps},
          {"decay_steps", s.decay_steps},
          {"decay_style", common::enum_name(s.decay_style)},
          {"wsd_decay_steps", s.wsd_decay_steps},
          {"wsd_decay_style", common::enum_name(s.wsd_decay_style)},
          {"start_weight_decay", s.start_weight_decay},
          {"end_weight_decay", s.end_weight_decay},
          {"weight_decay_increment_steps", s.weight_decay_increment_steps},
          {"weight_decay_increment_style", common::enum_name(s.weight_decay_increment_style)},
          {"num_steps", scheduler.num_steps()}};
}

std::string value_text(const json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// "--hidden-size 2048"; a switch (a boolean, set) is its flag alone.
std::string flag_text(const char* flag, const json& value) {
  return value.is_boolean() ? std::string(flag) : fmt::format("{} {}", flag, value_text(value));
}

// The shape flags whose value in the checkpoint's saved arguments differs from the current
// one: "--hidden-size 2048" as the checkpoint has it, and as the flags have it now; and the
// same as the launcher's config settings ("training.model.hidden_size=2048"), a switch that is
// off included ("training.model.activation=gelu"), for a command the launcher rendered.
struct FlagDifferences {
  std::vector<std::string> checkpoint, current;
  std::vector<std::string> checkpoint_settings, current_settings;
};
// `vocabulary_fits`: the embedding and output tensors have the checkpoint's shape, so the
// tokenizer and vocabulary flags (which only set their row count, the padded vocabulary) are
// not named even where they differ: a model imported from Hugging Face is saved with the
// NullTokenizer, and continues training with the SentencePiece model it was made with.
FlagDifferences shape_flag_differences(const json& saved, const json& current,
                                       const std::vector<std::string>& command_line,
                                       bool vocabulary_fits) {
  // An unset value (0: GPT-2's tokenizer knows its vocabulary; false: a switch not given) is
  // no flag to pass.
  auto is_set = [](const json& value) {
    return !value.is_null() && !(value.is_number() && value.get<double>() == 0) &&
           !(value.is_boolean() && !value.get<bool>());
  };
  FlagDifferences differences;
  for (const auto& row : kShapeFlags) {
    if (!saved.contains(row.key)) continue;
    const json& value = saved[row.key];
    const json current_value = current.contains(row.key) ? current[row.key] : json();
    if (value == current_value) continue;
    const std::string key = row.key;
    if (vocabulary_fits && (key == "tokenizer_type" || key == "vocab_size" ||
                            key == "make_vocab_size_divisible_by")) {
      continue;
    }
    // --ffn-hidden-size defaults to 4 × --hidden-size: no need to name it when the checkpoint
    // has the default and the command line does not set it.
    if (std::string(row.key) == "ffn_hidden_size" && saved.contains("hidden_size") &&
        saved["hidden_size"].is_number_integer() && value.is_number_integer() &&
        value.get<int64_t>() % 4 == 0 &&
        value.get<int64_t>() / 4 == saved["hidden_size"].get<int64_t>() &&
        std::find(command_line.begin(), command_line.end(), "--ffn-hidden-size") ==
            command_line.end()) {
      continue;
    }
    if (is_set(value)) differences.checkpoint.push_back(flag_text(row.flag, value));
    if (is_set(current_value)) differences.current.push_back(flag_text(row.flag, current_value));
    // A flag no config key renders is named as the flag.
    const auto add_setting = [&](const json& side, std::vector<std::string>& settings) {
      if (!is_set(side) && !side.is_boolean()) return;
      const std::string setting = common::nemo_settings_for_flag(row.flag, value_text(side));
      if (!setting.empty()) {
        settings.push_back(setting);
      } else if (is_set(side)) {
        settings.push_back(flag_text(row.flag, side) + " (a pretrain_gpt flag no config key sets)");
      }
    };
    add_setting(value, differences.checkpoint_settings);
    add_setting(current_value, differences.current_settings);
  }
  return differences;
}

bool is_optimizer_tensor(const std::string& name) { return name.starts_with("optimizer."); }

int64_t saved_group_size(const CheckpointMetadata& metadata, const char* group) {
  return metadata.has(group) ? metadata.get<int64_t>(metadata.section(group), "size") : 1;
}

// The checkpoint_util command that reshards the checkpoint for a run of `tensor_parallel` ×
// `pipeline_parallel`: the target pipeline size is named unless both sides have one stage (the
// default target is 1), and the current run's --make-vocab-size-divisible-by when it is not the
// checkpoint's, so that the resharded vocabulary is padded as this run pads it.
std::string resharding_command(const CheckpointMetadata& metadata, int64_t tensor_parallel,
                               int64_t pipeline_parallel, const CheckpointLoadOptions& options) {
  std::string command = fmt::format("checkpoint_util --load {} --save NEWDIR "
                                    "--target-tensor-parallel-size {}",
                                    options.directory.string(), tensor_parallel);
  if (pipeline_parallel > 1 || saved_group_size(metadata, "pipeline_parallel") > 1) {
    command += fmt::format(" --target-pipeline-parallel-size {}", pipeline_parallel);
  }
  const char* divisor_key = "make_vocab_size_divisible_by";
  if (metadata.has("arguments") && metadata.section("arguments").contains(divisor_key) &&
      options.arguments.contains(divisor_key) &&
      metadata.section("arguments")[divisor_key] != options.arguments[divisor_key]) {
    command += " --make-vocab-size-divisible-by " + value_text(options.arguments[divisor_key]);
  }
  return command;
}

// The tensor-parallel size a checkpoint was saved with (1 for files from before the field) must
// be the model's: its files hold that many shards of every divided tensor. The refusal gives
// the resharding command in full, for this run's tensor- and pipeline-parallel sizes.
void check_tensor_parallel_size(const CheckpointMetadata& metadata, int64_t size,
                                int64_t pipeline_parallel, const fs::path& file,
                                const CheckpointLoadOptions& options) {
  const int64_t saved = saved_group_size(metadata, "tensor_parallel");
  if (saved == size) return;
  const int64_t saved_pipeline = saved_group_size(metadata, "pipeline_parallel");
  common::fail("checkpoint {} was saved with --tensor-model-parallel-size {} (its shards are "
               "{}..{}); this run has --tensor-model-parallel-size {}. Train on with {}, or "
               "reshard it into a new directory and load that: {}, then --load NEWDIR",
               file.string(), saved, checkpoint_rank_directory_name(0, 0, saved_pipeline),
               checkpoint_rank_directory_name(saved - 1, saved_pipeline - 1, saved_pipeline),
               size, saved, resharding_command(metadata, size, pipeline_parallel, options));
}

// The same for the pipeline-parallel size (1 for files from before the field).
void check_pipeline_parallel_size(const CheckpointMetadata& metadata, int64_t tensor_parallel,
                                  int64_t size, const fs::path& file,
                                  const CheckpointLoadOptions& options) {
  const int64_t saved = saved_group_size(metadata, "pipeline_parallel");
  if (saved == size) return;
  common::fail("checkpoint {} was saved with --pipeline-model-parallel-size {}; this run has "
               "--pipeline-model-parallel-size {}. Train on with {}, or reshard it into a new "
               "directory and load that: {}, then --load NEWDIR",
               file.string(), saved, size, saved,
               resharding_command(metadata, tensor_parallel, size, options));
}

// Both: the checkpoint's layout must be this run's (its tensor-parallel `group`, its `stages`).
void check_saved_layout(const CheckpointMetadata& metadata, const Communicator& group,
                        const Communicator& stages, const fs::path& file,
                        const CheckpointLoadOptions& options) {
  check_tensor_parallel_size(metadata, group.size(), stages.size(), file, options);
  check_pipeline_parallel_size(metadata, group.size(), stages.size(), file, options);
}

// One error listing every parameter whose shape differs (or that only one side has), and the
// flags from the checkpoint's arguments that would make the model fit.
void check_parameter_shapes(const ShardFile& reader, const CheckpointMetadata& metadata,
                            const GptModel<float>& model, const CheckpointLoadOptions& options) {
  struct Row {
    std::string name, checkpoint, current;
  };
  std::vector<Row> rows;
  size_t parameters_in_checkpoint = 0;
  for (const auto& tensor : model.tensors()) {
    const std::vector<int64_t>* shape = reader.shape(tensor.name);
    if (shape == nullptr) {
      rows.push_back({tensor.name, "not in the checkpoint", format_python_shape(tensor.shape)});
    } else if (*shape != tensor.shape) {
      rows.push_back({tensor.name, format_python_shape(*shape), format_python_shape(tensor.shape)});
    }
  }
  for (const std::string& name : reader.tensor_names()) {
    if (is_optimizer_tensor(name)) continue;
    ++parameters_in_checkpoint;
    bool in_model = false;
    for (const auto& tensor : model.tensors()) in_model = in_model || tensor.name == name;
    if (!in_model)
      rows.push_back({name, format_python_shape(*reader.shape(name)), "not in the model"});
  }
  if (rows.empty()) return;

  size_t name_width = std::string("tensor").size(), shape_width = std::string("checkpoint").size();
  for (const auto& row : rows) {
    name_width = std::max(name_width, row.name.size());
    shape_width = std::max(shape_width, row.checkpoint.size());
  }
  std::string message = fmt::format(
      "checkpoint {} does not fit the model the current flags describe ({} parameter tensors "
      "there, {} in the model; {} differ):\n",
      reader.path().string(), parameters_in_checkpoint, model.tensors().size(), rows.size());
  message += fmt::format("  {:<{}}  {:<{}}  {}\n", "tensor", name_width, "checkpoint", shape_width,
                         "current");
  for (size_t i = 0; i < rows.size() && i < kMismatchRowsShown; ++i) {
    message += fmt::format("  {:<{}}  {:<{}}  {}\n", rows[i].name, name_width, rows[i].checkpoint,
                           shape_width, rows[i].current);
  }
  if (rows.size() > kMismatchRowsShown) {
    message += fmt::format("  ... and {} more\n", rows.size() - kMismatchRowsShown);
  }
  const bool vocabulary_fits = std::none_of(rows.begin(), rows.end(), [](const Row& row) {
    return row.name == "embedding.word_embeddings.weight" || row.name == "output_layer.weight";
  });
  const FlagDifferences flags = shape_flag_differences(
      metadata.section("arguments"), options.arguments, options.command_line, vocabulary_fits);
  if (options.name_config_keys && !flags.checkpoint_settings.empty()) {
    // The launcher rendered the flags: the user sets keys, not flags.
    message += fmt::format(
        "The checkpoint was saved with {}; set {} (instead of {}) to load it: the launcher "
        "renders those flags from these config keys.",
        flags.checkpoint.empty() ? std::string("the defaults")
                                 : fmt::format("{}", fmt::join(flags.checkpoint, " ")),
        fmt::join(flags.checkpoint_settings, " "),
        flags.current_settings.empty() ? std::string("the defaults")
                                       : fmt::format("{}", fmt::join(flags.current_settings, " ")));
  } else if (flags.checkpoint.empty()) {
    message += "The checkpoint's saved arguments match the current ones in every shape flag; it "
               "was written by a model with other tensors (see its arguments in the metadata).";
  } else {
    message += fmt::format("The checkpoint was saved with {}; pass {} (instead of {}) to load it.",
                           fmt::join(flags.checkpoint, " "),
                           flags.checkpoint.size() == 1 ? "this flag" : "these flags",
                           flags.current.empty() ? std::string("the defaults")
                                                 : fmt::format("{}", fmt::join(flags.current, " ")));
  }
  throw common::Error(message);
}

// A common::Error when the file has no tensor `name`.
void require_tensor(const ShardFile& reader, const std::string& name, const char* missing_hint) {
  if (reader.shape(name) == nullptr) {
    common::fail("checkpoint {} has no tensor '{}'{}", reader.path().string(), name, missing_hint);
  }
}

void read_tensor(const ShardFile& reader, const std::string& name, std::span<float> destination,
                 const char* missing_hint) {
  require_tensor(reader, name, missing_hint);
  reader.read(name, destination);
}

bool overlaps(const ShardRange& a, const ShardRange& b) {
  return std::max(a.offset, b.offset) < std::min(a.offset + a.numel, b.offset + b.numel);
}

// The part of `wanted` (elements of a flat buffer) that tensor `name` holds, a tensor of
// elements [held.offset, held.offset + held.numel) of that buffer, into its place in
// `destination` (wanted.numel values): read in place when the whole tensor is wanted, else
// through `staged`. Nothing when the two do not overlap.
void read_overlap(const ShardFile& reader, const std::string& name, const ShardRange& held,
                  const ShardRange& wanted, std::span<float> destination,
                  std::vector<float>& staged) {
  if (!overlaps(held, wanted)) return;
  const int64_t begin = std::max(held.offset, wanted.offset);
  const int64_t end = std::min(held.offset + held.numel, wanted.offset + wanted.numel);
  const auto into = destination.subspan(static_cast<size_t>(begin - wanted.offset),
                                        static_cast<size_t>(end - begin));
  if (begin == held.offset && end == held.offset + held.numel) {
    reader.read(name, into);
    return;
  }
  staged.resize(static_cast<size_t>(held.numel));
  reader.read(name, staged);
  std::copy_n(staged.begin() + (begin - held.offset), end - begin, into.begin());
}

// The moments of elements `range` of the flat buffer from a file that holds them by tensor
// (optimizer.exp_avg.<name>, ...): each tensor overlapping the range read, and its overlap kept.
void read_named_moments(const ShardFile& reader, const GptModel<float>& model,
                        const ShardRange& range, std::span<float> exp_avg,
                        std::span<float> exp_avg_sq) {
  const char* hint = " (saved with --no-save-optim? specify --no-load-optim)";
  std::vector<float> staged;
  for (const auto& tensor : model.tensors()) {
    const ShardRange held{tensor.offset, tensor.numel};
    if (!overlaps(held, range)) continue;  // not a tensor of the range: not looked up
    for (const auto& [prefix, destination] :
         {std::pair{kExpAvgPrefix, exp_avg}, std::pair{kExpAvgSqPrefix, exp_avg_sq}}) {
      // (ShardFile::read refuses a tensor of another element count than its parameter's.)
      const std::string name = prefix + tensor.name;
      require_tensor(reader, name, hint);
      read_overlap(reader, name, held, range, destination, staged);
    }
  }
}

// Megatron's OptimizerParamScheduler.load_state_dict: each schedule value must match the
// checkpoint's unless --override-opt_param-scheduler (keep the flags') or
// --use-checkpoint-opt_param-scheduler (take the checkpoint's); num_steps is loaded always.
// The schedule a checkpoint's "opt_param_scheduler" section holds (the fields `base` has that it
// does not keep stay base's).
LearningRateSchedule saved_schedule(const CheckpointMetadata& metadata, const json& saved,
                                    const fs::path& file, LearningRateSchedule base = {}) {
  LearningRateSchedule from_checkpoint = base;
  from_checkpoint.max_lr = metadata.get<double>(saved, "max_lr");
  from_checkpoint.min_lr = metadata.get<double>(saved, "min_lr");
  from_checkpoint.init_lr = metadata.get<double>(saved, "init_lr");
  from_checkpoint.warmup_steps = metadata.get<double>(saved, "warmup_steps");
  from_checkpoint.decay_steps = metadata.get<int64_t>(saved, "decay_steps");
  // A style is one of its names (lr_scheduler.hpp); another is an error naming the file.
  auto style = [&]<typename Style>(Style& target, const char* key, const char* flag) {
    target = common::enum_from_name_or_fail<Style>(
        metadata.get<std::string>(saved, key),
        fmt::format("checkpoint {}: opt_param_scheduler's {} ({})", file.string(), key, flag));
  };
  style(from_checkpoint.decay_style, "decay_style", "--lr-decay-style");
  from_checkpoint.wsd_decay_steps = metadata.get<int64_t>(saved, "wsd_decay_steps");
  style(from_checkpoint.wsd_decay_style, "wsd_decay_style", "--lr-wsd-decay-style");
  from_checkpoint.start_weight_decay = metadata.get<double>(saved, "start_weight_decay");
  from_checkpoint.end_weight_decay = metadata.get<double>(saved, "end_weight_decay");
  from_checkpoint.weight_decay_increment_steps =
      metadata.get<int64_t>(saved, "weight_decay_increment_steps");
  style(from_checkpoint.weight_decay_increment_style, "weight_decay_increment_style",
        "--weight-decay-incr-style");
  return from_checkpoint;
}

void restore_scheduler(const CheckpointMetadata& metadata, const CheckpointLoadOptions& options,
                       LearningRateScheduler& scheduler, std::ostream& out, const fs::path& file) {
  const json& saved = metadata.section("opt_param_scheduler");
  LearningRateSchedule current = scheduler.schedule();
  const LearningRateSchedule from_checkpoint = saved_schedule(metadata, saved, file, current);
  const int64_t num_steps = metadata.get<int64_t>(saved, "num_steps");

  struct Difference {
    std::string what, checkpoint, flags;
  };
  std::vector<Difference> differences;
  auto shown = [](const auto& value) -> std::string {
    if constexpr (std::is_enum_v<std::decay_t<decltype(value)>>) {
      return std::string(common::enum_name(value));
    } else {
      return fmt::format("{}", value);
    }
  };
  auto compare = [&](const char* what, const auto& checkpoint_value, const auto& flag_value) {
    if (checkpoint_value != flag_value) {
      differences.push_back({what, shown(checkpoint_value), shown(flag_value)});
    }
  };
  compare("learning rate (--lr)", from_checkpoint.max_lr, current.max_lr);
  compare("minimum learning rate (--min-lr)", from_checkpoint.min_lr, current.min_lr);
  compare("warmup initial learning rate (--lr-warmup-init)", from_checkpoint.init_lr, current.init_lr);
  compare("warmup samples (--lr-warmup-iters × --global-batch-size)", from_checkpoint.warmup_steps,
          current.warmup_steps);
  compare("decay samples (--lr-decay-iters × --global-batch-size)", from_checkpoint.decay_steps,
          current.decay_steps);
  compare("decay style (--lr-decay-style)", from_checkpoint.decay_style, current.decay_style);
  compare("WSD decay samples (--lr-wsd-decay-iters × --global-batch-size, or --lr-wsd-decay-samples)",
          from_checkpoint.wsd_decay_steps, current.wsd_decay_steps);
  compare("WSD decay style (--lr-wsd-decay-style)", from_checkpoint.wsd_decay_style,
          current.wsd_decay_style);
  compare("start weight decay (--start-weight-decay)", from_checkpoint.start_weight_decay,
          current.start_weight_decay);
  compare("end weight decay (--end-weight-decay)", from_checkpoint.end_weight_decay,
          current.end_weight_decay);
  compare("weight-decay increment samples", from_checkpoint.weight_decay_increment_steps,
          current.weight_decay_increment_steps);
  compare("weight-decay increment style (--weight-decay-incr-style)",
          from_checkpoint.weight_decay_increment_style, current.weight_decay_increment_style);

  if (options.use_checkpoint_opt_param_scheduler) {
    for (const auto& difference : differences) {
      out << fmt::format(" > using checkpoint value {} for {}\n", difference.checkpoint,
                         difference.what);
    }
    scheduler = LearningRateScheduler(from_checkpoint);
  } else if (!options.override_opt_param_scheduler && !differences.empty()) {
    std::string message = fmt::format(
        "checkpoint {}: the learning-rate schedule of the flags differs from the checkpoint's:\n",
        file.string());
    for (const auto& difference : differences) {
      message += fmt::format("  {}: checkpoint {}, flags {}\n", difference.what,
                             difference.checkpoint, difference.flags);
    }
    message += "Pass the checkpoint's values, or --use-checkpoint-opt_param-scheduler to continue "
               "the checkpoint's schedule, or --override-opt_param-scheduler to continue with the "
               "flags' schedule (Megatron's OptimizerParamScheduler check).";
    throw common::Error(message);
  }
  scheduler.set_num_steps(num_steps);
}

// Megatron's MixedPrecisionOptimizer.load_state_dict for the grad scaler, with its warnings.
void restore_loss_scaler(const CheckpointMetadata& metadata, LossScaler& scaler,
                         std::ostream& out) {
  const json& optimizer = metadata.section("optimizer");
  if (!optimizer.contains("grad_scaler")) {
    if (scaler.dynamic()) {
      out << "***WARNING*** found an old checkpoint, will not load grad scaler ...\n";
    }
    return;
  }
  if (!scaler.enabled()) {
    out << "***WARNING*** fould the grad scaler in the checkpoint but it is None in the class. "
           "Skipping loading grad scaler ...\n";
    return;
  }
  const json& saved = optimizer.at("grad_scaler");
  scaler.restore({.scale = metadata.get<double>(saved, "scale"),
                  .growth_tracker = metadata.get<int64_t>(saved, "growth_tracker"),
                  .hysteresis_tracker = metadata.get<int64_t>(saved, "hysteresis_tracker")});
}

// The optimizer's hyperparameters come from the flags (the scheduler sets the rate anyway);
// a change from the checkpoint's is worth a line, since torch would have restored them.
void note_optimizer_changes(const CheckpointMetadata& metadata, const AdamW& optimizer, std::ostream& out) {
  const json& saved = metadata.section("optimizer");
  const AdamWConfig& current = optimizer.config();
  const std::pair<const char*, double> values[] = {{"adam_beta1", current.beta1},
                                                   {"adam_beta2", current.beta2},
                                                   {"adam_eps", current.eps},
                                                   {"weight_decay", current.weight_decay}};
  for (const auto& [key, value] : values) {
    const double checkpoint_value = metadata.get<double>(saved, key);
    if (checkpoint_value != value) {
      out << fmt::format(" > {} is {} in the checkpoint and {} on the command line: using {}\n",
                         key, checkpoint_value, value, value);
    }
  }
}

// Removes what a killed save left behind: DIR/iter_XXXXXXX.tmp.<pid> (a directory being
// written), DIR/iter_XXXXXXX.old.<pid> (one being replaced) and the tracker's temporary file
// (latest_checkpointed_iteration.txt.tmp-<pid>-XXXXXX, durable_file.hpp; .tmp.<pid> from
// older versions), when process <pid> no longer runs (or is this process). None of them is
// ever tracked.
void remove_unfinished_saves(const fs::path& directory, std::ostream& out) {
  static const std::regex kLeftover(
      R"(^(?:(?:iter_\d{7,}|release|latest_checkpointed_iteration\.txt)\.(?:tmp|old)\.(\d+))"
      R"(|latest_checkpointed_iteration\.txt\.tmp-(\d+)-[A-Za-z0-9]{6})$)");
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    std::smatch match;
    if (!std::regex_match(name, match, kLeftover)) continue;
    long pid = 0;
    const std::string pid_text = match[1].matched ? match[1].str() : match[2].str();
    std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
    const bool owner_gone = pid == static_cast<long>(::getpid()) ||
                            (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
    if (!owner_gone) continue;
    std::error_code remove_error;
    fs::remove_all(entry.path(), remove_error);
    if (!remove_error) {
      out << fmt::format(" > removed {}, left by an interrupted save\n", entry.path().string());
    }
  }
}

// Puts the finished temporary directory in place of `final_directory`. A directory of the same
// iteration already there (saving an iteration again, e.g. after --finetune) is swapped out
// atomically with renameat2(RENAME_EXCHANGE) where the file system has it.
void publish_directory(const fs::path& temporary, const fs::path& final_directory) {
  if (!fs::exists(final_directory)) {
    common::rename_path(temporary, final_directory);
    return;
  }
  if (::renameat2(AT_FDCWD, temporary.c_str(), AT_FDCWD, final_directory.c_str(),
                  RENAME_EXCHANGE) == 0) {
    common::fsync_directory(final_directory.parent_path());
    fs::remove_all(temporary);  // now the old directory
    return;
  }
  // No atomic exchange here: move the old one aside first. Only a crash between these two
  // renames, while the tracker names this very iteration, leaves nothing to load.
  fs::path old = final_directory;
  old += ".old." + std::to_string(::getpid());
  common::rename_path(final_directory, old);
  common::rename_path(temporary, final_directory);
  common::fsync_directory(final_directory.parent_path());
  fs::remove_all(old);
}

}  // namespace

fs::path checkpoint_tracker_path(const fs::path& directory) { return directory / kTrackerName; }

fs::path save_lock_path(const fs::path& directory) { return directory / "save.lock"; }

common::ExclusiveFileLock lock_save_directory(const fs::path& directory) {
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) {
    common::fail("--save {}: cannot create the directory: {}", directory.string(), error.message());
  }
  common::LockHolder holder;
  auto lock = common::ExclusiveFileLock::try_lock(save_lock_path(directory), holder);
  if (!lock) {
    common::fail("--save {} is in use by another run (pid {} on {} holds {}): two runs saving into "
                 "one directory would interleave their checkpoints; wait for it to end, or pass "
                 "another --save", directory.string(), holder.pid.empty() ? "unknown" : holder.pid,
                 holder.host.empty() ? "an unknown host" : holder.host,
                 save_lock_path(directory).string());
  }
  return std::move(*lock);
}

void check_release_destination(const fs::path& directory, bool replace_training_tracker) {
  const auto tracked = read_checkpoint_tracker(directory);
  if (!tracked || tracked->release || replace_training_tracker) return;
  common::fail("--save {}: its tracker {} names training iteration {}; importing would point it "
               "to the release, so that --load {} would start from the imported weights at "
               "iteration 0. Pass another --save directory, or --replace-training-tracker to do "
               "it anyway (the iter_* directories are kept)", directory.string(),
               checkpoint_tracker_path(directory).string(), tracked->iteration, directory.string());
}

fs::path checkpoint_iteration_directory(const fs::path& directory, int64_t iteration) {
  return directory / fmt::format("iter_{:07d}", iteration);
}

std::string checkpoint_rank_directory_name(int64_t tensor_parallel_rank, int64_t pipeline_rank,
                                           int64_t pipeline_parallel) {
  if (pipeline_parallel == 1) return fmt::format("mp_rank_{:02d}", tensor_parallel_rank);
  return fmt::format("mp_rank_{:02d}_{:03d}", tensor_parallel_rank, pipeline_rank);
}

fs::path checkpoint_file_path(const fs::path& directory, int64_t iteration,
                              int64_t tensor_parallel_rank, int64_t pipeline_rank,
                              int64_t pipeline_parallel) {
  return checkpoint_iteration_directory(directory, iteration) /
         checkpoint_rank_directory_name(tensor_parallel_rank, pipeline_rank, pipeline_parallel) /
         kFileName;
}

fs::path checkpoint_rank_file(const TrackedCheckpoint& tracked, int64_t tensor_parallel_rank,
                              int64_t pipeline_rank, int64_t pipeline_parallel) {
  return tracked.file.parent_path().parent_path() /
         checkpoint_rank_directory_name(tensor_parallel_rank, pipeline_rank, pipeline_parallel) /
         kFileName;
}

namespace {

// mp_rank_00's file, or mp_rank_00_000's where only that exists (a pipelined checkpoint).
fs::path first_rank_file(const fs::path& iteration_directory) {
  const fs::path unpipelined = iteration_directory / checkpoint_rank_directory_name(0) / kFileName;
  const fs::path pipelined =
      iteration_directory / checkpoint_rank_directory_name(0, 0, 2) / kFileName;
  return !fs::exists(unpipelined) && fs::exists(pipelined) ? pipelined : unpipelined;
}

}  // namespace

std::optional<TrackedCheckpoint> read_checkpoint_tracker(const fs::path& directory) {
  const fs::path tracker = checkpoint_tracker_path(directory);
  // A tracker holds a number or "release"; anything but a small regular file is refused.
  std::optional<std::string> contents =
      common::read_small_file_if_exists(tracker, "the checkpoint tracker");
  if (!contents) return std::nullopt;
  std::string text = std::move(*contents);
  const auto first = text.find_first_not_of(" \t\r\n");
  const auto last = text.find_last_not_of(" \t\r\n");
  text = first == std::string::npos ? "" : text.substr(first, last - first + 1);
  if (text == "release") {
    return TrackedCheckpoint{0, true, first_rank_file(directory / "release")};
  }
  int64_t iteration = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), iteration);
  if (error != std::errc() || end != text.data() + text.size() || iteration < 0) {
    common::fail("invalid metadata file {}: it holds '{}', expected an iteration number or "
                 "'release'", tracker.string(), text);
  }
  return TrackedCheckpoint{iteration, false,
                           first_rank_file(checkpoint_iteration_directory(directory, iteration))};
}

TrackedCheckpoint require_checkpoint(const fs::path& directory, std::string_view option,
                                     std::string_view remedy) {
  const auto tracked = read_checkpoint_tracker(directory);
  if (!tracked) {
    common::fail("{} {} holds no checkpoint: {} is missing ({})", option, directory.string(),
                 checkpoint_tracker_path(directory).string(), remedy);
  }
  if (!fs::is_regular_file(tracked->file)) {
    common::fail("{} {}: {} names {}, which does not exist ({})", option, directory.string(),
                 checkpoint_tracker_path(directory).string(), tracked->file.string(), remedy);
  }
  return *tracked;
}

namespace {

// Checkpoints are host files: a model or optimizer on host memory is read and written in place;
// one on a GPU passes through a host copy staged here, once per save or load.
struct HostMoments {
  std::vector<float> staged_exp_avg, staged_exp_avg_sq;
  std::span<float> exp_avg, exp_avg_sq;  // optimizer.numel() values each
  bool staged = false;
};

// The optimizer's moments as host spans; `current` copies the device's values in (a save),
// else the spans are to be filled and, when staged, copied back by the caller (a load).
HostMoments host_moments(const AdamW& optimizer, bool current) {
  HostMoments moments;
  if (optimizer.device().memory_kind() == MemoryKind::host) {
    const auto exp_avg = optimizer.exp_avg();
    const auto exp_avg_sq = optimizer.exp_avg_sq();
    moments.exp_avg = {const_cast<float*>(exp_avg.data()), exp_avg.size()};
    moments.exp_avg_sq = {const_cast<float*>(exp_avg_sq.data()), exp_avg_sq.size()};
    return moments;
  }
  moments.staged = true;
  moments.staged_exp_avg.resize(static_cast<size_t>(optimizer.numel()));
  moments.staged_exp_avg_sq.resize(static_cast<size_t>(optimizer.numel()));
  if (current) optimizer.copy_moments_to_host(moments.staged_exp_avg, moments.staged_exp_avg_sq);
  moments.exp_avg = moments.staged_exp_avg;
  moments.exp_avg_sq = moments.staged_exp_avg_sq;
  return moments;
}

struct HostState {
  std::vector<float> staged_parameters;
  std::span<float> parameters;
  bool parameters_staged = false;
  HostMoments moments;  // with an optimizer
};

// The parameters (and the moments, with an optimizer) as host spans; `current` copies the
// device's values in (a save), else the spans are to be filled (a load).
HostState host_state(const GptModel<float>& model, const AdamW* optimizer, bool current) {
  HostState state;
  const auto count = static_cast<size_t>(model.parameter_buffer().numel);
  if (model.parameter_buffer().on == MemoryKind::host) {
    const auto in_place = model.parameters();
    state.parameters = {const_cast<float*>(in_place.data()), in_place.size()};
  } else {
    state.parameters_staged = true;
    state.staged_parameters.resize(count);
    if (current) model.copy_parameters_to_host(state.staged_parameters);
    state.parameters = state.staged_parameters;
  }
  if (optimizer != nullptr) state.moments = host_moments(*optimizer, current);
  return state;
}

// The steps of a crash-safe save (docs/checkpoints.md, "Crash safety") that one process, the
// lead, takes: begin_save prints Megatron's line, cleans up after interrupted saves and makes
// the temporary directory; write_rank_file writes one (tensor-parallel rank, stage)'s file into
// it; finish_save publishes the directory and, last, moves the tracker.
std::string saving_message(const fs::path& directory, int64_t iteration, bool release,
                           CheckpointFormat format) {
  return release ? fmt::format("[{}] saving release checkpoint to {} in {} format\n",
                               timestamp_now(), directory.string(), common::enum_name(format))
                 : fmt::format("[{}] saving checkpoint at iteration {:7d} to {} in {} format\n",
                               timestamp_now(), iteration, directory.string(),
                               common::enum_name(format));
}

fs::path final_save_directory(const fs::path& directory, int64_t iteration, bool release) {
  return release ? directory / "release" : checkpoint_iteration_directory(directory, iteration);
}

// Prints the saving line, makes DIR, removes leftovers of interrupted saves, and makes (empty)
// the temporary directory, named after this process's pid, that the rank files go into.
fs::path begin_save(const fs::path& directory, int64_t iteration, bool release, std::ostream& out,
                    CheckpointFormat format = CheckpointFormat::native) {
  out << saving_message(directory, iteration, release, format);
  out.flush();
  fs::create_directories(directory);
  remove_unfinished_saves(directory, out);
  fs::path temporary = final_save_directory(directory, iteration, release);
  temporary += ".tmp." + std::to_string(::getpid());
  fs::remove_all(temporary);
  fs::create_directories(temporary);
  return temporary;
}

// Makes the rank's directory, has `write` write its file there, and syncs the directory.
void write_rank_directory(const fs::path& temporary, const std::string& rank_directory_name,
                          const std::function<void(const fs::path& rank_directory)>& write) {
  const fs::path rank_directory = temporary / rank_directory_name;
  fs::create_directories(rank_directory);
  write(rank_directory);
  common::fsync_directory(rank_directory);
}

void write_rank_file(const fs::path& temporary, const std::string& rank_directory_name,
                     const char* file_name, const json& metadata,
                     std::span<const CheckpointTensor> tensors) {
  write_rank_directory(temporary, rank_directory_name, [&](const fs::path& rank_directory) {
    write_checkpoint_file(rank_directory / file_name, metadata, tensors);
  });
}

// The distributed optimizer's moments of the whole buffer on data-parallel rank 0, each member's
// range sent there (Megatron's get_parameter_state_dp_zero gathers them alike); the other
// members get nothing back.
HostMoments gather_moments(const AdamW& optimizer, Communicator& data_parallel,
                           int64_t parameter_count) {
  HostMoments own = host_moments(optimizer, true);
  if (data_parallel.rank() != 0) {
    data_parallel.send(host_view(own.exp_avg), 0);
    data_parallel.send(host_view(own.exp_avg_sq), 0);
    return {};
  }
  HostMoments whole;
  whole.staged = true;
  whole.staged_exp_avg.resize(static_cast<size_t>(parameter_count));
  whole.staged_exp_avg_sq.resize(static_cast<size_t>(parameter_count));
  for (int64_t member = 0; member < data_parallel.size(); ++member) {
    const ShardRange range = shard_range(parameter_count, data_parallel.size(), member);
    const auto offset = static_cast<size_t>(range.offset);
    const auto numel = static_cast<size_t>(range.numel);
    const std::span<float> exp_avg = std::span(whole.staged_exp_avg).subspan(offset, numel);
    const std::span<float> exp_avg_sq = std::span(whole.staged_exp_avg_sq).subspan(offset, numel);
    if (member == 0) {
      if (own.exp_avg.size() != numel) {
        common::fail("internal error: the distributed optimizer holds {} moments for a range of {}",
                     own.exp_avg.size(), numel);
      }
      std::copy(own.exp_avg.begin(), own.exp_avg.end(), exp_avg.begin());
      std::copy(own.exp_avg_sq.begin(), own.exp_avg_sq.end(), exp_avg_sq.begin());
    } else {
      data_parallel.receive(host_view(exp_avg), member);
      data_parallel.receive(host_view(exp_avg_sq), member);
    }
  }
  whole.exp_avg = whole.staged_exp_avg;
  whole.exp_avg_sq = whole.staged_exp_avg_sq;
  return whole;
}

// One data-parallel rank's distrib_optim file: its range of the moments, flat, with the range
// in the metadata so that a load checks it is the file it expects.
void write_moments_file(const fs::path& temporary, const std::string& rank_directory_name,
                        const TrainingProgress& progress, const AdamW& optimizer,
                        const Communicator& data_parallel, const ShardRange& range,
                        int64_t parameter_count) {
  if (optimizer.numel() != range.numel) {
    common::fail("internal error: the distributed optimizer holds {} moments for a range of {}",
                 optimizer.numel(), range.numel);
  }
  const HostMoments moments = host_moments(optimizer, true);
  const std::span<const float> exp_avg = moments.exp_avg, exp_avg_sq = moments.exp_avg_sq;
  const json metadata = {
      {"format", "megatron-native distributed optimizer state"},
      {"iteration", progress.iteration},
      {"data_parallel", {{"size", data_parallel.size()}, {"rank", data_parallel.rank()}}},
      {"parameter_count", parameter_count},
      {"range", {{"offset", range.offset}, {"numel", range.numel}}},
  };
  const std::vector<CheckpointTensor> tensors = {
      {kMomentExpAvg, {range.numel}, exp_avg}, {kMomentExpAvgSq, {range.numel}, exp_avg_sq}};
  const std::string name = distributed_optimizer_file_name(data_parallel.rank());
  write_rank_file(temporary, rank_directory_name, name.c_str(), metadata, tensors);
}

// Once every rank's file is written and synced: the temporary directory becomes the
// iteration's, then the tracker names it.
void finish_save(const fs::path& directory, const fs::path& temporary, int64_t iteration,
                 bool release, int64_t tensor_parallel, std::ostream& out,
                 int64_t pipeline_parallel = 1) {
  common::fsync_directory(temporary);
  publish_directory(temporary, final_save_directory(directory, iteration, release));
  common::fsync_directory(directory);
  common::write_text_file_atomically(checkpoint_tracker_path(directory),
                                     release ? std::string("release") : std::to_string(iteration));
  if (release) {
    out << fmt::format("  [{}] successfully saved release checkpoint to {} [ t 1/{}, p 1/{} ]\n",
                       timestamp_now(), directory.string(), tensor_parallel, pipeline_parallel);
  } else {
    out << fmt::format("  [{}] successfully saved checkpoint from iteration {:7d} to {} "
                       "[ t 1/{}, p 1/{} ]\n",
                       timestamp_now(), iteration, directory.string(), tensor_parallel,
                       pipeline_parallel);
  }
  out.flush();
}

// save_checkpoint and save_release_checkpoint: the optimizer and scheduler state is saved when
// both are given (and --no-save-optim is not set); a release checkpoint goes to DIR/release
// and the tracker says "release".
void save_to(const CheckpointSaveOptions& options, const TrainingProgress& progress,
             const GptModel<float>& model, const AdamW* optimizer,
             const LearningRateScheduler* scheduler, bool release, std::ostream& out,
             const OptimizerShard* shard = nullptr) {
  const fs::path& directory = options.directory;
  const bool megatron_format =
      options.format == CheckpointFormat::torch || options.format == CheckpointFormat::torch_dist;
  if (options.format != CheckpointFormat::native && (!megatron_format || release)) {
    common::fail("internal error: a --ckpt-format {} save{}", common::enum_name(options.format),
                 release ? " of a release" : "");
  }
  const bool save_optim = !options.no_save_optim && optimizer != nullptr && scheduler != nullptr;
  // With the moments in ranges, every data-parallel rank writes its range's file; rank 0 of
  // the group also the model's. Without the optimizer state the other ranks have nothing to do.
  Communicator* data_parallel = shard != nullptr ? shard->data_parallel : nullptr;
  if (data_parallel != nullptr && !save_optim) {
    if (data_parallel->rank() != 0) return;
    data_parallel = nullptr;
    shard = nullptr;
  }
  const bool writes_model = data_parallel == nullptr || data_parallel->rank() == 0;
  // Megatron's format keeps the distributed optimizer's state in one file per model-parallel
  // rank, data-parallel rank 0's (distrib_optim.pt): the ranges are gathered there.
  const bool gathers_moments = shard != nullptr && megatron_format;
  HostMoments gathered;
  if (gathers_moments) {
    gathered = gather_moments(*optimizer, *data_parallel, shard->parameter_count);
  }
  // The writers: one per (tensor-parallel rank, pipeline stage) (the model's groups), the
  // first of which makes the directory, publishes it and moves the tracker; the others write
  // their file only.
  Communicator& writers = model.tensor_parallel_group();
  Communicator& stages = model.pipeline_parallel_group();
  const int64_t writer = writers.rank();
  const bool lead = writes_model && writer == 0 && stages.rank() == 0;
  // Everyone of the model-parallel group has passed: the tensor-parallel group of each stage,
  // then each pipeline (whose stage 0 passed only once its whole stage had); with ranges, each
  // data-parallel group first (whose rank 0 is of the model-parallel group).
  auto all_ranks_here = [&] {
    if (data_parallel != nullptr) data_parallel->barrier();
    if (!writes_model) return;
    writers.barrier();
    stages.barrier();
  };
  // The model's file, data-parallel rank 0's: the metadata and the tensors, whose spans point
  // into `host`.
  json metadata;
  std::vector<CheckpointTensor> tensors;
  HostState host;
  if (writes_model) {
    metadata = {
        {"format", "megatron-native checkpoint"},
        {"iteration", progress.iteration},
        {"consumed_train_samples", progress.consumed_train_samples},
        {"consumed_valid_samples", progress.consumed_valid_samples},
        {"padded_vocab_size", model.config().padded_vocab_size},
        {"tensor_parallel", {{"size", writers.size()}, {"rank", writer}}},
        {"pipeline_parallel", {{"size", stages.size()}, {"rank", stages.rank()}}},
        {"no_save_optim", !save_optim},
        {"no_save_rng", options.no_save_rng},
        {"arguments", options.arguments},
        {"args", options.args},
        {"command_line", options.command_line},
    };
    host = host_state(model, save_optim && shard == nullptr ? optimizer : nullptr, true);
    if (gathers_moments) host.moments = std::move(gathered);
    const std::span<const float> parameters = host.parameters;
    for (const auto& tensor : model.tensors()) {
      tensors.push_back({tensor.name, tensor.shape,
                         parameters.subspan(static_cast<size_t>(tensor.offset),
                                            static_cast<size_t>(tensor.numel))});
    }
    if (save_optim) {
      const AdamWConfig& config = optimizer->config();
      metadata["optimizer"] = {{"step", optimizer->steps_taken()}, {"adam_beta1", config.beta1},
                               {"adam_beta2", config.beta2},       {"adam_eps", config.eps},
                               {"weight_decay", config.weight_decay}};
      // Megatron's optimizer state_dict['grad_scaler'], present when the run has a scaler.
      if (const LossScaler& scaler = optimizer->loss_scaler(); scaler.enabled()) {
        const LossScaler::State state = scaler.state();
        metadata["optimizer"]["grad_scaler"] = {{"scale", state.scale},
                                                {"growth_tracker", state.growth_tracker},
                                                {"hysteresis_tracker", state.hysteresis_tracker}};
      }
      metadata["opt_param_scheduler"] = schedule_json(*scheduler);
      if (shard != nullptr && !gathers_moments) {
        metadata["optimizer"]["distributed"] = {{"data_parallel", data_parallel->size()},
                                                {"parameter_count", shard->parameter_count}};
      }
      // With ranges, the moments are in the distrib_optim files.
      if (shard == nullptr || gathers_moments) {
        for (const auto& tensor : model.tensors()) {
          const auto offset = static_cast<size_t>(tensor.offset);
          const auto numel = static_cast<size_t>(tensor.numel);
          tensors.push_back({kExpAvgPrefix + tensor.name, tensor.shape,
                             std::span<const float>(host.moments.exp_avg).subspan(offset, numel)});
          tensors.push_back({kExpAvgSqPrefix + tensor.name, tensor.shape,
                             std::span<const float>(host.moments.exp_avg_sq).subspan(offset, numel)});
        }
      }
    }
    if (!options.no_save_rng) {
      metadata["rng_state"] = {{"dropout_seed", model.dropout_seed()},
                               {"dropout_step", model.dropout_step()}};
    }
  }

  // Write under a temporary name (the lead's pid, shared with the writers), make it durable,
  // then publish it and, last, the tracker: only after every writer has written and synced.
  double lead_pid = ::getpid();  // a double: what a broadcast carries (exact below 2^53)
  fs::path temporary;
  if (lead) temporary = begin_save(directory, progress.iteration, release, out, options.format);
  // After the lead made the directory: to its stage, then down every pipeline, then to every
  // data-parallel group.
  if (writes_model) {
    if (stages.rank() == 0) writers.broadcast(host_view(std::span(&lead_pid, 1)), 0);
    stages.broadcast(host_view(std::span(&lead_pid, 1)), 0);
  }
  if (data_parallel != nullptr) data_parallel->broadcast(host_view(std::span(&lead_pid, 1)), 0);
  if (!lead) {
    temporary = final_save_directory(directory, progress.iteration, release);
    temporary += ".tmp." + std::to_string(static_cast<int64_t>(lead_pid));
  }
  const std::string rank_directory =
      checkpoint_rank_directory_name(writer, stages.rank(), stages.size());
  // What Megatron's file of this rank holds (--ckpt-format torch), or torch_dist's common.pt.
  const PipelineStage& place = model.pipeline_stage();
  const MegatronRankFileContents contents{
      .metadata = &metadata,
      .tensors = tensors,
      .args = options.megatron_args,
      .chunks = stage_layer_chunks(model.config().num_layers, place),
      .first_stage = place.first(),
      .last_stage = place.last(),
      .precision = recorded_mixed_precision(metadata),
      .spec = options.megatron_spec,
      .learning_rate = scheduler != nullptr ? scheduler->learning_rate() : 0.0,
      .weight_decay = scheduler != nullptr ? scheduler->weight_decay() : 0.0,
      .distributed_optimizer = shard != nullptr};
  if (writes_model && options.format == CheckpointFormat::torch) {
    write_rank_directory(temporary, rank_directory, [&](const fs::path& rank_directory) {
      write_megatron_rank_file(rank_directory / kMegatronCheckpointFile, contents);
    });
  } else if (writes_model && options.format == CheckpointFormat::torch_dist) {
    // One file per (stage, tensor-parallel rank) of the model-parallel group, numbered as
    // Megatron's global ranks of data-parallel rank 0 would be.
    write_megatron_dist_part(temporary, stages.rank() * writers.size() + writer,
                             {.metadata = &metadata,
                              .tensors = tensors,
                              .layout = model.tensors(),
                              .num_layers = model.config().num_layers,
                              .tensor_parallel_rank = writer,
                              .precision = contents.precision,
                              .spec = options.megatron_spec});
  } else if (writes_model) {
    write_rank_file(temporary, rank_directory, kFileName, metadata, tensors);
  }
  if (shard != nullptr && !gathers_moments) {
    write_moments_file(temporary, rank_directory, progress, *optimizer, *data_parallel,
                       shard->range, shard->parameter_count);
  }
  all_ranks_here();
  if (lead) {
    if (options.format == CheckpointFormat::torch_dist) {
      finish_megatron_dist_checkpoint(temporary, writers.size() * stages.size(), contents);
    }
    finish_save(directory, temporary, progress.iteration, release, writers.size(), out,
                stages.size());
  }
  all_ranks_here();  // the tracker has moved before any rank goes on
}

}  // namespace

MixedPrecision recorded_mixed_precision(const json& metadata) {
  if (!metadata.contains("args") || !metadata["args"].is_object()) return MixedPrecision::none;
  const json& args = metadata["args"];
  if (args.value("bf16", "") == "True") return MixedPrecision::bf16;
  if (args.value("fp16", "") == "True") return MixedPrecision::fp16;
  return MixedPrecision::none;
}

std::string distributed_optimizer_file_name(int64_t data_parallel_rank) {
  return fmt::format("distrib_optim_{:03d}.bin", data_parallel_rank);
}

void save_checkpoint(const CheckpointSaveOptions& options, const TrainingProgress& progress,
                     const GptModel<float>& model, const AdamW& optimizer,
                     const LearningRateScheduler& scheduler, std::ostream& out,
                     const OptimizerShard* shard) {
  if (shard != nullptr) {
    // The ranges are shard_range's: a load finds each file's range from the count alone.
    const ShardRange expected =
        shard->data_parallel == nullptr
            ? ShardRange{-1, -1}
            : shard_range(shard->parameter_count, shard->data_parallel->size(),
                          shard->data_parallel->rank());
    if (expected.offset != shard->range.offset || expected.numel != shard->range.numel) {
      common::fail("internal error: a distributed optimizer's save without its group or with "
                   "another range than shard_range's");
    }
  }
  save_to(options, progress, model, &optimizer, &scheduler, false, out, shard);
}

bool has_distributed_moments(const CheckpointMetadata& metadata) {
  return metadata.has("optimizer") && metadata.section("optimizer").contains("distributed");
}

void read_distributed_moments(const fs::path& file, const CheckpointMetadata& metadata,
                              int64_t buffer_numel, ShardRange wanted, std::span<float> exp_avg,
                              std::span<float> exp_avg_sq) {
  if (buffer_numel < 0 || wanted.offset < 0 || wanted.numel < 0 ||
      wanted.offset > buffer_numel - wanted.numel || std::ssize(exp_avg) != wanted.numel ||
      std::ssize(exp_avg_sq) != wanted.numel) {
    common::fail(
        "internal error: reading elements [{}, {}) of a buffer of {} into {} and {} "
        "values",
        wanted.offset, wanted.offset + wanted.numel, buffer_numel, exp_avg.size(),
        exp_avg_sq.size());
  }
  const json& distributed = metadata.section(metadata.section("optimizer"), "distributed");
  const auto members = metadata.get<int64_t>(distributed, "data_parallel");
  const auto count = metadata.get<int64_t>(distributed, "parameter_count");
  // The ranges are shard_range's of the whole buffer: another count would cut them elsewhere
  // and put every moment at another parameter.
  if (members < 1 || count != buffer_numel) {
    common::fail(
        "checkpoint {}: its distributed optimizer state covers {} parameters over {} "
        "data-parallel ranks, but this rank's model has {} parameters: the file does "
        "not belong to this model (or is corrupt); --no-load-optim loads its weights "
        "alone",
        file.string(), count, members, buffer_numel);
  }
  if (wanted.numel == 0) return;
  std::vector<float> staged;
  // Only the files holding part of `wanted` are opened: from the one holding its first element
  // to the one holding its last, whatever the number of ranks the metadata names.
  const int64_t first = shard_member_holding(count, members, wanted.offset);
  const int64_t last = shard_member_holding(count, members, wanted.offset + wanted.numel - 1);
  for (int64_t member = first; member <= last; ++member) {
    const ShardRange range = shard_range(count, members, member);
    if (!overlaps(range, wanted)) continue;  // an empty range: no file needed
    const fs::path path = file.parent_path() / distributed_optimizer_file_name(member);
    if (!fs::is_regular_file(path)) {
      common::fail("checkpoint {} was saved with the distributed optimizer over {} data-parallel "
                   "ranks, but {} (rank {}'s optimizer state) does not exist: the checkpoint "
                   "is incomplete; --no-load-optim loads its weights alone",
                   file.string(), members, path.string(), member);
    }
    const std::unique_ptr<ShardFile> opened = open_native_shard_file(path);
    const ShardFile& reader = *opened;
    const CheckpointMetadata shard(reader.metadata(), reader.path());
    const json& saved_range = shard.section("range");
    if (shard.get<int64_t>("parameter_count") != count ||
        shard.get<int64_t>(saved_range, "offset") != range.offset ||
        shard.get<int64_t>(saved_range, "numel") != range.numel) {
      common::fail("{} does not hold the range [{}, {}) of {} parameters that data-parallel rank "
                   "{} of {} holds in {}: the files of two checkpoints were mixed",
                   path.string(), range.offset, range.offset + range.numel, count, member, members,
                   file.string());
    }
    for (const auto& [name, destination] :
         {std::pair{kMomentExpAvg, exp_avg}, std::pair{kMomentExpAvgSq, exp_avg_sq}}) {
      const std::vector<int64_t>* shape = reader.shape(name);
      if (shape == nullptr || *shape != std::vector<int64_t>{range.numel}) {
        common::fail("{} has no tensor '{}' of shape ({},)", path.string(), name, range.numel);
      }
      read_overlap(reader, name, range, wanted, destination, staged);
    }
  }
}

void save_release_checkpoint(const CheckpointSaveOptions& options, const GptModel<float>& model,
                             std::ostream& out) {
  save_to(options, TrainingProgress{}, model, nullptr, nullptr, true, out);
}

namespace {

// What write_megatron_rank_file needs of a rank file that write_checkpoint_files writes in
// Megatron's format (MegatronFileFormat says where each part comes from). The caller keeps
// `file` until the file is written.
MegatronRankFileContents megatron_contents(const CheckpointRankFile& file,
                                           const MegatronFileFormat& megatron, int64_t stage,
                                           int64_t pipeline_parallel) {
  const fs::path source("the checkpoint being written");
  const CheckpointMetadata metadata(file.metadata, source);
  const CheckpointModelRecord record = read_model_record(metadata, source);
  const int64_t num_layers = record.model.num_layers;
  const PipelineStage place{
      .pipeline_parallel = pipeline_parallel,
      .rank = stage,
      .virtual_chunks = record.parallelism.virtual_pipeline_chunks(num_layers)};
  double learning_rate = 0, weight_decay = 0;
  if (metadata.has("opt_param_scheduler")) {
    const json& saved = metadata.section("opt_param_scheduler");
    LearningRateScheduler scheduler(saved_schedule(metadata, saved, source));
    scheduler.set_num_steps(metadata.get<int64_t>(saved, "num_steps"));
    learning_rate = scheduler.learning_rate();
    weight_decay = scheduler.weight_decay();
  }
  return {.metadata = &file.metadata,
          .tensors = file.tensors,
          .args = megatron.args(file.metadata),
          .chunks = stage_layer_chunks(num_layers, place),
          .first_stage = place.first(),
          .last_stage = place.last(),
          .precision = recorded_mixed_precision(file.metadata),
          .spec = megatron.spec,
          .learning_rate = learning_rate,
          .weight_decay = weight_decay};
}

}  // namespace

void write_checkpoint_files(
    const fs::path& directory, int64_t iteration, bool release, int64_t tensor_parallel,
    int64_t pipeline_parallel,
    const std::function<CheckpointRankFile(int64_t tensor_parallel_rank, int64_t pipeline_rank)>&
        make_rank_file,
    std::ostream& out, const MegatronFileFormat* megatron) {
  if (tensor_parallel < 1) {
    common::fail("a checkpoint has at least one tensor-parallel rank, got {}", tensor_parallel);
  }
  if (pipeline_parallel < 1) {
    common::fail("a checkpoint has at least one pipeline stage, got {}", pipeline_parallel);
  }
  const fs::path temporary =
      begin_save(directory, iteration, release, out,
                 megatron != nullptr ? CheckpointFormat::torch : CheckpointFormat::native);
  for (int64_t stage = 0; stage < pipeline_parallel; ++stage) {
    for (int64_t rank = 0; rank < tensor_parallel; ++rank) {
      const CheckpointRankFile file = make_rank_file(rank, stage);
      const std::string rank_directory =
          checkpoint_rank_directory_name(rank, stage, pipeline_parallel);
      if (megatron == nullptr) {
        write_rank_file(temporary, rank_directory, kFileName, file.metadata, file.tensors);
        continue;
      }
      const MegatronRankFileContents contents =
          megatron_contents(file, *megatron, stage, pipeline_parallel);
      write_rank_directory(temporary, rank_directory, [&](const fs::path& rank_path) {
        write_megatron_rank_file(rank_path / kMegatronCheckpointFile, contents);
      });
    }
  }
  finish_save(directory, temporary, iteration, release, tensor_parallel, out, pipeline_parallel);
}

CheckpointMetadata::CheckpointMetadata(const json& root, fs::path file)
    : root_(root), file_(std::move(file)) {}

const json& CheckpointMetadata::section(const char* key) const { return section(root_, key); }

bool CheckpointMetadata::has(const char* key) const {
  if (!root_.contains(key)) return false;
  // Present but not an object is a corrupt file, not an absent section (which would read as
  // "saved without its optimizer state" and the like).
  if (!root_[key].is_object()) wrong_type(root_, key);
  return true;
}

void CheckpointMetadata::missing(const char* key) const {
  common::fail("checkpoint {}: the metadata has no field '{}' (the file was not written by "
               "this backend's save_checkpoint)", file_.string(), key);
}

void CheckpointMetadata::wrong_type(const json& object, const char* key) const {
  common::fail("checkpoint {}: metadata field '{}' has the wrong type ({})", file_.string(), key,
               object[key].dump());
}

void CheckpointMetadata::not_an_integer(const json& object, const char* key,
                                        const std::string& lowest,
                                        const std::string& highest) const {
  common::fail("checkpoint {}: metadata field '{}' is not an integer from {} to {} ({})",
               file_.string(), key, lowest, highest, object[key].dump());
}

namespace {

// Why a file lacks a part of the state: what its metadata says under `key` (a Megatron file's
// reason, megatron_checkpoint.hpp), else `otherwise`.
std::string why_not_read(const json& metadata, const char* key, const char* otherwise) {
  return metadata.contains(key) && metadata[key].is_string() ? metadata[key].get<std::string>()
                                                             : std::string(otherwise);
}

// This rank's file of the tracked checkpoint, mp_rank_<tensor-parallel rank>[_<stage>]: ours, or
// a Megatron-LM checkpoint's model_optim_rng.pt, read at the layout it was saved with (another
// layout is refused with the command that reshards it, as one of ours is).
std::unique_ptr<ShardFile> open_rank_shard(const fs::path& directory,
                                           const TrackedCheckpoint& tracked,
                                           const Communicator& group, const Communicator& stages,
                                           const PipelineStage& stage,
                                           const CheckpointLoadOptions& options) {
  if (is_megatron_checkpoint(directory)) {
    const MegatronCheckpointLayout layout = read_megatron_layout(directory);
    // A torch_dist checkpoint stores every tensor whole: it is read at this run's layout, as
    // Megatron's dist-checkpoint load reshards.
    if (layout.distributed) {
      return open_megatron_dist_shard_file(layout, group.size(), group.rank(), stage);
    }
    if (layout.tensor_parallel != group.size() || layout.pipeline_parallel != stages.size()) {
      const std::unique_ptr<ShardFile> first = open_megatron_shard_file(layout, 0, 0);
      check_saved_layout(CheckpointMetadata(first->metadata(), first->path()), group, stages,
                         first->path(), options);
    }
    return open_megatron_shard_file(layout, group.rank(), stages.rank());
  }
  const fs::path file = checkpoint_rank_file(tracked, group.rank(), stages.rank(), stages.size());
  if (!fs::is_regular_file(file)) {
    if (fs::is_regular_file(tracked.file)) {
      // Another layout's checkpoint: say so, with the command that reshards it.
      const CheckpointFileReader reader(tracked.file);
      check_saved_layout(CheckpointMetadata(reader.metadata(), reader.path()), group, stages,
                         reader.path(), options);
    }
    common::fail(
        "{} names iteration {}, but {} does not exist: the checkpoint directory was "
        "changed by hand; point the tracker at a complete checkpoint",
        checkpoint_tracker_path(directory).string(), tracked.iteration, file.string());
  }
  return open_native_shard_file(file);
}

}  // namespace

std::optional<TrainingProgress> load_checkpoint(const CheckpointLoadOptions& options,
                                                GptModel<float>& model, AdamW& optimizer,
                                                LearningRateScheduler& scheduler,
                                                std::ostream& out, const ShardRange* optimizer_range) {
  const fs::path& directory = options.directory;
  const auto tracked = read_checkpoint_tracker(directory);
  if (!tracked) {
    out << fmt::format("WARNING: could not find the metadata file {}\n",
                       checkpoint_tracker_path(directory).string());
    out << "    will not load any checkpoints and will start from random\n";
    out.flush();
    return std::nullopt;
  }
  if (tracked->release) {
    out << fmt::format(" loading release checkpoint from {}\n", directory.string());
  } else {
    out << fmt::format(" loading checkpoint from {} at iteration {}\n", directory.string(),
                       tracked->iteration);
  }
  out.flush();
  const Communicator& group = model.tensor_parallel_group();
  const Communicator& stages = model.pipeline_parallel_group();
  const std::unique_ptr<ShardFile> shard =
      open_rank_shard(directory, *tracked, group, stages, model.pipeline_stage(), options);
  const ShardFile& reader = *shard;
  const CheckpointMetadata metadata(reader.metadata(), reader.path());
  check_saved_layout(metadata, group, stages, reader.path(), options);
  check_parameter_shapes(reader, metadata, model, options);

  HostState host = host_state(model, nullptr, false);
  for (const auto& tensor : model.tensors()) {
    read_tensor(reader, tensor.name,
                host.parameters.subspan(static_cast<size_t>(tensor.offset),
                                        static_cast<size_t>(tensor.numel)), "");
  }
  if (host.parameters_staged) model.copy_parameters_from_host(host.staged_parameters);

  // Megatron: --finetune and release checkpoints give weights only, from iteration 0.
  const bool weights_only = options.finetune || tracked->release;
  TrainingProgress progress;
  if (!weights_only) {
    progress.iteration = metadata.get<int64_t>("iteration");
    progress.consumed_train_samples = metadata.get<int64_t>("consumed_train_samples");
    progress.consumed_valid_samples = metadata.get<int64_t>("consumed_valid_samples");
    if (progress.iteration != tracked->iteration) {
      common::fail("checkpoint {} holds iteration {}, but the tracker {} says {}",
                   reader.path().string(), progress.iteration,
                   checkpoint_tracker_path(directory).string(), tracked->iteration);
    }
  }

  if (!weights_only && !options.no_load_optim) {
    if (!metadata.has("optimizer") || !metadata.has("opt_param_scheduler")) {
      common::fail(
          "Unable to load optimizer from checkpoint {}: {}. Specify --no-load-optim or "
          "--finetune to prevent attempting to load the optimizer state",
          reader.path().string(),
          why_not_read(reader.metadata(), "optimizer_not_read",
                       "it was saved with --no-save-optim"));
    }
    // The optimizer's moments: the whole buffer's, or the range it holds.
    const ShardRange range =
        optimizer_range != nullptr ? *optimizer_range : ShardRange{0, model.parameter_buffer().numel};
    if (range.offset < 0 || range.numel != optimizer.numel() ||
        range.offset + range.numel > model.parameter_buffer().numel) {
      common::fail("internal error: an optimizer of {} moments loading the range [{}, {}) of {}",
                   optimizer.numel(), range.offset, range.offset + range.numel,
                   model.parameter_buffer().numel);
    }
    HostMoments moments = host_moments(optimizer, false);
    if (has_distributed_moments(metadata)) {
      read_distributed_moments(reader.path(), metadata, model.parameter_buffer().numel, range,
                               moments.exp_avg, moments.exp_avg_sq);
    } else {
      read_named_moments(reader, model, range, moments.exp_avg, moments.exp_avg_sq);
    }
    if (moments.staged) {
      optimizer.copy_moments_from_host(moments.staged_exp_avg, moments.staged_exp_avg_sq);
    }
    optimizer.set_steps_taken(metadata.get<int64_t>(metadata.section("optimizer"), "step"));
    restore_loss_scaler(metadata, optimizer.loss_scaler(), out);
    note_optimizer_changes(metadata, optimizer, out);
    restore_scheduler(metadata, options, scheduler, out, reader.path());
  }

  if (!weights_only && !options.no_load_rng) {
    if (!metadata.has("rng_state")) {
      common::fail(
          "Unable to load rng state from checkpoint {}: {}. Specify --no-load-rng or "
          "--finetune to prevent attempting to load the rng state",
          reader.path().string(),
          why_not_read(reader.metadata(), "rng_not_read", "it was saved with --no-save-rng"));
    }
    const json& rng = metadata.section("rng_state");
    model.set_dropout_seed(metadata.get<uint64_t>(rng, "dropout_seed"));
    model.set_dropout_step(metadata.get<uint64_t>(rng, "dropout_step"));
  }

  out << fmt::format("  successfully loaded checkpoint from {} [ t {}/{}, p {}/{} ] at iteration {}\n",
                     directory.string(), group.rank() + 1, group.size(), stages.rank() + 1,
                     stages.size(), progress.iteration);
  out.flush();
  return progress;
}

}  // namespace backend
