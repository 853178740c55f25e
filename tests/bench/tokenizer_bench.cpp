// Micro benchmark of the tokenizers on one thread: reads text files, tokenizes each line as a
// document (as preprocess_data sees JSONL documents), and prints MB/s.
//   GPT-2 BPE, or with --hf HuggingFaceTokenizer: a cold pass (empty word cache) and the best
//   of the warm passes, with the token count and bytes per token, as a markdown table.
//   --sentencepiece: GPTSentencePieceTokenizer (the model's ids as they are, what Python's
//   SentencePieceProcessor.encode_as_ids gives) over the model file, the best of the passes,
//   as one markdown table row, with an order-sensitive checksum of all ids so that
//   tokenizer_bench.sh can check that the reference produced the same ids.
// Built on demand by tests/bench/tokenizer_bench.sh and hf_tokenizer_bench.sh (target
// tokenizer_bench).
// Usage: tokenizer_bench VOCAB_JSON MERGES_TXT PASSES FILE...
//        tokenizer_bench --hf TOKENIZER_DIR PASSES FILE...
//        tokenizer_bench --sentencepiece MODEL PASSES FILE...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/gpt2_bpe_tokenizer.hpp"
#include "backend/data/hf_tokenizer.hpp"
#include "backend/data/sentencepiece_tokenizer.hpp"

namespace {

struct Corpus {
  std::vector<std::string> documents;
  size_t bytes = 0;
};

// Each line of each file, with its newline, is one document.
Corpus read_documents(int first, int argc, char** argv) {
  Corpus corpus;
  for (int i = first; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) common::fail("cannot read {}", argv[i]);
    std::string line;
    while (std::getline(in, line)) {
      line += '\n';
      corpus.bytes += line.size();
      corpus.documents.push_back(std::move(line));
    }
  }
  return corpus;
}

// Σ (position + 1) · id mod 2^64 over all ids of all documents in order (the reference in
// tokenizer_bench.sh computes the same).
struct Checksum {
  uint64_t value = 0, position = 0;
  void add(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) value += ++position * static_cast<uint64_t>(id);
  }
};

int run_sentencepiece(const char* model, int passes, const Corpus& corpus) {
  backend::SentencePieceTokenizer tokenizer(backend::SentencePieceTokenizer::Kind::gpt_sentencepiece, model);
  std::vector<int32_t> ids;
  double best_seconds = 1e30;
  Checksum checksum;
  for (int pass = 0; pass < passes; ++pass) {
    Checksum this_pass;
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& document : corpus.documents) {
      ids.clear();
      tokenizer.tokenize(document, ids);
      this_pass.add(ids);
    }
    best_seconds = std::min(best_seconds,
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    checksum = this_pass;
  }
  const double megabytes = static_cast<double>(corpus.bytes) / 1e6;
  std::printf("| ours: GPTSentencePieceTokenizer (C++ over libsentencepiece), best of %d | %.1f | %zu | "
              "%llu | %.2f |\n", passes, megabytes, corpus.documents.size(),
              static_cast<unsigned long long>(checksum.position), megabytes / best_seconds);
  std::printf("checksum %llu tokens %llu\n", static_cast<unsigned long long>(checksum.value),
              static_cast<unsigned long long>(checksum.position));
  return 0;
}

// GPT-2 BPE or HuggingFaceTokenizer: byte-level BPE with a word cache, so cold and warm differ.
int run_byte_level_bpe(backend::Tokenizer& tokenizer, int passes, const Corpus& corpus) {
  std::vector<int32_t> ids;
  ids.reserve(1 << 20);
  double cold_seconds = 0, best_warm_seconds = 1e30;
  size_t tokens = 0;
  for (int pass = 0; pass <= passes; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    tokens = 0;
    for (const std::string& document : corpus.documents) {
      ids.clear();
      tokenizer.tokenize(document, ids);
      tokens += ids.size();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (pass == 0) cold_seconds = seconds;
    else best_warm_seconds = std::min(best_warm_seconds, seconds);
  }
  const double megabytes = static_cast<double>(corpus.bytes) / 1e6;
  std::printf("| input MB | documents | tokens | bytes/token | cold MB/s | warm MB/s |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::printf("| %.1f | %zu | %zu | %.2f | %.1f | %.1f |\n", megabytes, corpus.documents.size(), tokens,
              static_cast<double>(corpus.bytes) / static_cast<double>(tokens), megabytes / cold_seconds,
              megabytes / best_warm_seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: tokenizer_bench VOCAB_JSON MERGES_TXT PASSES FILE...\n"
                         "       tokenizer_bench --hf TOKENIZER_DIR PASSES FILE...\n"
                         "       tokenizer_bench --sentencepiece MODEL PASSES FILE...\n");
    return 2;
  }
  try {
    const int passes = std::max(1, std::stoi(argv[3]));
    const Corpus corpus = read_documents(4, argc, argv);
    if (std::strcmp(argv[1], "--sentencepiece") == 0) return run_sentencepiece(argv[2], passes, corpus);
    if (std::strcmp(argv[1], "--hf") == 0) {
      backend::HuggingFaceTokenizer tokenizer(argv[2]);
      return run_byte_level_bpe(tokenizer, passes, corpus);
    }
    backend::Gpt2BpeTokenizer tokenizer(argv[1], argv[2]);
    return run_byte_level_bpe(tokenizer, passes, corpus);
  } catch (const common::Error& error) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", error.what());
    return 2;
  }
}
