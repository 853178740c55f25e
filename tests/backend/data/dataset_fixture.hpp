// Small .bin/.idx datasets for the GPT dataset tests, with tokens that say where they come from:
// token t of sequence s is (s · 1000 + t) mod 65000, so a sample's tokens can be checked against
// the sequences the indices name.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/data/indexed_dataset.hpp"

namespace test_support {

inline int32_t fixture_token(int64_t sequence, int64_t position) {
  return static_cast<int32_t>((sequence * 1000 + position) % 65000);
}

// Writes `prefix`.bin/.idx with one sequence per document of the given lengths.
inline void write_fixture_dataset(const std::string& prefix, const std::vector<int32_t>& lengths) {
  backend::IndexedDatasetWriter writer(prefix, backend::DType::uint16);
  for (size_t s = 0; s < lengths.size(); ++s) {
    std::vector<int32_t> tokens(static_cast<size_t>(lengths[s]));
    for (int32_t t = 0; t < lengths[s]; ++t) tokens[static_cast<size_t>(t)] = fixture_token(static_cast<int64_t>(s), t);
    writer.add_document(tokens, std::vector<int32_t>{lengths[s]});
  }
  writer.finalize();
}

// `count` lengths drawn uniformly from [low, high] (0 gives empty documents).
inline std::vector<int32_t> random_lengths(int count, int low, int high, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<int32_t> length(low, high);
  std::vector<int32_t> lengths(static_cast<size_t>(count));
  for (auto& value : lengths) value = length(generator);
  return lengths;
}

}  // namespace test_support
