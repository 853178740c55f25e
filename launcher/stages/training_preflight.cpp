// Training preflight checks and memory estimate; see training_preflight.hpp.
#include "launcher/stages/training_preflight.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>

#include "backend/common/ascii_case.hpp"
#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"
#include "backend/common/flag_rules.hpp"
#include "backend/data/tokenizer.hpp"
#include "launcher/config/scalar_text.hpp"
#include "launcher/stages/training_keys.hpp"
#include "launcher/stages/training_stage.hpp"

namespace launcher {

namespace {

int64_t integer(const Node& training, std::string_view key, int64_t fallback) {
  return integer_or(training, "training", key, fallback);
}

std::string text(const Node& training, std::string_view key, const std::string& fallback) {
  return text_or(training, "training", key, fallback);
}

// NeMo writes rmsnorm and RMSNorm.
bool is_rmsnorm(const std::string& name) { return common::ascii_lowercase(name) == "rmsnorm"; }

// The vocabulary size of the tokenizer a training job will read, from its files, read by the
// backend's own tokenizers (backend/data/tokenizer.hpp, the `tokenizers` library), when the
// config names a tokenizer file the launcher can read: the tokenizer the training stage passes
// (model.tokenizer.library and type → --tokenizer-type; library huggingface: type is the
// directory of tokenizer.json) with model.tokenizer.model. NeMo's configs carry a vocab_size of
// their own (Llama 2's 32000) that need not be that file's. nullopt when there is no such file
// here (a path only the cluster has; GPT-2's and NullTokenizer's sizes need none); a file that
// is there but is no tokenizer is a problem. Sizes are kept per file, for autoconfig's many
// preflights of one config.
struct FileVocabulary {
  int64_t size = 0;
  std::string source;  // for the preflight line: "the tokenizer's, <path>"
};
std::optional<FileVocabulary> tokenizer_file_vocabulary(const Node& training,
                                                        std::vector<std::string>& problems) {
  namespace fs = std::filesystem;
  const std::string library = text(training, "model.tokenizer.library", "megatron");
  std::string type = text(training, "model.tokenizer.type", "");
  std::string file = text(training, "model.tokenizer.model", "");
  std::string key = "training.model.tokenizer.model";
  if (library == "huggingface") {
    file = type;
    type = "HuggingFaceTokenizer";
    key = "training.model.tokenizer.type";
  } else if (library == "sentencepiece" && type.empty()) {
    type = "GPTSentencePieceTokenizer";
  }
  if (file.empty() || !backend::reads_tokenizer_model(type)) return std::nullopt;
  std::error_code error;
  const fs::path readable =
      type == "HuggingFaceTokenizer" && fs::is_directory(file, error) ? fs::path(file) / "tokenizer.json"
                                                                      : fs::path(file);
  if (!fs::is_regular_file(readable, error) || ::access(readable.c_str(), R_OK) != 0) {
    return std::nullopt;
  }
  static std::mutex mutex;
  static std::map<std::pair<std::string, std::string>, int64_t> sizes;
  const std::lock_guard lock(mutex);
  auto known = sizes.find({type, file});
  if (known == sizes.end()) {
    try {
      backend::TokenizerOptions options;
      options.tokenizer_type = type;
      options.tokenizer_model = file;
      const auto tokenizer = backend::build_tokenizer(options);
      known = sizes.emplace(std::pair{type, file}, tokenizer->vocab_size()).first;
    } catch (const common::Error& problem) {
      problems.push_back(fmt::format("{} {}: the job's {} cannot read it: {}", key, file, type,
                                     problem.what()));
      return std::nullopt;
    }
  }
  return FileVocabulary{known->second, fmt::format("{}'s, {}", type, file)};
}

// NeMo's trainer.precision in 16 bits (bf16, bf16-mixed, 16, 16-mixed): --bf16 or --fp16.
bool is_mixed_precision(std::string_view precision) {
  return precision.starts_with("bf16") || precision.starts_with("16");
}

// The layout and memory checks of training_preflight, on values that passed their rules.
void check_layout_and_memory(const Node& config, const Node& training, PreflightReport& report) {
  auto& problems = report.problems;
  using common::checked_multiply;

  const int64_t nodes = integer(training, "trainer.num_nodes", 1);
  const int64_t devices = integer(training, "trainer.devices", 1);
  report.gpus = checked_multiply(nodes, devices, "training.trainer.num_nodes × devices");
  report.nodes = nodes;
  report.gpus_per_node = devices;
  const int64_t tp = report.tensor_parallel = integer(training, "model.tensor_model_parallel_size", 1);
  const int64_t pp = report.pipeline_parallel =
      integer(training, "model.pipeline_model_parallel_size", 1);
  if (tp < 1 || pp < 1 || report.gpus < 1) {
    problems.push_back(fmt::format("tensor ({}), pipeline ({}) parallel sizes and num_nodes × "
                                   "devices ({}) must all be ≥ 1", tp, pp, report.gpus));
    return;
  }
  const int64_t model_parallel = checked_multiply(
      tp, pp, "training.model.tensor_model_parallel_size × pipeline_model_parallel_size");
  if (report.gpus % model_parallel != 0) {
    problems.push_back(fmt::format(
        "training.model.tensor_model_parallel_size {} × pipeline_model_parallel_size {} = {} does "
        "not divide the {} GPUs of training.trainer.num_nodes {} × devices {}",
        tp, pp, model_parallel, report.gpus, nodes, devices));
  }
  const int64_t dp = report.data_parallel = std::max<int64_t>(1, report.gpus / model_parallel);

  const int64_t layers = integer(training, "model.num_layers", 0);
  const int64_t hidden = integer(training, "model.hidden_size", 0);
  const int64_t heads = integer(training, "model.num_attention_heads", 0);
  const int64_t seq = integer(training, "model.encoder_seq_length", 0);
  const int64_t mbs = integer(training, "model.micro_batch_size", 1);
  if (layers < 1 || hidden < 1 || heads < 1 || seq < 1 || mbs < 1) {
    problems.push_back(fmt::format("training.model: num_layers ({}), hidden_size ({}), "
                                   "num_attention_heads ({}), encoder_seq_length ({}) and "
                                   "micro_batch_size ({}) must all be given and ≥ 1",
                                   layers, hidden, heads, seq, mbs));
    return;
  }
  const int64_t ffn = find_set(training, "model.ffn_hidden_size") != nullptr
                          ? integer(training, "model.ffn_hidden_size", 0)
                          : checked_multiply(4, hidden, "4 × training.model.hidden_size");
  const int64_t positions = integer(training, "model.max_position_embeddings", seq);
  const int64_t micro_batches_at_once =
      checked_multiply(mbs, dp, "training.model.micro_batch_size × data-parallel size");
  const int64_t gbs = integer(training, "model.global_batch_size", micro_batches_at_once);
  if (heads % tp != 0) {
    problems.push_back(fmt::format("training.model.num_attention_heads {} is not divisible by "
                                   "tensor_model_parallel_size {}", heads, tp));
  }
  if (layers % pp != 0) {
    problems.push_back(fmt::format("training.model.num_layers {} is not divisible by "
                                   "pipeline_model_parallel_size {}", layers, pp));
  }
  // Megatron's interleaved schedule (model.virtual_pipeline_model_parallel_size V ≥ 2, passed as
  // --num-layers-per-virtual-pipeline-stage): its rules, as pretrain_gpt enforces them.
  const int64_t chunks = report.virtual_pipeline = virtual_pipeline_chunks(config);
  if (chunks > 1) {
    // Megatron's interleaved schedule needs pp > 1, and pp > 2 without overlapped p2p
    // communication (two sends between the same two ranks in one batch otherwise).
    const Node* overlap = find_set(training, "model.overlap_p2p_comm");
    const bool overlapped =
        overlap != nullptr && overlap->as_bool("training.model.overlap_p2p_comm");
    // NeMo hands both to Megatron core's interleaved schedule, which refuses the pair
    // (batch_p2p_comm defaults to true there).
    const Node* batched = find_set(training, "model.batch_p2p_comm");
    if (overlapped && (batched == nullptr || batched->as_bool("training.model.batch_p2p_comm"))) {
      problems.push_back(
          "training.model.overlap_p2p_comm true needs training.model.batch_p2p_comm false (NeMo's "
          "default is true): Megatron core's interleaved schedule can not use both "
          "overlap_p2p_comm "
          "and batch_p2p_comm");
    }
    if (pp == 1 || (pp == 2 && !overlapped)) {
      problems.push_back(fmt::format(
          "training.model.virtual_pipeline_model_parallel_size {} needs "
          "pipeline_model_parallel_size > {} for Megatron's interleaved schedule{}, got {}: raise "
          "pipeline_model_parallel_size{} or set virtual_pipeline_model_parallel_size to null",
          chunks, overlapped ? 1 : 2, overlapped ? "" : " without overlap_p2p_comm", pp,
          pp == 2 ? ", set overlap_p2p_comm to true" : ""));
    }
    try {
      layers_per_virtual_pipeline_stage(config);
    } catch (const common::Error& error) {
      problems.push_back(error.what());  // num_layers not divisible by pp × V
    }
    // The schedule runs the micro batches of a step in rounds of pp (only countable when the
    // layout and the batch divide; their own problems are reported otherwise).
    if (report.gpus % model_parallel == 0 && gbs % micro_batches_at_once == 0 &&
        (gbs / micro_batches_at_once) % pp != 0) {
      problems.push_back(fmt::format(
          "training.model.global_batch_size {} / (micro_batch_size {} × data-parallel size {}) = "
          "{} micro batches per step is not divisible by pipeline_model_parallel_size {}, as "
          "Megatron's interleaved schedule (virtual_pipeline_model_parallel_size {}) needs",
          gbs, mbs, dp, gbs / micro_batches_at_once, pp, chunks));
    }
  }
  if (hidden % heads != 0) {
    problems.push_back(fmt::format("training.model.num_attention_heads {} does not divide "
                                   "hidden_size {}", heads, hidden));
  }
  if (gbs % micro_batches_at_once != 0) {
    problems.push_back(fmt::format(
        "training.model.global_batch_size {} is not divisible by micro_batch_size {} × "
        "data-parallel size {} (= {} GPUs / (tp {} × pp {}))", gbs, mbs, dp, report.gpus, tp, pp));
  }
  if (seq > positions) {
    problems.push_back(fmt::format("training.model.encoder_seq_length {} exceeds "
                                   "max_position_embeddings {}", seq, positions));
  }

  const std::string data_impl = text(training, "model.data.data_impl", "mmap");
  // An empty test split is fine: pretrain_gpt skips the test pass, as Megatron does.
  const int64_t validation_batches = launcher::validation_batches(config).value_or(0);
  const Node* data_prefix = find_set(training, "model.data.data_prefix");
  const bool per_split_blends = data_prefix != nullptr && data_prefix->is_map();
  if (data_impl != "mock" && !per_split_blends) {
    // Checked against the --split rule already (training_value_problems).
    const std::string split = text(training, "model.data.splits_string", "969,30,1");
    if (validation_batches > 0 && common::parse_split_shares(split)[1] == 0) {
      problems.push_back(fmt::format(
          "training.model.data.splits_string '{}' leaves the validation split empty while "
          "training.trainer.limit_val_batches is {}: give validation a share (e.g. 99990,8,2) or "
          "set training.trainer.limit_val_batches=0", split, validation_batches));
    }
  }

  // The tokenizer's vocabulary: read from its files where the launcher can read them, GPT-2's
  // for GPT2BPETokenizer, else model.tokenizer.vocab_size; padded as Megatron pads it (a
  // multiple of make_vocab_size_divisible_by × tp).
  const bool gpt2 = text(training, "model.tokenizer.type", "") == "GPT2BPETokenizer";
  int64_t tokenizer_vocab = gpt2 ? 50257 : integer(training, "model.tokenizer.vocab_size", 50257);
  report.vocabulary_source = gpt2 ? "GPT-2's" : find_set(training, "model.tokenizer.vocab_size")
                                                    ? "training.model.tokenizer.vocab_size"
                                                    : "GPT-2's, no tokenizer file or vocab_size given";
  if (const auto from_files = tokenizer_file_vocabulary(training, problems)) {
    tokenizer_vocab = from_files->size;
    report.vocabulary_source = from_files->source;
  }
  if (tokenizer_vocab < 1) {
    problems.push_back(fmt::format("training.model.tokenizer.vocab_size {} must be ≥ 1", tokenizer_vocab));
    return;
  }
  const int64_t divisible = checked_multiply(
      integer(training, "model.make_vocab_size_divisible_by", 128), tp,
      "training.model.make_vocab_size_divisible_by × tensor_model_parallel_size");
  const int64_t vocab =
      common::checked_add(tokenizer_vocab, divisible - 1, "the padded vocabulary") / divisible * divisible;
  report.vocabulary = tokenizer_vocab;
  report.padded_vocabulary = vocab;
  const int64_t groups = integer(training, "model.num_query_groups", heads);
  if (groups < 1 || heads % groups != 0) {
    problems.push_back(fmt::format("training.model.num_query_groups {} does not divide "
                                   "num_attention_heads {}", groups, heads));
  } else if (groups % tp != 0 && tp % groups != 0) {
    problems.push_back(fmt::format("training.model.num_query_groups {} and "
                                   "tensor_model_parallel_size {}: one must divide the other",
                                   groups, tp));
  }
  const Node* shared = find_set(training, "model.share_embeddings_and_output_weights");
  const Node* bias = find_set(training, "model.bias");
  const common::ModelShape shape{
      .num_layers = layers,
      .hidden_size = hidden,
      .num_attention_heads = heads,
      .num_query_groups = std::max<int64_t>(groups, 1),
      .ffn_hidden_size = ffn,
      .padded_vocab_size = vocab,
      .position_rows =
          text(training, "model.position_embedding_type", "learned_absolute") == "learned_absolute"
              ? positions
              : 0,
      .gated_mlp = text(training, "model.activation", "gelu").find("swiglu") != std::string::npos,
      .linear_biases = bias == nullptr || bias->as_bool("training.model.bias"),
      .norm_biases = !is_rmsnorm(text(training, "model.normalization", "layernorm")),
      .untied_output =
          shared != nullptr && !shared->as_bool("training.model.share_embeddings_and_output_weights")};

  report.precision = text(training, "trainer.precision", "32");
  const std::string optimizer = text(training, "model.optim.name", "adam");
  report.distributed_optimizer = optimizer == "distributed_fused_adam";
  report.recompute = text(training, "model.activations_checkpoint_granularity", "none");
  common::TrainingSetup setup;
  setup.seq_length = seq;
  setup.micro_batch_size = mbs;
  setup.tensor_parallel = tp;
  setup.pipeline_parallel = pp;
  setup.virtual_pipeline_chunks = chunks;  // the interleaved schedule keeps more in flight
  setup.data_parallel = dp;
  setup.mixed_precision = is_mixed_precision(report.precision);
  // NeMo's distributed_fused_adam is Megatron's distributed optimizer, ZeRO stage 1; NeMo has no
  // key for stage 3 or offload, so the launcher never estimates them.
  setup.zero_stage = report.distributed_optimizer ? 1 : 0;
  const Node* sequence_parallel = find_set(training, "model.sequence_parallel");
  setup.sequence_parallel =
      sequence_parallel != nullptr && sequence_parallel->as_bool("training.model.sequence_parallel");
  setup.recompute = report.recompute == "selective" ? common::Recompute::selective
                    : report.recompute == "full"    ? common::Recompute::full
                                                    : common::Recompute::none;
  // pretrain_gpt's attention never holds the s × s scores: blockwise on the CPU, the fused
  // FlashAttention-style kernel on the GPU (the default there, --use-flash-attn), so the
  // estimate leaves out Korthikanti's 5·a·s²·b term whatever NeMo's use_flash_attention says
  // (NeMo's unfused path, which stores them, has no counterpart here).
  setup.attention_scores_stored = false;
  report.memory = common::estimate_training_memory(shape, setup);
  report.parameters = report.memory.parameters;

  if (const Node* memory = find_set(config, "cluster.gpu_memory_gb")) {
    const double gigabytes = memory->as_double("cluster.gpu_memory_gb");
    // NaN compares false with every estimate: it would switch the fit check off unseen.
    if (!std::isfinite(gigabytes) || gigabytes <= 0) {
      problems.push_back(fmt::format(
          "cluster.gpu_memory_gb {}: expected the GPU's memory in GB, a finite number > 0 "
          "(e.g. 80), or null to skip the memory check", gigabytes));
      return;
    }
    report.gpu_memory_bytes = gigabytes * 1e9;
    if (report.memory.total_bytes() > report.gpu_memory_bytes) {
      problems.push_back(fmt::format(
          "the estimated {} per GPU exceed cluster.gpu_memory_gb {}: raise tensor/pipeline "
          "parallelism, lower micro_batch_size, use the distributed optimizer "
          "(training.model.optim.name=distributed_fused_adam) or activation recompute "
          "(training.model.activations_checkpoint_granularity=full)",
          common::format_gigabytes(report.memory.total_bytes()),
          memory->as_double("cluster.gpu_memory_gb")));
    }
  }
}

// Whether a Slurm job gets GPUs: NeMo's bcm.yaml asks with gpus_per_node; gpus_per_task or
// gres ask too.
bool slurm_gives_gpus(const Node& config) {
  for (const char* key : {"cluster.gpus_per_node", "cluster.gpus_per_task", "cluster.gres"}) {
    if (find_set(config, key) != nullptr) return true;
  }
  return false;
}

// What pretrain_gpt cannot run on this cluster's GPUs (the header's list): ranks sharing a GPU.
void check_gpu_layout(const Node& config, std::string_view cluster_type, PreflightReport& report) {
  if (cluster_type != "bcm" || !slurm_gives_gpus(config)) return;
  const Node* per_node = find_set(config, "cluster.gpus_per_node");
  if (per_node == nullptr) return;
  const int64_t node_gpus = per_node->as_int("cluster.gpus_per_node");
  if (report.gpus_per_node > node_gpus) {
    report.unsupported.push_back(fmt::format(
        "training.trainer.devices {} tasks per node, but cluster.gpus_per_node {}: ranks would "
        "share GPUs, which NCCL refuses; set training.trainer.devices={} (one task per GPU)",
        report.gpus_per_node, node_gpus, node_gpus));
  } else if (report.gpus_per_node < node_gpus) {
    report.warnings.push_back(fmt::format(
        "training.trainer.devices {} tasks per node with cluster.gpus_per_node {}: {} GPU(s) of "
        "each node stay idle (one task per GPU uses them all: training.trainer.devices={})",
        report.gpus_per_node, node_gpus, node_gpus - report.gpus_per_node, node_gpus));
  }
}

}  // namespace

PreflightReport training_preflight(const Node& config, std::string_view cluster_type) {
  PreflightReport report;
  const Node& training = at_path(config, "training");
  auto& problems = report.problems;
  // Values the backend would refuse first: nothing below is computed from them (a zero
  // make_vocab_size_divisible_by once divided by zero here).
  // Every key accounted for: mapped, known to have no effect, or reported.
  TrainingKeyReport keys = account_training_keys(config);
  report.warnings = std::move(keys.warnings);
  problems = std::move(keys.errors);
  const std::vector<std::string> value_problems = training_value_problems(config);
  problems.insert(problems.end(), value_problems.begin(), value_problems.end());
  if (!value_problems.empty()) return report;
  try {
    check_layout_and_memory(config, training, report);
    check_gpu_layout(config, cluster_type, report);
  } catch (const common::Error& error) {
    problems.push_back(error.what());  // a product of sizes that does not fit int64
  }
  return report;
}

std::vector<std::string> format_preflight(const PreflightReport& report) {
  const std::string capacity =
      report.gpu_memory_bytes > 0 ? " of " + common::format_gigabytes(report.gpu_memory_bytes) : "";
  std::vector<std::string> lines = {
      fmt::format(
          "preflight: {} GPU(s) ({} node(s) × {}) = tp {} × pp {}{} × dp {}; {:.1f}M "
          "parameters; precision {}; distributed optimizer {}; recompute {}; attention "
          "fused (no s² scores kept); vocabulary {} ({}), padded to {}",
          report.gpus, report.nodes, report.gpus_per_node, report.tensor_parallel,
          report.pipeline_parallel,
          report.virtual_pipeline > 1
              ? fmt::format(" (interleaved, {} model chunks per stage)", report.virtual_pipeline)
              : "",
          report.data_parallel, report.parameters / 1e6, report.precision,
          report.distributed_optimizer ? "yes" : "no", report.recompute, report.vocabulary,
          report.vocabulary_source, report.padded_vocabulary),
      "preflight: memory per GPU (estimate, most loaded pipeline stage)",
  };
  for (auto& line : common::format_memory_estimate(report.memory, capacity)) lines.push_back(std::move(line));
  return lines;
}

void enforce_training_preflight(const Node& config, std::string_view cluster_type, bool dry_run) {
  PreflightReport report = training_preflight(config, cluster_type);
  for (const auto& warning : report.warnings) spdlog::warn("{}", warning);
  for (auto& unsupported : report.unsupported) {
    if (dry_run) {
      spdlog::warn("{} (--dry-run renders the scripts; without it the launch is refused)",
                   unsupported);
    } else {
      report.problems.push_back(std::move(unsupported));
    }
  }
  if (report.parameters > 0) {
    for (const auto& line : format_preflight(report)) spdlog::info("{}", line);
  }
  if (!report.problems.empty()) {
    std::string message = "preflight refused the training stage before queueing it:";
    for (const auto& problem : report.problems) message += "\n  - " + problem;
    common::fail("{}", message);
  }
}

}  // namespace launcher
