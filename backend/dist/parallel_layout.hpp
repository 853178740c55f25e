// The parallel layout of a run: world = tp × pp × dp, as Megatron's
// initialize_model_parallel derives the data-parallel size. A value built once from the
// flags and passed to whatever needs it (Megatron's parallel_state globals are what this
// avoids). The ranks' groups built from it are dist/process_groups.hpp's.
#pragma once

#include <cstdint>

namespace backend {

struct ParallelLayout {
  int64_t world_size = 1;
  int64_t tensor_parallel = 1;
  int64_t pipeline_parallel = 1;
  int64_t data_parallel = 1;
};

// Checks that tp × pp divides the world size and derives dp; common::Error otherwise, naming
// the flags.
ParallelLayout make_parallel_layout(int64_t world_size, int64_t tensor_parallel,
                                    int64_t pipeline_parallel);

}  // namespace backend
