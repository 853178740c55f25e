// Benchmark of the GPT dataset index building (tests/bench/dataset_index_bench.sh drives it):
//   dataset_index_bench generate DIR FILES TOTAL_TOKENS SEQUENCES_PER_FILE SEED
//       writes FILES synthetic datasets DIR/part_NNNNN.idx (random sequence lengths summing to
//       about TOTAL_TOKENS over all files) with sparse .bin files of the size the index claims
//       (truncate: no token is written, and the disk holds only the .idx files)
//   dataset_index_bench build DIR SEQ_LENGTH TRAIN_SAMPLES THREADS CACHE_DIR
//       builds the datasets of pretrain_gpt for a blend of every DIR/*.idx weighted by its token
//       count (the ALCF data file list), --split 969,30,1, eval 0, indices cached in CACHE_DIR,
//       and prints the time of each phase; run it twice to time the cached start
//   dataset_index_bench blend DATASETS SAMPLES
//       times build_blending_indices against Megatron's scan of every dataset at every step
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/blended_dataset.hpp"
#include "backend/data/gpt_dataset_builder.hpp"
#include "backend/data/indexed_dataset.hpp"

namespace {

using Clock = std::chrono::steady_clock;
// Resident memory now, from /proc/self/status (file-backed pages of the memory maps included).
std::string resident_memory() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return line.substr(6);
  }
  return "?";
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

template <typename T>
void append(std::string& bytes, T value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

int generate(const std::string& directory, int files, double total_tokens, int64_t sequences, uint64_t seed) {
  std::filesystem::create_directories(directory);
  std::mt19937_64 generator(seed);
  // File sizes vary by a factor of ten, like the shards of a real corpus; lengths within a file
  // are exponential around the mean, cut at int32.
  std::uniform_real_distribution<double> file_scale(0.2, 2.0);
  std::vector<double> scales(static_cast<size_t>(files));
  double scale_sum = 0;
  for (double& scale : scales) scale_sum += (scale = file_scale(generator));
  double written = 0;
  for (int f = 0; f < files; ++f) {
    const double mean = total_tokens * scales[static_cast<size_t>(f)] / scale_sum / static_cast<double>(sequences);
    std::exponential_distribution<double> length(1.0 / mean);
    std::string index("MMIDIDX\0\0", 9);
    append<uint64_t>(index, 1);
    append<uint8_t>(index, static_cast<uint8_t>(backend::DType::uint16));
    append<uint64_t>(index, static_cast<uint64_t>(sequences));
    append<uint64_t>(index, static_cast<uint64_t>(sequences + 1));
    std::vector<int64_t> pointers(static_cast<size_t>(sequences));
    int64_t pointer = 0;
    for (int64_t s = 0; s < sequences; ++s) {
      const auto tokens = static_cast<int32_t>(std::min(2.0e9, 1.0 + length(generator)));
      append<int32_t>(index, tokens);
      pointers[static_cast<size_t>(s)] = pointer;
      pointer += 2 * static_cast<int64_t>(tokens);
    }
    for (int64_t p : pointers) append<int64_t>(index, p);
    for (int64_t d = 0; d <= sequences; ++d) append<int64_t>(index, d);
    const std::string prefix = directory + "/" + fmt::format("part_{:05d}", f);
    std::ofstream(prefix + ".idx", std::ios::binary).write(index.data(), static_cast<std::streamsize>(index.size()));
    { std::ofstream create(prefix + ".bin", std::ios::binary); }
    std::filesystem::resize_file(prefix + ".bin", static_cast<uintmax_t>(pointer));  // sparse
    written += static_cast<double>(pointer) / 2;
  }
  std::printf("generated %d datasets, %.4g tokens, %lld sequences each, in %s\n", files, written,
              static_cast<long long>(sequences), directory.c_str());
  return 0;
}

int build(const std::string& directory, int64_t seq_length, int64_t train_samples, int threads,
          const std::string& cache) {
  std::vector<std::string> prefixes;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (entry.path().extension() == ".idx") prefixes.push_back((entry.path().parent_path() / entry.path().stem()).string());
  }
  std::sort(prefixes.begin(), prefixes.end());
  const auto start = Clock::now();
  backend::DataBlend blend;
  blend.weights.emplace();
  double tokens = 0;
  for (const auto& prefix : prefixes) {
    backend::IndexedDataset dataset(prefix);
    double count = static_cast<double>(dataset.data().size()) / 2;
    blend.prefixes.push_back(prefix);
    blend.weights->push_back(count);
    tokens += count;
  }
  std::printf("read %zu indices (%.4g tokens) for the weights: %.2f s, resident %s\n", prefixes.size(),
              tokens, seconds_since(start), resident_memory().c_str());
  backend::GptDataBuildOptions options;
  options.sources.blend = blend;
  options.sources.split = "969,30,1";
  options.dataset.sequence_length = seq_length;
  options.dataset.tokenizer = {{"class", "GPT2BPETokenizer"}, {"vocab_size", 50257}};
  options.dataset.cache_path = cache;
  options.num_threads = threads;
  options.why_needed = {"bench", "bench", "bench"};
  const auto build_start = Clock::now();
  const auto datasets = backend::build_gpt_datasets(options, {train_samples, 0, 0});
  std::printf("built the train split: %lld samples from %zu datasets: %.2f s (%d threads), resident %s\n",
              static_cast<long long>(datasets[0]->size()), prefixes.size(), seconds_since(build_start),
              threads, resident_memory().c_str());
  std::vector<int32_t> sample(static_cast<size_t>(seq_length + 1));
  const auto read_start = Clock::now();
  std::mt19937_64 generator(1);
  std::uniform_int_distribution<int64_t> pick(0, datasets[0]->size() - 1);
  for (int i = 0; i < 1000; ++i) datasets[0]->sample(pick(generator), sample);  // sparse: zeros
  std::printf("1000 random samples read: %.3f s\n", seconds_since(read_start));
  std::printf("total: %.2f s\n", seconds_since(start));
  return 0;
}

