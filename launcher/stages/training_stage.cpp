// NeMo training config → Megatron-LM flags; see training_stage.hpp.
// References: NeMo-Megatron-Launcher conf/training/gpt3/*.yaml for the keys, Megatron-LM
// megatron/training/arguments.py for the flags, NeMo's CosineAnnealing scheduler for the
// warmup / constant_steps semantics, NeMo's MegatronBaseModel for
// virtual_pipeline_model_parallel_size (1 is None: no interleaving).
#include "launcher/stages/training_stage.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include "backend/common/ascii_case.hpp"
#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"
#include "backend/common/flag_rules.hpp"
#include "backend/common/python_format.hpp"
#include "launcher/config/node.hpp"
#include "launcher/config/scalar_text.hpp"

namespace launcher {

namespace {

// Direct one-to-one rows: the value is passed as the flag's argument.
const std::vector<TrainingFlagMapping> kTrainingFlags = {
    {"model.num_layers", "--num-layers", ""},
    {"model.hidden_size", "--hidden-size", ""},
    {"model.ffn_hidden_size", "--ffn-hidden-size", ""},
    {"model.num_attention_heads", "--num-attention-heads", ""},
    {"model.encoder_seq_length", "--seq-length", ""},
    {"model.max_position_embeddings", "--max-position-embeddings", ""},
    {"model.micro_batch_size", "--micro-batch-size", ""},
    {"model.global_batch_size", "--global-batch-size", ""},
    {"model.tensor_model_parallel_size", "--tensor-model-parallel-size", ""},
    {"model.pipeline_model_parallel_size", "--pipeline-model-parallel-size", ""},
    {"model.init_method_std", "--init-method-std", ""},
    {"model.hidden_dropout", "--hidden-dropout", ""},
    {"model.attention_dropout", "--attention-dropout", ""},
    {"model.layernorm_epsilon", "--layernorm-epsilon", ""},
    {"model.make_vocab_size_divisible_by", "--make-vocab-size-divisible-by", ""},
    {"model.seed", "--seed", ""},
    {"model.tokenizer.vocab_file", "--vocab-file", ""},
    {"model.tokenizer.merge_file", "--merge-file", ""},
    {"model.tokenizer.model", "--tokenizer-model", ""},
    {"model.rotary_base", "--rotary-base", ""},
    {"model.rotary_percentage", "--rotary-percent", ""},
    {"model.native_amp_init_scale", "--initial-loss-scale", ""},
    {"model.native_amp_growth_interval", "--loss-scale-window", ""},
    {"model.hysteresis", "--hysteresis", ""},
    {"model.optim.lr", "--lr", ""},
    {"model.optim.weight_decay", "--weight-decay", ""},
    {"model.optim.betas.0", "--adam-beta1", ""},
    {"model.optim.betas.1", "--adam-beta2", ""},
    {"model.optim.sched.min_lr", "--min-lr", ""},
    {"model.optim.sched.warmup_steps", "--lr-warmup-iters", ""},
    {"trainer.max_steps", "--train-iters", ""},
    {"trainer.log_every_n_steps", "--log-interval", ""},
    {"trainer.val_check_interval", "--eval-interval", ""},
    {"trainer.gradient_clip_val", "--clip-grad", ""},
    // Ours, not NeMo keys: the loss-spike detection of --rollback-on-spike (docs/checkpoints.md),
    // read by pretrain_gpt only with it (exp_manager.rollback_on_spike below).
    {"exp_manager.spike_detection.threshold", "--spike-threshold", ""},
    {"exp_manager.spike_detection.window", "--spike-window", ""},
    {"exp_manager.spike_detection.nan_iterations", "--spike-nan-iterations", ""},
    {"exp_manager.spike_detection.lr_factor", "--spike-lr-factor", ""},
    {"exp_manager.spike_detection.max_rollbacks", "--spike-max-rollbacks", ""},
};

// Rows computed from several keys or translated values (documented with the table).
const std::vector<TrainingFlagMapping> kDerivedFlags = {
    {"trainer.limit_val_batches", "--eval-iters",
     "Lightning's two forms: an integer N → --eval-iters N (also the test pass length: Megatron "
     "has one --eval-iters); a float is a fraction of the validation batches: 0.0 → "
     "--eval-iters 0 (no validation), any other fraction is refused (the batches are not "
     "counted before pretrain_gpt reads the data), and so is a float > 1.0, as NeMo refuses it"},
    {"model.optim.sched.name", "--lr-decay-style",
     "CosineAnnealing → cosine, LinearAnnealing → linear, Constant → constant"},
    {"trainer.max_steps, model.optim.sched.constant_steps", "--lr-decay-iters",
     "max_steps − constant_steps (NeMo holds min_lr for the last constant_steps); max_steps when "
     "that would not exceed the warmup; at least warmup_steps + 1, because Megatron requires "
     "warmup < decay (the rate of every iteration that runs is NeMo's either way)"},
    {"trainer.precision", "--bf16 / --fp16",
     "bf16 or bf16-mixed → --bf16; 16 or 16-mixed → --fp16; 32 → none"},
    {"model.data.data_impl", "--mock-data / --data-path",
     "mock → --mock-data; mmap → --data-path with model.data.data_prefix (a list), --split with "
     "model.data.splits_string"},
    {"model.data.eod_mask_loss", "--eod-mask-loss",
     "true → --eod-mask-loss (no loss on the positions whose input token is the tokenizer's end "
     "of document: NeMo's loss mask); false or null → none"},
    {"model.data.data_prefix.train, model.data.data_prefix.validation, model.data.data_prefix.test",
     "--train-data-path --valid-data-path --test-data-path",
     "NeMo's per-split data_prefix {train: [...], validation: [...], test: [...]} (all three "
     "required, as NeMo asserts): each split's blend of weight, prefix pairs (or one prefix) to "
     "its flag, Megatron's per-split blends; splits_string is then not passed (NeMo ignores it "
     "too)"},
    {"model.data.index_mapping_dir", "--data-cache-path",
     "with data_impl mmap, when set: where the dataset index arrays are cached (null: next to "
     "the data, NeMo's default and Megatron's)"},
    {"model.position_embedding_type", "--position-embedding-type",
     "rope → --position-embedding-type rope; learned_absolute → none (the default)"},
    {"model.normalization, model.layernorm_zero_centered_gamma",
     "--normalization / --apply-layernorm-1p",
     "rmsnorm → --normalization RMSNorm; layernorm1p, or layernorm with "
     "layernorm_zero_centered_gamma true → --apply-layernorm-1p (Megatron's zero-centred "
     "LayerNorm, NeMo's two spellings of it); layernorm → none (in any letter case: NeMo's "
     "configs write LayerNorm too)"},
    {"model.tokenizer.library, model.tokenizer.type", "--tokenizer-type",
     "megatron (or unset) → --tokenizer-type <type>; sentencepiece → <type>, or "
     "GPTSentencePieceTokenizer when type is null (NeMo's SentencePiece tokenizer: the model's "
     "pieces, no BOS added); huggingface → HuggingFaceTokenizer with --tokenizer-model <type>, "
     "a local directory holding tokenizer.json (NeMo would also fetch a hub name; nothing is "
     "downloaded here)"},
    {"trainer.accelerator", "--device",
     "gpu or auto → none (pretrain_gpt's --device auto takes the GPU when there is one, else "
     "the CPU); cpu → --device cpu"},
    {"trainer.max_time", "--exit-duration-in-mins",
     "Lightning's DD:HH:MM:SS → the same time in minutes: the run saves a checkpoint and stops "
     "after the first iteration past it, as NeMo's Timer callback does"},
    {"model.optim.overlap_grad_sync, model.optim.overlap_param_sync",
     "--overlap-grad-reduce --overlap-param-gather",
     "true → the flag, with name distributed_fused_adam (the only optimizer NeMo reads them "
     "for); pretrain_gpt says what it overlaps (docs/parallelism.md)"},
    {"model.optim.grad_sync_dtype, model.optim.bucket_cap_mb",
     "--grad-reduce-in-bf16 --ddp-bucket-size",
     "with name distributed_fused_adam (the optimizer NeMo reads them for): grad_sync_dtype bf16 "
     "→ --grad-reduce-in-bf16; fp32 or null → none; fp16 is refused (a reduction in fp16 is not "
     "built); bucket_cap_mb M → --ddp-bucket-size M·2^20 / the sync type's bytes (2 for bf16, 4 "
     "for fp32: Apex's DistributedFusedAdam counts its buckets so)"},
    {"model.activations_checkpoint_granularity, model.activations_checkpoint_method, "
     "model.activations_checkpoint_num_layers",
     "--recompute-granularity --recompute-method --recompute-num-layers",
     "full → all three (method and num_layers when set); selective → --recompute-granularity "
     "selective alone (NeMo ignores method and num_layers under selective); null → none of "
     "them, whatever method and num_layers say (NeMo recomputes nothing)"},
    {"model.activation", "--swiglu", "swiglu or fast-swiglu → --swiglu; gelu → none"},
    {"model.bias", "--disable-bias-linear", "false → --disable-bias-linear"},
    {"model.share_embeddings_and_output_weights", "--untie-embeddings-and-output-weights",
     "false → --untie-embeddings-and-output-weights"},
    {"model.rampup_batch_size",
     "--rampup-batch-size --train-samples --lr-warmup-samples --lr-decay-samples",
     "[start, increment, samples] → --rampup-batch-size start increment samples; Megatron ramps "
     "only in sample-based runs, so --train-iters, --lr-warmup-iters and --lr-decay-iters become "
     "the same lengths in samples (× global_batch_size): the run consumes max_steps × "
     "global_batch_size samples, in more steps than max_steps while the batch is small"},
    {"model.num_query_groups", "--group-query-attention --num-query-groups",
     "set and different from num_attention_heads → both flags"},
    {"model.use_flash_attention", "--use-flash-attn",
     "true → --use-flash-attn (on a GPU with bf16, attention on tensor cores; attention is fused "
     "either way, the same model); false → none"},
    {"model.sequence_parallel", "--sequence-parallel",
     "true → --sequence-parallel; false → none (pretrain_gpt, as Megatron, switches it off when "
     "tensor_model_parallel_size is 1)"},
    {"model.virtual_pipeline_model_parallel_size", "--num-layers-per-virtual-pipeline-stage",
     "V, the model chunks per pipeline stage (Megatron's interleaved schedule): null or 1 → none "
     "(NeMo treats 1 as no interleaving); V ≥ 2 → num_layers / (pipeline_model_parallel_size × "
     "V), the layers of one chunk; any other value is refused, and so are V ≥ 2 with "
     "pipeline_model_parallel_size 1, or 2 without overlap_p2p_comm, num_layers not divisible by "
     "pp × V, and micro batches per step not divisible by pp (preflight)"},
    {"model.overlap_p2p_comm", "--no-overlap-p2p-communication",
     "with virtual_pipeline_model_parallel_size ≥ 2: false or null (NeMo's default) → "
     "--no-overlap-p2p-communication (each batch of pipeline transfers completes before the next "
     "compute); true → none (they travel during the computes: Megatron-LM's default); without "
     "interleaving, none (NeMo and Megatron ignore it there)"},
    {"model.optim.name", "--use-distributed-optimizer",
     "distributed_fused_adam → --use-distributed-optimizer (NeMo's distributed optimizer is "
     "Megatron's); fused_adam, adam or adamw → none; any other name is refused"},
    {"exp_manager.explicit_log_dir", "--benchmark-output",
     "benchmark mode (data_impl mock and trainer.limit_val_batches 0): "
     "<explicit_log_dir>/benchmark.json"},
    {"exp_manager.explicit_log_dir", "--log-dir",
     "always: the backend writes NeMo's cmd-args.log and hparams.yaml there "
     "(run.results_dir/results "
     "when explicit_log_dir is unset)"},
    {"exp_manager.explicit_log_dir", "--tensorboard-dir",
     "the same directory, where NeMo's TensorBoard logger writes its event files; none when "
     "exp_manager.create_tensorboard_logger is false"},
    // Checkpoints: NeMo's exp_manager keys → Megatron's checkpoint flags.
    {"exp_manager.create_checkpoint_callback", "--save",
     "true → --save <explicit_log_dir>/checkpoints (explicit_log_dir defaults to "
     "<run.results_dir>/results)"},
    {"exp_manager.resume_if_exists", "--load --use-checkpoint-opt_param-scheduler",
     "true → --load of that same directory, and the schedule continues as the checkpoint has it "
     "(NeMo restores the scheduler's state, max_steps included); no checkpoint there yet → "
     "training starts from scratch, as resume_ignore_no_checkpoint: true"},
    {"model.restore_from_path", "--pretrained-checkpoint",
     "a checkpoint directory (pretrain_gpt's --save, or checkpoint_util --import-hf --save "
     "for a Hugging Face model) → training starts from its weights with a fresh optimizer, "
     "scheduler and RNG at iteration 0 (NeMo's restore_from_path), unless the run's own "
     "checkpoints (resume_if_exists) already hold one, which a restarted job resumes; a .nemo "
     "file is refused (convert the model with checkpoint_util --import-hf)"},
    {"exp_manager.checkpoint_callback_params.every_n_train_steps, trainer.val_check_interval",
     "--save-interval",
     "with --save: every_n_train_steps when set, else val_check_interval (NeMo's checkpoint "
     "callback saves at each validation); the last step is saved too"},
    {"exp_manager.create_preemption_callback", "--exit-signal-handler",
     "with create_checkpoint_callback true: true or unset (NeMo's default, which the 23.07 and "
     "23.08 trees leave unset) → --exit-signal-handler (SIGTERM saves a checkpoint after the "
     "iteration and ends the job, as NeMo's preemption callback); false → none"},
    {"exp_manager.rollback_on_spike", "--rollback-on-spike",
     "ours, not a NeMo key: true → --rollback-on-spike (a loss spike, or persistent NaN/Inf loss, "
     "reloads the run's last checkpoint and training continues past the batches that caused "
     "it), with create_checkpoint_callback true (the checkpoints it reloads); false → none"},
};

const Node* lookup(const Node& training, const std::string& key) { return find_set(training, key); }

// NeMo's activation recompute: the granularity decides (null: none), and method and num_layers
// are read only under full, as NeMo's transformer reads them.
const std::string kRecomputeGranularityKey = "model.activations_checkpoint_granularity";
// Ours (not a NeMo key): --rollback-on-spike.
const std::string kRollbackOnSpikeKey = "exp_manager.rollback_on_spike";
const std::pair<std::string, std::string> kFullRecomputeKeys[] = {
    {"model.activations_checkpoint_method", "--recompute-method"},
    {"model.activations_checkpoint_num_layers", "--recompute-num-layers"}};

// The granularity's text, "" when unset or null (or not a scalar: check_value reports that).
std::string recompute_granularity(const Node& training) {
  const Node* value = lookup(training, kRecomputeGranularityKey);
  if (value == nullptr || !value->is_string()) return "";
  return value->as_string("training." + kRecomputeGranularityKey);
}

// NeMo's key for the interleaved schedule has no flag of its own (Megatron takes layers per
// chunk, not chunks), so its value rule lives here rather than in the backend's table; it is
// still applied by the backend's check_flag_value, so its text is read with the same integer
// grammar and refused in the same words as a flag's value.
const std::string kVirtualPipelineKey = "model.virtual_pipeline_model_parallel_size";
const std::string kOverlapP2pKey = "model.overlap_p2p_comm";
const std::string kValidationBatchesKey = "trainer.limit_val_batches";
constexpr common::FlagRule kVirtualPipelineRule = common::integer_flag(
    "virtual_pipeline_model_parallel_size", 1, std::numeric_limits<int64_t>::max(),
    "the model chunks per pipeline stage; null or 1: no interleaving");

// Keys below `training.` are reported with their full path.
std::string training_text(const Node& value, const std::string& key) {
  return launcher::scalar_text(value, "training." + key);
}

int64_t integer_or(const Node& training, const std::string& key, int64_t fallback) {
  return launcher::integer_or(training, "training", key, fallback);
}

// NeMo's log directory: exp_manager.explicit_log_dir, else <run.results_dir>/results.
std::string log_directory(const Node& training) {
  const Node* log_dir = lookup(training, "exp_manager.explicit_log_dir");
  return log_dir ? training_text(*log_dir, "exp_manager.explicit_log_dir")
                 : at_path(training, "run.results_dir").as_string("training.run.results_dir") + "/results";
}

bool is_true(const Node& training, const std::string& key) {
  const Node* value = lookup(training, key);
  return value != nullptr && value->as_bool("training." + key);
}

// distributed_fused_adam's grad_sync_dtype and bucket_cap_mb (Apex's DistributedFusedAdam: a
// bucket of bucket_cap_mb MiB of gradients in the sync type).
void add_gradient_sync_flags(const Node& training, std::vector<std::string>& arguments) {
  int64_t sync_bytes = 4;
  if (const Node* dtype = lookup(training, "model.optim.grad_sync_dtype");
      dtype != nullptr && !dtype->is_null()) {
    const std::string text = training_text(*dtype, "model.optim.grad_sync_dtype");
    if (text == "bf16" || text == "bfloat16") {
      arguments.push_back("--grad-reduce-in-bf16");
      sync_bytes = 2;
    } else if (text == "fp16" || text == "float16" || text == "16") {
      common::fail(
          "training.model.optim.grad_sync_dtype '{}': reducing the gradients in fp16 is "
          "not built (valid: bf16, fp32, or null)",
          text);
    } else if (text != "fp32" && text != "float32" && text != "32") {
      common::fail(
          "training.model.optim.grad_sync_dtype '{}' is not valid (valid: bf16, fp32, "
          "or null)",
          text);
    }
  }
  if (const Node* bucket = lookup(training, "model.optim.bucket_cap_mb");
      bucket != nullptr && !bucket->is_null()) {
    const double megabytes = bucket->as_double("training.model.optim.bucket_cap_mb");
    const double elements = std::floor(megabytes * 1048576.0 / static_cast<double>(sync_bytes));
    if (!(elements >= 1) || elements > 9e15) {
      common::fail(
          "training.model.optim.bucket_cap_mb {} is not valid (a size in MiB holding at "
          "least one gradient)",
          megabytes);
    }
    arguments.insert(arguments.end(),
                     {"--ddp-bucket-size", std::to_string(static_cast<int64_t>(elements))});
  }
}

// NeMo's optimizer names that pretrain_gpt trains, each as Megatron's Adam (AdamW: decoupled
// weight decay, --adam-beta1/2; NeMo's plain `adam` is torch's, with L2 weight decay);
// distributed_fused_adam is Megatron's distributed optimizer over the data-parallel group.
constexpr const char* kDistributedOptimizer = "distributed_fused_adam";
const std::vector<std::string> kOptimizerNames = {"fused_adam", "adam", "adamw",
                                                  kDistributedOptimizer};

std::string decay_style(const std::string& scheduler) {
  static const std::map<std::string, std::string> styles = {
      {"CosineAnnealing", "cosine"}, {"LinearAnnealing", "linear"}, {"Constant", "constant"},
      {"constant", "constant"},      {"linear", "linear"},          {"cosine", "cosine"}};
  auto it = styles.find(scheduler);
  if (it == styles.end()) {
    common::fail("training.model.optim.sched.name '{}' has no Megatron equivalent (valid: "
                 "CosineAnnealing, LinearAnnealing, Constant)", scheduler);
  }
  return it->second;
}

// NeMo's model.rampup_batch_size: [start, increment, samples]. Megatron ramps the batch only in
// sample-based runs (it refuses --rampup-batch-size with --train-iters), so the iteration
// lengths already in `arguments` are rewritten as the same lengths in samples.
void rampup_in_samples(const Node& training, const Node& rampup, std::vector<std::string>& arguments) {
  const std::string key = "training.model.rampup_batch_size";
  if (!rampup.is_list() || rampup.size() != 3) {
    common::fail("{}: expected [start_batch_size, batch_size_increment, rampup_samples], e.g. "
                 "[32, 32, 2000000], or null", key);
  }
  std::vector<std::string> values;
  for (size_t i = 0; i < 3; ++i) {
    const int64_t value = rampup.at(i).as_int(fmt::format("{}.{}", key, i));
    if (value <= 0) common::fail("{}.{} is {}: every entry must be positive", key, i, value);
    values.push_back(fmt::format("{}", value));
  }
  const int64_t global_batch_size = integer_or(training, "model.global_batch_size", 0);
  if (global_batch_size <= 0) {
    common::fail("{} needs training.model.global_batch_size (the batch size the ramp ends at)", key);
  }
  const std::map<std::string, std::string> in_samples = {{"--train-iters", "--train-samples"},
                                                         {"--lr-warmup-iters", "--lr-warmup-samples"},
                                                         {"--lr-decay-iters", "--lr-decay-samples"}};
  for (size_t i = 0; i + 1 < arguments.size(); ++i) {
    const auto renamed = in_samples.find(arguments[i]);
    if (renamed == in_samples.end()) continue;
    int64_t iterations = 0;
    const std::string& text = arguments[i + 1];
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), iterations);
    if (error != std::errc() || end != text.data() + text.size()) {
      common::fail("{} needs whole numbers of steps to count in samples; {} is '{}'", key,
                   arguments[i], text);
    }
    arguments[i] = renamed->second;
    arguments[i + 1] = fmt::format(
        "{}", common::checked_multiply(iterations, global_batch_size,
                                       fmt::format("{} × training.model.global_batch_size (the "
                                                   "steps of {} counted in samples)",
                                                   arguments[i], key)));
  }
  arguments.insert(arguments.end(), {"--rampup-batch-size", values[0], values[1], values[2]});
}

