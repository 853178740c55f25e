// A thread that calls one function every period until stopped: the clock of the watchdogs
// (collective_watchdog.hpp, queued_collective_watchdog.hpp). stop() wakes it at once rather than
// at the end of its period, and waits for a call in progress to return.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace backend {

class PeriodicThread {
 public:
  PeriodicThread() = default;
  ~PeriodicThread() { stop(); }
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Calls `work` every `period` from a new thread (stopping the one before, if any).
  void start(std::chrono::milliseconds period, std::function<void()> work);
  // Idempotent.
  void stop();

 private:
  std::mutex mutex_;  // guards stopping_
  bool stopping_ = false;
  std::condition_variable wake_;
  std::thread thread_;
};

}  // namespace backend
