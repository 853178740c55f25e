// Megatron's blend and split parsing: get_blend_from_list, normalize (numpy's pairwise sum),
// parse_and_normalize_split, the split matrix, Python's round() of the split bounds, and our
// --data-file-list.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/data_blend.hpp"
#include "tests/backend/data/numpy_reference.hpp"
#include "tests/temporary_directory.hpp"

using namespace backend;
using test_support::dataset_reference;
using test_support::numpy_available;
using test_support::run_command;
using test_support::TemporaryDirectory;

namespace {
std::vector<std::string> words(std::initializer_list<const char*> list) { return {list.begin(), list.end()}; }
}  // namespace

TEST_CASE("blends: one prefix, weights first, or prefixes only") {
  const auto single = blend_from_words(words({"/data/a_text_document"}), "--data-path");
  CHECK(single.prefixes == words({"/data/a_text_document"}));
  CHECK_FALSE(single.weights);

  const auto weighted = blend_from_words(words({"0.3", "a", "0.7", " b "}), "--data-path");
  CHECK(weighted.prefixes == words({"a", "b"}));
  REQUIRE(weighted.weights);
  CHECK(*weighted.weights == std::vector<double>{0.3, 0.7});

  const auto scientific = blend_from_words(words({"1e-3", "a", "30", "b"}), "--data-path");
  CHECK(*scientific.weights == std::vector<double>{1e-3, 30});
  // Weights are what Python's float() reads: underscores between digits, overflow to inf
  // (refused when normalized), and no hexadecimal (a prefix then).
  CHECK(*blend_from_words(words({"1_0", "a", "1e-400", "b"}), "--data-path").weights ==
        std::vector<double>{10, 0});
  CHECK(*blend_from_words(words({"1e400", "a", "1", "b"}), "--data-path").weights ==
        std::vector<double>{std::numeric_limits<double>::infinity(), 1});
  CHECK_FALSE(blend_from_words(words({"0x1", "a"}), "--data-path").weights);

  // An odd count, or an even one without numbers: all prefixes, blended by size.
  CHECK(blend_from_words(words({"a", "b"}), "--data-path").prefixes == words({"a", "b"}));
  CHECK_FALSE(blend_from_words(words({"a", "b", "c"}), "--data-path").weights);
  CHECK(blend_from_words(words({"1", "a", "b"}), "--data-path").prefixes == words({"1", "a", "b"}));

  CHECK_THROWS_WITH_AS(blend_from_words(words({"0.3", "a", "b", "c"}), "--data-path"),
                       doctest::Contains("every other word must be a number"), common::Error);
  CHECK_THROWS_WITH_AS(blend_from_words({}, "--train-data-path"),
                       doctest::Contains("--train-data-path is empty"), common::Error);
}

TEST_CASE("weights are normalized, and must be finite, non-negative and not all zero") {
  CHECK(normalize_weights(std::vector<double>{30, 70}, "w") == std::vector<double>{0.3, 0.7});
  CHECK(normalize_weights(std::vector<double>{0, 2}, "w") == std::vector<double>{0, 1});
  CHECK_THROWS_WITH_AS(normalize_weights(std::vector<double>{-1, 2}, "--data-path weights"),
                       doctest::Contains("--data-path weights: weight -1 is not a finite number"),
                       common::Error);
  CHECK_THROWS_WITH_AS(normalize_weights(std::vector<double>{0, 0}, "w"),
                       doctest::Contains("sum to 0"), common::Error);
  CHECK_THROWS_WITH_AS(normalize_weights(std::vector<double>{std::numeric_limits<double>::infinity(), 1}, "w"),
                       doctest::Contains("w: weight inf is not a finite number"), common::Error);
  // Finite weights whose sum is not: every weight would have normalized to 0.
  CHECK_THROWS_WITH_AS(normalize_weights(std::vector<double>{1e308, 1e308}, "--data-path weights"),
                       doctest::Contains("--data-path weights: the weights sum beyond the largest "
                                         "float64 (1.7976931348623157e+308); scale them down"),
                       common::Error);
  // numpy's pairwise summation is not a left-to-right loop: over 2,419 weights the two differ.
  std::mt19937_64 generator(7);
  std::uniform_real_distribution<double> uniform(0, 1);
  std::vector<double> many(2419);
  double loop = 0;
  for (double& weight : many) {
    weight = uniform(generator) * 1e-3;
    loop += weight;
  }
  CHECK(numpy_sum(many) == doctest::Approx(loop).epsilon(1e-12));
  CHECK(numpy_sum(std::vector<double>{}) == 0.0);
}

