// A NeMo run's .nemo continued here and taken back, end to end: write_nemo_archives.py saves a
// GPT as NeMo 1.x does (GPT2BPETokenizer's files packed in); checkpoint_util --import-nemo
// makes a release checkpoint of it and prints the pretrain_gpt flags (the model's, and
// --vocab-file / --merge-file naming the extracted files); pretrain_gpt trains two iterations
// from it with exactly those flags; checkpoint_util --export-nemo writes the trained run's
// megatron_gpt.nemo, which NeMo's tools read (read_nemo_archive.py: tarfile, OmegaConf,
// torch.load) with NeMo's state-dict names and the trained weights, and which imports again.
// Needs torch, yaml and omegaconf in Debian's /usr/bin/python3; skipped without them except
// under CI.
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/process.hpp"
#include "sanitized_build.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"
#include "tests/reference_tools.hpp"

namespace {

namespace fs = std::filesystem;
using test_support::kCheckpointUtil;
using test_support::kPretrainGpt;

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

}  // namespace

TEST_CASE("a NeMo .nemo is imported, trained here and exported as NeMo reads it" *
          test_support::release_only()) {
  if (!test_support::python_imports("torch, yaml, omegaconf",
                                    "python3-torch python3-yaml python3-omegaconf")) {
    return;
  }
  test_support::TemporaryDirectory temporary;
  const auto written = test_support::run_command(
      std::string(test_support::kPython) + " " + test_support::kTestSource +
      "/tests/backend/ckpt/write_nemo_archives.py " + temporary.path.string());
  REQUIRE_MESSAGE(written.exit_status == 0, written.output);

  const fs::path imported = temporary.path / "imported";
  const auto import = launcher::run_and_capture(
      {kCheckpointUtil, "--import-nemo", (temporary.path / "gpt.nemo").string(), "--save",
       imported.string()});
  INFO(import.output);
  REQUIRE(import.exit_code == 0);
  CHECK(fs::is_regular_file(imported / "release" / "mp_rank_00" / "model_optim_rng.bin"));
  CHECK(fs::is_regular_file(imported / "nemo_tokenizer" / "vocab.json"));
  std::smatch match;
  REQUIRE(std::regex_search(import.output, match, std::regex(R"(pretrain_gpt (.*) --load)")));
  const std::vector<std::string> flags = split_words(match[1].str());
  CHECK(match[1].str().find("--tokenizer-type GPT2BPETokenizer") != std::string::npos);
  CHECK(match[1].str().find("--vocab-file " + (imported / "nemo_tokenizer" / "vocab.json").string()) !=
        std::string::npos);

  // Two iterations from the imported weights, with the printed flags.
  const fs::path trained = temporary.path / "trained";
  std::vector<std::string> run = {kPretrainGpt};
  run.insert(run.end(), flags.begin(), flags.end());
  run.insert(run.end(), {"--seq-length", "8", "--micro-batch-size", "2", "--global-batch-size",
                         "2", "--lr", "1e-3", "--mock-data", "--train-iters", "2", "--eval-iters",
                         "0", "--log-interval", "1", "--load", imported.string(), "--save",
                         trained.string()});
  const auto training = launcher::run_and_capture(run);
  INFO(training.output);
  REQUIRE(training.exit_code == 0);
  CHECK(training.output.find("loading release checkpoint from " + imported.string()) !=
        std::string::npos);
  CHECK(training.output.find("iteration        2/       2") != std::string::npos);
  CHECK(training.output.find("lm loss: nan") == std::string::npos);

  // The launcher's conversion stage's file: NeMo reads it, with the trained weights.
  const fs::path exported = temporary.path / "results" / "megatron_gpt.nemo";
  fs::create_directories(exported.parent_path());
  const auto exporting = launcher::run_and_capture(
      {kCheckpointUtil, "--load", trained.string(), "--export-nemo", exported.string()});
  INFO(exporting.output);
  REQUIRE(exporting.exit_code == 0);
  CHECK(exporting.output.find("exported") != std::string::npos);
  auto read = [&](const fs::path& archive) {
    const auto result = test_support::run_command(
        std::string(test_support::kPython) + " " + test_support::kTestSource +
        "/tests/backend/ckpt/read_nemo_archive.py " + archive.string() + " " +
        test_support::kTestSource + "/tests/data/nemo_23.08.02/conf/training/gpt3/126m.yaml");
    REQUIRE_MESSAGE(result.exit_status == 0, result.output);
    return nlohmann::json::parse(result.output);
  };
  const nlohmann::json theirs = read(exported);
  const nlohmann::json original = read(temporary.path / "gpt.nemo");
  CHECK(theirs["config"]["tokenizer"]["type"] == "GPT2BPETokenizer");
  CHECK(theirs["config"]["num_layers"] == 2);
  REQUIRE(theirs["weights"].size() == original["weights"].size());
  size_t changed = 0;
  for (size_t i = 0; i < original["weights"].size(); ++i) {
    CHECK(theirs["weights"][i][0] == original["weights"][i][0]);
    CHECK(theirs["weights"][i][1]["shape"] == original["weights"][i][1]["shape"]);
    if (theirs["weights"][i][1]["values"] != original["weights"][i][1]["values"]) ++changed;
  }
  CHECK(changed == original["weights"].size());  // every tensor trained

  const auto again = launcher::run_and_capture({kCheckpointUtil, "--import-nemo",
                                                exported.string(), "--save",
                                                (temporary.path / "again").string()});
  INFO(again.output);
  CHECK(again.exit_code == 0);
}
