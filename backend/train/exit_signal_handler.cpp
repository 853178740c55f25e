// See exit_signal_handler.hpp.
#include "backend/train/exit_signal_handler.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace backend {

namespace {

// Lock-free, so the handler's store is async-signal-safe.
std::atomic<bool> signal_received{false};
std::atomic<bool> handler_installed{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void note_exit_signal(int) {
  signal_received.store(true);
}

}  // namespace

ExitSignalHandler::ExitSignalHandler() {
  if (handler_installed.exchange(true)) {
    throw std::logic_error("ExitSignalHandler: one already exists in this process");
  }
  signal_received.store(false);
  struct sigaction action {};
  action.sa_handler = note_exit_signal;
  sigemptyset(&action.sa_mask);
  // Restarted system calls: a read or a collective that the signal interrupts goes on.
  action.sa_flags = SA_RESTART;
  if (sigaction(SIGTERM, &action, &previous_) != 0) {
    handler_installed.store(false);
    throw std::runtime_error(std::string("sigaction(SIGTERM): ") + std::strerror(errno));
  }
}

ExitSignalHandler::~ExitSignalHandler() {
  sigaction(SIGTERM, &previous_, nullptr);
  handler_installed.store(false);
}

bool ExitSignalHandler::received() const {
  return signal_received.load();
}

}  // namespace backend
