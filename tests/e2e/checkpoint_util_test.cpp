// checkpoint_util, the executable: a pretrain_gpt run's checkpoint is exported to Hugging Face,
// imported back as a release checkpoint, and pretrain_gpt started from it with the flags
// checkpoint_util prints computes the same first loss as a run resumed from the original
// weights would (both forward the same weights on the same batch); bad command lines exit 2
// with one line naming the problem.
#include <doctest/doctest.h>

#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "backend/ckpt/safetensors.hpp"
#include "launcher/process.hpp"
#include "temporary_directory.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kPretrain = std::string(TEST_BIN_DIR) + "/pretrain_gpt";
const std::string kCheckpointUtil = std::string(TEST_BIN_DIR) + "/checkpoint_util";

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
  const fs::path checkpoints = temporary.path / "checkpoints";
  const std::vector<std::string> data_flags = {"--seq-length", "16", "--micro-batch-size", "2",
                                               "--global-batch-size", "2", "--lr", "1e-3",
                                               "--mock-data", "--eval-iters", "0",
                                               "--log-interval", "1", "--seed", "5"};
  std::vector<std::string> train = {kPretrain, "--num-layers", "2", "--hidden-size", "32",
                                    "--num-attention-heads", "4", "--vocab-size", "99",
                                    "--make-vocab-size-divisible-by", "64", "--train-iters", "2",
                                    "--save", checkpoints.string()};
  train.insert(train.end(), data_flags.begin(), data_flags.end());
  const auto trained = launcher::run_and_capture(train);
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);

  const fs::path hf = temporary.path / "hf";
  const auto exported = launcher::run_and_capture(
      {kCheckpointUtil, "--load", checkpoints.string(), "--export-hf", hf.string()});
  INFO(exported.output);
  REQUIRE(exported.exit_code == 0);
  CHECK(exported.output.find("loading checkpoint from " + checkpoints.string() + " at iteration 2") !=
        std::string::npos);
  CHECK(exported.output.find("as GPT2LMHeadModel to " + hf.string()) != std::string::npos);
  const auto file = backend::read_safetensors(hf / "model.safetensors");
  CHECK(file.metadata.at("tokenizer_vocab_size") == "100");
  CHECK(file.tensors.size() == 4 + 2 * 12);

  const fs::path release = temporary.path / "release_checkpoints";
  const auto imported = launcher::run_and_capture(
      {kCheckpointUtil, "--import-hf", hf.string(), "--save", release.string()});
  INFO(imported.output);
  REQUIRE(imported.exit_code == 0);
  CHECK(fs::is_regular_file(release / "release" / "mp_rank_00" / "model_optim_rng.bin"));
  std::smatch match;
  REQUIRE(std::regex_search(imported.output, match, std::regex(R"(pretrain_gpt (.*) --load)")));
  const auto model_flags = split_words(match[1].str());

  // Start from the release checkpoint with the printed flags, and from the original
  // checkpoint with --finetune (its weights, iteration 0): the same weights, the same batch.
  std::vector<std::string> from_release = {kPretrain, "--train-iters", "1", "--load", release.string()};
  from_release.insert(from_release.end(), model_flags.begin(), model_flags.end());
  from_release.insert(from_release.end(), data_flags.begin(), data_flags.end());
  const auto release_run = launcher::run_and_capture(from_release);
  INFO(release_run.output);
  REQUIRE(release_run.exit_code == 0);
  CHECK(release_run.output.find("loading release checkpoint from") != std::string::npos);

  std::vector<std::string> from_original = train;
  from_original.erase(from_original.begin() + 13, from_original.begin() + 15);  // --save DIR
  from_original[12] = "1";                                                       // --train-iters
  from_original.insert(from_original.end(), {"--load", checkpoints.string(), "--finetune"});
  const auto original_run = launcher::run_and_capture(from_original);
  INFO(original_run.output);
  REQUIRE(original_run.exit_code == 0);
  CHECK(!first_loss(release_run.output).empty());
  CHECK(first_loss(release_run.output) == first_loss(original_run.output));
}

TEST_CASE("checkpoint_util: bad command lines exit 2 naming the problem") {
  test_support::TemporaryDirectory temporary;
  struct Case {
    std::vector<std::string> arguments;
    const char* message;
  };
  for (const auto& [arguments, message] : std::vector<Case>{
           {{}, "nothing to do"},
           {{"--load", "x"}, "--load requires --export-hf"},
           {{"--import-hf", "x"}, "--import-hf requires --save"},
           {{"--load", "x", "--export-hf", "y", "--import-hf", "z", "--save", "w"}, "excludes"},
           {{"--frobnicate"}, "frobnicate"},
           {{"--load", (temporary.path / "none").string(), "--export-hf", "y"}, "holds no checkpoint"},
           {{"--import-hf", (temporary.path / "none").string(), "--save", "y"}, "no config.json"}}) {
    std::vector<std::string> argv = {kCheckpointUtil};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    const auto run = launcher::run_and_capture(argv);
    INFO(run.output);
    CHECK(run.exit_code == 2);
    CHECK(run.output.find(message) != std::string::npos);
  }
}
