// checkpoint_util, the executable: a pretrain_gpt run's checkpoint (GPT-2, Llama, Llama 3.x with
// its RoPE scaling) is exported to Hugging Face, imported back as a release checkpoint, and
// pretrain_gpt started from it with the flags checkpoint_util prints computes the same first
// loss as a run resumed from the original weights would (both forward the same weights on the
// same batch); bad command lines exit 2 with one line naming the problem.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ckpt/safetensors.hpp"
#include "launcher/process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::kPretrainGpt;
using test_support::kCheckpointUtil;

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// The lm loss of the first iteration line.
std::string first_loss(const std::string& output) {
  std::smatch match;
  if (!std::regex_search(output, match, std::regex(R"(lm loss: ([0-9.E+-]+))"))) return "";
  return match[1].str();
}

}  // namespace

TEST_CASE("checkpoint_util: checkpoint → Hugging Face → release checkpoint → pretrain_gpt") {
  test_support::TemporaryDirectory temporary;
  std::vector<std::string> model = {"--num-layers", "2", "--hidden-size", "32",
                                    "--num-attention-heads", "4", "--vocab-size", "99",
                                    "--make-vocab-size-divisible-by", "64"};
  std::string architecture = "GPT2LMHeadModel";
  size_t tensor_count = 4 + 2 * 12;
  SUBCASE("GPT-2") {}
  SUBCASE("Llama with grouped-query attention") {
    model.insert(model.end(), {"--position-embedding-type", "rope", "--rotary-base", "500000",
                               "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
                               "--untie-embeddings-and-output-weights", "--group-query-attention",
                               "--num-query-groups", "2"});
    architecture = "LlamaForCausalLM";
    tensor_count = 3 + 2 * 9;
  }
  bool rope_scaling = false;
  SUBCASE("Llama 3.2 with its RoPE scaling") {
    model.insert(model.end(), {"--position-embedding-type", "rope", "--rotary-base", "500000",
                               "--use-rope-scaling", "--rope-scaling-factor", "32",
                               "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
                               "--group-query-attention", "--num-query-groups", "2"});
    architecture = "LlamaForCausalLM";
    tensor_count = 2 + 2 * 9;  // tied, as Llama 3.2 1B
    rope_scaling = true;
  }
  const std::vector<std::string> data = {"--seq-length", "16", "--micro-batch-size", "2",
                                         "--global-batch-size", "2", "--lr", "1e-3",
                                         "--mock-data", "--eval-iters", "0",
                                         "--log-interval", "1", "--seed", "5"};
  auto pretrain = [&](const std::vector<std::string>& model_flags, const char* iterations,
                      const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {kPretrainGpt, "--train-iters", iterations};
    argv.insert(argv.end(), model_flags.begin(), model_flags.end());
    argv.insert(argv.end(), data.begin(), data.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    return launcher::run_and_capture(argv);
  };

  const fs::path checkpoints = temporary.path / "checkpoints";
  const auto trained = pretrain(model, "2", {"--save", checkpoints.string()});
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);

  const fs::path hf = temporary.path / "hf";
  const auto exported = launcher::run_and_capture(
      {kCheckpointUtil, "--load", checkpoints.string(), "--export-hf", hf.string()});
  INFO(exported.output);
  REQUIRE(exported.exit_code == 0);
  CHECK(exported.output.find("loading checkpoint from " + checkpoints.string() + " at iteration 2") !=
        std::string::npos);
  CHECK(exported.output.find("as " + architecture + " to " + hf.string()) != std::string::npos);
  const auto file = backend::read_safetensors(hf / "model.safetensors");
  CHECK(file.metadata.at("tokenizer_vocab_size") == "100");
  CHECK(file.tensors.size() == tensor_count);
  const auto config = nlohmann::json::parse(std::ifstream(hf / "config.json"));
  if (rope_scaling) {
    CHECK(config["rope_scaling"]["rope_type"] == "llama3");
    CHECK(config["rope_scaling"]["factor"] == 32.0);
  } else if (architecture == "LlamaForCausalLM") {
    CHECK(config.at("rope_scaling").is_null());
  } else {
    CHECK_FALSE(config.contains("rope_scaling"));
  }

  const fs::path release = temporary.path / "release_checkpoints";
  const auto imported = launcher::run_and_capture(
      {kCheckpointUtil, "--import-hf", hf.string(), "--save", release.string()});
  INFO(imported.output);
  REQUIRE(imported.exit_code == 0);
  CHECK(fs::is_regular_file(release / "release" / "mp_rank_00" / "model_optim_rng.bin"));
  std::smatch match;
  REQUIRE(std::regex_search(imported.output, match, std::regex(R"(pretrain_gpt (.*) --load)")));
  const auto printed_flags = split_words(match[1].str());
  CHECK((match[1].str().find("--use-rope-scaling --rope-scaling-factor 32") != std::string::npos) ==
        rope_scaling);

  // Start from the release checkpoint with the printed flags, and from the original
  // checkpoint with --finetune (its weights, iteration 0): the same weights, the same batch.
  const auto release_run = pretrain(printed_flags, "1", {"--load", release.string()});
  INFO(release_run.output);
  REQUIRE(release_run.exit_code == 0);
  CHECK(release_run.output.find("loading release checkpoint from") != std::string::npos);
  const auto original_run = pretrain(model, "1", {"--load", checkpoints.string(), "--finetune"});
  INFO(original_run.output);
  REQUIRE(original_run.exit_code == 0);
  CHECK(!first_loss(release_run.output).empty());
  CHECK(first_loss(release_run.output) == first_loss(original_run.output));
}

TEST_CASE("checkpoint_util: bad command lines exit 2 naming the problem") {
  test_support::TemporaryDirectory temporary;
  // A symbolic link loop used to end in "internal error: filesystem error: ... Too many levels
  // of symbolic links" (exit 3).
  const std::string loop = (temporary.path / "loop").string();
  std::filesystem::create_symlink(loop, loop);
  std::filesystem::create_directories(temporary.path / "hf");
  std::filesystem::create_symlink("config.json", temporary.path / "hf" / "config.json");
  struct Case {
    std::vector<std::string> arguments;
    std::string message;
  };
  for (const auto& [arguments, message] : std::vector<Case>{
           {{}, "nothing to do"},
           {{"--load", "x"}, "--load requires --export-hf"},
           {{"--import-hf", "x"}, "--import-hf requires --save"},
           {{"--load", "x", "--export-hf", "y", "--import-hf", "z", "--save", "w"}, "excludes"},
           {{"--frobnicate"}, "frobnicate"},
           {{"--load", (temporary.path / "none").string(), "--export-hf", "y"}, "holds no checkpoint"},
           {{"--import-hf", (temporary.path / "none").string(), "--save", "y"}, "no config.json"},
           {{"--import-hf", loop, "--save", "y"},
            "cannot read the Hugging Face model directory " + loop + ": Too many levels of symbolic links"},
           {{"--import-hf", (temporary.path / "hf").string(), "--save", "y"},
            "cannot read the Hugging Face model file " + (temporary.path / "hf" / "config.json").string() +
                ": Too many levels of symbolic links"},
           {{"--load", loop, "--export-hf", "y"}, "Too many levels of symbolic links"}}) {
    std::vector<std::string> argv = {kCheckpointUtil};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    const auto run = launcher::run_and_capture(argv);
    INFO(run.output);
    CHECK(run.exit_code == 2);
    CHECK(run.output.find(message) != std::string::npos);
  }
}
