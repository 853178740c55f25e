// Hugging Face export and import of a GptModel: the directory transformers'
// from_pretrained reads (config.json + model.safetensors), with the tensor names and layouts
// of GPT2LMHeadModel (transformers/models/gpt2/modeling_gpt2.py) for the GPT-2 model and of
// LlamaForCausalLM (models/llama/modeling_llama.py) for the Llama switches, the inverse of
// what Megatron-LM's tools/checkpoint loaders do. Any other combination of switches has no
// Hugging Face architecture that computes it and is refused.
//
// Megatron core → GPT2LMHeadModel (C hidden, NH heads, HD = C / NH, F ffn, V padded vocab):
//   embedding.word_embeddings.weight (V, C)        → transformer.wte.weight (V, C)
//   embedding.position_embeddings.weight (P, C)    → transformer.wpe.weight (P, C)
//   decoder.layers.{i}.input_layernorm.{w,b}       → transformer.h.{i}.ln_1.{weight,bias}
//   ….self_attention.linear_qkv.weight (3C, C)     → transformer.h.{i}.attn.c_attn.weight (C, 3C)
//   ….self_attention.linear_qkv.bias (3C)          → transformer.h.{i}.attn.c_attn.bias (3C)
//   ….self_attention.linear_proj.{weight, bias}    → transformer.h.{i}.attn.c_proj (C, C), (C)
//   ….pre_mlp_layernorm.{w,b}                      → transformer.h.{i}.ln_2
//   ….mlp.linear_fc1.{weight (F, C), bias}         → transformer.h.{i}.mlp.c_fc (C, F), (F)
//   ….mlp.linear_fc2.{weight (C, F), bias}         → transformer.h.{i}.mlp.c_proj (F, C), (C)
//   decoder.final_layernorm.{w,b}                  → transformer.ln_f
//   (output layer tied to wte: no lm_head.weight, as save_pretrained writes tied weights)
// Two layout changes: GPT-2's Conv1D stores weights (in, out), the transpose of Megatron's and
// torch.nn.Linear's (out, in); and the fused qkv output is [all q heads | all k | all v] in
// GPT-2 but per head [q | k | v] in Megatron core. So Megatron row h·3HD + s·HD + d (s = 0, 1,
// 2 for q, k, v) is GPT-2 column s·C + h·HD + d.
//
// Megatron core (RoPE, RMSNorm, SwiGLU) → LlamaForCausalLM, all weights (out, in) on both sides:
//   embedding.word_embeddings.weight               → model.embed_tokens.weight
//   decoder.layers.{i}.input_layernorm.weight      → model.layers.{i}.input_layernorm.weight
//   ….self_attention.linear_qkv.{weight,bias}      → ….self_attn.{q,k,v}_proj.{weight,bias}
//       rows per query group [its q heads | k | v] split into the three projections; the
//       NG query groups (--num-query-groups) are config.json's num_key_value_heads
//   ….self_attention.linear_proj.{weight,bias}     → ….self_attn.o_proj.{weight,bias}
//   ….pre_mlp_layernorm.weight                     → ….post_attention_layernorm.weight
//   ….mlp.linear_fc1.{weight,bias} (2F, C)         → ….mlp.gate_proj (first F rows), up_proj
//   ….mlp.linear_fc2.{weight,bias}                 → ….mlp.down_proj
//   decoder.final_layernorm.weight                 → model.norm.weight
//   output_layer.weight (untied only)              → lm_head.weight
// Biases exist with add_bias_linear (config.json attention_bias = mlp_bias = true). q and k
// need no permutation: Megatron core's non-interleaved RoPE is the rotate_half form that
// transformers' Llama uses (the permutation in convert_llama_weights_to_hf is for Meta's
// interleaved checkpoints).
//
// The vocabulary is exported padded (config.json vocab_size = Megatron's padded size): the
// model was trained with a softmax over the padded rows, so dropping them would change the
// logits' normaliser. The tokenizer's size is kept in config.json's "tokenizer_vocab_size" and
// the safetensors "__metadata__"; docs/checkpoints.md, "Hugging Face export".
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <istream>
#include <span>
#include <string>
#include <vector>

#include "backend/ckpt/safetensors.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/model/gpt_model.hpp"

namespace backend {

// The JSON of config.json or model.safetensors.index.json, read from `in`; fails naming
// `source` when it is not JSON. import_hf reads both files through it, the fuzz target its text.
nlohmann::json parse_hf_json(std::istream& in, const std::string& source);

// config.json for the architecture the GptConfig describes.
nlohmann::ordered_json hf_config_json(const GptConfig& config);

// The GptConfig a config.json describes. `source` names the file in messages. Fails on an
// architecture we cannot build (naming model_type and what is supported) and on settings that
// change the computation in ways GptModel does not implement.
GptConfig gpt_config_from_hf(const nlohmann::json& config, const std::string& source);

// What a buffer holds: the parameters, or the gradients (a LayerNorm weight stored as γ − 1,
// --apply-layernorm-1p, becomes γ in Hugging Face's form; its gradient is the same either way).
enum class HfValues { parameters, gradients };

// Megatron-named tensors of a flat buffer laid out as `layout` (GptModel::tensors()): the
// parameters, or the gradients, under Hugging Face names and layouts.
std::vector<NamedTensor> to_hf_tensors(const GptConfig& config,
                                       const std::vector<ParameterTensor>& layout,
                                       std::span<const float> buffer,
                                       HfValues values = HfValues::parameters);

// The inverse: fills every tensor of `layout` in `buffer` from Hugging Face tensors. A missing,
// unexpected or mis-shaped tensor fails naming it and `source`.
void from_hf_tensors(const GptConfig& config, const std::vector<ParameterTensor>& layout,
                     const std::vector<NamedTensor>& tensors, std::span<float> buffer,
                     const std::string& source, HfValues values = HfValues::parameters);

// Writes <directory>/config.json and <directory>/model.safetensors (creating the directory).
void export_hf(const std::filesystem::path& directory, const GptModel<float>& model);

// Reads a directory export_hf wrote, or one from the Hub for a supported architecture:
// config.json and either model.safetensors or the shards model.safetensors.index.json lists.
GptModel<float> import_hf(const std::filesystem::path& directory);

}  // namespace backend
