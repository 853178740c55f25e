// The data side of pretrain_gpt: Megatron's sample counts per split, the sources the data
// flags name, batches read from real datasets (tokens and labels shifted by one), the errors
// that name the flag to change, and the index cache under Megatron's name.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/md5.hpp"
#include "backend/train/dataset_provider.hpp"
#include "captured_log.hpp"
#include "test_files.hpp"
#include "tests/backend/data/dataset_fixture.hpp"
#include "tests/temporary_directory.hpp"

using namespace backend;

namespace {
using test_support::CapturedLog;

int count(const std::string& text, const std::string& needle) {
  int found = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++found;
  return found;
}

TrainingArguments data_arguments(const std::string& prefix) {
  TrainingArguments a;
  a.model.num_layers = 2;
  a.model.hidden_size = 32;
  a.model.num_attention_heads = 4;
  a.model.seq_length = 16;
  a.run.micro_batch_size = 2;
  a.run.global_batch_size = 4;
  a.run.train_iters = 20;
  a.optimizer.lr = 1e-3;
  a.tokenizer.tokenizer_type = "NullTokenizer";
  a.tokenizer.vocab_size = 65000;
  a.data.data_path = {prefix};
  a.data.split = "80,10,10";
  a.evaluation.eval_interval = 10;
  a.evaluation.eval_iters = 2;
  a.model.hidden_dropout = a.model.attention_dropout = 0;
  validate_arguments(a);
  return a;
}
}  // namespace

TEST_CASE("samples per split: Megatron's get_train_valid_test_num_samples") {
  TrainingArguments a;
  a.run.train_iters = 100;
  a.run.global_batch_size = 8;
  a.evaluation.eval_interval = 30;
  a.evaluation.eval_iters = 2;
  // (100 // 30 + 1) evaluations of 2 batches of 8; the test pass once.
  CHECK(train_valid_test_num_samples(a) == std::array<int64_t, 3>{800, 64, 16});
  a.run.train_samples = 1000;
  CHECK(train_valid_test_num_samples(a)[0] == 1000);
  a.evaluation.eval_iters = 0;
  CHECK(train_valid_test_num_samples(a) == std::array<int64_t, 3>{1000, 0, 0});
}

TEST_CASE("the data flags' files: data file list, data args, per-split JSON") {
  test_support::TemporaryDirectory directory;
  TrainingArguments a;
  a.data.data_file_list = (directory.path / "list.txt").string();
  std::ofstream(a.data.data_file_list) << "# weight prefix\n0.5 x\n1.5 y\n";
  auto sources = data_sources(a);
  REQUIRE(sources.blend);
  CHECK(sources.blend->prefixes == std::vector<std::string>{"x", "y"});
  CHECK(*sources.split == "969, 30, 1");

  TrainingArguments per_split;
  per_split.data.per_split_data_args_path = (directory.path / "splits.json").string();
  std::ofstream(per_split.data.per_split_data_args_path)
      << R"({"train": ["0.3", "a", "0.7", "b"], "valid": ["v"]})";
  sources = data_sources(per_split);
  CHECK_FALSE(sources.blend);
  REQUIRE(sources.blend_per_split[0]);
  CHECK(sources.blend_per_split[0]->prefixes == std::vector<std::string>{"a", "b"});
  CHECK(sources.blend_per_split[1]->prefixes == std::vector<std::string>{"v"});
  CHECK_FALSE(sources.blend_per_split[2]);

  std::ofstream(per_split.data.per_split_data_args_path) << R"({"train": "a"})";
  CHECK_THROWS_WITH_AS(data_sources(per_split), doctest::Contains("\"train\" must be a non-empty list"),
                       common::Error);
  std::ofstream(per_split.data.per_split_data_args_path) << "train: [a]";
  CHECK_THROWS_WITH_AS(data_sources(per_split), doctest::Contains("not JSON"), common::Error);
}

