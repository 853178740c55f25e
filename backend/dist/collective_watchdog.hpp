// Megatron's --distributed-timeout-minutes for collectives that have no timeout of their own.
// Open MPI's collectives and point-to-point calls wait forever: when a rank is stopped, wedged,
// or has died where the launcher does not notice (srun without --kill-on-bad-exit), the others
// would wait in MPI_Allreduce until the scheduler's wall time. The watchdog bounds that wait.
//
// The MPI session owns one (mpi_session_mpi.cpp); every blocking call of its communicators marks
// "in <operation> on <group> since t" (begin/end, or the Call that watch() returns) and a thread
// of its own (start()) looks every second: when the current call has lasted longer than the
// timeout, it hands one message to the action it was given, once, e.g.
//   rank 3 (host node2): MPI_Allreduce in the data parallel group did not complete in 10 minutes
//   (--distributed-timeout-minutes 10): another rank has probably failed or hangs; aborting the
//   job
// The session's action logs that line and ends the process (mpi_session_mpi.cpp says why not
// MPI_Abort). Only the time spent inside one call counts: a long computation between calls
// never fires it, as in torch.distributed, whose timeout Megatron's flag sets. Nor does time
// this process was frozen itself (SIGSTOP, a debugger, a paused machine): the rank that was
// stopped does not blame the others when it is continued.
//
// The clock and the action are values passed in, so the logic is tested with a fake clock and
// no MPI (tests/backend/dist/collective_watchdog_test.cpp). One thread marks calls (MPI is
// initialised funneled: the main thread is its only caller), calls do not nest, and the watching
// thread reads the mark under a mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

#include "backend/dist/periodic_thread.hpp"

namespace backend {

// Megatron's default for --distributed-timeout-minutes; what applies until the flags are read.
inline constexpr double kDefaultDistributedTimeoutMinutes = 10;

// "10 minutes", "1 minute", "1.5 minutes", "3 seconds" (below a minute): for messages.
std::string format_timeout(double minutes);

// What a watchdog does with a rank that waited too long (or whose collective failed): the
// message on stderr (spdlog's error line, flushed with everything printed so far), then the end
// of this process with status 2, from whichever thread found it. Launchers end the job when a
// rank exits non-zero (mpirun; srun with --kill-on-bad-exit; torchrun's agent).
[[noreturn]] void end_this_rank(const std::string& message);

class CollectiveWatchdog {
 public:
  using Clock = std::chrono::steady_clock;
  using Now = std::function<Clock::time_point()>;
  using OnTimeout = std::function<void(const std::string& message)>;

  // `who` starts the message: "rank 3 (host node2)". `on_timeout` is called with the message,
  // from the thread that found the timeout (the watching thread once start() ran).
  CollectiveWatchdog(std::string who, Now now, OnTimeout on_timeout,
                     double timeout_minutes = kDefaultDistributedTimeoutMinutes);
  ~CollectiveWatchdog();  // stop()
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // --distributed-timeout-minutes: finite and > 0, else common::Error naming the flag. Applies
  // to the call in progress too. A timeout longer than the clock can count never fires.
  void set_timeout_minutes(double minutes);
  double timeout_minutes() const;

  // The marking thread is now in `operation` ("MPI_Allreduce") on the group named `group`
  // ("data parallel"), with world rank `peer` for a send or a receive (-1: a collective). The
  // texts must stay valid until end(), which clears the mark.
  void begin(std::string_view operation, std::string_view group, int64_t peer = -1);
  void end();

  // begin() now, end() when it goes out of scope.
  class Call {
   public:
    explicit Call(CollectiveWatchdog* watchdog) : watchdog_(watchdog) {}
    ~Call() {
      if (watchdog_ != nullptr) watchdog_->end();
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    CollectiveWatchdog* watchdog_;
  };
  [[nodiscard]] Call watch(std::string_view operation, std::string_view group, int64_t peer = -1) {
    begin(operation, group, peer);
    return Call(this);
  }

  // One look: when the current call has lasted longer than the timeout, and its timeout was not
  // reported yet, calls on_timeout with the message and returns true.
  bool check();

  // The watching thread's look, made every `period`: check(), after taking out of the current
  // call the time this process was frozen. Two looks further apart than twice the period mean
  // the process (or this thread) did not run in between; the time beyond one period is not
  // counted against the other ranks.
  bool tick(Clock::duration period);

  // A thread that calls tick() every `period` until stop() (or the destructor).
  void start(std::chrono::milliseconds period = std::chrono::seconds(1));
  void stop();

 private:
  std::string message(std::string_view operation, std::string_view group, int64_t peer,
                      double minutes) const;

  const std::string who_;
  const Now now_;
  const OnTimeout on_timeout_;

  mutable std::mutex mutex_;  // guards everything below
  double timeout_minutes_ = kDefaultDistributedTimeoutMinutes;
  Clock::duration timeout_{};
  bool in_call_ = false;
  bool reported_ = false;  // this call's timeout went to on_timeout already
  std::string_view operation_, group_;
  int64_t peer_ = -1;
  Clock::time_point since_{};
  bool ticked_ = false;  // last_tick_ is set
  Clock::time_point last_tick_{};

  PeriodicThread ticker_;  // last: stopped before the members its calls use go
};

}  // namespace backend