int blend(int datasets, int64_t samples) {
  std::mt19937_64 generator(3);
  std::uniform_real_distribution<double> uniform(0.2, 2.0);
  std::vector<double> weights(static_cast<size_t>(datasets));
  for (double& weight : weights) weight = uniform(generator);
  weights = backend::normalize_weights(weights, "bench");
  std::vector<int16_t> index(static_cast<size_t>(samples));
  std::vector<int64_t> sample_index(static_cast<size_t>(samples));
  auto start = Clock::now();
  backend::build_blending_indices(weights, index, sample_index);
  const double ours = seconds_since(start);
  // Megatron's scan, on a prefix of the steps (it is the slow one).
  const int64_t scanned = std::min<int64_t>(samples, 200000000 / std::max(1, datasets));
  std::vector<int64_t> taken(weights.size(), 0);
  start = Clock::now();
  int64_t agree = 0;
  for (int64_t step = 0; step < scanned; ++step) {
    const double x = std::max(static_cast<double>(step), 1.0);
    size_t best = 0;
    double best_error = backend::blending_error(weights[0], x, taken[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double error = backend::blending_error(weights[d], x, taken[d]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    agree += index[static_cast<size_t>(step)] == static_cast<int16_t>(best);
    ++taken[best];
  }
  const double scan = seconds_since(start);
  std::printf("%d datasets, %lld samples: ours %.3f s (%.1f ns/sample); Megatron's scan "
              "%.1f ns/sample (over %lld samples, %lld agree) → %.0fx\n",
              datasets, static_cast<long long>(samples), ours, 1e9 * ours / static_cast<double>(samples),
              1e9 * scan / static_cast<double>(scanned), static_cast<long long>(scanned),
              static_cast<long long>(agree),
              (scan / static_cast<double>(scanned)) / (ours / static_cast<double>(samples)));
  return agree == scanned ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "generate" && argc == 7) {
      return generate(argv[2], std::stoi(argv[3]), std::stod(argv[4]), std::stoll(argv[5]), std::stoull(argv[6]));
    }
    if (mode == "build" && argc == 7) {
      return build(argv[2], std::stoll(argv[3]), std::stoll(argv[4]), std::stoi(argv[5]), argv[6]);
    }
    if (mode == "blend" && argc == 4) return blend(std::stoi(argv[2]), std::stoll(argv[3]));
    std::fprintf(stderr, "usage: see the comment at the top of tests/bench/dataset_index_bench.cpp\n");
    return 2;
  } catch (const common::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  }
}
