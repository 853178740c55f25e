// evaluate_gpt, the executable: a tiny GPT trained by pretrain_gpt (on the test's LAMBADA
// passages, so that it gets some of them right and not others) is evaluated on the WikiText-
// and LAMBADA-format files of tests/data/zero_shot/, and every number is checked against
// tests/e2e/zero_shot_reference.py, an independent float64 PyTorch implementation of the same
// metrics run on the checkpoint_util --export-hf export of the same weights. The reference needs
// torch in Debian's /usr/bin/python3 (python3-torch); without it the comparison is skipped with
// a message, except when the environment variable CI is set, where that is a failure. Bad input
// exits 2 with one line naming the flag, file or line.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "launcher/process.hpp"
#include "sanitized_build.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"
#include "tests/reference_tools.hpp"
#include "tiny_lambada_checkpoint.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::tiny_lambada_model_flags;

using test_support::kTestBin;
using test_support::kTestSource;
using test_support::kTestData;
using test_support::kGpt2Vocab;
using test_support::kGpt2Merges;
using test_support::kPython;

const std::string kWiki = kTestData + "/zero_shot/wiki.test.tokens";
const std::string kLambada = kTestData + "/zero_shot/lambada_test.jsonl";

using test_support::join;

using test_support::torch_available;

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  return nlohmann::json::parse(in);
}

// The tiny model (tiny_lambada_checkpoint.hpp) and its Hugging Face export, which the PyTorch
// reference reads.
struct TrainedModel : test_support::TinyLambadaCheckpoint {
  TrainedModel() : TinyLambadaCheckpoint("evaluate_gpt") {}
  fs::path hf;
};

void train(TrainedModel& model, int iterations) {
  test_support::train_tiny_lambada_checkpoint(model, iterations);
  if (!model.ok) return;
  model.hf = model.temporary.path / "hf";
  const auto exported = launcher::run_and_capture(
      {kTestBin + "/checkpoint_util", "--load", model.checkpoints.string(), "--export-hf",
       model.hf.string()});
  model.output += exported.output;
  model.ok = exported.exit_code == 0;
}

launcher::CapturedRun evaluate(const TrainedModel& model, const std::vector<std::string>& flags) {
  return launcher::run_and_capture(
      join(join({kTestBin + "/evaluate_gpt"}, tiny_lambada_model_flags()),
           join({"--load", model.checkpoints.string(), "--micro-batch-size", "3"}, flags)));
}

nlohmann::json reference(const TrainedModel& model, const std::string& task, const std::string& file,
                         int64_t overlapping_eval, bool strict) {
  const auto run = launcher::run_and_capture(
      {kPython, kTestSource + "/tests/e2e/zero_shot_reference.py", model.hf.string(), kGpt2Vocab, kGpt2Merges,
       task, file, "64", std::to_string(overlapping_eval), strict ? "1" : "0"});
  INFO("zero_shot_reference.py output:\n" << run.output);
  REQUIRE(run.exit_code == 0);
  return nlohmann::json::parse(run.output);
}

void check_close(double ours, double theirs, const char* what) {
  CAPTURE(what);
  CAPTURE(ours);
  CAPTURE(theirs);
  CHECK(std::fabs(ours - theirs) <= 1e-5 * std::fabs(theirs));
}

}  // namespace

// release-only: most of its 75 s under the sanitizers is the PyTorch reference; evaluate_gpt
// runs sanitized in the bad-input test and the tasks' unit tests.
TEST_CASE("evaluate_gpt WIKITEXT103 and LAMBADA match an independent PyTorch reference" *
          test_support::release_only()) {
  if (!torch_available()) return;
  TrainedModel model;
  train(model, 60);
  INFO(model.output);
  REQUIRE(model.ok);

  for (const int64_t overlapping : {32, 64, 7}) {
    CAPTURE(overlapping);
    const fs::path results = model.temporary.path / ("wikitext_" + std::to_string(overlapping) + ".json");
    std::vector<std::string> flags = {"--task", "WIKITEXT103", "--valid-data", kWiki,
                                      "--results-json", results.string()};
    // 32 is the default: left out, as a Megatron command line without the flag.
    if (overlapping != 32) {
      flags.insert(flags.end(), {"--overlapping-eval", std::to_string(overlapping)});
    }
    const auto run = evaluate(model, flags);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    const std::regex line(
        R"(\n(-+)\n( validation results on WIKITEXT103 \| avg loss: \d\.\d{4}E[+-]\d\d \| ppl: \d\.\d{4}E[+-]\d\d \| adjusted ppl: \d\.\d{4}E[+-]\d\d \| token ratio: [0-9.]+ \|)\n(-+)\n)");
    std::smatch match;
    REQUIRE(std::regex_search(run.output, match, line));
    CHECK(match[1].length() == match[2].length() + 1);
    CHECK(match[3] == match[1]);
    CHECK(run.output.find(" > number of original tokens: 233, number of detokenized tokens: ") !=
          std::string::npos);
    CHECK(run.output.find("done :-)") != std::string::npos);

    const nlohmann::json ours = read_json(results);
    CHECK(ours["task"] == "WIKITEXT103");
    CHECK(ours["overlapping_eval"] == overlapping);
    REQUIRE(ours["results"].size() == 1);
    const nlohmann::json& result = ours["results"][0];
    const nlohmann::json theirs = reference(model, "WIKITEXT103", kWiki, overlapping, false);
    CHECK(result["num_original_tokens"] == theirs["num_original_tokens"]);
    CHECK(result["num_tokenized_tokens"] == theirs["num_tokenized_tokens"]);
    CHECK(result["token_ratio"].get<double>() == theirs["token_ratio"].get<double>());
    for (const char* key : {"total_loss", "avg_loss", "ppl", "adjusted_ppl"}) {
      check_close(result[key].get<double>(), theirs[key].get<double>(), key);
    }
  }

  for (const bool strict : {false, true}) {
    CAPTURE(strict);
    const fs::path results = model.temporary.path / (strict ? "strict.json" : "lambada.json");
    std::vector<std::string> flags = {"--task", "LAMBADA", "--valid-data", kLambada,
                                      "--results-json", results.string()};
    if (strict) flags.push_back("--strict-lambada");
    const auto run = evaluate(model, flags);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    const std::regex line(
        R"(\n(-+)\n( validation results on LAMBADA \| number correct: \d\.\d{4}E\+00 \| total examples: 5\.0000E\+00 \| avg accuracy: \d\.\d{4}E[+-]\d\d)\n(-+)\n)");
    std::smatch match;
    REQUIRE(std::regex_search(run.output, match, line));
    CHECK(match[1].length() == match[2].length() + 1);
    CHECK(run.output.find(" > found 5 samples.") != std::string::npos);

    const nlohmann::json result = read_json(results)["results"][0];
    const nlohmann::json theirs = reference(model, "LAMBADA", kLambada, 32, strict);
    CHECK(result["number_correct"] == theirs["number_correct"]);
    CHECK(result["total_examples"] == theirs["total_examples"]);
    check_close(result["avg_accuracy"].get<double>(), theirs["avg_accuracy"].get<double>(),
                "avg_accuracy");
    // The comparison means something only where the model gets some right and some wrong.
    CHECK(theirs["number_correct"].get<int64_t>() > 0);
    CHECK(theirs["number_correct"].get<int64_t>() < 5);
  }
}

