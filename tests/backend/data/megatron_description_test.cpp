// Megatron's cache names: the descriptions are the text Megatron's own code writes (written out
// here by hand from its rules: megatron_dataset.py's unique_identifiers, blended_dataset.py's,
// the legacy tokenizers' unique_identifiers, json.dumps(indent=4)), so the MD5s in the file
// names are Megatron's; and a cache directory laid out under Megatron's names, with markers in
// its arrays, is read as it is, not rebuilt.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/md5.hpp"
#include "backend/data/gpt_dataset_builder.hpp"
#include "backend/data/megatron_description.hpp"
#include "test_files.hpp"
#include "tests/backend/data/dataset_fixture.hpp"
#include "tests/temporary_directory.hpp"

using namespace backend;
using test_support::random_lengths;
using test_support::read_file;
using test_support::TemporaryDirectory;
using test_support::write_fixture_dataset;

namespace {

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// What Megatron's GPTDataset(dataset_path=@PATH@, num_samples=@SAMPLES@, index_split=Split.train)
// writes with random_seed 1234, sequence_length 16, split "969, 30, 1" and
// _GPT2BPETokenizer("/data/gpt2-vocab.json", "/data/gpt2-merges.txt"). split_matrix is
// convert_split_vector_to_split_matrix([0.969, 0.03, 0.001]): bookends 0 (an int), 0.969,
// 0.969 + 0.03 = 0.999, 0.999 + 0.001 = 1.0.
constexpr const char* kMegatronGptDescription = R"({
    "class": "GPTDataset",
    "dataset_path": "@PATH@",
    "num_samples": @SAMPLES@,
    "index_split": "train",
    "random_seed": 1234,
    "sequence_length": 16,
    "split": "969, 30, 1",
    "split_matrix": [
        [
            0,
            0.969
        ],
        [
            0.969,
            0.999
        ],
        [
            0.999,
            1.0
        ]
    ],
    "tokenizer": {
        "class": "_GPT2BPETokenizer",
        "tokenizer_path": [
            "/data/gpt2-vocab.json",
            "/data/gpt2-merges.txt"
        ]
    }
})";

// What Megatron's BlendedDataset writes for the train split of "0.3 @A@ 0.7 @B@" at 100 samples:
// the datasets' unique_identifiers nested (one level deeper), then split, the weights normalized
// twice ([0.3, 0.7] both times) and the size, Σ ceil(100 · w) = 30 + 70.
constexpr const char* kMegatronBlendDescription = R"({
    "class": "BlendedDataset",
    "datasets": [
        {
            "class": "GPTDataset",
            "dataset_path": "@A@",
            "num_samples": 31,
            "index_split": "train",
            "random_seed": 1234,
            "sequence_length": 16,
            "split": "969, 30, 1",
            "split_matrix": [
                [
                    0,
                    0.969
                ],
                [
                    0.969,
                    0.999
                ],
                [
                    0.999,
                    1.0
                ]
            ],
            "tokenizer": {
                "class": "_GPT2BPETokenizer",
                "tokenizer_path": [
                    "/data/gpt2-vocab.json",
                    "/data/gpt2-merges.txt"
                ]
            }
        },
        {
            "class": "GPTDataset",
            "dataset_path": "@B@",
            "num_samples": 71,
            "index_split": "train",
            "random_seed": 1234,
            "sequence_length": 16,
            "split": "969, 30, 1",
            "split_matrix": [
                [
                    0,
                    0.969
                ],
                [
                    0.969,
                    0.999
                ],
                [
                    0.999,
                    1.0
                ]
            ],
            "tokenizer": {
                "class": "_GPT2BPETokenizer",
                "tokenizer_path": [
                    "/data/gpt2-vocab.json",
                    "/data/gpt2-merges.txt"
                ]
            }
        }
    ],
    "split": "train",
    "weights": [
        0.3,
        0.7
    ],
    "size": 100
})";

TokenizerOptions tokenizer_options(std::string type, std::string vocab_file, std::string merge_file,
                                   int64_t vocab_size, std::string model, int64_t vocab_extra_ids) {
  return {.tokenizer_type = std::move(type), .vocab_file = std::move(vocab_file),
          .merge_file = std::move(merge_file), .vocab_size = vocab_size,
          .tokenizer_model = std::move(model), .vocab_extra_ids = vocab_extra_ids};
}

struct DescribedCorpus {
  TemporaryDirectory directory;
  std::string a, b;
  DescribedCorpus() {
    a = (directory.path / "shard_a_text_document").string();
    b = (directory.path / "shard_b_text_document").string();
    write_fixture_dataset(a, random_lengths(200, 5, 40, 7));
    write_fixture_dataset(b, random_lengths(300, 5, 40, 8));
  }
};

