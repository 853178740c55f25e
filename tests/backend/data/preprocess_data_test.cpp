// preprocess_data: byte-identical to golden outputs made by an independent transcription of
// Megatron's preprocess_data.py + IndexedDatasetBuilder (tests/data/tools/
// megatron_preprocess_reference.py) for any worker count and batch size; compressed inputs;
// bad lines counted with line numbers (fatal with --strict, leaving no output files);
// invalid UTF-8 replaced; Megatron's progress line; --merge equal to preprocessing the
// concatenated input; flag errors.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/compressors.hpp"
#include "backend/data/gpt2_bpe_tokenizer.hpp"
#include "backend/data/indexed_dataset.hpp"
#include "backend/data/preprocess_data.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using namespace backend;
using test_support::kTestData;
using test_support::TemporaryDirectory;

namespace {

using test_support::directory_entries;
using test_support::gzip;
using test_support::read_file;
using test_support::write_file;
using test_support::xz;
using test_support::zstd;

PreprocessOptions gpt2_options(std::vector<std::string> inputs, std::string output_prefix) {
  PreprocessOptions options;
  options.inputs = std::move(inputs);
  options.output_prefix = std::move(output_prefix);
  options.tokenizer = {.tokenizer_type = "GPT2BPETokenizer",
                       .vocab_file = kTestData + "/gpt2-vocab.json",
                       .merge_file = kTestData + "/gpt2-merges.txt",
                       .vocab_size = 0,
                       .tokenizer_model = "",
                       .vocab_extra_ids = 0};
  options.append_eod = true;
  return options;
}

PreprocessSummary run(const PreprocessOptions& options, std::string* err_text = nullptr) {
  std::ostringstream out, err;
  PreprocessSummary summary = preprocess_data(options, out, err);
  if (err_text != nullptr) *err_text = err.str();
  return summary;
}

// Every token of a dataset, its sequences one after another.
std::vector<int32_t> all_tokens(const IndexedDataset& dataset) {
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < dataset.sequence_count(); ++i) {
    std::vector<int32_t> sequence(static_cast<size_t>(dataset.sequence_length(i)));
    dataset.read_tokens(i, 0, sequence);
    tokens.insert(tokens.end(), sequence.begin(), sequence.end());
  }
  return tokens;
}

}  // namespace

TEST_CASE("preprocess_data output is byte-identical to Megatron's for every worker count") {
  TemporaryDirectory directory;
  for (const int workers : {1, 3}) {
    for (const int64_t batch_bytes : {int64_t{64}, int64_t{1} << 20}) {
      CAPTURE(workers);
      CAPTURE(batch_bytes);
      const std::string prefix = (directory.path / "sample").string();
      PreprocessOptions options = gpt2_options({kTestData + "/preprocess_sample.jsonl"}, prefix);
      options.json_keys = {"text", "title"};
      options.workers = workers;
      options.batch_bytes = batch_bytes;
      const PreprocessSummary summary = run(options);
      CHECK(summary.documents == 15);
      CHECK(summary.bad_lines == 0);
      REQUIRE(summary.outputs.size() == 2);
      CHECK(summary.outputs[0].empty_documents == 2);
      for (const char* key : {"text", "title"}) {
        for (const char* extension : {".bin", ".idx"}) {
          const std::string name = std::string("sample_") + key + "_document" + extension;
          CHECK_MESSAGE(
              read_file(directory.path / name) == read_file(kTestData + "/preprocess_" + name),
              name);
        }
      }
    }
  }
}

TEST_CASE("--workers above the cores this process may use runs that many, says so, same output") {
  // Scripts pass a node's core count to tasks given fewer cores: neither refused nor silent.
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "sample").string();
  PreprocessOptions options = gpt2_options({kTestData + "/preprocess_sample.jsonl"}, prefix);
  options.workers = available_cores() + 7;
  std::string err;
  run(options, &err);
  CHECK_MESSAGE(err.find(fmt::format("--workers {}: this process may run on {} cores; using {} workers",
                                     options.workers, available_cores(), available_cores())) !=
                    std::string::npos,
                err);
  CHECK(read_file(directory.path / "sample_text_document.bin") ==
        read_file(kTestData + "/preprocess_sample_text_document.bin"));
  options.workers = kMaxWorkers + 1;
  CHECK_THROWS_WITH_AS(run(options), doctest::Contains("--workers must lie in [1, 1024], got 1025"),
                       common::Error);
}

