// Megatron's blending indices (exact, via a kinetic tournament tree) and BlendedDataset; see
// blended_dataset.hpp.
#include "backend/data/blended_dataset.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/md5.hpp"
#include "backend/common/small_file.hpp"
#include "backend/data/megatron_description.hpp"

namespace backend {

namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
// Up to this many datasets the plain scan is as fast as the tournament or faster (measured on
// one core: 64 datasets 58 ns a step against 142, 256 datasets 180 ns against 190-225, 512
// datasets 444 ns against 243).
constexpr size_t kScanLimit = 384;

// The tournament: leaves are datasets, each internal node the winner of its subtree at the
// current step (the larger error, the lower index on ties, which is what Megatron's scan from
// dataset 0 with a strict > gives) and `expires`, the first step value at which the node's or a
// descendant's comparison must be looked at again.
class BlendingTournament {
 public:
  explicit BlendingTournament(std::span<const double> weights) : weights_(weights) {
    leaves_ = 1;
    while (leaves_ < weights.size()) leaves_ *= 2;
    winner_.assign(2 * leaves_, -1);
    expires_.assign(2 * leaves_, kNever);
    own_expires_.assign(2 * leaves_, kNever);
    taken_.assign(weights.size(), 0);
    for (size_t d = 0; d < weights.size(); ++d) winner_[leaves_ + d] = static_cast<int32_t>(d);
    for (size_t node = leaves_ - 1; node >= 1; --node) recompute(node, 1);
  }

  // The dataset Megatron picks at the step whose value is x (= max(step, 1)).
  int32_t pick(int64_t x) {
    refresh(1, x);
    return winner_[1];
  }

  // The dataset's next sample is taken at step value x; returns its index.
  int64_t take(int32_t dataset, int64_t x) {
    const int64_t sample = taken_[static_cast<size_t>(dataset)]++;
    for (size_t node = (leaves_ + static_cast<size_t>(dataset)) / 2; node >= 1; node /= 2) recompute(node, x);
    return sample;
  }

 private:
  double error(int32_t dataset, int64_t x) const {
    return blending_error(weights_[static_cast<size_t>(dataset)], static_cast<double>(x),
                          taken_[static_cast<size_t>(dataset)]);
  }

  // The first step value after x at which `winner`, ahead of `loser` at x, might not be ahead.
  // The computed errors differ from weight · x − taken by at most about 2^-51 (x + 1) each
  // (one rounding of the product, one of the difference, weights ≤ 1, taken ≤ x), so while the
  // exact gap g(x') = (w_W − w_L) x' − (t_W − t_L) exceeds eps (x' + 1) with eps = 2^-46
  // (ample, also for the rounding of this very test), the comparison cannot change.
  int64_t horizon(int32_t winner, int32_t loser, int64_t x) const {
    const double weight_w = weights_[static_cast<size_t>(winner)];
    const double weight_l = weights_[static_cast<size_t>(loser)];
    constexpr double eps = 0x1p-46;
    const double slope = weight_w - weight_l;
    const double gap = static_cast<double>(taken_[static_cast<size_t>(winner)] -
                                           taken_[static_cast<size_t>(loser)]);
    const double next = static_cast<double>(x + 1);
    // Both cases are computed and one is selected, without branches: which case applies is
    // as unpredictable as the comparison itself.
    // The winner's line is steeper: the certified margin (slope − eps) x' − gap − eps grows
    // with x', so certified at x + 1 means certified for ever.
    const int64_t steeper = (slope - eps) * next - gap - eps > 0 ? kNever : x + 1;
    // Otherwise the margin shrinks: certified while x' < (−gap − eps) / (eps − slope).
    const double limit = (-gap - eps) / (eps - slope);
    const double shrunk = std::min(limit * (1 - 1e-12), 4e18);
    int64_t flatter = static_cast<int64_t>(shrunk);
    flatter = limit > 4e18 ? kNever : std::max<int64_t>(x + 1, flatter);
    flatter = limit > next ? flatter : x + 1;
    // Equal weights: both products round alike, so only the counts order the two, and they
    // change only when one of them is taken (which recomputes this node).
    const int64_t horizon = slope > eps ? steeper : flatter;
    return weight_w == weight_l ? kNever : horizon;
  }

