// GptDecoder: incremental decoding of a whole GptModel<float> with a key/value cache
// (gpt_decoder.hpp), composed from the ops (backend/ops/) as GptModel's forward is (gpt_model.cpp's
// layer_forward in evaluation mode), with three ops for rows at positions of their own:
//   x = embedding_at_positions(tokens, positions)           word row (+ position row at p_r)
//   per layer l:
//     h   = norm(x)                                         LayerNorm or RMSNorm (--normalization)
//     qkv = h · W_qkv^T (+ b)                               all rows in one GEMM
//     qkv = rope_at_positions(qkv)                          q and k heads at p_r (rope only)
//     a   = kv_cache_attention(qkv, cache_l)                stores every row's k, v at
//                                                           [slot_r, p_r], then attends over
//                                                           the slot's positions 0..p_r
//     x  += a · W_proj^T (+ b)
//     x  += act(norm(x) · W_fc1^T (+ b)) · W_fc2^T (+ b)    gelu_tanh or swiglu
//   logits = final_norm(x[rows with logits]) · W^T          tied word embedding or output_layer
// Cache layout (one allocation per kind, carved at construction):
//   key_cache[layer][slot][position][group][head_dim], value_cache likewise, so one layer's
//   cache is (slots, max_length, NG, HD) contiguous and a slot's keys run position by position
//   (the layout kv_cache_attention_forward reads, ops/attention.hpp). Bytes = 2 · layers ·
//   slots · max_length · NG · HD · 4.
// The linear layers run once over all rows of a step through the device's GEMM (continuous
// batching: Orca, Yu et al. 2022; vLLM's packed rows; Megatron core's inference context for
// the cache's meaning). Nothing is allocated in step(): the activations of max_rows rows, the
// host staging of the rows' ids and the per-slot bookkeeping are made here.
//
// A slot's bookkeeping (host side): cached_length[slot] is the number of positions 0..n−1
// holding this slot's current sequence. A row at position p needs p ≤ that length (its earlier
// positions cached), or, within a step, the slot's previous row at p − 1 (a prefill's rows in
// order); after the step the length is the last row's p + 1 (what lay beyond was overwritten or
// is stale). This refuses attention over positions nobody stored, which would otherwise read
// zeros or another sequence's keys without any error.
#include "backend/model/gpt_decoder.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"
#include "backend/device/arena.hpp"
#include "backend/model/layer_ops.hpp"
#include "backend/model/parameter_layout.hpp"
#include "backend/ops/attention.hpp"
#include "backend/ops/embedding.hpp"
#include "backend/ops/linear.hpp"
#include "backend/ops/linear_gelu.hpp"
#include "backend/ops/residual.hpp"
#include "backend/ops/rope.hpp"
#include "backend/ops/swiglu.hpp"

namespace backend {
namespace {

constexpr ElementType kType = ElementType::f32;

// One layer's parameter tensors as views of the model's flat buffer (empty: absent).
struct LayerWeights {
  View input_norm_weight, input_norm_bias, qkv_weight, qkv_bias, proj_weight, proj_bias,
      mlp_norm_weight, mlp_norm_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
};

}  // namespace

struct GptDecoder::State {
  GptConfig config;
  Device* device = nullptr;
  int64_t slots = 0, max_length = 0, max_rows = 0;
  int64_t hidden = 0, heads = 0, groups = 0, head_dim = 0, qkv_features = 0, ffn = 0,
          fc1_features = 0, vocab = 0;

  // Parameters (borrowed).
  View word_embeddings, position_embeddings, final_norm_weight, final_norm_bias, output_weight;
  std::vector<LayerWeights> layers;

  // Caches and activations (owned).
  Arena arena;
  View key_cache, value_cache;       // (layers, slots, max_length, NG, HD)
  View tokens, positions, slot_ids;  // i32 (max_rows)
  View x, normed, qkv, context, branch, fc1, activation, mean, rstd;
  View packed, packed_norm, logits;  // the rows with logits: final norm input, output, logits
  View rope_cos, rope_sin;           // (max_length, R/2)

