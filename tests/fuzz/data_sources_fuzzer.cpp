// libFuzzer target: how a run names its data (backend/data/data_blend.hpp), as a user writes
// it: --data-path's words (get_blend_from_list), a --data-file-list file, and --split. The
// input is three parts separated by lines "--": the words, the file, the split text. Oracles:
//   a blend: as many weights as prefixes when weighted (every other word), one prefix per word
//     otherwise; no file-list prefix holds whitespace or '#';
//   normalized weights: finite, in [0, 1], summing to 1 within rounding;
//   numpy_sum: within its error bound of the exact sum (pairwise summation's n·ε·Σ|x|);
//   a split: three finite shares ≥ 0 summing to 1 within rounding, whose matrix and bounds
//     give every sequence of a dataset (of 0 to 2^40 sequences) to exactly one split, in
//     order, with nothing left over.
// Everything else must end in success or common::Error; a crash, another exception or a
// sanitizer report is a finding.
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/data_blend.hpp"
#include "tests/fuzz/scratch_file.hpp"

namespace {

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "FINDING: data_sources_fuzzer: %s\n", what);
    std::abort();
  }
}

bool near_one(double sum, size_t count) {
  return std::fabs(sum - 1.0) <= 4.0 * static_cast<double>(count + 1) * 1.2e-16;
}

void check_weights(const backend::DataBlend& blend, const char* what) {
  if (!blend.weights) return;
  check(blend.weights->size() == blend.prefixes.size(), "weights and prefixes differ in count");
  std::vector<double> normalized;
  try {
    normalized = backend::normalize_weights(*blend.weights, what);
  } catch (const common::Error&) {
    return;
  }
  check(normalized.size() == blend.weights->size(), "normalize changed the count");
  for (const double weight : normalized) {
    check(std::isfinite(weight) && weight >= 0 && weight <= 1, "a normalized weight outside [0, 1]");
  }
  check(near_one(backend::numpy_sum(normalized), normalized.size()),
        "normalized weights do not sum to 1");
}

void check_numpy_sum(const std::vector<double>& values) {
  long double exact = 0, magnitude = 0;
  for (const double value : values) {
    if (!std::isfinite(value)) return;
    exact += value;
    magnitude += std::fabs(value);
  }
  if (!std::isfinite(static_cast<double>(magnitude))) return;
  const double sum = backend::numpy_sum(values);
  const long double bound = static_cast<long double>(values.size() + 1) * 1.2e-16L * magnitude;
  check(std::fabs(static_cast<long double>(sum) - exact) <= bound,
        "numpy_sum is farther from the exact sum than pairwise summation may be");
}

void check_split(const std::string& text) {
  std::array<double, 3> shares{};
  try {
    shares = backend::parse_split(text);
  } catch (const common::Error&) {
    return;
  }
  for (const double share : shares) {
    check(std::isfinite(share) && share >= 0 && share <= 1, "a split share outside [0, 1]");
  }
  check(near_one(shares[0] + shares[1] + shares[2], 3), "the split shares do not sum to 1");
  const backend::SplitMatrix matrix = backend::split_matrix_from_vector(shares);
  for (const int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 40}) {
    int64_t next = 0;
    for (const auto& fractions : matrix) {
      if (!fractions) continue;
      check(fractions->first < fractions->second, "an empty split in the matrix");
      const auto [begin, end] = backend::split_range(*fractions, count);
      check(begin == next, "a split does not start where the previous one ends");
      check(begin <= end && end <= count, "a split's bounds are out of order or past the end");
      next = end;
    }
    check(next == count, "the splits leave sequences over");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz_support::ScratchDirectory scratch("data_sources_fuzzer");
  std::vector<std::string> parts(1);
  {
    std::istringstream text(std::string(reinterpret_cast<const char*>(data), size));
    for (std::string line; std::getline(text, line);) {
      if (line == "--" && parts.size() < 3) {
        parts.emplace_back();
      } else {
        parts.back() += line + "\n";
      }
    }
  }
  parts.resize(3);

  std::vector<std::string> words;
  {
    std::istringstream text(parts[0]);
    for (std::string word; text >> word;) words.push_back(word);
  }
  try {
    const backend::DataBlend blend = backend::blend_from_words(words, "--data-path");
    check(!blend.prefixes.empty(), "a blend without prefixes");
    check(blend.weights ? blend.prefixes.size() * 2 == words.size()
                        : blend.prefixes.size() == words.size(),
          "the blend's prefixes are not its words");
    check_weights(blend, "--data-path");
    if (blend.weights) check_numpy_sum(*blend.weights);
  } catch (const common::Error&) {
  }

  try {
    const backend::DataBlend list =
        backend::read_data_file_list(scratch.write("list.txt", parts[1]).string());
    check(!list.prefixes.empty(), "a file list without prefixes");
    for (const std::string& prefix : list.prefixes) {
      check(!prefix.empty() && prefix.find_first_of(" \t\n\v\f\r#") == std::string::npos,
            "a file-list prefix holds whitespace or a comment");
    }
    check_weights(list, "--data-file-list");
  } catch (const common::Error&) {
  }

  std::string split = parts[2];
  if (!split.empty() && split.back() == '\n') split.pop_back();
  check_split(split);
  return 0;
}
