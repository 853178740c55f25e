// The parallel layout's flags as one value: Megatron-LM's distributed arguments
// (megatron/training/arguments.py: _add_distributed_args) under its dest names, with the world
// size the launcher started and Megatron-DeepSpeed's ZeRO settings (backend/train/
// deepspeed_config.hpp maps its configuration file onto them). pretrain_gpt's parser fills it
// from kParallelismFlags (backend/train/arguments.cpp); parallel_layout() derives the layout
// the process groups are built from (parallel_layout.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>

#include "backend/common/enum_names.hpp"
#include "backend/dist/parallel_layout.hpp"

namespace backend {

// Megatron's --distributed-backend: the collectives' library (device_collectives.hpp): gloo
// stages them through host memory over Open MPI; nccl is Open MPI on CPU ranks (and, on GPU
// ranks, NCCL once built).
enum class DistributedBackend { nccl, gloo };
constexpr common::EnumName<DistributedBackend> kDistributedBackendNames[] = {
    {DistributedBackend::nccl, "nccl"}, {DistributedBackend::gloo, "gloo"}};
constexpr std::span<const common::EnumName<DistributedBackend>> enum_names(DistributedBackend) {
  return kDistributedBackendNames;
}

// Older Megatron's --DDP-impl: its own data-parallel wrapper or PyTorch's. Recorded: gradients are
// summed after the backward either way.
enum class DdpImplementation { local, torch };
constexpr common::EnumName<DdpImplementation> kDdpImplementationNames[] = {
    {DdpImplementation::local, "local"}, {DdpImplementation::torch, "torch"}};
constexpr std::span<const common::EnumName<DdpImplementation>> enum_names(DdpImplementation) {
  return kDdpImplementationNames;
}

struct ParallelismArguments {
  // Not a flag: the processes the launcher started (Megatron reads WORLD_SIZE in validate_args;
  // parse_arguments reads the launcher's environment, process_environment.hpp).
  int64_t world_size = 1;
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  // --num-layers-per-virtual-pipeline-stage (0: not given): the interleaved schedule's model
  // chunks per stage are num_layers / pp / this (virtual_pipeline_chunks below).
  int64_t num_layers_per_virtual_pipeline_stage = 0;
  // How long one collective may wait for the other ranks before this rank ends the job
  // (backend/dist/collective_watchdog.hpp). Megatron's is an int; fractions are our extension.
  double distributed_timeout_minutes = 10;
  bool use_distributed_optimizer = false;  // ZeRO-1 over the data-parallel group
  bool sequence_parallel = false;          // the residual stream sharded over the TP group
  // Megatron's --overlap-grad-reduce: each bucket's data-parallel all-reduce (or, with the
  // distributed optimizer, reduce-scatter) starts as soon as the last micro batch's backward
  // has finished its units. --overlap-param-gather (distributed optimizer only): the updated
  // shards return in buckets the next forward waits for unit by unit (Megatron also requires
  // --overlap-grad-reduce with it; here the two are independent).
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  // The interleaved schedule's p2p overlap (pipeline_schedule.hpp): on by default, as in
  // Megatron-LM since 2023-10; --no-overlap-p2p-communication (Megatron's flag now) turns it
  // off; --overlap-p2p-communication (its flag before, off by default then) is accepted. Megatron
  // ignores the overlap without interleaving, and so does overlap_p2p_communication().
  bool overlap_p2p_communication_flag = false;     // --overlap-p2p-communication
  bool no_overlap_p2p_communication_flag = false;  // --no-overlap-p2p-communication
  // Megatron's --ddp-bucket-size: elements per bucket of either overlap; not given (None):
  // max(40M, 1M × data-parallel size) (backend/train/buffer_buckets.hpp).
  std::optional<int64_t> ddp_bucket_size;
  // Megatron core's --grad-reduce-in-bf16: with --bf16 on the CUDA device the data-parallel
  // gradient sums move bf16 (backend/model/bf16_gradient_reduction.hpp); the gradients still
  // accumulate in fp32.
  bool grad_reduce_in_bf16 = false;
  // Megatron-DeepSpeed's --zero-stage (or its configuration file's). 3: parameters and
  // gradients sharded over the data-parallel group too (GptModel's sharded_over_data_parallel).
  // The offloads (DeepSpeed's offload_optimizer / cpu_offload and offload_param to "cpu"): the
  // optimizer's state and the parameter shard in host memory, which on CPU ranks is where they
  // are already.
  int64_t zero_stage = 0;
  bool offload_optimizer = false;
  bool offload_parameters = false;
  DistributedBackend distributed_backend = DistributedBackend::nccl;
  DdpImplementation ddp_impl = DdpImplementation::local;              // --DDP-impl (recorded)

  // The data-parallel size the arguments dump records: world size / (tp × pp), rounded down
  // (the dump does not check that tp × pp divides the world; parallel_layout() does).
  int64_t data_parallel_size() const {
    return world_size /
           std::max<int64_t>(1, tensor_model_parallel_size * pipeline_model_parallel_size);
  }
  // The interleaved schedule's model chunks per pipeline stage for a model of `num_layers`:
  // Whether the interleaved schedule overlaps its transfers: interleaving and not
  // --no-overlap-p2p-communication.
  bool overlap_p2p_communication() const {
    return num_layers_per_virtual_pipeline_stage != 0 && !no_overlap_p2p_communication_flag;
  }
  // num_layers / pp / --num-layers-per-virtual-pipeline-stage, 1 without it.
  int64_t virtual_pipeline_chunks(int64_t num_layers) const {
    return num_layers_per_virtual_pipeline_stage == 0
               ? 1
               : num_layers / pipeline_model_parallel_size / num_layers_per_virtual_pipeline_stage;
  }
};

// The layout the flags give (make_parallel_layout: tp × pp must divide the world size).
inline ParallelLayout parallel_layout(const ParallelismArguments& parallelism) {
  return make_parallel_layout(parallelism.world_size, parallelism.tensor_model_parallel_size,
                              parallelism.pipeline_model_parallel_size);
}

}  // namespace backend
