// libFuzzer target: the distributed optimizer's state as a --load reads it back
// (read_distributed_moments, backend/ckpt/checkpoint.hpp): the rank file's "optimizer" →
// "distributed" section (how many data-parallel ranks, how many parameters) and the
// distrib_optim_ZZZ.bin files beside it, each with its range in its metadata. The file format
// itself is checkpoint_file_fuzzer's; here the files are well formed (write_checkpoint_file
// writes them) and what is fuzzed is what they say. The input is lines of text:
//   line 1: B O N        the model's buffer of B parameters, the range [O, O + N) wanted
//   line 2: JSON         the rank file's metadata
//   then per file ZZZ = 000, 001, ... (eight at most), two lines:
//     JSON               its metadata
//     NAME:D,D,... ...   its tensors, by name and shape
// A tensor's values are the oracle: element k of a file whose metadata says its range starts at
// S holds S + k + 1 (exp_avg) or −(S + k + 1) (exp_avg_sq, and any other name) — the values
// the distributed optimizer's save writes for moments m[i] = i + 1. So a read that succeeds
// must give exactly O + j + 1 and −(O + j + 1) at j: a value from another element, another
// tensor or nowhere (a range left unread) is a finding, as are a crash, an exception other
// than common::Error, a sanitizer report, or an input that runs past -timeout (a rank count
// that is walked rather than computed).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/common/error.hpp"
#include "tests/fuzz/scratch_file.hpp"

namespace fs = std::filesystem;

namespace {

constexpr int64_t kMostElements = 4096;  // per tensor and per buffer: inputs stay small
constexpr int kMostFiles = 8;

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "FINDING: distributed_moments_fuzzer: %s\n", what);
    std::abort();
  }
}

bool parse_json(const std::string& line, nlohmann::json& value) {
  try {
    value = nlohmann::json::parse(line);
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

// "exp_avg:3 exp_avg_sq:3" → names and shapes; false for anything else, or too many elements.
bool parse_tensors(const std::string& line, std::vector<std::string>& names,
                   std::vector<std::vector<int64_t>>& shapes) {
  std::istringstream words(line);
  for (std::string word; words >> word;) {
    const size_t colon = word.find(':');
    if (colon == std::string::npos || colon == 0 || names.size() >= 4) return false;
    names.push_back(word.substr(0, colon));
    std::vector<int64_t> shape;
    int64_t numel = 1;
    std::istringstream dimensions(word.substr(colon + 1));
    for (std::string dimension; std::getline(dimensions, dimension, ',');) {
      if (dimension.empty() || dimension.size() > 5 ||
          dimension.find_first_not_of("0123456789") != std::string::npos) {
        return false;
      }
      shape.push_back(std::stoll(dimension));
      numel *= shape.back();
      if (numel > kMostElements || shape.size() > 4) return false;
    }
    shapes.push_back(shape);
  }
  return true;
}

// Where a file's metadata says its range starts (0 when it says nothing usable).
int64_t claimed_offset(const nlohmann::json& metadata) {
  if (metadata.is_object() && metadata.contains("range") && metadata["range"].is_object() &&
      metadata["range"].contains("offset") && metadata["range"]["offset"].is_number_integer()) {
    const auto offset = metadata["range"]["offset"].get<int64_t>();
    if (offset >= 0 && offset <= kMostElements) return offset;
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz_support::ScratchDirectory scratch("distributed_moments_fuzzer");
  std::vector<std::string> lines;
  {
    std::istringstream text(std::string(reinterpret_cast<const char*>(data), size));
    for (std::string line; std::getline(text, line);) lines.push_back(line);
  }
  if (lines.size() < 2) return 0;
  int64_t buffer_numel = 0, offset = 0, numel = 0;
  std::istringstream first_line(lines[0]);
  first_line >> buffer_numel >> offset >> numel;
  if (!first_line || buffer_numel < 0 || buffer_numel > kMostElements || offset < 0 || numel < 0 ||
      offset > buffer_numel || numel > buffer_numel - offset) {
    return 0;
  }
  nlohmann::json rank_metadata;
  if (!parse_json(lines[1], rank_metadata)) return 0;

  scratch.clear();
  for (size_t line = 2, member = 0; line + 1 < lines.size() && member < kMostFiles;
       line += 2, ++member) {
    nlohmann::json metadata;
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    if (!parse_json(lines[line], metadata) || !parse_tensors(lines[line + 1], names, shapes)) {
      return 0;
    }
    const int64_t start = claimed_offset(metadata);
    std::vector<std::vector<float>> values(names.size());
    std::vector<backend::CheckpointTensor> tensors;
    for (size_t t = 0; t < names.size(); ++t) {
      int64_t count = 1;
      for (const int64_t dimension : shapes[t]) count *= dimension;
      const float sign = names[t] == "exp_avg" ? 1.0f : -1.0f;
      for (int64_t k = 0; k < count; ++k) {
        values[t].push_back(sign * static_cast<float>(start + k + 1));
      }
      tensors.push_back({names[t], shapes[t], values[t]});
    }
    try {
      backend::write_checkpoint_file(
          scratch.path / backend::distributed_optimizer_file_name(static_cast<int64_t>(member)),
          metadata, tensors);
    } catch (const common::Error&) {
      return 0;  // e.g. two tensors of one name: not a file the save writes
    }
  }

  const fs::path rank_file = scratch.path / "model_optim_rng.bin";
  const float unread = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> exp_avg(static_cast<size_t>(numel), unread), exp_avg_sq(exp_avg);
  try {
    const backend::CheckpointMetadata metadata(rank_metadata, rank_file);
    if (!backend::has_distributed_moments(metadata)) return 0;
    backend::read_distributed_moments(rank_file, metadata, buffer_numel, {offset, numel}, exp_avg,
                                      exp_avg_sq);
  } catch (const common::Error&) {
    return 0;
  }
  for (int64_t j = 0; j < numel; ++j) {
    const auto expected = static_cast<float>(offset + j + 1);
    check(exp_avg[static_cast<size_t>(j)] == expected, "exp_avg is not the wanted element's");
    check(exp_avg_sq[static_cast<size_t>(j)] == -expected,
          "exp_avg_sq is not the wanted element's");
  }
  return 0;
}
