// Hugging Face export and import; the name and layout mapping is in hf_format.hpp.
//
// Every mapping is one Megatron tensor seen as a (rows, columns) matrix (a vector as (n, 1))
// whose rows are distributed over one or more Hugging Face tensors ("pieces"), each stored
// either row-major as Megatron stores it, or transposed (GPT-2's Conv1D). A row permutation
// plus an optional transpose covers every conversion here (GPT-2's qkv reordering, and the
// splits of a fused tensor into several), and export and import read the same table, so
// import is the exact inverse of export by construction.
#include "backend/ckpt/hf_format.hpp"

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "backend/common/checked_math.hpp"
#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/memory_estimate.hpp"
#include "backend/common/python_format.hpp"
#include "backend/common/small_file.hpp"

namespace backend {

using common::format_python_shape;

namespace {

constexpr const char* kSafetensorsFile = "model.safetensors";
constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";
constexpr const char* kTokenizerVocabKey = "tokenizer_vocab_size";

struct HfPiece {
  std::string name;
  std::vector<int64_t> shape;
};

struct RowTarget {
  int32_t piece = 0;
  int64_t row = 0;
};

struct TensorMapping {
  std::string megatron_name;
  std::vector<HfPiece> pieces;
  std::vector<RowTarget> rows;  // Megatron row r goes to pieces[rows[r].piece], row rows[r].row
  bool transposed = false;      // pieces stored (columns, rows), as GPT-2's Conv1D
  // Added on export: 1 for a LayerNorm weight stored as γ − 1 (--apply-layernorm-1p), since
  // Hugging Face's LayerNorm holds γ itself.
  float offset = 0.0f;
};

std::vector<RowTarget> identity_rows(int64_t count) {
  std::vector<RowTarget> rows(static_cast<size_t>(count));
  for (int64_t r = 0; r < count; ++r) rows[static_cast<size_t>(r)] = {0, r};
  return rows;
}

// A tensor that keeps its shape and layout, only its name changes.
TensorMapping renamed(std::string megatron_name, std::string hf_name, std::vector<int64_t> shape) {
  const int64_t rows = shape.at(0);
  return {std::move(megatron_name), {{std::move(hf_name), std::move(shape)}}, identity_rows(rows),
          false};
}

// A Megatron (out, in) linear weight as a GPT-2 Conv1D weight (in, out).
TensorMapping conv1d_weight(std::string megatron_name, std::string hf_name, int64_t out, int64_t in) {
  return {std::move(megatron_name), {{std::move(hf_name), {in, out}}}, identity_rows(out), true};
}

// Megatron's per-head [q | k | v] rows → GPT-2's [all q | all k | all v]: row h·3HD + s·HD + d
// becomes row s·C + h·HD + d.
std::vector<RowTarget> gpt2_qkv_rows(const GptConfig& config) {
  const int64_t C = config.hidden_size;
  const int64_t NH = config.num_attention_heads;
  const int64_t HD = config.head_dim();
  std::vector<RowTarget> rows(static_cast<size_t>(3 * C));
  for (int64_t h = 0; h < NH; ++h) {
    for (int64_t s = 0; s < 3; ++s) {
      for (int64_t d = 0; d < HD; ++d) rows[static_cast<size_t>(h * 3 * HD + s * HD + d)] = {0, s * C + h * HD + d};
    }
  }
  return rows;
}

std::vector<TensorMapping> gpt2_mappings(const GptConfig& config) {
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  std::vector<TensorMapping> mappings;
  mappings.push_back(renamed("embedding.word_embeddings.weight", "transformer.wte.weight",
                             {config.padded_vocab_size, C}));
  mappings.push_back(renamed("embedding.position_embeddings.weight", "transformer.wpe.weight",
                             {config.max_position_embeddings, C}));
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string m = fmt::format("decoder.layers.{}.", i);
    const std::string h = fmt::format("transformer.h.{}.", i);
    mappings.push_back(renamed(m + "input_layernorm.weight", h + "ln_1.weight", {C}));
    mappings.push_back(renamed(m + "input_layernorm.bias", h + "ln_1.bias", {C}));
    mappings.push_back({m + "self_attention.linear_qkv.weight",
                        {{h + "attn.c_attn.weight", {C, 3 * C}}}, gpt2_qkv_rows(config), true});
    mappings.push_back({m + "self_attention.linear_qkv.bias", {{h + "attn.c_attn.bias", {3 * C}}},
                        gpt2_qkv_rows(config), false});
    mappings.push_back(conv1d_weight(m + "self_attention.linear_proj.weight",
                                     h + "attn.c_proj.weight", C, C));
    mappings.push_back(renamed(m + "self_attention.linear_proj.bias", h + "attn.c_proj.bias", {C}));
    mappings.push_back(renamed(m + "pre_mlp_layernorm.weight", h + "ln_2.weight", {C}));
    mappings.push_back(renamed(m + "pre_mlp_layernorm.bias", h + "ln_2.bias", {C}));
    mappings.push_back(conv1d_weight(m + "mlp.linear_fc1.weight", h + "mlp.c_fc.weight", F, C));
    mappings.push_back(renamed(m + "mlp.linear_fc1.bias", h + "mlp.c_fc.bias", {F}));
    mappings.push_back(conv1d_weight(m + "mlp.linear_fc2.weight", h + "mlp.c_proj.weight", C, F));
    mappings.push_back(renamed(m + "mlp.linear_fc2.bias", h + "mlp.c_proj.bias", {C}));
  }
  mappings.push_back(renamed("decoder.final_layernorm.weight", "transformer.ln_f.weight", {C}));
  mappings.push_back(renamed("decoder.final_layernorm.bias", "transformer.ln_f.bias", {C}));
  if (config.apply_layernorm_1p) {
    for (TensorMapping& mapping : mappings) {
      if (mapping.megatron_name.ends_with("layernorm.weight")) mapping.offset = 1.0f;
    }
  }
  return mappings;
}

// Megatron core's fused qkv rows, per query group g of NG: [the group's NH/NG query heads |
// its key head | its value head], HD rows each. LlamaForCausalLM keeps q_proj, k_proj and
// v_proj apart, heads in order, so group g's rows go to q rows g·(NH/NG)·HD.., k and v rows
// g·HD.. (Megatron's tools/checkpoint loader_llama_mistral.py builds the same concatenation).
// RoPE needs no permutation: Megatron core's non-interleaved rotary embedding rotates
// [x1 | x2] halves (rope_utils.py _rotate_half), as transformers' rotate_half does.
std::vector<RowTarget> llama_qkv_rows(const GptConfig& config) {
  const int64_t NH = config.num_attention_heads;
  const int64_t NG = config.query_groups();
  const int64_t HD = config.head_dim();
  const int64_t heads_per_group = NH / NG;
  std::vector<RowTarget> rows;
  for (int64_t g = 0; g < NG; ++g) {
    for (int64_t j = 0; j < heads_per_group * HD; ++j) rows.push_back({0, g * heads_per_group * HD + j});
    for (int64_t j = 0; j < HD; ++j) rows.push_back({1, g * HD + j});
    for (int64_t j = 0; j < HD; ++j) rows.push_back({2, g * HD + j});
  }
  return rows;
}

// Megatron's SwiGLU linear_fc1 rows [gate (F) | linear (F)] → gate_proj and up_proj.
std::vector<RowTarget> swiglu_rows(int64_t ffn) {
  std::vector<RowTarget> rows;
  for (int32_t piece = 0; piece < 2; ++piece) {
    for (int64_t r = 0; r < ffn; ++r) rows.push_back({piece, r});
  }
  return rows;
}

std::vector<TensorMapping> llama_mappings(const GptConfig& config) {
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t NH = config.num_attention_heads;
  const int64_t NG = config.query_groups();
  const int64_t HD = config.head_dim();
  const bool bias = config.add_bias_linear;
  std::vector<TensorMapping> mappings;
  mappings.push_back(renamed("embedding.word_embeddings.weight", "model.embed_tokens.weight",
                             {config.padded_vocab_size, C}));
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string m = fmt::format("decoder.layers.{}.", i);
    const std::string h = fmt::format("model.layers.{}.", i);
    mappings.push_back(renamed(m + "input_layernorm.weight", h + "input_layernorm.weight", {C}));
    mappings.push_back({m + "self_attention.linear_qkv.weight",
                        {{h + "self_attn.q_proj.weight", {NH * HD, C}},
                         {h + "self_attn.k_proj.weight", {NG * HD, C}},
                         {h + "self_attn.v_proj.weight", {NG * HD, C}}},
                        llama_qkv_rows(config), false});
    if (bias) {
      mappings.push_back({m + "self_attention.linear_qkv.bias",
                          {{h + "self_attn.q_proj.bias", {NH * HD}},
                           {h + "self_attn.k_proj.bias", {NG * HD}},
                           {h + "self_attn.v_proj.bias", {NG * HD}}},
                          llama_qkv_rows(config), false});
    }
    mappings.push_back(renamed(m + "self_attention.linear_proj.weight", h + "self_attn.o_proj.weight",
                               {C, NH * HD}));
    if (bias) {
      mappings.push_back(renamed(m + "self_attention.linear_proj.bias", h + "self_attn.o_proj.bias", {C}));
    }
    mappings.push_back(renamed(m + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight", {C}));
    mappings.push_back({m + "mlp.linear_fc1.weight",
                        {{h + "mlp.gate_proj.weight", {F, C}}, {h + "mlp.up_proj.weight", {F, C}}},
                        swiglu_rows(F), false});
    if (bias) {
      mappings.push_back({m + "mlp.linear_fc1.bias",
                          {{h + "mlp.gate_proj.bias", {F}}, {h + "mlp.up_proj.bias", {F}}},
                          swiglu_rows(F), false});
    }
    mappings.push_back(renamed(m + "mlp.linear_fc2.weight", h + "mlp.down_proj.weight", {C, F}));
    if (bias) mappings.push_back(renamed(m + "mlp.linear_fc2.bias", h + "mlp.down_proj.bias", {C}));
  }
  mappings.push_back(renamed("decoder.final_layernorm.weight", "model.norm.weight", {C}));
  if (!config.share_embeddings_and_output_weights) {
    mappings.push_back(renamed("output_layer.weight", "lm_head.weight", {config.padded_vocab_size, C}));
  }
  return mappings;
}

enum class HfArchitecture { gpt2, llama };

// The Hugging Face architecture that computes what this GptConfig computes.
HfArchitecture hf_architecture(const GptConfig& config) {
  const bool learned = config.position_embedding_type == PositionEmbeddingType::learned_absolute;
  const bool layer_norm = config.normalization == Normalization::layer_norm;
  const bool grouped = config.query_groups() != config.num_attention_heads;
  if (learned && layer_norm && !config.swiglu && config.add_bias_linear &&
      config.share_embeddings_and_output_weights && !grouped) {
    return HfArchitecture::gpt2;
  }
  if (!learned && !layer_norm && config.swiglu && config.rotary_percent == 1.0) {
    return HfArchitecture::llama;
  }
  common::fail(
      "no Hugging Face architecture computes this model (position embedding {}, {}, {}, "
      "biases {}, output layer {}, {} query groups for {} heads, rotary percent {}): "
      "GPT2LMHeadModel needs learned positions, LayerNorm, GELU, biases, a tied output layer "
      "and multi-head attention; LlamaForCausalLM needs RoPE over whole heads "
      "(--rotary-percent 1.0), RMSNorm and SwiGLU",
      learned ? "learned_absolute" : "rope", layer_norm ? "LayerNorm" : "RMSNorm",
      config.swiglu ? "SwiGLU" : "GELU", config.add_bias_linear ? "on" : "off",
      config.share_embeddings_and_output_weights ? "tied" : "untied", config.query_groups(),
      config.num_attention_heads, config.rotary_percent);
}

std::vector<TensorMapping> mappings_for(const GptConfig& config) {
  return hf_architecture(config) == HfArchitecture::gpt2 ? gpt2_mappings(config)
                                                          : llama_mappings(config);
}

const char* embedding_hf_name(const GptConfig& config) {
  return hf_architecture(config) == HfArchitecture::gpt2 ? "transformer.wte.weight"
                                                          : "model.embed_tokens.weight";
}

// The layout tensor a mapping converts; its shape must be the one the mapping was built for.
const ParameterTensor& layout_tensor(const std::vector<ParameterTensor>& layout,
                                     const TensorMapping& mapping) {
  for (const ParameterTensor& tensor : layout) {
    if (tensor.name == mapping.megatron_name) {
      if (tensor.shape.empty() ||
          tensor.shape.at(0) != static_cast<int64_t>(mapping.rows.size())) {
        common::fail("Hugging Face conversion: tensor {} has an unexpected shape", tensor.name);
      }
      return tensor;
    }
  }
  common::fail("Hugging Face conversion: the model has no tensor {}", mapping.megatron_name);
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (const int64_t dim : shape) count *= dim;
  return count;
}

// Index of element (row, column) of a piece, row-major or transposed.
int64_t piece_index(const HfPiece& piece, bool transposed, int64_t row, int64_t column,
                    int64_t columns) {
  if (!transposed) return row * columns + column;
  const int64_t piece_rows = piece.shape.back();
  return column * piece_rows + row;
}

void check_layout_covered(const std::vector<ParameterTensor>& layout,
                          const std::vector<TensorMapping>& mappings) {
  std::set<std::string> mapped;
  for (const auto& mapping : mappings) mapped.insert(mapping.megatron_name);
  for (const auto& tensor : layout) {
    if (!mapped.contains(tensor.name)) {
      common::fail("Hugging Face conversion: model tensor {} has no Hugging Face name", tensor.name);
    }
  }
}

// JSON accessors that name the file and key in their errors.
int64_t required_integer(const nlohmann::json& config, const char* key, const std::string& source) {
  if (!config.contains(key)) common::fail("{}: missing key '{}'", source, key);
  const auto& value = config[key];
  // An unsigned value beyond int64 would wrap to a negative one in get<int64_t>().
  if (!value.is_number_integer() ||
      (value.is_number_unsigned() && !std::in_range<int64_t>(value.get<uint64_t>()))) {
    common::fail(
        "{}: '{}' must be an integer from -9223372036854775808 to 9223372036854775807, "
        "got {}",
        source, key, value.dump());
  }
  return value.get<int64_t>();
}

int64_t optional_integer(const nlohmann::json& config, const char* key, int64_t fallback,
                         const std::string& source) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  return required_integer(config, key, source);
}

double optional_number(const nlohmann::json& config, const char* key, double fallback,
                       const std::string& source) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  const auto& value = config[key];
  if (!value.is_number()) common::fail("{}: '{}' must be a number, got {}", source, key, value.dump());
  return value.get<double>();
}