// NeMo's model.tokenizer.library: megatron when unset.
std::string tokenizer_library(const Node& training) {
  const Node* library = lookup(training, "model.tokenizer.library");
  return library ? training_text(*library, "model.tokenizer.library") : "megatron";
}

// NeMo's normalization names in lower case (its configs write LayerNorm and layernorm).
std::string normalization_name(const Node& training) {
  const Node* normalization = lookup(training, "model.normalization");
  return common::ascii_lowercase(
      normalization ? training_text(*normalization, "model.normalization") : "layernorm");
}

// Lightning's max_time "DD:HH:MM:SS" in minutes.
double max_time_minutes(const Node& value) {
  const std::string key = "training.trainer.max_time";
  const std::string text = launcher::scalar_text(value, key);
  int64_t fields[4] = {0, 0, 0, 0};
  size_t field = 0;
  const char* at = text.data();
  const char* end = text.data() + text.size();
  while (field < 4) {
    const auto [next, error] = std::from_chars(at, end, fields[field]);
    if (error != std::errc() || fields[field] < 0) break;
    ++field;
    at = next;
    if (field < 4) {
      if (at == end || *at != ':') break;
      ++at;
    }
  }
  if (field != 4 || at != end || fields[1] > 23 || fields[2] > 59 || fields[3] > 59) {
    common::fail("{} '{}' is not a time limit: expected DD:HH:MM:SS, e.g. 00:23:30:00 (set in {})",
                 key, text, value.location().describe());
  }
  const double minutes = static_cast<double>(fields[0]) * 24 * 60 + static_cast<double>(fields[1]) * 60 +
                         static_cast<double>(fields[2]) + static_cast<double>(fields[3]) / 60.0;
  if (minutes <= 0) common::fail("{} '{}' must be longer than zero (or null: no limit)", key, text);
  return minutes;
}