TEST_CASE("gzip, zstd and xz inputs give the same output as plain text") {
  TemporaryDirectory directory;
  const std::string text = read_file(kTestData + "/preprocess_sample.jsonl");
  write_file(directory.path / "plain.jsonl", text);
  write_file(directory.path / "sample.jsonl.gz", gzip(text.substr(0, 500)) + gzip(text.substr(500)));
  write_file(directory.path / "sample.jsonl.zst", zstd(text));
  write_file(directory.path / "sample.jsonl.xz", xz(text));
  run(gpt2_options({(directory.path / "plain.jsonl").string()}, (directory.path / "plain").string()));
  const std::string expected = read_file(directory.path / "plain_text_document.bin");
  CHECK(expected == read_file(kTestData + "/preprocess_sample_text_document.bin"));
  for (const char* name : {"sample.jsonl.gz", "sample.jsonl.zst", "sample.jsonl.xz"}) {
    CAPTURE(name);
    const std::string prefix = (directory.path / (std::string(name) + ".out")).string();
    run(gpt2_options({(directory.path / name).string()}, prefix));
    CHECK(read_file(prefix + "_text_document.bin") == expected);
    CHECK(read_file(prefix + "_text_document.idx") ==
          read_file(directory.path / "plain_text_document.idx"));
  }
  // Damaged compressed data names the file.
  std::string truncated = gzip(text);
  truncated.resize(truncated.size() / 2);
  write_file(directory.path / "truncated.gz", truncated);
  CHECK_THROWS_WITH_AS(run(gpt2_options({(directory.path / "truncated.gz").string()},
                                        (directory.path / "t").string())),
                       doctest::Contains("truncated.gz: the gzip data ends early"), common::Error);
  std::string corrupt = zstd(text);
  corrupt[4] = static_cast<char>(corrupt[4] | 0x08);  // a reserved bit of the frame header
  write_file(directory.path / "corrupt.zst", corrupt);
  CHECK_THROWS_WITH_AS(run(gpt2_options({(directory.path / "corrupt.zst").string()},
                                        (directory.path / "c").string())),
                       doctest::Contains("corrupt.zst: corrupt zstd data"), common::Error);
  std::string cut = zstd(text);
  cut.resize(cut.size() - 10);
  write_file(directory.path / "cut.zst", cut);
  CHECK_THROWS_WITH_AS(run(gpt2_options({(directory.path / "cut.zst").string()},
                                        (directory.path / "z").string())),
                       doctest::Contains("cut.zst: the zstd data ends early"), common::Error);
  std::string cut_xz = xz(text);
  cut_xz.resize(cut_xz.size() - 10);
  write_file(directory.path / "cut.xz", cut_xz);
  CHECK_THROWS_WITH_AS(run(gpt2_options({(directory.path / "cut.xz").string()},
                                        (directory.path / "x").string())),
                       doctest::Contains("cut.xz"), common::Error);
}

TEST_CASE("bad lines are skipped and reported with their line numbers, and --strict stops") {
  TemporaryDirectory directory;
  const auto input = directory.path / "mixed.jsonl";
  write_file(input,
             "{\"text\": \"good one\"}\n"
             "{\"text\": 5}\n"
             "not json\n"
             "\n"
             "{\"other\": \"x\"}\n"
             "[\"an array\"]\n"
             "{\"text\": [\"a\", 3]}\n"
             "{\"text\": \"caf\xE9 latin-1\"}\n"
             "{\"text\": \"good two\"}");  // no final newline
  const std::string prefix = (directory.path / "out").string();
  std::string err;
  const PreprocessSummary summary = run(gpt2_options({input.string()}, prefix), &err);
  CHECK(summary.documents == 8);  // the blank line is not a document
  CHECK(summary.bad_lines == 5);
  CHECK(summary.repaired_lines == 1);
  CHECK(summary.outputs[0].documents == 3);
  CHECK(err.find(input.string() + ":2: skipped: key \"text\" is a number") != std::string::npos);
  CHECK(err.find(input.string() + ":3: skipped: invalid JSON") != std::string::npos);
  CHECK(err.find(input.string() + ":5: skipped: no key \"text\"") != std::string::npos);
  CHECK(err.find(input.string() + ":6: skipped: array is not a JSON object") != std::string::npos);
  CHECK(err.find(input.string() + ":7: skipped: key \"text\" is a list with a non-string item") !=
        std::string::npos);
  CHECK(err.find("Skipped 5 bad lines.") != std::string::npos);
  CHECK(err.find("1 line had invalid UTF-8, replaced by U+FFFD.") != std::string::npos);

  // The kept documents hold exactly their tokens and eod; the Latin-1 byte became U+FFFD.
  Gpt2BpeTokenizer tokenizer(kTestData + "/gpt2-vocab.json", kTestData + "/gpt2-merges.txt");
  std::vector<int32_t> expected;
  for (const char* text : {"good one", "caf\xEF\xBF\xBD latin-1", "good two"}) {
    tokenizer.tokenize(text, expected);
    expected.push_back(tokenizer.eod());
  }
  CHECK(all_tokens(IndexedDataset(prefix + "_text_document")) == expected);

  // --strict: the first bad line is fatal and no output file is left.
  TemporaryDirectory strict_directory;
  PreprocessOptions strict = gpt2_options({input.string()}, (strict_directory.path / "out").string());
  strict.strict = true;
  const std::string strict_message = input.string() + ":2: key \"text\" is a number";
  CHECK_THROWS_WITH_AS(run(strict), doctest::Contains(strict_message.c_str()), common::Error);
  CHECK(directory_entries(strict_directory.path).empty());
}

