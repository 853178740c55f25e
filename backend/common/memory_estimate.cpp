// Training and conversion memory estimates; see memory_estimate.hpp.
#include "backend/common/memory_estimate.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"

namespace common {

namespace {

struct Parameters {
  double per_layer = 0;
  double word_embedding = 0;  // V·h; an untied output layer is another
  double position_table = 0;
  bool untied_output = false;
  double final_norm = 0;
  double total(double layers) const {
    return layers * per_layer + word_embedding * (untied_output ? 2 : 1) + position_table +
           final_norm;
  }
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
  p.word_embedding = static_cast<double>(m.padded_vocab_size) * h;
  p.position_table = static_cast<double>(m.position_rows) * h;
  p.untied_output = m.untied_output;
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

// One pipeline stage's share (see the header for the model): `first` and `last` say whether it
// holds the embedding and the output layer; both with one stage.
MemoryEstimate estimate_stage_memory(const ModelShape& shape, const Parameters& p,
                                     const TrainingSetup& setup, bool first, bool last) {
  const double layers = static_cast<double>(shape.num_layers);
  const double tp = static_cast<double>(std::max<int64_t>(setup.tensor_parallel, 1));
  const double pp = static_cast<double>(std::max<int64_t>(setup.pipeline_parallel, 1));
  const double dp = static_cast<double>(std::max<int64_t>(setup.data_parallel, 1));
  const double chunks = static_cast<double>(std::max<int64_t>(setup.virtual_pipeline_chunks, 1));
  const double rank = first ? 0.0 : pp - 1;

  // The stage's units, each ÷ tp. A tied output layer is the embedding itself on a single
  // stage, a copy of it on the last of several.
  const double stage_layers = layers / pp;
  const double layer = p.per_layer / tp;
  const double embedding = first ? (p.word_embedding + p.position_table) / tp : 0.0;
  const double output =
      last ? ((p.untied_output || !first ? p.word_embedding : 0.0) + p.final_norm) / tp : 0.0;
  const double stage_parameters = stage_layers * layer + embedding + output;
  // ZeRO-3's working set as pretrain_gpt keeps it (GptModel's working slots): one slot for each
  // kind of unit on the stage, the embedding, a layer and the head (the final norm and the
  // output layer, when that is not the embedding itself), each with room for a unit's gathered
  // parameters and its whole gradient.
  const double working_set = embedding + (stage_layers > 0 ? layer : 0.0) + output;

  MemoryEstimate estimate;
  estimate.parameters = p.total(layers);
  const double weight_width = setup.mixed_precision ? 2.0 : 4.0;
  const double optimizer_width = setup.mixed_precision ? 12.0 : 8.0;
  const bool sharded = setup.zero_stage >= 1;
  const double gradient_shard = sharded ? stage_parameters * 4.0 / dp : 0.0;
  double parameter_shard = stage_parameters * weight_width;
  if (setup.zero_stage == 3) {
    parameter_shard /= dp;
    estimate.weights_bytes = working_set * weight_width;
    estimate.gradients_bytes = working_set * 4.0;
  } else {
    estimate.gradients_bytes = stage_parameters * 4.0;
  }
  const double optimizer = stage_parameters * optimizer_width / (sharded ? dp : 1.0);
  if (setup.offload_parameters) {
    estimate.host_bytes += parameter_shard;
  } else {
    estimate.weights_bytes += parameter_shard;
  }
  if (setup.offload_optimizer) {
    estimate.host_bytes += optimizer + gradient_shard;
  } else {
    estimate.optimizer_bytes = optimizer;
    estimate.gradients_bytes += gradient_shard;
  }

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
  // Layers whose activations the schedule keeps at once on this rank: its warm-up forwards and
  // the one of the steady state, in micro batches of L/pp layers (1F1B) or model chunks of
  // L/(pp·V) layers (interleaved; Megatron's get_num_warmup_microbatches).
  const double in_flight_layers =
      chunks > 1 ? (2.0 * (pp - rank - 1) + (chunks - 1) * pp + 1) * layers / (pp * chunks)
                 : (pp - rank) * stage_layers;
  const double activations = setup.recompute == Recompute::full
                                 ? in_flight_layers * 2.0 * s * b * h + full_layer
                                 : in_flight_layers * full_layer;
  const double activation_width = setup.mixed_precision ? 1.0 : 2.0;  // the formula counts 16-bit
  // One (s·b, V/tp) logits buffer on the last stage, of the activations' type: the trainer's
  // fused classifier writes the logits' gradient over it, so there is no second one (dlogits).
  const double logits_width = setup.mixed_precision ? 2.0 : 4.0;
  const double logits =
      last ? s * b * static_cast<double>(shape.padded_vocab_size) / tp * logits_width : 0.0;
  estimate.activations_bytes = activations * activation_width + logits;
  return estimate;
}

}  // namespace

double parameter_count(const ModelShape& shape) {
  return count_parameters(shape).total(static_cast<double>(shape.num_layers));
}

MemoryEstimate estimate_training_memory(const ModelShape& shape, const TrainingSetup& setup) {
  if (setup.zero_stage < 0 || setup.zero_stage > 3) {
    fail("ZeRO stage {} is not a stage: 0 (none), 1, 2 or 3", setup.zero_stage);
  }
  if (setup.offload_optimizer && setup.zero_stage < 1) {
    fail("offloading the optimizer needs ZeRO stage 1, 2 or 3 (the optimizer state that moves "
         "to host memory is the rank's shard); the stage is 0");
  }
  if (setup.offload_parameters && setup.zero_stage != 3) {
    fail("offloading the parameters needs ZeRO stage 3 (only stage 3 shards them); the stage "
         "is {}",
         setup.zero_stage);
  }
  const Parameters p = count_parameters(shape);
  if (setup.pipeline_parallel <= 1) return estimate_stage_memory(shape, p, setup, true, true);
  MemoryEstimate first = estimate_stage_memory(shape, p, setup, true, false);
  MemoryEstimate last = estimate_stage_memory(shape, p, setup, false, true);
  return last.total_bytes() > first.total_bytes() ? last : first;
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
  if (estimate.host_bytes > 0) {
    // After the total: offloaded bytes take host memory, not the device's.
    lines.push_back(fmt::format("  host memory       {:>10} (offloaded, not in the total)",
                                format_gigabytes(estimate.host_bytes)));
  }
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