  // Host staging and bookkeeping, sized at construction.
  std::vector<int32_t> host_tokens, host_positions, host_slots;
  std::vector<int64_t> cached_length;  // per slot
  std::vector<int64_t> step_last;      // per slot: this step's last position so far, or −1
  std::vector<int64_t> logits_rows;    // indices of this step's rows with logits

  View empty() const { return View{nullptr, 0, kType, x.on}; }

  void norm(View output, View input, View weight, View bias, int64_t rows) {
    norm_forward(*device, config, output.slice(0, rows * hidden),
                 {mean.slice(0, rows), rstd.slice(0, rows)}, input, weight, bias, rows);
  }

  void layer_step(int64_t l, int64_t n) {
    const LayerWeights& w = layers[static_cast<size_t>(l)];
    Device& d = *device;
    const View stream = x.slice(0, n * hidden);
    const View rows_qkv = qkv.slice(0, n * qkv_features);
    const View rows_branch = branch.slice(0, n * hidden);
    norm(normed, stream, w.input_norm_weight, w.input_norm_bias, n);
    ops::linear_forward(d, rows_qkv, normed.slice(0, n * hidden), w.qkv_weight, w.qkv_bias, n,
                        hidden, qkv_features);
    if (config.position_embedding_type == PositionEmbeddingType::rope) {
      rotate_queries_and_keys_at(d, config, rows_qkv, rope_cos, rope_sin, positions.slice(0, n), n);
    }
    const int64_t layer_cache = slots * max_length * groups * head_dim;
    ops::kv_cache_attention_forward(
        d, context.slice(0, n * hidden), key_cache.slice(l * layer_cache, layer_cache),
        value_cache.slice(l * layer_cache, layer_cache), rows_qkv, slot_ids.slice(0, n),
        positions.slice(0, n), n, heads, groups, head_dim, max_length);
    ops::linear_forward(d, rows_branch, context.slice(0, n * hidden), w.proj_weight, w.proj_bias, n,
                        hidden, hidden);
    ops::residual_forward(d, stream, stream, rows_branch);

    norm(normed, stream, w.mlp_norm_weight, w.mlp_norm_bias, n);
    const View rows_fc1 = fc1.slice(0, n * fc1_features);
    const View rows_activation = activation.slice(0, n * ffn);
    if (config.swiglu) {
      ops::linear_forward(d, rows_fc1, normed.slice(0, n * hidden), w.fc1_weight, w.fc1_bias, n,
                          hidden, fc1_features);
      ops::swiglu_forward(d, rows_activation, rows_fc1, n, ffn);
    } else {
      // The training forward's op (GELU in the GEMM's epilogue on a GPU), so decoding computes
      // the function the model was trained with.
      ops::linear_gelu_forward(d, rows_activation, rows_fc1, normed.slice(0, n * hidden),
                               w.fc1_weight, w.fc1_bias, n, hidden, fc1_features);
    }
    ops::linear_forward(d, rows_branch, rows_activation, w.fc2_weight, w.fc2_bias, n, ffn, hidden);
    ops::residual_forward(d, stream, stream, rows_branch);
  }
};

GptDecoder::GptDecoder(const GptModel<float>& model, int64_t slots, int64_t max_length,
                       int64_t max_rows)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  const GptConfig& config = model.config();
  if (model.tensor_parallel_group().size() > 1) {
    common::fail("GptDecoder: the model is one of {} tensor-parallel ranks; decoding takes a "
                 "whole model (--tensor-model-parallel-size 1)",
                 model.tensor_parallel_group().size());
  }
  if (!model.pipeline_stage().whole_model()) {
    common::fail("GptDecoder: the model is stage {} of a {}-stage pipeline; decoding takes a "
                 "whole model (--pipeline-model-parallel-size 1)",
                 model.pipeline_stage().rank, model.pipeline_stage().pipeline_parallel);
  }
  if (model.sharded_over_data_parallel()) {
    common::fail("GptDecoder: the model's parameters are sharded over the data-parallel group "
                 "(ZeRO-3); decoding takes a model holding all of them");
  }
  if (slots < 1 || max_length < 1 || max_rows < 1) {
    common::fail("GptDecoder: slots ({}), max_length ({}) and max_rows ({}) must each be at "
                 "least 1",
                 slots, max_length, max_rows);
  }
  if (max_length > config.max_position_embeddings) {
    common::fail("GptDecoder: max_length {} exceeds the model's max_position_embeddings {}",
                 max_length, config.max_position_embeddings);
  }
  s.config = config;
  s.device = &model.device();
  s.slots = slots;
  s.max_length = max_length;
  s.max_rows = max_rows;
  s.hidden = config.hidden_size;
  s.heads = config.num_attention_heads;
  s.groups = config.query_groups();
  s.head_dim = config.head_dim();
  s.qkv_features = config.qkv_features();
  s.ffn = config.ffn_hidden_size;
  s.fc1_features = config.fc1_features();
  s.vocab = config.padded_vocab_size;
  if (config.attention_features() != s.hidden) {
    common::fail("GptDecoder: {} heads of {} features are not the hidden size {}", s.heads,
                 s.head_dim, s.hidden);
  }

