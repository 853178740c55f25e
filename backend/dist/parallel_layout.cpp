// world = tp × pp × dp; see parallel_layout.hpp.
#include "backend/dist/parallel_layout.hpp"

#include "backend/common/error.hpp"

namespace backend {

ParallelLayout make_parallel_layout(int64_t world_size, int64_t tensor_parallel,
                                    int64_t pipeline_parallel) {
  if (world_size < 1) common::fail("world size must be ≥ 1, got {}", world_size);
  if (tensor_parallel < 1) {
    common::fail("--tensor-model-parallel-size must be ≥ 1, got {}", tensor_parallel);
  }
  if (pipeline_parallel < 1) {
    common::fail("--pipeline-model-parallel-size must be ≥ 1, got {}", pipeline_parallel);
  }
  if (world_size % (tensor_parallel * pipeline_parallel) != 0) {
    common::fail("world size {} is not divisible by --tensor-model-parallel-size {} × "
                 "--pipeline-model-parallel-size {}",
                 world_size, tensor_parallel, pipeline_parallel);
  }
  return {world_size, tensor_parallel, pipeline_parallel,
          world_size / (tensor_parallel * pipeline_parallel)};
}

}  // namespace backend
