// See download_command_line.hpp. The ranges are documented in docs/data.md ("download").
#include "backend/fetch/download_command_line.hpp"

#include <CLI/CLI.hpp>

#include "backend/common/command_line.hpp"
#include "backend/common/error.hpp"
#include "backend/common/numeric_flag.hpp"
#include "backend/common/url_file_name.hpp"

namespace backend {

std::optional<DownloadCommand> parse_download_arguments(int argc, const char* const* argv) {
  DownloadCommand command;
  DownloadOptions& d = command.download;
  std::string output;
  CLI::App app{"Download one file with resume, retries and SHA-256 verification "
               "(megatron-native's data_preparation stage)", "download"};
  app.option_defaults()->always_capture_default();
  app.get_formatter()->column_width(34);
  app.add_option("url", d.url, "http(s)://, ftp(s):// or file:// URL")->required();
  app.add_option("-o,--output", output,
                 "Where to save it (default: the URL's file name in the current directory)");
  app.add_option("--sha256", d.sha256, "Expected SHA-256 (hex); the file is refused when it differs");
  // Bounds: beyond them a value is a typo, and the waits (2^k backoff, curl's longs) stay finite.
  app.add_option("--retries", d.retries, "Attempts after the first, counted while no byte arrives")
      ->check(common::integer_in_range(0, 1000));
  app.add_option("--retry-delay", d.retry_delay_seconds, "Seconds before the first retry; doubles each time")
      ->check(common::real_in_range(0, 3600));
  app.add_option("--max-retry-delay", d.max_retry_delay_seconds, "Longest wait between attempts (seconds)")
      ->check(common::real_in_range(0, 86400));
  app.add_option("--stall-timeout", d.stall_timeout_seconds,
                 "Abandon an attempt after this many seconds without data")
      ->check(common::integer_in_range(1, 86400));
  app.add_option("--connect-timeout", d.connect_timeout_seconds, "Seconds to wait for a connection")
      ->check(common::integer_in_range(1, 3600));
  app.add_flag("--force", d.force, "Download even when the output file exists");
  app.add_option("--progress", command.progress,
                 "bar: a status line redrawn in place; log: a line per tenth; auto: bar on a terminal")
      ->check(CLI::IsMember({"auto", "bar", "log", "none"}));
  const common::RefusedFlags no_refused_flags(app, {});
  if (!common::parse_command_line(app, argc, argv, "download", no_refused_flags, "")) {
    return std::nullopt;
  }
  if (output.empty()) {
    output = common::url_file_name(d.url);
    if (output.empty()) common::fail("download {}: the URL names no file; pass --output FILE", d.url);
  }
  d.output = output;
  return command;
}

}  // namespace backend
