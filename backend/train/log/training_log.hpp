// Megatron-LM's log lines, byte for byte (megatron/training/training.py: training_log and
// evaluate_and_print_results), because users and their tools parse them:
//  " [2024-05-01 12:00:00] iteration        5/      10 | consumed samples:           40 |
//    elapsed time per iteration (ms): 812.3 | learning rate: 1.000000E-04 | global batch
//    size:     8 | lm loss: 1.082345E+01 | loss scale: 1.0 | grad norm: 1.234 | number of
//    skipped iterations:   0 | number of nan iterations:   0 |"        (one line; with
//    --log-params-norm " params norm: 123.456 |" after the grad norm)
// and the validation block: a line of dashes, " validation loss at <prefix> | lm loss value:
// X | lm loss PPL: Y | ", a line of dashes, where PPL = exp(min(20, loss)) and the dashes are
// one longer than the middle line.
//
// TrainingLog is training_log itself: it sums each iteration into the current interval
// (Megatron's total_loss_dict and timers) and every --log-interval prints the line with
//   elapsed time = mean over the interval's iterations, lm loss = mean over those that were
//   not skipped, grad norm, params norm, batch size and loss scale = the last iteration's (the scale after
//   its scaler update, as Megatron prints it), learning rate = the one the next iteration uses;
// it writes the TensorBoard scalars (every --tensorboard-log-interval, each also against the
// consumed samples) and the evaluation blocks with their scalars.
#pragma once

#include <cstdint>
#include <ctime>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/device/device_memory.hpp"
#include "backend/train/log/logging_arguments.hpp"
#include "backend/train/log/tensorboard_writer.hpp"

namespace backend {

struct IterationLogFields {
  std::time_t timestamp = 0;
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  double elapsed_ms_per_iteration = 0;
  std::optional<double> throughput_tflops_per_gpu;  // printed only with --log-throughput
  double learning_rate = 0;
  int64_t global_batch_size = 0;
  double lm_loss = 0;
  double loss_scale = 1.0;
  double grad_norm = 0;
  std::optional<double> params_norm{};  // printed only with --log-params-norm
  std::optional<double> num_zeros_in_grad{};  // printed only with --log-num-zeros-in-grad
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;  // skipped and nan: a subset of the skipped ones
};

std::string format_iteration_line(const IterationLogFields& fields);

// Our extension to the iteration line, printed on a line of its own right after it with
// --log-throughput, so Megatron's iteration line stays byte for byte what log parsers expect:
//  " throughput: 41120.2 tokens/s | MFU: 11.6% of the measured 0.235 TFLOP/s sgemm peak |"
// with MFU = achieved model FLOP/s (Megatron's formula) / the measured peak.
// `peak_name` says what was measured: "sgemm peak" on the CPU, "bf16 GEMM peak" on a GPU.
std::string format_throughput_extension_line(double tokens_per_second, double achieved_flops,
                                             double peak_flops,
                                             std::string_view peak_name = "sgemm peak");

// The three lines of a validation/test report; prefix e.g. "iteration 100" or
// "iteration 100 on test set".
std::vector<std::string> format_evaluation_block(const std::string& prefix, double lm_loss);

// " [YYYY-MM-DD HH:MM:SS]" in local time, as Megatron's datetime.now().strftime(...).
std::string format_timestamp(std::time_t timestamp);

// One finished training iteration.
struct IterationRecord {
  int64_t iteration = 0;
  double lm_loss = 0;
  double grad_norm = 0;
  double learning_rate = 0;  // the rate this iteration's update used
  bool skipped = false;
  double elapsed_ms = 0;
  int64_t global_batch_size = 0;  // grows during --rampup-batch-size
  int64_t consumed_samples = 0;   // after this iteration
  // The loss scale after this iteration's scaler update, i.e. the one the next iteration uses:
  // what Megatron's train loop reads (optimizer.get_loss_scale() after train_step) and prints.
  // 1.0 without a scaler.
  double loss_scale = 1.0;
  // The trainer marks an iteration whose loss was not finite (and, without a loss scaler, one
  // whose gradient norm was not finite: there Megatron stops instead of skipping, and we count
  // that skip as nan). Megatron counts a "nan iteration" only among the skipped ones (it looks
  // for a non-finite loss there alone), so IntervalTotals counts `skipped && nan`. An fp16
  // overflow that the loss scaler catches is skipped with a finite loss: skipped, not nan.
  bool nan = false;
  // The model's device's memory after the iteration (--log-memory-to-tensorboard writes it).
  MemoryUsage memory{};
  std::optional<double> params_norm{};  // --log-params-norm: the parameters' L2 norm after it
  std::optional<double> num_zeros_in_grad{};  // --log-num-zeros-in-grad (not when skipped)
};

// The sums over the iterations since the last iteration line.
struct IntervalTotals {
  double lm_loss_sum = 0;  // of the iterations that were not skipped
  double elapsed_ms_sum = 0;
  int64_t advanced_iterations = 0;
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;  // skipped and nan: a subset of the skipped ones

  void add(const IterationRecord& record);
  int64_t iterations() const { return advanced_iterations + skipped_iterations; }
  double mean_lm_loss() const;  // 0 when every iteration was skipped
  double elapsed_ms_per_iteration() const;
};

// Megatron's report_memory line, printed once, after the first logged interval, by every rank of
// data-parallel rank 0 (`rank` its global rank): megabytes as Python prints a float, the device's
// live allocations for "allocated" and their peak for "max allocated"; with no caching
// allocator, "reserved" is what is allocated. For example
//  "[Rank 0] (after 10 iterations) memory (MB) | allocated: 1913.25 | max allocated: 2389.5 |
//   reserved: 1913.25 | max reserved: 2389.5"   (one line)
std::string format_memory_line(int64_t rank, int64_t iteration, const MemoryUsage& usage);

class TrainingLog {
 public:
  // Opens the event file when --tensorboard-dir is given and `tensorboard` is true (a parallel
  // run's last rank only, as Megatron's get_tensorboard_writer). `peak_flops`: the measured
  // peak that --log-throughput's extension line reports MFU against, `peak_name` what it is.
  TrainingLog(LoggingArguments logging, LoggedRun run, std::optional<double> peak_flops,
              std::ostream& out, std::string peak_name = "sgemm peak", bool tensorboard = true);

  // After every iteration, with the learning rate the next one will use.
  void add_iteration(const IterationRecord& record, double next_learning_rate);
  // Megatron's evaluate_and_print_results: the block, and the loss in TensorBoard at
  // `iteration` and `consumed_train_samples`; a test pass is written as validation too.
  void add_evaluation(const std::string& prefix, int64_t iteration,
                      int64_t consumed_train_samples, double lm_loss);
  // --rollback-on-spike: prints `line` (the rollback's own line, which says why) and writes
  // the scalar `rollbacks` (how many so far) at `iteration`, the spike's.
  void add_rollback(const std::string& line, int64_t iteration, int64_t rollbacks);
  // Writes out and closes the event file (its destructor does too).
  void close();

 private:
  void print_iteration_line(const IterationRecord& record, double next_learning_rate);

  LoggingArguments logging_;
  LoggedRun run_;
  std::optional<double> peak_flops_;
  std::string peak_name_;
  std::ostream& out_;
  std::optional<TensorBoardWriter> tensorboard_;
  IntervalTotals interval_;
};

}  // namespace backend
