// Megatron's log lines, read back: the training iteration line (backend/train/log/training_log.cpp
// writes it as Megatron-LM's training_log does)
//    [2026-01-01 12:00:00] iteration       20/    1000 | consumed samples: 80 | elapsed time per
//   iteration (ms): 812.5 | throughput per GPU (TFLOP/s/GPU): 1.2 | learning rate: 6.0E-04 |
//   global batch size: 4 | lm loss: 9.1E+00 | loss scale: 1.0 | grad norm: 3.2 | number of
//   skipped iterations: 0 | number of nan iterations: 0 |
// (one line; "key: value" fields between '|'), our throughput line after it
//   throughput: 1520.8 tokens/s | MFU: 36.5% of the measured 0.170 TFLOP/s sgemm peak |
// and the validation line " validation loss at iteration 20 ... | lm loss value: 8.9E+00 | ...".
// From them: the series `launcher report --html` plots when a run has no event files, and the
// progress and ETA that `launcher status` and `launcher logs -f` show for a running job.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace launcher {

struct IterationLine {
  int64_t iteration = 0;
  int64_t train_iters = 0;
  // Every other "key: value" field with a number, by Megatron's key ("lm loss",
  // "elapsed time per iteration (ms)", "learning rate", "grad norm", ...).
  std::map<std::string, double> fields;
};

// The iteration line's fields, or nullopt when `line` is not one.
std::optional<IterationLine> parse_iteration_line(std::string_view line);

// One value of a series at an iteration, tagged as in the TensorBoard event files
// ("lm loss", "learning-rate", "grad-norm", "throughput", "iteration-time", "lm loss
// validation") or, for what only the log says, "tokens/s", "mfu" (a fraction), "skipped
// iterations", "nan iterations".
struct LoggedValue {
  std::string tag;
  int64_t iteration = 0;
  double value = 0;
};

// Every value the iteration, throughput and validation lines of a job log hold, in log order.
std::vector<LoggedValue> parse_job_log(std::string_view log_text);

struct Progress {
  int64_t iteration = 0;
  int64_t train_iters = 0;
  std::optional<double> seconds_left;  // from the mean step time of the last few lines
};

// The newest iteration line of the log text and the time left at the recent step times
// (the mean "elapsed time per iteration" of the last `recent_lines` lines); nullopt when the
// log has no iteration line yet.
std::optional<Progress> find_progress(std::string_view log_text, int recent_lines = 5);

// The same for a log file, reading only its last 256 KiB (logs of long runs are large);
// nullopt when the file is missing or has no iteration line there.
std::optional<Progress> read_progress(const std::filesystem::path& log_file);

// "120/1000 (12%), ETA 1h 03m" (ETA left out when unknown).
std::string format_progress(const Progress& progress);

}  // namespace launcher
