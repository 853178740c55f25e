// The tiny GPT the serving and evaluation e2e tests run on: 2 layers, hidden 32, 4 heads,
// sequence 64, GPT-2's tokenizer, trained by pretrain_gpt (lr 1e-2, batch 2 of 4, seed 1234) on
// the first three passages of the test LAMBADA file, tokenized by preprocess_data. At 30-60
// iterations it has learned those passages' last words and not the others'.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "build_cache.hpp"
#include "launcher/process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace test_support {

inline std::vector<std::string> join(std::vector<std::string> first,
                                     const std::vector<std::string>& second) {
  first.insert(first.end(), second.begin(), second.end());
  return first;
}

// The model and tokenizer flags that pretrain_gpt shares with evaluate_gpt and the server.
inline std::vector<std::string> tiny_lambada_model_flags() {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
          "--seq-length", "64", "--max-position-embeddings", "64",
          "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", kGpt2Vocab,
          "--merge-file", kGpt2Merges, "--device", "cpu"};
}

struct TinyLambadaCheckpoint {
  explicit TinyLambadaCheckpoint(const std::string& name) : temporary(name) {}
  TemporaryDirectory temporary;
  std::filesystem::path checkpoints;  // pretrain_gpt's --save
  std::string output;                 // what the tools printed, for the test's INFO
  bool ok = false;
};

// Trains the model of `iterations` iterations into `directory` (its corpus beside the checkpoints
// in `directory`/checkpoints); false and the tools' output when a tool failed.
inline bool train_tiny_lambada_checkpoint_into(const std::filesystem::path& directory, int iterations,
                                               std::string& output) {
  const std::filesystem::path corpus = directory / "corpus.jsonl";
  {
    std::ifstream in(kTestData + "/zero_shot/lambada_test.jsonl");
    std::ofstream out(corpus);
    std::string line;
    for (int i = 0; i < 3 && std::getline(in, line); ++i) out << line << '\n';
  }
  const auto prepared = launcher::run_and_capture(
      {kTestBin + "/preprocess_data", "--input", corpus.string(), "--output-prefix",
       (directory / "corpus").string(), "--tokenizer-type", "GPT2BPETokenizer",
       "--vocab-file", kGpt2Vocab, "--merge-file", kGpt2Merges, "--append-eod", "--workers", "1"});
  output = prepared.output;
  if (prepared.exit_code != 0) return false;
  const auto trained = launcher::run_and_capture(join(
      join({kTestBin + "/pretrain_gpt"}, tiny_lambada_model_flags()),
      {"--data-path", (directory / "corpus_text_document").string(), "--split", "1,0,0",
       "--train-iters", std::to_string(iterations), "--lr", "1e-2", "--micro-batch-size", "2",
       "--global-batch-size", "4", "--eval-iters", "0", "--log-interval", "10", "--seed", "1234",
       "--save", (directory / "checkpoints").string()}));
  output += trained.output;
  return trained.exit_code == 0;
}

inline void train_tiny_lambada_checkpoint(TinyLambadaCheckpoint& model, int iterations) {
  model.checkpoints = model.temporary.path / "checkpoints";
  model.ok = train_tiny_lambada_checkpoint_into(model.temporary.path, iterations, model.output);
}

// The checkpoint of `iterations` iterations trained once per build rather than once per test
// process (under the sanitizers each training takes about 25 s; tests/build_cache.hpp), with a
// stamp of what made it: the tools' and input files' sizes and modification times, and the
// model flags.
struct SharedTinyLambadaCheckpoint {
  std::filesystem::path checkpoints;  // --load
  std::string output;                 // the training's output, or that it was reused
  bool ok = false;
};

inline SharedTinyLambadaCheckpoint shared_tiny_lambada_checkpoint(int iterations) {
  namespace fs = std::filesystem;
  std::string stamp;
  for (const std::string& file : {kTestBin + "/preprocess_data", kTestBin + "/pretrain_gpt",
                                  kTestData + "/zero_shot/lambada_test.jsonl", kGpt2Vocab, kGpt2Merges}) {
    std::error_code error;
    stamp += file + " " + std::to_string(fs::file_size(file, error)) + " " +
             std::to_string(fs::last_write_time(file, error).time_since_epoch().count()) + "\n";
  }
  for (const auto& flag : tiny_lambada_model_flags()) stamp += flag + " ";
  BuildCacheEntry entry = made_once_per_build("tiny-lambada-" + std::to_string(iterations), stamp,
                                              [&](const fs::path& directory, std::string& output) {
                                                return train_tiny_lambada_checkpoint_into(
                                                    directory, iterations, output);
                                              });
  return {.checkpoints = entry.directory / "checkpoints",
          .output = std::move(entry.output),
          .ok = entry.ok};
}

}  // namespace test_support
