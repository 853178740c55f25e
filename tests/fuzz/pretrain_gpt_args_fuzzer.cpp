// libFuzzer target: pretrain_gpt's command line (tests/fuzz/command_line_harness.hpp) through
// backend::parse_arguments (flag rules, Megatron's validation, the schedule), then, for a
// NullTokenizer run (no tokenizer files to read), the model shape and the memory estimate that
// pretrain_gpt checks before it allocates. Every size must be checked, never wrapped or trusted.
#include "backend/common/memory_estimate.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trainer.hpp"
#include "command_line_harness.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz_command_line::initialize();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_command_line::run("pretrain_gpt", data, size, [](int argc, const char* const* argv) {
    const auto arguments = backend::parse_arguments(argc, argv);
    if (!arguments) return;
    backend::format_arguments(*arguments);
    if (arguments->tokenizer.tokenizer_type != "NullTokenizer") return;
    const backend::GptConfig config = backend::model_config(*arguments);
    const common::MemoryEstimate estimate = backend::training_memory_estimate(
        config, arguments->run.micro_batch_size, arguments->model.seq_length);
    common::format_memory_estimate(estimate, "fuzz");
  });
}
