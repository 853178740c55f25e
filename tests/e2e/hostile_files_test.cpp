// Files a hostile user names, run through the real executables (issue 9): /dev/zero, a FIFO
// with no writer, and a sparse 100 GB file in the place of every file a tool reads whole
// (tokenizer files, data lists, per-split JSON, checkpoint tracker, Hugging Face config.json,
// safetensors, the launcher's config files, job records and benchmark reports), and FIFOs in
// the place of files a tool maps (.idx). Each ends in exit status 2 with a message naming the
// flag or the file's role, the path and why, never in bad_alloc (exit 3), a signal, or a wait
// for a writer that never comes (each run is bounded by `timeout`, whose 124 fails the check).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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

using test_support::kTestBin;
using test_support::kGpt2Vocab;
using test_support::kGpt2Merges;

// The three hostile files, made in `directory`.
struct HostileFiles {
  std::string fifo, sparse;
  explicit HostileFiles(const fs::path& directory)
      : fifo((directory / "fifo").string()), sparse((directory / "sparse").string()) {
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    std::ofstream{sparse};
    REQUIRE(::truncate(sparse.c_str(), 100LL << 30) == 0);
  }
};
const std::string kCharacterDevice = "it is a character device, not a regular file";
const std::string kFifo = "it is a FIFO (named pipe), not a regular file";
const std::string kTooLarge =
    "it is 107374182400 bytes, more than the 268435456 bytes (256 MiB) a file read whole may have";

std::vector<std::string> pretrain(std::vector<std::string> extra) {
  std::vector<std::string> argv = {kTestBin + "/pretrain_gpt", "--num-layers", "2", "--hidden-size",
                                   "64", "--num-attention-heads", "4", "--seq-length", "32",
                                   "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters",
                                   "10", "--eval-iters", "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}
std::vector<std::string> pretrain_gpt2(const std::string& vocab, const std::string& merges) {
  return pretrain({"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file",
                   merges, "--data-path", "x", "--split", "1,0,0"});
}

}  // namespace

TEST_CASE("pretrain_gpt refuses tokenizer files it cannot read whole, naming the flag") {
  test_support::TemporaryDirectory temporary;
  const HostileFiles files(temporary.path);
  check_refused(run_bounded(pretrain_gpt2("/dev/zero", kGpt2Merges)),
                "cannot read --vocab-file /dev/zero: " + kCharacterDevice);
  check_refused(run_bounded(pretrain_gpt2(kGpt2Vocab, "/dev/zero")),
                "cannot read --merge-file /dev/zero: " + kCharacterDevice);
  check_refused(run_bounded(pretrain_gpt2(files.fifo, kGpt2Merges)),
                "cannot read --vocab-file " + files.fifo + ": " + kFifo);
  check_refused(run_bounded(pretrain_gpt2(kGpt2Vocab, files.fifo)),
                "cannot read --merge-file " + files.fifo + ": " + kFifo);
  check_refused(run_bounded(pretrain_gpt2(files.sparse, kGpt2Merges)),
                "cannot read --vocab-file " + files.sparse + ": " + kTooLarge);
  check_refused(run_bounded(pretrain_gpt2(kGpt2Vocab, files.sparse)),
                "cannot read --merge-file " + files.sparse + ": " + kTooLarge);
}

TEST_CASE("pretrain_gpt refuses data lists, dataset files and trackers it cannot read") {
  test_support::TemporaryDirectory temporary;
  const HostileFiles files(temporary.path);
  const std::vector<std::string> null_tokenizer = {"--tokenizer-type", "NullTokenizer",
                                                   "--vocab-size", "100"};
  auto with_data = [&](std::vector<std::string> data) {
    data.insert(data.end(), null_tokenizer.begin(), null_tokenizer.end());
    return pretrain(data);
  };
  check_refused(run_bounded(with_data({"--data-args-path", "/dev/zero"})),
                "cannot read --data-args-path /dev/zero: " + kCharacterDevice);
  check_refused(run_bounded(with_data({"--data-args-path", files.sparse})),
                "cannot read --data-args-path " + files.sparse + ": " + kTooLarge);
  check_refused(run_bounded(with_data({"--data-file-list", files.fifo})),
                "cannot read --data-file-list " + files.fifo + ": " + kFifo);
  check_refused(run_bounded(with_data({"--per-split-data-args-path", "/dev/zero"})),
                "cannot read --per-split-data-args-path /dev/zero: " + kCharacterDevice);
  check_refused(run_bounded(with_data({"--per-split-data-args-path", files.sparse})),
                "cannot read --per-split-data-args-path " + files.sparse + ": " + kTooLarge);

  // A dataset prefix whose .idx is a FIFO: not waited on.
  const std::string prefix = (temporary.path / "corpus_text_document").string();
  REQUIRE(::mkfifo((prefix + ".idx").c_str(), 0600) == 0);
  std::ofstream(prefix + ".bin") << "";
  check_refused(run_bounded(with_data({"--data-path", prefix, "--split", "1,0,0"})),
                "cannot read dataset file " + prefix + ".idx: " + kFifo);

  // A checkpoint directory whose tracker is a FIFO, or /dev/zero.
  const fs::path load = temporary.path / "load";
  fs::create_directories(load);
  REQUIRE(::mkfifo((load / "latest_checkpointed_iteration.txt").c_str(), 0600) == 0);
  check_refused(run_bounded(pretrain({"--mock-data", "--vocab-size", "100", "--load", load.string()})),
                "cannot read the checkpoint tracker " +
                    (load / "latest_checkpointed_iteration.txt").string() + ": " + kFifo);
  fs::remove(load / "latest_checkpointed_iteration.txt");
  fs::create_symlink("/dev/zero", load / "latest_checkpointed_iteration.txt");
  check_refused(run_bounded(pretrain({"--mock-data", "--vocab-size", "100", "--load", load.string()})),
                kCharacterDevice);
}

TEST_CASE("preprocess_data refuses tokenizer files it cannot read whole") {
  test_support::TemporaryDirectory temporary;
  const HostileFiles files(temporary.path);
  const std::string input = (temporary.path / "input.jsonl").string();
  std::ofstream(input) << "{\"text\": \"hello\"}\n";
  auto preprocess = [&](const std::string& vocab, const std::string& merges) {
    return run_bounded({kTestBin + "/preprocess_data", "--input", input, "--output-prefix",
                        (temporary.path / "out").string(), "--tokenizer-type", "GPT2BPETokenizer",
                        "--vocab-file", vocab, "--merge-file", merges});
  };
  check_refused(preprocess("/dev/zero", kGpt2Merges),
                "cannot read --vocab-file /dev/zero: " + kCharacterDevice);
  check_refused(preprocess(kGpt2Vocab, files.fifo), "cannot read --merge-file " + files.fifo + ": " + kFifo);
  check_refused(preprocess(files.sparse, kGpt2Merges), kTooLarge);
}

TEST_CASE("checkpoint_util --import-hf refuses a config.json or safetensors it cannot read") {
  test_support::TemporaryDirectory temporary;
  const HostileFiles files(temporary.path);
  const fs::path model = temporary.path / "hf";
  fs::create_directories(model);
  auto import_hf = [&] {
    return run_bounded({kTestBin + "/checkpoint_util", "--import-hf", model.string(), "--save",
                        (temporary.path / "out").string()});
  };
  fs::create_symlink("/dev/zero", model / "config.json");
  check_refused(import_hf(), "cannot read the Hugging Face file " +
                                 (model / "config.json").string() + ": " + kCharacterDevice);
  fs::remove(model / "config.json");
  fs::create_symlink(files.sparse, model / "config.json");
  check_refused(import_hf(), kTooLarge);
  fs::remove(model / "config.json");
  std::ofstream(model / "config.json")
      << R"({"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 8, )"
      << R"("vocab_size": 128})";
  REQUIRE(::mkfifo((model / "model.safetensors").c_str(), 0600) == 0);
  check_refused(import_hf(), "cannot read the safetensors file " +
                                 (model / "model.safetensors").string() + ": " + kFifo);
}

