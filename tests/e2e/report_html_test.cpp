// End to end: two tiny real trainings through `launcher main`, `launcher report --html` over
// both, and the page loaded by a real headless chromium: no console errors, the DOM holds the
// SVG plots with one polyline per run and as many points as iterations, and a screenshot
// (decoded here: PNG chunks, zlib, the five row filters of the PNG specification, section 9)
// shows each run's colour drawn across the plot area. Also the backend's TensorBoardWriter
// read back by the launcher's reader, and `launcher logs -f` / `launcher status` showing a
// running job's progress from pretrain_gpt's own iteration lines. Skips with a message when chromium is missing, except
// under CI (CI=true), where container/install-deps.sh --tests installs it and its absence fails.
#include <doctest/doctest.h>
#include <zlib.h>

#include "spawned_process.hpp"
#include "svg_polylines.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <regex>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/train/log/tensorboard_writer.hpp"
#include "backend/train/log/training_log.hpp"
#include "launcher/process.hpp"
#include "launcher/run_status.hpp"
#include "launcher/tensorboard_reader.hpp"

namespace fs = std::filesystem;
using test_support::read_file;

namespace {

using test_support::running_under_ci;

std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser"}) {
    if (auto path = launcher::find_on_path(name)) return path->string();
  }
  const std::string problem = "chromium is missing (apt-get install chromium, or bash "
                              "container/install-deps.sh --tests)";
  if (running_under_ci()) FAIL("under CI the report page must be checked in a browser: " << problem);
  MESSAGE("skipping the browser check of launcher report --html: " << problem);
  return "";
}

launcher::CapturedRun tiny_training(const fs::path& results, const std::string& name,
                                    const std::string& seed) {
  return launcher::run_and_capture(
      {std::string(TEST_BIN_DIR) + "/launcher", "main", "training=gpt3/126m", "cluster_type=local",
       "base_results_dir=" + results.string(), "training.run.name=" + name,
       "training.trainer.max_steps=3", "training.model.global_batch_size=4",
       "training.model.micro_batch_size=2", "training.model.seed=" + seed,
       "training.model.encoder_seq_length=32", "training.model.num_layers=2",
       "training.model.hidden_size=64", "training.model.num_attention_heads=4",
       "training.trainer.limit_val_batches=1"});
}

std::vector<std::string> chromium_command(const std::string& chromium, const fs::path& profile) {
  return {chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
          "--user-data-dir=" + profile.string(), "--enable-logging=stderr", "--v=0"};
}

struct Image {
  uint32_t width = 0, height = 0;
  int channels = 0;
  std::vector<std::vector<uint8_t>> rows;
};