// Checks `key`'s value (if set) with `rule`; a value that is not a scalar is a problem too.
void check_rule(const Node& training, const std::string& key, const common::FlagRule& rule,
                std::vector<std::string>& problems) {
  const Node* value = lookup(training, key);
  if (value == nullptr) return;
  try {
    // In the user's words: the key, with the flag it becomes (a rule of ours has none).
    const std::string subject = rule.flag.starts_with("--")
                                    ? fmt::format("training.{} ({})", key, rule.flag)
                                    : fmt::format("training.{}", key);
    const common::CheckedFlagValue checked =
        common::check_flag_value(rule, training_text(*value, key), subject);
    if (!checked.problem.empty()) {
      problems.push_back(fmt::format("training.{}: {} (from {})", key, checked.problem,
                                     value->location().describe()));
    }
  } catch (const common::Error& error) {
    problems.push_back(error.what());
  }
}

// Checks `key`'s value (if set) with the backend's rule of `flag`.
void check_value(const Node& training, const std::string& key, const std::string& flag,
                 std::vector<std::string>& problems) {
  const common::FlagRule* rule = common::find_flag_rule(flag);
  if (rule == nullptr) {
    throw std::logic_error(flag + " has no value rule in backend/common/flag_rules.cpp");
  }
  check_rule(training, key, *rule, problems);
}

