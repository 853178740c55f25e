// decompress: the data_preparation stage's decompression step. Reads a .gz, .zst or .xz file
// (told apart by content: backend/data/compressed_input.hpp, which also reads concatenated
// members and plain files) and writes the decompressed bytes through `<output>.tmp-<pid>`,
// renamed into place when complete and flushed, so `<output>` is never a partial file. An
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
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string_view>
#include <vector>

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

void write_all(int fd, const char* data, size_t size, const fs::path& path) {
  while (size > 0) {
    const ssize_t done = ::write(fd, data, size);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) common::fail("cannot write {}: {}", path.string(), std::strerror(errno));
    data += done;
    size -= static_cast<size_t>(done);
  }
}

void decompress(const std::string& input, const fs::path& output, bool force, backend::ProgressMode mode) {
  if (!fs::is_regular_file(input)) common::fail("decompress: {} is not a file", input);
  std::error_code status_error;
  const fs::file_status status = fs::status(output, status_error);
  if (output.filename().empty()) {
    common::fail("decompress {}: --output {} names a directory, not a file to write; add the file "
                 "name", input, output.string());
  }
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    common::fail("decompress {}: --output {} is {}, not a file to write", input, output.string(),
                 fs::is_directory(status) ? "a directory" : "a device, pipe or socket");
  }
  if (fs::exists(output) && !force) {
    spdlog::info("{} is already there; not decompressing {} again", output.string(), input);
    return;
  }
  if (output.has_parent_path()) fs::create_directories(output.parent_path());
  backend::CompressedInput reader(input);  // refuses content its name does not promise
  if (std::string_view(reader.format()) == "plain") {
    common::fail("decompress: {} is not compressed (gzip, zstd or xz); nothing to decompress", input);
  }
  const fs::path temporary = output.string() + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) common::fail("cannot create {}: {}", temporary.string(), std::strerror(errno));
  // Progress counts decompressed bytes against an unknown total (the formats do not all store it).
  backend::TransferProgress progress(mode, output.filename().string(), std::cerr,
                                     [](const std::string& line) { spdlog::info("{}", line); });
  progress.note(fmt::format("decompressing {} ({}) to {}", input, reader.format(), output.string()));
  try {
    std::vector<char> buffer(4 << 20);
    int64_t written = 0;
    progress.start(0, -1, now_seconds());
    while (const size_t got = reader.read(buffer.data(), buffer.size())) {
      write_all(fd, buffer.data(), got, temporary);
      written += static_cast<int64_t>(got);
      progress.update(written, now_seconds());
    }
    if (::fsync(fd) != 0) common::fail("cannot flush {}: {}", temporary.string(), std::strerror(errno));
    ::close(fd);
    fd = -1;
    progress.finish(written, now_seconds());
    std::error_code error;
    fs::rename(temporary, output, error);
    if (error) common::fail("cannot rename {} to {}: {}", temporary.string(), output.string(), error.message());
  } catch (...) {
    if (fd >= 0) ::close(fd);
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
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      std::cout << app.help();
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
