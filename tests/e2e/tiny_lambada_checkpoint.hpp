// The tiny GPT the serving and evaluation e2e tests run on: 2 layers, hidden 32, 4 heads,
// sequence 64, GPT-2's tokenizer, trained by pretrain_gpt (lr 1e-2, batch 2 of 4, seed 1234) on
// the first three passages of the test LAMBADA file, tokenized by preprocess_data. At 30-60
// iterations it has learned those passages' last words and not the others'.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

inline void train_tiny_lambada_checkpoint(TinyLambadaCheckpoint& model, int iterations) {
  const std::filesystem::path corpus = model.temporary.path / "corpus.jsonl";
  {
    std::ifstream in(kTestData + "/zero_shot/lambada_test.jsonl");
    std::ofstream out(corpus);
    std::string line;
    for (int i = 0; i < 3 && std::getline(in, line); ++i) out << line << '\n';
  }
  const auto prepared = launcher::run_and_capture(
      {kTestBin + "/preprocess_data", "--input", corpus.string(), "--output-prefix",
       (model.temporary.path / "corpus").string(), "--tokenizer-type", "GPT2BPETokenizer",
       "--vocab-file", kGpt2Vocab, "--merge-file", kGpt2Merges, "--append-eod", "--workers", "1"});
  model.output = prepared.output;
  if (prepared.exit_code != 0) return;
  model.checkpoints = model.temporary.path / "checkpoints";
  const auto trained = launcher::run_and_capture(join(
      join({kTestBin + "/pretrain_gpt"}, tiny_lambada_model_flags()),
      {"--data-path", (model.temporary.path / "corpus_text_document").string(), "--split", "1,0,0",
       "--train-iters", std::to_string(iterations), "--lr", "1e-2", "--micro-batch-size", "2",
       "--global-batch-size", "4", "--eval-iters", "0", "--log-interval", "10", "--seed", "1234",
       "--save", model.checkpoints.string()}));
  model.output += trained.output;
  model.ok = trained.exit_code == 0;
}

}  // namespace test_support