bool optional_bool(const nlohmann::json& config, const char* key, bool fallback,
                   const std::string& source) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  const auto& value = config[key];
  if (!value.is_boolean()) common::fail("{}: '{}' must be true or false, got {}", source, key, value.dump());
  return value.get<bool>();
}

std::string optional_string(const nlohmann::json& config, const char* key,
                            const std::string& fallback, const std::string& source) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  const auto& value = config[key];
  if (!value.is_string()) common::fail("{}: '{}' must be a string, got {}", source, key, value.dump());
  return value.get<std::string>();
}

GptConfig gpt2_config_from_hf(const nlohmann::json& hf, const std::string& source) {
  GptConfig config;
  config.num_layers = required_integer(hf, "n_layer", source);
  config.hidden_size = required_integer(hf, "n_embd", source);
  config.num_attention_heads = required_integer(hf, "n_head", source);
  // n_inner null or absent: 4 × n_embd (transformers' default), which must fit int64 too.
  config.ffn_hidden_size =
      hf.contains("n_inner") && !hf["n_inner"].is_null()
          ? required_integer(hf, "n_inner", source)
          : common::checked_multiply(4, config.hidden_size, source + ": 4 × n_embd (n_inner's default)");
  config.max_position_embeddings = required_integer(hf, "n_positions", source);
  config.padded_vocab_size = required_integer(hf, "vocab_size", source);
  config.vocab_size = optional_integer(hf, kTokenizerVocabKey, config.padded_vocab_size, source);
  config.layernorm_epsilon = optional_number(hf, "layer_norm_epsilon", 1e-5, source);
  config.init_method_std = optional_number(hf, "initializer_range", 0.02, source);
  // transformers' GPT2Config defaults, so a Hub config without them means what it means there.
  config.hidden_dropout = optional_number(hf, "resid_pdrop", 0.1, source);
  config.attention_dropout = optional_number(hf, "attn_pdrop", 0.1, source);
  if (config.num_attention_heads <= 0 || config.hidden_size % config.num_attention_heads != 0) {
    common::fail("{}: n_head {} must be positive and divide n_embd {}", source,
                 config.num_attention_heads, config.hidden_size);
  }
  if (config.vocab_size > config.padded_vocab_size) {
    common::fail("{}: {} {} exceeds vocab_size {} (the rows of wte)", source, kTokenizerVocabKey,
                 config.vocab_size, config.padded_vocab_size);
  }

  // Settings that change GPT-2's computation away from what GptModel computes.
  const std::string activation = optional_string(hf, "activation_function", "gelu_new", source);
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    common::fail("{}: activation_function '{}' is not supported (valid: gelu_new, "
                 "gelu_pytorch_tanh: GELU with the tanh approximation, as Megatron's)",
                 source, activation);
  }
  if (!optional_bool(hf, "scale_attn_weights", true, source)) {
    common::fail("{}: scale_attn_weights false is not supported (attention scores are always "
                 "scaled by 1/sqrt(head dim))", source);
  }
  if (optional_bool(hf, "scale_attn_by_inverse_layer_idx", false, source)) {
    common::fail("{}: scale_attn_by_inverse_layer_idx true is not supported", source);
  }
  if (optional_bool(hf, "add_cross_attention", false, source)) {
    common::fail("{}: add_cross_attention true is not supported (a decoder-only GPT has no "
                 "encoder to attend to)", source);
  }
  if (!optional_bool(hf, "tie_word_embeddings", true, source)) {
    common::fail("{}: tie_word_embeddings false is not supported for gpt2 (the output layer is "
                 "the word embedding)", source);
  }
  return config;
}

