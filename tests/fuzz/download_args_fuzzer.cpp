// libFuzzer target: download's command line (tests/fuzz/command_line_harness.hpp) through
// backend::parse_download_arguments: flag rules, the output name taken from the URL; nothing is
// fetched or written.
#include "backend/fetch/download_command_line.hpp"
#include "command_line_harness.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz_command_line::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_command_line::run("download", data, size, [](int argc, const char* const* argv) {
    backend::parse_download_arguments(argc, argv);
  });
}
