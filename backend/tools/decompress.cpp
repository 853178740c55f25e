// decompress: the data_preparation stage's decompression step. Reads a .gz, .zst or .xz file
// (told apart by content: backend/data/compressed_input.hpp, which also reads concatenated
// members and plain files) and writes the decompressed bytes through a temporary beside
// `<output>` (common::DurableFileWriter::temporary_for), renamed into place when complete and
// flushed, so `<output>` is never a partial file; `<output>` follows common::output_target's
// rule (a link has its target replaced; a device, FIFO or directory is refused). An
// existing `<output>` is kept (complete by that rule) unless --force. --remove-input deletes
// INPUT once `<output>` is in place (NeMo's Pile extract step with rm_downloaded: True), also
// when `<output>` was already there.
//   decompress INPUT [--output FILE] [--force] [--remove-input] [--progress auto|bar|log|none]
// The default output is INPUT without its .gz/.zst/.xz suffix. Plain input is refused (there
// is nothing to decompress, and copying it would hide a failed download), and so is content
// that its name does not promise (a plain file named .gz; bzip2, which is not built).
// Progress is that of the compressed input read (a terminal line redrawn in place, or a log
// line per tenth).
// Exit status: 0 done or already there, 2 a failure naming the file, 3 an internal error.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <span>
#include <string_view>
#include <vector>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/logging.hpp"
#include "backend/common/tool_main.hpp"
#include "backend/data/compressed_input.hpp"
#include "backend/fetch/transfer_progress.hpp"

namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string default_output(const std::string& input) {
  for (const char* suffix : {".gz", ".zst", ".xz", ".bz2"}) {  // .bz2: refused by the reader
    if (input.ends_with(suffix) && input.size() > std::strlen(suffix)) {
      return input.substr(0, input.size() - std::strlen(suffix));
    }
  }
  common::fail("decompress {}: the name does not end in .gz, .zst or .xz; pass --output FILE", input);
}

void decompress(const std::string& input, const fs::path& given_output, bool force,
                backend::ProgressMode mode) {
  std::error_code input_error;
  if (!fs::is_regular_file(input, input_error)) common::fail("decompress: {} is not a file", input);
  if (given_output.filename().empty()) {
    common::fail("decompress {}: --output {} names a directory, not a file to write; add the file "
                 "name", input, given_output.string());
  }
  // common::output_target's rule: a link to a regular file has its target replaced; a
  // directory, device, FIFO or broken link is refused before anything is read.
  const fs::path output = [&] {
    try {
      return common::replaceable_output_file(given_output, "--output");
    } catch (const common::Error& error) {
      common::fail("decompress {}: {}", input, error.what());
    }
  }();
  std::error_code status_error;
  if (fs::exists(fs::symlink_status(output, status_error)) && !force) {
    spdlog::info("{} is already there; not decompressing {} again", output.string(), input);
    return;
  }
  if (output.has_parent_path()) {
    std::error_code error;
    fs::create_directories(output.parent_path(), error);
    if (error) {
      common::fail("decompress {}: cannot create the directory {}: {}", input,
                   output.parent_path().string(), error.message());
    }
  }
  backend::CompressedInput reader(input);  // refuses content its name does not promise
  if (std::string_view(reader.format()) == "plain") {
    common::fail("decompress: {} is not compressed (gzip, zstd or xz); nothing to decompress", input);
  }
  common::DurableFileWriter writer = common::DurableFileWriter::temporary_for(output);
  const fs::path temporary = writer.path();
  // Progress counts decompressed bytes against an unknown total (the formats do not all store it).
  backend::TransferProgress progress(mode, output.filename().string(), std::cerr,
                                     [](const std::string& line) { spdlog::info("{}", line); });
  progress.note(fmt::format("decompressing {} ({}) to {}", input, reader.format(), output.string()));
  try {
    std::vector<char> buffer(4 << 20);
    int64_t written = 0;
    progress.start(0, -1, now_seconds());
    while (const size_t got = reader.read(buffer.data(), buffer.size())) {
      writer.write(std::as_bytes(std::span(buffer.data(), got)));
      written += static_cast<int64_t>(got);
      progress.update(written, now_seconds());
    }
    writer.finish();
    progress.finish(written, now_seconds());
    common::rename_path(temporary, output);
  } catch (...) {
    std::error_code ignored;
    fs::remove(temporary, ignored);
    throw;
  }
}

}  // namespace

int main(int argc, char** argv) {
  common::setup_logging("decompress");
  return common::run_tool([&] {
    std::string input, output, progress = "auto";
    bool force = false, remove_input = false;
    CLI::App app{"Decompress a .gz, .zst or .xz file (megatron-native's data_preparation stage)",
                 "decompress"};
    app.add_option("input", input, "The compressed file")->required();
    app.add_option("-o,--output", output, "Where to write (default: the input without its suffix)");
    app.add_flag("--force", force, "Decompress even when the output exists");
    app.add_flag("--remove-input", remove_input, "Delete the input once the output is in place");
    app.add_option("--progress", progress, "bar, log, none or auto (bar on a terminal)")
        ->check(CLI::IsMember({"auto", "bar", "log", "none"}));
    app.set_version_flag("--version", std::string(PROJECT_VERSION_STRING),
                         "Print the version (the launcher's) and exit");
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      std::cout << app.help();
      return 0;
    } catch (const CLI::CallForVersion&) {
      std::cout << PROJECT_VERSION_STRING << '\n';
      return 0;
    } catch (const CLI::ParseError& error) {
      common::fail("decompress: {} (run decompress --help for the flags)", error.what());
    }
    if (output.empty()) output = default_output(input);
    backend::ProgressMode mode = backend::ProgressMode::kLog;
    if (progress == "bar" || (progress == "auto" && isatty(STDERR_FILENO))) {
      mode = backend::ProgressMode::kTerminal;
    } else if (progress == "none") {
      mode = backend::ProgressMode::kNone;
    }
    decompress(input, output, force, mode);
    if (remove_input) {
      // Only after the output is complete (renamed into place, or found there): a failed run
      // keeps its input, so launching again can still finish without downloading it again.
      std::error_code error;
      fs::remove(input, error);
      if (error) {
        common::fail("decompress: {} is written but {} could not be removed: {}", output, input,
                     error.message());
      }
      spdlog::info("removed {} (--remove-input)", input);
    }
    return 0;
  });
}