// Hugging Face's rope_scaling (transformers' modeling_rope_utils.py): null, or rope_type
// "default", is plain RoPE; "llama3" (older configs say type) is Llama 3.x's scaling, whose four
// keys transformers requires. The other types (linear, dynamic, yarn, longrope) are not built.
RopeScaling rope_scaling_from_hf(const nlohmann::json& hf, const std::string& source) {
  if (!hf.contains("rope_scaling") || hf["rope_scaling"].is_null()) return {};
  const nlohmann::json& scaling = hf["rope_scaling"];
  const std::string where = source + ": rope_scaling";
  if (!scaling.is_object()) {
    common::fail("{} must be an object or null, got {}", where, scaling.dump());
  }
  const std::string type =
      optional_string(scaling, "rope_type", optional_string(scaling, "type", "default", where), where);
  if (type == "default") return {};
  if (type != "llama3") {
    common::fail("{}: rope_type '{}' is not supported (valid: llama3, Llama 3.x's scaling; "
                 "default or null, plain RoPE)",
                 where, type);
  }
  const char* keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings"};
  for (const char* key : keys) {
    if (!scaling.contains(key) || scaling[key].is_null()) {
      common::fail("{}: missing key '{}' (rope_type llama3 needs factor, low_freq_factor, "
                   "high_freq_factor and original_max_position_embeddings)",
                   where, key);
    }
  }
  const RopeScaling read = {
      .factor = optional_number(scaling, "factor", 0, where),
      .low_frequency_factor = optional_number(scaling, "low_freq_factor", 0, where),
      .high_frequency_factor = optional_number(scaling, "high_freq_factor", 0, where),
      .original_max_position_embeddings =
          optional_number(scaling, "original_max_position_embeddings", 0, where)};
  // transformers' _validate_llama3_parameters requires factor ≥ 1. A factor of 0 would
  // otherwise read as "no scaling" (RopeScaling::active), importing plain RoPE silently where
  // the config asks for Llama 3's; 0.5 and -8 are refused by the same rule.
  if (!(read.factor >= 1 && std::isfinite(read.factor))) {
    common::fail("{}: factor {} must be a finite number ≥ 1 (rope_type llama3 stretches RoPE's "
                 "wavelengths by it)", where, read.factor);
  }
  return read;
}