  // The whole model's layout; the model's own buffer must be exactly it.
  const ParameterLayout layout(config);
  const View parameters = model.parameter_buffer();
  if (parameters.numel != layout.numel() || parameters.type != kType) {
    common::fail("GptDecoder: the model's parameter buffer ({} elements of {}) is not the whole "
                 "fp32 layout of its configuration ({} elements)",
                 parameters.numel, element_name(parameters.type), layout.numel());
  }
  auto tensor = [&](int64_t offset) {
    if (offset == kAbsentTensor) return View{nullptr, 0, kType, parameters.on};
    const auto& tensors = layout.tensors();
    const auto found = std::find_if(tensors.begin(), tensors.end(), [offset](const auto& entry) {
      return entry.offset == offset;
    });
    if (found == tensors.end()) {
      common::fail("GptDecoder: no parameter tensor at offset {}", offset);
    }
    return parameters.slice(offset, found->numel);
  };
  s.word_embeddings = tensor(layout.word_embeddings());
  s.position_embeddings = tensor(layout.position_embeddings());
  s.final_norm_weight = tensor(layout.final_norm_weight());
  s.final_norm_bias = tensor(layout.final_norm_bias());
  s.output_weight = tensor(layout.output_weight());
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const LayerParameters& p = layout.layer(l);
    s.layers.push_back({tensor(p.input_norm_weight), tensor(p.input_norm_bias),
                        tensor(p.qkv_weight), tensor(p.qkv_bias), tensor(p.proj_weight),
                        tensor(p.proj_bias), tensor(p.mlp_norm_weight), tensor(p.mlp_norm_bias),
                        tensor(p.fc1_weight), tensor(p.fc1_bias), tensor(p.fc2_weight),
                        tensor(p.fc2_bias)});
  }

  const int64_t cache_numel =
      common::checked_multiply({config.num_layers, slots, max_length, s.groups, s.head_dim},
                               "GptDecoder's key/value cache (layers × slots × max_length × "
                               "query groups × head dimension)");
  const bool rope = config.position_embedding_type == PositionEmbeddingType::rope;
  const int64_t half_rotary = rope ? config.rotary_dim() / 2 : 0;
  auto rows_of = [&](int64_t width, const char* what) {
    return common::checked_multiply(max_rows, width, what);
  };
  ArenaLayout plan;
  const int64_t keys = plan.add("key cache", kType, cache_numel);
  const int64_t values = plan.add("value cache", kType, cache_numel);
  const int64_t tokens = plan.add("tokens", ElementType::i32, max_rows);
  const int64_t positions = plan.add("positions", ElementType::i32, max_rows);
  const int64_t slot_ids = plan.add("slots", ElementType::i32, max_rows);
  const int64_t x = plan.add("residual stream", kType, rows_of(s.hidden, "residual stream"));
  const int64_t normed = plan.add("norm output", kType, rows_of(s.hidden, "norm output"));
  const int64_t qkv = plan.add("qkv", kType, rows_of(s.qkv_features, "qkv"));
  const int64_t context = plan.add("attention context", kType, rows_of(s.hidden, "context"));
  const int64_t branch = plan.add("branch", kType, rows_of(s.hidden, "branch"));
  const int64_t fc1 = plan.add("fc1", kType, rows_of(s.fc1_features, "fc1"));
  const int64_t activation = plan.add("activation", kType, rows_of(s.ffn, "activation"));
  const int64_t mean = plan.add("norm mean", kType, max_rows);
  const int64_t rstd = plan.add("norm rstd", kType, max_rows);
  const int64_t packed = plan.add("logits rows", kType, rows_of(s.hidden, "logits rows"));
  const int64_t packed_norm =
      plan.add("final norm output", kType, rows_of(s.hidden, "final norm output"));
  const int64_t logits = plan.add("logits", kType, rows_of(s.vocab, "logits"));
  const int64_t rope_cos = plan.add("rope cos", kType, max_length * half_rotary);
  const int64_t rope_sin = plan.add("rope sin", kType, max_length * half_rotary);
  s.arena = Arena(*s.device, std::move(plan), "GptDecoder caches and activations");
  s.key_cache = s.arena.view(keys);
  s.value_cache = s.arena.view(values);
  s.tokens = s.arena.view(tokens);
  s.positions = s.arena.view(positions);
  s.slot_ids = s.arena.view(slot_ids);
  s.x = s.arena.view(x);
  s.normed = s.arena.view(normed);
  s.qkv = s.arena.view(qkv);
  s.context = s.arena.view(context);
  s.branch = s.arena.view(branch);
  s.fc1 = s.arena.view(fc1);
  s.activation = s.arena.view(activation);
  s.mean = s.arena.view(mean);
  s.rstd = s.arena.view(rstd);
  s.packed = s.arena.view(packed);
  s.packed_norm = s.arena.view(packed_norm);
  s.logits = s.arena.view(logits);
  s.rope_cos = s.arena.view(rope_cos);
  s.rope_sin = s.arena.view(rope_sin);
  if (rope) {
    ops::rope_tables(*s.device, s.rope_cos, s.rope_sin, max_length, config.rotary_dim(),
                     static_cast<double>(config.rotary_base), config.rope_scaling);
  }
  s.host_tokens.resize(static_cast<size_t>(max_rows));
  s.host_positions.resize(static_cast<size_t>(max_rows));
  s.host_slots.resize(static_cast<size_t>(max_rows));
  s.logits_rows.reserve(static_cast<size_t>(max_rows));
  s.cached_length.assign(static_cast<size_t>(slots), 0);
  s.step_last.assign(static_cast<size_t>(slots), -1);
}