TEST_CASE("a line over --max-line-bytes is a bad line, read through without being kept") {
  // A 256 MB line once took 1.1 GB (and from a pipe, minutes: the newline search went over all
  // the bytes held after every read).
  TemporaryDirectory directory;
  const std::string long_text = "{\"text\": \"" + std::string(300, 'x') + "\"}";
  const auto input = directory.path / "long.jsonl";
  write_file(input, long_text + "\n{\"text\": \"good one\"}\n" + long_text +
                        "\n{\"text\": \"good two\"}\n" + long_text);  // the last: no newline
  Gpt2BpeTokenizer tokenizer(kTestData + "/gpt2-vocab.json", kTestData + "/gpt2-merges.txt");
  std::vector<int32_t> expected;
  for (const char* text : {"good one", "good two"}) {
    tokenizer.tokenize(text, expected);
    expected.push_back(tokenizer.eod());
  }
  for (const int64_t batch_bytes : {int64_t{16}, int64_t{100}, int64_t{1} << 20}) {
    CAPTURE(batch_bytes);
    TemporaryDirectory output;
    PreprocessOptions options = gpt2_options({input.string()}, (output.path / "out").string());
    options.batch_bytes = batch_bytes;
    options.max_line_bytes = 200;
    std::string err;
    const PreprocessSummary summary = run(options, &err);
    CHECK(summary.documents == 5);
    CHECK(summary.bad_lines == 3);
    CHECK(summary.outputs[0].documents == 2);
    CHECK(summary.input_bytes == static_cast<int64_t>(std::filesystem::file_size(input)));
    for (const int line : {1, 3, 5}) {
      const std::string expected_line = fmt::format(
          "{}:{}: skipped: the line is longer than --max-line-bytes 200", input.string(), line);
      CHECK(err.find(expected_line) != std::string::npos);
    }
    CHECK(all_tokens(IndexedDataset(output.path.string() + "/out_text_document")) == expected);
    // The same lines under the default limit are read.
    options.max_line_bytes = PreprocessOptions::kDefaultMaxLineBytes;
    TemporaryDirectory whole;
    options.output_prefix = (whole.path / "out").string();
    CHECK(run(options).bad_lines == 0);
  }
  // --strict stops at it.
  TemporaryDirectory strict_directory;
  PreprocessOptions strict = gpt2_options({input.string()}, (strict_directory.path / "out").string());
  strict.strict = true;
  strict.max_line_bytes = 200;
  CHECK_THROWS_WITH_AS(run(strict), doctest::Contains(":1: the line is longer than --max-line-bytes 200"),
                       common::Error);
}

