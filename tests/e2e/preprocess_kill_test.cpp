// Crash safety of preprocess_data's output pair, with real processes: a run that replaces an
// existing P.bin/P.idx is killed with SIGKILL at each step of publishing the pair (through the
// MEGATRON_NATIVE_CRASH_AT hook, backend/common/durable_file.hpp) and at random moments. Each
// time, what a reader finds under P must be the old pair, the new pair, or nothing it accepts
// (the .idx absent), never a new .bin beside the old .idx; the next run must finish the job
// and remove or report what the killed one left. A mismatched pair made by hand is refused by
// pretrain_gpt, naming both files. Two runs writing one prefix at once: the second is refused.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/indexed_dataset.hpp"
#include "launcher/process.hpp"
#include "sanitized_build.hpp"
#include "spawned_process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::read_file;
using test_support::wait_for_exit;

// Starts argv with `crash_at` in MEGATRON_NATIVE_CRASH_AT (none when empty), output to `log`.
pid_t spawn(const std::vector<std::string>& argv, const fs::path& log, const std::string& crash_at) {
  return test_support::spawn_process(
      argv, log, {crash_at.empty() ? "MEGATRON_NATIVE_CRASH_AT" : "MEGATRON_NATIVE_CRASH_AT=" + crash_at});
}

// `documents` lines of NullTokenizer ids; `shift` changes the ids, not the lengths.
void write_corpus(const fs::path& path, int documents, int shift) {
  std::ofstream out(path);
  for (int d = 0; d < documents; ++d) {
    out << "{\"text\": \"";
    for (int i = 0; i < 20 + d % 17; ++i) out << (i ? " " : "") << (d * 7 + i + shift) % 1000;
    out << "\"}\n";
  }
}

std::vector<std::string> preprocess_command(const fs::path& input, const fs::path& prefix) {
  return {std::string(TEST_BIN_DIR) + "/preprocess_data", "--input", input.string(),
          "--output-prefix", prefix.string(), "--tokenizer-type", "NullTokenizer",
          "--vocab-size", "1000", "--workers", "1", "--log-interval", "1000000"};
}

struct Pair {
  std::string bin, idx;
};

Pair read_pair(const fs::path& prefix) {
  return {read_file(prefix.string() + ".bin"), read_file(prefix.string() + ".idx")};
}

std::vector<std::string> leftovers(const fs::path& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp-") != std::string::npos || name.ends_with(".lock")) names.push_back(name);
  }
  return names;
}

// What a reader finds under `prefix` after a kill: the old pair, the new pair, or a pair the
// reader refuses because the .idx is missing. Anything else fails the test.
std::string check_pair_state(const fs::path& prefix, const Pair& old_pair, const Pair& new_pair) {
  const bool has_bin = fs::exists(prefix.string() + ".bin");
  const bool has_idx = fs::exists(prefix.string() + ".idx");
  if (!has_idx) {
    CHECK_THROWS_AS(backend::IndexedDataset(prefix.string()), common::Error);
    return "absent";
  }
  REQUIRE_MESSAGE(has_bin, "an .idx without its .bin");
  const Pair pair = read_pair(prefix);
  const bool is_old = pair.bin == old_pair.bin && pair.idx == old_pair.idx;
  const bool is_new = pair.bin == new_pair.bin && pair.idx == new_pair.idx;
  CHECK_MESSAGE((is_old || is_new),
                "a mixed pair: .bin " << (pair.bin == new_pair.bin ? "new" : "old") << ", .idx "
                                      << (pair.idx == new_pair.idx ? "new" : "old"));
  return is_new ? "new" : "old";
}

}  // namespace

TEST_CASE("preprocess_data killed while publishing its outputs leaves the old pair, the new pair, or none") {
  test_support::TemporaryDirectory work;
  write_corpus(work.path / "old.jsonl", 300, 0);
  // A larger corpus, and one of exactly the old sizes with other ids: a reader that only
  // compared sizes would take its .bin beside the old .idx.
  write_corpus(work.path / "larger.jsonl", 500, 1);
  write_corpus(work.path / "same_size.jsonl", 300, 3);
  fs::create_directories(work.path / "reference");
  const fs::path output = work.path / "out";
  fs::create_directories(output);
  const fs::path prefix = output / "data_text_document";

  const auto run = [&](const fs::path& input, const fs::path& output_prefix, const std::string& crash_at) {
    return wait_for_exit(spawn(preprocess_command(input, output_prefix), work.path / "log.txt", crash_at));
  };
  REQUIRE(run(work.path / "old.jsonl", work.path / "reference/old", "") == 0);
  const Pair old_pair = read_pair(work.path / "reference/old_text_document");

  for (const char* corpus : {"larger", "same_size"}) {
    const fs::path input = work.path / (std::string(corpus) + ".jsonl");
    REQUIRE(run(input, work.path / "reference" / corpus, "") == 0);
    const Pair new_pair = read_pair(work.path / "reference" / (std::string(corpus) + "_text_document"));
    REQUIRE(new_pair.bin.size() != 0);
    if (std::string(corpus) == "same_size") REQUIRE(new_pair.bin.size() == old_pair.bin.size());

    for (const char* point : {"indexed-dataset:written", "indexed-dataset:index-removed",
                              "indexed-dataset:data-renamed", "indexed-dataset:index-renamed"}) {
      CAPTURE(corpus);
      CAPTURE(point);
      fs::remove_all(output);
      REQUIRE(run(work.path / "old.jsonl", output / "data", "") == 0);
      REQUIRE(read_pair(prefix).idx == old_pair.idx);
      CHECK(run(input, output / "data", point) == 128 + SIGKILL);
      check_pair_state(prefix, old_pair, new_pair);

      // The next run publishes the new pair and removes what the killed one left, saying so.
      REQUIRE(run(input, output / "data", "") == 0);
      const std::string log = read_file(work.path / "log.txt");
      CHECK(read_pair(prefix).bin == new_pair.bin);
      CHECK(read_pair(prefix).idx == new_pair.idx);
      CHECK(leftovers(output).empty());
      if (std::string(point) != "indexed-dataset:index-renamed") {
        CHECK(log.find("left by an interrupted run") != std::string::npos);
      }
    }
  }
}

