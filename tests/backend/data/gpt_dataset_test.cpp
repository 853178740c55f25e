// Megatron's GPT dataset: the epoch plan, the invariants of the three index arrays, samples read
// back from the sequences the indices name, the cache (written once, memory-mapped after,
// rebuilt when damaged), and parity with a numpy transcription of Megatron's algorithms.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <thread>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/gpt_dataset.hpp"
#include "tests/backend/data/dataset_fixture.hpp"
#include "tests/backend/data/numpy_reference.hpp"
#include "tests/temporary_directory.hpp"

using namespace backend;
using test_support::dataset_reference;
using test_support::fixture_token;
using test_support::numpy_available;
using test_support::random_lengths;
using test_support::run_command;
using test_support::TemporaryDirectory;
using test_support::write_fixture_dataset;

namespace {

GptDatasetConfig config_with(int64_t sequence_length, std::string cache_path = "") {
  GptDatasetConfig config;
  config.random_seed = 1234;
  config.sequence_length = sequence_length;
  config.split = "1";
  config.split_matrix = split_matrix_from_vector(parse_split("1"));
  config.tokenizer = {{"class", "NullTokenizer"}, {"vocab_size", 65001}};
  config.cache_path = std::move(cache_path);
  return config;
}

std::vector<int64_t> read_npy_values(const std::filesystem::path& path) {
  NpyArray array(path);
  std::vector<int64_t> values(static_cast<size_t>(array.size()));
  for (int64_t i = 0; i < array.size(); ++i) values[static_cast<size_t>(i)] = array[i];
  return values;
}

std::string cache_base(const GptDataset& dataset) {
  return (std::filesystem::path(dataset.cache_directory()) /
          (dataset.description_hash() + "-GPTDataset-" + megatron_split_name(dataset.split())))
      .string();
}

}  // namespace

TEST_CASE("epochs: the fewest that cover the samples — the final one apart below 80 %") {
  // 100 tokens per epoch, samples of 10 + 1 tokens overlapping by one.
  CHECK(plan_epochs(100, std::nullopt, 10).num_epochs == 1);
  CHECK(plan_epochs(100, 9, 10).num_epochs == 1);   // 9 · 10 + 1 = 91 ≤ 100
  CHECK(plan_epochs(100, 10, 10).num_epochs == 2);  // 101 > 100
  // 25 samples need 251 tokens: 3 epochs; the first two give (200 − 1) // 10 = 19 samples, so 6
  // come from the last, fewer than int(0.8 · 9) = 7: the last epoch is shuffled on its own.
  const auto separate = plan_epochs(100, 25, 10);
  CHECK(separate.num_epochs == 3);
  CHECK(separate.separate_final_epoch);
  CHECK(separate.num_samples_sans_final_epoch == 19);
  const auto together = plan_epochs(100, 27, 10);  // 8 from the last epoch: not below 7
  CHECK(together.num_epochs == 3);
  CHECK_FALSE(together.separate_final_epoch);
}

TEST_CASE("the index arrays: every token used once per epoch, samples overlapping by one") {
  const std::vector<int32_t> lengths = random_lengths(60, 0, 40, 3);
  for (const auto& [begin, end, epochs, separate] :
       {std::tuple{0, 60, 1, false}, std::tuple{10, 50, 3, false}, std::tuple{5, 60, 4, true}}) {
    const int first_document = begin;  // clang 14 cannot capture a structured binding (CAPTURE)
    CAPTURE(first_document);
    std::vector<int32_t> documents(static_cast<size_t>(end - begin));
    std::iota(documents.begin(), documents.end(), begin);
    NumpyRandomState random(99);
    const auto document_index = build_document_index(documents, epochs, random, separate);

    // Each epoch holds every document once; a separate final epoch is a permutation on its own.
    REQUIRE(document_index.size() == documents.size() * static_cast<size_t>(epochs));
    std::map<int32_t, int> seen;
    for (int32_t d : document_index) ++seen[d];
    for (int32_t d : documents) CHECK(seen[d] == epochs);
    if (separate) {
      std::vector<int32_t> last(document_index.end() - static_cast<std::ptrdiff_t>(documents.size()),
                                document_index.end());
      std::sort(last.begin(), last.end());
      CHECK(last == documents);
    }
    CHECK_FALSE(std::is_sorted(document_index.begin(), document_index.end()));

    int64_t tokens_per_epoch = 0;
    for (int32_t d : documents) tokens_per_epoch += lengths[static_cast<size_t>(d)];
    const int64_t seq = 16;
    const auto rows = build_sample_index<int32_t>(lengths, document_index, seq, epochs, tokens_per_epoch);
    const int64_t samples = static_cast<int64_t>(rows.size() / 2) - 1;
    CHECK(samples == (epochs * tokens_per_epoch - 1) / seq);
    // Row j points at token j · seq of the stream of the document index's tokens, inside a
    // document; the tokens left over after the last sample are fewer than a sample.
    std::vector<int64_t> stream_start(document_index.size() + 1, 0);
    for (size_t p = 0; p < document_index.size(); ++p) {
      stream_start[p + 1] = stream_start[p] + lengths[static_cast<size_t>(document_index[p])];
    }
    for (int64_t j = 0; j <= samples; ++j) {
      const int64_t position = rows[static_cast<size_t>(2 * j)], offset = rows[static_cast<size_t>(2 * j + 1)];
      CHECK(stream_start[static_cast<size_t>(position)] + offset == j * seq);
      CHECK(offset >= 0);
      if (j > 0) CHECK(offset < lengths[static_cast<size_t>(document_index[static_cast<size_t>(position)])]);
    }
    CHECK(stream_start.back() - (samples * seq + 1) < seq);

    const int64_t first = separate ? samples / 2 : samples;
    const auto shuffle = build_shuffle_index<uint32_t>(first, samples, random);
    std::vector<uint32_t> sorted = shuffle;
    std::sort(sorted.begin(), sorted.begin() + first);
    std::sort(sorted.begin() + first, sorted.end());
    for (int64_t i = 0; i < samples; ++i) CHECK(sorted[static_cast<size_t>(i)] == static_cast<uint32_t>(i));
  }
}