// model.optim.name (if set) must be one of kOptimizerNames: any other optimizer (sgd,
// novograd, ...) would silently train with Adam.
void check_optimizer_name(const Node& training, std::vector<std::string>& problems) {
  const std::string key = "model.optim.name";
  const Node* value = lookup(training, key);
  if (value == nullptr) return;
  try {
    const std::string name = training_text(*value, key);
    if (std::find(kOptimizerNames.begin(), kOptimizerNames.end(), name) == kOptimizerNames.end()) {
      problems.push_back(fmt::format("training.{}: '{}' is not an optimizer pretrain_gpt trains "
                                     "(valid: {}) (from {})",
                                     key, name, fmt::join(kOptimizerNames, ", "),
                                     value->location().describe()));
    }
  } catch (const common::Error& error) {
    problems.push_back(error.what());
  }
}

// --rollback-on-spike reloads the checkpoints of --save, which only create_checkpoint_callback
// gives: without it pretrain_gpt would refuse the job once it started.
void check_rollback_on_spike(const Node& training, std::vector<std::string>& problems) {
  try {
    if (is_true(training, kRollbackOnSpikeKey) &&
        !is_true(training, "exp_manager.create_checkpoint_callback")) {
      problems.push_back(fmt::format(
          "training.{}: true needs training.exp_manager.create_checkpoint_callback: true (a "
          "rollback reloads the last checkpoint the run saved) (from {})",
          kRollbackOnSpikeKey, lookup(training, kRollbackOnSpikeKey)->location().describe()));
    }
  } catch (const common::Error& error) {
    problems.push_back(error.what());
  }
}

}  // namespace

