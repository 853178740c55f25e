// The collective watchdog; see collective_watchdog.hpp.
#include "backend/dist/collective_watchdog.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "backend/common/error.hpp"

namespace backend {

void end_this_rank(const std::string& message) {
  spdlog::error("{}", message);
  spdlog::default_logger()->flush();
  std::fflush(nullptr);  // the iteration lines printed so far, before the process goes
  std::_Exit(2);
}

std::string format_timeout(double minutes) {
  if (minutes >= 1) return fmt::format("{} minute{}", minutes, minutes == 1 ? "" : "s");
  const double seconds = minutes * 60;
  return fmt::format("{:.3g} second{}", seconds, seconds == 1 ? "" : "s");
}

CollectiveWatchdog::CollectiveWatchdog(std::string who, Now now, OnTimeout on_timeout,
                                       double timeout_minutes)
    : who_(std::move(who)), now_(std::move(now)), on_timeout_(std::move(on_timeout)) {
  set_timeout_minutes(timeout_minutes);
}

CollectiveWatchdog::~CollectiveWatchdog() { stop(); }

void CollectiveWatchdog::set_timeout_minutes(double minutes) {
  if (!std::isfinite(minutes) || minutes <= 0) {
    common::fail("--distributed-timeout-minutes {}: the time a collective may wait must be a "
                 "number of minutes > 0", minutes);
  }
  // Saturated where the clock's count would overflow: such a timeout never fires.
  const double limit = std::chrono::duration<double>(Clock::duration::max()).count() / 2;
  const double seconds = minutes * 60;
  const Clock::duration timeout =
      seconds >= limit ? Clock::duration::max() / 2
                       : std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(seconds));
  const std::lock_guard lock(mutex_);
  timeout_minutes_ = minutes;
  timeout_ = timeout;
}

double CollectiveWatchdog::timeout_minutes() const {
  const std::lock_guard lock(mutex_);
  return timeout_minutes_;
}

void CollectiveWatchdog::begin(std::string_view operation, std::string_view group, int64_t peer) {
  const Clock::time_point now = now_();
  const std::lock_guard lock(mutex_);
  in_call_ = true;
  reported_ = false;
  operation_ = operation;
  group_ = group;
  peer_ = peer;
  since_ = now;
}

void CollectiveWatchdog::end() {
  const std::lock_guard lock(mutex_);
  in_call_ = false;
  operation_ = {};
  group_ = {};
}

bool CollectiveWatchdog::check() {
  std::string text;
  {
    const std::lock_guard lock(mutex_);
    if (!in_call_ || reported_) return false;
    if (now_() - since_ <= timeout_) return false;
    reported_ = true;
    // Formatted under the lock: the texts are the caller's until end(), which waits for it.
    text = message(operation_, group_, peer_, timeout_minutes_);
  }
  on_timeout_(text);
  return true;
}

bool CollectiveWatchdog::tick(Clock::duration period) {
  const Clock::time_point now = now_();
  {
    const std::lock_guard lock(mutex_);
    if (ticked_ && in_call_ && now - last_tick_ > 2 * period) {
      // Frozen from the last look until one period ago; the call lost the part of that after
      // it began.
      const Clock::time_point frozen_from = std::max(since_, last_tick_);
      const Clock::time_point frozen_to = now - period;
      if (frozen_to > frozen_from) since_ += frozen_to - frozen_from;
    }
    ticked_ = true;
    last_tick_ = now;
  }
  return check();
}

std::string CollectiveWatchdog::message(std::string_view operation, std::string_view group,
                                        int64_t peer, double minutes) const {
  return fmt::format("{}: {}{} in the {} group did not complete in {} "
                     "(--distributed-timeout-minutes {}): another rank has probably failed or "
                     "hangs; aborting the job",
                     who_, operation, peer >= 0 ? fmt::format(" with rank {}", peer) : "", group,
                     format_timeout(minutes), minutes);
}

void CollectiveWatchdog::start(std::chrono::milliseconds period) {
  ticker_.stop();
  {
    const std::lock_guard lock(mutex_);
    ticked_ = true;
    last_tick_ = now_();
  }
  ticker_.start(period, [this, period] { tick(period); });
}

void CollectiveWatchdog::stop() {
  ticker_.stop();
}

}  // namespace backend
