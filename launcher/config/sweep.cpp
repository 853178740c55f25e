// Multirun sweeps: expanding sweep overrides into jobs and launching them; see sweep.hpp.
// The sweep syntax is read by the shared override grammar (grammar::parse_override_sweep);
// this file gives choice() and range() their meaning (hydra/_internal/grammar/
// grammar_functions.py) and runs the product as BasicSweeper + BasicLauncher do.
#include "launcher/config/sweep.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <optional>

#include "backend/common/error.hpp"
#include "launcher/config/node.hpp"
#include "launcher/config/overrides.hpp"
#include "launcher/config/value_grammar.hpp"

namespace launcher {

namespace {

using grammar::Element;
using grammar::SweepValue;

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string text;
  for (const auto& item : items) {
    if (!text.empty()) text += separator;
    text += item;
  }
  return text;
}

class SweepReader {
 public:
  explicit SweepReader(std::string_view text)
      : text_(text), description_(fmt::format("bad override '{}'", text)) {}

  std::vector<std::string> choices() {
    const std::size_t equals = text_.find('=');
    // No value (a delete, or a malformed override that parse_override will report): no sweep.
    if (equals == std::string_view::npos ||
        text_.find_first_not_of(" \t", equals + 1) == std::string_view::npos) {
      parse_override(text_);
      return {std::string(text_)};
    }
    prefix_ = std::string(text_.substr(0, equals + 1));
    const SweepValue value = grammar::parse_override_sweep(text_, equals + 1, description_);
    std::vector<std::string> result;
    switch (value.kind) {
      case SweepValue::Kind::Element:
        result.emplace_back(text_);
        break;
      case SweepValue::Kind::SimpleSweep:
        for (const Element& item : value.items) add(result, item.source);
        break;
      case SweepValue::Kind::Function:
        result = call(value);
        break;
    }
    // The key (and the +, ++, ~ prefix) is checked once per choice by the one override parser.
    for (const auto& choice : result) parse_override(choice);
    return result;
  }

 private:
  [[noreturn]] void fail_at(std::size_t position, std::string_view message) const {
    throw common::Error(grammar::caret_message(description_, text_, position, message));
  }

  void add(std::vector<std::string>& result, std::string_view value_text) const {
    if (result.size() >= kMaxSweepJobs) {
      common::fail("{}: the sweep has more than {} values (the most a multirun launches)",
                   description_, kMaxSweepJobs);
    }
    result.push_back(prefix_ + std::string(value_text));
  }

  std::vector<std::string> call(const SweepValue& value) const {
    if (value.function == "choice") return choice(value);
    if (value.function == "range") return range(value);
    if (value.function == "interval") {
      fail_at(value.function_position,
              "interval() needs a sampling sweeper (Optuna, Ax, ...); the basic sweeper runs "
              "choice() and range() sweeps only");
    }
    fail_at(value.function_position,
            fmt::format("function '{}' is not supported in sweeps (supported: choice, range); "
                        "quote the value if the parentheses are literal text",
                        value.function));
  }

  std::vector<std::string> choice(const SweepValue& value) const {
    if (value.items.empty()) fail_at(value.function_position, "choice() needs at least one value");
    std::vector<std::string> result;
    for (std::size_t i = 0; i < value.items.size(); ++i) {
      if (!value.argument_names[i].empty()) {
        fail_at(value.items[i].position, "choice() takes values only, not name=value arguments");
      }
      add(result, value.items[i].source);
    }
    return result;
  }

