// Megatron-LM's training and validation log lines; see training_log.hpp.
#include "backend/train/training_log.hpp"

#include "backend/common/local_time.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace backend {

std::string format_timestamp(std::time_t timestamp) { return common::format_local_time(timestamp); }

std::string format_iteration_line(const IterationLogFields& f) {
  std::string line = fmt::format(" [{}]", format_timestamp(f.timestamp));
  line += fmt::format(" iteration {:8d}/{:8d} |", f.iteration, f.train_iters);
  line += fmt::format(" consumed samples: {:12d} |", f.consumed_samples);
  line += fmt::format(" elapsed time per iteration (ms): {:.1f} |", f.elapsed_ms_per_iteration);
  if (f.throughput_tflops_per_gpu) {
    line += fmt::format(" throughput per GPU (TFLOP/s/GPU): {:.1f} |", *f.throughput_tflops_per_gpu);
  }
  line += fmt::format(" learning rate: {:.6E} |", f.learning_rate);
  line += fmt::format(" global batch size: {:5d} |", f.global_batch_size);
  line += fmt::format(" lm loss: {:.6E} |", f.lm_loss);
  line += fmt::format(" loss scale: {:.1f} |", f.loss_scale);
  line += fmt::format(" grad norm: {:.3f} |", f.grad_norm);
  line += fmt::format(" number of skipped iterations: {:3d} |", f.skipped_iterations);
  line += fmt::format(" number of nan iterations: {:3d} |", f.nan_iterations);
  return line;
}

std::string format_throughput_extension_line(double tokens_per_second, double achieved_flops,
                                             double peak_flops) {
  const double mfu = peak_flops > 0 ? achieved_flops / peak_flops : 0.0;
  return fmt::format(" throughput: {:.1f} tokens/s | MFU: {:.1f}% of the measured {:.3f} TFLOP/s "
                     "sgemm peak |", tokens_per_second, 100.0 * mfu, peak_flops / 1e12);
}

std::vector<std::string> format_evaluation_block(const std::string& prefix, double lm_loss) {
  const double perplexity = std::exp(std::min(20.0, lm_loss));
  std::string middle = fmt::format(" validation loss at {} | ", prefix);
  middle += fmt::format("lm loss value: {:.6E} | ", lm_loss);
  middle += fmt::format("lm loss PPL: {:.6E} | ", perplexity);
  const std::string dashes(middle.size() + 1, '-');
  return {dashes, middle, dashes};
}

}  // namespace backend
