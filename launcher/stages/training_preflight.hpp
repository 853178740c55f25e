// Checks on the training config before anything is queued: what Megatron would assert only
// after the job waited for its nodes. All problems are collected and refused at once.
//   - tp × pp divides the GPU count (num_nodes × devices); dp = GPUs / (tp × pp)
//   - attention heads divisible by tp; layers divisible by pp
//   - global batch divisible by micro batch × dp
//   - sequence length ≤ max position embeddings
//   - a split string Megatron can parse, with a non-empty validation share when validation
//     runs (limit_val_batches > 0) — Megatron's bare `assert num_samples > 0` otherwise
//   - per-GPU memory estimate (weights, gradients, optimizer states, activations) against
//     cluster.gpu_memory_gb when the cluster config gives it
// The memory model: Megatron's mixed-precision bookkeeping (bf16/fp16 weights 2 B, fp32 main
// gradients 4 B, fp32 master weights + Adam moments 12 B, divided by dp with the distributed
// optimizer; fp32 training: 4 + 4 + 8 B) and activations per layer from Korthikanti et al.
// 2022 ("Reducing Activation Recomputation in Large Transformer Models", Table 2):
// s·b·h·(10 + 24/t) + 5·a·s²·b/t bytes without recompute (16-bit activations; doubled for
// fp32), 2·s·b·h per layer with full recompute plus one layer's worth; the first pipeline
// stage holds pp micro batches of L/pp layers (1F1B), i.e. L layers' worth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launcher/config/node.hpp"

namespace launcher {

struct MemoryEstimate {
  double weights_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;
  double total_bytes() const {
    return weights_bytes + gradients_bytes + optimizer_bytes + activations_bytes;
  }
};

struct PreflightReport {
  int64_t gpus = 1;
  int64_t tensor_parallel = 1, pipeline_parallel = 1, data_parallel = 1;
  int64_t parameters = 0;  // whole model
  MemoryEstimate memory;   // per GPU, the most loaded pipeline stage
  std::string precision;
  bool distributed_optimizer = false;
  std::string recompute;   // none | selective | full
  double gpu_memory_bytes = 0;  // 0: not given by the cluster config
  std::vector<std::string> problems;
};

// Reads `training` (and `cluster` for gpu_memory_gb) from a resolved config.
PreflightReport training_preflight(const Node& config);

// The memory table and the layout line, for the log.
std::vector<std::string> format_preflight(const PreflightReport& report);

// Logs the table and throws common::Error listing every problem, if any.
void enforce_training_preflight(const Node& config);

}  // namespace launcher
