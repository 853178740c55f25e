// The value rules of pretrain_gpt's flags; see flag_rules.hpp.
#include "backend/common/flag_rules.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <vector>

#include "backend/common/error.hpp"

namespace common {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr int64_t kLargestInteger = std::numeric_limits<int64_t>::max();

// Megatron's choices (megatron/training/arguments.py). --tokenizer-type lists all of Megatron's
// tokenizers, not only those built here (docs/data.md): a config naming one that is not built
// (BertWordPieceCase, TikTokenizer, ...) is valid and renders; pretrain_gpt refuses it as not
// built yet.
constexpr std::string_view kTokenizerTypes[] = {
    "BertWordPieceLowerCase", "BertWordPieceCase",    "GPT2BPETokenizer", "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
    "MultimodalTokenizer",    "NullTokenizer"};
constexpr std::string_view kPositionEmbeddingTypes[] = {"learned_absolute", "rope"};
// Megatron-LM's names, then Megatron-DeepSpeed's (read as the first two).
constexpr std::string_view kNormalizations[] = {"LayerNorm", "RMSNorm", "layernorm", "rmsnorm"};
constexpr std::string_view kRecomputeGranularities[] = {"selective", "full"};
constexpr std::string_view kRecomputeMethods[] = {"uniform", "block"};
constexpr std::string_view kDecayStyles[] = {"constant", "linear", "cosine", "inverse-square-root",
                                             "WSD"};
constexpr std::string_view kWsdDecayStyles[] = {"exponential", "linear", "cosine", "minus_sqrt"};
constexpr std::string_view kWeightDecayIncrementStyles[] = {"constant", "linear", "cosine"};
constexpr std::string_view kDevices[] = {"auto", "cpu", "cuda"};
// Megatron core's cuda_graph_impl (transformer_engine is refused by pretrain_gpt, not here).
constexpr std::string_view kCudaGraphImplementations[] = {"none", "local", "full_iteration",
                                                          "transformer_engine"};
// Megatron-DeepSpeed's and older Megatron's flags that published scripts pass.
constexpr std::string_view kDataImplementations[] = {"mmap", "infer", "lazy", "cached"};
constexpr std::string_view kDistributedBackends[] = {"nccl", "gloo"};
constexpr std::string_view kDdpImplementations[] = {"local", "torch"};
// evaluate_gpt's tasks (Megatron's tasks/main.py knows more: RACE, MNLI, ... are not built).
constexpr std::string_view kZeroShotTasks[] = {"WIKITEXT103", "LAMBADA"};
// Megatron's choices for flags accepted here with one value, or without effect
// (backend/train/arguments.cpp says which values are built).
constexpr std::string_view kTransformerImplementations[] = {"local", "transformer_engine"};
constexpr std::string_view kAttentionBackends[] = {"flash", "fused", "unfused", "local", "auto"};
constexpr std::string_view kOptimizers[] = {"adam", "sgd"};
constexpr std::string_view kDataloaderTypes[] = {"single", "cyclic", "external"};
constexpr std::string_view kCheckpointFormats[] = {"native", "torch", "torch_dist", "zarr",
                                                   "torch_dcp"};
constexpr std::string_view kTimingLogOptions[] = {"max", "minmax", "all"};
// Python's names of the signals a process can catch that schedulers send as notice
// (backend/train/exit_signal_handler.hpp).
constexpr std::string_view kExitSignals[] = {"SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"};

constexpr FlagRule norm_epsilon() {
  FlagRule rule = real_flag("--norm-epsilon", 0, false);
  rule.alias = "--layernorm-epsilon";
  return rule;
}
constexpr FlagRule split_shares() {
  FlagRule rule;
  rule.flag = "--split";
  rule.kind = FlagKind::split;
  return rule;
}

// In docs/backend.md's order.
constexpr FlagRule kRules[] = {
    // model
    integer_flag("--num-layers", 1),
    integer_flag("--hidden-size", 1),
    integer_flag("--ffn-hidden-size", 1),
    integer_flag("--num-attention-heads", 1),
    integer_flag("--seq-length", 1),
    integer_flag("--max-position-embeddings", 1),
    integer_flag("--make-vocab-size-divisible-by", 1),
    real_flag("--init-method-std", 0, false),
    norm_epsilon(),
    choice_flag("--position-embedding-type", kPositionEmbeddingTypes),
    integer_flag("--rotary-base", 1),
    real_flag("--rotary-percent", 0, false, 1, true),
    real_flag("--rope-scaling-factor", 1, true),
    choice_flag("--normalization", kNormalizations),
    choice_flag("--recompute-granularity", kRecomputeGranularities),
    choice_flag("--recompute-method", kRecomputeMethods),
    integer_flag("--recompute-num-layers", 0),  // block recompute of 0 layers recomputes nothing
    integer_flag("--num-query-groups", 1),
    integer_flag("--num-key-value-heads", 1),
    probability_flag("--hidden-dropout"),
    probability_flag("--attention-dropout"),
    // tokenizer and data
    choice_flag("--tokenizer-type", kTokenizerTypes),
    integer_flag("--vocab-size", 1, 2147483646,
                 "token ids are 32-bit, and NullTokenizer adds its EOD"),
    text_flag("--vocab-file"),
    text_flag("--merge-file"),
    text_flag("--tokenizer-model"),
    text_flag("--data-path"),
    text_flag("--data-args-path"),
    text_flag("--data-file-list", "--data-path-file"),
    split_shares(),
    text_flag("--train-data-path"),
    text_flag("--valid-data-path"),
    text_flag("--test-data-path"),
    text_flag("--per-split-data-args-path"),
    text_flag("--data-cache-path"),
    integer_flag("--num-dataset-builder-threads", 0, 2147483647),
    // batches and length
    integer_flag("--micro-batch-size", 1),
    integer_flag("--global-batch-size", 1),
    integer_flag("--train-iters", 1),
    integer_flag("--train-samples", 1),
    integer_flag("--rampup-batch-size", 1),  // each of START INCREMENT SAMPLES
    integer_flag("--seed", 1, 4294967295,
                 "Megatron requires a positive seed, and numpy's RandomState one below 2^32"),
    // learning rate and optimizer
    real_flag("--lr", 0, true),
    real_flag("--min-lr", 0, true),
    choice_flag("--lr-decay-style", kDecayStyles),
    integer_flag("--lr-warmup-iters", 0),
    integer_flag("--lr-warmup-samples", 0),
    real_flag("--lr-warmup-fraction", 0, true, 1, false),
    real_flag("--lr-warmup-init", 0, true),
    integer_flag("--lr-decay-iters", 1),
    integer_flag("--lr-decay-samples", 1),
    choice_flag("--lr-wsd-decay-style", kWsdDecayStyles),
    integer_flag("--lr-wsd-decay-iters", 0),
    integer_flag("--lr-wsd-decay-samples", 0),
    real_flag("--weight-decay", 0, true),
    choice_flag("--weight-decay-incr-style", kWeightDecayIncrementStyles),
    real_flag("--start-weight-decay", 0, true),
    real_flag("--end-weight-decay", 0, true),
    real_flag("--clip-grad", 0, true),
    probability_flag("--adam-beta1"),
    probability_flag("--adam-beta2"),
    real_flag("--adam-eps", 0, false),
    // parallelism, device
    integer_flag("--tensor-model-parallel-size", 1),
    integer_flag("--pipeline-model-parallel-size", 1),
    integer_flag("--num-layers-per-virtual-pipeline-stage", 1),
    integer_flag("--ddp-bucket-size", 1),
    // Megatron's is an int ≥ 1 in practice (a timedelta of 0 minutes fails every collective);
    // fractions let a test wait seconds
    real_flag("--distributed-timeout-minutes", 0, false),
    // loss scaling (with --fp16 / --bf16): Megatron's grad scalers assert positive scales, a
    // window and a hysteresis of at least one iteration
    real_flag("--loss-scale", 0, false),
    real_flag("--initial-loss-scale", 0, false),
    real_flag("--min-loss-scale", 0, false),
    integer_flag("--loss-scale-window", 1),
    integer_flag("--hysteresis", 1),
    choice_flag("--device", kDevices),
    choice_flag("--cuda-graph-impl", kCudaGraphImplementations),
    // pretrain_gpt asks for at least 1 and says why (arguments.cpp)
    integer_flag("--cuda-graph-warmup-steps", 0),
    choice_flag("--data-impl", kDataImplementations),
    choice_flag("--distributed-backend", kDistributedBackends),
    choice_flag("--DDP-impl", kDdpImplementations),
    integer_flag("--checkpoint-num-layers", 1),
    choice_flag("--activations-checkpoint-method", kRecomputeMethods),
    integer_flag("--activations-checkpoint-num-layers", 0),  // as --recompute-num-layers
    // Megatron flags without effect here, or built for one value (docs/backend.md, "Flags
    // without effect")
    choice_flag("--transformer-impl", kTransformerImplementations),
    choice_flag("--attention-backend", kAttentionBackends),
    integer_flag("--num-workers", 0),
    integer_flag("--empty-unused-memory-level", 0, 2),
    integer_flag("--manual-gc-interval", 0),
    choice_flag("--timing-log-option", kTimingLogOptions),
    integer_flag("--timing-log-level", 0, 2),
    text_flag("--wandb-project"),
    text_flag("--wandb-exp-name"),
    text_flag("--wandb-save-dir"),
    choice_flag("--optimizer", kOptimizers),
    choice_flag("--dataloader-type", kDataloaderTypes),
    choice_flag("--ckpt-format", kCheckpointFormats),
    integer_flag("--kv-channels", 1),
    integer_flag("--vocab-extra-ids", 0),
    integer_flag("--context-parallel-size", 1),
    integer_flag("--expert-model-parallel-size", 1),
    text_flag("--deepspeed_config"),
    integer_flag("--zero-stage", 0),
    // evaluation, logging, checkpoints
    integer_flag("--eval-interval", 1),
    integer_flag("--eval-iters", 0),
    integer_flag("--log-interval", 1),
    text_flag("--tensorboard-dir"),
    integer_flag("--tensorboard-log-interval", 1),
    integer_flag("--tensorboard-queue-size", 1),
    text_flag("--log-dir"),
    text_flag("--save"),
    text_flag("--load"),
    text_flag("--pretrained-checkpoint"),
    integer_flag("--save-interval", 1),
    integer_flag("--exit-interval", 1),
    real_flag("--exit-duration-in-mins", 0, false),
    choice_flag("--exit-signal", kExitSignals),
    // --rollback-on-spike's (docs/checkpoints.md): a threshold above 1 (at or below the median
    // every ordinary iteration would be a spike), a learning-rate factor in (0, 1]
    real_flag("--spike-threshold", 1, false),
    integer_flag("--spike-window", 1),
    integer_flag("--spike-nan-iterations", 1),
    real_flag("--spike-lr-factor", 0, false, 1, true),
    integer_flag("--spike-max-rollbacks", 0),
    integer_flag("--inject-loss-spike-at-iteration", 1),
    text_flag("--benchmark-output"),
    // evaluate_gpt's tasks (docs/evaluation.md)
    choice_flag("--task", kZeroShotTasks),
    text_flag("--valid-data"),
    integer_flag("--overlapping-eval", 1),
    text_flag("--results-json"),
    // text_generation_server's (docs/serving.md)
    text_flag("--host"),
    integer_flag("--port", 0, 65535, "0 asks for any free port"),
    integer_flag("--max-batch-size", 1),
    integer_flag("--max-concurrent-requests", 1, 4096,
                 "each holds an open connection and its request"),
    integer_flag("--max-request-bytes", 1),
    integer_flag("--max-prompt-bytes", 1),
    integer_flag("--max-tokens-to-generate", 0),
    integer_flag("--socket-timeout", 1, 86400, "seconds, at most a day"),
};

std::string format_real(double value) { return fmt::format("{}", value); }

std::string description(const FlagRule& rule) {
  switch (rule.kind) {
    case FlagKind::integer:
      if (rule.max_integer == kLargestInteger) return fmt::format("an integer ≥ {}", rule.min_integer);
      return fmt::format("an integer in [{}, {}]", rule.min_integer, rule.max_integer);
    case FlagKind::real: {
      const bool bounded_below = rule.lower != -kInfinity, bounded_above = rule.upper != kInfinity;
      if (bounded_below && bounded_above) {
        return fmt::format("a real number in {}{}, {}{}", rule.lower_inclusive ? "[" : "(",
                           format_real(rule.lower), format_real(rule.upper),
                           rule.upper_inclusive ? "]" : ")");
      }
      if (bounded_below) {
        return fmt::format("a real number {} {}", rule.lower_inclusive ? "≥" : ">",
                           format_real(rule.lower));
      }
      return "a finite real number";
    }
    case FlagKind::choice:
      return fmt::format("one of {}", fmt::join(rule.choices, ", "));
    case FlagKind::split:
      return "one to three non-negative shares (train, validation, test) separated by ',' or '/', "
             "not all 0, e.g. 949,50,1";
    case FlagKind::text:
      break;
  }
  return "a text";
}

std::string_view trim(std::string_view text) {
  const auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

// A decimal or scientific real, as strtod reads it without hexadecimal. inf, nan and an
// overflow to infinity are numbers but not finite ones; an underflow reads as the nearest
// representable value, as Python's float().
enum class RealParse { ok, not_a_number, not_finite };
RealParse parse_real(std::string_view text, double& value) {
  const std::string word(trim(text));
  if (word.empty() || word.find_first_of("xX") != std::string::npos) return RealParse::not_a_number;
  char* end = nullptr;
  value = std::strtod(word.c_str(), &end);
  if (end != word.c_str() + word.size()) return RealParse::not_a_number;
  if (!std::isfinite(value)) return RealParse::not_finite;
  return RealParse::ok;
}

// What is wrong with one --split share, or nothing.
std::optional<std::string> share_problem(std::string_view share, double& value) {
  switch (parse_real(share, value)) {
    case RealParse::not_a_number:
      return fmt::format("'{}' is not a number", trim(share));
    case RealParse::not_finite:
      return fmt::format("'{}' is not a finite number", trim(share));
    case RealParse::ok:
      break;
  }
  if (value < 0) return fmt::format("'{}' is negative", trim(share));
  return std::nullopt;
}

// The shares of a --split text, or what is wrong with it.
std::optional<std::string> split_problem(std::string_view text, std::array<double, 3>& shares) {
  std::vector<double> values;
  size_t begin = 0;
  while (true) {
    const size_t end = text.find_first_of(",/", begin);
    const std::string_view share = text.substr(begin, end == std::string_view::npos ? text.npos : end - begin);
    double value = 0;
    if (auto problem = share_problem(share, value)) return problem;
    values.push_back(value);
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  if (values.size() > 3) {
    return fmt::format("{} shares; give at most three (train, validation, test)", values.size());
  }
  values.resize(3, 0.0);
  const double sum = values[0] + values[1] + values[2];
  if (sum <= 0) return std::string("the shares sum to 0");
  // Beyond the largest double the sum is inf, and every share would normalize to 0.
  if (!std::isfinite(sum)) return std::string("the shares sum beyond the largest float64; scale them down");
  shares = {values[0], values[1], values[2]};
  return std::nullopt;
}

}  // namespace

std::span<const FlagRule> flag_rules() { return kRules; }

const FlagRule* find_flag_rule(std::string_view flag) { return find_flag_rule(kRules, flag); }

const FlagRule* find_flag_rule(std::span<const FlagRule> rules, std::string_view flag) {
  for (const FlagRule& rule : rules) {
    if (rule.flag == flag || (!rule.alias.empty() && rule.alias == flag)) return &rule;
  }
  return nullptr;
}

std::string describe_flag_rule(const FlagRule& rule, std::string_view subject) {
  std::string text =
      fmt::format("{} takes {}", subject.empty() ? rule.flag : subject, description(rule));
  if (!rule.note.empty()) text += fmt::format(" ({})", rule.note);
  return text;
}

CheckedFlagValue check_flag_value(const FlagRule& rule, std::string_view value,
                                  std::string_view subject) {
  auto refuse = [&](std::string what) {
    return CheckedFlagValue{fmt::format("{}; {}", what, describe_flag_rule(rule, subject)), ""};
  };
  switch (rule.kind) {
    case FlagKind::integer: {
      std::string_view digits = trim(value);
      const bool negative = digits.starts_with('-');
      if (digits.starts_with('+') || negative) digits.remove_prefix(1);
      if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) {
            return std::isdigit(static_cast<unsigned char>(c)) != 0;
          })) {
        return refuse(fmt::format("'{}' is not an integer", value));
      }
      // Magnitudes beyond int64 are out of every range; say which end they fell off.
      uint64_t magnitude = 0;
      const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude);
      const bool too_big = error == std::errc::result_out_of_range ||
                           magnitude > (negative ? uint64_t{1} << 63 : uint64_t{kLargestInteger});
      if (too_big) {
        return refuse(fmt::format("'{}' is {} than any integer this backend counts in", value,
                                  negative ? "smaller" : "larger"));
      }
      // Negated as a signed value: 2^63 is int64's smallest, every other magnitude fits.
      const int64_t number = !negative                     ? static_cast<int64_t>(magnitude)
                             : magnitude == uint64_t{1} << 63 ? std::numeric_limits<int64_t>::min()
                                                             : -static_cast<int64_t>(magnitude);
      if (number < rule.min_integer || number > rule.max_integer) {
        return refuse(fmt::format("'{}' is out of range", number));
      }
      return {"", fmt::format("{}", number)};
    }
    case FlagKind::real: {
      double number = 0;
      switch (parse_real(value, number)) {
        case RealParse::not_a_number:
          return refuse(fmt::format("'{}' is not a number", value));
        case RealParse::not_finite:
          return refuse(fmt::format("'{}' is not a finite number", value));
        case RealParse::ok:
          break;
      }
      const bool above_lower = rule.lower_inclusive ? number >= rule.lower : number > rule.lower;
      const bool below_upper = rule.upper_inclusive ? number <= rule.upper : number < rule.upper;
      if (!above_lower || !below_upper) return refuse(fmt::format("'{}' is out of range", trim(value)));
      return {"", format_real(number)};
    }
    case FlagKind::choice:
      if (std::find(rule.choices.begin(), rule.choices.end(), value) == rule.choices.end()) {
        return refuse(fmt::format("'{}' is not a valid choice", value));
      }
      return {"", std::string(value)};
    case FlagKind::split: {
      std::array<double, 3> shares{};
      if (auto problem = split_problem(value, shares)) {
        return refuse(fmt::format("'{}': {}", value, *problem));
      }
      return {"", std::string(value)};
    }
    case FlagKind::text:
      break;
  }
  return {"", std::string(value)};
}

std::array<double, 3> parse_split_shares(std::string_view text) {
  std::array<double, 3> shares{};
  if (auto problem = split_problem(text, shares)) {
    fail("--split '{}': {}; {}", text, *problem, describe_flag_rule(*find_flag_rule("--split")));
  }
  return shares;
}

}  // namespace common