GptDataBuildOptions blend_options(const DescribedCorpus& corpus, const std::string& cache_path) {
  GptDataBuildOptions options;
  options.sources.blend = blend_from_words(std::vector<std::string>{"0.3", corpus.a, "0.7", corpus.b}, "--data-path");
  options.sources.split = "969, 30, 1";
  options.dataset.random_seed = 1234;
  options.dataset.sequence_length = 16;
  options.dataset.tokenizer = megatron_tokenizer_identifiers(
      tokenizer_options("GPT2BPETokenizer", "/data/gpt2-vocab.json", "/data/gpt2-merges.txt", 0, "", 0));
  options.dataset.cache_path = cache_path;
  options.num_threads = 2;
  options.why_needed = {"WHY-TRAIN", "WHY-VALID", "WHY-TEST"};
  return options;
}

std::map<std::string, std::filesystem::file_time_type> listing(const std::filesystem::path& directory) {
  std::map<std::string, std::filesystem::file_time_type> files;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    files[entry.path().filename().string()] = entry.last_write_time();
  }
  return files;
}

template <typename T>
std::vector<T> read_npy(const std::filesystem::path& path) {
  NpyArray array(path);
  std::vector<T> values(static_cast<size_t>(array.size()));
  for (int64_t i = 0; i < array.size(); ++i) values[static_cast<size_t>(i)] = static_cast<T>(array[i]);
  return values;
}

}  // namespace

TEST_CASE("descriptions are written as Python's json.dumps(indent=4) writes them") {
  // Each expected text is what CPython 3's json.dumps gives for the same value.
  nlohmann::ordered_json value;
  value["a"] = "\xc3\xa9\xf0\x9f\x98\x80\x7f\x01\t\"\\/";  // é, 😀, DEL, U+0001, tab, quote, backslash, slash
  value["b"] = nlohmann::ordered_json::array();
  value["c"] = nlohmann::ordered_json::object();
  value["d"] = nlohmann::ordered_json::array({nullptr, true, 1, nlohmann::ordered_json::array({2})});
  CHECK(python_json_text(value) == R"({
    "a": "\u00e9\ud83d\ude00\u007f\u0001\t\"\\/",
    "b": [],
    "c": {},
    "d": [
        null,
        true,
        1,
        [
            2
        ]
    ]
})");
  // Floats as float.__repr__: positional from 1e-4 up to 1e16 (exclusive), ".0" when integral.
  const std::vector<std::pair<double, const char*>> floats = {
      {1e-05, "1e-05"}, {1e-4, "0.0001"}, {1e15, "1000000000000000.0"}, {1e16, "1e+16"},
      {0.1 + 0.2, "0.30000000000000004"}, {-0.0, "-0.0"}, {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"}, {123.456, "123.456"}, {1e22, "1e+22"},
      {12345678901234567.0, "1.2345678901234568e+16"}, {0.001, "0.001"}, {2.5e-5, "2.5e-05"},
      {1.0, "1.0"}, {0.969 + 0.03, "0.999"}, {-1.5, "-1.5"}, {100.0, "100.0"}};
  for (const auto& entry : floats) {
    const auto& [number, text] = entry;
    CAPTURE(entry.second);
    CHECK(python_json_text(number) == text);
  }
  CHECK(python_json_text(int64_t{-7}) == "-7");
  CHECK(python_json_text(uint64_t{4294967295}) == "4294967295");
  // A path that is not UTF-8 reaches Python as surrogate escapes, which json writes as \udcXX;
  // a truncated sequence escapes each of its bytes.
  CHECK(python_json_text("a\xff" "b") == R"("a\udcffb")");
  CHECK(python_json_text("\xe2\x82" "A") == R"("\udce2\udc82A")");
  CHECK(python_json_text("\xed\xa0\x80") == R"("\udced\udca0\udc80")");  // an encoded surrogate
}