std::vector<std::string> training_value_problems(const Node& config) {
  const Node* training_node = find(config, "training");
  if (training_node == nullptr || !training_node->is_map()) return {};
  const Node& training = *training_node;
  std::vector<std::string> problems;
  for (const auto& row : kTrainingFlags) check_value(training, row.config_key, row.flag, problems);
  try {
    validation_batches(config);
  } catch (const common::Error& error) {
    problems.push_back(error.what());
  }
  // The keys of derived rows whose value still reaches a flag as it is.
  check_value(training, "model.num_query_groups", "--num-query-groups", problems);
  check_value(training, kRecomputeGranularityKey, "--recompute-granularity", problems);
  if (recompute_granularity(training) == "full") {
    for (const auto& [key, flag] : kFullRecomputeKeys) check_value(training, key, flag, problems);
  }
  check_rule(training, kVirtualPipelineKey, kVirtualPipelineRule, problems);
  check_optimizer_name(training, problems);
  check_rollback_on_spike(training, problems);
  if (tokenizer_library(training) != "huggingface") {
    check_value(training, "model.tokenizer.type", "--tokenizer-type", problems);
  }
  const Node* data_impl = lookup(training, "model.data.data_impl");
  if (data_impl == nullptr || training_text(*data_impl, "model.data.data_impl") == "mmap") {
    check_value(training, "model.data.splits_string", "--split", problems);
  }
  return problems;
}

std::optional<int64_t> validation_batches(const Node& config) {
  const Node& training = at_path(config, "training");
  const Node* value = lookup(training, kValidationBatchesKey);
  if (value == nullptr) return std::nullopt;
  const std::string key = "training." + kValidationBatchesKey;
  if (value->is_float()) {
    // Lightning's float: a fraction of the validation dataloader's batches, int(fraction ×
    // batches); NeMo's validation set is then one epoch of the validation split.
    const double fraction = value->as_double(key);
    const std::string text = common::format_python_float(fraction);  // 1.0, not 1
    if (fraction == 0) return 0;
    if (fraction > 0 && fraction <= 1) {
      common::fail("{} {}: a float is Lightning's fraction of the validation batches (NeMo's "
                   "validation set is then one epoch of the validation split), which cannot be "
                   "counted before pretrain_gpt reads the data; give a number of batches, an "
                   "integer (e.g. 10: --eval-iters 10), or 0.0 (or 0) for no validation (from {})",
                   key, text, value->location().describe());
    }
    common::fail("{} {}: a float is a fraction of the validation batches, from 0.0 (none) to 1.0, "
                 "as NeMo requires (\"limit_val_batches must be an integer or float less than or "
                 "equal to 1.0\"); give a number of batches as an integer (e.g. 10: --eval-iters "
                 "10), or 0.0 (or 0) for no validation (from {})",
                 key, text, value->location().describe());
  }
  const common::CheckedFlagValue checked = common::check_flag_value(
      *common::find_flag_rule("--eval-iters"), training_text(*value, kValidationBatchesKey),
      key + " (--eval-iters)");
  if (!checked.problem.empty()) {
    common::fail("{}: {} (from {})", key, checked.problem, value->location().describe());
  }
  int64_t batches = 0;
  std::from_chars(checked.canonical.data(), checked.canonical.data() + checked.canonical.size(),
                  batches);
  return batches;
}

