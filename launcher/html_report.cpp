// The HTML run report and its SVG plots; see html_report.hpp. The plots are drawn in a fixed
// pixel frame (viewBox) with "nice" ticks: steps of 1, 2 or 5 times a power of ten, and on a
// log scale one tick per decade.
#include "launcher/html_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"
#include "launcher/config/node.hpp"
#include "launcher/config/scalar_text.hpp"
#include "launcher/config/yaml_io.hpp"
#include "launcher/iteration_log.hpp"
#include "launcher/run_status.hpp"
#include "launcher/tensorboard_reader.hpp"

namespace launcher {

namespace fs = std::filesystem;

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

// Okabe–Ito-like distinct colours, the first two far apart (the browser test looks for them).
constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                    "#9467bd", "#8c564b", "#e377c2", "#17becf"};

// The SVG frame: plot area [kLeft, kRight] × [kTop, kBottom], legend right of it.
constexpr double kWidth = 900, kHeight = 320;
constexpr double kLeft = 80, kRight = 640, kTop = 36, kBottom = 270;
constexpr double kLegendX = 660;
constexpr size_t kMarkersUpTo = 40;  // points get a marker when a line has this few
// A line keeps at most 2 × this many points: the plot is 560 px wide, and a long run's
// hundreds of thousands of iterations would make a page no browser opens.
constexpr size_t kThinBuckets = 1000;

double nice_step(double range, int wanted_ticks) {
  const double raw = range / wanted_ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double factor : {1.0, 2.0, 5.0}) {
    if (raw <= factor * power) return factor * power;
  }
  return 10 * power;
}

std::string tick_text(double value) {
  if (value == 0) return "0";
  return fmt::format("{:.4g}", value);
}

struct Axis {
  double low = 0, high = 1;
  bool log = false;
  std::vector<double> ticks;
  double to_unit(double value) const {  // 0 at low, 1 at high
    if (log) return (std::log10(value) - std::log10(low)) / (std::log10(high) - std::log10(low));
    return (value - low) / (high - low);
  }
};

Axis linear_axis(double low, double high, int wanted_ticks, bool integers) {
  if (!(high > low)) {
    const double pad = low == 0 ? 1 : std::abs(low) * 0.1;
    low -= pad;
    high += pad;
  }
  double step = nice_step(high - low, wanted_ticks);
  if (integers) step = std::max(1.0, step);
  Axis axis;
  axis.low = std::floor(low / step) * step;
  axis.high = std::ceil(high / step) * step;
  for (double tick = axis.low; tick <= axis.high + step * 1e-9; tick += step) {
    axis.ticks.push_back(std::abs(tick) < step * 1e-9 ? 0.0 : tick);
  }
  return axis;
}

Axis log_axis(double low, double high) {
  Axis axis;
  axis.log = true;
  const double first = std::floor(std::log10(low)), last = std::ceil(std::log10(high));
  axis.low = std::pow(10.0, first);
  axis.high = std::pow(10.0, std::max(last, first + 1));
  for (double decade = first; decade <= std::log10(axis.high) + 1e-9; decade += 1) {
    axis.ticks.push_back(std::pow(10.0, decade));
  }
  return axis;
}

}  // namespace

std::vector<Point> thin_points(const std::vector<Point>& points, size_t buckets) {
  if (points.size() <= 2 * buckets) return points;
  // Points are in x order (iterations): equal runs of them, each kept as its lowest and highest
  // point in x order, so a spike stays visible however long the run.
  std::vector<Point> kept;
  kept.reserve(2 * buckets);
  for (size_t bucket = 0; bucket < buckets; ++bucket) {
    const size_t begin = bucket * points.size() / buckets, end = (bucket + 1) * points.size() / buckets;
    size_t low = begin, high = begin;
    for (size_t i = begin; i < end; ++i) {
      if (points[i].y < points[low].y) low = i;
      if (points[i].y > points[high].y) high = i;
    }
    kept.push_back(points[std::min(low, high)]);
    if (low != high) kept.push_back(points[std::max(low, high)]);
  }
  return kept;
}

bool wants_log_scale(const std::vector<PlotLine>& lines) {
  double low = std::numeric_limits<double>::infinity(), high = 0;
  bool any = false;
  for (const auto& line : lines) {
    for (const auto& point : line.points) {
      if (!std::isfinite(point.y)) continue;
      if (point.y <= 0) return false;
      low = std::min(low, point.y);
      high = std::max(high, point.y);
      any = true;
    }
  }
  return any && high / low > 10;
}

