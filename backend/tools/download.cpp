// download: fetch one file (http(s)://, ftp(s)://, file://) for the launcher's data_preparation
// stage, as its job scripts run it on compute nodes (next to preprocess_data). Resumes a
// partial `<output>.part`, retries with exponential backoff, verifies --sha256, and renames the
// file into place only when complete (backend/fetch/download.hpp). Progress: a status line
// redrawn in place on a terminal; plain log lines otherwise (a Slurm job's output file).
//   download URL [--output FILE] [--sha256 HEX] [--retries N] [--retry-delay S] ...
// Exit status: 0 downloaded or already there, 2 any failure (one line naming the URL and the
// HTTP status or curl error), 3 an internal error.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <iostream>
#include <optional>

#include "backend/common/error.hpp"
#include "backend/common/logging.hpp"
#include "backend/common/url_file_name.hpp"
#include "backend/fetch/download.hpp"

namespace {

struct ToolOptions {
  backend::DownloadOptions download;
  std::string output;
  std::string progress = "auto";
};

std::optional<ToolOptions> parse(int argc, char** argv) {
  ToolOptions options;
  backend::DownloadOptions& d = options.download;
  CLI::App app{"Download one file with resume, retries and SHA-256 verification "
               "(megatron-native's data_preparation stage)", "download"};
  app.option_defaults()->always_capture_default();
  app.get_formatter()->column_width(34);
  app.add_option("url", d.url, "http(s)://, ftp(s):// or file:// URL")->required();
  app.add_option("-o,--output", options.output,
                 "Where to save it (default: the URL's file name in the current directory)");
  app.add_option("--sha256", d.sha256, "Expected SHA-256 (hex); the file is refused when it differs");
  app.add_option("--retries", d.retries, "Attempts after the first, counted while no byte arrives");
  app.add_option("--retry-delay", d.retry_delay_seconds, "Seconds before the first retry; doubles each time");
  app.add_option("--max-retry-delay", d.max_retry_delay_seconds, "Longest wait between attempts (seconds)");
  app.add_option("--stall-timeout", d.stall_timeout_seconds, "Abandon an attempt after this many seconds without data");
  app.add_option("--connect-timeout", d.connect_timeout_seconds, "Seconds to wait for a connection");
  app.add_flag("--force", d.force, "Download even when the output file exists");
  app.add_option("--progress", options.progress,
                 "bar: a status line redrawn in place; log: a line per tenth; auto: bar on a terminal")
      ->check(CLI::IsMember({"auto", "bar", "log", "none"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::ParseError& error) {
    common::fail("download: {} (run download --help for the flags)", error.what());
  }
  if (options.output.empty()) {
    options.output = common::url_file_name(d.url);
    if (options.output.empty()) {
      common::fail("download {}: the URL names no file; pass --output FILE", d.url);
    }
  }
  d.output = options.output;
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  common::setup_logging("download");
  try {
    const std::optional<ToolOptions> options = parse(argc, argv);
    if (!options) return 0;
    backend::ProgressMode mode = backend::ProgressMode::kLog;
    if (options->progress == "bar" || (options->progress == "auto" && isatty(STDERR_FILENO))) {
      mode = backend::ProgressMode::kTerminal;
    } else if (options->progress == "none") {
      mode = backend::ProgressMode::kNone;
    }
    backend::TransferProgress progress(mode, options->download.output.filename().string(), std::cerr,
                                       [](const std::string& line) { spdlog::info("{}", line); });
    backend::download(options->download, progress);
    return 0;
  } catch (const common::Error& error) {
    spdlog::error("{}", error.what());
    return 2;
  } catch (const std::exception& error) {
    spdlog::critical("internal error (please report): {}", error.what());
    return 3;
  }
}
