// The periodic thread; see periodic_thread.hpp.
#include "backend/dist/periodic_thread.hpp"

#include <utility>

namespace backend {

void PeriodicThread::start(std::chrono::milliseconds period, std::function<void()> work) {
  stop();
  {
    const std::lock_guard lock(mutex_);
    stopping_ = false;
  }
  thread_ = std::thread([this, period, work = std::move(work)] {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
      lock.unlock();
      work();
      lock.lock();
    }
  });
}

void PeriodicThread::stop() {
  if (!thread_.joinable()) return;
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

}  // namespace backend
