// Training and conversion memory estimates; see memory_estimate.hpp.
#include "backend/common/memory_estimate.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "backend/common/error.hpp"

namespace common {

namespace {

struct Parameters {
  double per_layer = 0;
  double embedding = 0;  // word embedding, position table, untied output layer
  double final_norm = 0;
  double total(double layers) const { return layers * per_layer + embedding + final_norm; }
};

Parameters count_parameters(const ModelShape& m) {
  const double h = static_cast<double>(m.hidden_size);
  const double heads = static_cast<double>(std::max<int64_t>(m.num_attention_heads, 1));
  const double groups = static_cast<double>(m.num_query_groups > 0 ? m.num_query_groups : m.num_attention_heads);
  const double head_dim = h / heads;
  const double f = static_cast<double>(m.ffn_hidden_size);
  const double fc1 = m.gated_mlp ? 2 * f : f;
  const double qkv = h + 2 * groups * head_dim;
  const double norm = m.norm_biases ? 2 * h : h;
  Parameters p;
  p.per_layer = qkv * h + h * h + fc1 * h + h * f + 2 * norm;
  if (m.linear_biases) p.per_layer += qkv + h + fc1 + h;
  const double vocab = static_cast<double>(m.padded_vocab_size);
  p.embedding = vocab * h * (m.untied_output ? 2 : 1) + static_cast<double>(m.position_rows) * h;
  p.final_norm = norm;
  return p;
}

// The limit a cgroup (v2, then v1) sets on this process's memory, or 0 when none is set.
double cgroup_memory_limit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text)) continue;
    try {
      size_t used = 0;
      const double limit = std::stod(text, &used);  // "max" (no limit) is not a number
      if (used == text.size() && limit > 0) return limit;
    } catch (const std::exception&) {
    }
  }
  return 0;
}

}  // namespace

double parameter_count(const ModelShape& shape) {
  return count_parameters(shape).total(static_cast<double>(shape.num_layers));
}

MemoryEstimate estimate_training_memory(const ModelShape& shape, const TrainingSetup& setup) {
  const Parameters p = count_parameters(shape);
  const double layers = static_cast<double>(shape.num_layers);
  const double tp = static_cast<double>(std::max<int64_t>(setup.tensor_parallel, 1));
  const double pp = static_cast<double>(std::max<int64_t>(setup.pipeline_parallel, 1));
  const double dp = static_cast<double>(std::max<int64_t>(setup.data_parallel, 1));
  MemoryEstimate estimate;
  estimate.parameters = p.total(layers);
  // The first pipeline stage holds the embedding; the layers split over pp, everything over tp.
  const double stage_parameters = (layers / pp * p.per_layer + p.embedding + p.final_norm) / tp;
  estimate.weights_bytes = stage_parameters * (setup.mixed_precision ? 2.0 : 4.0);
  estimate.gradients_bytes = stage_parameters * 4.0;
  estimate.optimizer_bytes = stage_parameters * (setup.mixed_precision ? 12.0 : 8.0) /
                             (setup.distributed_optimizer ? dp : 1.0);

  const double s = static_cast<double>(setup.seq_length);
  const double b = static_cast<double>(setup.micro_batch_size);
  const double h = static_cast<double>(shape.hidden_size);
  const double a = static_cast<double>(shape.num_attention_heads);
  const bool scores_kept = setup.attention_scores_stored && setup.recompute != Recompute::selective;
  const double scores = scores_kept ? 5.0 * a * s * s * b / tp : 0.0;
  // Korthikanti et al.'s per-layer 34·sbh, of which 10·sbh (the norms' inputs and outputs, the
  // dropout masks) every tensor-parallel rank holds whole; sequence parallelism divides those
  // too, except the two all-gathered norm outputs (4·sbh) that pretrain_gpt keeps for the
  // backward (Megatron gathers them again there).
  const bool sequence_parallel = setup.sequence_parallel && tp > 1;
  const double full_layer =
      s * b * h * (sequence_parallel ? 4.0 + 30.0 / tp : 10.0 + 24.0 / tp) + scores;
  // L/pp layers × pp micro batches in flight (1F1B) on the first stage: L layers' worth.
  const double activations = setup.recompute == Recompute::full
                                 ? layers * 2.0 * s * b * h + full_layer
                                 : layers * full_layer;
  const double activation_width = setup.mixed_precision ? 1.0 : 2.0;  // the formula counts 16-bit
  const double logits = 2.0 * s * b * static_cast<double>(shape.padded_vocab_size) / tp * 4.0;
  estimate.activations_bytes = activations * activation_width + logits;
  return estimate;
}

MemoryEstimate estimate_conversion_memory(const ModelShape& shape) {
  MemoryEstimate estimate;
  estimate.parameters = parameter_count(shape);
  estimate.weights_bytes = 4.0 * estimate.parameters;
  estimate.file_tensors_bytes = 4.0 * estimate.parameters;
  return estimate;
}

MemoryEstimate estimate_reshard_memory(const ModelShape& shape, bool optimizer_state,
                                       int64_t target_tensor_parallel) {
  MemoryEstimate estimate;
  estimate.parameters = parameter_count(shape);
  estimate.weights_bytes = 4.0 * estimate.parameters;
  estimate.optimizer_bytes = optimizer_state ? 8.0 * estimate.parameters : 0.0;
  estimate.file_tensors_bytes = (estimate.weights_bytes + estimate.optimizer_bytes) /
                                static_cast<double>(std::max<int64_t>(target_tensor_parallel, 1));
  return estimate;
}

std::string format_gigabytes(double bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }

std::vector<std::string> format_memory_estimate(const MemoryEstimate& estimate,
                                                std::string_view capacity) {
  std::vector<std::string> lines = {
      fmt::format("  weights           {:>10}", format_gigabytes(estimate.weights_bytes)),
      fmt::format("  gradients         {:>10}", format_gigabytes(estimate.gradients_bytes)),
      fmt::format("  optimizer states  {:>10}", format_gigabytes(estimate.optimizer_bytes)),
      fmt::format("  activations       {:>10}", format_gigabytes(estimate.activations_bytes)),
  };
  if (estimate.file_tensors_bytes > 0) {
    lines.push_back(fmt::format("  file tensors      {:>10}", format_gigabytes(estimate.file_tensors_bytes)));
  }
  lines.push_back(fmt::format("  total             {:>10}{}", format_gigabytes(estimate.total_bytes()),
                              capacity));
  return lines;
}

AvailableMemory available_memory() {
  const double physical =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const double limit = cgroup_memory_limit();
  if (limit > 0 && limit < physical) return {limit, "the cgroup's memory limit"};
  return {physical, "physical memory"};
}

void require_memory_fits(const MemoryEstimate& estimate, const AvailableMemory& available,
                         std::string_view what, std::string_view ways_out) {
  if (estimate.total_bytes() <= available.bytes) return;
  std::string message = fmt::format(
      "{} does not fit in this machine's memory: an estimated {} ({:.4g} parameters) for {} "
      "available ({})",
      what, format_gigabytes(estimate.total_bytes()), estimate.parameters,
      format_gigabytes(available.bytes), available.source);
  for (const std::string& line : format_memory_estimate(estimate)) message += "\n" + line;
  message += fmt::format("\n{}", ways_out);
  fail("{}", message);
}

}  // namespace common
