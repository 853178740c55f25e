// preprocess_data: Megatron-LM's tools/preprocess_data.py entry point, native (and, with
// --merge, tools/merge_datasets.py). JSONL in, {prefix}_{key}_document.bin/.idx out; any user
// error is one clear line and exit status 2, never a crash. See backend/data/preprocess_data.hpp.
// --remove-input deletes the inputs only after the datasets are complete, so a failed run keeps
// them for the next try.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>
#include <system_error>

#include "backend/common/error.hpp"
#include "backend/common/logging.hpp"
#include "backend/common/tool_main.hpp"
#include "backend/data/preprocess_data.hpp"

int main(int argc, char** argv) {
  common::setup_logging("preprocess_data");
  return common::run_tool([&] {
    const auto options = backend::parse_preprocess_arguments(argc, argv);
    if (!options) return 0;  // --help
    backend::preprocess_data(*options, std::cout, std::cerr);
    if (options->remove_inputs) {
      for (const std::string& input : options->inputs) {
        std::error_code error;
        std::filesystem::remove(input, error);
        if (error) {
          common::fail("the datasets are written but --input {} could not be removed: {}", input,
                       error.message());
        }
        spdlog::info("removed {} (--remove-input)", input);
      }
    }
    return 0;
  });
}
