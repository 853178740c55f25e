// ModelParallelism's makers and checks (model_parallelism.hpp).
#include "backend/model/model_parallelism.hpp"

#include <string_view>

#include "backend/common/error.hpp"
#include "backend/common/gpu_capabilities.hpp"

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

void check_mixed_precision_layout(const GptConfig& config, const ModelParallelism& parallelism,
                                  const ModelLayoutSizes& sizes, ElementType parameters,
                                  const Device& device) {
  const std::string_view half = element_name(working_type(config.mixed_precision, parameters));
  const PipelineStage& stage = parallelism.pipeline;
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
  if (!common::gpu_mixed_precision_runs(sizes.tensor_parallel, stage.pipeline_parallel) ||
      parallelism.sharded_data_parallel != nullptr) {
    common::fail(
        "GptModel: {} mixed precision is built for one rank's whole model (data "
        "parallelism included); tensor parallelism ({}), pipeline parallelism ({}) "
        "and ZeRO-3 ({}) with {} are not built yet: train them in fp32",
        half, sizes.tensor_parallel, stage.pipeline_parallel,
        parallelism.sharded_data_parallel != nullptr ? "on" : "off", half);
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
    check_mixed_precision_layout(config, parallelism, sizes, parameters, device);
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
