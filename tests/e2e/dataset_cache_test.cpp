// The dataset index cache under concurrency, with the real executables: a blend that names one
// prefix twice on a cold cache (several builder threads of one process once raced on one cache
// file and failed), and two pretrain_gpt processes building the same cold cache at the same
// moment. Every run must succeed, print the same losses, and leave only finished cache files.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/process.hpp"
#include "spawned_process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::read_file;
using test_support::wait_for_exit;

// A NullTokenizer corpus large enough that building its indices takes a while.
std::string make_dataset(const fs::path& directory) {
  {
    std::ofstream out(directory / "corpus.jsonl");
    for (int d = 0; d < 20000; ++d) {
      out << "{\"text\": \"";
      for (int i = 0; i < 5 + d % 23; ++i) out << (i ? " " : "") << (d * 13 + i) % 500;
      out << "\"}\n";
    }
  }
  const auto preprocess = launcher::run_and_capture(
      {std::string(TEST_BIN_DIR) + "/preprocess_data", "--input", (directory / "corpus.jsonl").string(),
       "--output-prefix", (directory / "corpus").string(), "--tokenizer-type", "NullTokenizer",
       "--vocab-size", "500", "--append-eod"});
  INFO(preprocess.output);
  REQUIRE(preprocess.exit_code == 0);
  return (directory / "corpus_text_document").string();
}

std::vector<std::string> training_command(const std::vector<std::string>& data_path, int builder_threads) {
  std::vector<std::string> argv = {
      std::string(TEST_BIN_DIR) + "/pretrain_gpt", "--num-layers", "1", "--hidden-size", "32",
      "--num-attention-heads", "2", "--seq-length", "16", "--micro-batch-size", "2",
      "--global-batch-size", "2", "--train-iters", "3", "--lr", "1e-3", "--eval-iters", "1",
      "--eval-interval", "1000", "--split", "90,8,2", "--tokenizer-type", "NullTokenizer",
      "--vocab-size", "500", "--log-interval", "1"};
  argv.insert(argv.end(), {"--num-dataset-builder-threads", std::to_string(builder_threads), "--data-path"});
  argv.insert(argv.end(), data_path.begin(), data_path.end());
  return argv;
}

std::vector<std::string> losses(const std::string& log) {
  static const std::regex loss(R"(\| lm loss: ([0-9.E+-]+) \|)");
  std::vector<std::string> found;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), loss); it != std::sregex_iterator(); ++it) {
    found.push_back((*it)[1]);
  }
  return found;
}

void check_no_temporaries(const fs::path& directory) {
  for (const auto& entry : fs::recursive_directory_iterator(directory)) {
    CHECK_MESSAGE(entry.path().filename().string().find(".tmp") == std::string::npos, entry.path());
  }
}

}  // namespace

TEST_CASE("a blend naming one prefix twice trains on a cold cache with several builder threads") {
  test_support::TemporaryDirectory work;
  const std::string prefix = make_dataset(work.path);
  std::vector<std::string> reference;
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    fs::remove_all(prefix);  // the cache directory Megatron puts next to the dataset
    const auto run = launcher::run_and_capture(training_command({"0.5", prefix, "0.5", prefix}, 4));
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    const auto run_losses = losses(run.output);
    CHECK(run_losses.size() == 3);
    if (round == 0) reference = run_losses;
    CHECK(run_losses == reference);
    check_no_temporaries(work.path);
  }
}

TEST_CASE("two pretrain_gpt processes building the same cold cache at once both succeed") {
  test_support::TemporaryDirectory work;
  const std::string prefix = make_dataset(work.path);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    fs::remove_all(prefix);
    const auto command = training_command({prefix}, 2);
    const pid_t first = test_support::spawn_process(command, work.path / "first.log");
    const pid_t second = test_support::spawn_process(command, work.path / "second.log");
    const int first_status = wait_for_exit(first), second_status = wait_for_exit(second);
    const std::string first_log = read_file(work.path / "first.log");
    const std::string second_log = read_file(work.path / "second.log");
    INFO(first_log);
    INFO(second_log);
    CHECK(first_status == 0);
    CHECK(second_status == 0);
    CHECK(losses(first_log).size() == 3);
    CHECK(losses(first_log) == losses(second_log));
    check_no_temporaries(work.path);
  }
}
