// Megatron-DeepSpeed's --deepspeed --deepspeed_config FILE [--zero-stage N]: DeepSpeed's JSON
// configuration (https://www.deepspeed.ai/docs/config-json/), mapped onto what this backend
// builds, so the published Megatron-DeepSpeed scripts run unchanged:
//   zero_optimization.stage 0          no sharding
//   zero_optimization.stage 1 or 2     --use-distributed-optimizer (Megatron's distributed
//                                      optimizer: gradients reduce-scattered, fp32 state sharded)
//   zero_optimization.stage 3          parameters and gradients sharded over the data-parallel
//                                      ranks too (GptModel's ZeRO-3), without tensor or pipeline
//                                      parallelism, on CPU ranks
//   cpu_offload, offload_optimizer / offload_param {device: "cpu"}
//                                      accepted (offload_param with stage 3 only): on CPU ranks
//                                      the state is in host memory already; "nvme" is refused
//   fp16 {enabled, loss_scale (0: dynamic), initial_scale_power, loss_scale_window, hysteresis,
//        min_loss_scale}               --fp16 --loss-scale / --initial-loss-scale 2^power /
//                                      --loss-scale-window / --hysteresis / --min-loss-scale
//   bf16 (or bfloat16) {enabled}       --bf16
//   train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps
//                                      must agree with --global-batch-size, --micro-batch-size
//                                      and the data-parallel size (DeepSpeed's own check), or
//                                      supply them when the flags are absent
//   gradient_clipping                  --clip-grad (an explicit --clip-grad must agree)
//   zero_optimization.overlap_comm true with stage 1 or 2, and reduce_bucket_size (DeepSpeed's
//   default 5e8 elements)              --overlap-grad-reduce --ddp-bucket-size N (an explicit
//                                      --ddp-bucket-size must agree)
//   the other zero_optimization bucket sizes and switches (stage 3's overlap), steps_per_print,
//   wall_clock_breakdown, zero_allow_untested_optimizer, curriculum_learning {enabled: false}
//                                      accepted: they change speed or logging, not the result
// Every other key (an "optimizer" or "scheduler" section, activation_checkpointing, ...) is
// refused naming it, so nothing in a user's file is silently ignored.
#pragma once

#include <cstdint>
#include <optional>

#include "backend/train/arguments.hpp"

namespace backend {

// What the command line said, besides the fields of `arguments`, that the mapping needs.
struct DeepSpeedFlags {
  bool deepspeed = false;                // --deepspeed
  std::string config_file;               // --deepspeed_config
  std::optional<int64_t> zero_stage;     // --zero-stage
  bool clip_grad_given = false;          // --clip-grad was on the command line
  bool global_batch_size_given = false;  // --global-batch-size was
  bool micro_batch_size_given = false;   // --micro-batch-size was
};

// Reads the configuration and applies it to `arguments` (before validate_arguments; the world
// size is set). common::Error naming the file and key for anything invalid or not built.
void apply_deepspeed_config(const DeepSpeedFlags& flags, TrainingArguments& arguments);

}  // namespace backend