TEST_CASE("batches from a real dataset: Megatron's log lines, labels shifted by one") {
  test_support::TemporaryDirectory directory;
  const std::string prefix = (directory.path / "corpus_text_document").string();
  test_support::write_fixture_dataset(prefix, test_support::random_lengths(200, 1, 50, 8));
  const auto a = data_arguments(prefix);
  std::ostringstream log;
  const BatchSource source = build_dataset_batch_source(a, 65001, log);
  const std::string text = log.str();
  CHECK(text.find("> building train, validation, and test datasets ...\n"
                  " > datasets target sizes (minimum size):\n"
                  "    train:      80\n"
                  "    validation: 24\n"
                  "    test:       8\n"
                  "> building train, validation, and test datasets for GPT ...\n") == 0);
  CHECK(text.find("> finished creating GPT datasets ...") != std::string::npos);

  std::vector<int32_t> tokens(2 * 16), labels(2 * 16);
  for (Split split : {Split::train, Split::validation, Split::test}) {
    source(split, 2, 2, tokens, labels);
    for (int b = 0; b < 2; ++b) {
      for (int t = 0; t + 1 < 16; ++t) CHECK(labels[b * 16 + t] == tokens[b * 16 + t + 1]);
    }
  }
  // The same samples again: reading is deterministic.
  std::vector<int32_t> again(2 * 16), again_labels(2 * 16);
  source(Split::test, 2, 2, again, again_labels);
  CHECK(again == tokens);

  // Ids the tokenizer does not have mean the data was made with another vocabulary.
  const BatchSource narrow = build_dataset_batch_source(a, 1000, log);
  CHECK_THROWS_WITH_AS(narrow(Split::train, 0, 2, tokens, labels),
                       doctest::Contains("but the tokenizer has 1000 ids"), common::Error);
}

TEST_CASE("an empty validation split names --split and --eval-iters") {
  test_support::TemporaryDirectory directory;
  const std::string prefix = (directory.path / "small").string();
  test_support::write_fixture_dataset(prefix, test_support::random_lengths(50, 1, 50, 9));
  auto a = data_arguments(prefix);
  a.data.split = "100,0,0";
  std::ostringstream log;
  CHECK_THROWS_WITH_AS(build_dataset_batch_source(a, 65001, log),
                       doctest::Contains("--split 100,0,0 gives the validation split a share of 0, so "
                                         "the validation split has no data: validation reads 24 "
                                         "samples (--eval-iters 2 global batches of 4 at each of 3 "
                                         "evaluations); pass --eval-iters 0"),
                       common::Error);
  a.evaluation.eval_iters = 0;
  CHECK_NOTHROW(build_dataset_batch_source(a, 65001, log));
}

TEST_CASE("an empty test split is skipped with one log line, as Megatron skips it") {
  test_support::TemporaryDirectory directory;
  const std::string prefix = (directory.path / "small").string();
  test_support::write_fixture_dataset(prefix, test_support::random_lengths(200, 1, 50, 9));
  auto a = data_arguments(prefix);
  a.data.split = "98,2,0";  // with --eval-iters 2: the test pass would read 8 samples
  CapturedLog captured;
  std::ostringstream log;
  bool skipped = false;
  const BatchSource source = build_dataset_batch_source(a, 65001, log, &skipped);
  CHECK(skipped);
  CHECK(count(captured.text.str(), "test split: none") == 1);
  CHECK(captured.text.str().find("test split: none (--split 98,2,0 gives it a share of 0), so no "
                                 "test evaluation is run after training") != std::string::npos);
  std::vector<int32_t> tokens(2 * 16), labels(2 * 16);
  CHECK_NOTHROW(source(Split::train, 0, 2, tokens, labels));
  CHECK_NOTHROW(source(Split::validation, 0, 2, tokens, labels));

  // Per-split data without a test blend: the same.
  a.data.data_path.clear();
  a.data.split.clear();
  a.data.train_data_path = {prefix};
  a.data.valid_data_path = {prefix};
  skipped = false;
  (void)build_dataset_batch_source(a, 65001, log, &skipped);
  CHECK(skipped);
  CHECK(captured.text.str().find("test split: none (no test data is given: --test-data-path") !=
        std::string::npos);
  a.data.test_data_path = {prefix};
  (void)build_dataset_batch_source(a, 65001, log, &skipped);
  CHECK_FALSE(skipped);
}