TEST_CASE("preprocess_data SIGKILLed at random moments never leaves a mixed pair" *
          test_support::release_only()) {
  test_support::TemporaryDirectory work;
  write_corpus(work.path / "old.jsonl", 3000, 0);
  write_corpus(work.path / "new.jsonl", 6000, 1);
  const fs::path output = work.path / "out";
  const fs::path prefix = output / "data_text_document";
  const auto command = [&](const char* corpus, const fs::path& output_prefix) {
    return preprocess_command(work.path / corpus, output_prefix);
  };
  REQUIRE(launcher::run_and_capture(command("old.jsonl", work.path / "old")).exit_code == 0);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(launcher::run_and_capture(command("new.jsonl", work.path / "new")).exit_code == 0);
  const double full_run = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Pair old_pair = read_pair(work.path / "old_text_document");
  const Pair new_pair = read_pair(work.path / "new_text_document");

  std::mt19937 random(12345);
  std::uniform_real_distribution<double> delay(0.0, 1.2 * full_run);
  int killed = 0;
  for (int attempt = 0; attempt < 25; ++attempt) {
    fs::remove_all(output);
    fs::create_directories(output);
    fs::copy_file(work.path / "old_text_document.bin", prefix.string() + ".bin");
    fs::copy_file(work.path / "old_text_document.idx", prefix.string() + ".idx");
    const pid_t pid = spawn(command("new.jsonl", output / "data"), work.path / "log.txt", "");
    std::this_thread::sleep_for(std::chrono::duration<double>(delay(random)));
    ::kill(pid, SIGKILL);
    if (wait_for_exit(pid) == 128 + SIGKILL) ++killed;
    check_pair_state(prefix, old_pair, new_pair);
    REQUIRE(launcher::run_and_capture(command("new.jsonl", output / "data")).exit_code == 0);
    CHECK(read_pair(prefix).idx == new_pair.idx);
    CHECK(leftovers(output).empty());
  }
  CHECK(killed > 0);
}

TEST_CASE("pretrain_gpt refuses a .bin and an .idx that are not one pair, naming both") {
  test_support::TemporaryDirectory work;
  write_corpus(work.path / "a.jsonl", 300, 0);
  write_corpus(work.path / "b.jsonl", 500, 1);
  REQUIRE(launcher::run_and_capture(preprocess_command(work.path / "a.jsonl", work.path / "a")).exit_code == 0);
  REQUIRE(launcher::run_and_capture(preprocess_command(work.path / "b.jsonl", work.path / "b")).exit_code == 0);
  // The state a kill between the two renames used to leave: the new .bin, the old .idx.
  fs::copy_file(work.path / "b_text_document.bin", work.path / "mixed.bin");
  fs::copy_file(work.path / "a_text_document.idx", work.path / "mixed.idx");
  const std::string prefix = (work.path / "mixed").string();
  const auto train = launcher::run_and_capture(
      {std::string(TEST_BIN_DIR) + "/pretrain_gpt", "--num-layers", "1", "--hidden-size", "32",
       "--num-attention-heads", "2", "--seq-length", "16", "--micro-batch-size", "2",
       "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-3", "--data-path", prefix,
       "--split", "100,0,0", "--eval-iters", "0", "--tokenizer-type", "NullTokenizer",
       "--vocab-size", "1000"});
  INFO(train.output);
  CHECK(train.exit_code == 2);
  CHECK(train.output.find(prefix + ".bin") != std::string::npos);
  CHECK(train.output.find(prefix + ".idx") != std::string::npos);
  CHECK(train.output.find("not one pair") != std::string::npos);
}

TEST_CASE("a second preprocess_data writing the same prefix while the first runs is refused") {
  test_support::TemporaryDirectory work;
  write_corpus(work.path / "a.jsonl", 50, 0);
  // The first writer: this test process, holding the prefix as a running preprocess_data does.
  const std::string prefix = (work.path / "out_text_document").string();
  auto first = std::make_unique<backend::IndexedDatasetWriter>(prefix, backend::DType::uint16);
  const auto second = launcher::run_and_capture(preprocess_command(work.path / "a.jsonl", work.path / "out"));
  INFO(second.output);
  CHECK(second.exit_code == 2);
  CHECK(second.output.find("another process (pid " + std::to_string(::getpid()) + " on ") !=
        std::string::npos);
  CHECK(second.output.find(prefix + ".lock") != std::string::npos);
  first->add_document(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{3});
  first->finalize();
  first.reset();
  CHECK(backend::IndexedDataset(prefix).document_count() == 1);  // the first's data, whole
  // Once the first is done, the same command runs.
  CHECK(launcher::run_and_capture(preprocess_command(work.path / "a.jsonl", work.path / "out")).exit_code == 0);
  CHECK(backend::IndexedDataset(prefix).document_count() == 50);
}
