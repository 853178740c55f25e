// `launcher report --html`: the SVG plots (points, scales, legend), the one escaping function,
// and whole pages from run directories holding event files, job logs, configs and job records,
// hostile names included; runs with nothing to plot are refused by name.
#include <doctest/doctest.h>

#include "svg_polylines.hpp"
#include "temporary_directory.hpp"
#include "tensorboard_event_bytes.hpp"
#include "test_files.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>

#include "backend/common/error.hpp"
#include "launcher/html_report.hpp"
#include "launcher/run_status.hpp"

using namespace launcher;
namespace fs = std::filesystem;
using test_support::file_version_event;
using test_support::read_file;
using test_support::scalar_event;
using test_support::TemporaryDirectory;
using test_support::tfrecord;

namespace {

int count(const std::string& text, const std::string& pattern) {
  const std::regex expression(pattern);
  return static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), expression),
                                        std::sregex_iterator()));
}

using test_support::polyline_point_counts;

// A run directory as `launcher main` leaves it: the composed config, an event file in results/,
// a job log and its record.
void write_run(const fs::path& dir, const std::string& name, int micro_batch_size,
               const std::vector<float>& losses) {
  fs::create_directories(dir / "results");
  std::ofstream(dir / (name + "_launcher_config.yaml"))
      << fmt::format("training:\n  run:\n    name: '{}'\n  trainer:\n    num_nodes: 1\n    devices: 4\n"
                     "  model:\n    micro_batch_size: {}\n    encoder_seq_length: 32\n"
                     "    tensor_model_parallel_size: 2\n    pipeline_model_parallel_size: 1\n",
                     std::regex_replace(name, std::regex("'"), "''"), micro_batch_size);
  std::string events = tfrecord(file_version_event(1.0));
  for (size_t i = 0; i < losses.size(); ++i) {
    const auto step = static_cast<int64_t>(i + 1);
    events += tfrecord(scalar_event("lm loss", losses[i], step, 2.0));
    events += tfrecord(scalar_event("lm loss vs samples", losses[i], step * 4, 2.0));
    events += tfrecord(scalar_event("learning-rate", 1e-3f, step, 2.0));
    events += tfrecord(scalar_event("batch-size", 4, step, 2.0));
    events += tfrecord(scalar_event("iteration-time", 0.5f, step, 2.0));
  }
  std::ofstream(dir / "results" / "events.out.tfevents.1700000000.host.1.0", std::ios::binary) << events;
  std::ofstream(dir / ("log-" + name + "_7.out"))
      << " [2026-11-27 13:00:00] iteration        1/       3 | consumed samples:            4 | "
         "elapsed time per iteration (ms): 500.0 | learning rate: 1.000000E-03 | global batch size: "
         "    4 | lm loss: 9.000000E+00 | loss scale: 1.0 | grad norm: 2.000 | number of skipped "
         "iterations:   1 | number of nan iterations:   0 |\n";
  append_job_record(dir, {"training", "local", "7", dir / "s.sh", dir / ("log-" + name + "_7.out"), 0, 100});
}

}  // namespace

TEST_CASE("html_escape leaves no markup") {
  CHECK(html_escape(R"(<script>alert("x")</script> & 'y')") ==
        "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;");
  CHECK(html_escape("lm loss") == "lm loss");
}

TEST_CASE("a plot has one polyline per line with every finite point, and a legend") {
  std::vector<PlotLine> lines = {
      {"run a", "#1f77b4", false, {{1, 5}, {2, 4}, {3, 3.5}}},
      {"run b", "#d62728", false, {{1, 6}, {2, std::nan("")}, {3, 4}, {4, 3}}},
      {"empty", "#2ca02c", false, {}}};
  const std::string svg = render_svg_plot({"Training loss", "iteration", "lm loss"}, lines);
  CHECK(polyline_point_counts(svg) == std::vector<int>{3, 3});
  CHECK(count(svg, "class=\"legend-entry\"") == 2);
  CHECK(svg.find(">run a</text>") != std::string::npos);
  CHECK(svg.find("empty") == std::string::npos);
  CHECK(svg.find("stroke=\"#d62728\"") != std::string::npos);
  CHECK(svg.find(">iteration</text>") != std::string::npos);
  CHECK(svg.find("(log scale)") == std::string::npos);
  // The first point of run a is at the left edge, its last below its first.
  CHECK(svg.find("points=\"80.0,") != std::string::npos);
}