GptConfig llama_config_from_hf(const nlohmann::json& hf, const std::string& source) {
  GptConfig config;
  config.position_embedding_type = PositionEmbeddingType::rope;
  config.normalization = Normalization::rms_norm;
  config.swiglu = true;
  config.num_layers = required_integer(hf, "num_hidden_layers", source);
  config.hidden_size = required_integer(hf, "hidden_size", source);
  config.num_attention_heads = required_integer(hf, "num_attention_heads", source);
  config.ffn_hidden_size = required_integer(hf, "intermediate_size", source);
  // LlamaConfig's defaults where the key may be left out.
  config.max_position_embeddings = optional_integer(hf, "max_position_embeddings", 2048, source);
  config.padded_vocab_size = required_integer(hf, "vocab_size", source);
  config.vocab_size = optional_integer(hf, kTokenizerVocabKey, config.padded_vocab_size, source);
  config.layernorm_epsilon = optional_number(hf, "rms_norm_eps", 1e-6, source);
  config.init_method_std = optional_number(hf, "initializer_range", 0.02, source);
  config.hidden_dropout = 0.0;  // LlamaForCausalLM has no hidden dropout
  config.attention_dropout = optional_number(hf, "attention_dropout", 0.0, source);
  config.share_embeddings_and_output_weights = optional_bool(hf, "tie_word_embeddings", false, source);

  if (config.num_attention_heads <= 0 || config.hidden_size % config.num_attention_heads != 0) {
    common::fail("{}: num_attention_heads {} must be positive and divide hidden_size {}", source,
                 config.num_attention_heads, config.hidden_size);
  }
  if (config.vocab_size > config.padded_vocab_size) {
    common::fail("{}: {} {} exceeds vocab_size {} (the rows of embed_tokens)", source,
                 kTokenizerVocabKey, config.vocab_size, config.padded_vocab_size);
  }
  const double rope_theta = optional_number(hf, "rope_theta", 10000.0, source);
  // Checked before the cast: converting a double beyond int64's range is undefined.
  if (!(std::abs(rope_theta) < 0x1p63) || rope_theta != std::trunc(rope_theta)) {
    common::fail("{}: rope_theta {} must be a whole number below 2^63 (--rotary-base is an "
                 "integer)", source, rope_theta);
  }
  config.rotary_base = static_cast<int64_t>(rope_theta);
  const int64_t kv_heads =
      optional_integer(hf, "num_key_value_heads", config.num_attention_heads, source);
  if (kv_heads <= 0 || config.num_attention_heads % kv_heads != 0) {
    common::fail("{}: num_key_value_heads {} must be positive and divide num_attention_heads {}",
                 source, kv_heads, config.num_attention_heads);
  }
  // Megatron's --num-query-groups; NG = NH is plain multi-head attention (0 here).
  config.num_query_groups = kv_heads == config.num_attention_heads ? 0 : kv_heads;
  const int64_t head_dim = optional_integer(hf, "head_dim", config.head_dim(), source);
  if (head_dim != config.head_dim()) {
    common::fail("{}: head_dim {} is not hidden_size / num_attention_heads = {}, which is the only "
                 "head size built", source, head_dim, config.head_dim());
  }
  const std::string activation = optional_string(hf, "hidden_act", "silu", source);
  if (activation != "silu") {
    common::fail("{}: hidden_act '{}' is not supported (valid: silu, SwiGLU's)", source, activation);
  }
  config.rope_scaling = rope_scaling_from_hf(hf, source);
  const bool attention_bias = optional_bool(hf, "attention_bias", false, source);
  const bool mlp_bias = optional_bool(hf, "mlp_bias", false, source);
  if (attention_bias != mlp_bias) {
    common::fail("{}: attention_bias {} and mlp_bias {} differ; Megatron has one switch for both "
                 "(--disable-bias-linear)", source, attention_bias, mlp_bias);
  }
  config.add_bias_linear = attention_bias;
  return config;
}

