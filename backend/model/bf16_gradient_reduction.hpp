// Megatron core's --grad-reduce-in-bf16 for the data-parallel gradient sums: a communicator
// over a data-parallel group whose sums of fp32 views go through bf16. Each fp32 view summed
// (all_reduce, reduce_scatter and their started forms) is rounded to bf16 (ops::convert, to
// nearest even) into a scratch buffer, summed over the group in bf16 (NCCL adds bf16; Open MPI sums
// 16-bit floats in fp32 and rounds once: mpi_session_mpi.cpp), and widened back into the fp32
// view (exact). Half the bytes of the fp32 reduction cross the network. Every other call, and
// sums of other element types (host scalars in fp64, ZeRO-3's bf16 parameter gathers), pass
// through unchanged.
//
// Megatron keeps the gradient buffer itself in bf16 under this flag (its micro batches
// accumulate in bf16); here the gradients accumulate in fp32 as in every precision and only
// the reduction is 16-bit: the same bytes on the wire, one rounding fewer per micro batch.
// Give it only where fp32 sums are gradients: the data-parallel group of train_step and of a
// ZeRO-3 model under bf16 mixed precision (whose parameter gathers move bf16), which is where
// the trainer uses it (docs/parallelism.md, "Collectives and memory").
#pragma once

#include <memory>

#include "backend/device/device.hpp"
#include "backend/dist/communicator.hpp"

namespace backend {

// `group` and `device` must outlive the result; the views it sums are in `device`'s memory.
std::unique_ptr<Communicator> make_bf16_gradient_reduction(Communicator& group, Device& device);

}  // namespace backend