std::string render_svg_plot(const PlotSpec& spec, const std::vector<PlotLine>& given_lines,
                            bool log_scale) {
  std::vector<PlotLine> lines;
  for (const auto& line : given_lines) {
    PlotLine finite = line;
    std::erase_if(finite.points, [log_scale](const Point& point) {
      return !std::isfinite(point.x) || !std::isfinite(point.y) || (log_scale && point.y <= 0);
    });
    finite.points = thin_points(finite.points, kThinBuckets);
    if (!finite.points.empty()) lines.push_back(std::move(finite));
  }
  double x_low = std::numeric_limits<double>::infinity(), x_high = -x_low;
  double y_low = x_low, y_high = -x_low;
  for (const auto& line : lines) {
    for (const auto& point : line.points) {
      x_low = std::min(x_low, point.x);
      x_high = std::max(x_high, point.x);
      y_low = std::min(y_low, point.y);
      y_high = std::max(y_high, point.y);
    }
  }
  if (lines.empty()) x_low = 0, x_high = 1, y_low = 0, y_high = 1;
  const Axis x_axis = linear_axis(x_low, x_high, 6, true);
  const Axis y_axis = log_scale ? log_axis(y_low, y_high) : linear_axis(y_low, y_high, 5, false);
  auto pixel_x = [&x_axis](double x) { return kLeft + x_axis.to_unit(x) * (kRight - kLeft); };
  auto pixel_y = [&y_axis](double y) { return kBottom - y_axis.to_unit(y) * (kBottom - kTop); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" role=\"img\" aria-label=\"{2}\">\n",
      kWidth, kHeight, html_escape(spec.title));
  svg += fmt::format("<text class=\"title\" x=\"{}\" y=\"20\" text-anchor=\"middle\">{}</text>\n",
                     (kLeft + kRight) / 2, html_escape(spec.title));
  // Grid and ticks.
  for (const double tick : x_axis.ticks) {
    const double x = pixel_x(tick);
    svg += fmt::format("<line class=\"grid\" x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"/>"
                       "<text class=\"tick\" x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
                       x, kTop, kBottom, kBottom + 16, tick_text(tick));
  }
  for (const double tick : y_axis.ticks) {
    const double y = pixel_y(tick);
    svg += fmt::format("<line class=\"grid\" x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\"/>"
                       "<text class=\"tick\" x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                       y, kLeft, kRight, kLeft - 6, y + 4, tick_text(tick));
  }
  svg += fmt::format("<rect class=\"frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", kLeft,
                     kTop, kRight - kLeft, kBottom - kTop);
  svg += fmt::format("<text class=\"axis-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     (kLeft + kRight) / 2, kBottom + 40, html_escape(spec.x_label));
  svg += fmt::format(
      "<text class=\"axis-label\" x=\"18\" y=\"{0}\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 18 {0})\">{1}{2}</text>\n",
      (kTop + kBottom) / 2, html_escape(spec.y_label), log_scale ? " (log scale)" : "");
  // Lines, then the legend.
  for (const auto& line : lines) {
    std::string points;
    for (const auto& point : line.points) {
      points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", pixel_x(point.x),
                            pixel_y(point.y));
    }
    svg += fmt::format(
        "<polyline class=\"series\" data-label=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"2.5\"{} points=\"{}\"/>\n",
        html_escape(line.label), line.colour, line.dashed ? " stroke-dasharray=\"6 4\"" : "", points);
    if (line.points.size() <= kMarkersUpTo) {
      for (const auto& point : line.points) {
        svg += fmt::format("<circle class=\"marker\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>",
                           pixel_x(point.x), pixel_y(point.y), line.colour);
      }
      svg += "\n";
    }
  }
  double legend_y = kTop + 8;
  for (const auto& line : lines) {
    svg += fmt::format(
        "<g class=\"legend-entry\"><line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" "
        "stroke-width=\"3\"{4}/><text class=\"legend\" x=\"{5}\" y=\"{6}\">{7}</text></g>\n",
        kLegendX, legend_y, kLegendX + 24, line.colour,
        line.dashed ? " stroke-dasharray=\"6 4\"" : "", kLegendX + 30, legend_y + 4,
        html_escape(line.label));
    legend_y += 20;
  }
  if (lines.empty()) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no values</text>\n",
                       (kLeft + kRight) / 2, (kTop + kBottom) / 2);
  }
  svg += "</svg>\n";
  return svg;
}

