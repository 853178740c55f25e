// Megatron-LM's command-line flags for pretrain_gpt (megatron/training/arguments.py), parsed
// with CLI11 into one value type, TrainingArguments. Each concern's flags are a table
// (arguments.cpp, flag_table.hpp) from which the CLI11 options and the arguments dump are made;
// the model (backend/model/model_arguments.hpp), the tokenizer (data/tokenizer.hpp's
// TokenizerOptions), the training data (data/data_arguments.hpp), the run's batches, length and
// evaluation cadence (train/run_arguments.hpp), the parallel layout
// (dist/parallelism_arguments.hpp), mixed precision (optim/mixed_precision_arguments.hpp), the
// optimizer and its schedule (optim/optimizer_arguments.hpp), logging
// (train/log/logging_arguments.hpp), checkpointing (ckpt/checkpointing_arguments.hpp), spike
// handling, evaluate_gpt's tasks and the server's flags are structs of their own; what is left
// here is the device, the spellings of Megatron-DeepSpeed and the command line. Names, defaults
// and validation rules follow Megatron, so a user's pretrain_gpt.py command line works here
// unchanged, within the features built so far. A Megatron flag that this backend knows but does
// not implement yet is rejected with a message saying so (see kUnsupportedFlags in
// arguments.cpp), never silently ignored.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/ckpt/checkpointing_arguments.hpp"
#include "backend/common/enum_names.hpp"
#include "backend/data/data_arguments.hpp"
#include "backend/data/tokenizer.hpp"
#include "backend/device/device.hpp"
#include "backend/dist/parallelism_arguments.hpp"
#include "backend/eval/task_arguments.hpp"
#include "backend/model/model_arguments.hpp"
#include "backend/optim/mixed_precision_arguments.hpp"
#include "backend/optim/optimizer_arguments.hpp"
#include "backend/train/log/logging_arguments.hpp"
#include "backend/train/run_arguments.hpp"
#include "backend/train/spike_detector.hpp"

namespace backend {

// The program whose command line parse_arguments reads: pretrain_gpt's flags, or evaluate_gpt's
// (the same model, tokenizer, device and --load flags, plus Megatron's tasks/main.py flags
// below; no training schedule or training data is asked for), or text_generation_server's (the
// same, plus the server's flags below: Megatron's tools/run_text_generation_server.py).
enum class ArgumentsProgram { pretrain_gpt, evaluate_gpt, text_generation_server };

// Concerns of their own (their tables in arguments.cpp).

// text_generation_server's only (docs/serving.md).
struct ServingArguments {
  std::string host = "127.0.0.1";        // --host
  int64_t port = 5000;                   // --port (Megatron's default; 0: any free port)
  int64_t max_batch_size = 8;            // --max-batch-size: sequences decoded together
  int64_t max_concurrent_requests = 64;  // --max-concurrent-requests: queued + running
  int64_t max_request_bytes = 16 << 20;  // --max-request-bytes: a request body
  int64_t max_prompt_bytes = 1 << 20;    // --max-prompt-bytes: one prompt
  int64_t max_tokens_to_generate = 4096; // --max-tokens-to-generate: one request's
  int64_t socket_timeout = 10;           // --socket-timeout: seconds a request may take to arrive
};

// --cuda-graph-impl's values, Megatron core's.
enum class CudaGraphImpl { none, local, full_iteration, transformer_engine };
constexpr common::EnumName<CudaGraphImpl> kCudaGraphImplNames[] = {
    {CudaGraphImpl::none, "none"},
    {CudaGraphImpl::local, "local"},
    {CudaGraphImpl::full_iteration, "full_iteration"},
    {CudaGraphImpl::transformer_engine, "transformer_engine"}};
constexpr std::span<const common::EnumName<CudaGraphImpl>> enum_names(CudaGraphImpl) {
  return kCudaGraphImplNames;
}

struct TrainingArguments {
  ArgumentsProgram program = ArgumentsProgram::pretrain_gpt;

