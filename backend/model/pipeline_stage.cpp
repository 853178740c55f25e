// The layer assignment of pipeline_stage.hpp (Megatron core's get_transformer_layer_offset).
#include "backend/model/pipeline_stage.hpp"

#include "backend/common/error.hpp"

namespace backend {

void check_pipeline_stage(int64_t num_layers, const PipelineStage& stage) {
  const int64_t pp = stage.pipeline_parallel;
  if (pp < 1) common::fail("--pipeline-model-parallel-size must be at least 1, got {}", pp);
  if (stage.rank < 0 || stage.rank >= pp) {
    common::fail("pipeline-parallel rank {} is outside [0, {})", stage.rank, pp);
  }
  if (stage.virtual_chunks < 1) {
    common::fail("the virtual pipeline size must be at least 1, got {}", stage.virtual_chunks);
  }
  if (num_layers % pp != 0) {
    common::fail("--num-layers {} must be divisible by --pipeline-model-parallel-size {} (every "
                 "stage holds the same number of layers), e.g. --num-layers {}",
                 num_layers, pp, (num_layers / pp + 1) * pp);
  }
  const int64_t per_stage = num_layers / pp;
  if (per_stage % stage.virtual_chunks != 0) {
    common::fail("the {} layers per pipeline stage (--num-layers {} / --pipeline-model-parallel-"
                 "size {}) must be divisible by the {} model chunks per stage; choose "
                 "--num-layers-per-virtual-pipeline-stage dividing {}",
                 per_stage, num_layers, pp, stage.virtual_chunks, per_stage);
  }
}

std::vector<LayerRange> stage_layer_chunks(int64_t num_layers, const PipelineStage& stage) {
  check_pipeline_stage(num_layers, stage);
  const int64_t vp = stage.virtual_chunks;
  const int64_t per_chunk = num_layers / (stage.pipeline_parallel * vp);
  std::vector<LayerRange> chunks;
  for (int64_t c = 0; c < vp; ++c) {
    const int64_t begin = c * (num_layers / vp) + stage.rank * per_chunk;
    chunks.push_back({begin, begin + per_chunk});
  }
  return chunks;
}

}  // namespace backend