GptDecoder::~GptDecoder() = default;
GptDecoder::GptDecoder(GptDecoder&&) noexcept = default;
GptDecoder& GptDecoder::operator=(GptDecoder&&) noexcept = default;

int64_t GptDecoder::slots() const { return state_->slots; }
int64_t GptDecoder::max_length() const { return state_->max_length; }
int64_t GptDecoder::max_rows() const { return state_->max_rows; }
int64_t GptDecoder::padded_vocab_size() const { return state_->vocab; }
int64_t GptDecoder::cache_bytes() const {
  return state_->key_cache.bytes() + state_->value_cache.bytes();
}

void GptDecoder::step(std::span<const DecodeRow> rows, std::span<float> logits) {
  State& s = *state_;
  const auto n = static_cast<int64_t>(rows.size());
  if (n < 1 || n > s.max_rows) {
    common::fail("GptDecoder::step: {} rows; a step takes 1 to max_rows = {}", n, s.max_rows);
  }
  // Validate everything before anything changes (a refused step leaves the caches as they were).
  s.logits_rows.clear();
  const int64_t vocabulary = s.config.vocab_size;
  std::string problem;
  int64_t bad_row = -1;
  for (int64_t r = 0; r < n && bad_row < 0; ++r) {
    const DecodeRow& row = rows[static_cast<size_t>(r)];
    if (row.token < 0 || row.token >= vocabulary) {
      problem = fmt::format("token {} is outside the vocabulary [0, {})", row.token, vocabulary);
    } else if (row.slot < 0 || row.slot >= s.slots) {
      problem = fmt::format("slot {} is outside [0, {})", row.slot, s.slots);
    } else if (row.position < 0 || row.position >= s.max_length) {
      problem = fmt::format("position {} is outside [0, max_length = {})", row.position,
                            s.max_length);
    } else {
      const int64_t previous = s.step_last[static_cast<size_t>(row.slot)];
      if (previous >= 0 && row.position != previous + 1) {
        problem = fmt::format("slot {} already has a row at position {} in this step; its rows "
                              "in one step must be at consecutive positions in order (next: {})",
                              row.slot, previous, previous + 1);
      } else if (previous < 0 && row.position > s.cached_length[static_cast<size_t>(row.slot)]) {
        problem = fmt::format("slot {} holds positions 0..{} only, so a row at position {} "
                              "would attend over positions nobody stored (start a sequence "
                              "at position 0 and feed every position)",
                              row.slot, s.cached_length[static_cast<size_t>(row.slot)] - 1,
                              row.position);
      } else {
        s.step_last[static_cast<size_t>(row.slot)] = row.position;
      }
    }
    if (!problem.empty()) bad_row = r;
    if (row.logits) s.logits_rows.push_back(r);
  }
  if (bad_row < 0 && static_cast<int64_t>(logits.size()) !=
                         static_cast<int64_t>(s.logits_rows.size()) * s.vocab) {
    problem = fmt::format("the logits span holds {} floats; the {} rows with logits need {} × "
                          "padded_vocab_size {} = {}",
                          logits.size(), s.logits_rows.size(), s.logits_rows.size(), s.vocab,
                          static_cast<int64_t>(s.logits_rows.size()) * s.vocab);
  }
  // The slots this step touches: commit their new lengths (or forget them when refused).
  for (int64_t r = 0; r < n; ++r) {
    const int32_t slot = rows[static_cast<size_t>(r)].slot;
    if (slot < 0 || slot >= s.slots) continue;
    int64_t& last = s.step_last[static_cast<size_t>(slot)];
    if (last >= 0 && problem.empty()) s.cached_length[static_cast<size_t>(slot)] = last + 1;
    last = -1;
  }
  if (!problem.empty()) {
    if (bad_row >= 0) common::fail("GptDecoder::step: row {}: {}", bad_row, problem);
    common::fail("GptDecoder::step: {}", problem);
  }

  for (int64_t r = 0; r < n; ++r) {
    const DecodeRow& row = rows[static_cast<size_t>(r)];
    s.host_tokens[static_cast<size_t>(r)] = row.token;
    s.host_positions[static_cast<size_t>(r)] = row.position;
    s.host_slots[static_cast<size_t>(r)] = row.slot;
  }
  Device& d = *s.device;
  d.copy_from_host(s.tokens.slice(0, n), s.host_tokens.data());
  d.copy_from_host(s.positions.slice(0, n), s.host_positions.data());
  d.copy_from_host(s.slot_ids.slice(0, n), s.host_slots.data());

  ops::embedding_at_positions_forward(d, s.x.slice(0, n * s.hidden), s.tokens.slice(0, n),
                                      s.positions.slice(0, n), s.word_embeddings,
                                      s.position_embeddings, n, s.hidden);
  for (int64_t l = 0; l < s.config.num_layers; ++l) s.layer_step(l, n);

  const auto m = static_cast<int64_t>(s.logits_rows.size());
  if (m == 0) return;
  // The rows with logits, packed in order (runs of consecutive rows in one copy), unless that
  // is every row.
  View final_input = s.x.slice(0, n * s.hidden);
  if (m < n) {
    int64_t k = 0;
    while (k < m) {
      int64_t run = 1;
      while (k + run < m && s.logits_rows[static_cast<size_t>(k + run)] ==
                                s.logits_rows[static_cast<size_t>(k)] + run) {
        ++run;
      }
      d.copy(s.packed.slice(k * s.hidden, run * s.hidden),
             s.x.slice(s.logits_rows[static_cast<size_t>(k)] * s.hidden, run * s.hidden));
      k += run;
    }
    final_input = s.packed.slice(0, m * s.hidden);
  }
  s.norm(s.packed_norm, final_input, s.final_norm_weight, s.final_norm_bias, m);
  const View rows_logits = s.logits.slice(0, m * s.vocab);
  ops::linear_forward(d, rows_logits, s.packed_norm.slice(0, m * s.hidden), s.output_weight,
                      s.empty(), m, s.hidden, s.vocab);
  d.copy_to_host(logits.data(), rows_logits);
}

}  // namespace backend
