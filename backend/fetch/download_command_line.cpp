// See download_command_line.hpp. The ranges are documented in docs/data.md ("download").
#include "backend/fetch/download_command_line.hpp"

#include <CLI/CLI.hpp>

#include "backend/common/command_line.hpp"
#include "backend/common/error.hpp"
#include "backend/common/flag_rules.hpp"
#include "backend/common/url_file_name.hpp"

namespace backend {

namespace {

constexpr std::string_view kProgressStyles[] = {"auto", "bar", "log", "none"};
// Bounds: beyond them a value is a typo, and the waits (2^k backoff, curl's longs) stay finite.
constexpr common::FlagRule kDownloadFlagRules[] = {
    common::text_flag("url"),
    common::text_flag("--output"),
    common::text_flag("--sha256"),
    common::integer_flag("--retries", 0, 1000),
    common::real_flag("--retry-delay", 0, true, 3600),
    common::real_flag("--max-retry-delay", 0, true, 86400),
    common::integer_flag("--stall-timeout", 1, 86400),
    common::integer_flag("--connect-timeout", 1, 3600),
    common::choice_flag("--progress", kProgressStyles),
};

}  // namespace

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
  app.add_option("--retries", d.retries, "Attempts after the first, counted while no byte arrives");
  app.add_option("--retry-delay", d.retry_delay_seconds, "Seconds before the first retry; doubles each time");
  app.add_option("--max-retry-delay", d.max_retry_delay_seconds, "Longest wait between attempts (seconds)");
  app.add_option("--stall-timeout", d.stall_timeout_seconds,
                 "Abandon an attempt after this many seconds without data");
  app.add_option("--connect-timeout", d.connect_timeout_seconds, "Seconds to wait for a connection");
  app.add_flag("--force", d.force, "Download even when the output file exists");
  app.add_option("--progress", command.progress,
                 "bar: a status line redrawn in place; log: a line per tenth; auto: bar on a terminal");
  common::apply_flag_rules(app, kDownloadFlagRules);
  const common::RefusedFlags no_refused_flags(app, {});
  if (!common::parse_command_line(app, argc, argv, "download", no_refused_flags, "")) {
    return std::nullopt;
  }
  if (output.empty()) {
    output = common::url_file_name(d.url);
    if (output.empty()) common::fail("download {}: the URL names no file; pass --output FILE", d.url);
    // Checked here, where the name comes from: the system would refuse it at the first call
    // ("File name too long"), which is not a reason the user can act on.
    if (output.size() > common::kMaxFileNameBytes) {
      common::fail("download {}...: the URL's file name is {} bytes, more than the {} bytes a "
                   "file name may have; pass --output FILE to name the download",
                   d.url.substr(0, 80), output.size(), common::kMaxFileNameBytes);
    }
  }
  d.output = output;
  return command;
}

}  // namespace backend
