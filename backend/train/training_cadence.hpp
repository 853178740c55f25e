// When the training loop evaluates, saves a checkpoint and exits, as Megatron-LM's train()
// decides (megatron/training/training.py: the --eval-interval check and
// checkpoint_and_decide_exit), as pure functions of the iteration and the arguments.
// After iteration i (counted from 1):
//   evaluate  --eval-iters > 0 and i % --eval-interval = 0 and i ≠ --train-iters
//             (the last iteration gets the final validation and test passes instead), unless
//             a SIGTERM asks to stop (below)
//   save      --save given, and i % --save-interval = 0 (--save-interval 0: never) or exit
//   exit      i % --exit-interval = 0 (--exit-interval 0: never), or the run has lasted more
//             than --exit-duration-in-mins, or a rank got SIGTERM under --exit-signal-handler
//             (both decided by every rank together: the caller's ExitConditions); neither the
//             final evaluation nor another save follows (Megatron's sys.exit)
// A SIGTERM is the scheduler's notice before SIGKILL, so its iteration saves at once: Megatron
// validates first when the iteration is also an --eval-interval one, which can spend the
// notice; the resumed run does not validate that iteration either.
// After the loop ends at --train-iters: save the last iteration, max(resumed, --train-iters),
// unless it is 0 or --save holds it already (saved by the interval, or loaded from --save).
#pragma once

#include <cstdint>
#include <optional>

#include "backend/train/arguments.hpp"

namespace backend {

// In this order: evaluate, save, exit.
struct IterationActions {
  bool evaluate = false;
  bool save = false;
  bool exit = false;
};

// What the ranks decided together after an iteration (the trainer's max all-reduces).
struct ExitConditions {
  bool duration_exceeded = false;     // --exit-duration-in-mins has passed
  bool exit_signal_received = false;  // --exit-signal-handler: SIGTERM reached a rank
};

IterationActions actions_after_iteration(const TrainingArguments& arguments, int64_t iteration,
                                         ExitConditions conditions = {});

// The iteration to save once training has run to the end, if any. `last_saved_iteration`: the
// last iteration a checkpoint in --save holds from this run or the one it resumed (−1: none).
std::optional<int64_t> iteration_to_save_at_end(const TrainingArguments& arguments,
                                                int64_t resumed_iteration,
                                                int64_t last_saved_iteration);

}  // namespace backend