TEST_CASE("JSON that parses but nlohmann refuses, and other hostile values, are bad lines too") {
  // 1e999999 overflows a double: nlohmann throws out_of_range rather than parse_error, which
  // once escaped the bad-line path and stopped the run with "internal error".
  TemporaryDirectory directory;
  const auto input = directory.path / "hostile.jsonl";
  const std::string deep_array = std::string(100000, '[') + std::string(100000, ']');
  write_file(input,
             "{\"text\": \"a\", \"n\": 1e999999}\n"
             "{\"text\": \"kept one\", \"n\": 123456789012345678901234567890}\n"
             "{\"text\": \"b\", \"n\": -1e400}\n"
             "{\"text\": \"kept two\", \"n\": " + deep_array + "}\n"
             "{\"te\xFFxt\": \"c\"}\n"
             "{\"text\": \"\\ud800\"}\n"
             "42\n"
             "\"text\"\n"
             "{\"text\": {\"text\": \"d\"}}\n"
             "{\"text\": \"kept three\"}\n");
  const std::string prefix = (directory.path / "out").string();
  std::string err;
  const PreprocessSummary summary = run(gpt2_options({input.string()}, prefix), &err);
  INFO(err);
  CHECK(summary.documents == 10);
  CHECK(summary.bad_lines == 7);
  CHECK(summary.outputs[0].documents == 3);
  CHECK(err.find(input.string() + ":1: skipped: number overflow parsing '1e999999'") != std::string::npos);
  CHECK(err.find(input.string() + ":3: skipped: number overflow parsing '-1e400'") != std::string::npos);
  CHECK(err.find(input.string() + ":5: skipped: no key \"text\"") != std::string::npos);
  CHECK(err.find(input.string() + ":6: skipped: invalid JSON") != std::string::npos);
  CHECK(err.find(input.string() + ":7: skipped: number is not a JSON object") != std::string::npos);
  CHECK(err.find(input.string() + ":8: skipped: string is not a JSON object") != std::string::npos);
  CHECK(err.find(input.string() + ":9: skipped: key \"text\" is an object") != std::string::npos);

  // --strict: the overflowing number is a clear error naming the line, not an internal one.
  TemporaryDirectory strict_directory;
  PreprocessOptions strict = gpt2_options({input.string()}, (strict_directory.path / "out").string());
  strict.strict = true;
  const std::string strict_message = input.string() + ":1: number overflow parsing '1e999999'";
  CHECK_THROWS_WITH_AS(run(strict), doctest::Contains(strict_message.c_str()), common::Error);
  CHECK(directory_entries(strict_directory.path).empty());
}

TEST_CASE("NullTokenizer documents without eod, empty documents, and Megatron's progress line") {
  TemporaryDirectory directory;
  const auto input = directory.path / "ids.jsonl";
  write_file(input,
             "{\"text\": \"1 2 3\"}\n{\"text\": \"\"}\n{\"text\": [\"4\", \"5 6\"]}\n"
             "{\"text\": \"7 x\"}\n{\"text\": \"99\"}\n");
  PreprocessOptions options;
  options.inputs = {input.string()};
  options.output_prefix = (directory.path / "ids").string();
  options.tokenizer = {.tokenizer_type = "NullTokenizer", .vocab_file = "", .merge_file = "",
                       .vocab_size = 100, .tokenizer_model = "", .vocab_extra_ids = 0};
  options.log_interval = 2;
  std::string err;
  const PreprocessSummary summary = run(options, &err);
  CHECK(summary.bad_lines == 1);  // "7 x" is not ids
  CHECK(err.find(":4: skipped: NullTokenizer: field 2 of the text, \"x\"") != std::string::npos);
  CHECK(err.find("Processed 2 documents (") != std::string::npos);
  CHECK(err.find("Processed 4 documents (") != std::string::npos);
  CHECK(err.find(" docs/s, ") != std::string::npos);
  CHECK(err.find(" MB/s).\n") != std::string::npos);
  const IndexedDataset dataset(options.output_prefix + "_text_document");
  CHECK(dataset.dtype() == DType::uint16);
  CHECK(dataset.document_count() == 4);
  CHECK(dataset.sequence_count() == 4);
  const std::vector<int64_t> documents = {dataset.document_index(0), dataset.document_index(1),
                                          dataset.document_index(2), dataset.document_index(3),
                                          dataset.document_index(4)};
  CHECK(documents == std::vector<int64_t>{0, 1, 1, 3, 4});
  const std::vector<int32_t> lengths = {dataset.sequence_length(0), dataset.sequence_length(1),
                                        dataset.sequence_length(2), dataset.sequence_length(3)};
  CHECK(lengths == std::vector<int32_t>{3, 1, 2, 1});
  std::vector<int32_t> last(1);
  dataset.read_tokens(3, 0, last);
  CHECK(last[0] == 99);
}