TEST_CASE("the ALCF data file list's corpus column changes no sample, and is logged") {
  test_support::TemporaryDirectory directory;
  const std::string books = (directory.path / "books").string();
  const std::string web = (directory.path / "web").string();
  const std::string code = (directory.path / "code").string();
  test_support::write_fixture_dataset(books, test_support::random_lengths(100, 1, 50, 1));
  test_support::write_fixture_dataset(web, test_support::random_lengths(150, 1, 50, 2));
  test_support::write_fixture_dataset(code, test_support::random_lengths(80, 1, 50, 3));
  auto a = data_arguments(books);
  a.data.data_path.clear();
  a.data.data_file_list = (directory.path / "plain.txt").string();
  std::ofstream(a.data.data_file_list)
      << "0.2 " << books << "\n0.5 " << web << "\n0.3 " << code << "\n";
  auto alcf = a;
  alcf.data.data_file_list = (directory.path / "alcf.txt").string();
  std::ofstream(alcf.data.data_file_list)
      << "0.2 " << books << ".bin prose\n0.5 " << web << " web\n0.3 " << code << " prose\n";
  std::ostringstream log;
  const BatchSource plain_source = build_dataset_batch_source(a, 65001, log);
  CapturedLog captured;
  const BatchSource alcf_source = build_dataset_batch_source(alcf, 65001, log);
  std::vector<int32_t> tokens(4 * 16), labels(4 * 16), alcf_tokens(4 * 16), alcf_labels(4 * 16);
  for (Split split : {Split::train, Split::validation, Split::test}) {
    for (int64_t first = 0; first < 8; first += 4) {
      plain_source(split, first, 4, tokens, labels);
      alcf_source(split, first, 4, alcf_tokens, alcf_labels);
      CHECK(tokens == alcf_tokens);
    }
  }
  const std::string text = captured.text.str();
  CHECK(text.find("--data-file-list: 3 datasets in 2 corpora") != std::string::npos);
  CHECK(text.find("    prose: 2 datasets, weight 0.500000") != std::string::npos);
  CHECK(text.find("    web: 1 datasets, weight 0.500000") != std::string::npos);
}

TEST_CASE("pretrain_gpt's flags give the cache the name Megatron gives it") {
  // Megatron's description for the train split of this run, written out by hand: the prefix
  // and --split as given, seed 1234, and _NullTokenizer(65000)'s unique_identifiers. Megatron
  // names the files after its MD5, in <prefix>/cache/GPTDataset_indices/.
  test_support::TemporaryDirectory directory;
  const std::string prefix = (directory.path / "corpus_text_document").string();
  test_support::write_fixture_dataset(prefix, test_support::random_lengths(200, 1, 50, 8));
  std::ostringstream log;
  (void)build_dataset_batch_source(data_arguments(prefix), 65001, log);
  const std::string megatron = R"({
    "class": "GPTDataset",
    "dataset_path": ")" + prefix + R"(",
    "num_samples": 80,
    "index_split": "train",
    "random_seed": 1234,
    "sequence_length": 16,
    "split": "80,10,10",
    "split_matrix": [
        [
            0,
            0.8
        ],
        [
            0.8,
            0.9
        ],
        [
            0.9,
            1.0
        ]
    ],
    "tokenizer": {
        "class": "_NullTokenizer",
        "tokenizer_path": [
            null
        ],
        "vocab_size": "65000"
    }
})";
  const auto file = std::filesystem::path(prefix) / "cache" / "GPTDataset_indices" /
                    (common::md5_hex(megatron) + "-GPTDataset-train-description.txt");
  REQUIRE(std::filesystem::exists(file));
  CHECK(test_support::read_file(file) == megatron);
}