TEST_CASE("samples are seq_length + 1 consecutive tokens of the shuffled document stream") {
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "corpus_text_document").string();
  const auto lengths = random_lengths(40, 0, 30, 5);
  write_fixture_dataset(prefix, lengths);
  auto indexed = std::make_shared<const IndexedDataset>(prefix);
  const int64_t seq = 8;
  GptDataset dataset(indexed, prefix, 4, 36, 70, Split::validation, config_with(seq));
  REQUIRE(dataset.size() >= 70);
  CHECK(dataset.built_anew());
  CHECK(dataset.cache_directory() == prefix + "/cache/GPTDataset_indices");

  const std::string base = cache_base(dataset);
  const auto document_index = read_npy_values(base + "-document_index.npy");
  const auto shuffle = read_npy_values(base + "-shuffle_index.npy");
  std::vector<int32_t> stream;
  for (int64_t sequence : document_index) {
    for (int32_t t = 0; t < lengths[static_cast<size_t>(sequence)]; ++t)
      stream.push_back(fixture_token(sequence, t));
  }
  std::vector<int32_t> sample(static_cast<size_t>(seq + 1));
  for (int64_t i = 0; i < dataset.size(); ++i) {
    dataset.sample(i, sample);
    const int64_t start = shuffle[static_cast<size_t>(i)] * seq;
    CAPTURE(i);
    CHECK(std::equal(sample.begin(), sample.end(), stream.begin() + start));
  }
  CHECK_THROWS_WITH_AS(dataset.sample(dataset.size(), sample),
                       doctest::Contains(("of the valid split of " + prefix + " does not exist").c_str()),
                       common::Error);
}

TEST_CASE("the cache: built once, memory-mapped after, keyed by the description") {
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "c").string();
  write_fixture_dataset(prefix, random_lengths(50, 1, 20, 9));
  auto indexed = std::make_shared<const IndexedDataset>(prefix);
  const GptDatasetConfig config = config_with(4);

  GptDataset first(indexed, prefix, 0, 50, 100, Split::train, config);
  REQUIRE(first.built_anew());
  const std::string base = cache_base(first);
  const auto written = std::filesystem::last_write_time(base + "-sample_index.npy");
  const auto description = base + "-description.txt";
  REQUIRE(std::filesystem::exists(description));

  GptDataset second(indexed, prefix, 0, 50, 100, Split::train, config);
  CHECK_FALSE(second.built_anew());
  CHECK(second.description_hash() == first.description_hash());
  CHECK(std::filesystem::last_write_time(base + "-sample_index.npy") == written);
  CHECK(second.size() == first.size());
  std::vector<int32_t> a(5), b(5);
  for (int64_t i = 0; i < first.size(); ++i) {
    first.sample(i, a);
    second.sample(i, b);
    CHECK(a == b);
  }

  // Another seed, sample count or split is another description, hence other files.
  GptDatasetConfig reseeded = config;
  reseeded.random_seed = 7;
  GptDataset third(indexed, prefix, 0, 50, 100, Split::train, reseeded);
  CHECK(third.built_anew());
  CHECK(third.description_hash() != first.description_hash());
  CHECK(GptDataset(indexed, prefix, 0, 50, 101, Split::train, config).description_hash() != first.description_hash());

  // A damaged array is rebuilt, not trusted; so is a description that does not match.
  std::filesystem::resize_file(base + "-shuffle_index.npy", 100);
  GptDataset repaired(indexed, prefix, 0, 50, 100, Split::train, config);
  CHECK(repaired.built_anew());
  CHECK(read_npy_values(base + "-shuffle_index.npy").size() == static_cast<size_t>(first.size()));
  std::ofstream(description, std::ios::app) << " ";
  CHECK(GptDataset(indexed, prefix, 0, 50, 100, Split::train, config).built_anew());

  // --data-cache-path moves the files; a path that cannot be a directory says which flag helps.
  const auto elsewhere = directory.path / "index_cache";
  GptDataset moved(indexed, prefix, 0, 50, 100, Split::train, config_with(4, elsewhere.string()));
  CHECK(moved.cache_directory() == elsewhere.string());
  CHECK(std::filesystem::exists(elsewhere / (moved.description_hash() + "-GPTDataset-train-shuffle_index.npy")));
  std::ofstream(directory.path / "a_file") << "x";
  CHECK_THROWS_WITH_AS(GptDataset(indexed, prefix, 0, 50, 100, Split::train,
                                  config_with(4, (directory.path / "a_file" / "cache").string())),
                       doctest::Contains("pass --data-cache-path DIR"), common::Error);
}