TEST_CASE("merging per-shard outputs equals preprocessing the shards as one input") {
  TemporaryDirectory directory;
  const std::string text = read_file(kTestData + "/preprocess_sample.jsonl");
  const size_t middle = text.find('\n', text.size() / 2) + 1;
  std::filesystem::create_directories(directory.path / "shards");
  write_file(directory.path / "a.jsonl", text.substr(0, middle));
  write_file(directory.path / "b.jsonl", text.substr(middle));
  run(gpt2_options({(directory.path / "a.jsonl").string()}, (directory.path / "shards/00").string()));
  run(gpt2_options({(directory.path / "b.jsonl").string()}, (directory.path / "shards/01").string()));
  PreprocessOptions merge;
  merge.merge = true;
  merge.inputs = {(directory.path / "shards").string()};
  merge.output_prefix = (directory.path / "merged").string();
  run(merge);
  // Both inputs in one run, in order.
  run(gpt2_options({(directory.path / "a.jsonl").string(), (directory.path / "b.jsonl").string()},
                   (directory.path / "whole").string()));
  CHECK(read_file(directory.path / "merged.bin") ==
        read_file(kTestData + "/preprocess_sample_text_document.bin"));
  CHECK(read_file(directory.path / "merged.idx") ==
        read_file(kTestData + "/preprocess_sample_text_document.idx"));
  CHECK(read_file(directory.path / "whole_text_document.idx") ==
        read_file(kTestData + "/preprocess_sample_text_document.idx"));

  // Prefixes work too, and a lone .bin is an error.
  PreprocessOptions by_prefix = merge;
  by_prefix.inputs = {(directory.path / "shards/00_text_document.idx").string(),
                      (directory.path / "shards/01_text_document").string()};
  by_prefix.output_prefix = (directory.path / "merged2").string();
  run(by_prefix);
  CHECK(read_file(directory.path / "merged2.idx") == read_file(directory.path / "merged.idx"));
  std::filesystem::remove(directory.path / "shards/01_text_document.idx");
  CHECK_THROWS_WITH_AS(run(merge), doctest::Contains("01_text_document.bin has no"), common::Error);
}

TEST_CASE("--merge refuses datasets of two dtypes, an empty directory and a lone .idx") {
  TemporaryDirectory directory;
  const auto shards = directory.path / "shards";
  std::filesystem::create_directories(shards);
  PreprocessOptions merge;
  merge.merge = true;
  merge.inputs = {shards.string()};
  merge.output_prefix = (directory.path / "merged").string();

  // An empty directory: nothing to merge, and nothing written.
  CHECK_THROWS_WITH_AS(run(merge), doctest::Contains("holds no .bin/.idx pairs"), common::Error);
  CHECK(!std::filesystem::exists(directory.path / "merged.bin"));

  // uint16 (a small vocabulary) beside int32 (a large one): both files are named, and the
  // output is not created.
  const std::vector<int32_t> tokens = {1, 2, 3};
  const std::vector<int32_t> lengths = {3};
  for (const auto& [name, dtype] : {std::pair{"a", DType::uint16}, std::pair{"b", DType::int32}}) {
    IndexedDatasetWriter writer((shards / name).string(), dtype);
    writer.add_document(tokens, lengths);
    writer.finalize();
  }
  const std::string both_named = fmt::format("{}.idx holds int32 tokens but {}.idx holds uint16",
                                             (shards / "b").string(), (shards / "a").string());
  CHECK_THROWS_WITH_AS(run(merge), doctest::Contains(both_named.c_str()), common::Error);
  CHECK(!std::filesystem::exists(directory.path / "merged.bin"));
  CHECK(!std::filesystem::exists(directory.path / "merged.idx"));

  // Both uint16: merged, documents and tokens concatenated in name order.
  std::filesystem::remove(shards / "b.bin");
  std::filesystem::remove(shards / "b.idx");
  {
    IndexedDatasetWriter writer((shards / "b").string(), DType::uint16);
    const std::vector<int32_t> more = {7, 8};
    const std::vector<int32_t> more_lengths = {2};
    writer.add_document(more, more_lengths);
    writer.finalize();
  }
  run(merge);
  IndexedDataset merged(merge.output_prefix);
  CHECK(merged.document_count() == 2);
  CHECK(merged.sequence_pointer(1) == 6);  // after a's three uint16 tokens
  std::vector<int32_t> second(2);
  merged.read_tokens(1, 0, second);
  CHECK(second == std::vector<int32_t>{7, 8});

  // An .idx whose .bin is missing.
  std::filesystem::remove(shards / "a.bin");
  CHECK_THROWS_WITH_AS(run(merge), doctest::Contains("a.idx has no"), common::Error);
}