// HF Hub GPT-2 checkpoints (the original "gpt2" repository) name tensors without the
// "transformer." prefix that GPT2LMHeadModel's state dict has; both load.
std::string canonical_gpt2_name(const std::string& name) {
  if (name.starts_with("transformer.") || name.starts_with("lm_head.")) return name;
  if (name.starts_with("h.") || name.starts_with("wte.") || name.starts_with("wpe.") ||
      name.starts_with("ln_f.")) {
    return "transformer." + name;
  }
  return name;
}

// Non-parameter buffers some checkpoints carry: GPT-2's causal mask and its fill value, older
// Llama exports' rotary inverse frequencies.
bool is_buffer(const std::string& name) {
  return (name.starts_with("transformer.h.") &&
          (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"))) ||
         (name.starts_with("model.layers.") && name.ends_with(".self_attn.rotary_emb.inv_freq"));
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::istringstream in(common::read_small_file(path, "the Hugging Face file"));
  return parse_hf_json(in, path.string());
}

// Whether something is at `path` (a file of the model directory), without the exception
// std::filesystem::exists throws for a path it cannot look up: a symbolic link loop, a
// component that is not a directory, a name too long are refused naming the path.
bool model_file_exists(const std::filesystem::path& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (error && error != std::errc::no_such_file_or_directory) {
    common::fail("cannot read the Hugging Face model file {}: {}", path.string(), error.message());
  }
  return std::filesystem::exists(status);
}

// The directory --import-hf names must be one: said plainly, before its files are looked for
// (a missing one is said as "no config.json").
void check_model_directory(const std::filesystem::path& directory) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(directory, error);
  if (error == std::errc::no_such_file_or_directory) return;
  if (error) {
    common::fail("cannot read the Hugging Face model directory {}: {}", directory.string(),
                 error.message());
  }
  if (!std::filesystem::is_directory(status)) {
    common::fail("cannot read the Hugging Face model directory {}: it is not a directory (give the "
                 "directory that holds config.json and model.safetensors)", directory.string());
  }
}

}  // namespace

