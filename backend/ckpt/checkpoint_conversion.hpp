// Between checkpoints and models, for checkpoint_util (Megatron-LM's tools/checkpoint/
// convert.py with loader_megatron / saver_megatron): the model a checkpoint holds, rebuilt from
// the record of the arguments it was saved with (checkpoint_record.hpp), and the record that
// rebuilds a given model, for saving one that came from elsewhere (a Hugging Face import) as a
// checkpoint pretrain_gpt can load.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <string>

#include "backend/ckpt/checkpoint_record.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/model/gpt_model.hpp"

namespace backend {

// The weights of the checkpoint DIR's tracker names (an iteration or a release), in the model
// its saved arguments describe; the optimizer state is not read. A tensor- or pipeline-parallel
// checkpoint's files (one per rank and stage) are assembled whole (load_whole_checkpoint_weights,
// checkpoint_reshard.hpp), with the padded vocabulary of the size that saved it. Megatron's load
// messages go to `out`. A directory without a tracker, or a checkpoint that does not match its own
// arguments, is a common::Error naming the file.
GptModel<float> load_checkpoint_weights(const std::filesystem::path& directory, std::ostream& out);

// The model's flags (as a checkpoint records them) under which pretrain_gpt builds exactly
// `config`: model_config(arguments_for_model(config)) gives `config` back. The vocabulary becomes
// --tokenizer-type GPT2BPETokenizer when the tokenizer's size is GPT-2's 50257, else
// NullTokenizer with --vocab-size = size − 1 (NullTokenizer adds its EOD), and
// --make-vocab-size-divisible-by the largest power of two up to 128 that pads the tokenizer's
// size to config.padded_vocab_size (else the padded size itself). --seq-length is
// --max-position-embeddings.
CheckpointModelRecord arguments_for_model(const GptConfig& config);

// The tokenizer a Hugging Face model directory ships, recorded in `arguments` in place of
// arguments_for_model's NullTokenizer when it has the model's vocabulary size
// (`model_vocab_size`): tokenizer.model (SentencePiece: Llama 1 and 2, Mistral) as
// Llama2Tokenizer, else tokenizer.json (Llama 3) as HuggingFaceTokenizer, with --tokenizer-model
// its absolute path, as Megatron's Llama guide passes them. Then the printed flags and the
// checkpoint's record (--use-checkpoint-args) name the tokenizer that made the model. Returns
// one line saying what was recorded or why nothing was (no tokenizer file, another vocabulary
// size, a file the tokenizer cannot read: the weights are imported all the same, and the
// arguments stay as they were).
std::string record_hf_tokenizer(CheckpointModelRecord& arguments,
                                const std::filesystem::path& hf_directory,
                                int64_t model_vocab_size);

}  // namespace backend