TEST_CASE("preprocess_data takes older Megatron's --vocab and argparse's abbreviations") {
  const auto parse = [](std::vector<const char*> arguments) {
    arguments.insert(arguments.begin(), "preprocess_data");
    return parse_preprocess_arguments(static_cast<int>(arguments.size()), arguments.data());
  };
  // Megatron's README command (preprocess_data.py had no other --vocab* flag then).
  const auto readme = parse({"--input", "my-corpus.json", "--output-prefix", "my-gpt2", "--vocab",
                             "gpt2-vocab.json", "--dataset-impl", "mmap", "--tokenizer-type",
                             "GPT2BPETokenizer", "--merge-file", "gpt2-merges.txt", "--append-eod"});
  REQUIRE(readme);
  CHECK(readme->tokenizer.vocab_file == "gpt2-vocab.json");
  const auto short_flags = parse({"--inp", "a.jsonl", "--output=o", "--tokenizer-t",
                                  "NullTokenizer", "--vocab-s", "100", "--json", "text"});
  REQUIRE(short_flags);
  CHECK(short_flags->inputs == std::vector<std::string>{"a.jsonl"});
  CHECK(short_flags->output_prefix == "o");
  CHECK(short_flags->tokenizer.vocab_size == 100);
  CHECK_THROWS_WITH_AS(parse({"--input", "a", "--output-prefix", "o", "--tokenizer-type",
                              "NullTokenizer", "--vocab-", "100"}),
                       "preprocess_data: ambiguous option: --vocab- could match --vocab-file, "
                       "--vocab-size, --vocab-extra-ids",
                       common::Error);
  // A refused flag's prefix is refused as the flag.
  CHECK_THROWS_WITH_AS(parse({"--input", "a", "--output-prefix", "o", "--tokenizer-type",
                              "GPT2BPETokenizer", "--split-sent"}),
                       doctest::Contains("--split-sentences is not supported: sentence splitting"),
                       common::Error);
}

TEST_CASE("preprocess_data flags: Megatron's names, refused ones with a reason") {
  const auto parse = [](std::vector<const char*> arguments) {
    arguments.insert(arguments.begin(), "preprocess_data");
    return parse_preprocess_arguments(static_cast<int>(arguments.size()), arguments.data());
  };
  const std::string workers = std::to_string(std::min(2, available_cores()));
  const auto options = parse({"--input", "a.jsonl", "b.jsonl.gz", "--output-prefix", "out",
                              "--json-keys", "text", "title", "--tokenizer-type",
                              "GPT2BPETokenizer", "--vocab-file", "v.json", "--merge-file",
                              "m.txt", "--append-eod", "--workers", workers.c_str(), "--log-interval", "10",
                              "--dataset-impl", "mmap", "--partitions", "2"});
  REQUIRE(options.has_value());
  CHECK(options->inputs == std::vector<std::string>{"a.jsonl", "b.jsonl.gz"});
  CHECK(options->json_keys == std::vector<std::string>{"text", "title"});
  CHECK(options->append_eod);
  CHECK(options->workers == std::min(2, available_cores()));
  CHECK(options->log_interval == 10);
  CHECK_THROWS_WITH_AS(parse({"--input", "a", "--output-prefix", "o", "--tokenizer-type",
                              "GPT2BPETokenizer", "--split-sentences"}),
                       doctest::Contains("--split-sentences is not supported: sentence splitting"),
                       common::Error);
  CHECK_THROWS_WITH_AS(parse({"--input", "a", "--output-prefix", "o", "--tokenizer-type",
                              "GPT2BPETokenizer", "--append-eos"}),
                       doctest::Contains("unknown argument --append-eos Did you mean '--append-eod'?"), common::Error);
  CHECK_THROWS_WITH_AS(parse({"--input", "a", "--output-prefix", "o"}),
                       doctest::Contains("--tokenizer-type is required"), common::Error);
  CHECK_THROWS_WITH_AS(parse({"--input", "a", "--output-prefix", "o", "--tokenizer-type",
                              "GPT2BPETokenizer", "--dataset-impl", "lazy"}),
                       doctest::Contains("only mmap"), common::Error);
  CHECK_THROWS_WITH_AS(parse({"--input", "a", "--output-prefix", "o", "--tokenizer-type",
                              "GPT2BPETokenizer", "--workers", "0"}),
                       doctest::Contains("--workers: '0' is out of range; --workers takes an integer in [1, 1024]"), common::Error);
  CHECK_THROWS_WITH_AS(parse({"--input", "a", "--output-prefix", "o", "--tokenizer-type",
                              "GPT2BPETokenizer", "--json-keys", "text", "text"}),
                       doctest::Contains("lists \"text\" twice"), common::Error);
  CHECK(parse({"--merge", "--input", "dir", "--output-prefix", "o"}).has_value());
  // --remove-input (ours, NeMo's rm_extracted): JSONL inputs only.
  const auto removing = parse({"--input", "a", "--output-prefix", "o", "--tokenizer-type", "NullTokenizer",
                               "--vocab-size", "10", "--remove-input"});
  REQUIRE(removing.has_value());
  CHECK(removing->remove_inputs);
  CHECK_FALSE(options->remove_inputs);
  CHECK_THROWS_WITH_AS(parse({"--merge", "--input", "dir", "--output-prefix", "o", "--remove-input"}),
                       doctest::Contains("--remove-input deletes JSONL inputs after tokenizing them; it does "
                                         "not apply to --merge"),
                       common::Error);
}