nlohmann::json parse_hf_json(std::istream& in, const std::string& source) {
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {  // also out_of_range: 1e999
    common::fail("{} is not valid JSON: {}", source, error.what());
  }
}

nlohmann::ordered_json hf_config_json(const GptConfig& config) {
  nlohmann::ordered_json json;
  if (hf_architecture(config) == HfArchitecture::llama) {
    json["architectures"] = {"LlamaForCausalLM"};
    json["model_type"] = "llama";
    json["hidden_size"] = config.hidden_size;
    json["intermediate_size"] = config.ffn_hidden_size;
    json["num_attention_heads"] = config.num_attention_heads;
    json["num_key_value_heads"] = config.query_groups();
    json["head_dim"] = config.head_dim();
    json["num_hidden_layers"] = config.num_layers;
    json["max_position_embeddings"] = config.max_position_embeddings;
    json["vocab_size"] = config.padded_vocab_size;
    json[kTokenizerVocabKey] = config.vocab_size;
    json["rms_norm_eps"] = config.layernorm_epsilon;
    json["rope_theta"] = static_cast<double>(config.rotary_base);
    if (const RopeScaling& scaling = config.rope_scaling; scaling.active()) {
      json["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", scaling.factor},
          {"low_freq_factor", scaling.low_frequency_factor},
          {"high_freq_factor", scaling.high_frequency_factor},
          // An integer in Llama 3.x's configs (validated positive and finite; whole below 2^53).
          {"original_max_position_embeddings",
           scaling.original_max_position_embeddings == std::trunc(scaling.original_max_position_embeddings) &&
                   scaling.original_max_position_embeddings < 0x1p53
               ? nlohmann::ordered_json(static_cast<int64_t>(scaling.original_max_position_embeddings))
               : nlohmann::ordered_json(scaling.original_max_position_embeddings)}};
    } else {
      json["rope_scaling"] = nullptr;
    }
    json["hidden_act"] = "silu";
    json["attention_bias"] = config.add_bias_linear;
    json["mlp_bias"] = config.add_bias_linear;
    json["attention_dropout"] = config.attention_dropout;
    json["initializer_range"] = config.init_method_std;
    json["tie_word_embeddings"] = config.share_embeddings_and_output_weights;
    json["torch_dtype"] = "float32";
    return json;
  }
  json["architectures"] = {"GPT2LMHeadModel"};
  json["model_type"] = "gpt2";
  json["n_embd"] = config.hidden_size;
  json["n_head"] = config.num_attention_heads;
  json["n_layer"] = config.num_layers;
  json["n_positions"] = config.max_position_embeddings;
  json["n_ctx"] = config.max_position_embeddings;
  json["n_inner"] = config.ffn_hidden_size;
  json["vocab_size"] = config.padded_vocab_size;
  json[kTokenizerVocabKey] = config.vocab_size;
  json["layer_norm_epsilon"] = config.layernorm_epsilon;
  json["activation_function"] = "gelu_new";
  json["initializer_range"] = config.init_method_std;
  json["resid_pdrop"] = config.hidden_dropout;
  json["embd_pdrop"] = config.hidden_dropout;
  json["attn_pdrop"] = config.attention_dropout;
  json["scale_attn_weights"] = true;
  json["tie_word_embeddings"] = true;
  json["torch_dtype"] = "float32";
  return json;
}