TEST_CASE("a long run's line is thinned to each bucket's lowest and highest point, spikes kept") {
  std::vector<Point> points;
  for (int i = 0; i < 100000; ++i) points.push_back({static_cast<double>(i), 5.0 - i * 1e-5});
  points[77777].y = 1000;  // one spike
  const auto thinned = thin_points(points, 1000);
  CHECK(thinned.size() == 2000);
  CHECK(std::is_sorted(thinned.begin(), thinned.end(),
                       [](const Point& a, const Point& b) { return a.x < b.x; }));
  CHECK(std::count_if(thinned.begin(), thinned.end(), [](const Point& p) { return p.y == 1000; }) == 1);
  CHECK(thinned.front().x == 0);
  CHECK(thinned.back().x == 99999);
  CHECK(thin_points({{1, 2}, {2, 3}}, 1000).size() == 2);
  const std::string svg = render_svg_plot({"Training loss", "iteration", "lm loss"},
                                          {{"long", "#1f77b4", false, points}});
  CHECK(polyline_point_counts(svg) == std::vector<int>{2000});
  CHECK(svg.find("class=\"marker\"") == std::string::npos);
}

TEST_CASE("a loss spanning more than a decade is drawn on a log scale with a tick per decade") {
  const std::vector<PlotLine> spread = {{"a", "#1f77b4", false, {{1, 11.0}, {2, 0.9}, {3, 0.05}}}};
  const std::vector<PlotLine> narrow = {{"a", "#1f77b4", false, {{1, 11.0}, {2, 2.0}}}};
  const std::vector<PlotLine> negative = {{"a", "#1f77b4", false, {{1, 11.0}, {2, -0.1}}}};
  CHECK(wants_log_scale(spread));
  CHECK_FALSE(wants_log_scale(narrow));
  CHECK_FALSE(wants_log_scale(negative));
  const std::string svg = render_svg_plot({"Training loss", "iteration", "lm loss"}, spread, true);
  CHECK(svg.find("lm loss (log scale)") != std::string::npos);
  for (const char* tick : {">0.01</text>", ">0.1</text>", ">1</text>", ">10</text>", ">100</text>"}) {
    CAPTURE(tick);
    CHECK(svg.find(tick) != std::string::npos);
  }
}

