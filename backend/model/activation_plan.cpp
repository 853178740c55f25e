// plan_activations: the regions of one micro-batch shape, in the order the forward first
// writes them (which keeps a layer's buffers together in memory).
#include "backend/model/activation_plan.hpp"

#include <string>
#include <utility>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"
#include "backend/ops/embedding.hpp"

namespace backend {

RecomputeSchedule::RecomputeSchedule(const GptConfig& config, std::vector<LayerRange> chunks)
    : granularity_(config.recompute_granularity),
      method_(config.recompute_method),
      recompute_num_layers_(config.recompute_num_layers),
      chunks_(std::move(chunks)) {
  if (chunks_.empty()) chunks_.push_back({0, config.num_layers});
}

const LayerRange& RecomputeSchedule::chunk_of(int64_t l) const {
  for (const LayerRange& chunk : chunks_) {
    if (chunk.contains(l)) return chunk;
  }
  common::fail("layer {} is not in this pipeline stage's chunks", l);
}

bool RecomputeSchedule::recomputed(int64_t l) const {
  if (granularity_ != RecomputeGranularity::full) return false;
  return method_ == RecomputeMethod::uniform || l - chunk_of(l).begin < recompute_num_layers_;
}

int64_t RecomputeSchedule::chunk_begin(int64_t l) const {
  if (method_ == RecomputeMethod::block) return l;
  const int64_t first = chunk_of(l).begin;
  return first + (l - first) / recompute_num_layers_ * recompute_num_layers_;
}

bool RecomputeSchedule::last_of_chunk(int64_t l) const {
  return l + 1 == chunk_of(l).end || !recomputed(l + 1) || chunk_begin(l + 1) == l + 1;
}

ActivationPlan plan_activations(const GptConfig& config, const RecomputeSchedule& schedule,
                                int64_t batch_size, int64_t seq_length, ElementType dtype,
                                int64_t tensor_parallel, bool sequence_parallel,
                                const PipelineStage& stage, ActivationPart part) {
  // Every buffer's element count, checked: rows × the widest feature count (the logits'
  // padded vocabulary, or linear_qkv's and linear_fc1's features) must fit, and
  // B · NH · T for the attention statistics.
  const int64_t rows =
      common::checked_multiply(batch_size, seq_length, "micro batch × sequence length");
  for (const int64_t width : {config.padded_vocab_size, config.qkv_features(), config.fc1_features(),
                              config.hidden_size}) {
    common::checked_multiply(rows, width,
                             "the activations (micro batch × sequence length × features)");
  }
  const int64_t logsumexp_count = common::checked_multiply(
      {rows, config.num_attention_heads},
      "the attention statistics (micro batch × sequence length × heads)");
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t F1 = config.fc1_features();
  const int64_t QKV = config.qkv_features();
  const int64_t V = config.padded_vocab_size;
  const int64_t A = config.attention_features();
  const bool rms_norm = config.normalization == Normalization::rms_norm;
  // The residual stream's rows: all of them, or this rank's share under sequence parallelism
  // (the caller checked that the tensor-parallel size divides the sequence).
  const bool sharded_stream = sequence_parallel && tensor_parallel > 1;
  const int64_t stream_rows = sharded_stream ? rows / tensor_parallel : rows;
  const int64_t norm_means = rms_norm ? 0 : stream_rows;

  ActivationPlan plan;
  plan.batch_size = batch_size;
  plan.seq_length = seq_length;
  ArenaLayout& layout = plan.layout;
  // Statistics (norm means and reciprocal deviations, log-sum-exps, losses, RoPE tables) stay
  // fp32 when the activations are bf16 or fp16, as the ops' twins take them.
  const bool narrow = dtype == ElementType::bf16 || dtype == ElementType::f16;
  const ElementType statistics = narrow ? ElementType::f32 : dtype;
  int64_t kept_bytes = 0;
  const bool carve_kept = part != ActivationPart::shared;
  const bool carve_shared = part != ActivationPart::per_micro_batch;
  // What one micro batch keeps for its backward (counted in kept_bytes), what it keeps only
  // while the recompute or the forward works (shared, counted too), and the scratch.
  auto keep = [&](std::string what, int64_t numel, ElementType type) {
    kept_bytes += common::checked_multiply(numel, element_size(type), "the activations");
    return layout.add(std::move(what), type, carve_kept ? numel : 0);
  };
  auto kept_shared = [&](std::string what, int64_t numel, ElementType type) {
    kept_bytes += common::checked_multiply(numel, element_size(type), "the activations");
    return layout.add(std::move(what), type, carve_shared ? numel : 0);
  };
  auto scratch = [&](std::string what, int64_t numel, ElementType type) {
    return layout.add(std::move(what), type, carve_shared ? numel : 0);
  };
  // The backward's scratch: none for a model that only runs forwards (GptConfig::inference_only;
  // evaluate_gpt's batches would otherwise carve a second (rows, vocabulary) buffer, dlogits).
  const bool backward = !config.inference_only;
  auto gradient_scratch = [&](std::string what, int64_t numel, ElementType type) {
    return scratch(std::move(what), backward ? numel : 0, type);
  };
  const bool last_stage = stage.last();
  const int64_t head_rows = last_stage ? rows : 0;
  const int64_t head_stream_rows = last_stage ? stream_rows : 0;

  plan.tokens = layout.add("tokens", ElementType::i32, carve_kept ? rows : 0);
  plan.token_index = layout.add("token index", ElementType::i32,
                                carve_kept && backward && stage.first()
                                    ? token_index_elements(rows)
                                    : 0);
  plan.labels = layout.add("labels", ElementType::i32, carve_kept ? rows : 0);
  plan.embedded = keep("embedding output", stream_rows * C, dtype);
  const auto chunks = stage_layer_chunks(config.num_layers, stage);
  const bool pipelined = !stage.whole_model();
  for (size_t c = 0; c < chunks.size(); ++c) {
    plan.chunk_inputs.push_back(
        keep("chunk " + std::to_string(c) + " input", c > 0 ? stream_rows * C : 0, dtype));
    plan.output_gradients.push_back(
        keep("chunk " + std::to_string(c) + " output gradient", pipelined ? stream_rows * C : 0,
             dtype));
  }
  auto layer_regions = [&](const std::string& name, bool internals, bool output,
                           bool shared = false) {
    const int64_t n = internals ? rows : 0;
    auto typed_region = [&](std::string what, int64_t numel, ElementType type) {
      return shared ? kept_shared(std::move(what), numel, type)
                    : keep(std::move(what), numel, type);
    };
    auto region = [&](std::string what, int64_t numel) {
      return typed_region(std::move(what), numel, dtype);
    };
    LayerActivationRegions r{};
    r.input_norm = region(name + " input_layernorm", n * C);
    r.input_norm_mean =
        typed_region(name + " input_layernorm mean", internals ? norm_means : 0, statistics);
    r.input_norm_rstd =
        typed_region(name + " input_layernorm rstd", internals ? stream_rows : 0, statistics);
    r.qkv = region(name + " qkv", n * QKV);
    r.attention_logsumexp =
        typed_region(name + " attention log-sum-exp",
                     internals && !schedule.selective() ? logsumexp_count : 0, statistics);
    r.context = region(name + " attention context", n * A);
    r.attention_residual = region(name + " attention residual", internals ? stream_rows * C : 0);
    r.mlp_norm = region(name + " pre_mlp_layernorm", n * C);
    r.mlp_norm_mean =
        typed_region(name + " pre_mlp_layernorm mean", internals ? norm_means : 0, statistics);
    r.mlp_norm_rstd =
        typed_region(name + " pre_mlp_layernorm rstd", internals ? stream_rows : 0, statistics);
    r.fc1 = region(name + " linear_fc1", n * F1);
    r.activation = region(name + " activation", n * F);
    r.output = region(name + " output", output ? stream_rows * C : 0);
    return r;
  };
  std::vector<bool> slot_needs_output;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    if (!holds_layer(chunks, l)) {
      plan.layers.push_back(layer_regions("layer " + std::to_string(l), false, false));
      continue;
    }
    const bool dropped = schedule.recomputed(l);
    plan.layers.push_back(layer_regions("layer " + std::to_string(l), !dropped,
                                        !dropped || schedule.last_of_chunk(l)));
    if (!dropped) continue;
    const auto slot = static_cast<size_t>(l - schedule.chunk_begin(l));
    if (slot_needs_output.size() <= slot) slot_needs_output.resize(slot + 1, false);
    if (!schedule.last_of_chunk(l)) slot_needs_output[slot] = true;
  }
  // The recompute slots serve one chunk's forward at a time: shared by the micro batches.
  for (size_t j = 0; j < slot_needs_output.size(); ++j) {
    plan.recompute_slots.push_back(
        layer_regions("recompute slot " + std::to_string(j), true, slot_needs_output[j], true));
  }
  plan.recomputed_logsumexp = kept_shared("recomputed attention log-sum-exp",
                                          schedule.selective() ? logsumexp_count : 0, statistics);
  plan.final_norm = keep("final_layernorm", head_rows * C, dtype);
  plan.final_norm_mean = keep("final_layernorm mean", last_stage ? norm_means : 0, statistics);
  plan.final_norm_rstd = keep("final_layernorm rstd", head_stream_rows, statistics);
  plan.logits = keep("logits", head_rows * V, dtype);
  plan.losses = keep("losses", head_rows, statistics);
  plan.logsumexp = keep("logits log-sum-exp", head_rows, statistics);
  plan.loss_total = layout.add("loss total", ElementType::f64, carve_shared ? 1 : 0);
  const int64_t parts = tensor_parallel > 1 ? tensor_parallel : 0;
  plan.logsumexp_parts =
      scratch("logits log-sum-exp per vocabulary shard", parts * head_rows, statistics);
  plan.target_logit = scratch("label logits", parts > 0 ? head_rows : 0, statistics);
  plan.branch = scratch("branch", rows * C, dtype);
  const bool rope = config.position_embedding_type == PositionEmbeddingType::rope;
  const int64_t rope_table = rope ? seq_length * (config.rotary_dim() / 2) : 0;
  plan.rope_cos = scratch("rope cos", rope_table, statistics);
  plan.rope_sin = scratch("rope sin", rope_table, statistics);
  plan.dlogits =
      gradient_scratch("dlogits", config.classifier_gradient_in_forward ? 0 : head_rows * V, dtype);
  plan.dresidual = gradient_scratch("dresidual", stream_rows * C, dtype);
  plan.dbranch = gradient_scratch("dbranch", stream_rows * C, dtype);
  plan.branch_shard =
      scratch("branch, this rank's rows", sharded_stream ? stream_rows * C : 0, dtype);
  plan.dnorm_shard =
      gradient_scratch("dnorm, this rank's rows", sharded_stream ? stream_rows * C : 0, dtype);
  plan.dnorm = gradient_scratch("dnorm", rows * C, dtype);
  plan.dqkv = gradient_scratch("dqkv", rows * QKV, dtype);
  // The gradient of SwiGLU's output; GELU's is fused into fc2's backward (linear_gelu.hpp).
  plan.dhidden = gradient_scratch("dhidden", config.swiglu ? rows * F : 0, dtype);
  plan.dfc1 = gradient_scratch("dfc1", rows * F1, dtype);
  plan.kept_bytes = kept_bytes;
  return plan;
}

}  // namespace backend