TEST_CASE("preprocess_data flags of the SentencePiece tokenizers") {
  const auto parse = [](std::vector<const char*> arguments) {
    arguments.insert(arguments.begin(), {"preprocess_data", "--input", "a.jsonl",
                                         "--output-prefix", "out"});
    return parse_preprocess_arguments(static_cast<int>(arguments.size()), arguments.data());
  };
  const auto llama = parse({"--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model",
                            "tokenizer.model", "--append-eod"});
  REQUIRE(llama.has_value());
  CHECK(llama->tokenizer.tokenizer_type == "Llama2Tokenizer");
  CHECK(llama->tokenizer.tokenizer_model == "tokenizer.model");
  const auto extra = parse({"--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model",
                            "t.model", "--vocab-extra-ids", "100"});
  REQUIRE(extra.has_value());
  CHECK(extra->tokenizer.vocab_extra_ids == 100);
  CHECK_THROWS_WITH_AS(parse({"--tokenizer-type", "GPTSentencePieceTokenizer"}),
                       doctest::Contains("--tokenizer-type GPTSentencePieceTokenizer needs "
                                         "--tokenizer-model"),
                       common::Error);
  CHECK_THROWS_WITH_AS(parse({"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v.json",
                              "--merge-file", "m.txt", "--tokenizer-model", "t.model"}),
                       doctest::Contains("--tokenizer-model t.model is read only by the "
                                         "SentencePiece and HuggingFace tokenizers"),
                       common::Error);
  CHECK_THROWS_WITH_AS(parse({"--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model",
                              "t.model", "--vocab-extra-ids", "2"}),
                       doctest::Contains("--vocab-extra-ids 2 is not supported with "
                                         "--tokenizer-type Llama2Tokenizer"),
                       common::Error);
  // The model file is read when the run starts, and a missing one named there.
  TemporaryDirectory directory;
  const std::filesystem::path input = directory.path / "in.jsonl";
  write_file(input, "{\"text\": \"x\"}\n");
  PreprocessOptions options;
  options.inputs = {input.string()};
  options.output_prefix = (directory.path / "out").string();
  options.tokenizer = {.tokenizer_type = "Llama2Tokenizer", .vocab_file = "", .merge_file = "",
                       .vocab_size = 0, .tokenizer_model = (directory.path / "no.model").string(),
                       .vocab_extra_ids = 0};
  CHECK_THROWS_WITH_AS(run(options), doctest::Contains("cannot read --tokenizer-model "),
                       common::Error);
}

