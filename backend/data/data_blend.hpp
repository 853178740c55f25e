// How Megatron names the data of a run (megatron/core/datasets/utils.py get_blend_from_list and
// normalize; blended_megatron_dataset_config.py parse_and_normalize_split and
// convert_split_vector_to_split_matrix; megatron/training/utils.py get_blend_and_blend_per_split):
//
//   blend     prefixes of .bin/.idx pairs, with weights or without: `--data-path A` (one),
//             `--data-path 0.3 A 0.7 B` (an even count whose every other word is a number:
//             weights first), `--data-path A B` (no weights: each dataset once, blended by size).
//             Weights are normalized to sum 1 (numpy's float64 sum, which is pairwise).
//   split     `--split 949,50,1`: one to three non-negative numbers separated by ',' or '/',
//             padded with zeros to three, normalized (Megatron takes whatever numbers
//             re.findall finds in the text; "-1,2,3" and "nan,1,1" are refused here instead); the split matrix gives each split the range [sum of the earlier
//             shares, + its share) of every dataset's sequences, or none for a zero share.
//   sources   --data-path WORDS, --data-args-path FILE (a file holding --data-path's words),
//             --data-file-list FILE (one "weight prefix" per line, # comments; or
//             "weight prefix corpus", the three columns of Megatron-DeepSpeed's ALCF fork, whose
//             flag this is: the corpus names a group of the blend, which only the log uses),
//             or per split: --train-data-path / --valid-data-path / --test-data-path WORDS and
//             --per-split-data-args-path FILE (JSON {"train": [...], "valid": [...],
//             "test": [...]}).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace backend {

struct DataBlend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;  // as given; normalize() them before use
  // --data-file-list's third column, one per prefix, or empty. The ALCF fork concatenates each
  // corpus's datasets and blends the corpora by their summed weights: every dataset still
  // gives its own weight's share of the samples, which the one blend over all the prefixes
  // gives too (in another order), so the corpora change no sample here; they are reported.
  std::vector<std::string> corpora;
};

// The corpora of a blend, sorted by name: how many datasets each groups and the sum of their
// normalized weights (the fork's "expected" corpus weight).
struct CorpusShare {
  std::string name;
  int64_t datasets = 0;
  double weight = 0;
};
std::vector<CorpusShare> corpus_shares(const DataBlend& blend, std::span<const double> normalized);

// get_blend_from_list. `flag` names the source in errors (e.g. "--data-path").
DataBlend blend_from_words(std::span<const std::string> words, const std::string& flag);

// --data-args-path: the file's whitespace-separated words, as --data-path.
DataBlend read_data_args_file(const std::string& path);

// --data-file-list: one "weight prefix" (or only "prefix", then on every line; or "weight prefix
// corpus", then on every line, a trailing ".bin" of the prefix dropped as the ALCF fork drops
// it) per line; blank lines and text after '#' are ignored. Errors name the file and line.
DataBlend read_data_file_list(const std::string& path);

// numpy.sum of a float64 array: numpy's pairwise summation (blocks of 128 with eight
// accumulators), which Megatron's normalize() uses; a plain loop differs in the last bits.
double numpy_sum(std::span<const double> values);

// Megatron's normalize(): each weight over numpy_sum of all. Weights must be finite, ≥ 0 and
// not all 0 (`what` names them in errors).
std::vector<double> normalize_weights(std::span<const double> weights, const std::string& what);

// The split matrix: per split (train, valid, test) the [begin, end) fractions, or none.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;

// parse_and_normalize_split: "949,50,1" → {0.949, 0.05, 0.001}. Errors name --split
// (common::parse_split_shares).
std::array<double, 3> parse_split(const std::string& split);
SplitMatrix split_matrix_from_vector(const std::array<double, 3>& split);

// The sequences [begin, end) of a dataset of `count` sequences that a split's fractions select:
// int(round(fraction × count)) at both ends, rounding half to even as Python's round().
std::pair<int64_t, int64_t> split_range(const std::pair<double, double>& fractions, int64_t count);

// Where a run's data comes from: one blend split by --split, or a blend per split.
struct DataSources {
  std::optional<DataBlend> blend;                       // --data-path and friends
  std::array<std::optional<DataBlend>, 3> blend_per_split;  // --train/valid/test-data-path
  std::optional<std::string> split;                     // --split's text (with `blend`)
};

}  // namespace backend
