// The logging flags as one value: Megatron-LM's logging arguments (megatron/training/
// arguments.py: _add_logging_args, and --log-interval from _add_training_args) under its dest
// names, with our --benchmark-output and --log-dir; and LoggedRun, what the log lines and the
// benchmark report say about the run they log. pretrain_gpt's parser fills LoggingArguments from
// its logging tables (backend/train/arguments.cpp); TrainingLog (training_log.hpp) and the
// benchmark report (benchmark_report.hpp) read these two and nothing else of the arguments.
#pragma once

#include <cstdint>
#include <string>

#include "backend/dist/parallelism_arguments.hpp"
#include "backend/model/model_arguments.hpp"

namespace backend {

struct LoggingArguments {
  int64_t log_interval = 100;    // the iteration line every N iterations
  std::string benchmark_output;  // our extension: write benchmark.json here at the end
  bool log_throughput = false;   // TFLOP/s per GPU in the iteration line, and our own line
  std::string tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  int64_t tensorboard_queue_size = 1000;
  bool log_timers_to_tensorboard = false;
  bool log_params_norm = false;  // " params norm: X |" in the iteration line, params-norm scalar
  bool log_num_zeros_in_grad = false;  // " num zeros: X |" in the iteration line, num-zeros scalar
  bool log_loss_scale_to_tensorboard = true;  // --no-log-loss-scale-to-tensorboard
  bool log_validation_ppl_to_tensorboard = false;
  bool log_world_size_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;  // the device's memory (Megatron's mem-* tags)
  std::string log_dir;  // our extension (NeMo's log dir): cmd-args.log and hparams.yaml
};

// What the log reports about the run besides its iterations: the model and the global batch for
// Megatron's FLOP count (num_floating_point_operations), the run's length for the iteration
// line's "iteration N/ T", the ranks the FLOPs are shared by.
struct LoggedRun {
  ModelArguments model;
  int64_t padded_vocab_size = 0;
  int64_t micro_batch_size = 0;
  int64_t global_batch_size = 0;
  int64_t train_iters = 0;
  ParallelismArguments parallelism;
};

}  // namespace backend