TEST_CASE("preprocess_data's numeric flags and output paths are checked before anything is written") {
  TemporaryDirectory directory;
  const auto parse = [](std::vector<std::string> arguments) {
    std::vector<const char*> argv = {"preprocess_data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "10"};
    for (const auto& argument : arguments) argv.push_back(argument.c_str());
    return parse_preprocess_arguments(static_cast<int>(argv.size()), argv.data());
  };
  struct Case {
    std::vector<std::string> arguments;
    std::string message;
  };
  for (const auto& [arguments, message] : std::vector<Case>{
           // --workers 100000 used to start 100000 threads of a few MB each, until the kernel
           // killed the process.
           {{"--workers", "100000"}, "--workers: '100000' is out of range; --workers takes an integer in [1, 1024]"},
           {{"--workers", "-1"}, "--workers: '-1' is out of range; --workers takes an integer in [1, 1024]"},
           {{"--workers", "nan"}, "--workers: 'nan' is not an integer; --workers takes an integer in [1, 1024]"},
           {{"--log-interval", "0"}, "--log-interval: '0' is out of range; --log-interval takes an integer ≥ 1"},
           {{"--partitions", "-3"}, "--partitions: '-3' is out of range; --partitions takes an integer in [1, 2147483647]"},
           {{"--vocab-size", "99999999999999999999"}, "--vocab-size: '99999999999999999999' is larger than any integer this backend counts in; --vocab-size takes an integer in [1, 2147483646]"},
           {{"--vocab-size", "0"}, "--vocab-size: '0' is out of range; --vocab-size takes an integer in [1, 2147483646]"},
           {{"--vocab-extra-ids", "1e3"}, "--vocab-extra-ids: '1e3' is not an integer"},
           {{"--max-line-bytes", "0"}, "--max-line-bytes: '0' is out of range; --max-line-bytes takes an integer in [1, 1099511627776]"},
       }) {
    // A copy: clang 14 (the asan preset) cannot refer to a structured binding in CAPTURE's lambda.
    const auto& captured_message = message;
    CAPTURE(captured_message);
    std::vector<std::string> argv = {"--input", "a.jsonl", "--output-prefix", "o"};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    CHECK_THROWS_WITH_AS(parse(argv), doctest::Contains(message.c_str()), common::Error);
  }
  CHECK(parse({"--input", "a.jsonl", "--output-prefix", "o", "--workers", "1024"})->workers == 1024);
  CHECK(parse({"--input", "a.jsonl", "--output-prefix", "o"})->max_line_bytes == int64_t{64} << 20);
  CHECK(parse({"--input", "a.jsonl", "--output-prefix", "o", "--max-line-bytes", "1024"})
            ->max_line_bytes == 1024);

  // An output that is one of the inputs (by real path) would be overwritten: refused. Here the
  // "JSONL" input is a previous run's .bin, and a symbolic link leads to it too.
  const std::string prefix = (directory.path / "corpus").string();
  write_file(prefix + "_text_document.bin", "not text");
  std::filesystem::create_symlink(prefix + "_text_document.bin", directory.path / "link.jsonl");
  for (const std::string& input : {prefix + "_text_document.bin", (directory.path / "link.jsonl").string(),
                                  (directory.path / "." / "corpus_text_document.bin").string()}) {
    CAPTURE(input);
    CHECK_THROWS_WITH_AS(parse({"--input", "a.jsonl", input, "--output-prefix", prefix}),
                         doctest::Contains(("--output-prefix " + prefix + " would write " + prefix +
                                            "_text_document.bin, which is the --input " + input).c_str()),
                         common::Error);
  }
  CHECK(read_file(prefix + "_text_document.bin") == "not text");
  // --merge: an input prefix that is the output.
  CHECK_THROWS_WITH_AS(parse({"--merge", "--input", prefix + "_text_document", "--output-prefix",
                              prefix + "_text_document"}),
                       doctest::Contains("which is the --input"), common::Error);
}

TEST_CASE("an empty --output-prefix is refused, naming the flag") {
  // It used to write _text_document.bin/.idx into the current directory.
  for (const bool merge : {false, true}) {
    CAPTURE(merge);
    std::vector<const char*> argv = {"preprocess_data", "--tokenizer-type", "NullTokenizer",
                                     "--vocab-size", "10", "--input", "a.jsonl",
                                     "--output-prefix", ""};
    if (merge) argv.push_back("--merge");
    CHECK_THROWS_WITH_AS(parse_preprocess_arguments(static_cast<int>(argv.size()), argv.data()),
                         doctest::Contains("--output-prefix is empty: give the path prefix of the "
                                           "datasets to write"),
                         common::Error);
  }
}
