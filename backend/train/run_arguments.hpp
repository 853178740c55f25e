// The run's own flags as values: its batches, length, seed and when it stops early
// (RunArguments: Megatron-LM's _add_training_args and the exit flags), and when it validates
// (EvaluationArguments: _add_validation_args), under Megatron's dest names. pretrain_gpt's parser
// fills them from kRunFlags, kExitFlags and kEvaluationFlags (arguments.cpp); the training
// schedule (training_schedule.hpp) turns the batches and the length into the iterations, and the
// cadence (training_cadence.hpp) the intervals into what each iteration does after its step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace backend {

struct RunArguments {
  int64_t micro_batch_size = 0;
  int64_t global_batch_size = 0;  // 0 → micro_batch_size × data-parallel size
  int64_t train_iters = 0;        // with --train-samples: derived as Megatron's update_train_iters
  int64_t train_samples = 0;      // --train-samples: sample-based training (0: iteration-based)
  bool train_iters_derived = false;  // set by validation when train_iters came from train_samples
  std::vector<int64_t> rampup_batch_size;  // --rampup-batch-size START INCREMENT SAMPLES
  uint64_t seed = 1234;
  int64_t exit_interval = 0;         // 0: train to --train-iters
  double exit_duration_in_mins = 0;  // 0: no time limit
  // On the signal: finish the iteration, save (with --save) and exit 0 (exit_signal_handler.hpp).
  bool exit_signal_handler = false;
  // The one the handler takes, by name (exit_signal_number maps it; a name, not an enum, since
  // <csignal> makes SIGTERM and the others macros).
  std::string exit_signal = "SIGTERM";
};

struct EvaluationArguments {
  int64_t eval_interval = 1000;  // validate every N iterations
  int64_t eval_iters = 100;      // batches per validation or test pass
};

}  // namespace backend
