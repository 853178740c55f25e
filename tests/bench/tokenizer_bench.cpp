// Micro benchmark of the GPT-2 BPE tokenizer, or with --hf of HuggingFaceTokenizer, on one
// thread: reads text files, tokenizes each line as a document (as preprocess_data sees JSONL
// documents), and prints MB/s for a cold pass (empty word cache) and the best of the warm
// passes, with the token count and bytes per token. Built on demand by
// tests/bench/tokenizer_bench.sh and hf_tokenizer_bench.sh (target tokenizer_bench).
// Usage: tokenizer_bench VOCAB_JSON MERGES_TXT PASSES FILE...
//        tokenizer_bench --hf TOKENIZER_DIR PASSES FILE...
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/gpt2_bpe_tokenizer.hpp"
#include "backend/data/hf_tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: tokenizer_bench VOCAB_JSON MERGES_TXT PASSES FILE...\n"
                         "       tokenizer_bench --hf TOKENIZER_DIR PASSES FILE...\n");
    return 2;
  }
  try {
    std::vector<std::string> documents;
    size_t bytes = 0;
    for (int i = 4; i < argc; ++i) {
      std::ifstream in(argv[i], std::ios::binary);
      if (!in) common::fail("cannot read {}", argv[i]);
      std::string line;
      while (std::getline(in, line)) {
        line += '\n';
        bytes += line.size();
        documents.push_back(std::move(line));
      }
    }
    const int passes = std::max(1, std::stoi(argv[3]));
    const std::unique_ptr<backend::Tokenizer> tokenizer =
        std::string_view(argv[1]) == "--hf"
            ? std::unique_ptr<backend::Tokenizer>(std::make_unique<backend::HuggingFaceTokenizer>(argv[2]))
            : std::make_unique<backend::Gpt2BpeTokenizer>(argv[1], argv[2]);
    std::vector<int32_t> ids;
    ids.reserve(1 << 20);
    double cold_seconds = 0, best_warm_seconds = 1e30;
    size_t tokens = 0;
    for (int pass = 0; pass <= passes; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      tokens = 0;
      for (const std::string& document : documents) {
        ids.clear();
        tokenizer->tokenize(document, ids);
        tokens += ids.size();
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (pass == 0) cold_seconds = seconds;
      else best_warm_seconds = std::min(best_warm_seconds, seconds);
    }
    const double megabytes = static_cast<double>(bytes) / 1e6;
    std::printf("| input MB | documents | tokens | bytes/token | cold MB/s | warm MB/s |\n");
    std::printf("|---|---|---|---|---|---|\n");
    std::printf("| %.1f | %zu | %zu | %.2f | %.1f | %.1f |\n", megabytes, documents.size(), tokens,
                static_cast<double>(bytes) / static_cast<double>(tokens), megabytes / cold_seconds,
                megabytes / best_warm_seconds);
  } catch (const common::Error& error) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", error.what());
    return 2;
  }
  return 0;
}
