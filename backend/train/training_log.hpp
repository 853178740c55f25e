// Megatron-LM's log lines, byte for byte (megatron/training/training.py: training_log and
// evaluate_and_print_results), because users and their tools parse them:
//  " [2024-05-01 12:00:00] iteration        5/      10 | consumed samples:           40 |
//    elapsed time per iteration (ms): 812.3 | learning rate: 1.000000E-04 | global batch
//    size:     8 | lm loss: 1.082345E+01 | loss scale: 1.0 | grad norm: 1.234 | number of
//    skipped iterations:   0 | number of nan iterations:   0 |"        (one line)
// and the validation block: a line of dashes, " validation loss at <prefix> | lm loss value:
// X | lm loss PPL: Y | ", a line of dashes, where PPL = exp(min(20, loss)) and the dashes are
// one longer than the middle line.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

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
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
};

std::string format_iteration_line(const IterationLogFields& fields);

// Our extension to the iteration line, printed on a line of its own right after it with
// --log-throughput, so Megatron's iteration line stays byte for byte what log parsers expect:
//  " throughput: 41120.2 tokens/s | MFU: 11.6% of the measured 0.235 TFLOP/s sgemm peak |"
// with MFU = achieved model FLOP/s (Megatron's formula) / the measured peak.
std::string format_throughput_extension_line(double tokens_per_second, double achieved_flops,
                                             double peak_flops);

// The three lines of a validation/test report; prefix e.g. "iteration 100" or
// "iteration 100 on test set".
std::vector<std::string> format_evaluation_block(const std::string& prefix, double lm_loss);

// " [YYYY-MM-DD HH:MM:SS]" in local time, as Megatron's datetime.now().strftime(...).
std::string format_timestamp(std::time_t timestamp);

}  // namespace backend
