// GPT-2 BPE: ids identical to the reference encoders on every committed fixture
// (tests/data/gpt2_tokenizer_fixtures.jsonl, made by tests/data/tools/make_tokenizer_fixtures.mjs
// from js-tiktoken, gpt-3-encoder and OpenAI's algorithm under Python's `regex`), with each merge
// loop and with a cache that empties often; detokenize inverts tokenize; pre-token splits derived
// by hand from the pattern; bad vocab/merges files give errors naming the file and line.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/gpt2_bpe_tokenizer.hpp"
#include "backend/data/tokenizer.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using namespace backend;
using test_support::from_hex;
using test_support::kGpt2Merges;
using test_support::kGpt2Vocab;
using test_support::kTestData;
using test_support::read_file;
using test_support::TemporaryDirectory;
using test_support::write_file;

namespace {

struct BpeFixture {
  std::string input;     // the bytes to tokenize
  std::string expected;  // what detokenize must give back (the repaired text for invalid UTF-8)
  std::vector<int32_t> ids;
  bool python_only = false;
  bool invalid_utf8 = false;
};

const std::vector<BpeFixture>& fixtures() {
  static const std::vector<BpeFixture> all = [] {
    std::vector<BpeFixture> result;
    std::ifstream in(kTestData + "/gpt2_tokenizer_fixtures.jsonl");
    REQUIRE(in);
    std::string line;
    while (std::getline(in, line)) {
      const auto record = nlohmann::json::parse(line);
      BpeFixture fixture;
      if (record.contains("text")) {
        fixture.input = fixture.expected = record["text"].get<std::string>();
      } else {
        fixture.input = from_hex(record["bytes_hex"].get<std::string>());
        fixture.expected = from_hex(record["decoded_hex"].get<std::string>());
        fixture.invalid_utf8 = true;
      }
      fixture.ids = record["ids"].get<std::vector<int32_t>>();
      fixture.python_only = record.value("python_only", false);
      result.push_back(std::move(fixture));
    }
    return result;
  }();
  return all;
}

// Every fixture through `tokenizer`; returns the number of mismatches (each one reported).
int count_mismatches(Tokenizer& tokenizer) {
  int mismatches = 0;
  for (const BpeFixture& fixture : fixtures()) {
    const std::vector<int32_t> ids = tokenizer.tokenize(fixture.input);
    if (ids != fixture.ids) {
      ++mismatches;
      if (mismatches <= 5) {
        MESSAGE("mismatch on " << nlohmann::json(fixture.expected).dump().substr(0, 200));
      }
    }
  }
  return mismatches;
}

std::string error_of(const std::filesystem::path& vocab, const std::filesystem::path& merges) {
  try {
    Gpt2BpeTokenizer tokenizer(vocab, merges);
  } catch (const common::Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("GPT-2 BPE gives the reference ids on every fixture") {
  Gpt2BpeTokenizer tokenizer(kGpt2Vocab, kGpt2Merges);
  REQUIRE(fixtures().size() > 2000);
  int python_only = 0, invalid = 0;
  for (const BpeFixture& fixture : fixtures()) {
    python_only += fixture.python_only;
    invalid += fixture.invalid_utf8;
  }
  CHECK(python_only > 50);
  CHECK(invalid > 30);
  CHECK(count_mismatches(tokenizer) == 0);
  // A second pass runs on a warm cache.
  CHECK(count_mismatches(tokenizer) == 0);
}

TEST_CASE("the heap merge, the scan merge and a small word cache give the same ids") {
  Gpt2BpeTokenizer heap_only(kGpt2Vocab, kGpt2Merges,
                             {.word_cache_entries = 0, .heap_merge_min_bytes = 0});
  Gpt2BpeTokenizer scan_only(kGpt2Vocab, kGpt2Merges,
                             {.word_cache_entries = 0, .heap_merge_min_bytes = 1 << 30});
  Gpt2BpeTokenizer small_cache(kGpt2Vocab, kGpt2Merges,
                               {.word_cache_entries = 7, .heap_merge_min_bytes = 48});
  CHECK(count_mismatches(heap_only) == 0);
  CHECK(count_mismatches(scan_only) == 0);
  CHECK(count_mismatches(small_cache) == 0);
  // A clone shares the tables and has its own cache.
  const auto clone = small_cache.clone();
  CHECK(count_mismatches(*clone) == 0);
}

TEST_CASE("detokenize gives back the text, or the repaired text for invalid UTF-8") {
  Gpt2BpeTokenizer tokenizer(kGpt2Vocab, kGpt2Merges);
  for (const BpeFixture& fixture : fixtures()) {
    CHECK(tokenizer.detokenize(fixture.ids) == fixture.expected);
  }
  const std::string text = "Round trip: 👩‍💻 中文 e\u0301 \t\n  ";
  CHECK(tokenizer.detokenize(tokenizer.tokenize(text)) == text);
  CHECK_THROWS_WITH_AS(tokenizer.detokenize(std::vector<int32_t>{50257}),
                       doctest::Contains("id 50257 is outside"), common::Error);
  CHECK_THROWS_AS(tokenizer.detokenize(std::vector<int32_t>{-1}), common::Error);
}

TEST_CASE("<|endoftext|> is eod 50256 and, inside text, ordinary text") {
  Gpt2BpeTokenizer tokenizer(kGpt2Vocab, kGpt2Merges);
  CHECK(tokenizer.vocab_size() == 50257);
  CHECK(tokenizer.eod() == 50256);
  CHECK(tokenizer.detokenize(std::vector<int32_t>{50256}) == "<|endoftext|>");
  const auto ids = tokenizer.tokenize("<|endoftext|>");
  CHECK(ids.size() > 1);
  CHECK(std::find(ids.begin(), ids.end(), 50256) == ids.end());
  CHECK(tokenizer.tokenize("").empty());
  // GPT-2's ids for "Hello world", as published in countless examples.
  CHECK(tokenizer.tokenize("Hello world") == std::vector<int32_t>{15496, 995});
}

TEST_CASE("pre-tokenization follows the pattern's alternatives and Python's \\s") {
  Gpt2BpeTokenizer tokenizer(kGpt2Vocab, kGpt2Merges);
  using Pieces = std::vector<std::string_view>;
  CHECK(tokenizer.pretokenize("Hello  world") == Pieces{"Hello", " ", " world"});
  CHECK(tokenizer.pretokenize("don't I'M 'S") == Pieces{"don", "'t", " I", "'", "M", " '", "S"});
  CHECK(tokenizer.pretokenize("we'll they're ''s") ==
        Pieces{"we", "'ll", " they", "'re", " ''", "s"});
  CHECK(tokenizer.pretokenize("a1 22b ?!x") == Pieces{"a", "1", " 22", "b", " ?!", "x"});
  CHECK(tokenizer.pretokenize("end  \n\n") == Pieces{"end", "  \n\n"});
  CHECK(tokenizer.pretokenize("a\t\n b") == Pieces{"a", "\t\n", " b"});
  CHECK(tokenizer.pretokenize("a\nb") == Pieces{"a", "\n", "b"});
  CHECK(tokenizer.pretokenize("caf\u00e9 e\u0301") == Pieces{"caf\u00e9", " e", "\u0301"});
  CHECK(tokenizer.pretokenize("x\u3000y") == Pieces{"x", "\u3000", "y"});
  CHECK(tokenizer.pretokenize("\u0663\u0664 \u00bd") == Pieces{"\u0663\u0664", " \u00bd"});
  // U+0085 is White_Space (Python), U+FEFF is not (JavaScript's \s says the opposite).
  CHECK(tokenizer.pretokenize("a\u0085\u0085b") == Pieces{"a", "\u0085", "\u0085", "b"});
  CHECK(tokenizer.pretokenize("x \ufeffy") == Pieces{"x", " \ufeff", "y"});
  CHECK_THROWS_AS(tokenizer.pretokenize("\xff"), common::Error);
}

TEST_CASE("a missing or malformed vocab.json is reported with its file and line") {
  TemporaryDirectory directory;
  const auto missing = directory.path / "missing.json";
  CHECK(error_of(missing, kGpt2Merges).find("cannot read --vocab-file " + missing.string()) == 0);

  const auto bad_json = directory.path / "vocab.json";
  write_file(bad_json, "{\n  \"a\": 1,\n  \"b\" 2\n}\n");
  CHECK(error_of(bad_json, kGpt2Merges).find(bad_json.string() + ":3:") == 0);

  write_file(bad_json, "[1, 2, 3]");
  CHECK(error_of(bad_json, kGpt2Merges).find("must be a JSON object") != std::string::npos);

  // A number beyond a double is valid JSON syntax that nlohmann refuses with out_of_range, not
  // parse_error: it ended in an internal error.
  write_file(bad_json, "{\"a\": 1e999}");
  CHECK(error_of(bad_json, kGpt2Merges)
            .find(bad_json.string() + ": --vocab-file is not valid JSON") == 0);

  auto vocab = nlohmann::json::parse(read_file(kGpt2Vocab));
  const auto write_vocab = [&](const nlohmann::json& contents) {
    write_file(bad_json, contents.dump());
    return error_of(bad_json, kGpt2Merges);
  };
  auto changed = vocab;
  changed["\u0120the"] = 50257;
  CHECK(write_vocab(changed).find("ids must be the integers 0 .. 50256") != std::string::npos);
  changed = vocab;
  changed["\u0120the"] = "262";
  CHECK(write_vocab(changed).find("has id \"262\"") != std::string::npos);
  changed = vocab;
  changed["\u0120the"] = 0;  // id 0 belongs to "!"
  CHECK(write_vocab(changed).find("is given to two tokens") != std::string::npos);
  changed = vocab;
  changed.erase("<|endoftext|>");
  changed["<|endoftext|>x"] = 50256;
  CHECK(write_vocab(changed).find("no \"<|endoftext|>\" token") != std::string::npos);
  changed = vocab;
  changed.erase("!");  // byte 0x21's token
  changed["\u00e9\u00e9\u00e9\u00e9\u00e9"] = 0;
  CHECK(write_vocab(changed).find("no token for byte 0x21") != std::string::npos);
  changed = vocab;
  changed.erase("\u0120the");
  changed["\u20ac"] = 262;  // '€' is not one of the 256 byte characters
  CHECK(write_vocab(changed).find("contains U+20AC") != std::string::npos);
}

TEST_CASE("a missing or malformed merges.txt is reported with its file and line") {
  TemporaryDirectory directory;
  const auto merges = directory.path / "merges.txt";
  CHECK(error_of(kGpt2Vocab, merges).find("cannot read --merge-file " + merges.string()) == 0);

  write_file(merges, "#version: 0.2\n\u0120 t\n\u0120 a\nh e llo\n");
  CHECK(error_of(kGpt2Vocab, merges).find(merges.string() + ":4: a merge is two tokens") == 0);
  write_file(merges, "#version: 0.2\n\u0120 t\nhello\n");
  CHECK(error_of(kGpt2Vocab, merges).find(merges.string() + ":3: a merge is two tokens") == 0);
  write_file(merges, "#version: 0.2\n\u0120 t\n\u0120t notatoken_xyzzy\n");
  CHECK(error_of(kGpt2Vocab, merges)
            .find(merges.string() + ":3: token \"notatoken_xyzzy\" is not in the vocabulary") == 0);
  write_file(merges, "#version: 0.2\n\u0120the \u0120the\n");
  CHECK(error_of(kGpt2Vocab, merges)
            .find(merges.string() + ":2: the merged token \"\u0120the\u0120the\"") == 0);
  write_file(merges, "#version: 0.2\n\u20ac t\n");
  CHECK(
      error_of(kGpt2Vocab, merges).find(merges.string() + ":2: token \"\u20ac\" contains U+20AC") ==
      0);
  write_file(merges, "#version: 0.2\n\xff t\n");
  CHECK(error_of(kGpt2Vocab, merges).find(merges.string() + ":2: not valid UTF-8") == 0);

  // A short merges file is valid: fewer merges, still lossless byte-level tokens.
  write_file(merges, "#version: 0.2\r\n\u0120 t\r\n\r\nh e\r\n");
  // " the" is Ġ t h e: rank 0 merges Ġt, rank 1 (after the blank line) merges he.
  Gpt2BpeTokenizer tokenizer(kGpt2Vocab, merges);
  const auto vocab = nlohmann::json::parse(read_file(kGpt2Vocab));
  CHECK(tokenizer.tokenize(" the") ==
        std::vector<int32_t>{vocab["\u0120t"].get<int32_t>(), vocab["he"].get<int32_t>()});
  CHECK(tokenizer.tokenize(" at") == std::vector<int32_t>{vocab["\u0120"].get<int32_t>(),
                                                          vocab["a"].get<int32_t>(),
                                                          vocab["t"].get<int32_t>()});
}

TEST_CASE("build_tokenizer names the missing flag") {
  CHECK_THROWS_WITH_AS(build_tokenizer({.tokenizer_type = "GPT2BPETokenizer",
                                        .vocab_file = kGpt2Vocab,
                                        .merge_file = "",
                                        .vocab_size = 0,
                                        .tokenizer_model = "",
                                        .vocab_extra_ids = 0}),
                       doctest::Contains("--merge-file"), common::Error);
  CHECK_THROWS_WITH_AS(build_tokenizer({.tokenizer_type = "SentencePieceTokenizer",
                                        .vocab_file = "", .merge_file = "", .vocab_size = 0,
                                        .tokenizer_model = "", .vocab_extra_ids = 0}),
                       doctest::Contains("--tokenizer-type SentencePieceTokenizer needs "
                                         "--tokenizer-model"),
                       common::Error);
  CHECK_THROWS_WITH_AS(build_tokenizer({.tokenizer_type = "TikTokenizer",
                                        .vocab_file = "", .merge_file = "", .vocab_size = 0,
                                        .tokenizer_model = "", .vocab_extra_ids = 0}),
                       doctest::Contains("valid: GPT2BPETokenizer, NullTokenizer, "
                                         "SentencePieceTokenizer, GPTSentencePieceTokenizer, "
                                         "Llama2Tokenizer, HuggingFaceTokenizer"),
                       common::Error);
  const auto tokenizer = build_tokenizer({.tokenizer_type = "GPT2BPETokenizer",
                                          .vocab_file = kGpt2Vocab,
                                          .merge_file = kGpt2Merges,
                                          .vocab_size = 0,
                                          .tokenizer_model = "",
                                          .vocab_extra_ids = 0});
  CHECK(tokenizer->eod() == 50256);
}
