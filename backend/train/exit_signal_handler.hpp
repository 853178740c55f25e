// Megatron-LM's --exit-signal-handler (megatron/training/dist_signal_handler.py): while an
// ExitSignalHandler lives, its signal (SIGTERM, or Megatron's --exit-signal) does not end the
// process; it is only noted, and the training loop asks received() after each iteration, saves
// a checkpoint and exits there, as Megatron's checkpoint_and_decide_exit does. This is what makes a Slurm time limit or a preemption (SIGTERM,
// then SIGKILL KillWait seconds later) cost at most one iteration rather than everything since
// the last --save-interval. Which rank got the signal is the trainer's business: every rank asks
// all the others (a max all-reduce), so all of them save the same iteration and stop together.
//
// A signal handler can only reach static storage, so the flag it sets is one per process; at most
// one ExitSignalHandler exists at a time (a second is a programming error, std::logic_error),
// and its destructor puts back the disposition it found.
#pragma once

#include <signal.h>

#include <optional>
#include <string_view>

namespace backend {

// The signals --exit-signal takes, by Python's names (signal.Signals), and their numbers: those
// a process can catch that schedulers send as notice (sbatch --signal, qsig).
std::optional<int> exit_signal_number(std::string_view name);

class ExitSignalHandler {
 public:
  explicit ExitSignalHandler(int signal_number = SIGTERM);
  ~ExitSignalHandler();
  ExitSignalHandler(const ExitSignalHandler&) = delete;
  ExitSignalHandler& operator=(const ExitSignalHandler&) = delete;

  // Whether the signal arrived since this object was made.
  bool received() const;

 private:
  int signal_number_;
  struct sigaction previous_ {};
};

}  // namespace backend
