// Values a hostile user types, run through the real executables (issue 9, items 4, 6, 13-15):
// every one ends in exit status 2 with one message naming the flag or key and what is valid,
// never in a signal, an internal error (exit 3), a hang (each run is bounded by `timeout`,
// whose 124 fails the check) or a silently queued job; and the shipped configs that need
// features the backend has not built yet (tensor parallelism) still render.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "bounded_run.hpp"
#include "launcher/process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::run_bounded;
using test_support::check_refused;

using test_support::kPretrainGpt;
using test_support::kLauncher;
using test_support::kCheckpointUtil;

std::vector<std::string> tiny_model() {
  return {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
          "--seq-length", "32", "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "10",
          "--vocab-size", "100", "--eval-iters", "0"};
}

// tiny_model() with `flag`'s value replaced (or the flag added), plus `extra`.
std::vector<std::string> pretrain_with(const std::vector<std::string>& replace,
                                       std::vector<std::string> extra = {"--mock-data"}) {
  std::vector<std::string> argv = {kPretrainGpt};
  std::vector<std::string> model = tiny_model();
  for (size_t i = 0; i + 1 < replace.size(); i += 2) {
    const auto at = std::find(model.begin(), model.end(), replace[i]);
    if (at != model.end()) {
      *(at + 1) = replace[i + 1];
    } else {
      model.insert(model.end(), {replace[i], replace[i + 1]});
    }
  }
  argv.insert(argv.end(), model.begin(), model.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

}  // namespace

TEST_CASE("pretrain_gpt refuses values that are not numbers, not finite, or out of range") {
  struct Case {
    std::vector<std::string> replace;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--lr", "abc"}, "--lr: 'abc' is not a number; --lr takes a real number ≥ 0"},
      {{"--lr", "inf"}, "--lr: 'inf' is not a finite number"},
      {{"--lr", "nan"}, "--lr: 'nan' is not a finite number"},
      {{"--clip-grad", "inf"}, "--clip-grad: 'inf' is not a finite number"},
      {{"--global-batch-size", "-4"}, "'-4' is out of range; --global-batch-size takes an integer ≥ 1"},
      {{"--global-batch-size", "0"}, "'0' is out of range; --global-batch-size takes an integer ≥ 1"},
      {{"--max-position-embeddings", "0"}, "'0' is out of range; --max-position-embeddings takes"},
      {{"--ffn-hidden-size", "0"}, "'0' is out of range; --ffn-hidden-size takes"},
      {{"--train-iters", "-5"}, "'-5' is out of range; --train-iters takes an integer ≥ 1"},
      {{"--hidden-dropout", "2"}, "'2' is out of range; --hidden-dropout takes a real number in [0, 1)"},
      {{"--seed", "-1"}, "'-1' is out of range; --seed takes an integer in [1, 4294967295]"},
      {{"--seed", "99999999999999999999"}, "--seed: '99999999999999999999' is larger than any integer"},
      {{"--num-layers", "99999999999999999999"},
       "--num-layers: '99999999999999999999' is larger than any integer"},
      {{"--vocab-size", "4611686018427387904"}, "'4611686018427387904' is out of range; --vocab-size"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    check_refused(run_bounded(pretrain_with(c.replace)), c.message);
  }
}

TEST_CASE("pretrain_gpt refuses sizes whose products overflow or whose model cannot fit") {
  struct Case {
    std::vector<std::string> replace;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--ffn-hidden-size", "9223372036854775807"}, "exceeds 9223372036854775807"},
      {{"--hidden-size", "2305843009213693952"}, "--ffn-hidden-size (default 4 × --hidden-size)"},
      {{"--hidden-size", "4611686018427387904"}, "exceeds 9223372036854775807"},
      {{"--make-vocab-size-divisible-by", "9223372036854775807"}, "padded vocabulary"},
      {{"--seq-length", "9223372036854775807"}, "exceeds 9223372036854775807"},
      {{"--train-iters", "9223372036854775807"},
       "--train-iters × --global-batch-size (the samples the run trains on): 9223372036854775807 × 2"},
      {{"--global-batch-size", "9223372036854775806"}, "exceeds 9223372036854775807"},
      {{"--global-batch-size", "9223372036854775806", "--train-iters", "1"},
       "exceeds 9223372036854775807"},
      {{"--num-layers", "1000000000000"}, "does not fit in this machine's memory"},
      {{"--hidden-size", "1048576", "--num-attention-heads", "1024"},
       "does not fit in this machine's memory"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    check_refused(run_bounded(pretrain_with(c.replace)), c.message);
  }
  // The refusal shows the estimate it is based on.
  const auto huge = run_bounded(pretrain_with({"--num-layers", "1000000000000"}));
  CHECK(huge.output.find("optimizer states") != std::string::npos);
}

TEST_CASE("pretrain_gpt validates a batch-size ramp-up of any length at once") {
  // tiny_model() trained for samples instead of iterations.
  auto sample_based = [](const std::string& global_batch_size, std::vector<std::string> flags) {
    auto argv = pretrain_with({"--global-batch-size", global_batch_size});
    const auto iterations = std::find(argv.begin(), argv.end(), "--train-iters");
    argv.erase(iterations, iterations + 2);
    argv.insert(argv.end(), flags.begin(), flags.end());
    return argv;
  };
  // 2^60 iterations of ramp-up: walked one iteration at a time, validation would not end. Its
  // tokens then overflow the counters: refused, after the walk.
  check_refused(run_bounded(sample_based("4", {"--train-samples", "4611686018427387904",
                                               "--rampup-batch-size", "2", "2",
                                               "2305843009213693952"})),
                "the samples the run trains on × --seq-length (its tokens)");
  // More increments than the walk takes steps for.
  check_refused(run_bounded(sample_based("2000004", {"--train-samples", "100",
                                                     "--rampup-batch-size", "2", "2", "100"})),
                "1000001 increments from the start batch size to --global-batch-size 2000004; "
                "at most 1000000 are supported");
}

TEST_CASE("pretrain_gpt's messages name what is wrong") {
  // A value left out: the flag after it is named, not a word further on.
  std::vector<std::string> missing_value = {kPretrainGpt, "--num-layers", "--hidden-size", "64"};
  const auto model = tiny_model();
  missing_value.insert(missing_value.end(), model.begin() + 4, model.end());
  missing_value.push_back("--mock-data");
  check_refused(run_bounded(missing_value),
                "--num-layers needs a value, but the next argument is the flag --hidden-size");

  // --split: Megatron's regex reads -1 as 1 and skips nan; refused here by name.
  check_refused(run_bounded(pretrain_with({}, {"--data-path", "x", "--split", "-1,2,3"})),
                "--split: '-1,2,3': '-1' is negative");
  check_refused(run_bounded(pretrain_with({}, {"--data-path", "x", "--split", "nan,1,1"})),
                "'nan' is not a finite number");

  // A vocabulary file that is not there, or not a file, is named as such, not as invalid JSON.
  test_support::TemporaryDirectory temporary;
  auto with_files = [&](const std::string& vocab, const std::string& merges) {
    return run_bounded(pretrain_with({"--vocab-size", "1"},
                                     {"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab,
                                      "--merge-file", merges, "--data-path", "x", "--split", "1,0,0"}));
  };
  const std::string missing = (temporary.path / "nonexistent.json").string();
  const std::string merges = (temporary.path / "nonexistent-merges.txt").string();
  check_refused(with_files(missing, merges),
                "cannot read --vocab-file " + missing + ": No such file or directory");
  const auto directory = with_files(temporary.path.string(), merges);
  check_refused(directory, "cannot read --vocab-file " + temporary.path.string() +
                               ": it is a directory, not a file");
  CHECK(directory.output.find("not valid JSON") == std::string::npos);
  const std::string vocab = std::string(TEST_SOURCE_DIR) + "/tests/data/gpt2-vocab.json";
  check_refused(with_files(vocab, merges),
                "cannot read --merge-file " + merges + ": No such file or directory");
  check_refused(with_files(vocab, temporary.path.string()), "it is a directory, not a file");
}

TEST_CASE("launcher --dry-run refuses a bad mapped value before queueing, naming key and flag") {
  test_support::TemporaryDirectory temporary;
  struct Case {
    std::string override_;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"training.model.optim.lr=abc",
       "training.model.optim.lr: 'abc' is not a number; training.model.optim.lr (--lr) takes a "
       "real number ≥ 0"},
      {"training.model.global_batch_size=-4",
       "training.model.global_batch_size: '-4' is out of range; training.model.global_batch_size "
       "(--global-batch-size) takes an integer ≥ 1"},
      {"training.trainer.max_steps=-5",
       "training.trainer.max_steps: '-5' is out of range; training.trainer.max_steps (--train-iters)"},
      {"training.model.hidden_dropout=2", "training.model.hidden_dropout: '2' is out of range"},
      {"training.model.make_vocab_size_divisible_by=0",
       "training.model.make_vocab_size_divisible_by: '0' is out of range"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.override_);
    const auto run = run_bounded({kLauncher, "main", "training=gpt3/126m",
                                  "base_results_dir=" + temporary.path.string(), c.override_,
                                  "--dry-run"});
    check_refused(run, c.message);
    CHECK(fs::is_empty(temporary.path));  // nothing written
  }
  // Configs that need what pretrain_gpt has not built yet (tp 2) still render.
  const auto tp2 = run_bounded({kLauncher, "main", "training=gpt3/5b", "cluster_type=bcm",
                                "base_results_dir=" + temporary.path.string(), "--dry-run"});
  INFO(tp2.output);
  CHECK(tp2.exit_code == 0);
}

TEST_CASE("checkpoint_util --import-hf refuses a config.json whose model cannot be built") {
  test_support::TemporaryDirectory temporary;
  auto import_with = [&](const std::string& key, const std::string& value) {
    const fs::path directory = temporary.path / ("hf_" + key + value.substr(0, 4));
    fs::create_directories(directory);
    std::map<std::string, std::string> config = {{"n_layer", "1"},     {"n_embd", "16"},
                                                 {"n_head", "2"},      {"n_positions", "8"},
                                                 {"vocab_size", "128"}};
    config[key] = value;
    std::string json = R"({"model_type": "gpt2")";
    for (const auto& [name, number] : config) json += ", \"" + name + "\": " + number;
    std::ofstream(directory / "config.json") << json << "}";
    // No tensors at all: the config must be refused before they are looked for.
    std::ofstream(directory / "model.safetensors") << "not read";
    return run_bounded({kCheckpointUtil, "--import-hf", directory.string(), "--save",
                        (temporary.path / "out").string()});
  };
  check_refused(import_with("n_layer", "1000000000000"), "does not fit in this machine's memory");
  check_refused(import_with("vocab_size", "1000000000000000"), "does not fit in this machine's memory");
  check_refused(import_with("n_embd", "4611686018427387904"), "exceeds 9223372036854775807");
}
