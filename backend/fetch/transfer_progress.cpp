// Progress display and log lines for transfers; see transfer_progress.hpp.
#include "backend/fetch/transfer_progress.hpp"

#include <fmt/format.h>

#include <cmath>

namespace backend {

namespace {
constexpr double kWindowSeconds = 5.0;     // the rate is measured over this much recent time
constexpr double kRedrawSeconds = 0.1;     // at most ten redraws a second
constexpr int64_t kUnknownSizeLogStep = int64_t(128) << 20;
constexpr double kLogLineSeconds = 0.5;    // a fast transfer logs its start and end, not tenths
}  // namespace

std::string format_bytes(int64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::string format_duration(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) return "--:--";
  const auto total = static_cast<int64_t>(std::llround(seconds));
  const int64_t hours = total / 3600, minutes = total / 60 % 60, rest = total % 60;
  if (hours > 0) return fmt::format("{}:{:02}:{:02}", hours, minutes, rest);
  return fmt::format("{}:{:02}", minutes, rest);
}

TransferProgress::TransferProgress(ProgressMode mode, std::string label, std::ostream& terminal,
                                   std::function<void(const std::string&)> emit_line)
    : mode_(mode), label_(std::move(label)), terminal_(terminal), emit_line_(std::move(emit_line)) {}

void TransferProgress::start(int64_t done, int64_t total, double now_seconds) {
  total_ = total;
  started_at_bytes_ = done;
  started_at_ = now_seconds;
  last_draw_ = -1;
  samples_.clear();
  samples_.emplace_back(now_seconds, done);
  latest_ = {now_seconds, done};
  schedule_next_log_line(done);
}

void TransferProgress::set_total(int64_t total) {
  if (total == total_) return;
  total_ = total;
  schedule_next_log_line(latest_.second);
}

// The next log line: at the first tenth of the whole file above what is already there.
void TransferProgress::schedule_next_log_line(int64_t done) {
  const int64_t step = total_ > 0 ? std::max<int64_t>(1, total_ / 10) : kUnknownSizeLogStep;
  next_log_bytes_ = (done / step + 1) * step;
}

double TransferProgress::rate() const {
  if (samples_.empty()) return 0;
  const double seconds = latest_.first - samples_.front().first;
  if (seconds < 0.2) return 0;
  return static_cast<double>(latest_.second - samples_.front().second) / seconds;
}

std::string TransferProgress::status_text(int64_t done) const {
  const double bytes_per_second = rate();
  std::string text = label_ + "  " + format_bytes(done);
  if (total_ > 0) {
    text += fmt::format(" / {}  {:.1f}%", format_bytes(total_),
                        100.0 * static_cast<double>(done) / static_cast<double>(total_));
  }
  text += "  " + (bytes_per_second > 0 ? format_bytes(static_cast<int64_t>(bytes_per_second)) + "/s"
                                       : std::string("--/s"));
  if (total_ > 0) {
    const double eta = bytes_per_second > 0
                           ? static_cast<double>(total_ - done) / bytes_per_second : -1.0;
    text += "  ETA " + format_duration(eta);
  }
  return text;
}

void TransferProgress::clear_terminal_line() {
  if (mode_ == ProgressMode::kTerminal && line_shown_) {
    terminal_ << "\r\x1b[K" << std::flush;
    line_shown_ = false;
  }
}

void TransferProgress::update(int64_t done, double now_seconds) {
  latest_ = {now_seconds, done};
  // A sample every 50 ms at most; the oldest go once the window without them is long enough.
  if (samples_.empty() || now_seconds - samples_.back().first >= 0.05) {
    samples_.emplace_back(now_seconds, done);
    while (samples_.size() > 2 && now_seconds - samples_[1].first >= kWindowSeconds) {
      samples_.pop_front();
    }
  }
  if (mode_ == ProgressMode::kTerminal) {
    if (last_draw_ >= 0 && now_seconds - last_draw_ < kRedrawSeconds) return;
    last_draw_ = now_seconds;
    terminal_ << "\r" << status_text(done) << "\x1b[K" << std::flush;
    line_shown_ = true;
  } else if (mode_ == ProgressMode::kLog && done >= next_log_bytes_) {
    if (last_draw_ >= 0 && now_seconds - last_draw_ < kLogLineSeconds) return;
    if (last_draw_ < 0 && now_seconds - started_at_ < kLogLineSeconds) return;
    last_draw_ = now_seconds;
    emit_line_(status_text(done));
    schedule_next_log_line(done);
  }
}

void TransferProgress::note(const std::string& line) {
  clear_terminal_line();
  if (mode_ != ProgressMode::kNone) emit_line_(line);
  last_draw_ = -1;  // redraw the status line at the next update
}

void TransferProgress::finish(int64_t done, double now_seconds) {
  latest_ = {now_seconds, done};
  if (mode_ == ProgressMode::kTerminal) {  // the final status line stays on the screen
    terminal_ << "\r" << status_text(done) << "\x1b[K\n" << std::flush;
    line_shown_ = false;
  }
  const double seconds = now_seconds - started_at_;
  const int64_t moved = done - started_at_bytes_;
  if (mode_ != ProgressMode::kNone) {
    emit_line_(fmt::format("{}: {} in {} ({}/s)", label_, format_bytes(done), format_duration(seconds),
                           format_bytes(seconds > 0 ? static_cast<int64_t>(moved / seconds) : moved)));
  }
}

}  // namespace backend
