// Reading Megatron's iteration, throughput and validation lines; see iteration_log.hpp.
#include "launcher/iteration_log.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>

namespace launcher {

namespace fs = std::filesystem;

namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t' || text.front() == '\r')) {
    text.remove_prefix(1);
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  return text;
}

// The number at the start of `text` (after blanks), as strtod reads it ("6.000000E-04", "36.5%").
std::optional<double> leading_number(std::string_view text) {
  text = trim(text);
  const std::string copy(text.substr(0, 64));
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (end == copy.c_str()) return std::nullopt;
  return value;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> parts;
  size_t begin = 0;
  while (begin <= line.size()) {
    const size_t end = line.find('|', begin);
    parts.push_back(line.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin));
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  return parts;
}

// "key: value" with the key trimmed; the key may itself hold ':' ("(ms)"), so the last ": ".
std::optional<std::pair<std::string, double>> key_value(std::string_view field) {
  field = trim(field);
  const size_t colon = field.rfind(": ");
  if (colon == std::string_view::npos) return std::nullopt;
  const auto value = leading_number(field.substr(colon + 2));
  if (!value) return std::nullopt;
  return std::pair{std::string(trim(field.substr(0, colon))), *value};
}

int64_t parse_integer(std::string_view text, bool& ok) {
  text = trim(text);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  ok = error == std::errc() && end == text.data() + text.size() && !text.empty();
  return value;
}

}  // namespace

std::optional<IterationLine> parse_iteration_line(std::string_view line) {
  const size_t at = line.find(" iteration ");
  if (at == std::string_view::npos) return std::nullopt;
  const auto parts = split_fields(line.substr(at + 11));
  if (parts.size() < 2) return std::nullopt;
  const size_t slash = parts[0].find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  IterationLine result;
  bool iteration_ok = false, total_ok = false;
  result.iteration = parse_integer(parts[0].substr(0, slash), iteration_ok);
  result.train_iters = parse_integer(parts[0].substr(slash + 1), total_ok);
  if (!iteration_ok || !total_ok) return std::nullopt;
  for (size_t i = 1; i < parts.size(); ++i) {
    if (auto field = key_value(parts[i])) result.fields[field->first] = field->second;
  }
  return result;
}

std::vector<LoggedValue> parse_job_log(std::string_view log_text) {
  std::vector<LoggedValue> values;
  int64_t last_iteration = 0;
  size_t begin = 0;
  while (begin < log_text.size()) {
    size_t end = log_text.find('\n', begin);
    if (end == std::string_view::npos) end = log_text.size();
    const std::string_view line = log_text.substr(begin, end - begin);
    begin = end + 1;
    if (auto iteration = parse_iteration_line(line)) {
      last_iteration = iteration->iteration;
      static const std::pair<const char*, const char*> tags[] = {
          {"lm loss", "lm loss"},
          {"learning rate", "learning-rate"},
          {"grad norm", "grad-norm"},
          {"throughput per GPU (TFLOP/s/GPU)", "throughput"},
          {"number of skipped iterations", "skipped iterations"},
          {"number of nan iterations", "nan iterations"}};
      for (const auto& [key, tag] : tags) {
        auto found = iteration->fields.find(key);
        if (found != iteration->fields.end()) values.push_back({tag, last_iteration, found->second});
      }
      auto elapsed = iteration->fields.find("elapsed time per iteration (ms)");
      if (elapsed != iteration->fields.end()) {
        values.push_back({"iteration-time", last_iteration, elapsed->second / 1000.0});
      }
      continue;
    }
    const std::string_view trimmed = trim(line);
    if (trimmed.starts_with("throughput: ")) {
      // Our line after an iteration line: "throughput: X tokens/s | MFU: Y% of ...".
      const auto parts = split_fields(trimmed);
      if (auto tokens = leading_number(parts[0].substr(12))) {
        values.push_back({"tokens/s", last_iteration, *tokens});
      }
      if (parts.size() > 1) {
        if (auto mfu = key_value(parts[1]); mfu && mfu->first == "MFU") {
          values.push_back({"mfu", last_iteration, mfu->second / 100.0});
        }
      }
      continue;
    }
    if (trimmed.starts_with("validation loss at ")) {
      // "validation loss at iteration 20 on validation set | lm loss value: ..." (Megatron's
      // prefix; "at the end of training" uses the last iteration seen).
      int64_t iteration = last_iteration;
      const std::string_view after = trimmed.substr(19);
      if (after.starts_with("iteration ")) {
        bool ok = false;
        const std::string_view number = after.substr(10, after.find(' ', 10) - 10);
        const int64_t parsed = parse_integer(number, ok);
        if (ok) iteration = parsed;
      }
      for (const auto& part : split_fields(trimmed)) {
        if (auto field = key_value(part); field && field->first == "lm loss value") {
          values.push_back({"lm loss validation", iteration, field->second});
        }
      }
    }
  }
  return values;
}

std::optional<Progress> find_progress(std::string_view log_text, int recent_lines) {
  std::vector<IterationLine> recent;
  size_t end = log_text.size();
  while (end > 0 && static_cast<int>(recent.size()) < recent_lines) {
    const size_t newline = log_text.rfind('\n', end - 1);
    const size_t begin = newline == std::string_view::npos ? 0 : newline + 1;
    if (auto line = parse_iteration_line(log_text.substr(begin, end - begin))) {
      recent.push_back(*line);
    }
    if (newline == std::string_view::npos) break;
    end = newline;
  }
  if (recent.empty()) return std::nullopt;
  Progress progress;
  progress.iteration = recent.front().iteration;
  progress.train_iters = recent.front().train_iters;
  double milliseconds = 0;
  int timed = 0;
  for (const auto& line : recent) {
    auto elapsed = line.fields.find("elapsed time per iteration (ms)");
    if (elapsed == line.fields.end() || !std::isfinite(elapsed->second)) continue;
    milliseconds += elapsed->second;
    ++timed;
  }
  if (timed > 0) {
    const int64_t left = std::max<int64_t>(0, progress.train_iters - progress.iteration);
    progress.seconds_left = static_cast<double>(left) * milliseconds / timed / 1000.0;
  }
  return progress;
}

std::optional<Progress> read_progress(const fs::path& log_file) {
  std::error_code error;
  if (!fs::is_regular_file(log_file, error)) return std::nullopt;
  std::ifstream in(log_file, std::ios::binary);
  if (!in) return std::nullopt;
  constexpr std::streamoff kTail = 256 * 1024;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(std::max<std::streamoff>(0, size - kTail));
  std::string text(static_cast<size_t>(std::min(size, kTail)), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return find_progress(text);
}

std::string format_progress(const Progress& progress) {
  std::string text = fmt::format("{}/{}", progress.iteration, progress.train_iters);
  if (progress.train_iters > 0) {
    text += fmt::format(" ({}%)", 100 * progress.iteration / progress.train_iters);
  }
  if (progress.seconds_left) {
    const auto seconds = static_cast<int64_t>(std::llround(*progress.seconds_left));
    if (seconds >= 3600) {
      text += fmt::format(", ETA {}h {:02d}m", seconds / 3600, seconds % 3600 / 60);
    } else if (seconds >= 60) {
      text += fmt::format(", ETA {}m {:02d}s", seconds / 60, seconds % 60);
    } else {
      text += fmt::format(", ETA {}s", seconds);
    }
  }
  return text;
}

}  // namespace launcher