GptConfig gpt_config_from_hf(const nlohmann::json& hf, const std::string& source) {
  if (!hf.is_object()) common::fail("{}: expected a JSON object", source);
  const std::string model_type = optional_string(hf, "model_type", "", source);
  GptConfig config;
  if (model_type == "gpt2") {
    config = gpt2_config_from_hf(hf, source);
  } else if (model_type == "llama") {
    config = llama_config_from_hf(hf, source);
  } else {
    common::fail("{}: model_type '{}' is not supported (valid: gpt2, llama)", source, model_type);
  }
  try {
    validate(config);
  } catch (const common::Error& error) {
    common::fail("{}: the model it describes is not valid: {}", source, error.what());
  }
  return config;
}

std::vector<NamedTensor> to_hf_tensors(const GptConfig& config,
                                       const std::vector<ParameterTensor>& layout,
                                       std::span<const float> buffer, HfValues values) {
  const auto mappings = mappings_for(config);
  check_layout_covered(layout, mappings);
  std::vector<NamedTensor> result;
  for (const TensorMapping& mapping : mappings) {
    const ParameterTensor& tensor = layout_tensor(layout, mapping);
    const size_t first = result.size();
    for (const HfPiece& piece : mapping.pieces) {
      result.push_back({piece.name, piece.shape,
                        std::vector<float>(static_cast<size_t>(element_count(piece.shape)))});
    }
    const int64_t rows = static_cast<int64_t>(mapping.rows.size());
    const int64_t columns = tensor.numel / rows;
    const float* source = buffer.data() + tensor.offset;
    const float offset = values == HfValues::parameters ? mapping.offset : 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const RowTarget target = mapping.rows[static_cast<size_t>(r)];
      const HfPiece& piece = mapping.pieces[static_cast<size_t>(target.piece)];
      auto& values = result[first + static_cast<size_t>(target.piece)].values;
      for (int64_t c = 0; c < columns; ++c) {
        values[static_cast<size_t>(piece_index(piece, mapping.transposed, target.row, c, columns))] =
            source[r * columns + c] + offset;
      }
    }
  }
  return result;
}

void from_hf_tensors(const GptConfig& config, const std::vector<ParameterTensor>& layout,
                     const std::vector<NamedTensor>& tensors, std::span<float> buffer,
                     const std::string& source, HfValues values) {
  const auto mappings = mappings_for(config);
  check_layout_covered(layout, mappings);
  const bool gpt2 = hf_architecture(config) == HfArchitecture::gpt2;
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& tensor : tensors) {
    const std::string name = gpt2 ? canonical_gpt2_name(tensor.name) : tensor.name;
    if (!by_name.emplace(name, &tensor).second) {
      common::fail("{}: tensor {} is given twice", source, name);
    }
  }
  std::set<std::string> used;
  for (const TensorMapping& mapping : mappings) {
    const ParameterTensor& tensor = layout_tensor(layout, mapping);
    std::vector<const NamedTensor*> pieces;
    for (const HfPiece& piece : mapping.pieces) {
      const auto found = by_name.find(piece.name);
      if (found == by_name.end()) {
        common::fail("{}: tensor {} {} is missing (it holds {})", source, piece.name,
                     format_python_shape(piece.shape), mapping.megatron_name);
      }
      if (found->second->shape != piece.shape) {
        common::fail("{}: tensor {} has shape {}, expected {} for this config.json", source,
                     piece.name, format_python_shape(found->second->shape),
                     format_python_shape(piece.shape));
      }
      used.insert(piece.name);
      pieces.push_back(found->second);
    }
    const int64_t rows = static_cast<int64_t>(mapping.rows.size());
    const int64_t columns = tensor.numel / rows;
    float* destination = buffer.data() + tensor.offset;
    const float offset = values == HfValues::parameters ? mapping.offset : 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const RowTarget target = mapping.rows[static_cast<size_t>(r)];
      const HfPiece& piece = mapping.pieces[static_cast<size_t>(target.piece)];
      const auto& hf_values = pieces[static_cast<size_t>(target.piece)]->values;
      for (int64_t c = 0; c < columns; ++c) {
        destination[r * columns + c] =
            hf_values[static_cast<size_t>(piece_index(piece, mapping.transposed, target.row, c,
                                                      columns))] -
            offset;
      }
    }
  }

  for (const auto& [name, tensor] : by_name) {
    if (used.contains(name) || is_buffer(name)) continue;
    if (name == "lm_head.weight") {
      // A tied output layer saved anyway: it must be the word embedding.
      const auto embedding = by_name.find(embedding_hf_name(config));
      if (embedding != by_name.end() && embedding->second->values == tensor->values) continue;
      common::fail("{}: lm_head.weight differs from {}, but config.json ties them "
                   "(tie_word_embeddings)", source, embedding_hf_name(config));
    }
    common::fail("{}: unexpected tensor {} {} (not part of the model config.json describes)",
                 source, name, format_python_shape(tensor->shape));
  }
}

