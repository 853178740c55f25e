// libFuzzer target: checkpoint_util's command line (tests/fuzz/command_line_harness.hpp)
// through backend::parse_checkpoint_util_arguments.
#include "backend/ckpt/checkpoint_util_options.hpp"
#include "command_line_harness.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz_command_line::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_command_line::run("checkpoint_util", data, size,
                                [](int argc, const char* const* argv) {
                                  backend::parse_checkpoint_util_arguments(argc, argv);
                                });
}
