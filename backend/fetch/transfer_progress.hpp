// Progress of one transfer (download, decompression) for a person at a terminal and for a log:
//  - terminal: one status line redrawn in place (carriage return, erase to end of line) at most
//    ten times a second: `oscar-1GB.jsonl.xz  412.0 MiB / 1.2 GiB  33.5%  41.2 MiB/s  ETA 0:20`;
//  - log (not a terminal, e.g. a Slurm job's output file): no redraws, a plain line each time
//    another tenth of a known size is done (every 128 MiB when the size is unknown), so a log
//    gets about ten lines per file whatever its size, never a stream of carriage returns (and
//    none more often than twice a second, so a fast local copy logs only its start and end);
//  - events (resuming, a retry and why, verification) are lines in both modes; on a terminal the
//    status line is erased first, so lines and redraws never interleave.
// The rate is taken over the last few seconds (a sliding window), so the ETA follows the
// current speed rather than the average since the start. Sizes are binary (KiB = 1024 B),
// as curl and wget print them.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <ostream>
#include <string>
#include <utility>

namespace backend {

enum class ProgressMode { kTerminal, kLog, kNone };

// "0 B", "999 B", "1.0 KiB", "412.0 MiB", "1.2 GiB", ... (one decimal from KiB on).
std::string format_bytes(int64_t bytes);
// "0:07", "1:02:03": hours only when needed; "--:--" when unknown (negative).
std::string format_duration(double seconds);

class TransferProgress {
 public:
  // `terminal` receives the redrawn status line (kTerminal); `emit_line` receives each whole
  // line (events; in kLog mode also the progress lines), without a trailing newline.
  TransferProgress(ProgressMode mode, std::string label, std::ostream& terminal,
                   std::function<void(const std::string&)> emit_line);

  // A (new) transfer begins at `done` bytes of `total` (negative: unknown).
  void start(int64_t done, int64_t total, double now_seconds);
  // The size became known (e.g. from the response headers).
  void set_total(int64_t total);
  // `done` bytes so far (absolute, the resumed part included); draws or logs when due.
  void update(int64_t done, double now_seconds);
  // A line about what happens (on a terminal the status line is erased first).
  void note(const std::string& line);
  // The transfer is over: the final status line stays on the terminal (followed by a newline).
  void finish(int64_t done, double now_seconds);

  // Bytes per second over the sliding window; 0 until two samples are far enough apart.
  double rate() const;
  std::string status_text(int64_t done) const;

 private:
  void clear_terminal_line();
  void schedule_next_log_line(int64_t done);
  ProgressMode mode_;
  std::string label_;
  std::ostream& terminal_;
  std::function<void(const std::string&)> emit_line_;
  int64_t total_ = -1;
  int64_t started_at_bytes_ = 0;
  double started_at_ = 0;
  double last_draw_ = -1;
  int64_t next_log_bytes_ = 0;
  bool line_shown_ = false;
  std::deque<std::pair<double, int64_t>> samples_;  // (time, bytes), the last few seconds
  std::pair<double, int64_t> latest_{0, 0};          // the most recent update
};

}  // namespace backend