uint32_t big_endian(const std::string& bytes, size_t at) {
  return (uint32_t{static_cast<uint8_t>(bytes[at])} << 24) |
         (uint32_t{static_cast<uint8_t>(bytes[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(bytes[at + 2])} << 8) | uint32_t{static_cast<uint8_t>(bytes[at + 3])};
}

// An 8-bit RGB or RGBA, non-interlaced PNG (what chromium writes).
Image decode_png(const std::string& bytes) {
  Image image;
  REQUIRE(bytes.size() > 8);
  REQUIRE(bytes.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  std::string compressed;
  for (size_t at = 8; at + 12 <= bytes.size();) {
    const uint32_t length = big_endian(bytes, at);
    const std::string kind = bytes.substr(at + 4, 4);
    if (kind == "IHDR") {
      image.width = big_endian(bytes, at + 8);
      image.height = big_endian(bytes, at + 12);
      REQUIRE(static_cast<int>(bytes[at + 16]) == 8);    // bit depth
      const int colour_type = bytes[at + 17];
      REQUIRE((colour_type == 2 || colour_type == 6));
      REQUIRE(static_cast<int>(bytes[at + 20]) == 0);    // not interlaced
      image.channels = colour_type == 2 ? 3 : 4;
    } else if (kind == "IDAT") {
      compressed += bytes.substr(at + 8, length);
    }
    at += 12 + length;
  }
  const size_t stride = size_t{image.width} * image.channels;
  std::vector<uint8_t> raw((stride + 1) * image.height);
  uLongf raw_size = raw.size();
  REQUIRE(uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(compressed.data()),
                     compressed.size()) == Z_OK);
  REQUIRE(raw_size == raw.size());
  std::vector<uint8_t> previous(stride, 0);
  const size_t c = image.channels;
  for (uint32_t y = 0; y < image.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    std::vector<uint8_t> row(raw.begin() + y * (stride + 1) + 1, raw.begin() + (y + 1) * (stride + 1));
    for (size_t i = 0; i < stride; ++i) {
      const int left = i >= c ? row[i - c] : 0, up = previous[i], up_left = i >= c ? previous[i - c] : 0;
      int predictor = 0;
      if (filter == 1) predictor = left;
      if (filter == 2) predictor = up;
      if (filter == 3) predictor = (left + up) / 2;
      if (filter == 4) {
        const int estimate = left + up - up_left;
        const int to_left = std::abs(estimate - left), to_up = std::abs(estimate - up),
                  to_up_left = std::abs(estimate - up_left);
        predictor = to_left <= to_up && to_left <= to_up_left ? left : to_up <= to_up_left ? up : up_left;
      }
      row[i] = static_cast<uint8_t>(row[i] + predictor);
    }
    previous = row;
    image.rows.push_back(std::move(row));
  }
  return image;
}

// pretrain_gpt's own iteration line (backend/train/log/training_log.cpp).
std::string iteration_line(int64_t iteration, int64_t total, double milliseconds) {
  backend::IterationLogFields fields;
  fields.timestamp = 1795000000;
  fields.iteration = iteration;
  fields.train_iters = total;
  fields.consumed_samples = iteration * 4;
  fields.elapsed_ms_per_iteration = milliseconds;
  fields.learning_rate = 6e-4;
  fields.global_batch_size = 4;
  fields.lm_loss = 9.5;
  fields.grad_norm = 2.0;
  return backend::format_iteration_line(fields) + "\n";
}

// Waits up to 20 s for `text` in the file.
bool wait_for_text(const fs::path& file, const std::string& text) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (read_file(file).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Pixels within 24 per channel of the colour (anti-aliased edges are not exact), and how far
// apart the leftmost and rightmost of them are.
struct ColourSpread {
  int pixels = 0;
  int width = 0;
};

ColourSpread find_colour(const Image& image, uint8_t red, uint8_t green, uint8_t blue) {
  ColourSpread spread;
  int low = static_cast<int>(image.width), high = -1;
  for (const auto& row : image.rows) {
    for (uint32_t x = 0; x < image.width; ++x) {
      const uint8_t* pixel = row.data() + size_t{x} * image.channels;
      if (std::abs(pixel[0] - red) <= 24 && std::abs(pixel[1] - green) <= 24 &&
          std::abs(pixel[2] - blue) <= 24) {
        ++spread.pixels;
        low = std::min(low, static_cast<int>(x));
        high = std::max(high, static_cast<int>(x));
      }
    }
  }
  spread.width = high - low;
  return spread;
}

using test_support::polyline_point_counts;

}  // namespace

TEST_CASE("the backend's TensorBoardWriter is read back by the launcher's reader") {
  test_support::TemporaryDirectory directory;
  fs::path file;
  {
    backend::TensorBoardWriter writer(directory.path, 2);
    writer.add_scalar("lm loss", 10.5, 1, 1700000000.0);
    writer.add_scalar("lm loss", 9.25, 2, 1700000001.0);
    writer.add_scalar("learning-rate", 3e-4, 2, 1700000001.0);
    file = writer.path();
  }
  const auto files = launcher::find_tensorboard_files(directory.path);
  REQUIRE(files == std::vector<fs::path>{file});
  const auto events = launcher::read_tensorboard_file(file);
  REQUIRE(events.size() == 3);
  CHECK(events[1].tag == "lm loss");
  CHECK(events[1].step == 2);
  CHECK(events[1].value == 9.25);
  CHECK(events[1].wall_time == 1700000001.0);
  CHECK(events[2].value == doctest::Approx(3e-4).epsilon(1e-6));
  // The same bytes with the last record cut short: a job still writing.
  const std::string bytes = read_file(file);
  CHECK(launcher::parse_tensorboard_events(bytes.substr(0, bytes.size() - 3), "f").size() == 2);
}

TEST_CASE("launcher logs -f shows a running job's progress and ETA, then follows its log") {
  test_support::TemporaryDirectory run;
  const fs::path log = run.path / "log-gpt3_126m_1.out";
  std::ofstream(log) << iteration_line(10, 100, 500.0) << iteration_line(20, 100, 500.0);
  // A local job that lives (this test process) and has written no exit status: RUNNING.
  launcher::append_job_record(run.path, {"training", "local", std::to_string(getpid()),
                                         run.path / "s.sh", log, std::nullopt, 100});
  const fs::path output = run.path / "follow.txt";
  const pid_t follower = test_support::spawn_process(
      {std::string(TEST_BIN_DIR) + "/launcher", "logs", "-f", run.path.string()}, output);
  CHECK(wait_for_text(output, fmt::format("job {} is RUNNING: iteration 20/100 (20%), ETA 40s", getpid())));
  CHECK(wait_for_text(output, "iteration       20/     100 |"));
  // It follows: a line written later appears too.
  std::ofstream(log, std::ios::app) << iteration_line(30, 100, 500.0);
  CHECK(wait_for_text(output, "iteration       30/     100 |"));
  kill(follower, SIGTERM);
  CHECK(test_support::wait_for_exit(follower) == 128 + SIGTERM);
  // And `launcher status` shows the same progress.
  const auto status = launcher::run_and_capture({std::string(TEST_BIN_DIR) + "/launcher", "status", run.path.string()});
  INFO(status.output);
  CHECK(status.exit_code == 0);
  CHECK(status.output.find("30/100 (30%), ETA 35s") != std::string::npos);
}

TEST_CASE("launcher report --html over two real runs renders in chromium with both runs' plots") {
  const std::string chromium = find_chromium();
  if (chromium.empty()) return;
  test_support::TemporaryDirectory temporary;
  // Two seeds: two different loss curves, so neither hides the other in the screenshot.
  for (const auto& [name, seed] : {std::pair{"run_a", "1234"}, std::pair{"run_b", "4321"}}) {
    const auto run = tiny_training(temporary.path, name, seed);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
  }
  const std::string launcher_path = std::string(TEST_BIN_DIR) + "/launcher";
  const fs::path page = temporary.path / "report.html";
  const auto report = launcher::run_and_capture(
      {launcher_path, "report", (temporary.path / "run_a").string(),
       (temporary.path / "run_b").string(), "--html", page.string()});
  INFO(report.output);
  REQUIRE(report.exit_code == 0);
  const std::string html = read_file(page);
  CHECK(html.find("<td>training.model.seed</td><td>1234</td><td>4321</td>") != std::string::npos);
  CHECK(html.find("<td>COMPLETED</td>") != std::string::npos);

  // A bad input: a run with nothing to plot is named, exit 2, and no page is written.
  fs::create_directories(temporary.path / "not_a_run");
  const auto refused = launcher::run_and_capture(
      {launcher_path, "report", (temporary.path / "not_a_run").string(), "--html",
       (temporary.path / "refused.html").string()});
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("not_a_run: nothing to plot") != std::string::npos);
  CHECK_FALSE(fs::exists(temporary.path / "refused.html"));
  const auto empty_name = launcher::run_and_capture(
      {launcher_path, "report", (temporary.path / "run_a").string(), "--html", ""});
  CHECK(empty_name.exit_code == 2);
  CHECK(empty_name.output.find("--html: the output file name is empty") != std::string::npos);

  // (a) The DOM as chromium built it, and its console.
  auto dom_command = chromium_command(chromium, temporary.path / "profile");
  dom_command.push_back("--dump-dom");
  dom_command.push_back("file://" + page.string());
  const auto dom = launcher::run_and_capture(dom_command);
  INFO(dom.output);
  REQUIRE(dom.exit_code == 0);
  CHECK(dom.output.find(":CONSOLE") == std::string::npos);
  const size_t training = dom.output.find("aria-label=\"Training loss\"");
  REQUIRE(training != std::string::npos);
  const std::string training_svg = dom.output.substr(training, dom.output.find("</svg>", training) - training);
  CHECK(polyline_point_counts(training_svg) == std::vector<int>{3, 3});  // 3 iterations each
  CHECK(training_svg.find("<text class=\"legend\" x=\"690\" y=\"48\">run_a</text>") != std::string::npos);
  CHECK(training_svg.find(">run_b</text>") != std::string::npos);
  for (const char* plot : {"Validation loss", "Learning rate", "Gradient norm", "Throughput",
                           "Step time"}) {
    CAPTURE(plot);
    CHECK(dom.output.find(std::string("aria-label=\"") + plot + "\"") != std::string::npos);
  }

  // (b) The screenshot: each run's colour drawn across a plot, not only in a legend swatch.
  const fs::path screenshot = temporary.path / "report.png";
  auto shot_command = chromium_command(chromium, temporary.path / "profile");
  shot_command.push_back("--window-size=960,1000");
  shot_command.push_back("--screenshot=" + screenshot.string());
  shot_command.push_back("file://" + page.string());
  const auto shot = launcher::run_and_capture(shot_command);
  INFO(shot.output);
  REQUIRE(shot.exit_code == 0);
  const Image image = decode_png(read_file(screenshot));
  CHECK(image.width == 960);
  CHECK(image.height == 1000);
  const ColourSpread first = find_colour(image, 0x1f, 0x77, 0xb4);
  const ColourSpread second = find_colour(image, 0xd6, 0x27, 0x28);
  CHECK(first.pixels > 300);
  CHECK(second.pixels > 300);
  CHECK(first.width > 400);  // the plot area is 560 px wide; a legend swatch 24
  CHECK(second.width > 400);
  // Mostly white page: the plots are drawn on it, not an error page.
  CHECK(find_colour(image, 0xff, 0xff, 0xff).pixels > static_cast<int>(image.width * image.height / 2));
}