TEST_CASE("threads building the same cache at once all succeed and agree") {
  // Same process, same pid: every temporary name must still be unique to its writer.
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "c").string();
  write_fixture_dataset(prefix, random_lengths(3000, 1, 60, 4));
  auto indexed = std::make_shared<const IndexedDataset>(prefix);
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    std::filesystem::remove_all(prefix);  // a cold cache
    constexpr int kThreads = 8;
    std::vector<std::string> failures(kThreads);
    std::vector<int64_t> sizes(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        try {
          GptDataset dataset(indexed, prefix, 0, 3000, 20000, Split::train, config_with(8));
          sizes[static_cast<size_t>(t)] = dataset.size();
          std::vector<int32_t> sample(9);
          for (int64_t i = 0; i < dataset.size(); i += 97) dataset.sample(i, sample);
        } catch (const std::exception& error) {
          failures[static_cast<size_t>(t)] = error.what();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (const auto& failure : failures) CHECK_MESSAGE(failure.empty(), failure);
    CHECK(std::count(sizes.begin(), sizes.end(), sizes[0]) == kThreads);
    for (const auto& entry : std::filesystem::recursive_directory_iterator(prefix)) {
      CHECK(entry.path().filename().string().find(".tmp") == std::string::npos);
    }
  }
}

TEST_CASE("an empty range gives a dataset without samples and without cache files") {
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "e").string();
  write_fixture_dataset(prefix, {5, 0, 0, 7});
  auto indexed = std::make_shared<const IndexedDataset>(prefix);
  GptDataset empty(indexed, prefix, 1, 3, 10, Split::test, config_with(4));
  CHECK(empty.size() == 0);
  CHECK_FALSE(std::filesystem::exists(prefix + "/cache"));
  GptDataset none(indexed, prefix, 2, 2, 10, Split::test, config_with(4));
  CHECK(none.size() == 0);
}

TEST_CASE("the indices equal a numpy transcription of Megatron's, element for element") {
  if (!numpy_available()) return;
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "parity_text_document").string();
  write_fixture_dataset(prefix, random_lengths(300, 0, 120, 17));
  auto indexed = std::make_shared<const IndexedDataset>(prefix);
  struct Case {
    int64_t begin, end;
    std::optional<int64_t> samples;
    int64_t seq;
    uint32_t seed;
  };
  // One epoch; several with the final one apart; several without; no sample count (one epoch);
  // a range in the middle; seeds at both ends of numpy's range.
  bool separate_seen = false, together_seen = false;
  for (const Case& c : {Case{0, 300, 200, 32, 1234}, Case{0, 300, 1050, 64, 1234},
                        Case{0, 300, 1250, 64, 1234}, Case{20, 280, std::nullopt, 16, 0},
                        Case{100, 130, 900, 10, 4294967295u}, Case{0, 300, 40000, 2, 42}}) {
    int64_t tokens = 0;
    for (int64_t s = c.begin; s < c.end; ++s) tokens += indexed->sequence_length(s);
    const EpochPlan plan = plan_epochs(tokens, c.samples, c.seq);
    separate_seen |= plan.separate_final_epoch;
    together_seen |= plan.num_epochs > 1 && !plan.separate_final_epoch;
    GptDatasetConfig config = config_with(c.seq);
    config.random_seed = c.seed;
    GptDataset dataset(indexed, prefix, c.begin, c.end, c.samples, Split::train, config);
    const auto result = run_command(dataset_reference(fmt::format(
        "gpt {}.idx {} {} {} {} {} {}", prefix, c.begin, c.end,
        c.samples ? std::to_string(*c.samples) : "None", c.seq, c.seed, cache_base(dataset))));
    CAPTURE(c.samples.value_or(-1));
    CAPTURE(result.output);
    CHECK(result.exit_status == 0);
  }
  CHECK(separate_seen);
  CHECK(together_seen);
}