  void recompute(size_t node, int64_t x) {
    const int32_t left = winner_[2 * node], right = winner_[2 * node + 1];
    int64_t own = kNever;
    if (left < 0) {
      winner_[node] = right;
    } else if (right < 0) {
      winner_[node] = left;
    } else {
      const bool right_ahead = error(right, x) > error(left, x);
      const int32_t winner = right_ahead ? right : left, loser = right_ahead ? left : right;
      winner_[node] = winner;
      own = horizon(winner, loser, x);
    }
    own_expires_[node] = own;
    expires_[node] = std::min({own, expires_[2 * node], expires_[2 * node + 1]});
  }

  // Brings the subtree up to step value x: expired comparisons below are redone; this node's
  // own comparison only when it expired or a child's winner changed.
  void refresh(size_t node, int64_t x) {
    if (expires_[node] > x) return;
    const int32_t left = winner_[2 * node], right = winner_[2 * node + 1];
    refresh(2 * node, x);
    refresh(2 * node + 1, x);
    if (own_expires_[node] > x && winner_[2 * node] == left && winner_[2 * node + 1] == right) {
      expires_[node] = std::min({own_expires_[node], expires_[2 * node], expires_[2 * node + 1]});
    } else {
      recompute(node, x);
    }
  }

  std::span<const double> weights_;
  size_t leaves_ = 1;
  std::vector<int32_t> winner_;
  std::vector<int64_t> expires_;      // the earliest own_expires_ in the subtree
  std::vector<int64_t> own_expires_;  // when this node's own comparison must be redone
  std::vector<int64_t> taken_;
};

}  // namespace

