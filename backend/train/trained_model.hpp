// A trained model for the tools that run one (evaluate_gpt, text_generation_server): the model
// pretrain_gpt's flags describe, whole in one process, with the weights of the checkpoint --load
// names (weights only, as Megatron's load_checkpoint(model, None, None) in its tasks/ and
// tools/run_text_generation_server.py), in evaluation mode.
#pragma once

#include <string_view>

#include "backend/model/gpt_model.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trainer.hpp"

namespace backend {

// What such a tool needs of its launch: one process (not several through mpirun/srun), no
// tensor or pipeline parallelism, and --load. common::Error naming `tool` and the fix otherwise.
void check_whole_model_launch(const TrainingArguments& arguments, std::string_view tool);

// The model on the device `selected` names, after checking that its weights fit there, with the
// checkpoint's weights, in evaluation mode (no dropout). common::Error when --load holds no
// checkpoint (untrained weights mean nothing to evaluate or serve) or the checkpoint does not
// match the flags.
GptModel<float> load_trained_model(const TrainingArguments& arguments,
                                   const SelectedDevice& selected, std::string_view tool);

}  // namespace backend
