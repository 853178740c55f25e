// Blend, split and data-source parsing; see data_blend.hpp.
#include "backend/data/data_blend.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "backend/common/error.hpp"
#include "backend/common/flag_rules.hpp"
#include "backend/common/python_format.hpp"
#include "backend/common/small_file.hpp"

namespace backend {

namespace {

std::string strip(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r\n\f\v");
  if (begin == std::string::npos) return "";
  const size_t end = text.find_last_not_of(" \t\r\n\f\v");
  return text.substr(begin, end - begin + 1);
}

// numpy's pairwise_sum for float64 (numpy/core/src/umath/loops_utils.h.src).
double pairwise_sum(const double* values, size_t count) {
  if (count < 8) {
    double sum = 0.0;
    for (size_t i = 0; i < count; ++i) sum += values[i];
    return sum;
  }
  if (count <= 128) {
    double partial[8];
    for (size_t k = 0; k < 8; ++k) partial[k] = values[k];
    size_t i = 8;
    for (; i < count - count % 8; i += 8) {
      for (size_t k = 0; k < 8; ++k) partial[k] += values[i + k];
    }
    double sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                 ((partial[4] + partial[5]) + (partial[6] + partial[7]));
    for (; i < count; ++i) sum += values[i];
    return sum;
  }
  size_t half = count / 2;
  half -= half % 8;
  return pairwise_sum(values, half) + pairwise_sum(values + half, count - half);
}

}  // namespace

DataBlend blend_from_words(std::span<const std::string> words, const std::string& flag) {
  if (words.empty()) common::fail("{} is empty: give a dataset prefix, or weights and prefixes", flag);
  DataBlend blend;
  if (words.size() % 2 == 0) {
    std::vector<double> weights;
    std::vector<std::string> not_numbers;
    for (size_t i = 0; i < words.size(); i += 2) {
      if (auto weight = common::parse_python_float(words[i])) {
        weights.push_back(*weight);
      } else {
        not_numbers.push_back(words[i]);
      }
    }
    if (not_numbers.empty()) {
      for (size_t i = 1; i < words.size(); i += 2) blend.prefixes.push_back(strip(words[i]));
      blend.weights = std::move(weights);
      return blend;
    }
    if (!weights.empty()) {
      common::fail("{} {}: with weights, every other word must be a number (weight prefix "
                   "weight prefix ...), but {} is not; without weights give only prefixes",
                   flag, fmt::join(words, " "), fmt::join(not_numbers, ", "));
    }
  }
  for (const auto& word : words) blend.prefixes.push_back(strip(word));
  return blend;
}

DataBlend read_data_args_file(const std::string& path) {
  std::istringstream file(common::read_small_file(path, "--data-args-path"));
  std::vector<std::string> words;
  std::string word;
  while (file >> word) words.push_back(word);
  if (words.empty()) common::fail("--data-args-path {}: the file holds no dataset prefixes", path);
  return blend_from_words(words, "--data-args-path " + path);
}

DataBlend read_data_file_list(const std::string& path) {
  std::istringstream file(common::read_small_file(path, "--data-file-list"));
  DataBlend blend;
  std::vector<double> weights;
  int weighted_lines = 0, unweighted_lines = 0, first_weighted = 0, first_unweighted = 0;
  int corpus_lines = 0, first_corpus = 0, first_without_corpus = 0;
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    if (const size_t comment = line.find('#'); comment != std::string::npos) line.resize(comment);
    std::istringstream fields(line);
    std::vector<std::string> words;
    for (std::string word; fields >> word;) words.push_back(word);
    if (words.empty()) continue;
    if (words.size() == 2 || words.size() == 3) {
      const auto weight = common::parse_python_float(words[0]);
      if (!weight) {
        common::fail("{}:{}: '{}' is not a weight (lines are \"weight prefix\" or \"weight prefix "
                     "corpus\", e.g. \"0.25 /data/oscar_text_document web\")",
                     path, number, words[0]);
      }
      weights.push_back(*weight);
      if (weighted_lines++ == 0) first_weighted = number;
      if (words.size() == 3) {
        // The ALCF fork drops a ".bin" its lists may name the dataset by.
        if (words[1].ends_with(".bin")) words[1].resize(words[1].size() - 4);
        if (words[1].empty()) {
          common::fail(
              "{}:{}: '.bin' names no dataset prefix (the prefix is the path before "
              ".bin, e.g. \"0.25 /data/oscar_text_document.bin web\")",
              path, number);
        }
        blend.corpora.push_back(words[2]);
        if (corpus_lines++ == 0) first_corpus = number;
      } else if (first_without_corpus == 0) {
        first_without_corpus = number;
      }
      blend.prefixes.push_back(words[1]);
    } else if (words.size() == 1) {
      blend.prefixes.push_back(words[0]);
      if (unweighted_lines++ == 0) first_unweighted = number;
    } else {
      common::fail("{}:{}: {} words; a line is \"weight prefix\" or \"weight prefix corpus\" "
                   "(paths with spaces are not supported)", path, number, words.size());
    }
  }
  if (blend.prefixes.empty()) common::fail("--data-file-list {}: the file lists no datasets", path);
  if (weighted_lines > 0 && unweighted_lines > 0) {
    common::fail("{}: line {} has a weight but line {} has none; weight every dataset or none",
                 path, first_weighted, first_unweighted);
  }
  if (corpus_lines > 0 && first_without_corpus > 0) {
    common::fail("{}: line {} names a corpus but line {} does not; name the corpus on every line "
                 "(\"weight prefix corpus\") or on none", path, first_corpus, first_without_corpus);
  }
  if (weighted_lines > 0) blend.weights = std::move(weights);
  return blend;
}

