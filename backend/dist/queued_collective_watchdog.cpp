// The watchdog of queued collectives; see queued_collective_watchdog.hpp.
#include "backend/dist/queued_collective_watchdog.hpp"

#include <fmt/format.h>

#include <utility>

#include "backend/common/error.hpp"
#include "backend/dist/collective_watchdog.hpp"

namespace backend {

QueuedCollectiveWatchdog::QueuedCollectiveWatchdog(std::string who,
                                                   std::chrono::milliseconds timeout, Now now,
                                                   OnFailure on_failure)
    : who_(std::move(who)),
      timeout_(timeout),
      now_(std::move(now)),
      on_failure_(std::move(on_failure)) {
  if (timeout_ <= std::chrono::milliseconds(0)) {
    common::fail("the queued collectives' watchdog needs a positive timeout, got {} ms",
                 timeout_.count());
  }
}

QueuedCollectiveWatchdog::~QueuedCollectiveWatchdog() {
  stop();
  const std::lock_guard lock(mutex_);
  for (Entry& entry : outstanding_) {
    if (entry.collective.release) entry.collective.release();
  }
  outstanding_.clear();
}

void QueuedCollectiveWatchdog::watch(Collective collective) {
  const std::lock_guard lock(mutex_);
  outstanding_.push_back({std::move(collective), now_()});
}

void QueuedCollectiveWatchdog::forget(const void* owner) {
  const std::lock_guard lock(mutex_);
  std::erase_if(outstanding_, [&](Entry& entry) {
    if (entry.collective.owner != owner) return false;
    if (entry.collective.release) entry.collective.release();
    return true;
  });
}

size_t QueuedCollectiveWatchdog::outstanding() const {
  const std::lock_guard lock(mutex_);
  return outstanding_.size();
}

bool QueuedCollectiveWatchdog::check() {
  std::string message;
  {
    const std::lock_guard lock(mutex_);
    if (reported_) return false;
    const Clock::time_point now = now_();
    for (auto it = outstanding_.begin(); it != outstanding_.end();) {
      const State state = it->collective.query();
      if (!state.failure.empty()) {
        message = fmt::format("{}: {} failed: {}; aborting the job", who_, it->collective.call,
                              state.failure);
        break;
      }
      if (state.done) {
        if (it->collective.release) it->collective.release();
        it = outstanding_.erase(it);
        continue;
      }
      if (now - it->since > timeout_) {
        const double minutes = std::chrono::duration<double, std::ratio<60>>(timeout_).count();
        message = fmt::format(
            "{}: {} did not complete in {} (--distributed-timeout-minutes {}): another rank has "
            "probably failed or hangs; aborting the job",
            who_, it->collective.call, format_timeout(minutes), minutes);
        break;
      }
      ++it;
    }
    if (message.empty()) return false;
    reported_ = true;
  }
  // Outside the lock: the action may end the process, or (in tests) call back in.
  on_failure_(message);
  return true;
}

void QueuedCollectiveWatchdog::start(std::chrono::milliseconds period) {
  ticker_.start(period, [this] { check(); });
}

void QueuedCollectiveWatchdog::stop() {
  ticker_.stop();
}

}  // namespace backend