TEST_CASE("normalized weights equal numpy's, bit for bit") {
  if (!numpy_available()) return;
  std::mt19937_64 generator(11);
  std::uniform_real_distribution<double> uniform(0, 1);
  for (int count : {3, 8, 9, 127, 128, 129, 300, 2419}) {
    std::vector<double> weights(static_cast<size_t>(count));
    std::string list;
    for (double& weight : weights) {
      weight = uniform(generator) * 100;
      if (!list.empty()) list += ',';
      list += fmt::format("{}", weight);
    }
    const auto result = run_command(dataset_reference("normalize " + list));
    REQUIRE(result.exit_status == 0);
    std::istringstream lines(result.output);
    const auto ours = normalize_weights(weights, "w");
    for (double expected : ours) {
      std::string line;
      std::getline(lines, line);
      CAPTURE(count);
      CHECK(std::stod(line) == expected);
    }
  }
}

TEST_CASE("--split: Megatron's parsing, normalization and split matrix") {
  const auto split = parse_split("949,50,1");
  CHECK(split[0] == 949.0 / 1000);
  CHECK(split[1] == 50.0 / 1000);
  CHECK(split[2] == 1.0 / 1000);
  CHECK(parse_split("969, 30, 1")[0] == 969.0 / 1000);
  CHECK(parse_split("1") == std::array<double, 3>{1, 0, 0});
  CHECK(parse_split("0.7,0.2") == std::array<double, 3>{0.7 / 0.8999999999999999, 0.2 / 0.8999999999999999, 0});

  // Megatron's docstring: [0.99, 0.01, 0.0] -> [(0, 0.99), (0.99, 1.0), None]
  const auto matrix = split_matrix_from_vector(parse_split("99,1,0"));
  REQUIRE(matrix[0]);
  CHECK(matrix[0]->first == 0.0);
  CHECK(matrix[0]->second == 0.99);
  REQUIRE(matrix[1]);
  CHECK(matrix[1]->first == 0.99);
  CHECK(matrix[1]->second == 1.0);
  CHECK_FALSE(matrix[2]);

  CHECK_THROWS_WITH_AS(parse_split("1,2,3,4"), doctest::Contains("4 shares"), common::Error);
  CHECK_THROWS_WITH_AS(parse_split("0,0,0"), doctest::Contains("sum to 0"), common::Error);
  // Shares whose sum is not finite would all have normalized to 0: no data in any split.
  CHECK_THROWS_WITH_AS(parse_split("1e308,1e308"),
                       doctest::Contains("the shares sum beyond the largest float64"), common::Error);
  CHECK_THROWS_WITH_AS(parse_split("train"), doctest::Contains("'train' is not a number"), common::Error);
  // Megatron's regex reads "-1,2,3" as 1,2,3 and "nan,1,1" as 1,1: refused instead.
  CHECK_THROWS_WITH_AS(parse_split("-1,2,3"), doctest::Contains("'-1' is negative"), common::Error);
  CHECK_THROWS_WITH_AS(parse_split("1.2.3,1"), doctest::Contains("'1.2.3' is not a number"), common::Error);
}

TEST_CASE("split bounds round half to even, as Python's round()") {
  CHECK(split_range({0.5, 1.0}, 3) == std::pair<int64_t, int64_t>{2, 3});  // round(1.5) = 2
  CHECK(split_range({0.5, 1.0}, 5) == std::pair<int64_t, int64_t>{2, 5});  // round(2.5) = 2
  CHECK(split_range({0.0, 0.949}, 1000) == std::pair<int64_t, int64_t>{0, 949});
  CHECK(split_range({0.999, 1.0}, 100) == std::pair<int64_t, int64_t>{100, 100});  // empty
}

