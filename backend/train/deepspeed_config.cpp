// DeepSpeed's JSON onto pretrain_gpt's arguments; see deepspeed_config.hpp. The keys and their
// meaning are DeepSpeed's (deepspeed/runtime/config.py, zero/config.py, fp16 section), as
// Megatron-DeepSpeed's examples write them (examples_deepspeed/*/ds_config_*.json).
#include "backend/train/deepspeed_config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"
#include "backend/dist/parallel_layout.hpp"

namespace backend {

namespace {

using nlohmann::json;

// One section of the file being read: typed access that names the file and the key path.
class Section {
 public:
  Section(const json& object, std::string path, const std::string& file)
      : object_(object), path_(std::move(path)), file_(file) {}

  // Refuses keys outside `known`, naming each with what this backend does with the section.
  void only(const std::set<std::string>& known, std::string_view why) const {
    std::vector<std::string> unknown;
    for (const auto& item : object_.items()) {
      if (!known.contains(item.key())) unknown.push_back(key(item.key()));
    }
    if (unknown.empty()) return;
    common::fail("--deepspeed_config {}: {} {} not supported: {} (supported here: {})", file_,
                 fmt::join(unknown, ", "), unknown.size() == 1 ? "is" : "are", why,
                 fmt::join(known, ", "));
  }
  bool has(const char* name) const { return object_.contains(name) && !object_[name].is_null(); }
  Section section(const char* name) const {
    const json& value = object_[name];
    if (!value.is_object()) wrong(name, "an object");
    return Section(value, key(name), file_);
  }
  bool boolean(const char* name, bool fallback) const {
    if (!has(name)) return fallback;
    const json& value = object_[name];
    if (!value.is_boolean()) wrong(name, "true or false");
    return value.get<bool>();
  }
  double number(const char* name) const {
    const json& value = object_[name];
    if (!value.is_number() || !std::isfinite(value.get<double>())) wrong(name, "a number");
    return value.get<double>();
  }
  int64_t integer(const char* name, int64_t least) const {
    const json& value = object_[name];
    if (!value.is_number_integer() || value.get<int64_t>() < least) {
      wrong(name, fmt::format("an integer ≥ {}", least));
    }
    return value.get<int64_t>();
  }
  std::string text(const char* name) const {
    const json& value = object_[name];
    if (!value.is_string()) wrong(name, "a string");
    return value.get<std::string>();
  }
  std::string key(std::string_view name) const {
    return path_.empty() ? std::string(name) : fmt::format("{}.{}", path_, name);
  }
  const std::string& file() const { return file_; }

