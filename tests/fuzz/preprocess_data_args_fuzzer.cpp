// libFuzzer target: preprocess_data's command line (tests/fuzz/command_line_harness.hpp)
// through backend::parse_preprocess_arguments, which checks every flag and that no output is
// an input without creating or opening anything for writing.
#include "backend/data/preprocess_data.hpp"
#include "command_line_harness.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz_command_line::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_command_line::run("preprocess_data", data, size,
                                [](int argc, const char* const* argv) {
                                  backend::parse_preprocess_arguments(argc, argv);
                                });
}
