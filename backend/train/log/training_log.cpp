// Megatron-LM's training and validation log lines and training_log; see training_log.hpp.
#include "backend/train/log/training_log.hpp"

#include "backend/common/local_time.hpp"
#include "backend/common/python_format.hpp"
#include "backend/train/log/benchmark_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <utility>

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
  if (f.num_zeros_in_grad) line += fmt::format(" num zeros: {:.1f} |", *f.num_zeros_in_grad);
  if (f.params_norm) line += fmt::format(" params norm: {:.3f} |", *f.params_norm);
  line += fmt::format(" number of skipped iterations: {:3d} |", f.skipped_iterations);
  line += fmt::format(" number of nan iterations: {:3d} |", f.nan_iterations);
  return line;
}

std::string format_memory_line(int64_t rank, int64_t iteration, const MemoryUsage& usage) {
  constexpr double kMegabyte = 1024.0 * 1024.0;
  const std::string allocated =
      common::format_python_float(static_cast<double>(usage.allocated_bytes) / kMegabyte);
  const std::string peak =
      common::format_python_float(static_cast<double>(usage.peak_bytes) / kMegabyte);
  return fmt::format("[Rank {}] (after {} iterations) memory (MB) | allocated: {} | max "
                     "allocated: {} | reserved: {} | max reserved: {}",
                     rank, iteration, allocated, peak, allocated, peak);
}

std::string format_throughput_extension_line(double tokens_per_second, double achieved_flops,
                                             double peak_flops, std::string_view peak_name) {
  const double mfu = peak_flops > 0 ? achieved_flops / peak_flops : 0.0;
  return fmt::format(" throughput: {:.1f} tokens/s | MFU: {:.1f}% of the measured {:.3f} TFLOP/s "
                     "{} |", tokens_per_second, 100.0 * mfu, peak_flops / 1e12, peak_name);
}

std::vector<std::string> format_evaluation_block(const std::string& prefix, double lm_loss) {
  const double perplexity = std::exp(std::min(20.0, lm_loss));
  std::string middle = fmt::format(" validation loss at {} | ", prefix);
  middle += fmt::format("lm loss value: {:.6E} | ", lm_loss);
  middle += fmt::format("lm loss PPL: {:.6E} | ", perplexity);
  const std::string dashes(middle.size() + 1, '-');
  return {dashes, middle, dashes};
}

void IntervalTotals::add(const IterationRecord& record) {
  elapsed_ms_sum += record.elapsed_ms;
  // Megatron's training_log: a skipped iteration is a nan iteration too when its loss was not
  // finite; an fp16 overflow skip has a finite loss and is skipped only. The trainer says which
  // (record.nan); a record that advanced is never counted as nan, as in Megatron.
  if (record.skipped) {
    ++skipped_iterations;
    if (record.nan) ++nan_iterations;
  } else {
    lm_loss_sum += record.lm_loss;
    ++advanced_iterations;
  }
}

double IntervalTotals::mean_lm_loss() const {
  return lm_loss_sum / static_cast<double>(std::max<int64_t>(1, advanced_iterations));
}

double IntervalTotals::elapsed_ms_per_iteration() const {
  return elapsed_ms_sum / static_cast<double>(iterations());
}

TrainingLog::TrainingLog(LoggingArguments logging, LoggedRun run, std::optional<double> peak_flops,
                         std::ostream& out, std::string peak_name, bool tensorboard)
    : logging_(std::move(logging)),
      run_(std::move(run)),
      peak_flops_(peak_flops),
      peak_name_(std::move(peak_name)),
      out_(out) {
  if (tensorboard && !logging_.tensorboard_dir.empty()) {
    tensorboard_.emplace(logging_.tensorboard_dir, logging_.tensorboard_queue_size);
  }
}

void TrainingLog::add_iteration(const IterationRecord& record, double next_learning_rate) {
  const LoggingArguments& a = logging_;
  if (tensorboard_ && record.iteration % a.tensorboard_log_interval == 0) {
    auto write = [&](const std::string& tag, double value) {
      tensorboard_->add_scalar(tag, value, record.iteration);
      tensorboard_->add_scalar(tag + " vs samples", value, record.consumed_samples);
    };
    write("learning-rate", next_learning_rate);
    write("batch-size", static_cast<double>(record.global_batch_size));
    write("lm loss", record.lm_loss);
    if (a.log_loss_scale_to_tensorboard) write("loss-scale", record.loss_scale);
    if (a.log_world_size_to_tensorboard) {
      write("world-size", static_cast<double>(run_.parallelism.world_size));
    }
    write("grad-norm", record.grad_norm);
    if (record.num_zeros_in_grad) write("num-zeros", *record.num_zeros_in_grad);
    if (record.params_norm) write("params-norm", *record.params_norm);
    if (a.log_memory_to_tensorboard) {
      // Megatron's four tags from torch.cuda.memory_stats(), at the iteration only. There is
      // no caching allocator here: what is reserved is what is allocated.
      const MemoryUsage& memory = record.memory;
      tensorboard_->add_scalar("mem-reserved-bytes", static_cast<double>(memory.allocated_bytes),
                               record.iteration);
      tensorboard_->add_scalar("mem-allocated-bytes", static_cast<double>(memory.allocated_bytes),
                               record.iteration);
      tensorboard_->add_scalar("mem-max-allocated-bytes", static_cast<double>(memory.peak_bytes),
                               record.iteration);
      tensorboard_->add_scalar("mem-allocated-count", static_cast<double>(memory.allocations),
                               record.iteration);
    }
  }
  interval_.add(record);
  if (record.iteration % a.log_interval == 0) {
    print_iteration_line(record, next_learning_rate);
    interval_ = {};
  }
}