std::vector<CorpusShare> corpus_shares(const DataBlend& blend, std::span<const double> normalized) {
  std::map<std::string, CorpusShare> by_name;  // sorted, as the fork's sorted(set(corpuses))
  for (size_t d = 0; d < blend.corpora.size() && d < normalized.size(); ++d) {
    CorpusShare& share = by_name[blend.corpora[d]];
    share.name = blend.corpora[d];
    ++share.datasets;
    share.weight += normalized[d];
  }
  std::vector<CorpusShare> shares;
  for (auto& entry : by_name) shares.push_back(std::move(entry.second));
  return shares;
}

double numpy_sum(std::span<const double> values) { return pairwise_sum(values.data(), values.size()); }

std::vector<double> normalize_weights(std::span<const double> weights, const std::string& what) {
  for (double weight : weights) {
    if (!std::isfinite(weight) || weight < 0) {
      common::fail("{}: weight {} is not a finite number ≥ 0", what, weight);
    }
  }
  const double sum = numpy_sum(weights);
  if (!(sum > 0)) common::fail("{}: the weights sum to {}; at least one must be positive", what, sum);
  // Beyond the largest double the sum is inf, and every weight would normalize to 0.
  if (!std::isfinite(sum)) {
    common::fail("{}: the weights sum beyond the largest float64 ({}); scale them down", what,
                 std::numeric_limits<double>::max());
  }
  std::vector<double> normalized;
  normalized.reserve(weights.size());
  for (double weight : weights) normalized.push_back(weight / sum);
  return normalized;
}

std::array<double, 3> parse_split(const std::string& split) {
  // The shares, checked by the --split rule that the launcher applies too (common/flag_rules).
  const std::array<double, 3> shares = common::parse_split_shares(split);
  const double sum = numpy_sum(shares);
  return {shares[0] / sum, shares[1] / sum, shares[2] / sum};
}

SplitMatrix split_matrix_from_vector(const std::array<double, 3>& split) {
  SplitMatrix matrix;
  double begin = 0.0;
  for (size_t i = 0; i < 3; ++i) {
    const double end = begin + split[i];
    if (end > begin) matrix[i] = std::make_pair(begin, end);
    begin = end;
  }
  return matrix;
}

std::pair<int64_t, int64_t> split_range(const std::pair<double, double>& fractions, int64_t count) {
  // Python's round() rounds half to even, as nearbyint in the default rounding mode.
  const auto bound = [count](double fraction) {
    return static_cast<int64_t>(std::nearbyint(fraction * static_cast<double>(count)));
  };
  return {bound(fractions.first), bound(fractions.second)};
}

}  // namespace backend
