// libFuzzer target: the Hugging Face config.json reader (backend/ckpt/hf_format.cpp) on
// arbitrary text: parse_hf_json, as import_hf reads the file, then gpt_config_from_hf. A
// config it accepts must be valid (validate) and survive the round trip through the
// config.json that export writes (hf_config_json) unchanged. Anything but success or
// common::Error, a crash or a sanitizer report (the sizes are int64: overflow, float casts) is
// a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "backend/ckpt/hf_format.hpp"
#include "backend/common/error.hpp"
#include "backend/model/gpt_config.hpp"

namespace {

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "FINDING: hf_config_fuzzer: %s\n", what.c_str());
  std::abort();
}

bool same(const backend::GptConfig& a, const backend::GptConfig& b) {
  return a.num_layers == b.num_layers && a.hidden_size == b.hidden_size &&
         a.num_attention_heads == b.num_attention_heads &&
         a.query_groups() == b.query_groups() && a.ffn_hidden_size == b.ffn_hidden_size &&
         a.max_position_embeddings == b.max_position_embeddings &&
         a.vocab_size == b.vocab_size && a.padded_vocab_size == b.padded_vocab_size &&
         a.layernorm_epsilon == b.layernorm_epsilon && a.init_method_std == b.init_method_std &&
         a.hidden_dropout == b.hidden_dropout && a.attention_dropout == b.attention_dropout &&
         a.position_embedding_type == b.position_embedding_type &&
         a.rotary_base == b.rotary_base && a.rotary_percent == b.rotary_percent &&
         a.normalization == b.normalization && a.swiglu == b.swiglu &&
         a.add_bias_linear == b.add_bias_linear &&
         a.share_embeddings_and_output_weights == b.share_embeddings_and_output_weights;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  backend::GptConfig config;
  try {
    config = backend::gpt_config_from_hf(backend::parse_hf_json(in, "config.json"), "config.json");
  } catch (const common::Error&) {
    return 0;
  }
  try {
    backend::validate(config);
  } catch (const common::Error& error) {
    finding(std::string("an accepted config.json gives an invalid model: ") + error.what());
  }
  std::string written;
  try {
    written = backend::hf_config_json(config).dump();
    std::istringstream again(written);
    if (!same(config, backend::gpt_config_from_hf(backend::parse_hf_json(again, "written"), "written"))) {
      finding("hf_config_json/gpt_config_from_hf round trip changed the config:\n" + written);
    }
  } catch (const common::Error& error) {
    finding(std::string("the config.json written for an accepted config is refused: ") +
            error.what() + "\n" + written);
  }
  return 0;
}