TEST_CASE("the launcher refuses config files, job records and reports it cannot read whole") {
  test_support::TemporaryDirectory temporary;
  const HostileFiles files(temporary.path);
  // A config directory whose config.yaml is 100 GB (a FIFO or a device there is no config
  // file at all to the launcher: "no config.yaml there").
  const fs::path conf = temporary.path / "conf";
  fs::create_directories(conf);
  fs::create_symlink(files.sparse, conf / "config.yaml");
  check_refused(
      run_bounded({kTestBin + "/launcher", "main", "--config-dir", conf.string(), "--cfg", "job"}),
      "cannot read the YAML file " + (conf / "config.yaml").string() + ": " + kTooLarge);

  // A run directory whose job records are a FIFO, then a sparse file.
  const fs::path run = temporary.path / "results" / "run";
  fs::create_directories(run);
  REQUIRE(::mkfifo((run / "jobs.jsonl").c_str(), 0600) == 0);
  check_refused(run_bounded({kTestBin + "/launcher", "status", run.string()}),
                "cannot read the job records " + (run / "jobs.jsonl").string() + ": " + kFifo);
  fs::remove(run / "jobs.jsonl");
  fs::create_symlink(files.sparse, run / "jobs.jsonl");
  check_refused(run_bounded({kTestBin + "/launcher", "status", run.string()}), kTooLarge);

  // A benchmark report of 100 GB (the report looks for a regular file, so not a device).
  fs::create_directories(run / "results");
  fs::create_symlink(files.sparse, run / "results" / "benchmark.json");
  check_refused(run_bounded({kTestBin + "/launcher", "report", run.string()}),
                "cannot read the benchmark report " + (run / "results" / "benchmark.json").string() +
                    ": " + kTooLarge);
}
