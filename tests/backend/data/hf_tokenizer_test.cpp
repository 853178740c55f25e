// HuggingFaceTokenizer: on Llama 3's tokenizer.json (tests/data/llama3/, rebuilt from
// llama3-tokenizer-js's vocabulary by tests/data/tools/make_llama3_fixtures.mjs) the ids of
// llama3-tokenizer-js and an independent Python encoder on every fixture, with each merge loop;
// on GPT-2's vocabulary written as a tokenizer.json (here, from gpt2-vocab.json/gpt2-merges.txt)
// the GPT-2 fixtures' ids, so the ByteLevel path equals GPT2BPETokenizer; Llama 3's
// pre-tokenizer splits derived by hand from its regex; ignore_merges; Megatron's vocab size,
// eod and BOS; bad files each a common::Error naming the file and the fault; preprocess_data end
// to end.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/byte_level_bpe.hpp"
#include "backend/data/compressed_input.hpp"
#include "backend/data/gpt2_bpe_tokenizer.hpp"
#include "backend/data/hf_tokenizer.hpp"
#include "backend/data/indexed_dataset.hpp"
#include "backend/data/preprocess_data.hpp"
#include "backend/data/tokenizer.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trainer.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using namespace backend;
namespace fs = std::filesystem;
using nlohmann::json;
using test_support::from_hex;
using test_support::kTestData;
using test_support::read_file;
using test_support::TemporaryDirectory;
using test_support::write_file;

namespace {

// Llama 3's tokenizer directory: tokenizer.json decompressed (with the project's own reader)
// into a directory that lives until the test program ends.
const fs::path& llama3_directory() {
  static TemporaryDirectory directory("hf_tokenizer_test");
  static const bool ready = [] {
    CompressedInput input(kTestData + "/llama3/tokenizer.json.xz");
    std::ofstream out(directory.path / "tokenizer.json", std::ios::binary);
    std::vector<char> buffer(1 << 20);
    while (const size_t n = input.read(buffer.data(), buffer.size())) out.write(buffer.data(), n);
    fs::copy_file(kTestData + "/llama3/tokenizer_config.json",
                  directory.path / "tokenizer_config.json");
    return out.good();
  }();
  REQUIRE(ready);
  return directory.path;
}

const HuggingFaceTokenizer& llama3() {
  static const HuggingFaceTokenizer tokenizer(llama3_directory());
  return tokenizer;
}

struct HfFixture {
  std::string text;
  std::vector<int32_t> ids;
  bool python_only = false;
};

std::vector<HfFixture> read_fixtures(const std::string& name) {
  std::vector<HfFixture> result;
  std::ifstream in(kTestData + "/" + name);
  REQUIRE(in);
  std::string line;
  while (std::getline(in, line)) {
    const auto record = json::parse(line);
    HfFixture fixture;
    fixture.text = record.contains("text") ? record["text"].get<std::string>()
                                           : from_hex(record["bytes_hex"].get<std::string>());
    fixture.ids = record["ids"].get<std::vector<int32_t>>();
    fixture.python_only = record.value("python_only", false);
    result.push_back(std::move(fixture));
  }
  return result;
}

int count_mismatches(Tokenizer& tokenizer, const std::vector<HfFixture>& fixtures) {
  int mismatches = 0;
  for (const HfFixture& fixture : fixtures) {
    if (tokenizer.tokenize(fixture.text) != fixture.ids) {
      if (++mismatches <= 5) MESSAGE("mismatch on " << json(fixture.text).dump().substr(0, 200));
    }
  }
  return mismatches;
}

// GPT-2's vocabulary as Hugging Face's tokenizer.json (openai-community/gpt2's structure):
// merges in the "a b" string form; with `split_regex`, the pre-tokenizer is a Sequence of a
// Split with GPT-2's regex and ByteLevel{use_regex: false} instead of ByteLevel alone.
fs::path write_gpt2_tokenizer(const fs::path& directory, bool split_regex) {
  json merges = json::array();
  std::istringstream lines(read_file(kTestData + "/gpt2-merges.txt"));
  std::string line;
  for (bool first = true; std::getline(lines, line); first = false) {
    if (first && line.starts_with("#version")) continue;  // merges such as "# #" start with '#'
    if (!line.empty()) merges.push_back(line);
  }
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                     {"trim_offsets", true}, {"use_regex", !split_regex}};
  json pre_tokenizer = byte_level;
  if (split_regex) {
    pre_tokenizer = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          byte_level}}};
  }
  const json tokenizer = {{"version", "1.0"},
                          {"added_tokens",
                           {{{"id", 50256},
                             {"content", "<|endoftext|>"},
                             {"single_word", false},
                             {"lstrip", false},
                             {"rstrip", false},
                             {"normalized", true},
                             {"special", true}}}},
                          {"normalizer", nullptr},
                          {"pre_tokenizer", pre_tokenizer},
                          {"post_processor",
                           {{"type", "ByteLevel"},
                            {"add_prefix_space", true},
                            {"trim_offsets", false},
                            {"use_regex", true}}},
                          {"decoder",
                           {{"type", "ByteLevel"},
                            {"add_prefix_space", true},
                            {"trim_offsets", true},
                            {"use_regex", true}}},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", nullptr},
                            {"continuing_subword_prefix", ""},
                            {"end_of_word_suffix", ""},
                            {"fuse_unk", false},
                            {"vocab", json::parse(read_file(kTestData + "/gpt2-vocab.json"))},
                            {"merges", merges}}}};
  write_file(directory / "tokenizer.json", tokenizer.dump());
  write_file(directory / "special_tokens_map.json",
             R"({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})");
  return directory;
}

