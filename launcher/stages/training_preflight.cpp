// Training preflight checks and memory estimate; see training_preflight.hpp.
#include "launcher/stages/training_preflight.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>

#include "backend/common/error.hpp"
#include "launcher/config/scalar_text.hpp"

namespace launcher {

namespace {

int64_t integer(const Node& training, std::string_view key, int64_t fallback) {
  return integer_or(training, "training", key, fallback);
}

std::string text(const Node& training, std::string_view key, const std::string& fallback) {
  return text_or(training, "training", key, fallback);
}

// Megatron's split string: "a,b,c" or "a/b/c", padded with zeros to three, normalised.
std::vector<double> parse_split(const std::string& split, std::vector<std::string>& problems) {
  std::vector<double> shares;
  std::string part;
  auto flush = [&]() {
    try {
      size_t used = 0;
      const double value = std::stod(part, &used);
      if (used != part.size() || value < 0 || !std::isfinite(value)) throw std::invalid_argument(part);
      shares.push_back(value);
    } catch (const std::exception&) {
      problems.push_back(fmt::format("training.model.data.splits_string '{}': '{}' is not a "
                                     "non-negative number (e.g. 99990,8,2)", split, part));
    }
    part.clear();
  };
  for (char c : split) {
    if (c == ',' || c == '/') {
      flush();
    } else if (c != ' ') {
      part += c;
    }
  }
  flush();
  if (shares.size() > 3) {
    problems.push_back(fmt::format("training.model.data.splits_string '{}' has {} parts; Megatron "
                                   "takes at most three (train, validation, test)", split, shares.size()));
  }
  while (shares.size() < 3) shares.push_back(0.0);
  return shares;
}

std::string gigabytes(double bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }

}  // namespace

PreflightReport training_preflight(const Node& config) {
  PreflightReport report;
  const Node& training = at_path(config, "training");
  auto& problems = report.problems;

  const int64_t nodes = integer(training, "trainer.num_nodes", 1);
  const int64_t devices = integer(training, "trainer.devices", 1);
  report.gpus = nodes * devices;
  const int64_t tp = report.tensor_parallel = integer(training, "model.tensor_model_parallel_size", 1);
  const int64_t pp = report.pipeline_parallel =
      integer(training, "model.pipeline_model_parallel_size", 1);
  if (tp < 1 || pp < 1 || report.gpus < 1) {
    problems.push_back(fmt::format("tensor ({}), pipeline ({}) parallel sizes and num_nodes × "
                                   "devices ({}) must all be ≥ 1", tp, pp, report.gpus));
    return report;
  }
  if (report.gpus % (tp * pp) != 0) {
    problems.push_back(fmt::format(
        "training.model.tensor_model_parallel_size {} × pipeline_model_parallel_size {} = {} does "
        "not divide the {} GPUs of training.trainer.num_nodes {} × devices {}",
        tp, pp, tp * pp, report.gpus, nodes, devices));
  }
  const int64_t dp = report.data_parallel = std::max<int64_t>(1, report.gpus / (tp * pp));

  const int64_t layers = integer(training, "model.num_layers", 0);
  const int64_t hidden = integer(training, "model.hidden_size", 0);
  const int64_t heads = integer(training, "model.num_attention_heads", 0);
  const int64_t ffn = integer(training, "model.ffn_hidden_size", 4 * hidden);
  const int64_t seq = integer(training, "model.encoder_seq_length", 0);
  const int64_t positions = integer(training, "model.max_position_embeddings", seq);
  const int64_t mbs = integer(training, "model.micro_batch_size", 1);
  const int64_t gbs = integer(training, "model.global_batch_size", mbs * dp);
  if (layers < 1 || hidden < 1 || heads < 1 || seq < 1 || mbs < 1) {
    problems.push_back(fmt::format("training.model: num_layers ({}), hidden_size ({}), "
                                   "num_attention_heads ({}), encoder_seq_length ({}) and "
                                   "micro_batch_size ({}) must all be ≥ 1",
                                   layers, hidden, heads, seq, mbs));
    return report;
  }
  if (heads % tp != 0) {
    problems.push_back(fmt::format("training.model.num_attention_heads {} is not divisible by "
                                   "tensor_model_parallel_size {}", heads, tp));
  }
  if (layers % pp != 0) {
    problems.push_back(fmt::format("training.model.num_layers {} is not divisible by "
                                   "pipeline_model_parallel_size {}", layers, pp));
  }
  if (hidden % heads != 0) {
    problems.push_back(fmt::format("training.model.num_attention_heads {} does not divide "
                                   "hidden_size {}", heads, hidden));
  }
  if (gbs % (mbs * dp) != 0) {
    problems.push_back(fmt::format(
        "training.model.global_batch_size {} is not divisible by micro_batch_size {} × "
        "data-parallel size {} (= {} GPUs / (tp {} × pp {}))", gbs, mbs, dp, report.gpus, tp, pp));
  }
  if (seq > positions) {
    problems.push_back(fmt::format("training.model.encoder_seq_length {} exceeds "
                                   "max_position_embeddings {}", seq, positions));
  }

  const std::string data_impl = text(training, "model.data.data_impl", "mmap");
  const int64_t validation_batches = integer(training, "trainer.limit_val_batches", 0);
  if (data_impl != "mock") {
    const std::string split = text(training, "model.data.splits_string", "969,30,1");
    const auto shares = parse_split(split, problems);
    if (shares[0] + shares[1] + shares[2] <= 0) {
      problems.push_back(fmt::format("training.model.data.splits_string '{}' gives every split a "
                                     "zero share", split));
    } else if (validation_batches > 0 && shares[1] == 0) {
      problems.push_back(fmt::format(
          "training.model.data.splits_string '{}' leaves the validation split empty while "
          "training.trainer.limit_val_batches is {}: give validation a share (e.g. 99990,8,2) or "
          "set training.trainer.limit_val_batches=0", split, validation_batches));
    }
  }

  // Parameters: embeddings (padded vocabulary), positions (learned absolute only), per layer
  // the attention (q and output h² each, k and v h·groups·head_dim each), the MLP (2·h·ffn, or
  // 3·h·ffn with SwiGLU's gate), 9h + ffn biases and norms; a separate output layer when the
  // embedding is not shared.
  // The tokenizer's vocabulary: GPT-2's for GPT2BPETokenizer, else model.tokenizer.vocab_size.
  const int64_t tokenizer_vocab = text(training, "model.tokenizer.type", "") == "GPT2BPETokenizer"
                                      ? 50257
                                      : integer(training, "model.tokenizer.vocab_size", 50257);
  const int64_t divisible = integer(training, "model.make_vocab_size_divisible_by", 128) * tp;
  const int64_t vocab = (tokenizer_vocab + divisible - 1) / divisible * divisible;
  const int64_t groups = integer(training, "model.num_query_groups", heads);
  if (groups < 1 || heads % groups != 0) {
    problems.push_back(fmt::format("training.model.num_query_groups {} does not divide "
                                   "num_attention_heads {}", groups, heads));
  } else if (groups % tp != 0 && tp % groups != 0) {
    problems.push_back(fmt::format("training.model.num_query_groups {} and "
                                   "tensor_model_parallel_size {}: one must divide the other",
                                   groups, tp));
  }
  const std::string activation = text(training, "model.activation", "gelu");
  const bool gated = activation.find("swiglu") != std::string::npos;
  const double head_dim = static_cast<double>(hidden) / heads;
  const double attention_weights = 2.0 * hidden * hidden + 2.0 * hidden * std::max<int64_t>(groups, 1) * head_dim;
  const double per_layer = attention_weights + (gated ? 3.0 : 2.0) * hidden * ffn + 9.0 * hidden + ffn;
  const bool learned_positions = text(training, "model.position_embedding_type", "learned_absolute") ==
                                 "learned_absolute";
  const Node* shared = find_set(training, "model.share_embeddings_and_output_weights");
  const bool untied = shared != nullptr && !shared->as_bool("training.model.share_embeddings_and_output_weights");
  const double embedding = static_cast<double>(vocab) * hidden * (untied ? 2.0 : 1.0) +
                           (learned_positions ? static_cast<double>(positions) * hidden : 0.0);
  report.parameters = static_cast<int64_t>(layers * per_layer + embedding + 2.0 * hidden);
  // The first pipeline stage holds the embedding; the layers split over pp, everything over tp.
  const double stage_parameters = (layers / static_cast<double>(pp) * per_layer + embedding) / tp;

  report.precision = text(training, "trainer.precision", "32");
  const bool mixed = report.precision.starts_with("bf16") || report.precision.starts_with("16");
  const std::string optimizer = text(training, "model.optim.name", "adam");
  report.distributed_optimizer = optimizer == "distributed_fused_adam";
  report.recompute = text(training, "model.activations_checkpoint_granularity", "none");
  if (report.recompute != "none" && report.recompute != "selective" && report.recompute != "full") {
    problems.push_back(fmt::format("training.model.activations_checkpoint_granularity '{}' is not "
                                   "valid (valid: null, selective, full)", report.recompute));
  }
  const double optimizer_bytes_per_parameter = mixed ? 12.0 : 8.0;
  report.memory.weights_bytes = stage_parameters * (mixed ? 2.0 : 4.0);
  report.memory.gradients_bytes = stage_parameters * 4.0;
  report.memory.optimizer_bytes = stage_parameters * optimizer_bytes_per_parameter /
                                  (report.distributed_optimizer ? dp : 1);
  const double activation_width = mixed ? 1.0 : 2.0;  // the formula counts 16-bit activations
  const double s = seq, b = mbs, h = hidden, a = heads, t = tp;
  // Selective recompute (Korthikanti et al. §5) recomputes the attention core, dropping the
  // 5·a·s²·b/t term of the scores and their softmax.
  const double scores = report.recompute == "selective" ? 0.0 : 5.0 * a * s * s * b / t;
  const double full_layer = s * b * h * (10.0 + 24.0 / t) + scores;
  const double layers_held = layers;  // L/pp layers × pp micro batches in flight (1F1B)
  const double activations =
      report.recompute == "full" ? layers_held * 2.0 * s * b * h + full_layer
                                 : layers_held * full_layer;
  const double logits = 2.0 * s * b * vocab / t * 4.0;  // fp32 logits and their gradient
  report.memory.activations_bytes = activations * activation_width + logits;

  if (const Node* memory = find_set(config, "cluster.gpu_memory_gb")) {
    report.gpu_memory_bytes = memory->as_double("cluster.gpu_memory_gb") * 1e9;
    if (report.memory.total_bytes() > report.gpu_memory_bytes) {
      problems.push_back(fmt::format(
          "the estimated {} per GPU exceed cluster.gpu_memory_gb {}: raise tensor/pipeline "
          "parallelism, lower micro_batch_size, use the distributed optimizer "
          "(training.model.optim.name=distributed_fused_adam) or activation recompute "
          "(training.model.activations_checkpoint_granularity=full)",
          gigabytes(report.memory.total_bytes()), memory->as_double("cluster.gpu_memory_gb")));
    }
  }
  return report;
}

std::vector<std::string> format_preflight(const PreflightReport& report) {
  const std::string capacity =
      report.gpu_memory_bytes > 0 ? fmt::format(" of {}", gigabytes(report.gpu_memory_bytes)) : "";
  return {
      fmt::format("preflight: {} GPU(s) = tp {} × pp {} × dp {}; {:.1f}M parameters; precision {}; "
                  "distributed optimizer {}; recompute {}",
                  report.gpus, report.tensor_parallel, report.pipeline_parallel,
                  report.data_parallel, report.parameters / 1e6, report.precision,
                  report.distributed_optimizer ? "yes" : "no", report.recompute),
      "preflight: memory per GPU (estimate, most loaded pipeline stage)",
      fmt::format("  weights           {:>10}", gigabytes(report.memory.weights_bytes)),
      fmt::format("  gradients         {:>10}", gigabytes(report.memory.gradients_bytes)),
      fmt::format("  optimizer states  {:>10}", gigabytes(report.memory.optimizer_bytes)),
      fmt::format("  activations       {:>10}", gigabytes(report.memory.activations_bytes)),
      fmt::format("  total             {:>10}{}", gigabytes(report.memory.total_bytes()), capacity),
  };
}

void enforce_training_preflight(const Node& config) {
  const PreflightReport report = training_preflight(config);
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
