// The pipeline-parallel schedules as data: for one pipeline rank and one global batch, the ordered
// list of computes (forward or backward of a micro batch on one of the rank's model chunks) and
// point-to-point transfer batches (posted together, all waited for), which an executor walks.
//
// Follows Megatron-LM megatron/core/pipeline_parallel/schedules.py (forward_backward_no_pipelining,
// forward_backward_pipelining_without_interleaving, forward_backward_pipelining_with_interleaving
// with and without overlap_p2p_comm (not overlap_p2p_comm_warmup_flush),
// microbatch_group_size_per_vp_stage at its default of the pipeline size) and p2p_communication.py
// (which calls post which transfers, and in which order in a batch):
// - 1F1B: rank r runs min(pp − r − 1, M) warmup forwards, then alternates one forward and one
//   backward, then drains the remaining backwards.
// - Interleaved 1F1B: virtual micro batch k (0 ≤ k < M·vp) is micro batch (k / (pp·vp))·pp + k % pp
//   on chunk (k / pp) % vp for forwards, chunk vp − 1 − that for backwards; rank r runs
//   min((pp − r − 1)·2 + (vp − 1)·pp, M·vp) warmup forwards. Virtual stage s = r + chunk·pp;
//   activations go to stage s + 1 (rank (r + 1) % pp), gradients to stage s − 1.
// - Interleaved 1F1B with overlapped p2p communication (Megatron's default since 2023-10;
//   --no-overlap-p2p-communication turns it off): the same computes in the same order, but in the
//   steady state each forward's transfers (its output to the next stage, the next forward's
//   input from the previous) are posted right after it and waited for just before the next
//   forward, so they travel during the backward; each backward's likewise travel during the next
//   forward. The warm-up's and the cool-down's transfers stay blocking, as in Megatron.
// A receive is for the next compute of its chunk that needs it: Megatron appends received tensors
// to one FIFO per chunk, and each chunk runs its forwards, and its backwards, in micro-batch order.
#pragma once

#include <cstdint>
#include <vector>

namespace backend {

enum class PipelineWork { forward, backward };
// Forward activations go to the next stage, gradients to the previous.
enum class PipelineMessage { activation, gradient };

struct PipelineTransfer {
  bool send = false;  // false: receive
  PipelineMessage message = PipelineMessage::activation;
  int64_t micro_batch = 0;
  // The model chunk on THIS rank whose buffer it is: a sent activation is that chunk's output,
  // a received activation that chunk's input, a sent gradient the gradient of that chunk's
  // input, a received gradient the gradient of that chunk's output.
  int64_t chunk = 0;
  int64_t peer = 0;  // pipeline rank of the other side
  bool operator==(const PipelineTransfer&) const = default;
};

struct PipelineStep {
  enum class Kind { compute, transfer, post, wait };
  Kind kind = Kind::compute;
  // compute: run `work` of (micro_batch, chunk) on this rank
  PipelineWork work = PipelineWork::forward;
  int64_t micro_batch = 0;
  int64_t chunk = 0;
  // transfer: posted together and all waited for (torch's batch_isend_irecv + wait); never empty.
  // Within a batch the order is Megatron's _batched_p2p_ops: gradient send to the previous rank,
  // activation receive from it, activation send to the next rank, gradient receive from it.
  // post: posted together like a transfer's, and waited for by the later `wait` step of the same
  // `handle` (overlapped p2p communication: the steps between run while they travel; a sent
  // buffer is not written and a receiving one not read until then).
  // wait: completes the post of `handle`, whose transfers it repeats (for pipeline_slots and
  // messages). Every post has exactly one wait, later in the list.
  std::vector<PipelineTransfer> transfers;
  int64_t handle = 0;  // post and wait: the rank's posts numbered from 0 in order
};

// The ordered steps of pipeline rank `rank` of `pipeline_parallel` for one global batch of
// `num_micro_batches` micro batches, each rank holding `virtual_chunks` model chunks:
// virtual_chunks == 1: Megatron's 1F1B (forward_backward_pipelining_without_interleaving);
// virtual_chunks > 1: Megatron's interleaved 1F1B (forward_backward_pipelining_with_interleaving),
// with its steady state's transfers overlapped when `overlap_p2p_communication` (which 1F1B
// ignores, as Megatron sets it off without interleaving). pipeline_parallel == 1: forward then
// backward per micro batch, no transfers.
// common::Error with Megatron's rules as messages (naming the flags --pipeline-model-parallel-size,
// --num-layers-per-virtual-pipeline-stage, --no-overlap-p2p-communication,
// --global-batch-size/--micro-batch-size): interleaving needs pipeline_parallel > 2 without the
// overlap (two sends between the same two ranks in one batch otherwise), > 1 with it, and
// num_micro_batches % pipeline_parallel == 0; sizes >= 1; rank in range.
std::vector<PipelineStep> pipeline_schedule(int64_t pipeline_parallel, int64_t rank,
                                            int64_t virtual_chunks, int64_t num_micro_batches,
                                            bool overlap_p2p_communication = false);

// How many micro batches' buffers the rank must hold at once: the largest (last − first + 1)
// micro-batch index span among micro batches "in flight" at any step, where a micro batch is in
// flight from the first step that mentions it (a compute, or a transfer, post or wait: any chunk)
// through the
// last one. Buffers are then assigned as micro_batch % pipeline_slots(steps) without collision.
// At least 1. For 1F1B with M ≥ pp that is pp on the first stage but pp − rank + 1 (not pp − rank)
// on the others: their steady send_backward_recv_forward batch sends micro batch i's input
// gradient while it receives micro batch i + pp − rank's input.
int64_t pipeline_slots(const std::vector<PipelineStep>& steps);

}  // namespace backend