TEST_CASE("the tokenizer entry is the unique_identifiers of Megatron's tokenizer for each type") {
  const auto entry = [](const TokenizerOptions& options) {
    return python_json_text(megatron_tokenizer_identifiers(options));
  };
  CHECK(entry(tokenizer_options("GPT2BPETokenizer", "gpt2-vocab.json", "gpt2-merges.txt", 0, "", 0)) == R"({
    "class": "_GPT2BPETokenizer",
    "tokenizer_path": [
        "gpt2-vocab.json",
        "gpt2-merges.txt"
    ]
})");
  // _NullTokenizer(vocab_size) passes None as its path and str(vocab_size) as its option.
  CHECK(entry(tokenizer_options("NullTokenizer", "", "", 65000, "", 0)) == R"({
    "class": "_NullTokenizer",
    "tokenizer_path": [
        null
    ],
    "vocab_size": "65000"
})");
  CHECK(entry(tokenizer_options("Llama2Tokenizer", "", "", 0, "/m/tokenizer.model", 0)) == R"({
    "class": "_Llama2Tokenizer",
    "tokenizer_path": [
        "/m/tokenizer.model"
    ],
    "vocab_extra_ids": "0"
})");
  CHECK(entry(tokenizer_options("GPTSentencePieceTokenizer", "", "", 0, "sp.model", 5)) == R"({
    "class": "_GPTSentencePieceTokenizer",
    "tokenizer_path": [
        "sp.model"
    ],
    "vocab_extra_ids": "0"
})");
  CHECK(entry(tokenizer_options("SentencePieceTokenizer", "", "", 0, "sp.model", 100)) == R"({
    "class": "_SentencePieceTokenizer",
    "tokenizer_path": [
        "sp.model"
    ],
    "vocab_extra_ids": "100"
})");
  CHECK_THROWS_WITH_AS(entry(tokenizer_options("TikTokenizer", "", "", 0, "", 0)), doctest::Contains("--tokenizer-type TikTokenizer"),
                       common::Error);
}

TEST_CASE("a split matrix whose first split is empty starts the second at the float 0.0") {
  // Megatron's bookends for "0,1,0" are [0, 0.0, 1.0, 1.0]: the first row is None, the second
  // (0.0, 1.0), written [0.0, 1.0] (only the very first bookend is the int 0).
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "d").string();
  write_fixture_dataset(prefix, random_lengths(20, 5, 40, 3));
  GptDatasetConfig config;
  config.sequence_length = 8;
  config.split = "0,1,0";
  config.split_matrix = split_matrix_from_vector(parse_split("0,1,0"));
  config.tokenizer = megatron_tokenizer_identifiers(tokenizer_options("NullTokenizer", "", "", 100, "", 0));
  config.cache_path = (directory.path / "cache").string();
  const GptDataset dataset(std::make_shared<const IndexedDataset>(prefix), prefix, 0, 20, 10,
                           Split::validation, config);
  const std::string expected = replace_all(R"({
    "class": "GPTDataset",
    "dataset_path": "@PATH@",
    "num_samples": 10,
    "index_split": "valid",
    "random_seed": 1234,
    "sequence_length": 8,
    "split": "0,1,0",
    "split_matrix": [
        null,
        [
            0.0,
            1.0
        ],
        null
    ],
    "tokenizer": {
        "class": "_NullTokenizer",
        "tokenizer_path": [
            null
        ],
        "vocab_size": "100"
    }
})", "@PATH@", prefix);
  CHECK(dataset.description_hash() == common::md5_hex(expected));
  CHECK(read_file(directory.path / "cache" /
                  (common::md5_hex(expected) + "-GPTDataset-valid-description.txt")) == expected);
}

TEST_CASE("a blend's cache files carry Megatron's names, from Megatron's descriptions") {
  DescribedCorpus corpus;
  TemporaryDirectory cache;
  const auto built = build_gpt_datasets(blend_options(corpus, cache.path.string()), {100, 0, 0});
  REQUIRE(built[0]);
  const BlendedDataset& blend = *built[0]->blend();
  REQUIRE(blend.datasets().size() == 2);

  const std::string gpt_a = replace_all(replace_all(kMegatronGptDescription, "@PATH@", corpus.a), "@SAMPLES@", "31");
  const std::string gpt_b = replace_all(replace_all(kMegatronGptDescription, "@PATH@", corpus.b), "@SAMPLES@", "71");
  const std::string blended = replace_all(replace_all(kMegatronBlendDescription, "@A@", corpus.a), "@B@", corpus.b);
  CHECK(blend.datasets()[0]->description_hash() == common::md5_hex(gpt_a));
  CHECK(blend.datasets()[1]->description_hash() == common::md5_hex(gpt_b));
  CHECK(blend.description_hash() == common::md5_hex(blended));

  // Exactly Megatron's file names, and the descriptions in them are Megatron's text.
  std::vector<std::string> expected_names;
  for (const std::string& description : {gpt_a, gpt_b}) {
    for (const char* suffix : {"description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy"}) {
      expected_names.push_back(common::md5_hex(description) + "-GPTDataset-train-" + suffix);
    }
  }
  for (const char* suffix : {"description.txt", "dataset_index.npy", "dataset_sample_index.npy"}) {
    expected_names.push_back(common::md5_hex(blended) + "-BlendedDataset-train-" + suffix);
  }
  std::vector<std::string> names;
  for (const auto& [name, time] : listing(cache.path)) names.push_back(name);
  std::sort(expected_names.begin(), expected_names.end());
  CHECK(names == expected_names);
  CHECK(read_file(cache.path / (common::md5_hex(gpt_a) + "-GPTDataset-train-description.txt")) ==
        gpt_a);
  CHECK(read_file(cache.path /
                  (common::md5_hex(blended) + "-BlendedDataset-train-description.txt")) == blended);
}