void export_hf(const std::filesystem::path& directory, const GptModel<float>& model) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) common::fail("cannot create {}: {}", directory.string(), error.message());
  const GptConfig& config = model.config();
  common::write_text_file_atomically(directory / "config.json",
                                     hf_config_json(config).dump(2) + "\n");
  // "format": "pt" is what transformers' from_pretrained requires of safetensors metadata.
  write_safetensors(directory / kSafetensorsFile,
                    to_hf_tensors(config, model.tensors(), model.parameters()),
                    {{"format", "pt"}, {kTokenizerVocabKey, std::to_string(config.vocab_size)}});
}

GptModel<float> import_hf(const std::filesystem::path& directory) {
  check_model_directory(directory);
  const auto config_path = directory / "config.json";
  if (!model_file_exists(config_path)) {
    common::fail("{}: no config.json (not a Hugging Face model directory)", directory.string());
  }
  const nlohmann::json hf_config = read_json_file(config_path);
  // The model config.json describes is checked, and its memory estimated, before a tensor is
  // read: a config that cannot be built, or not on this machine, is refused at once.
  GptConfig config = gpt_config_from_hf(hf_config, config_path.string());
  common::require_memory_fits(common::estimate_conversion_memory(model_shape(config)),
                              common::available_memory(),
                              fmt::format("{}: the model it describes", config_path.string()),
                              "Convert it on a machine with more memory.");

  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> metadata;
  std::string source;
  if (model_file_exists(directory / kSafetensorsFile)) {
    source = (directory / kSafetensorsFile).string();
    auto file = read_safetensors(directory / kSafetensorsFile);
    tensors = std::move(file.tensors);
    metadata = std::move(file.metadata);
  } else if (model_file_exists(directory / kSafetensorsIndexFile)) {
    const auto index_path = directory / kSafetensorsIndexFile;
    source = index_path.string();
    const nlohmann::json index = read_json_file(index_path);
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
      common::fail("{}: missing the weight_map object", source);
    }
    std::set<std::string> shards;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) common::fail("{}: weight_map entry {} must be a file name", source, name);
      shards.insert(shard.get<std::string>());
    }
    for (const std::string& shard : shards) {
      auto file = read_safetensors(directory / shard);
      for (auto& tensor : file.tensors) tensors.push_back(std::move(tensor));
      metadata.merge(file.metadata);
    }
  } else if (model_file_exists(directory / "pytorch_model.bin")) {
    common::fail("{}: only pytorch_model.bin is there; pickled checkpoints are not read (they can "
                 "run code). Convert it to model.safetensors first", directory.string());
  } else {
    common::fail("{}: neither {} nor {} is there", directory.string(), kSafetensorsFile,
                 kSafetensorsIndexFile);
  }

  // The tokenizer's size: config.json's key, else the metadata's, else the whole vocabulary.
  if (const auto found = metadata.find(kTokenizerVocabKey);
      found != metadata.end() && !hf_config.contains(kTokenizerVocabKey)) {
    try {
      config.vocab_size = std::stoll(found->second);
    } catch (const std::exception&) {
      common::fail("{}: __metadata__ {} '{}' is not an integer", source, kTokenizerVocabKey,
                   found->second);
    }
    if (config.vocab_size < 1 || config.vocab_size > config.padded_vocab_size) {
      common::fail("{}: __metadata__ {} {} is outside [1, vocab_size {}]", source,
                   kTokenizerVocabKey, config.vocab_size, config.padded_vocab_size);
    }
  }
  GptModel<float> model(config);
  from_hf_tensors(config, model.tensors(), tensors, model.parameters(), source);
  return model;
}

}  // namespace backend