TEST_CASE("a report page of two runs: plots overlaid, layout, config diff, jobs, all escaped") {
  TemporaryDirectory base;
  const fs::path first = base.path / "gpt3_126m";
  const std::string hostile = "<i>mbs4'\"&";
  const fs::path second = base.path / hostile;
  write_run(first, "gpt3_126m", 2, {10.5f, 9.0f, 8.0f});
  write_run(second, hostile, 4, {10.0f, 7.0f, 0.5f, 0.3f});
  const fs::path output = base.path / "report.html";
  write_html_report({first, second}, output);
  const std::string html = read_file(output);
  // No temporary left beside it.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(base.path)) files += entry.is_regular_file() ? 1 : 0;
  CHECK(files == 1);

  CHECK(html.starts_with("<!DOCTYPE html>"));
  CHECK(html.find("<i>") == std::string::npos);
  CHECK(html.find("&lt;i&gt;mbs4&#39;&quot;&amp;") != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  // Training loss: two lines, 3 and 4 points (the "vs samples" tags are not plotted); the
  // second run's loss spans more than a decade: log scale.
  const size_t training = html.find("aria-label=\"Training loss\"");
  REQUIRE(training != std::string::npos);
  const std::string training_svg = html.substr(training, html.find("</svg>", training) - training);
  CHECK(polyline_point_counts(training_svg) == std::vector<int>{3, 4});
  CHECK(training_svg.find("(log scale)") != std::string::npos);
  // tokens/s from batch size × sequence length / step time: 4 × 32 / 0.5 = 256.
  CHECK(html.find("aria-label=\"Throughput\"") != std::string::npos);
  // From the log only: the grad norm and the skipped iterations.
  CHECK(html.find("aria-label=\"Gradient norm\"") != std::string::npos);
  CHECK(html.find("aria-label=\"Skipped and NaN iterations\"") != std::string::npos);
  CHECK(html.find("TensorBoard event files and job logs") != std::string::npos);
  // Nothing recorded: no plot.
  CHECK(html.find("aria-label=\"Memory\"") == std::string::npos);
  CHECK(html.find("tp 2 × pp 1 × dp 2 (1 node × 4 devices)") != std::string::npos);
  // The config diff lists the keys that differ, and only those.
  CHECK(html.find("<td>training.model.micro_batch_size</td><td>2</td><td>4</td>") != std::string::npos);
  CHECK(html.find("<td>training.run.name</td>") != std::string::npos);
  CHECK(html.find("<td>training.trainer.devices</td>") == std::string::npos);
  CHECK(html.find("<td>training</td><td>local</td><td>7</td><td>COMPLETED</td>") != std::string::npos);
}

TEST_CASE("a run without event files is plotted from its job log, a run with neither is refused") {
  TemporaryDirectory base;
  const fs::path run = base.path / "logs_only";
  fs::create_directories(run);
  std::ofstream(run / "log-logs_only_1.out")
      << " [2026-11-27 13:00:00] iteration        1/       2 | consumed samples:            4 | "
         "elapsed time per iteration (ms): 500.0 | learning rate: 1.000000E-03 | global batch size: "
         "    4 | lm loss: 9.000000E+00 | loss scale: 1.0 | grad norm: 2.000 | number of skipped "
         "iterations:   0 | number of nan iterations:   0 |\n"
         " [2026-11-27 13:00:01] iteration        2/       2 | consumed samples:            8 | "
         "elapsed time per iteration (ms): 400.0 | learning rate: 1.000000E-03 | global batch size: "
         "    4 | lm loss: 8.000000E+00 | loss scale: 1.0 | grad norm: 2.000 | number of skipped "
         "iterations:   0 | number of nan iterations:   0 |\n";
  const RunData data = read_run(run);
  CHECK(data.source == "job logs");
  CHECK(data.series.at("lm loss").size() == 2);
  CHECK(data.jobs.empty());
  const std::string html = render_html_report({data});
  CHECK(html.find("One run: nothing to compare.") != std::string::npos);
  CHECK(html.find("unknown (no config)") != std::string::npos);

  fs::create_directories(base.path / "empty");
  CHECK_THROWS_WITH_AS(read_run(base.path / "empty"),
                       doctest::Contains("empty: nothing to plot: no TensorBoard event files"),
                       common::Error);
  CHECK_THROWS_WITH_AS(read_run(base.path / "missing"), doctest::Contains("missing: not a directory"),
                       common::Error);
  // A damaged event file is named, not skipped.
  fs::create_directories(base.path / "damaged");
  std::ofstream(base.path / "damaged" / "events.out.tfevents.1.h.1.0") << "garbage bytes here!";
  CHECK_THROWS_WITH_AS(read_run(base.path / "damaged"),
                       doctest::Contains("events.out.tfevents.1.h.1.0: corrupt event record at byte offset 0"),
                       common::Error);
  // An output in a directory that does not exist names the output.
  CHECK_THROWS_WITH_AS(write_html_report({run}, base.path / "no" / "report.html"),
                       doctest::Contains("report.html"), common::Error);
}
