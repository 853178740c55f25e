// Megatron core's torch_dist checkpoints written (--ckpt-format torch_dist), the inverse of
// megatron_dist_checkpoint.hpp: into one iteration directory,
//   __<writer>_0.distcp   by each (tensor-parallel rank, pipeline stage) of data-parallel rank 0,
//                         its chunks of every tensor it holds (torch_distributed_checkpoint_
//                         writer.hpp): the layers stacked under decoder.layers.<name> (Megatron
//                         core's default, homogeneous layers) at offset (layer, ...), each
//                         tensor-parallel shard at its offset on the partitioned axis, SwiGLU's
//                         fc1 as its gate and up halves (apply_swiglu_sharded_factory's
//                         offsets: rank t and tp + t of 2 tp), a replicated tensor by tensor-
//                         parallel rank 0 only, the last stage's tied copy of the embedding not
//                         at all (a replica); the model in bf16/fp16 under --bf16/--fp16, as
//                         Megatron's Float16Module holds it; with the optimizer's state,
//                         optimizer.state.exp_avg.<key> and optimizer.state.exp_avg_sq.<key>
//                         and, for a 16-bit model, optimizer.state.fp32_param.<key> (fp32), as
//                         Megatron's non-distributed optimizer shards them
//                         (optim_state_to_sharding_state)
//   common.pt             by the lead: megatron_checkpoint_writer.hpp's write_megatron_common_file
//   metadata.json         {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
//                         "common_backend": "torch", "common_backend_version": 1}
//   .metadata             by the lead, from every writer's items (each writer leaves them in
//                         .items_<writer>.json beside its file; the lead removes those)
// The names are --transformer-impl's spec (megatron_checkpoint_writer.hpp). The distributed
// optimizer's own torch_dist forms (dp_reshardable, fully_sharded_model_space with flattened
// ranges) are not written: its moments are gathered and written in the non-distributed form.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>

#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/ckpt/checkpointing_arguments.hpp"
#include "backend/ckpt/megatron_checkpoint_writer.hpp"
#include "backend/model/parameter_layout.hpp"

namespace backend {

// What one writer holds: the metadata of the save (its "optimizer" says whether the moments
// are in `tensors`), the tensors by this backend's names (the fp32 parameters, then with the
// optimizer's state optimizer.exp_avg.NAME and optimizer.exp_avg_sq.NAME), and its place.
struct MegatronDistPart {
  const nlohmann::json* metadata = nullptr;
  std::span<const CheckpointTensor> tensors;
  std::span<const ParameterTensor> layout;  // this rank's (GptModel::tensors())
  int64_t num_layers = 0;
  int64_t tensor_parallel_rank = 0;
  MixedPrecision precision = MixedPrecision::none;
  MegatronModuleSpec spec = MegatronModuleSpec::transformer_engine;
};

// Writes writer `writer`'s file and its list of items into `directory`.
void write_megatron_dist_part(const std::filesystem::path& directory, int64_t writer,
                              const MegatronDistPart& part);

// The lead's part, once the `writers` writers have written theirs: common.pt of `common`,
// metadata.json and .metadata; the item lists removed.
void finish_megatron_dist_checkpoint(const std::filesystem::path& directory, int64_t writers,
                                     const MegatronRankFileContents& common);

}  // namespace backend
