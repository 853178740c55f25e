// pretrain_gpt: Megatron-LM's pretrain_gpt.py entry point, native. Parses Megatron's flags,
// prints the arguments dump, trains, and exits 0; any user error is one clear line and exit
// status 2, never a crash.
#include <spdlog/spdlog.h>

#include <iostream>

#include "backend/common/error.hpp"
#include "backend/common/logging.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trainer.hpp"

int main(int argc, char** argv) {
  common::setup_logging("pretrain_gpt");
  try {
    auto arguments = backend::parse_arguments(argc, argv);
    if (!arguments) return 0;  // --help
    for (const auto& line : backend::format_arguments(*arguments)) std::cout << line << '\n';
    backend::pretrain(*arguments, std::cout);
    return 0;
  } catch (const common::Error& error) {
    std::cout.flush();  // the arguments dump first, so the message is not printed inside it
    spdlog::error("{}", error.what());
    return 2;
  } catch (const std::exception& error) {
    std::cout.flush();
    spdlog::critical("internal error (please report): {}", error.what());
    return 3;
  }
}