TEST_CASE("evaluate_gpt: bad input is one line naming the flag, file or line, exit status 2") {
  TrainedModel model;
  train(model, 1);
  INFO(model.output);
  REQUIRE(model.ok);
  const fs::path directory = model.temporary.path;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(directory / name) << text;
    return (directory / name).string();
  };
  const std::string empty_wiki = write("wiki.empty.tokens", "  \n \n");
  const std::string no_text = write("lambada_bad.jsonl", "{\"text\": \"a b c\"}\n{\"passage\": \"x y\"}\n");
  const std::string long_example =
      write("lambada_long.jsonl", "{\"text\": \"one two three four five six seven eight nine ten\"}\n");
  const std::string unnamed = write("valid.txt", "a b c d e f");
  const std::string missing = (directory / "wiki.missing.tokens").string();

  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--task", "WIKITEXT103", "--valid-data", missing},
       "cannot read --valid-data " + missing + ": No such file or directory"},
      {{"--task", "WIKITEXT103", "--valid-data", directory.string()},
       "cannot read --valid-data " + directory.string() + ": it is a directory, not a file"},
      {{"--task", "WIKITEXT103", "--valid-data", empty_wiki}, "the file holds no text"},
      {{"--task", "RACE", "--valid-data", kWiki}, "--task"},
      {{"--task", "LAMBADA", "--valid-data", no_text}, "lambada_bad.jsonl line 2: no \"text\" key"},
      {{"--task", "WIKITEXT103", "--valid-data", kWiki, "--overlapping-eval", "65"},
       "--overlapping-eval 65 exceeds --seq-length 64"},
      {{"--task", "WIKITEXT103", "--valid-data", kWiki, "--overlapping-eval", "0"}, "--overlapping-eval"},
      {{"--task", "LAMBADA", "--valid-data", long_example, "--seq-length", "8"},
       "lambada_long.jsonl line 1: the example is 10 tokens, longer than --seq-length 8 + 1"},
      {{"--task", "WIKITEXT103", "--valid-data", unnamed}, "must contain 'wiki'"},
      {{"--task", "WIKITEXT103"}, "--valid-data"},
      // 3.2e12 parameters: refused before anything is allocated.
      {{"--task", "WIKITEXT103", "--valid-data", kWiki, "--num-layers", "1000", "--hidden-size",
        "16384", "--num-attention-heads", "128"},
       "evaluate_gpt: the model does not fit in this machine's memory"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    const auto run = evaluate(model, c.flags);
    INFO(run.output);
    CHECK(run.exit_code == 2);
    CHECK(run.output.find(c.message) != std::string::npos);
    CHECK(run.output.find("internal error") == std::string::npos);
  }

  // No --load, and a --load without a checkpoint.
  const auto without_load = launcher::run_and_capture(join(
      join({kTestBin + "/evaluate_gpt"}, tiny_lambada_model_flags()),
      {"--micro-batch-size", "1", "--task", "WIKITEXT103", "--valid-data", kWiki}));
  CHECK(without_load.exit_code == 2);
  CHECK(without_load.output.find("evaluate_gpt needs --load DIR") != std::string::npos);
  const auto empty_load = launcher::run_and_capture(join(
      join({kTestBin + "/evaluate_gpt"}, tiny_lambada_model_flags()),
      {"--micro-batch-size", "1", "--task", "WIKITEXT103", "--valid-data", kWiki, "--load",
       (directory / "nothing").string()}));
  CHECK(empty_load.exit_code == 2);
  CHECK(empty_load.output.find("holds no checkpoint") != std::string::npos);
  // A model that is not the checkpoint's.
  const auto wrong_model = evaluate(model, {"--task", "WIKITEXT103", "--valid-data", kWiki,
                                            "--hidden-size", "64"});
  CHECK(wrong_model.exit_code == 2);
  CHECK(wrong_model.output.find("hidden") != std::string::npos);
}