 private:
  [[noreturn]] void wrong(const char* name, std::string_view expected) const {
    common::fail("--deepspeed_config {}: {} is {}; expected {}", file_, key(name),
                 object_.contains(name) ? object_[name].dump() : "missing", expected);
  }
  const json& object_;
  std::string path_;
  const std::string& file_;
};

// ZeRO: the stage and the offloads, the gradient reduction's overlap, and refusals for what is
// not built.
struct ZeroSettings {
  int64_t stage = 0;
  bool offload_optimizer = false;
  bool offload_parameters = false;
  bool overlap_comm = false;                 // zero_optimization.overlap_comm
  int64_t reduce_bucket_size = 500'000'000;  // DeepSpeed's default, in elements
};

// A bucket size: DeepSpeed's files write it as an integer or as a float such as 5e8.
int64_t bucket_size(const Section& zero, const char* name) {
  const double value = zero.number(name);
  if (value < 1 || value > 9e15 || value != std::floor(value)) {
    common::fail("--deepspeed_config {}: {} is {}; expected a whole number of elements ≥ 1",
                 zero.file(), zero.key(name), value);
  }
  return static_cast<int64_t>(value);
}

ZeroSettings zero_settings(const Section& root, const DeepSpeedFlags& flags) {
  std::optional<int64_t> stage;
  if (root.has("zero_optimization")) {
    const Section zero = root.section("zero_optimization");
    zero.only({"stage", "contiguous_gradients", "overlap_comm", "reduce_scatter",
               "reduce_bucket_size", "allgather_partitions", "allgather_bucket_size",
               "round_robin_gradients", "cpu_offload", "offload_optimizer", "offload_param",
               "elastic_checkpoint", "load_from_fp32_weights", "sub_group_size",
               "stage3_max_live_parameters", "stage3_max_reuse_distance",
               "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
               "stage3_gather_16bit_weights_on_model_save",
               "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters"},
              "ZeRO's other settings are not built");
    if (zero.has("stage")) stage = zero.integer("stage", 0);
  }
  if (flags.zero_stage && stage && *flags.zero_stage != *stage) {
    common::fail("--zero-stage {} disagrees with zero_optimization.stage {} in --deepspeed_config "
                 "{}; give one stage", *flags.zero_stage, *stage, root.file());
  }
  ZeroSettings settings;
  settings.stage = flags.zero_stage ? *flags.zero_stage : stage.value_or(0);
  if (settings.stage < 0 || settings.stage > 3) {
    common::fail("ZeRO stage {} (--zero-stage or zero_optimization.stage in {}) is not a stage: "
                 "0, 1, 2 or 3", settings.stage, root.file());
  }
  if (root.has("zero_optimization")) {
    const Section zero = root.section("zero_optimization");
    // DeepSpeed's older spelling of offload_optimizer {device: cpu}.
    settings.offload_optimizer = zero.boolean("cpu_offload", false);
    settings.overlap_comm = zero.boolean("overlap_comm", false);
    if (zero.has("reduce_bucket_size")) {
      settings.reduce_bucket_size = bucket_size(zero, "reduce_bucket_size");
    }
    if (zero.has("allgather_bucket_size")) bucket_size(zero, "allgather_bucket_size");
    for (const char* offload : {"offload_optimizer", "offload_param"}) {
      if (!zero.has(offload)) continue;
      const Section section = zero.section(offload);
      section.only({"device", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu",
                    "fast_init", "nvme_path", "pipeline_read", "pipeline_write", "ratio"},
                   "unknown offload settings");
      const std::string device = section.has("device") ? section.text("device") : "none";
      if (device == "none") continue;
      if (device != "cpu") {
        common::fail("--deepspeed_config {}: {} is \"{}\": offload to \"cpu\" is built, not to "
                     "\"{}\" (\"none\" and \"cpu\" are)", root.file(), section.key("device"), device,
                     device);
      }
      if (std::string_view(offload) == "offload_param") {
        if (settings.stage != 3) {
          common::fail("--deepspeed_config {}: {} needs ZeRO stage 3 (DeepSpeed offloads "
                       "parameters only when they are sharded), got stage {}",
                       root.file(), section.key("device"), settings.stage);
        }
        settings.offload_parameters = true;
      } else {
        settings.offload_optimizer = true;
      }
    }
  }
  if (settings.offload_optimizer && settings.stage == 0) {
    common::fail("--deepspeed_config {}: optimizer offload needs a ZeRO stage of 1 to 3 "
                 "(DeepSpeed's rule), got stage 0", root.file());
  }
  return settings;
}

void apply_precision(const Section& root, const DeepSpeedFlags& flags, TrainingArguments& a) {
  if (root.has("fp16")) {
    const Section fp16 = root.section("fp16");
    fp16.only({"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
               "min_loss_scale", "consecutive_hysteresis"},
              "other fp16 settings are not built");
    if (fp16.boolean("consecutive_hysteresis", false)) {
      common::fail("--deepspeed_config {}: {} true is not built (Megatron's scaler resets "
                   "hysteresis only after a window of clean steps)", flags.config_file,
                   fp16.key("consecutive_hysteresis"));
    }
    if (fp16.boolean("enabled", false)) {
      a.precision.fp16 = true;
      if (fp16.has("loss_scale")) {
        const double scale = fp16.number("loss_scale");
        if (scale < 0) {
          common::fail("--deepspeed_config {}: {} is {}; 0 means dynamic, else a positive "
                       "constant", flags.config_file, fp16.key("loss_scale"), scale);
        }
        if (scale > 0) a.precision.loss_scale = scale;
      }
      if (fp16.has("initial_scale_power")) {
        a.precision.initial_loss_scale = std::ldexp(
            1.0, static_cast<int>(std::min<int64_t>(fp16.integer("initial_scale_power", 0), 1000)));
      }
      if (fp16.has("loss_scale_window")) {
        a.precision.loss_scale_window = fp16.integer("loss_scale_window", 1);
      }
      if (fp16.has("hysteresis")) a.precision.hysteresis = fp16.integer("hysteresis", 1);
      if (fp16.has("min_loss_scale")) {
        a.precision.min_loss_scale = fp16.number("min_loss_scale");
        if (!(a.precision.min_loss_scale > 0)) {
          common::fail("--deepspeed_config {}: {} must be positive", flags.config_file,
                       fp16.key("min_loss_scale"));
        }
      }
    }
  }
  for (const char* name : {"bf16", "bfloat16"}) {
    if (!root.has(name)) continue;
    const Section bf16 = root.section(name);
    bf16.only({"enabled", "immediate_grad_update"}, "other bf16 settings are not built");
    if (bf16.boolean("enabled", false)) a.precision.bf16 = true;
  }
  if (a.precision.fp16 && a.precision.bf16) {
    common::fail("--deepspeed_config {} (with the flags) enables both fp16 and bf16; choose one",
                 flags.config_file);
  }
}

// DeepSpeed's batch rule: train_batch_size = micro × accumulation steps × data-parallel size.
void apply_batch(const Section& root, const DeepSpeedFlags& flags, TrainingArguments& a) {
  const int64_t data_parallel = parallel_layout(a.parallelism).data_parallel;
  auto agree = [&](const char* key, int64_t value, int64_t& field, bool given, const char* flag) {
    if (given && field != value) {
      common::fail("--deepspeed_config {}: {} {} disagrees with {} {}", flags.config_file, key,
                   value, flag, field);
    }
    field = value;
  };
  if (root.has("train_micro_batch_size_per_gpu")) {
    agree("train_micro_batch_size_per_gpu", root.integer("train_micro_batch_size_per_gpu", 1),
          a.run.micro_batch_size, flags.micro_batch_size_given, "--micro-batch-size");
  }
  if (root.has("train_batch_size")) {
    agree("train_batch_size", root.integer("train_batch_size", 1), a.run.global_batch_size,
          flags.global_batch_size_given, "--global-batch-size");
  }
  if (root.has("gradient_accumulation_steps")) {
    const int64_t steps = root.integer("gradient_accumulation_steps", 1);
    const int64_t expected = a.run.micro_batch_size * steps * data_parallel;
    if (a.run.global_batch_size == 0) a.run.global_batch_size = expected;
    if (a.run.global_batch_size != expected) {
      common::fail(
          "--deepspeed_config {}: gradient_accumulation_steps {} × micro batch {} × "
          "data-parallel size {} = {} is not the global batch size {}",
          flags.config_file, steps, a.run.micro_batch_size, data_parallel, expected,
          a.run.global_batch_size);
    }
  }
}

}  // namespace

void apply_deepspeed_config(const DeepSpeedFlags& flags, TrainingArguments& arguments) {
  if (!flags.deepspeed) {
    if (!flags.config_file.empty() || flags.zero_stage) {
      common::fail("{} needs --deepspeed (without it Megatron-DeepSpeed does not use DeepSpeed)",
                   flags.config_file.empty() ? "--zero-stage" : "--deepspeed_config");
    }
    return;
  }
  if (flags.config_file.empty()) {
    common::fail("--deepspeed needs --deepspeed_config FILE (DeepSpeed's JSON configuration)");
  }
  const std::string text = common::read_small_file(flags.config_file, "--deepspeed_config");
  json root_json;
  try {
    root_json = json::parse(text);
  } catch (const json::parse_error& error) {
    common::fail("--deepspeed_config {}: not valid JSON: {}", flags.config_file, error.what());
  }
  if (!root_json.is_object()) {
    common::fail("--deepspeed_config {}: expected a JSON object at the top", flags.config_file);
  }
  const Section root(root_json, "", flags.config_file);
  root.only({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "gradient_clipping", "zero_optimization", "fp16", "bf16", "bfloat16",
             "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
             "prescale_gradients", "gradient_predivide_factor", "curriculum_learning"},
            "this backend trains with Megatron's own optimizer, scheduler and recompute flags");
  if (root.boolean("prescale_gradients", false)) {
    common::fail("--deepspeed_config {}: prescale_gradients true is not built (gradients are "
                 "averaged after the reduction)", flags.config_file);
  }
  if (root.has("gradient_predivide_factor") && root.number("gradient_predivide_factor") != 1.0) {
    common::fail("--deepspeed_config {}: gradient_predivide_factor other than 1 is not built",
                 flags.config_file);
  }
  if (root.has("curriculum_learning")) {
    const Section curriculum = root.section("curriculum_learning");
    if (curriculum.boolean("enabled", false)) {
      common::fail("--deepspeed_config {}: curriculum_learning.enabled true is not built",
                   flags.config_file);
    }
  }
  if (root.has("steps_per_print")) root.integer("steps_per_print", 1);
  root.boolean("wall_clock_breakdown", false);
  root.boolean("zero_allow_untested_optimizer", false);

  const ZeroSettings zero = zero_settings(root, flags);
  // Stages 1 and 2 are Megatron's distributed optimizer; stage 3 shards the model itself.
  if (zero.stage == 1 || zero.stage == 2) arguments.parallelism.use_distributed_optimizer = true;
  if (zero.stage == 3 && arguments.parallelism.use_distributed_optimizer) {
    common::fail("--deepspeed_config {}: ZeRO stage 3 shards the optimizer itself; drop "
                 "--use-distributed-optimizer", flags.config_file);
  }
  if (zero.stage == 3 || zero.offload_optimizer) {
    if (arguments.device == DeviceChoice::cuda) {
      common::fail(
          "--deepspeed_config {}: ZeRO stage 3 and offload run on CPU ranks (--device "
          "cpu); on GPUs they are not built yet, got --device {}",
          flags.config_file, common::enum_name(arguments.device));
    }
  }
  if (zero.stage == 3 && (arguments.parallelism.tensor_model_parallel_size > 1 ||
                          arguments.parallelism.pipeline_model_parallel_size > 1)) {
    common::fail(
        "--deepspeed_config {}: ZeRO stage 3 with tensor or pipeline parallelism is not "
        "built yet (--tensor-model-parallel-size {}, --pipeline-model-parallel-size {}); "
        "use both 1, or ZeRO stage 1 or 2",
        flags.config_file, arguments.parallelism.tensor_model_parallel_size,
        arguments.parallelism.pipeline_model_parallel_size);
  }
  // Stages 1 and 2 with overlap_comm: DeepSpeed reduces the gradients in buckets of
  // reduce_bucket_size elements during the backward, which is --overlap-grad-reduce with
  // --ddp-bucket-size (an explicit --ddp-bucket-size must agree). Stage 3's overlap is not
  // built (its units reduce after their backward), so there it stays speed only.
  if ((zero.stage == 1 || zero.stage == 2) && zero.overlap_comm) {
    std::optional<int64_t>& bucket = arguments.parallelism.ddp_bucket_size;
    if (bucket && *bucket != zero.reduce_bucket_size) {
      common::fail(
          "--deepspeed_config {}: zero_optimization.reduce_bucket_size {} disagrees with "
          "--ddp-bucket-size {}",
          flags.config_file, zero.reduce_bucket_size, *bucket);
    }
    bucket = zero.reduce_bucket_size;
    arguments.parallelism.overlap_grad_reduce = true;
  }
  arguments.parallelism.zero_stage = zero.stage;
  arguments.parallelism.offload_optimizer = zero.offload_optimizer;
  arguments.parallelism.offload_parameters = zero.offload_parameters;
  apply_precision(root, flags, arguments);
  apply_batch(root, flags, arguments);
  if (root.has("gradient_clipping")) {
    const double clip = root.number("gradient_clipping");
    if (flags.clip_grad_given && clip != arguments.optimizer.clip_grad) {
      common::fail("--deepspeed_config {}: gradient_clipping {} disagrees with --clip-grad {}",
                   flags.config_file, clip, arguments.optimizer.clip_grad);
    }
    arguments.optimizer.clip_grad = clip;
  }
  arguments.deepspeed = true;
  arguments.deepspeed_config = flags.config_file;
}

}  // namespace backend