void build_blending_indices(std::span<const double> weights, std::span<int16_t> dataset_index,
                            std::span<int64_t> dataset_sample_index) {
  if (weights.empty() || weights.size() >= 32767) {
    common::fail("a blend of {} datasets; Megatron's blend holds 1 to 32,766 (an int16 index)",
                 weights.size());
  }
  if (dataset_index.size() != dataset_sample_index.size()) {
    common::fail("internal: blending arrays of {} and {} entries", dataset_index.size(),
                 dataset_sample_index.size());
  }
  if (weights.size() <= kScanLimit) {
    // Few datasets: Megatron's scan itself is the faster way.
    std::vector<int64_t> taken(weights.size(), 0);
    for (size_t step = 0; step < dataset_index.size(); ++step) {
      const double x = static_cast<double>(std::max<int64_t>(static_cast<int64_t>(step), 1));
      size_t best = 0;
      double best_error = blending_error(weights[0], x, taken[0]);
      for (size_t d = 1; d < weights.size(); ++d) {
        const double error = blending_error(weights[d], x, taken[d]);
        if (error > best_error) {
          best = d;
          best_error = error;
        }
      }
      dataset_index[step] = static_cast<int16_t>(best);
      dataset_sample_index[step] = taken[best]++;
    }
    return;
  }
  BlendingTournament tournament(weights);
  for (size_t step = 0; step < dataset_index.size(); ++step) {
    const int64_t x = std::max<int64_t>(static_cast<int64_t>(step), 1);
    const int32_t dataset = tournament.pick(x);
    dataset_index[step] = static_cast<int16_t>(dataset);
    dataset_sample_index[step] = tournament.take(dataset, x);
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const GptDataset>> datasets,
                               std::vector<double> weights, int64_t size,
                               const std::string& cache_path)
    : datasets_(std::move(datasets)), size_(size) {
  if (datasets_.empty() || datasets_.size() != weights.size()) {
    common::fail("internal: {} datasets and {} weights in a blend", datasets_.size(), weights.size());
  }
  weights_ = normalize_weights(weights, "the blend's weights");

  // Megatron's description and file names (blended_dataset.py): the split, taken from the first
  // dataset, is a key of the description and a part of each name.
  const char* split_name = megatron_split_name(datasets_.front()->split());
  nlohmann::ordered_json identifiers;
  identifiers["class"] = "BlendedDataset";
  identifiers["datasets"] = nlohmann::ordered_json::array();
  for (const auto& dataset : datasets_) identifiers["datasets"].push_back(dataset->unique_identifiers());
  identifiers["split"] = split_name;
  identifiers["weights"] = weights_;
  identifiers["size"] = size_;
  const std::string description = python_json_text(identifiers);
  hash_ = common::md5_hex(description);

  std::string base;
  if (!cache_path.empty()) {
    base = (std::filesystem::path(cache_path) / fmt::format("{}-BlendedDataset-{}", hash_, split_name)).string();
    const auto stored = common::read_small_file_if_exists(
        base + "-description.txt", "the BlendedDataset index cache description");
    if (stored && *stored == description) {
      try {
        NpyArray index(base + "-dataset_index.npy"), samples(base + "-dataset_sample_index.npy");
        if (index.element() != NpyElement::int16 || index.shape() != std::vector<int64_t>{size_} ||
            samples.element() != NpyElement::int64 || samples.shape() != std::vector<int64_t>{size_}) {
          common::fail("not an int16 and an int64 array of {} entries", size_);
        }
        cached_dataset_index_ = std::move(index);
        cached_dataset_sample_index_ = std::move(samples);
        spdlog::info("Load the BlendedDataset indices from {}-*.npy", base);
        return;
      } catch (const common::Error& failure) {
        spdlog::warn("the cached blend indices {}-* are unusable ({}); building them again", base,
                     failure.what());
      }
    }
  }

  const auto start = std::chrono::steady_clock::now();
  dataset_index_.resize(static_cast<size_t>(size_));
  dataset_sample_index_.resize(static_cast<size_t>(size_));
  build_blending_indices(weights_, dataset_index_, dataset_sample_index_);
  std::vector<int64_t> taken(datasets_.size(), 0);
  for (int16_t d : dataset_index_) ++taken[static_cast<size_t>(d)];
  for (size_t d = 0; d < datasets_.size(); ++d) {
    if (taken[d] > datasets_[d]->size()) {
      common::fail("the blend takes {} samples from the {} split of {}, which has {} (weight {}); "
                   "this is Megatron's blending rule overdrawing a dataset: raise the sample count "
                   "of that dataset or lower its weight", taken[d],
                   megatron_split_name(datasets_[d]->split()), datasets_[d]->prefix(),
                   datasets_[d]->size(), weights_[d]);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("Build the BlendedDataset indices: {} samples from {} datasets, {:.3f} s", size_,
               datasets_.size(), seconds);
  if (base.empty() && seconds > 10) {
    spdlog::warn("the blend's indices took {:.0f} s and are rebuilt at every start: pass "
                 "--data-cache-path DIR to keep them (Megatron caches a blend only there)", seconds);
  }
  if (!base.empty()) {
    try {
      std::filesystem::create_directories(cache_path);
      const std::vector<int64_t> shape = {size_};
      write_npy<int16_t>(base + "-dataset_index.npy", dataset_index_, shape);
      write_npy<int64_t>(base + "-dataset_sample_index.npy", dataset_sample_index_, shape);
      common::write_text_file_atomically(base + "-description.txt", description);
    } catch (const std::exception& failure) {
      common::fail("cannot write the blend's indices to --data-cache-path {}: {}", cache_path,
                   failure.what());
    }
  }
}

std::pair<int64_t, int64_t> BlendedDataset::source(int64_t index) const {
  if (index < 0 || index >= size_) {
    common::fail("sample {} of a blend of {} samples does not exist", index, size_);
  }
  if (cached_dataset_index_) {
    return {(*cached_dataset_index_)[index], (*cached_dataset_sample_index_)[index]};
  }
  return {dataset_index_[static_cast<size_t>(index)], dataset_sample_index_[static_cast<size_t>(index)]};
}

void BlendedDataset::sample(int64_t index, std::span<int32_t> out) const {
  const auto [dataset, sample] = source(index);
  if (dataset < 0 || dataset >= static_cast<int64_t>(datasets_.size())) {
    common::fail("blend sample {} names dataset {} of {}: the cached blend indices are corrupt; "
                 "delete them to rebuild", index, dataset, datasets_.size());
  }
  datasets_[static_cast<size_t>(dataset)]->sample(sample, out);
}

}  // namespace backend