int64_t virtual_pipeline_chunks(const Node& config) {
  const Node& training = at_path(config, "training");
  const Node* value = lookup(training, kVirtualPipelineKey);
  if (value == nullptr) return 1;
  // The checked text, not as_int: a quoted '3' is as valid here as for any flag's value.
  const common::CheckedFlagValue checked =
      common::check_flag_value(kVirtualPipelineRule, training_text(*value, kVirtualPipelineKey),
                               "training." + kVirtualPipelineKey);
  if (!checked.problem.empty()) {
    common::fail("training.{}: {}", kVirtualPipelineKey, checked.problem);
  }
  int64_t chunks = 0;
  const std::string& text = checked.canonical;
  std::from_chars(text.data(), text.data() + text.size(), chunks);
  return chunks;
}

std::optional<int64_t> layers_per_virtual_pipeline_stage(const Node& config) {
  const int64_t chunks = virtual_pipeline_chunks(config);
  if (chunks == 1) return std::nullopt;
  const Node& training = at_path(config, "training");
  const int64_t layers = integer_or(training, "model.num_layers", 0);
  const int64_t pp = integer_or(training, "model.pipeline_model_parallel_size", 1);
  if (layers < 1 || pp < 1) {
    common::fail("training.{} {} needs training.model.num_layers ({}) and "
                 "pipeline_model_parallel_size ({}) ≥ 1 to count the layers of a model chunk",
                 kVirtualPipelineKey, chunks, layers, pp);
  }
  const int64_t chunks_in_model = common::checked_multiply(
      pp, chunks,
      "training.model.pipeline_model_parallel_size × virtual_pipeline_model_parallel_size");
  if (layers % chunks_in_model != 0) {
    common::fail("training.model.num_layers {} is not divisible by pipeline_model_parallel_size {} "
                 "× virtual_pipeline_model_parallel_size {} = {} (every model chunk holds the same "
                 "number of layers)",
                 layers, pp, chunks, chunks_in_model);
  }
  return layers / chunks_in_model;
}

const std::vector<TrainingFlagMapping>& training_flag_table() {
  static const std::vector<TrainingFlagMapping> table = [] {
    auto all = kTrainingFlags;
    all.insert(all.end(), kDerivedFlags.begin(), kDerivedFlags.end());
    return all;
  }();
  return table;
}

