// Checks on the training config before anything is queued: what Megatron would assert only
// after the job waited for its nodes. All problems are collected and refused at once.
//   - every value mapped to a flag passes the backend's rule for it (training_value_problems);
//     when one does not, the rest is not computed from it
//   - tp × pp divides the GPU count (num_nodes × devices); dp = GPUs / (tp × pp)
//   - attention heads divisible by tp; layers divisible by pp
//   - with model.virtual_pipeline_model_parallel_size V ≥ 2 (Megatron's interleaved schedule):
//     pp > 2 (pp > 1 with model.overlap_p2p_comm true), layers divisible by pp × V, micro
//     batches per step divisible by pp, and not overlap_p2p_comm with batch_p2p_comm (whose
//     default is true), which Megatron core's interleaved schedule refuses
//   - global batch divisible by micro batch × dp
//   - sequence length ≤ max position embeddings
//   - a split with a non-empty validation share when validation runs (limit_val_batches > 0)
//     — Megatron's bare `assert num_samples > 0` otherwise; the test share may be 0, as
//     pretrain_gpt then skips the test pass as Megatron does
//   - on a Slurm cluster whose jobs get GPUs, more tasks per node (trainer.devices) than
//     cluster.gpus_per_node, whose ranks would share GPUs, which NCCL refuses: `unsupported`,
//     refused, or warned about on a dry run, which renders the scripts to be read; fewer tasks
//     than GPUs per node is a warning (GPUs idle). (16-bit mixed precision runs in every
//     layout, so no precision is refused here.)
//   - per-GPU memory estimate (weights, gradients, optimizer states, activations) against
//     cluster.gpu_memory_gb when the cluster config gives it, with the vocabulary of the
//     tokenizer's files when the launcher can read them (model.tokenizer.model, or a Hugging
//     Face directory), else model.tokenizer.vocab_size
// Products of sizes are overflow-checked (a layout too big to count is a problem, not a wrapped
// number). The memory model is backend/common/memory_estimate.hpp's, the one pretrain_gpt
// checks against the machine's memory too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/memory_estimate.hpp"
#include "launcher/config/node.hpp"

namespace launcher {

using MemoryEstimate = common::MemoryEstimate;

struct PreflightReport {
  int64_t gpus = 1;
  int64_t nodes = 1, gpus_per_node = 1;  // trainer.num_nodes and trainer.devices
  int64_t tensor_parallel = 1, pipeline_parallel = 1, data_parallel = 1;
  int64_t virtual_pipeline = 1;  // model chunks per pipeline stage (> 1: interleaved schedule)
  double parameters = 0;  // whole model
  MemoryEstimate memory;   // per GPU, the most loaded pipeline stage
  std::string precision;
  bool distributed_optimizer = false;
  std::string recompute;   // none | selective | full
  // The tokenizer's vocabulary the estimate counts, where that number comes from (the
  // tokenizer's files when the launcher can read them, else the config's vocab_size or GPT-2's),
  // and the padded vocabulary (a multiple of make_vocab_size_divisible_by × tp).
  int64_t vocabulary = 0, padded_vocabulary = 0;
  std::string vocabulary_source;
  double gpu_memory_bytes = 0;  // 0: not given by the cluster config
  // Keys with an effect in NeMo and none here (not strict), and layouts that run but waste
  // GPUs or may not run on this machine (above).
  std::vector<std::string> warnings;
  std::vector<std::string> problems;
  // What the backend cannot run on this cluster's GPUs yet (above): refused like problems,
  // except on a dry run.
  std::vector<std::string> unsupported;
};

// Reads `training` (and `cluster` for gpu_memory_gb and the GPU request) from a resolved config,
// for the cluster `cluster_type` names (bcm, pbs, k8s or local: the launch's resolved type).
PreflightReport training_preflight(const Node& config, std::string_view cluster_type);

// The memory table and the layout line, for the log.
std::vector<std::string> format_preflight(const PreflightReport& report);

// Logs the table and throws common::Error listing every problem, and every unsupported layout
// unless `dry_run` (then each is a warning saying the launch would refuse it).
void enforce_training_preflight(const Node& config, std::string_view cluster_type, bool dry_run);

}  // namespace launcher