  // the model's shape, its Llama switches and recompute (backend/model/model_arguments.hpp)
  ModelArguments model;

  // the tokenizer (backend/data/tokenizer.hpp) and the training data
  // (backend/data/data_arguments.hpp)
  TokenizerOptions tokenizer;
  DataArguments data;

  // the run's batches, length, seed and early exit; when it validates (run_arguments.hpp)
  RunArguments run;
  EvaluationArguments evaluation;

  // the optimizer and its schedule (backend/optim/optimizer_arguments.hpp)
  OptimizerArguments optimizer;

  // the parallel layout (backend/dist/parallelism_arguments.hpp)
  ParallelismArguments parallelism;
  // The interleaved schedule's model chunks per pipeline stage (1 without it).
  int64_t virtual_pipeline_chunks() const {
    return parallelism.virtual_pipeline_chunks(model.num_layers);
  }
  // Megatron-DeepSpeed's --deepspeed --deepspeed_config FILE, as mapped by deepspeed_config.hpp
  // (recorded for the arguments dump; what the file sets is in `parallelism` and elsewhere).
  bool deepspeed = false;
  std::string deepspeed_config;

  // --bf16, --fp16 and loss scaling (backend/optim/mixed_precision_arguments.hpp)
  MixedPrecisionArguments precision;

  DeviceChoice device = DeviceChoice::automatic;  // our extension: --device auto | cpu | cuda
  // Ours: --gemm-autotune times the GEMM algorithms per shape on a GPU (device/gemm_plans.cuh).
  bool gemm_autotune = false;

  // CUDA graphs (Megatron core's cuda_graph_impl; docs/step_on_device.md, item 5): local and
  // full_iteration capture the whole step here. --enable-cuda-graph and --external-cuda-graph
  // are the older spellings of local and transformer_engine, resolved into cuda_graph_impl.
  CudaGraphImpl cuda_graph_impl = CudaGraphImpl::none;
  bool enable_cuda_graph = false;
  bool external_cuda_graph = false;
  int64_t cuda_graph_warmup_steps = 3;

  // the logging flags (backend/train/log/logging_arguments.hpp) and the checkpointing flags
  // (backend/ckpt/checkpointing_arguments.hpp)
  LoggingArguments logging;
  CheckpointingArguments checkpointing;

  // --name-config-keys (ours, pretrain_gpt only): the launcher rendered this command from a
  // NeMo config, so a message that asks for shape flags names the config keys that set them.
  bool name_config_keys = false;

  SpikeHandlingArguments spike;
  TaskArguments tasks;
  ServingArguments serving;

  // The command line as given, for logs and the arguments dump.
  std::vector<std::string> command_line;
};

// Parses argv (argv[0] is the program). On --help prints usage and returns std::nullopt;
// bad or unsupported flags throw common::Error naming the flag. Derived defaults are
// filled in and Megatron's consistency checks applied (validate_arguments).
// `program` says which program's flags: evaluate_gpt adds the task flags, and needs neither
// --train-iters/--train-samples nor --lr nor training data.
std::optional<TrainingArguments> parse_arguments(
    int argc, const char* const* argv,
    ArgumentsProgram program = ArgumentsProgram::pretrain_gpt);

// Megatron's checks (global batch divisible by micro batch × dp, seq ≤ positions, ...).
void validate_arguments(TrainingArguments& arguments);

// Megatron's "------------------------ arguments ------------------------" dump lines.
std::vector<std::string> format_arguments(const TrainingArguments& arguments);

// Every resolved argument by Megatron's name (dest, underscores) with its value as Megatron's
// dump prints it (Python's str(): True/False/None, numbers, plain strings), sorted by name:
// the dump's lines, and what checkpoints store as their record of the arguments.
std::map<std::string, std::string> argument_values(const TrainingArguments& arguments);
// The same values as Megatron's args hold them (flag_table.hpp's flag_row_value: None as null,
// bools, numbers, strings, lists of strings): the args of a --ckpt-format torch save.
nlohmann::json megatron_arguments(const TrainingArguments& arguments);

}  // namespace backend
