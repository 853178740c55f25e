// Megatron core's torch_dist checkpoints (--ckpt-format torch_dist, Megatron-LM's default since
// 2024; megatron/core/dist_checkpointing: serialization.py, strategies/torch.py,
// strategies/common.py), read without running any of their code:
//   DIR/latest_checkpointed_iteration.txt   the tracker, as for --ckpt-format torch
//   DIR/iter_0000500/metadata.json          {"sharded_backend": "torch_dist", ...}
//   DIR/iter_0000500/common.pt              torch.save of what is not sharded: 'args',
//                                           'iteration', 'checkpoint_version', 'optimizer'
//                                           (torch's param groups, the step), 'opt_param_scheduler'
//   DIR/iter_0000500/.metadata, __*_*.distcp   one PyTorch distributed checkpoint
//                                           (torch_distributed_checkpoint.hpp) of every rank's
//                                           shards, each tensor at its global shape
// The tensors are Megatron core's sharded keys (sharded_state_dict): the model's names of core's
// local or Transformer Engine spec (megatron_checkpoint.hpp), each layer's tensor either stacked
// under decoder.layers.<name> on a first axis of --num-layers (TransformerBlock's default) or
// kept per layer as decoder.layers.<global index>.<name> (non-homogeneous layers); the global
// tensors hold the whole model's layout (the fused QKV per query group, SwiGLU's fc1 as every
// gate row then every up row, the vocabulary tables at the saved padded size); with tied
// embeddings the output layer is the word embedding's replica and not stored. The optimizer's
// state, with Megatron's non-distributed optimizer or the distributed optimizer's
// fully_sharded_model_space form, is optimizer.state.{exp_avg,exp_avg_sq}.<key> and, for a bf16
// or fp16 run, optimizer.state.fp32_param.<key> (the main weights), each at its parameter's
// global shape. Other optimizer layouts (optimizer.distributed.*: dp_zero_gather_scatter,
// dp_reshardable) are not read: the checkpoint then loads as weights only, saying why.
//
// Since every tensor is stored whole, a torch_dist checkpoint is read at any tensor- and
// pipeline-parallel layout, as Megatron's dist-checkpoint load reshards (ShardFile views of one
// rank each, reading the layout's shard_boxes); the padded vocabulary stays the saved one, so a
// layout must divide it. The RNG state (the rng_state objects) does not map to this backend's.
// Megatron core 0.15's common_state object in place of common.pt, and the zarr backend, are
// refused by name.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "backend/ckpt/megatron_checkpoint.hpp"
#include "backend/ckpt/shard_file.hpp"
#include "backend/model/pipeline_stage.hpp"

namespace backend {

inline constexpr const char* kMegatronDistConfigFile = "metadata.json";
inline constexpr const char* kMegatronCommonFile = "common.pt";

// Whether `iteration_directory` holds a distributed checkpoint (its metadata.json).
bool is_megatron_dist_directory(const std::filesystem::path& iteration_directory);

// The layout of the torch_dist checkpoint in `layout.iteration_directory` (its parallel sizes,
// from common.pt's args), filled into `layout`. Refused: a metadata.json of another backend or
// unreadable, no common.pt.
void read_megatron_dist_layout(MegatronCheckpointLayout& layout);

// The checkpoint read as `tensor_parallel` ranks × `stage.pipeline_parallel` stages would hold
// it: the ShardFile of tensor-parallel rank `rank` of `stage`, whose metadata records that
// layout. Refused, naming the file: what megatron_model_record refuses, a tensor neither of
// core's namings has or of another shape than the model its args describe, a layout that does
// not divide the model or the padded vocabulary.
std::unique_ptr<ShardFile> open_megatron_dist_shard_file(const MegatronCheckpointLayout& layout,
                                                         int64_t tensor_parallel, int64_t rank,
                                                         const PipelineStage& stage);

// The same at the layout the checkpoint was saved with, as open_megatron_shard_file gives a
// legacy checkpoint's file.
std::unique_ptr<ShardFile> open_megatron_dist_saved_shard_file(
    const MegatronCheckpointLayout& layout, int64_t tensor_parallel_rank, int64_t pipeline_rank);

// Every (rank, stage) at the layout the checkpoint was saved with, as open_megatron_shards
// gives a legacy checkpoint's.
MegatronShards open_megatron_dist_shards(const MegatronCheckpointLayout& layout);

}  // namespace backend
