// preprocess_data: Megatron-LM's tools/preprocess_data.py entry point, native (and, with
// --merge, tools/merge_datasets.py). JSONL in, {prefix}_{key}_document.bin/.idx out; any user
// error is one clear line and exit status 2, never a crash. See backend/data/preprocess_data.hpp.
#include <spdlog/spdlog.h>

#include <iostream>

#include "backend/common/error.hpp"
#include "backend/common/logging.hpp"
#include "backend/data/preprocess_data.hpp"

int main(int argc, char** argv) {
  common::setup_logging("preprocess_data");
  try {
    const auto options = backend::parse_preprocess_arguments(argc, argv);
    if (!options) return 0;  // --help
    backend::preprocess_data(*options, std::cout, std::cerr);
    return 0;
  } catch (const common::Error& error) {
    spdlog::error("{}", error.what());
    return 2;
  } catch (const std::exception& error) {
    spdlog::critical("internal error (please report): {}", error.what());
    return 3;
  }
}
