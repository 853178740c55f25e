// download's command line (backend/tools/download.cpp), parsed and validated with no side
// effects (argv in, options or a common::Error out; nothing opened, nothing fetched), so that
// it can be fuzzed:
//   download URL [--output FILE] [--sha256 HEX] [--retries N] [--retry-delay S]
//            [--max-retry-delay S] [--stall-timeout S] [--connect-timeout S] [--force]
//            [--progress auto|bar|log|none]
// Numeric flags are checked on their text with their ranges (a table of common/flag_rules.hpp), e.g.
// "--retries: '-1' is out of range; --retries takes an integer in [0, 1000]". Without --output the file is named after
// the URL (url_file_name.hpp); a URL that names no file needs --output.
#pragma once

#include <optional>
#include <string>

#include "backend/fetch/download.hpp"

namespace backend {

struct DownloadCommand {
  DownloadOptions download;
  std::string progress = "auto";  // auto, bar, log or none
};

// nullopt after --help (printed to stdout).
std::optional<DownloadCommand> parse_download_arguments(int argc, const char* const* argv);

}  // namespace backend