TEST_CASE("--data-file-list and --data-args-path files") {
  TemporaryDirectory directory;
  const auto list = directory.path / "blend.txt";
  std::ofstream(list) << "# the ALCF data file list\n"
                         "0.25 /data/books_text_document\n"
                         "\n"
                         "  0.75   /data/web_text_document   # most of it\n";
  const auto blend = read_data_file_list(list.string());
  CHECK(blend.prefixes == words({"/data/books_text_document", "/data/web_text_document"}));
  CHECK(*blend.weights == std::vector<double>{0.25, 0.75});

  std::ofstream(directory.path / "plain.txt") << "a\nb\n";
  CHECK_FALSE(read_data_file_list((directory.path / "plain.txt").string()).weights);

  std::ofstream(directory.path / "mixed.txt") << "0.5 a\nb\n";
  CHECK_THROWS_WITH_AS(read_data_file_list((directory.path / "mixed.txt").string()),
                       doctest::Contains("line 1 has a weight but line 2 has none"), common::Error);
  std::ofstream(directory.path / "word.txt") << "0.5 a\nhalf b\n";
  CHECK_THROWS_WITH_AS(read_data_file_list((directory.path / "word.txt").string()),
                       doctest::Contains("word.txt:2: 'half' is not a weight"), common::Error);
  std::ofstream(directory.path / "empty.txt") << "# nothing\n";
  CHECK_THROWS_WITH_AS(read_data_file_list((directory.path / "empty.txt").string()),
                       doctest::Contains("lists no datasets"), common::Error);
  CHECK_THROWS_WITH_AS(read_data_file_list((directory.path / "none.txt").string()),
                       doctest::Contains("--data-file-list"), common::Error);

  // The ALCF fork's three columns: weight, prefix (a ".bin" dropped, as the fork drops it),
  // corpus. The weights stay each dataset's own, over all lines.
  std::ofstream(directory.path / "alcf.txt")
      << "0.0018 /flare/dolma/algebraic-stack-train-0000_text_document algebraic-stack-train\n"
         "0.0017 /flare/dolma/algebraic-stack-train-0001_text_document.bin algebraic-stack-train\n"
         "0.5 /flare/dolma/books-0000_text_document books\n";
  const auto alcf = read_data_file_list((directory.path / "alcf.txt").string());
  CHECK(alcf.prefixes == words({"/flare/dolma/algebraic-stack-train-0000_text_document",
                                "/flare/dolma/algebraic-stack-train-0001_text_document",
                                "/flare/dolma/books-0000_text_document"}));
  CHECK(*alcf.weights == std::vector<double>{0.0018, 0.0017, 0.5});
  CHECK(alcf.corpora == words({"algebraic-stack-train", "algebraic-stack-train", "books"}));
  const auto shares = corpus_shares(alcf, normalize_weights(*alcf.weights, "w"));
  REQUIRE(shares.size() == 2);
  CHECK(shares[0].name == "algebraic-stack-train");
  CHECK(shares[0].datasets == 2);
  CHECK(shares[0].weight == doctest::Approx(0.0035 / 0.5035));
  CHECK(shares[1].name == "books");
  CHECK(shares[1].weight == doctest::Approx(0.5 / 0.5035));
  CHECK(read_data_file_list(list.string()).corpora.empty());
  // A prefix that is only ".bin" would become empty once the ".bin" is dropped (found by
  // fuzz/data_sources).
  std::ofstream(directory.path / "bare_bin.txt") << "0.5 .bin web\n";
  CHECK_THROWS_WITH_AS(read_data_file_list((directory.path / "bare_bin.txt").string()),
                       doctest::Contains("bare_bin.txt:1: '.bin' names no dataset prefix"),
                       common::Error);
  std::ofstream(directory.path / "some_corpora.txt") << "0.5 a web\n0.5 b\n";
  CHECK_THROWS_WITH_AS(read_data_file_list((directory.path / "some_corpora.txt").string()),
                       doctest::Contains("line 1 names a corpus but line 2 does not"), common::Error);
  std::ofstream(directory.path / "four.txt") << "0.5 a web extra\n";
  CHECK_THROWS_WITH_AS(read_data_file_list((directory.path / "four.txt").string()),
                       doctest::Contains("four.txt:1: 4 words; a line is \"weight prefix\" or "
                                         "\"weight prefix corpus\""),
                       common::Error);
  std::ofstream(directory.path / "corpus_first.txt") << "web 0.5 a\n";
  CHECK_THROWS_WITH_AS(read_data_file_list((directory.path / "corpus_first.txt").string()),
                       doctest::Contains("'web' is not a weight"), common::Error);

  std::ofstream(directory.path / "args.txt") << "0.3 a\n0.7\nb\n";
  const auto args = read_data_args_file((directory.path / "args.txt").string());
  CHECK(args.prefixes == words({"a", "b"}));
  CHECK(*args.weights == std::vector<double>{0.3, 0.7});
}
