// CLI11 validators for the numeric flags of the tools (preprocess_data, download, ...): the
// flag's text must be an integer (decimal, optional sign) or a finite real in an inclusive
// range. They check the text before CLI11 converts it, so "-1", "99999999999", "nan" and
// "1e999" all get one message that names the flag and what is valid, e.g.
//   --retries: -1 is not an integer from 0 to 1000
// instead of CLI11's "Could not convert" or an out-of-range value slipping through. --help
// shows the range ("INT in [0, 1000]").
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>

namespace common {

CLI::Validator integer_in_range(int64_t min, int64_t max);
CLI::Validator real_in_range(double min, double max);

}  // namespace common
