// NeMo's .nemo archives of a GPT (NeMo 1.x as NeMo-Megatron-Launcher 23.x runs it, the model
// class MegatronGPTModel without Megatron core: mcore_gpt false), imported and exported
// (nemo/core/connectors/save_restore_connector.py, nemo/collections/nlp/parts/nlp_overrides.py's
// NLPSaveRestoreConnector). A .nemo is a tar archive (tar_archive.hpp) of
//   ./model_config.yaml       the model's config: the resolved `model` section of the training
//                             config, with `target` (the class) and `nemo_version`
//   ./model_weights.ckpt      torch.save of model.state_dict() at tensor- and pipeline-parallel
//                             size 1 (mp_rank_TT/model_weights.ckpt per rank at TP > 1,
//                             tp_rank_TT_pp_rank_PPP/ with pipeline stages: not read yet)
//   ./<32 hex>_<file>         the tokenizer's files, which the config names "nemo:<32 hex>_<file>"
// model.state_dict() of the legacy GPTModel, names prefixed "model." ("model.module." under
// megatron_amp_O2, read alike), mapped to this backend's names (Megatron core's local spec):
//   model.language_model.embedding.word_embeddings.weight      embedding.word_embeddings.weight
//   model.language_model.embedding.position_embeddings.weight  embedding.position_embeddings.*
//   model.language_model.rotary_pos_emb.inv_freq               (RoPE's buffer: written, not read)
//   model.language_model.encoder.layers.N.input_layernorm.*    decoder.layers.N.input_layernorm
//     .self_attention.query_key_value.*                          .self_attention.linear_qkv
//     .self_attention.dense.*                                    .self_attention.linear_proj
//     .post_attention_layernorm.*                                .pre_mlp_layernorm
//     .mlp.dense_h_to_4h.* (and under SwiGLU .dense_h_to_4h_2)   .mlp.linear_fc1: the gate's rows
//                                                                (dense_h_to_4h), then the up
//                                                                projection's (dense_h_to_4h_2)
//     .mlp.dense_4h_to_h.*                                       .mlp.linear_fc2
//   model.language_model.encoder.final_layernorm.*             decoder.final_layernorm
//   model.language_model.output_layer.weight (untied)          output_layer.weight
// The fused QKV rows are per head [q, k, v] (per query group [its q heads, k, v]), as here.
// The config's keys (NeMo's megatron_gpt_config.yaml) give the model: num_layers, hidden_size,
// ffn_hidden_size, num_attention_heads, num_query_groups, encoder_seq_length,
// max_position_embeddings, normalization (layernorm, layernorm1p, rmsnorm), layernorm_epsilon,
// activation (gelu, swiglu, fast-swiglu), bias, position_embedding_type (learned_absolute,
// rope), rotary_base, rotary_percentage, share_embeddings_and_output_weights,
// make_vocab_size_divisible_by, kv_channels (none but hidden / heads), and the tokenizer
// (library megatron, sentencepiece or huggingface; type; model, vocab_file, merge_file).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "backend/ckpt/checkpoint_record.hpp"
#include "backend/model/gpt_model.hpp"

namespace backend {

// A .nemo imported: the model its config describes (at tensor-parallel size 1) with its
// weights, and the tokenizer's files, extracted.
struct NemoImport {
  CheckpointModelRecord record;
  GptModel<float> model;
  // The tokenizer's files written into the artifact directory, and the flags that name them
  // (--tokenizer-model is in the record; --vocab-file and --merge-file are not).
  std::vector<std::string> tokenizer_flags;
};

// Reads `archive`; the tokenizer files it holds are written into `artifact_directory`
// (created). Refused, naming the archive and the key or tensor: what tar_archive.hpp refuses,
// no model_config.yaml, a Megatron core model (mcore_gpt true: its weights are a distributed
// checkpoint), a config this backend cannot build (naming the key and the valid values), a
// weights file of several ranks, a tensor missing, of another shape, or not one of the names
// above.
NemoImport import_nemo(const std::filesystem::path& archive,
                       const std::filesystem::path& artifact_directory);

// Writes `model` (a whole model, tensor-parallel size 1) as the .nemo `archive`: the config of
// `record`'s model and tokenizer (a SentencePiece model file packed in), the weights in fp32,
// nemo_version 1.20.0 (NeMo-Megatron-Launcher 23.07's and 23.08's NeMo).
// GPT-2 BPE's files, which the record does not name: packed in when given (the launcher's
// conversion.model.vocab_file and merge_file, as NeMo's converter packs them).
struct NemoTokenizerFiles {
  std::filesystem::path vocab_file, merge_file;
};
void export_nemo(const std::filesystem::path& archive, const GptModel<float>& model,
                 const CheckpointModelRecord& record, const NemoTokenizerFiles& files = {});

}  // namespace backend
