// common::nemo_settings_for_flag, the launcher's mapping read backwards for pretrain_gpt's
// messages under --name-config-keys, checked against the mapping itself: every setting it gives
// is rendered by the training stage and must give back the flag and value it was asked for.
// And the launcher's training job passes --name-config-keys.
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "backend/common/nemo_config_keys.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/stages/command_flags.hpp"
#include "launcher/stages/training_stage.hpp"

using namespace launcher;

namespace {

// gpt3/126m with "key=value" settings, as `launcher main` overrides (++: set whether or not
// the tree has the key).
std::vector<std::string> rendered_with(const std::string& settings) {
  std::vector<std::string> overrides = {"training=gpt3/126m", "launcher_scripts_path=/opt/launcher"};
  std::istringstream words(settings);
  for (std::string setting; words >> setting;) overrides.push_back("++" + setting);
  ComposedConfig composed = compose({std::string(TEST_SOURCE_DIR) + "/conf", "config", overrides});
  return megatron_training_arguments(resolve(composed.config, ResolveContext{composed.choices}));
}

}  // namespace

TEST_CASE("each flag's config settings render that flag with that value") {
  struct Case {
    std::string flag, value;
  };
  const std::vector<Case> valued = {
      {"--num-layers", "6"},
      {"--hidden-size", "512"},
      {"--ffn-hidden-size", "2048"},
      {"--num-attention-heads", "8"},
      {"--seq-length", "1024"},
      {"--max-position-embeddings", "4096"},
      {"--make-vocab-size-divisible-by", "4"},
      {"--tensor-model-parallel-size", "2"},
      {"--pipeline-model-parallel-size", "2"},
      {"--num-query-groups", "4"},
      {"--tokenizer-type", "Llama2Tokenizer"},
      {"--tokenizer-type", "GPTSentencePieceTokenizer"},
      {"--tokenizer-type", "GPT2BPETokenizer"},
      {"--tokenizer-type", "NullTokenizer"},
      {"--position-embedding-type", "rope"},
      {"--normalization", "RMSNorm"},
  };
  for (const Case& c : valued) {
    const std::string settings = common::nemo_settings_for_flag(c.flag, c.value);
    CAPTURE(c.flag);
    CAPTURE(settings);
    REQUIRE_FALSE(settings.empty());
    CHECK(test_support::flag_value(rendered_with(settings), c.flag) == c.value);
  }
  // Switches, and the values that pass no flag (Megatron's defaults).
  const std::vector<Case> switches = {{"--swiglu", "true"},
                                      {"--disable-bias-linear", "true"},
                                      {"--untie-embeddings-and-output-weights", "true"},
                                      {"--group-query-attention --num-query-groups", "4"}};
  for (const Case& c : switches) {
    CAPTURE(c.flag);
    const auto arguments = rendered_with(common::nemo_settings_for_flag(c.flag, c.value));
    std::istringstream flags(c.flag);
    for (std::string flag; flags >> flag;) CHECK(test_support::has(arguments, flag));
  }
  for (const Case& c : std::vector<Case>{{"--swiglu", "false"},
                                         {"--disable-bias-linear", "false"},
                                         {"--untie-embeddings-and-output-weights", "false"},
                                         {"--position-embedding-type", "learned_absolute"},
                                         {"--normalization", "LayerNorm"}}) {
    CAPTURE(c.flag);
    CHECK_FALSE(test_support::has(rendered_with(common::nemo_settings_for_flag(c.flag, c.value)),
                                  c.flag));
  }
  // A Hugging Face tokenizer is a directory the message cannot know: it says what to give.
  CHECK(common::nemo_settings_for_flag("--tokenizer-type", "HuggingFaceTokenizer") ==
        "training.model.tokenizer.library=huggingface training.model.tokenizer.type=<the "
        "directory of its tokenizer.json>");
}

TEST_CASE("the training job tells pretrain_gpt that its flags came from config keys") {
  std::vector<std::string> overrides = {"training=gpt3/126m", "launcher_scripts_path=/opt/launcher"};
  ComposedConfig composed = compose({std::string(TEST_SOURCE_DIR) + "/conf", "config", overrides});
  const JobSpec job =
      build_training_job({resolve(composed.config, ResolveContext{composed.choices}), "/opt/bin", ""});
  CHECK(test_support::has(job.command, "--name-config-keys"));
}
