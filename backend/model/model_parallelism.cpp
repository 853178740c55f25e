// ModelParallelism's makers and checks (model_parallelism.hpp).
#include "backend/model/model_parallelism.hpp"

#include <string_view>

#include "backend/common/error.hpp"

namespace backend {

ModelParallelism tensor_parallelism(Communicator& group, bool sequence_parallel) {
  ModelParallelism parallelism;
  parallelism.tensor_parallel = &group;
  parallelism.sequence_parallel = sequence_parallel;
  return parallelism;
}

bool holds_tied_embedding(const GptConfig& config, const PipelineStage& stage) {
  return !stage.whole_model() && config.share_embeddings_and_output_weights &&
         (stage.first() || stage.last());
}

namespace {

// Mixed precision runs in every layout (tensor, sequence and pipeline parallelism, ZeRO-1 and
// ZeRO-3): what it needs is fp32 master weights and a device with 16-bit ops.
void check_mixed_precision(const GptConfig& config, ElementType parameters, const Device& device) {
  const std::string_view half = element_name(working_type(config.mixed_precision, parameters));
  if (parameters != ElementType::f32) {
    common::fail(
        "GptModel: {} mixed precision keeps fp32 master weights; a model of {} "
        "parameters cannot use it",
        half, element_name(parameters));
  }
  if (device.memory_kind() != MemoryKind::cuda) {
    common::fail(
        "GptModel: {} activations need a device with {} ops (--device cuda); {} "
        "computes in fp32 or fp64",
        half, half, device.name());
  }
}

}  // namespace

void check_model_parallelism(const GptConfig& config, const ModelParallelism& parallelism,
                             const ModelLayoutSizes& sizes, ElementType parameters,
                             const Device& device) {
  const PipelineStage& stage = parallelism.pipeline;
  if (sizes.pipeline_group != stage.pipeline_parallel) {
    common::fail("GptModel: a pipeline of {} stages over a pipeline group of {} ranks",
                 stage.pipeline_parallel, sizes.pipeline_group);
  }
  if (holds_tied_embedding(config, stage) && parallelism.embedding == nullptr) {
    common::fail(
        "GptModel: pipeline stage {} of {} holds a tied word embedding but no "
        "embedding group was given to keep it equal to its copy",
        stage.rank, stage.pipeline_parallel);
  }
  if (config.mixed_precision != MixedPrecision::none) {
    check_mixed_precision(config, parameters, device);
  }
  if (parallelism.sharded_data_parallel != nullptr &&
      (sizes.tensor_parallel > 1 || !stage.whole_model())) {
    common::fail(
        "ZeRO stage 3 with tensor or pipeline parallelism is not built yet "
        "(--tensor-model-parallel-size {}, --pipeline-model-parallel-size {}); use "
        "both 1, or ZeRO stage 1 or 2 (--use-distributed-optimizer)",
        sizes.tensor_parallel, stage.pipeline_parallel);
  }
}

}  // namespace backend
