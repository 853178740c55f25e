// The NeMo config settings that make the launcher render a pretrain_gpt shape flag
// (launcher/stages/training_stage.cpp's mapping, read backwards), so that a message asking a
// launcher user for flags can ask for the keys the user writes instead: pretrain_gpt started with
// --name-config-keys (the launcher adds it to every training job) says "set
// training.model.make_vocab_size_divisible_by=4" where it would say "pass
// --make-vocab-size-divisible-by 4". Only the flags such messages name are here (the checkpoint
// shape flags of backend/ckpt/checkpoint.cpp); tests/launcher/stages/nemo_config_keys_test.cpp
// renders every setting through the launcher's mapping and checks that it gives the flag.
#pragma once

#include <string>
#include <string_view>

namespace common {

// "training.model.make_vocab_size_divisible_by=4" for ("--make-vocab-size-divisible-by", "4");
// several settings space-separated where one flag comes from two keys ("--tokenizer-type
// Llama2Tokenizer": training.model.tokenizer.library=sentencepiece
// training.model.tokenizer.type=Llama2Tokenizer); a switch's value is "true" (given) or "false".
// Empty when no config key renders the flag (--vocab-size: the launcher never passes it).
std::string nemo_settings_for_flag(std::string_view flag, std::string_view value);

}  // namespace common
