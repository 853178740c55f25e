// Loading a trained model for evaluation or serving (trained_model.hpp).
#include "backend/train/trained_model.hpp"

#include <fmt/format.h>

#include <iostream>

#include "backend/common/error.hpp"
#include "backend/common/memory_estimate.hpp"
#include "backend/dist/process_environment.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/checkpoint_arguments.hpp"

namespace backend {

void check_whole_model_launch(const TrainingArguments& arguments, std::string_view tool) {
  const ProcessEnvironment process = read_process_environment();
  if (started_through_mpi(process) && process.world_size > 1) {
    common::fail("{} runs as one process; it was started as {} (rank {} of {}): run it without "
                 "mpirun/srun", tool, process.launcher, process.rank, process.world_size);
  }
  if (arguments.parallelism.tensor_model_parallel_size > 1 ||
      arguments.parallelism.pipeline_model_parallel_size > 1) {
    common::fail(
        "{} runs the whole model in one process: --tensor-model-parallel-size {} and "
        "--pipeline-model-parallel-size {} must be 1 (reshard a model-parallel "
        "checkpoint first: checkpoint_util --load DIR --save NEWDIR "
        "--target-tensor-parallel-size 1 --target-pipeline-parallel-size 1)",
        tool, arguments.parallelism.tensor_model_parallel_size,
        arguments.parallelism.pipeline_model_parallel_size);
  }
  if (arguments.checkpointing.load.empty()) {
    common::fail("{} needs --load DIR: the checkpoint (pretrain_gpt's --save directory) whose "
                 "model to run", tool);
  }
}

GptModel<float> load_trained_model(const TrainingArguments& arguments,
                                   const SelectedDevice& selected, std::string_view tool) {
  // Before the model is built.
  require_checkpoint(arguments.checkpointing.load, "--load",
                     "running untrained weights means nothing; point --load at pretrain_gpt's "
                     "--save directory");
  GptConfig config = model_config(arguments);
  config.inference_only = true;  // forwards only: no gradient buffer
  // Before anything is allocated: the fp32 weights, against the GPU's or this machine's
  // memory. The activations come on top.
  common::MemoryEstimate estimate;
  estimate.parameters = common::parameter_count(model_shape(config));
  estimate.weights_bytes = 4 * estimate.parameters;
  const common::AvailableMemory available =
      selected.gpu ? common::AvailableMemory{static_cast<double>(selected.gpu->total_memory_bytes),
                                             fmt::format("the memory of GPU {} ({})",
                                                         selected.gpu->index, selected.gpu->name)}
                   : common::available_memory();
  common::require_memory_fits(estimate, available, fmt::format("{}: the model", tool),
                              "Run a smaller model, or on a machine with more memory.");
  GptModel<float> model(config, *selected.device);
  // Weights only, as --no-load-optim --no-load-rng (not --finetune, so that the load message
  // names the checkpoint's iteration as Megatron's does); the optimizer and scheduler are
  // placeholders that load_checkpoint then leaves alone.
  CheckpointLoadOptions weights_only = checkpoint_load_options(arguments);
  weights_only.no_load_optim = true;
  weights_only.no_load_rng = true;
  AdamW optimizer(AdamWConfig{}, {}, 0);
  LearningRateScheduler scheduler(LearningRateSchedule{.max_lr = 0, .decay_steps = 1});
  if (!load_checkpoint(weights_only, model, optimizer, scheduler, std::cout)) {
    common::fail("--load {}: {} disappeared while the checkpoint was loaded",
                 arguments.checkpointing.load,
                 checkpoint_tracker_path(arguments.checkpointing.load).string());
  }
  model.set_training(false);
  return model;
}

}  // namespace backend
