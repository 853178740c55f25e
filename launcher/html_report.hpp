// `launcher report <run> ... --html out.html`: one self-contained HTML page (no script, no
// network: the plots are inline SVG drawn here) comparing runs. For each run it reads
//   - the scalars of its TensorBoard event files (events.out.tfevents.* up to two levels below
//     the results directory, tensorboard_reader.hpp), and the iteration, throughput and
//     validation lines of its job logs (iteration_log.hpp); a quantity the event files do not
//     hold (tokens/s, MFU, skipped and NaN iterations; everything when there are no event
//     files) comes from the logs;
//   - the composed config the launcher wrote (<run>_launcher_config.yaml, else <run>_hydra.yaml)
//     for the parallel layout and the config diff against the first run;
//   - jobs.jsonl and the scheduler for the job states, as `launcher status` shows them.
// Plots over iterations, runs overlaid in one colour each with a legend: training loss,
// validation loss (log scale when the values span more than one decade), learning rate, grad
// norm, tokens/s, TFLOP/s per GPU, MFU, memory (Megatron's mem-* tags), skipped/NaN iterations
// and rollbacks: whichever the runs recorded. Every string from a file goes through
// html_escape; the page is written with common::write_text_file_atomically.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace launcher {

// & < > " ' as character references: safe in element text and in quoted attributes.
std::string html_escape(std::string_view text);

struct Point {
  double x = 0;
  double y = 0;
};

struct PlotLine {
  std::string label;   // the legend entry
  std::string colour;  // "#rrggbb"
  bool dashed = false;
  std::vector<Point> points;
};

struct PlotSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
};

// At most 2 × buckets of the points (in x order): for each of `buckets` equal runs of them, its
// lowest and highest point, so spikes survive; fewer points are returned as they are.
std::vector<Point> thin_points(const std::vector<Point>& points, size_t buckets);

// Whether values this positive and this spread are drawn on a log scale (all > 0 and
// max / min > 10).
bool wants_log_scale(const std::vector<PlotLine>& lines);

// One <svg> plot: axes with ticks and labels, one <polyline> per line (with a point marker
// each when few), a legend. Points that are not finite (or not positive on a log scale) and
// then empty lines are left out; a line of more than 2000 points is thinned (thin_points).
std::string render_svg_plot(const PlotSpec& spec, const std::vector<PlotLine>& lines,
                            bool log_scale = false);

// What one run recorded and where it stands.
struct RunData {
  std::string name;
  std::filesystem::path directory;
  std::string source;  // "TensorBoard event files" / "job logs" / both
  std::map<std::string, std::map<int64_t, double>> series;  // tag -> iteration -> value
  std::map<std::string, std::string> config;                // flattened dotted keys
  std::filesystem::path config_file;                        // empty when none was found
  std::vector<std::vector<std::string>> jobs;  // stage, cluster, job id, state, progress, log
};

// Reads a run directory; common::Error naming it when it has neither event files nor a job log
// with iteration lines.
RunData read_run(const std::filesystem::path& run_dir);

// The whole page.
std::string render_html_report(const std::vector<RunData>& runs);

// read_run for each, render, write `output` whole.
void write_html_report(const std::vector<std::filesystem::path>& run_dirs,
                       const std::filesystem::path& output);

}  // namespace launcher