namespace {

void flatten(const Node& node, const std::string& path, std::map<std::string, std::string>& out) {
  if (node.is_map()) {
    if (node.entries().empty()) out[path] = "{}";
    for (const auto& entry : node.entries()) {
      flatten(entry.value, path.empty() ? entry.key : path + "." + entry.key, out);
    }
  } else if (node.is_list()) {
    if (node.items().empty()) out[path] = "[]";
    for (size_t i = 0; i < node.items().size(); ++i) {
      flatten(node.items()[i], fmt::format("{}[{}]", path, i), out);
    }
  } else if (node.is_null()) {
    out[path] = "null";
  } else {
    out[path] = scalar_text(node, path);
  }
}

// The launcher's whole composed config of the run, else the training section it wrote.
fs::path find_config_file(const fs::path& run_dir) {
  fs::path section;
  std::error_code error;
  std::vector<fs::path> names;
  for (auto it = fs::directory_iterator(run_dir, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    names.push_back(it->path());
  }
  std::sort(names.begin(), names.end());
  for (const auto& path : names) {
    const std::string name = path.filename().string();
    if (name.ends_with("_launcher_config.yaml")) return path;
    if (name.ends_with("_hydra.yaml") && section.empty()) section = path;
  }
  return section;
}

std::optional<int64_t> config_integer(const std::map<std::string, std::string>& config,
                                      const std::string& key) {
  for (const std::string& path : {"training." + key, key}) {
    auto found = config.find(path);
    if (found == config.end()) continue;
    int64_t value = 0;
    const auto [end, error] = std::from_chars(found->second.data(),
                                              found->second.data() + found->second.size(), value);
    if (error == std::errc() && end == found->second.data() + found->second.size()) return value;
  }
  return std::nullopt;
}

std::string parallel_layout(const RunData& run) {
  const auto tp = config_integer(run.config, "model.tensor_model_parallel_size");
  const auto pp = config_integer(run.config, "model.pipeline_model_parallel_size");
  const auto nodes = config_integer(run.config, "trainer.num_nodes");
  const auto devices = config_integer(run.config, "trainer.devices");
  if (!tp || !pp || !nodes || !devices || *tp <= 0 || *pp <= 0) return "unknown (no config)";
  const int64_t world = *nodes * *devices;
  return fmt::format("tp {} × pp {} × dp {} ({} node{} × {} device{})", *tp, *pp,
                     world / (*tp * *pp), *nodes, *nodes == 1 ? "" : "s", *devices,
                     *devices == 1 ? "" : "s");
}

std::vector<fs::path> job_logs(const fs::path& run_dir, bool has_records) {
  std::vector<fs::path> logs;
  std::error_code error;
  if (has_records) {
    for (const auto& record : read_job_records(run_dir)) {
      if (!record.log_file.empty() && fs::is_regular_file(record.log_file, error) &&
          std::find(logs.begin(), logs.end(), record.log_file) == logs.end()) {
        logs.push_back(record.log_file);
      }
    }
  }
  if (!logs.empty()) return logs;
  for (auto it = fs::directory_iterator(run_dir, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    std::error_code type_error;
    if (name.starts_with("log-") && name.ends_with(".out") && it->is_regular_file(type_error)) {
      logs.push_back(it->path());
    }
  }
  std::sort(logs.begin(), logs.end());
  return logs;
}

}  // namespace

RunData read_run(const fs::path& run_dir) {
  RunData run;
  run.directory = run_dir;
  const fs::path normal = fs::absolute(run_dir).lexically_normal();
  run.name = (normal.has_filename() ? normal : normal.parent_path()).filename().string();
  std::error_code error;
  if (!fs::is_directory(run_dir, error)) {
    common::fail("{}: not a directory (a run's results directory, or a run name under "
                 "base_results_dir)", run_dir.string());
  }
  // Event files: a later file (a resumed run) replaces the steps it repeats.
  const auto event_files = find_tensorboard_files(run_dir);
  for (const auto& file : event_files) {
    for (auto& event : read_tensorboard_file(file)) {
      if (event.tag.ends_with(" vs samples")) continue;
      run.series[event.tag][event.step] = event.value;
    }
  }
  const bool has_records = fs::exists(run_dir / "jobs.jsonl", error);
  std::map<std::string, std::map<int64_t, double>> logged;
  for (const auto& log : job_logs(run_dir, has_records)) {
    const std::string text = common::read_small_file(log, "the job log", uint64_t{1} << 30);
    for (const auto& value : parse_job_log(text)) logged[value.tag][value.iteration] = value.value;
  }
  bool used_logs = false;
  for (auto& [tag, values] : logged) {
    if (run.series.contains(tag)) continue;
    run.series[tag] = std::move(values);
    used_logs = true;
  }
  if (run.series.empty()) {
    common::fail("{}: nothing to plot: no TensorBoard event files (events.out.tfevents.*, "
                 "written with --tensorboard-dir) and no job log (log-*.out) with iteration lines",
                 run_dir.string());
  }
  run.source = !event_files.empty() && used_logs ? "TensorBoard event files and job logs"
               : !event_files.empty()            ? "TensorBoard event files"
                                                 : "job logs";
  run.config_file = find_config_file(run_dir);
  if (!run.config_file.empty()) flatten(load_yaml_file(run.config_file), "", run.config);
  // tokens/s from the event files' batch size and step time when no log line gave it.
  const auto sequence = config_integer(run.config, "model.encoder_seq_length");
  if (!run.series.contains("tokens/s") && sequence && run.series.contains("batch-size") &&
      run.series.contains("iteration-time")) {
    const auto& batch = run.series.at("batch-size");
    std::map<int64_t, double> tokens;
    for (const auto& [step, seconds] : run.series.at("iteration-time")) {
      auto found = batch.find(step);
      if (found != batch.end() && seconds > 0) {
        tokens[step] = found->second * static_cast<double>(*sequence) / seconds;
      }
    }
    if (!tokens.empty()) run.series["tokens/s"] = std::move(tokens);
  }
  if (has_records) {
    for (const auto& record : read_job_records(run_dir)) {
      const std::string state = query_job_state(record);
      run.jobs.push_back({record.stage, record.cluster, record.job_id, state,
                          job_progress(record, state), record.log_file.string()});
    }
  }
  return run;
}

namespace {

struct PlotDefinition {
  const char* title;
  const char* y_label;
  std::vector<std::pair<const char*, const char*>> tags;  // tag, its name in the legend
  double scale = 1;
  bool log_when_spread = false;
};

const std::vector<PlotDefinition>& plot_definitions() {
  static const std::vector<PlotDefinition> definitions = {
      {"Training loss", "lm loss (nats per token)", {{"lm loss", "lm loss"}}, 1, true},
      {"Validation loss", "lm loss (nats per token)", {{"lm loss validation", "validation"}}, 1, true},
      {"Learning rate", "learning rate", {{"learning-rate", "learning rate"}}},
      {"Gradient norm", "L2 norm of the gradient", {{"grad-norm", "grad norm"}}},
      {"Throughput", "tokens/s", {{"tokens/s", "tokens/s"}}},
      {"Throughput per GPU", "TFLOP/s per GPU", {{"throughput", "TFLOP/s"}}},
      {"Model FLOPs utilization", "MFU (%)", {{"mfu", "MFU"}}, 100},
      {"Step time", "seconds per iteration", {{"iteration-time", "step time"}}},
      {"Memory",
       "memory (GB)",
       {{"mem-allocated-bytes", "allocated"},
        {"mem-max-allocated-bytes", "max allocated"},
        {"mem-reserved-bytes", "reserved"}},
       1e-9},
      {"Skipped and NaN iterations",
       "iterations (count per log interval)",
       {{"skipped iterations", "skipped"}, {"nan iterations", "NaN"}, {"rollbacks", "rollbacks"}}},
  };
  return definitions;
}

std::string table_row(const std::vector<std::string>& cells, const char* cell = "td") {
  std::string row = "<tr>";
  for (const auto& text : cells) row += fmt::format("<{0}>{1}</{0}>", cell, html_escape(text));
  return row + "</tr>\n";
}

}  // namespace

std::string render_html_report(const std::vector<RunData>& runs) {
  std::string names;
  for (const auto& run : runs) names += (names.empty() ? "" : ", ") + run.name;
  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>Run report: " + html_escape(names) + "</title>\n"
      "<style>\n"
      "body { font-family: sans-serif; margin: 1.5em; color: #222; background: #fff; }\n"
      "table { border-collapse: collapse; margin-bottom: 1.5em; }\n"
      "th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: left; }\n"
      "th { background: #eee; }\n"
      "svg.plot { display: block; margin-bottom: 1em; font-size: 12px; }\n"
      "svg .grid { stroke: #e3e3e3; stroke-width: 1; }\n"
      "svg .frame { fill: none; stroke: #555; stroke-width: 1; }\n"
      "svg .title { font-size: 15px; font-weight: bold; }\n"
      "svg .tick, svg .legend { fill: #333; }\n"
      "</style>\n</head>\n<body>\n<h1>Run report</h1>\n";

  html += "<h2>Runs</h2>\n<table class=\"runs\">\n";
  html += table_row({"run", "directory", "parallel layout", "read from", "last iteration", "config"}, "th");
  for (const auto& run : runs) {
    int64_t last = 0;
    for (const auto& [tag, values] : run.series) {
      if (!values.empty()) last = std::max(last, values.rbegin()->first);
    }
    html += table_row({run.name, run.directory.string(), parallel_layout(run), run.source,
                       std::to_string(last),
                       run.config_file.empty() ? "none found" : run.config_file.filename().string()});
  }
  html += "</table>\n<h2>Plots</h2>\n";
  for (const auto& definition : plot_definitions()) {
    std::vector<PlotLine> lines;
    for (size_t r = 0; r < runs.size(); ++r) {
      for (size_t t = 0; t < definition.tags.size(); ++t) {
        auto found = runs[r].series.find(definition.tags[t].first);
        if (found == runs[r].series.end() || found->second.empty()) continue;
        PlotLine line;
        line.label = definition.tags.size() > 1 ? runs[r].name + ": " + definition.tags[t].second
                                                : runs[r].name;
        line.colour = kPalette[r % std::size(kPalette)];
        line.dashed = t > 0;
        for (const auto& [step, value] : found->second) {
          line.points.push_back({static_cast<double>(step), value * definition.scale});
        }
        lines.push_back(std::move(line));
      }
    }
    if (lines.empty()) continue;
    const bool log_scale = definition.log_when_spread && wants_log_scale(lines);
    html += render_svg_plot({definition.title, "iteration", definition.y_label}, lines, log_scale);
  }

  html += "<h2>Config differences</h2>\n";
  if (runs.size() < 2) {
    html += "<p>One run: nothing to compare.</p>\n";
  } else {
    std::set<std::string> keys;
    for (const auto& run : runs) {
      for (const auto& [key, value] : run.config) keys.insert(key);
    }
    std::vector<std::string> header = {"key"};
    for (const auto& run : runs) header.push_back(run.name);
    std::string rows;
    for (const auto& key : keys) {
      std::vector<std::string> cells = {key};
      bool differs = false;
      auto value_of = [&key](const RunData& run) {
        auto found = run.config.find(key);
        return found == run.config.end() ? std::string("(absent)") : found->second;
      };
      const std::string first = value_of(runs.front());
      for (const auto& run : runs) {
        cells.push_back(value_of(run));
        differs = differs || cells.back() != first;
      }
      if (differs) rows += table_row(cells);
    }
    html += fmt::format("<p>Against the first run, {}.</p>\n", html_escape(runs.front().name));
    html += rows.empty() ? "<p>The configs are the same.</p>\n"
                         : "<table class=\"config-diff\">\n" + table_row(header, "th") + rows + "</table>\n";
  }

  html += "<h2>Jobs</h2>\n<table class=\"jobs\">\n";
  html += table_row({"run", "stage", "cluster", "job id", "state", "progress", "log"}, "th");
  for (const auto& run : runs) {
    for (const auto& job : run.jobs) {
      std::vector<std::string> cells = {run.name};
      cells.insert(cells.end(), job.begin(), job.end());
      html += table_row(cells);
    }
  }
  html += "</table>\n</body>\n</html>\n";
  return html;
}

void write_html_report(const std::vector<fs::path>& run_dirs, const fs::path& output) {
  common::output_target(output, "--html");  // before the runs are read
  std::vector<RunData> runs;
  for (const auto& run_dir : run_dirs) runs.push_back(read_run(run_dir));
  common::write_text_file_atomically(output, render_html_report(runs), common::FileMode::regular,
                                     "--html");
}

}  // namespace launcher
