// The text Megatron hashes to name its dataset index caches, reproduced byte for byte so that a
// cache written by Megatron is found and reused here (and one written here is found by Megatron).
//
// Megatron (megatron/core/datasets/megatron_dataset.py, blended_dataset.py; core 0.8 to 0.19)
// names each cache file `<md5 of the description>-<class>-<split>-<suffix>`, where the
// description is `json.dumps(unique_identifiers, indent=4, default=lambda o:
// o.unique_identifiers)`: Python's json module with its defaults (ensure_ascii, separators
// ", " / ": " turned into newlines by the indent) over an OrderedDict. python_json_text writes
// exactly that text for a JSON value:
//   - objects and arrays one entry per line, indented 4 spaces per level; `{}` and `[]` when
//     empty; "key": value
//   - strings with `"` `\` `\b` `\f` `\n` `\r` `\t` escaped as such, every other code point
//     below U+0020 or from U+007F on as \uXXXX (lowercase hex, astral ones as a surrogate
//     pair); a byte that is not part of valid UTF-8 as \udcXX, the lone surrogate Python's
//     surrogateescape makes of it when a path on the command line is not UTF-8
//   - integers in decimal; floats as Python's repr: the shortest digits that read back as the
//     same double, positional when the decimal exponent is from −4 to 15 (with ".0" when
//     integral), else d.ddde±XX; `null`, `true`, `false`
//
// The tokenizer entry: the description holds the tokenizer object, which json.dumps writes as
// its unique_identifiers. That is Megatron's legacy tokenizer system
// (megatron/training/tokenizer/tokenizer.py over MegatronLegacyTokenizer, formerly
// MegatronTokenizer, in megatron/core/datasets/megatron_tokenizer.py): the only one up to core
// 0.14, and the one 0.15 and 0.16 use with --legacy-tokenizer. Its identifiers are the class
// name, the paths given to it as a list, then each keyword option converted with str():
//   GPT2BPETokenizer            {"class": "_GPT2BPETokenizer", "tokenizer_path": [vocab, merges]}
//   SentencePieceTokenizer      {"class": "_SentencePieceTokenizer", "tokenizer_path": [model],
//                                "vocab_extra_ids": "N"}
//   GPTSentencePieceTokenizer   the same with "_GPTSentencePieceTokenizer" and "0"
//   Llama2Tokenizer             the same with "_Llama2Tokenizer" and "0"
//   NullTokenizer               {"class": "_NullTokenizer", "tokenizer_path": [null],
//                                "vocab_size": "N"} (N = --vocab-size, before the EOD is added)
// Paths are the flags' text as given (Megatron does not resolve them), as is each dataset prefix.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "backend/data/tokenizer.hpp"

namespace backend {

// json.dumps(value, indent=4) as Python writes it (see above).
std::string python_json_text(const nlohmann::ordered_json& value);

// The tokenizer's entry in a dataset description: Megatron's legacy tokenizer's
// unique_identifiers for `options.tokenizer_type` (a type build_tokenizer accepts).
nlohmann::ordered_json megatron_tokenizer_identifiers(const TokenizerOptions& options);

}  // namespace backend