TEST_CASE("a cache laid out under Megatron's names is read, not rebuilt") {
  DescribedCorpus corpus;
  TemporaryDirectory ours;
  const auto built = build_gpt_datasets(blend_options(corpus, ours.path.string()), {100, 0, 0});
  REQUIRE(built[0]);
  const BlendedDataset& original = *built[0]->blend();
  for (const auto& dataset : original.datasets()) CHECK(dataset->built_anew());

  // The directory Megatron would have written: the arrays under the names Megatron's hashes give,
  // Megatron's description text beside them, and a marker in each so that reading them shows:
  // every shuffle index reversed, and the blend's first entry swapped with the first entry that
  // names the other dataset.
  TemporaryDirectory megatron;
  const std::vector<std::string> descriptions = {
      replace_all(replace_all(kMegatronGptDescription, "@PATH@", corpus.a), "@SAMPLES@", "31"),
      replace_all(replace_all(kMegatronGptDescription, "@PATH@", corpus.b), "@SAMPLES@", "71")};
  for (size_t d = 0; d < 2; ++d) {
    const std::string from = (ours.path / (original.datasets()[d]->description_hash() + "-GPTDataset-train-")).string();
    const std::string to = (megatron.path / (common::md5_hex(descriptions[d]) + "-GPTDataset-train-")).string();
    std::filesystem::copy_file(from + "document_index.npy", to + "document_index.npy");
    std::filesystem::copy_file(from + "sample_index.npy", to + "sample_index.npy");
    auto shuffle = read_npy<uint32_t>(from + "shuffle_index.npy");
    std::reverse(shuffle.begin(), shuffle.end());
    const std::vector<int64_t> shape = {static_cast<int64_t>(shuffle.size())};
    write_npy<uint32_t>(to + "shuffle_index.npy", shuffle, shape);
    std::ofstream(to + "description.txt", std::ios::binary) << descriptions[d];
  }
  const std::string blended = replace_all(replace_all(kMegatronBlendDescription, "@A@", corpus.a), "@B@", corpus.b);
  {
    const std::string from = (ours.path / (original.description_hash() + "-BlendedDataset-train-")).string();
    const std::string to = (megatron.path / (common::md5_hex(blended) + "-BlendedDataset-train-")).string();
    auto dataset_index = read_npy<int16_t>(from + "dataset_index.npy");
    auto sample_index = read_npy<int64_t>(from + "dataset_sample_index.npy");
    const auto other = std::find_if(dataset_index.begin(), dataset_index.end(),
                                    [&](int16_t d) { return d != dataset_index[0]; }) - dataset_index.begin();
    REQUIRE(other < static_cast<std::ptrdiff_t>(dataset_index.size()));
    std::swap(dataset_index[0], dataset_index[static_cast<size_t>(other)]);
    std::swap(sample_index[0], sample_index[static_cast<size_t>(other)]);
    const std::vector<int64_t> shape = {static_cast<int64_t>(dataset_index.size())};
    write_npy<int16_t>(to + "dataset_index.npy", dataset_index, shape);
    write_npy<int64_t>(to + "dataset_sample_index.npy", sample_index, shape);
    std::ofstream(to + "description.txt", std::ios::binary) << blended;
  }
  // An old modification time on every file: a rewrite would show.
  const auto long_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(24 * 365);
  for (const auto& entry : std::filesystem::directory_iterator(megatron.path)) {
    std::filesystem::last_write_time(entry.path(), long_ago);
  }
  const auto before = listing(megatron.path);
  REQUIRE(before.size() == 11);

  const auto reused = build_gpt_datasets(blend_options(corpus, megatron.path.string()), {100, 0, 0});
  REQUIRE(reused[0]);
  const BlendedDataset& blend = *reused[0]->blend();
  CHECK(listing(megatron.path) == before);  // nothing written, nothing added
  std::vector<int32_t> got(17), expected(17);
  for (size_t d = 0; d < 2; ++d) {
    const GptDataset& dataset = *blend.datasets()[d];
    CHECK_FALSE(dataset.built_anew());
    REQUIRE(dataset.size() == original.datasets()[d]->size());
    for (int64_t i = 0; i < dataset.size(); i += 7) {  // the reversed shuffle index was read
      dataset.sample(i, got);
      original.datasets()[d]->sample(dataset.size() - 1 - i, expected);
      CHECK(got == expected);
    }
  }
  // The swapped blend entries were read.
  int64_t other = 1;
  while (original.source(other).first == original.source(0).first) ++other;
  CHECK(blend.source(0) == original.source(other));
  CHECK(blend.source(other) == original.source(0));
  CHECK(blend.source(other + 1) == original.source(other + 1));
}