void TrainingLog::print_iteration_line(const IterationRecord& record, double next_learning_rate) {
  const LoggingArguments& a = logging_;
  IterationLogFields fields;
  fields.timestamp = std::time(nullptr);
  fields.iteration = record.iteration;
  fields.train_iters = run_.train_iters;
  fields.consumed_samples = record.consumed_samples;
  fields.elapsed_ms_per_iteration = interval_.elapsed_ms_per_iteration();
  const double seconds_per_iteration = fields.elapsed_ms_per_iteration / 1000.0;
  // Megatron's num_floating_point_operations(args, batch_size) for this iteration's batch.
  // Per device: the iteration's FLOPs shared by every rank (Megatron divides by world size).
  const double throughput_tflops =
      megatron_throughput_tflops_per_gpu(run_, record.global_batch_size, seconds_per_iteration);
  if (a.log_throughput) fields.throughput_tflops_per_gpu = throughput_tflops;
  fields.learning_rate = next_learning_rate;
  fields.global_batch_size = record.global_batch_size;
  fields.lm_loss = interval_.mean_lm_loss();
  // Megatron prints optimizer.get_loss_scale() read after the step: the last iteration's scale
  // after its update (an overflow on this very iteration already shows the backed-off scale).
  fields.loss_scale = record.loss_scale;
  fields.grad_norm = record.grad_norm;
  fields.params_norm = record.params_norm;
  fields.num_zeros_in_grad = record.num_zeros_in_grad;
  fields.skipped_iterations = interval_.skipped_iterations;
  fields.nan_iterations = interval_.nan_iterations;
  out_ << format_iteration_line(fields) << '\n';
  if (peak_flops_) {
    const double tokens_per_second =
        static_cast<double>(record.global_batch_size * run_.model.seq_length) /
        seconds_per_iteration;
    out_ << format_throughput_extension_line(tokens_per_second, throughput_tflops * 1e12,
                                             *peak_flops_, peak_name_)
         << '\n';
  }
  out_.flush();
  if (tensorboard_) {
    if (a.log_timers_to_tensorboard) {
      tensorboard_->add_scalar("iteration-time", seconds_per_iteration, record.iteration);
      if (a.log_throughput) {
        tensorboard_->add_scalar("throughput", throughput_tflops, record.iteration);
      }
    }
    tensorboard_->flush();
  }
}

void TrainingLog::add_evaluation(const std::string& prefix, int64_t iteration,
                                 int64_t consumed_train_samples, double lm_loss) {
  for (const auto& line : format_evaluation_block(prefix, lm_loss)) out_ << line << '\n';
  out_.flush();
  if (!tensorboard_) return;
  tensorboard_->add_scalar("lm loss validation", lm_loss, iteration);
  tensorboard_->add_scalar("lm loss validation vs samples", lm_loss, consumed_train_samples);
  if (logging_.log_validation_ppl_to_tensorboard) {
    const double perplexity = std::exp(std::min(20.0, lm_loss));
    tensorboard_->add_scalar("lm loss validation ppl", perplexity, iteration);
    tensorboard_->add_scalar("lm loss validation ppl vs samples", perplexity,
                             consumed_train_samples);
  }
  tensorboard_->flush();
}

void TrainingLog::add_rollback(const std::string& line, int64_t iteration, int64_t rollbacks) {
  out_ << line << '\n';
  out_.flush();
  // The next iteration line averages the iterations after the rollback only: those before it
  // trained the weights that were thrown away.
  interval_ = IntervalTotals{};
  if (!tensorboard_) return;
  tensorboard_->add_scalar("rollbacks", static_cast<double>(rollbacks), iteration);
  tensorboard_->flush();
}

void TrainingLog::close() {
  if (tensorboard_) tensorboard_->close();
}

}  // namespace backend
