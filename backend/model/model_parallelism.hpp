// The model-parallel part of one rank's layout as GptModel takes it (Megatron core's
// ProcessGroupCollection, narrowed to what a model computes with), and the layouts the model
// refuses by name before any memory is carved.
#pragma once

#include <cstdint>

#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"
#include "backend/dist/communicator.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/model/pipeline_stage.hpp"

namespace backend {

// The model-parallel part of a rank's layout: its tensor-parallel group (nullptr: a group of
// one), --sequence-parallel, its pipeline stage and pipeline group (nullptr: a group of one; the
// schedule's transfers go through it), and the embedding group (the first and last stages'
// ranks of its pipeline, which keep a tied word embedding equal; needed on those stages when
// pipelined with tied embeddings). The groups must outlive the model.
//
// ZeRO-3 (DeepSpeed's stage 3; Rajbhandari et al. 2020): `sharded_data_parallel`, the
// data-parallel group over which the parameters and gradients are sharded: each rank holds a
// contiguous range of the flat buffers (shard_range, as the distributed optimizer's), gathers a
// unit (the embedding, a layer, the head) whole into a working slot when it is used, and sums a
// unit's gradients over the group into its range when the unit's backward is done. Without
// tensor or pipeline parallelism (refused otherwise).
struct ModelParallelism {
  Communicator* tensor_parallel = nullptr;
  bool sequence_parallel = false;
  PipelineStage pipeline;
  Communicator* pipeline_parallel = nullptr;
  Communicator* embedding = nullptr;
  Communicator* sharded_data_parallel = nullptr;
};

// A tensor-parallel group (and --sequence-parallel) alone.
ModelParallelism tensor_parallelism(Communicator& group, bool sequence_parallel);

// Whether `stage` holds one of the two copies of a tied word embedding that the embedding group
// keeps equal: the first stage's original or the last stage's copy (pipeline_stage.hpp).
bool holds_tied_embedding(const GptConfig& config, const PipelineStage& stage);

// The sizes of the groups the model was given (a missing group is one of one rank).
struct ModelLayoutSizes {
  int64_t tensor_parallel = 1;  // the tensor-parallel group's size
  int64_t pipeline_group = 1;   // the pipeline group's size
};

// The layouts GptModel refuses, by name: a pipeline group that is not the stage's pipeline, a
// tied embedding's stage without an embedding group, ZeRO-3 with tensor or pipeline
// parallelism, and mixed precision (--bf16, --fp16) anywhere but GptModel<float> on a device
// with bf16 and fp16 ops (rather than computing in fp32 behind the user's back); in every
// layout it runs.
void check_model_parallelism(const GptConfig& config, const ModelParallelism& parallelism,
                             const ModelLayoutSizes& sizes, ElementType parameters,
                             const Device& device);

}  // namespace backend
