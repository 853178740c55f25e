// Python's float() of a word (common::parse_python_float), which reads the weights of a data
// blend as Megatron's get_blend_from_list does: a table of the grammar's corners, then 20,000
// random words over the grammar's alphabet compared bit for bit with /usr/bin/python3's
// float() itself (skipped with a message without Python, a failure when CI is set).
#include "backend/common/python_format.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/reference_tools.hpp"
#include "tests/temporary_directory.hpp"
#include "tests/test_files.hpp"

namespace {

using common::parse_python_float;
using test_support::run_command;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

}  // namespace

TEST_CASE("parse_python_float: the corners of Python's float() grammar") {
  // Each value as CPython 3.11's float() gives it.
  CHECK(parse_python_float("1_0") == 10.0);
  CHECK(parse_python_float("1_0.5_5e1_0") == 105500000000.0);
  CHECK(parse_python_float("-1_2.3_4E-0_1") == -1.234);
  CHECK(parse_python_float(" \t2\v\f\r\n") == 2.0);
  CHECK(parse_python_float("1.") == 1.0);
  CHECK(parse_python_float("+.5") == 0.5);
  CHECK(parse_python_float("1E+5") == 100000.0);
  CHECK(parse_python_float("1e400") == kInfinity);
  CHECK(parse_python_float("-1e400") == -kInfinity);
  CHECK(parse_python_float("1" + std::string(400, '0')) == kInfinity);
  CHECK(parse_python_float("1e-400") == 0.0);
  CHECK(parse_python_float("4.9e-324") == std::numeric_limits<double>::denorm_min());
  CHECK(parse_python_float("+INF") == kInfinity);
  CHECK(parse_python_float("-Infinity") == -kInfinity);
  CHECK(std::isnan(*parse_python_float("NaN")));
  CHECK(std::isnan(*parse_python_float("-nan")));
  // ValueError in Python.
  for (const char* word : {"", " ", "1__0", "_1", "1_", "1_e5", "1e_5", "1e", "1e+", ".", "0x10",
                           "0X1p3", "nan(1)", "infinit", "infinityy", "1.2.3", "--1", "\x1c" "2",
                           "1 2", "e5", "+", "١٢"}) {
    CAPTURE(word);
    CHECK_FALSE(parse_python_float(word).has_value());
  }
}

TEST_CASE("parse_python_float equals Python's float() on 20,000 random words, bit for bit") {
  const bool python = test_support::reference_available(
      std::string(test_support::kPython) + " -c 'print(float(\"1_0\"))'", "Python's float()",
      "Debian: apt-get install python3",
      [](const test_support::CommandResult& result) { return result.output == "10.0\n"; });
  if (!python) return;
  // Words over the grammar's alphabet, short enough that every corner comes up often.
  const std::string alphabet = "0123456789012345678901234567890._____eEeE++--  infatyINFATYx";
  std::mt19937_64 generator(2026);
  std::uniform_int_distribution<size_t> length(0, 9), letter(0, alphabet.size() - 1);
  std::vector<std::string> words = {"inf", "-Infinity", "nan", "1e308", "1e309", "2.5e-324"};
  while (words.size() < 20000) {
    std::string word;
    for (size_t i = length(generator); i > 0; --i) word.push_back(alphabet[letter(generator)]);
    words.push_back(word);
  }
  test_support::TemporaryDirectory temporary;
  const std::string list = (temporary.path / "words.txt").string();
  {
    std::ofstream out(list);
    for (const std::string& word : words) out << word << '\n';
  }
  // Per word: the float64's bits as an unsigned integer, "nan", or "error".
  const std::string script =
      "import struct,sys\n"
      "for line in open(sys.argv[1], encoding='ascii'):\n"
      "    try: x = float(line[:-1])\n"
      "    except ValueError: print('error'); continue\n"
      "    print('nan' if x != x else struct.unpack('<Q', struct.pack('<d', x))[0])\n";
  const std::string script_file = (temporary.path / "floats.py").string();
  std::ofstream(script_file) << script;
  const auto result = run_command(std::string(test_support::kPython) + " " + script_file + " " + list);
  REQUIRE(result.exit_status == 0);
  std::istringstream lines(result.output);
  int compared = 0, numbers = 0;
  for (const std::string& word : words) {
    std::string expected;
    REQUIRE(std::getline(lines, expected));
    const std::optional<double> ours = parse_python_float(word);
    CAPTURE(word);
    CAPTURE(expected);
    if (expected == "error") {
      CHECK_FALSE(ours.has_value());
    } else if (expected == "nan") {
      REQUIRE(ours.has_value());
      CHECK(std::isnan(*ours));
    } else {
      REQUIRE(ours.has_value());
      CHECK(std::bit_cast<uint64_t>(*ours) == std::stoull(expected));
      ++numbers;
    }
    ++compared;
  }
  CHECK(compared == 20000);
  CHECK(numbers > 2000);  // the words are not all refusals
}
