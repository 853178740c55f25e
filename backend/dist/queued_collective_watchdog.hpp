// The watchdog of collectives that are queued on a device and not waited for by the host:
// --distributed-timeout-minutes and NCCL's asynchronous errors for GPU ranks, as PyTorch's NCCL
// process group watches its work objects from a thread of its own (ProcessGroupNCCL's watchdog,
// TORCH_NCCL_ASYNC_ERROR_HANDLING).
//
// The NCCL communicator (nccl_communicator_cuda.cu) enqueues a collective on its stream, makes
// the compute stream wait for it by an event and returns: the host goes on queueing compute,
// and nothing on the host waits for the collective until a later copy to the host. A rank that
// died would then leave that copy waiting forever, with no message. So each queued collective is
// handed here with how to ask about it (done, or failed with NCCL's reason) and a thread looks at
// the outstanding ones every period: one that failed, or has been outstanding longer than the
// timeout, is reported once to the action given, which for a trainer logs the line and ends the
// process (as the MPI session's watchdog does: collective_watchdog.hpp), e.g.
//   rank 3 (host node2): ncclAllReduce in the data parallel group did not complete in 10 minutes
//   (--distributed-timeout-minutes 10): another rank has probably failed or hangs; aborting the
//   job
// A finished one is released (its event destroyed) and forgotten. The time counts from when the
// collective was queued, which includes the compute queued before it on the stream: minutes of
// timeout against milliseconds of a step's compute.
//
// The clock and the action are values passed in, so the rules are tested without a GPU
// (tests/backend/dist/queued_collective_watchdog_test.cpp). watch() and forget() come from the
// communicators' thread, check() from the watching thread; a mutex guards the list, and the
// queries and releases run under it (they are short, non-blocking CUDA and NCCL queries).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>

#include "backend/dist/periodic_thread.hpp"

namespace backend {

class QueuedCollectiveWatchdog {
 public:
  using Clock = std::chrono::steady_clock;
  using Now = std::function<Clock::time_point()>;
  using OnFailure = std::function<void(const std::string& message)>;

  // What a look at one collective finds: done, or failed (a non-empty reason), or neither.
  struct State {
    bool done = false;
    std::string failure;
  };

  struct Collective {
    std::string call;   // "ncclAllReduce in the data parallel group"
    const void* owner;  // its communicator, for forget()
    std::function<State()> query;
    std::function<void()> release;  // once, when it is done or forgotten; may be empty
  };

  // `who` starts the message: "rank 3 (host node2)". `timeout` must be positive.
  QueuedCollectiveWatchdog(std::string who, std::chrono::milliseconds timeout, Now now,
                           OnFailure on_failure);
  ~QueuedCollectiveWatchdog();  // stop(), then every outstanding collective released
  QueuedCollectiveWatchdog(const QueuedCollectiveWatchdog&) = delete;
  QueuedCollectiveWatchdog& operator=(const QueuedCollectiveWatchdog&) = delete;

  // Watched from now on.
  void watch(Collective collective);
  // Releases and drops `owner`'s outstanding collectives (a communicator that is going away,
  // after its stream has finished or its communicator was aborted).
  void forget(const void* owner);
  size_t outstanding() const;

  // One look, in queueing order: releases the finished ones; reports the first that failed or
  // outlived the timeout (once: a reported watchdog reports nothing more) and returns true then.
  bool check();

  // A thread that calls check() every `period` until stop() (or the destructor).
  void start(std::chrono::milliseconds period = std::chrono::milliseconds(100));
  void stop();

 private:
  struct Entry {
    Collective collective;
    Clock::time_point since;
  };

  const std::string who_;
  const std::chrono::milliseconds timeout_;
  const Now now_;
  const OnFailure on_failure_;

  mutable std::mutex mutex_;  // guards everything below
  std::list<Entry> outstanding_;
  bool reported_ = false;
  PeriodicThread ticker_;  // last: stopped before the members its calls use go
};

}  // namespace backend