std::vector<std::string> megatron_training_arguments(const Node& config) {
  const Node* training_node = find(config, "training");
  if (training_node == nullptr || !training_node->is_map()) {
    common::fail("the config has no `training` section: choose one with training=<option>");
  }
  const Node& training = *training_node;
  if (const auto problems = training_value_problems(config); !problems.empty()) {
    if (problems.size() == 1) common::fail("{}", problems.front());
    std::string message = "the training config has values pretrain_gpt would refuse:";
    for (const auto& problem : problems) message += "\n  - " + problem;
    common::fail("{}", message);
  }
  std::vector<std::string> arguments;
  for (const auto& row : kTrainingFlags) {
    if (const Node* value = lookup(training, row.config_key)) {
      arguments.push_back(row.flag);
      arguments.push_back(training_text(*value, row.config_key));
    }
  }
  if (const auto batches = validation_batches(config)) {
    arguments.insert(arguments.end(), {"--eval-iters", fmt::format("{}", *batches)});
  }
  // NeMo's chunks per stage become Megatron's layers per chunk.
  if (const auto layers_per_chunk = layers_per_virtual_pipeline_stage(config)) {
    arguments.insert(arguments.end(), {"--num-layers-per-virtual-pipeline-stage",
                                       fmt::format("{}", *layers_per_chunk)});
    // NeMo overlaps the interleaved schedule's transfers only when asked (its default is
    // false); Megatron-LM's default is the overlap.
    if (!is_true(training, kOverlapP2pKey)) arguments.push_back("--no-overlap-p2p-communication");
  }

  if (const Node* scheduler = lookup(training, "model.optim.sched.name")) {
    arguments.push_back("--lr-decay-style");
    arguments.push_back(decay_style(training_text(*scheduler, "model.optim.sched.name")));
  }
  const int64_t max_steps = integer_or(training, "trainer.max_steps", 0);
  const int64_t warmup = integer_or(training, "model.optim.sched.warmup_steps", 0);
  const int64_t constant = integer_or(training, "model.optim.sched.constant_steps", 0);
  if (max_steps > 0) {
    int64_t decay = max_steps - constant > warmup ? max_steps - constant : max_steps;
    decay = std::max(decay, common::checked_add(warmup, 1, "training.model.optim.sched.warmup_steps + 1"));
    arguments.push_back("--lr-decay-iters");
    arguments.push_back(fmt::format("{}", decay));
  }

  // Llama-family switches (NeMo's keys → Megatron's flags).
  if (const Node* position = lookup(training, "model.position_embedding_type")) {
    const std::string value = training_text(*position, "model.position_embedding_type");
    if (value == "rope") {
      arguments.insert(arguments.end(), {"--position-embedding-type", "rope"});
    } else if (value != "learned_absolute") {
      common::fail("training.model.position_embedding_type '{}' is not valid (valid: "
                   "learned_absolute, rope)", value);
    }
  }
  {
    const std::string value = normalization_name(training);
    const bool zero_centered = is_true(training, "model.layernorm_zero_centered_gamma");
    if (value == "rmsnorm") {
      arguments.insert(arguments.end(), {"--normalization", "RMSNorm"});
      // pretrain_gpt refuses the zero-centred gamma with RMSNorm, naming the flag.
      if (zero_centered) arguments.push_back("--apply-layernorm-1p");
    } else if (value == "layernorm1p" || (value == "layernorm" && zero_centered)) {
      arguments.push_back("--apply-layernorm-1p");
    } else if (value != "layernorm") {
      common::fail("training.model.normalization '{}' is not valid (valid: layernorm, "
                   "layernorm1p, rmsnorm, in any letter case)", value);
    }
  }

  // NeMo's tokenizer library and type → Megatron's tokenizer type.
  {
    const std::string library = tokenizer_library(training);
    const Node* type = lookup(training, "model.tokenizer.type");
    if (library == "megatron" || library == "sentencepiece") {
      if (type != nullptr) {
        arguments.insert(arguments.end(), {"--tokenizer-type", training_text(*type, "model.tokenizer.type")});
      } else if (library == "sentencepiece") {
        arguments.insert(arguments.end(), {"--tokenizer-type", "GPTSentencePieceTokenizer"});
      }
    } else if (library == "huggingface") {
      if (type == nullptr) {
        common::fail("training.model.tokenizer.library huggingface needs training.model.tokenizer.type: "
                     "a local directory holding the tokenizer's tokenizer.json");
      }
      arguments.insert(arguments.end(), {"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                         training_text(*type, "model.tokenizer.type")});
    } else {
      common::fail("training.model.tokenizer.library '{}' is not valid (valid: megatron, "
                   "sentencepiece, huggingface)", library);
    }
  }

  if (const Node* accelerator = lookup(training, "trainer.accelerator")) {
    const std::string value = training_text(*accelerator, "trainer.accelerator");
    if (value == "cpu") {
      arguments.insert(arguments.end(), {"--device", "cpu"});
    } else if (value != "gpu" && value != "auto" && value != "cuda") {
      common::fail("training.trainer.accelerator '{}' is not valid (valid: gpu, auto, cpu)", value);
    }
  }
  if (const Node* max_time = lookup(training, "trainer.max_time")) {
    arguments.insert(arguments.end(),
                     {"--exit-duration-in-mins", fmt::format("{}", max_time_minutes(*max_time))});
  }
  if (const Node* activation = lookup(training, "model.activation")) {
    const std::string value = training_text(*activation, "model.activation");
    if (value == "swiglu" || value == "fast-swiglu") {
      arguments.push_back("--swiglu");
    } else if (value != "gelu") {
      common::fail("training.model.activation '{}' is not valid (valid: gelu, swiglu, fast-swiglu)",
                   value);
    }
  }
  if (const Node* bias = lookup(training, "model.bias"); bias && !bias->as_bool("training.model.bias")) {
    arguments.push_back("--disable-bias-linear");
  }
  if (const Node* shared = lookup(training, "model.share_embeddings_and_output_weights");
      shared && !shared->as_bool("training.model.share_embeddings_and_output_weights")) {
    arguments.push_back("--untie-embeddings-and-output-weights");
  }
  if (const Node* groups = lookup(training, "model.num_query_groups")) {
    const int64_t heads = integer_or(training, "model.num_attention_heads", 0);
    if (groups->as_int("training.model.num_query_groups") != heads) {
      arguments.insert(arguments.end(), {"--group-query-attention", "--num-query-groups",
                                         training_text(*groups, "model.num_query_groups")});
    }
  }

  // NeMo's recompute: method and num_layers count only under full granularity.
  if (const Node* granularity = lookup(training, kRecomputeGranularityKey)) {
    const std::string value = training_text(*granularity, kRecomputeGranularityKey);
    arguments.insert(arguments.end(), {"--recompute-granularity", value});
    if (value == "full") {
      for (const auto& [key, flag] : kFullRecomputeKeys) {
        if (const Node* set = lookup(training, key)) {
          arguments.insert(arguments.end(), {flag, training_text(*set, key)});
        }
      }
    }
  }

  // Sequence parallelism whenever asked: pretrain_gpt, as Megatron, turns it off itself at
  // tensor_model_parallel_size 1.
  if (is_true(training, "model.sequence_parallel")) arguments.push_back("--sequence-parallel");
  if (is_true(training, "model.use_flash_attention")) arguments.push_back("--use-flash-attn");
  if (const Node* eod_mask_loss = lookup(training, "model.data.eod_mask_loss");
      eod_mask_loss != nullptr && !eod_mask_loss->is_null() &&
      eod_mask_loss->as_bool("training.model.data.eod_mask_loss")) {
    arguments.push_back("--eod-mask-loss");
  }
  // The name is one of kOptimizerNames (training_value_problems).
  if (const Node* optimizer = lookup(training, "model.optim.name");
      optimizer && training_text(*optimizer, "model.optim.name") == kDistributedOptimizer) {
    arguments.push_back("--use-distributed-optimizer");
    if (is_true(training, "model.optim.overlap_grad_sync")) arguments.push_back("--overlap-grad-reduce");
    if (is_true(training, "model.optim.overlap_param_sync")) arguments.push_back("--overlap-param-gather");
    add_gradient_sync_flags(training, arguments);
  }

  if (const Node* precision = lookup(training, "trainer.precision")) {
    const std::string text = training_text(*precision, "trainer.precision");
    if (text == "bf16" || text == "bf16-mixed") {
      arguments.push_back("--bf16");
    } else if (text == "16" || text == "16-mixed") {
      arguments.push_back("--fp16");
    } else if (text != "32" && text != "32-true") {
      common::fail("training.trainer.precision '{}' is not valid (valid: bf16, bf16-mixed, 16, "
                   "16-mixed, 32)", text);
    }
  }

  const std::string log_dir = log_directory(training);
  arguments.insert(arguments.end(), {"--log-dir", log_dir});
  // NeMo's TensorBoardLogger writes into the log dir itself (exp_manager's default is on).
  const Node* tensorboard = lookup(training, "exp_manager.create_tensorboard_logger");
  if (tensorboard == nullptr || tensorboard->as_bool("training.exp_manager.create_tensorboard_logger")) {
    arguments.insert(arguments.end(), {"--tensorboard-dir", log_dir});
  }

  const Node* data_impl = lookup(training, "model.data.data_impl");
  const std::string impl = data_impl ? training_text(*data_impl, "model.data.data_impl") : "mmap";
  if (impl == "mock") {
    arguments.push_back("--mock-data");
    // Megatron's benchmark mode: synthetic data, train only. The backend then leaves
    // benchmark.json for `launcher report`.
    if (validation_batches(config).value_or(1) == 0) {
      arguments.push_back("--benchmark-output");
      arguments.push_back(log_dir + "/benchmark.json");
    }
  } else if (impl == "mmap") {
    const Node* prefix = lookup(training, "model.data.data_prefix");
    // A blend (a list [weight, prefix, ...], or one prefix) after `flag`.
    auto push_blend = [&](const char* flag, const Node& blend, const std::string& key) {
      if (blend.is_null() || (blend.is_list() && blend.size() == 0)) {
        common::fail("training.{} is empty: list [weight, prefix, ...] of Megatron .bin/.idx "
                     "datasets, or set training.model.data.data_impl=mock",
                     key);
      }
      arguments.push_back(flag);
      if (blend.is_list()) {
        for (size_t i = 0; i < blend.size(); ++i) {
          arguments.push_back(training_text(blend.at(i), fmt::format("{}.{}", key, i)));
        }
      } else {
        arguments.push_back(training_text(blend, key));
      }
    };
    if (prefix != nullptr && prefix->is_map()) {
      // NeMo's per-split form {train: [...], validation: [...], test: [...]}: each split its own
      // blend, all three required (NeMo asserts them), splits_string ignored as NeMo ignores it.
      for (const MapEntry& entry : prefix->entries()) {
        if (entry.key != "train" && entry.key != "validation" && entry.key != "test") {
          common::fail("training.model.data.data_prefix.{} is not a split (valid keys: train, "
                       "validation, test)",
                       entry.key);
        }
      }
      for (const auto& [split, flag] : {std::pair{"train", "--train-data-path"},
                                        std::pair{"validation", "--valid-data-path"},
                                        std::pair{"test", "--test-data-path"}}) {
        const std::string key = fmt::format("model.data.data_prefix.{}", split);
        const Node* blend = lookup(training, key);
        if (blend == nullptr) {
          common::fail("training.model.data.data_prefix has no '{}' key: NeMo's per-split form "
                       "needs train, validation and test",
                       split);
        }
        push_blend(flag, *blend, key);
      }
    } else {
      static const Node kAbsent;
      push_blend("--data-path", prefix == nullptr ? kAbsent : *prefix, "model.data.data_prefix");
      if (const Node* split = lookup(training, "model.data.splits_string")) {
        arguments.push_back("--split");
        arguments.push_back(training_text(*split, "model.data.splits_string"));
      }
    }
    if (const Node* cache = lookup(training, "model.data.index_mapping_dir")) {
      arguments.push_back("--data-cache-path");
      arguments.push_back(training_text(*cache, "model.data.index_mapping_dir"));
    }
  } else {
    common::fail("training.model.data.data_impl '{}' is not valid (valid: mmap, mock)", impl);
  }

  // Checkpoints where NeMo's exp_manager keeps them (<log dir>/checkpoints). A relaunch of the
  // same run resumes from there; the first one finds no tracker and starts from scratch.
  const std::string checkpoints = log_directory(training) + "/checkpoints";
  if (is_true(training, "exp_manager.create_checkpoint_callback")) {
    arguments.insert(arguments.end(), {"--save", checkpoints});
    const int64_t every_n_train_steps =
        integer_or(training, "exp_manager.checkpoint_callback_params.every_n_train_steps", 0);
    const int64_t interval = every_n_train_steps > 0
                                 ? every_n_train_steps
                                 : integer_or(training, "trainer.val_check_interval", 0);
    if (interval > 0) arguments.insert(arguments.end(), {"--save-interval", fmt::format("{}", interval)});
    // NeMo's preemption callback (exp_manager's create_preemption_callback, true by default)
    // saves on SIGTERM and exits: Megatron's --exit-signal-handler.
    const Node* preemption = lookup(training, "exp_manager.create_preemption_callback");
    if (preemption == nullptr || preemption->is_null() ||
        is_true(training, "exp_manager.create_preemption_callback")) {
      arguments.push_back("--exit-signal-handler");
    }
  }
  // Checked with the values (check_rollback_on_spike): --save is there.
  if (is_true(training, kRollbackOnSpikeKey)) arguments.push_back("--rollback-on-spike");
  if (is_true(training, "exp_manager.resume_if_exists")) {
    arguments.insert(arguments.end(), {"--load", checkpoints, "--use-checkpoint-opt_param-scheduler"});
  }
  if (const Node* restore = lookup(training, "model.restore_from_path");
      restore != nullptr && !restore->is_null()) {
    const std::string path = restore->as_string("training.model.restore_from_path");
    if (path.empty() || path.ends_with(".nemo")) {
      common::fail("training.model.restore_from_path: '{}' is not a checkpoint directory; a "
                   ".nemo file is imported first: `checkpoint_util --import-nemo <file.nemo> "
                   "--save <dir>` (or --import-hf <Hugging Face dir>, or give pretrain_gpt's "
                   "--save directory) and set restore_from_path to that directory",
                   path);
    }
    arguments.insert(arguments.end(), {"--pretrained-checkpoint", path});
  }
  if (const Node* rampup = lookup(training, "model.rampup_batch_size")) {
    rampup_in_samples(training, *rampup, arguments);
  }
  return arguments;
}

JobSpec build_training_job(const StageContext& context) {
  JobSpec job = job_from_run_section("training", context);
  job.tool = "pretrain_gpt";
  const Node& training = at_path(context.config, "training");
  job.nodes = static_cast<int>(integer_or(training, "trainer.num_nodes", 1));
  job.tasks_per_node = static_cast<int>(integer_or(training, "trainer.devices", 1));
  if (job.nodes < 1 || job.tasks_per_node < 1) {
    common::fail("training.trainer.num_nodes ({}) and training.trainer.devices ({}) must be ≥ 1",
                 job.nodes, job.tasks_per_node);
  }
  job.ranks_meet = true;
  job.command.push_back((context.backend_bin_dir / job.tool).string());
  for (auto& argument : megatron_training_arguments(context.config)) {
    job.command.push_back(std::move(argument));
  }
  // The user wrote config keys, not these flags: pretrain_gpt's messages then name the keys
  // (backend/common/nemo_config_keys.hpp).
  job.command.push_back("--name-config-keys");
  // With tensor parallelism Megatron needs the GPU to run kernels in the order they were
  // queued, so a tensor-parallel collective is not overtaken by the compute that waits on it:
  // one hardware queue per device, as NeMo's launcher sets for tp > 1. env_vars may override.
  if (integer_or(training, "model.tensor_model_parallel_size", 1) > 1) {
    job.environment.emplace_back("CUDA_DEVICE_MAX_CONNECTIONS", "1");
  }
  return job;
}

}  // namespace launcher
