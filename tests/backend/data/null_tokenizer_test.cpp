// NullTokenizer: Megatron's _NullTokenizer ids-as-text, vocab_size = N + 1, eod = N, and the
// errors for text that is not ids.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/null_tokenizer.hpp"
#include "backend/data/tokenizer.hpp"

using namespace backend;

TEST_CASE("NullTokenizer reads ids from text, its eod is the last id") {
  NullTokenizer tokenizer(100);
  CHECK(tokenizer.vocab_size() == 101);
  CHECK(tokenizer.eod() == 100);
  CHECK(tokenizer.tokenize("1 2 3") == std::vector<int32_t>{1, 2, 3});
  CHECK(tokenizer.tokenize("0 99 100") == std::vector<int32_t>{0, 99, 100});
  CHECK(tokenizer.tokenize("  4\n5\t+6 ") == std::vector<int32_t>{4, 5, 6});
  CHECK(tokenizer.tokenize("").empty());
  CHECK(tokenizer.detokenize(std::vector<int32_t>{7, 0, 100}) == "7 0 100");
  const auto clone = tokenizer.clone();
  CHECK(clone->eod() == 100);
}

TEST_CASE("NullTokenizer rejects text that is not ids in range") {
  NullTokenizer tokenizer(100);
  CHECK_THROWS_WITH_AS(tokenizer.tokenize("1 two 3"), doctest::Contains("field 2 of the text, \"two\""),
                       common::Error);
  CHECK_THROWS_AS(tokenizer.tokenize("-1"), common::Error);
  CHECK_THROWS_AS(tokenizer.tokenize("101"), common::Error);
  CHECK_THROWS_AS(tokenizer.tokenize("1.5"), common::Error);
  CHECK_THROWS_AS(tokenizer.tokenize("99999999999999999999"), common::Error);
  CHECK_THROWS_AS(tokenizer.tokenize("+"), common::Error);
  CHECK_THROWS_AS(tokenizer.detokenize(std::vector<int32_t>{101}), common::Error);
  // A field quoted in the message never carries control characters into a terminal or a log
  // (an escape sequence, a NUL that cuts the line), and is not cut inside a UTF-8 character.
  try {
    tokenizer.tokenize(std::string("7 1\x1b[2J\0x", 9));
    FAIL("control characters were taken for ids");
  } catch (const common::Error& error) {
    const std::string message = error.what();
    CHECK(message.find("\"1\\x1b[2J\\x00x\"") != std::string::npos);
    CHECK(std::none_of(message.begin(), message.end(), [](char c) { return c >= 0 && c < 0x20; }));
  }
  CHECK_THROWS_WITH_AS(tokenizer.tokenize(std::string(39, '9') + "\u0663"),
                       doctest::Contains(("\"" + std::string(39, '9') + "\"").c_str()), common::Error);
  CHECK_THROWS_WITH_AS(NullTokenizer(0), doctest::Contains("--vocab-size"), common::Error);
  CHECK_THROWS_WITH_AS(build_tokenizer({.tokenizer_type = "NullTokenizer", .vocab_file = "",
                                        .merge_file = "", .vocab_size = 0,
                                        .tokenizer_model = "", .vocab_extra_ids = 0}),
                       doctest::Contains("--vocab-size"), common::Error);
  CHECK(build_tokenizer({.tokenizer_type = "NullTokenizer", .vocab_file = "", .merge_file = "",
                         .vocab_size = 50, .tokenizer_model = "",
                         .vocab_extra_ids = 0})->vocab_size() == 51);
}
