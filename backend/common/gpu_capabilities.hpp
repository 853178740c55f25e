// What pretrain_gpt's CUDA path trains so far, stated once: the model's check
// (backend/model/model_parallelism.cpp) refuses the rest when a job starts, and the launcher's
// preflight (launcher/stages/training_preflight.cpp) refuses it before the job queues, each in
// its own words (flags or config keys). docs/parallelism.md, "Collectives and memory", and
// docs/device.md say what runs.
#pragma once

#include <cstdint>

namespace common {

// 16-bit mixed precision (--bf16, --fp16) runs one rank's whole model: data parallelism and the
// distributed optimizer, not yet tensor or pipeline parallelism (issue 40, item 3). (ZeRO-3 in
// 16 bits falls back to fp32 with a warning rather than being refused.)
constexpr bool gpu_mixed_precision_runs(int64_t tensor_parallel, int64_t pipeline_parallel) {
  return tensor_parallel == 1 && pipeline_parallel == 1;
}

}  // namespace common