// A small byte-level tokenizer.json: the 256 byte tokens (id = byte), "bc" 256 (the one merge),
// "abc" 257 (no merge makes it), added "<|eos|>" 258.
json tiny_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    const char32_t c = byte_level_character(static_cast<uint8_t>(b));
    std::string text;
    if (c < 0x80) {
      text.push_back(static_cast<char>(c));
    } else {
      text.push_back(static_cast<char>(0xC0 | (c >> 6)));
      text.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    vocab[text] = b;
  }
  vocab["bc"] = 256;
  vocab["abc"] = 257;
  return {{"added_tokens", {{{"id", 258}, {"content", "<|eos|>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({json::array({"b", "c"})})}}}};
}

fs::path write_tiny(const fs::path& directory, const json& tokenizer,
                    const std::string& config = R"({"eos_token": {"content": "<|eos|>"}})") {
  write_file(directory / "tokenizer.json", tokenizer.dump());
  write_file(directory / "tokenizer_config.json", config);
  return directory;
}

}  // namespace

TEST_CASE("HuggingFaceTokenizer on Llama 3's tokenizer.json gives the reference ids on every fixture") {
  const std::vector<HfFixture> fixtures = read_fixtures("llama3/llama3_tokenizer_fixtures.jsonl");
  REQUIRE(fixtures.size() > 2000);
  int python_only = 0;
  for (const HfFixture& fixture : fixtures) python_only += fixture.python_only;
  CHECK(python_only > 50);
  auto tokenizer = llama3().clone();
  CHECK(count_mismatches(*tokenizer, fixtures) == 0);
  // The heap merge for every pre-token and a cache that empties every few pre-tokens.
  HuggingFaceTokenizer heap(llama3_directory(), {.word_cache_entries = 3, .heap_merge_min_bytes = 0});
  CHECK(count_mismatches(heap, fixtures) == 0);
  HuggingFaceTokenizer scan(llama3_directory() / "tokenizer.json",
                            {.word_cache_entries = 0, .heap_merge_min_bytes = 1 << 30});
  CHECK(count_mismatches(scan, fixtures) == 0);
}

TEST_CASE("Llama 3: detokenize gives back <|begin_of_text|> and the text") {
  const std::vector<HfFixture> fixtures = read_fixtures("llama3/llama3_tokenizer_fixtures.jsonl");
  for (const HfFixture& fixture : fixtures) {
    CHECK(llama3().detokenize(fixture.ids) == "<|begin_of_text|>" + fixture.text);
  }
  CHECK_THROWS_WITH_AS(llama3().detokenize(std::vector<int32_t>{128256}),
                       doctest::Contains("id 128256 is outside the vocabulary [0, 128256)"),
                       common::Error);
}

TEST_CASE("Llama 3: Megatron's vocab size, eod and BOS, and special tokens in the text") {
  auto tokenizer = llama3().clone();
  CHECK(tokenizer->vocab_size() == 128256);  // len(AutoTokenizer): 128000 + 256 added
  CHECK(tokenizer->eod() == 128001);         // tokenizer_config.json's <|end_of_text|>
  CHECK(llama3().prefix_ids().size() == 1);
  CHECK(llama3().prefix_ids()[0] == 128000);
  CHECK(llama3().suffix_ids().empty());
  CHECK(tokenizer->tokenize("") == std::vector<int32_t>{128000});
  CHECK(tokenizer->tokenize("Hello world!") == std::vector<int32_t>{128000, 9906, 1917, 0});
  CHECK(tokenizer->tokenize("<|eot_id|>") == std::vector<int32_t>{128000, 128009});
  CHECK(tokenizer->tokenize("a<|reserved_special_token_247|>") ==
        std::vector<int32_t>{128000, 64, 128255});
  // Invalid UTF-8 is replaced as Python's decode("utf-8", "replace") does before encoding.
  CHECK(tokenizer->tokenize(std::string("x\xF0\x9F\x98 y")) == tokenizer->tokenize("x\uFFFD y"));
  // eos from special_tokens_map.json when tokenizer_config.json has none; the file path works too.
  TemporaryDirectory directory;
  fs::copy_file(llama3_directory() / "tokenizer.json", directory.path / "tokenizer.json");
  write_file(directory.path / "tokenizer_config.json", R"({"model_max_length": 8192})");
  write_file(directory.path / "special_tokens_map.json", R"({"eos_token": "<|eot_id|>"})");
  const auto built = build_tokenizer({.tokenizer_type = "HuggingFaceTokenizer", .vocab_file = "",
                                      .merge_file = "", .vocab_size = 0,
                                      .tokenizer_model = (directory.path / "tokenizer.json").string(),
                                      .vocab_extra_ids = 0});
  CHECK(built->eod() == 128009);
}

TEST_CASE("Llama 3's pre-tokenizer splits as its regex does") {
  auto tables = std::make_shared<ByteLevelBpeTables>();
  tables->pattern = PretokenizerPattern::llama3;
  ByteLevelBpeEncoder encoder(tables, {});
  using Pieces = std::vector<std::string_view>;
  CHECK(encoder.pretokenize("Hello world") == Pieces{"Hello", " world"});
  CHECK(encoder.pretokenize("I'M x'ſt don'T") == Pieces{"I", "'M", " x", "'ſ", "t", " don", "'T"});
  CHECK(encoder.pretokenize("12345 1234567") == Pieces{"123", "45", " ", "123", "456", "7"});
  CHECK(encoder.pretokenize("a\r\n\r\nb") == Pieces{"a", "\r\n\r\n", "b"});
  CHECK(encoder.pretokenize("  \n  x") == Pieces{"  \n", " ", " x"});
  CHECK(encoder.pretokenize("!!!\n\nx ?!\r\n") == Pieces{"!!!\n\n", "x", " ?!\r\n"});
  CHECK(encoder.pretokenize("\tword (hello) end  ") ==
        Pieces{"\tword", " (", "hello", ")", " end", "  "});
}

TEST_CASE("ignore_merges: a pre-token that is a vocabulary entry is one id") {
  TemporaryDirectory directory;
  json tokenizer = tiny_tokenizer();
  HuggingFaceTokenizer merging(write_tiny(directory.path, tokenizer));
  CHECK(merging.tokenize("abc") == std::vector<int32_t>{'a', 256});
  CHECK(merging.vocab_size() == 259);
  CHECK(merging.eod() == 258);
  CHECK(merging.tokenize("x<|eos|>abc") == std::vector<int32_t>{'x', 258, 'a', 256});
  tokenizer["model"]["ignore_merges"] = true;
  HuggingFaceTokenizer ignoring(write_tiny(directory.path, tokenizer));
  CHECK(ignoring.tokenize("abc") == std::vector<int32_t>{257});
  CHECK(ignoring.tokenize(" abc abc") == std::vector<int32_t>{' ', 'a', 256, ' ', 'a', 256});
  CHECK(ignoring.detokenize(std::vector<int32_t>{257, 258}) == "abc<|eos|>");
}

TEST_CASE("GPT-2's vocabulary as a tokenizer.json gives GPT2BPETokenizer's ids") {
  const std::vector<HfFixture> fixtures = read_fixtures("gpt2_tokenizer_fixtures.jsonl");
  Gpt2BpeTokenizer gpt2(kTestData + "/gpt2-vocab.json", kTestData + "/gpt2-merges.txt");
  for (const bool split_regex : {false, true}) {
    CAPTURE(split_regex);
    TemporaryDirectory directory;
    HuggingFaceTokenizer tokenizer(write_gpt2_tokenizer(directory.path, split_regex));
    CHECK(tokenizer.vocab_size() == 50257);
    CHECK(tokenizer.eod() == 50256);
    CHECK(tokenizer.prefix_ids().empty());
    int mismatches = 0, compared = 0;
    for (const HfFixture& fixture : fixtures) {
      // HF splits out the added token <|endoftext|>; Megatron's GPT2BPETokenizer reads it as text.
      if (fixture.text.find("<|endoftext|>") != std::string::npos) continue;
      ++compared;
      const auto ids = tokenizer.tokenize(fixture.text);
      if (ids != fixture.ids || ids != gpt2.tokenize(fixture.text)) {
        if (++mismatches <= 5) MESSAGE("mismatch on " << json(fixture.text).dump().substr(0, 200));
      }
    }
    CHECK(compared > 2000);
    CHECK(mismatches == 0);
    CHECK(tokenizer.tokenize("a<|endoftext|>b") == std::vector<int32_t>{64, 50256, 65});
    CHECK(gpt2.tokenize("a<|endoftext|>b").size() > 3);
  }
}

TEST_CASE("bad tokenizer files are errors naming the file and the fault") {
  TemporaryDirectory directory;
  const fs::path& dir = directory.path;
  const auto load_error = [&](const fs::path& path) -> std::string {
    try {
      HuggingFaceTokenizer tokenizer(path);
    } catch (const common::Error& error) {
      return error.what();
    }
    return "(no error)";
  };
  const auto fails_with = [&](const json& tokenizer, const std::string& message,
                              const std::string& config = R"({"eos_token": "<|eos|>"})") {
    write_tiny(dir, tokenizer, config);
    const std::string error = load_error(dir);
    CAPTURE(error);
    CHECK(error.find(message) != std::string::npos);
    CHECK(error.find(dir.string()) != std::string::npos);
  };
  CHECK(load_error(dir / "missing").find((dir / "missing").string() + " does not exist") !=
        std::string::npos);
  CHECK(load_error(dir).find("no " + (dir / "tokenizer.json").string()) != std::string::npos);
  write_file(dir / "tokenizer.json", "{\"model\": [1, 2");
  CHECK(load_error(dir).find("tokenizer.json is not valid JSON") != std::string::npos);

  json tokenizer = tiny_tokenizer();
  tokenizer["model"]["type"] = "WordPiece";
  fails_with(tokenizer, "model.type is \"WordPiece\"; HuggingFaceTokenizer reads byte-level BPE");
  tokenizer = tiny_tokenizer();
  tokenizer["model"]["byte_fallback"] = true;
  fails_with(tokenizer, "model.byte_fallback is true, which is not implemented");
  tokenizer = tiny_tokenizer();
  tokenizer["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", R"(\p{N}| ?[^\s\p{L}\p{N}]+)"}}},
         {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  fails_with(tokenizer, R"(the pre-tokenizer regex "\\p{N}| ?[^\\s\\p{L}\\p{N}]+" is not supported: only these patterns are implemented)");
  fails_with(tokenizer, R"(Llama 3's (= tiktoken cl100k_base's) "(?i:'s|'t|'re|'ve|'m|'ll|'d)|)");
  tokenizer = tiny_tokenizer();
  tokenizer["pre_tokenizer"]["add_prefix_space"] = true;
  fails_with(tokenizer, "add_prefix_space true (or unset, which means true)");
  tokenizer = tiny_tokenizer();
  tokenizer["model"]["merges"].push_back("b x");
  tokenizer["model"]["merges"].push_back("a bc");
  fails_with(tokenizer, "model.merges[1] \"b x\": the merged token \"bx\" is not in model.vocab");
  tokenizer = tiny_tokenizer();
  tokenizer["model"]["merges"] = json::array({"b zz"});
  fails_with(tokenizer, "model.merges[0] \"b zz\": the token \"zz\" is not in model.vocab");
  tokenizer = tiny_tokenizer();
  tokenizer["model"]["merges"] = json::array({"b c d"});
  fails_with(tokenizer, "model.merges[0] \"b c d\" is not two tokens separated by one space");
  tokenizer = tiny_tokenizer();
  tokenizer["model"]["vocab"].erase("a");
  fails_with(tokenizer, "no token has id 97");
  tokenizer = tiny_tokenizer();
  tokenizer["normalizer"] = {{"type", "NFC"}};
  fails_with(tokenizer, "normalizer {\"type\":\"NFC\"} is not supported");
  tokenizer = tiny_tokenizer();
  tokenizer["post_processor"] = {{"type", "RobertaProcessing"}};
  fails_with(tokenizer, "post_processor type \"RobertaProcessing\" is not supported");
  fails_with(tiny_tokenizer(), "no eos_token in tokenizer_config.json or special_tokens_map.json",
             R"({"model_max_length": 10})");
  write_tiny(dir, tiny_tokenizer(), R"({"eos_token": "</s>"})");
  CHECK(load_error(dir).find("eos_token \"</s>\" is not a token of") != std::string::npos);
}

TEST_CASE("build_tokenizer: HuggingFaceTokenizer needs --tokenizer-model") {
  CHECK_THROWS_WITH_AS(build_tokenizer({.tokenizer_type = "HuggingFaceTokenizer", .vocab_file = "",
                                        .merge_file = "", .vocab_size = 0, .tokenizer_model = "",
                                        .vocab_extra_ids = 0}),
                       doctest::Contains("--tokenizer-type HuggingFaceTokenizer needs "
                                         "--tokenizer-model (the directory holding tokenizer.json"),
                       common::Error);
  const auto tokenizer = build_tokenizer({.tokenizer_type = "HuggingFaceTokenizer",
                                          .vocab_file = "", .merge_file = "", .vocab_size = 0,
                                          .tokenizer_model = llama3_directory().string(),
                                          .vocab_extra_ids = 0});
  CHECK(tokenizer->vocab_size() == 128256);
}

TEST_CASE("pretrain_gpt accepts HuggingFaceTokenizer and sizes the vocabulary from tokenizer.json") {
  const std::string model = llama3_directory().string();
  std::vector<const char*> argv = {
      "pretrain_gpt", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
      "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", "3", "--lr", "1e-3", "--mock-data",
      "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", model.c_str()};
  const auto arguments = parse_arguments(static_cast<int>(argv.size()), argv.data());
  REQUIRE(arguments);
  CHECK(arguments->tokenizer.tokenizer_type == "HuggingFaceTokenizer");
  CHECK(tokenizer_vocab_size(*arguments) == 128256);  // read even for mock data, as Megatron
}

TEST_CASE("preprocess_data with HuggingFaceTokenizer: the .bin/.idx ids are the tokenizer's plus eod") {
  const std::vector<std::string> texts = {
      "Hello world!", "", "  leading\n\n\ttabs <|eot_id|> special", "数字 12345 ٣٤٥",
      "emoji 👍🏽 and ſ 'S", "line\r\nbreaks\r\n"};
  TemporaryDirectory work;
  const fs::path jsonl = work.path / "messy.jsonl";
  {
    std::ofstream out(jsonl, std::ios::binary);
    for (const auto& text : texts) out << json{{"text", text}}.dump() << '\n';
  }
  PreprocessOptions options;
  options.inputs = {jsonl.string()};
  options.output_prefix = (work.path / "messy").string();
  options.tokenizer = {.tokenizer_type = "HuggingFaceTokenizer", .vocab_file = "",
                       .merge_file = "", .vocab_size = 0,
                       .tokenizer_model = llama3_directory().string(), .vocab_extra_ids = 0};
  options.append_eod = true;
  options.workers = 2;
  options.batch_bytes = 32;  // several batches, so both workers' clones tokenize
  std::ostringstream out, err;
  const PreprocessSummary summary = preprocess_data(options, out, err);
  REQUIRE(summary.bad_lines == 0);
  IndexedDataset dataset((work.path / "messy_text_document").string());
  CHECK(dataset.dtype() == DType::int32);  // 128256 ids do not fit 16 bits
  REQUIRE(dataset.sequence_count() == static_cast<int64_t>(texts.size()));
  auto tokenizer = llama3().clone();
  for (int64_t i = 0; i < dataset.sequence_count(); ++i) {
    const std::string& text = texts[static_cast<size_t>(i)];
    INFO("document " << i << ": " << json(text).dump());
    std::vector<int32_t> ids(static_cast<size_t>(dataset.sequence_length(i)));
    dataset.read_tokens(i, 0, ids);
    std::vector<int32_t> expected = tokenizer->tokenize(text);  // <|begin_of_text|> first
    expected.push_back(128001);                                  // --append-eod: eos
    CHECK(ids == expected);
  }
}
