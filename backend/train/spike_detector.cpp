// --rollback-on-spike's detector; see spike_detector.hpp.
#include "backend/train/spike_detector.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace backend {

std::string Spike::reason() const {
  if (nan) return fmt::format("{} consecutive iterations with a NaN/Inf lm loss", nan_count);
  return fmt::format("lm loss {:.6E} > {} × median {:.6E} over the last {} iterations", lm_loss,
                     threshold, median, window);
}

double median_of(std::deque<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  if (values.size() % 2 == 1) return values[middle];
  return (values[middle - 1] + values[middle]) / 2.0;
}

SpikeDetector::SpikeDetector(SpikeDetectorSettings settings) : settings_(settings) {}

void SpikeDetector::reset() {
  losses_.clear();
  consecutive_nan_ = 0;
}

std::optional<Spike> SpikeDetector::observe(double lm_loss, bool nan) {
  if (nan || !std::isfinite(lm_loss)) {
    ++consecutive_nan_;
    if (consecutive_nan_ >= settings_.nan_iterations) {
      return Spike{.lm_loss = lm_loss, .nan = true, .median = 0, .nan_count = consecutive_nan_,
                   .threshold = settings_.threshold, .window = settings_.window};
    }
    return std::nullopt;
  }
  consecutive_nan_ = 0;
  if (static_cast<int64_t>(losses_.size()) >= settings_.window) {
    const double median = median_of(losses_);
    if (lm_loss > settings_.threshold * median) {
      return Spike{.lm_loss = lm_loss, .nan = false, .median = median, .nan_count = 0,
                   .threshold = settings_.threshold, .window = settings_.window};
    }
  }
  losses_.push_back(lm_loss);
  while (static_cast<int64_t>(losses_.size()) > settings_.window) losses_.pop_front();
  return std::nullopt;
}

}  // namespace backend