  // Hydra's range(start, stop=None, step=1): range(n) is 0..n-1; values are start + step*i
  // while below stop (above it for a negative step); floats when start or step is a float.
  std::vector<std::string> range(const SweepValue& value) const {
    static constexpr std::string_view kNames[] = {"start", "stop", "step"};
    std::optional<Node> arguments[3];
    std::size_t positional = 0;
    bool named_seen = false;
    for (std::size_t i = 0; i < value.items.size(); ++i) {
      const Element& item = value.items[i];
      std::size_t slot = 0;
      if (value.argument_names[i].empty()) {
        if (named_seen) fail_at(item.position, "a positional argument follows a named one");
        if (positional == 3) fail_at(item.position, "range() takes at most 3 arguments");
        slot = positional++;
      } else {
        named_seen = true;
        const std::string& name = value.argument_names[i];
        slot = 3;
        for (std::size_t k = 0; k < 3; ++k) {
          if (name == kNames[k]) slot = k;
        }
        if (slot == 3) {
          fail_at(item.position,
                  fmt::format("range() has no argument '{}' (valid: start, stop, step)", name));
        }
        if (arguments[slot]) {
          fail_at(item.position, fmt::format("range() argument '{}' is given twice", name));
        }
      }
      const bool number =
          item.kind == Element::Kind::Scalar && (item.scalar.is_int() || item.scalar.is_float());
      if (!number || (item.scalar.is_float() && !std::isfinite(item.scalar.as_double()))) {
        fail_at(item.position, fmt::format("range() {} must be a finite number, not '{}'",
                                           kNames[slot], item.source));
      }
      arguments[slot] = item.scalar;
    }
    if (!arguments[0]) fail_at(value.function_position, "range() needs at least a stop value");
    if (!arguments[1]) {  // range(n): 0 .. n-1
      arguments[1] = arguments[0];
      arguments[0] = Node::integer(0);
    }
    if (!arguments[2]) arguments[2] = Node::integer(1);
    const Node& start = *arguments[0];
    const Node& stop = *arguments[1];
    const Node& step = *arguments[2];
    if (step.as_double() == 0) fail_at(value.function_position, "range() step must not be zero");

    std::vector<std::string> result;
    if (start.is_int() && stop.is_int() && step.is_int()) {
      const __int128 first = start.as_int();
      const __int128 last = stop.as_int();
      const __int128 increment = step.as_int();
      for (__int128 current = first; increment > 0 ? current < last : current > last;
           current += increment) {
        add(result, std::to_string(static_cast<std::int64_t>(current)));
      }
    } else {
      const double first = start.as_double();
      const double last = stop.as_double();
      const double increment = step.as_double();
      for (std::size_t i = 0;; ++i) {
        const double current = first + increment * static_cast<double>(i);
        if (increment > 0 ? !(current < last) : !(current > last)) break;
        add(result, format_float(current));
      }
    }
    if (result.empty()) {
      fail_at(value.function_position, "the range is empty: it has no value to sweep over");
    }
    return result;
  }

  std::string_view text_;
  std::string description_;
  std::string prefix_;  // "key=" as typed, including +, ++, ~ and @package
};

}  // namespace

std::vector<std::string> sweep_choices(std::string_view override_text) {
  return SweepReader(override_text).choices();
}

std::vector<std::vector<std::string>> expand_sweeps(const std::vector<std::string>& overrides) {
  std::vector<std::vector<std::string>> choices;
  choices.reserve(overrides.size());
  for (const auto& text : overrides) choices.push_back(sweep_choices(text));
  std::size_t jobs = 1;
  bool too_many = false;
  std::vector<std::string> sizes;
  for (const auto& values : choices) {
    sizes.push_back(std::to_string(values.size()));
    if (jobs > kMaxSweepJobs / values.size()) too_many = true;
    if (!too_many) jobs *= values.size();
  }
  if (too_many) {
    common::fail("the multirun has more than {} jobs ({} values); sweep over fewer values",
                 kMaxSweepJobs, join(sizes, " x "));
  }
  // itertools.product: an odometer whose last digit turns fastest.
  std::vector<std::vector<std::string>> result;
  result.reserve(jobs);
  std::vector<std::size_t> digits(choices.size(), 0);
  for (std::size_t job = 0; job < jobs; ++job) {
    std::vector<std::string> overrides_of_job;
    overrides_of_job.reserve(choices.size());
    for (std::size_t i = 0; i < choices.size(); ++i)
      overrides_of_job.push_back(choices[i][digits[i]]);
    result.push_back(std::move(overrides_of_job));
    for (std::size_t i = choices.size(); i > 0;) {
      --i;  // not `i-- > 0`, which wraps past 0 as the loop ends
      if (++digits[i] < choices[i].size()) break;
      digits[i] = 0;
    }
  }
  return result;
}

int run_sweep(const std::vector<std::vector<std::string>>& jobs,
              const std::function<int(const std::vector<std::string>& overrides,
                                      std::size_t job_number)>& launch,
              std::ostream& terminal) {
  terminal << fmt::format("Launching {} job{}\n", jobs.size(), jobs.size() == 1 ? "" : "s");
  int first_failure = 0;
  std::vector<std::string> failed;
  for (std::size_t number = 0; number < jobs.size(); ++number) {
    std::vector<std::string> shown;
    for (const auto& text : jobs[number]) {
      if (!text.starts_with("hydra.")) shown.push_back(text);
    }
    terminal << fmt::format("#{} :{}{}\n", number, shown.empty() ? "" : " ", join(shown, " "));
    terminal.flush();
    int status = 0;
    try {
      status = launch(jobs[number], number);
    } catch (const common::Error& error) {
      spdlog::error("#{}: {}", number, error.what());
      status = 2;
    }
    if (status != 0) {
      if (first_failure == 0) first_failure = status;
      failed.push_back(fmt::format("#{}", number));
    }
  }
  if (!failed.empty()) {
    spdlog::error("{} of {} jobs failed: {}", failed.size(), jobs.size(), join(failed, ", "));
  }
  return first_failure;
}

}  // namespace launcher
