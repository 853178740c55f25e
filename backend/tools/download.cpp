// download: fetch one file (http(s)://, ftp(s)://, file://) for the launcher's data_preparation
// stage, as its job scripts run it on compute nodes (next to preprocess_data). Resumes a
// partial `<output>.part`, retries with exponential backoff, verifies --sha256, and renames the
// file into place only when complete (backend/fetch/download.hpp). Progress: a status line
// redrawn in place on a terminal; plain log lines otherwise (a Slurm job's output file).
//   download URL [--output FILE] [--sha256 HEX] [--retries N] [--retry-delay S] ...
// The command line is parsed by backend/fetch/download_command_line.hpp.
// Exit status: 0 downloaded or already there, 2 any failure (one line naming the URL and the
// HTTP status or curl error), 3 an internal error.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <iostream>

#include "backend/common/logging.hpp"
#include "backend/common/tool_main.hpp"
#include "backend/fetch/download.hpp"
#include "backend/fetch/download_command_line.hpp"

int main(int argc, char** argv) {
  common::setup_logging("download");
  return common::run_tool([&] {
    const auto options = backend::parse_download_arguments(argc, argv);
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
  });
}
