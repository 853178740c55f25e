// Megatron-LM's pipeline schedules (schedules.py, p2p_communication.py) replayed into a list of
// steps instead of run; see pipeline_schedule.hpp. The names (warmup, remaining, recv_prev,
// recv_next, recv_tensor_from_previous_stage) are Megatron's, so each branch can be checked
// against its original line by line.
#include "backend/train/pipeline_schedule.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "backend/common/error.hpp"

namespace backend {
namespace {

struct Buffer {
  int64_t micro_batch = 0;
  int64_t chunk = 0;
};

class ScheduleBuilder {
 public:
  ScheduleBuilder(int64_t pipeline_parallel, int64_t rank, int64_t virtual_chunks)
      : pipeline_parallel_(pipeline_parallel),
        rank_(rank),
        activations_received_(static_cast<size_t>(virtual_chunks), 0),
        gradients_received_(static_cast<size_t>(virtual_chunks), 0) {}

  void compute(PipelineWork work, Buffer buffer) {
    PipelineStep step;
    step.kind = PipelineStep::Kind::compute;
    step.work = work;
    step.micro_batch = buffer.micro_batch;
    step.chunk = buffer.chunk;
    steps_.push_back(std::move(step));
  }

  // One of Megatron's _communicate calls, blocking: its parts in _batched_p2p_ops's order;
  // nullopt: absent. A receive names only its chunk: Megatron keeps one FIFO of received inputs
  // and one of received output gradients per chunk, consumed by that chunk's forwards and
  // backwards in micro-batch order, so the n-th receive into a chunk is micro batch n.
  void exchange(std::optional<Buffer> send_prev, std::optional<int64_t> recv_prev,
                std::optional<Buffer> send_next, std::optional<int64_t> recv_next) {
    add(PipelineStep::Kind::transfer, send_prev, recv_prev, send_next, recv_next);
  }

  // The same call with overlap_p2p_comm=True: posted now, waited for by wait(handle). nullopt
  // when it transfers nothing (then Megatron returns no handles).
  std::optional<int64_t> post(std::optional<Buffer> send_prev, std::optional<int64_t> recv_prev,
                              std::optional<Buffer> send_next, std::optional<int64_t> recv_next) {
    if (!add(PipelineStep::Kind::post, send_prev, recv_prev, send_next, recv_next)) {
      return std::nullopt;
    }
    steps_.back().handle = static_cast<int64_t>(posts_.size());
    posts_.push_back({steps_.size() - 1, false});
    return steps_.back().handle;
  }

  // Megatron waits for a post's send and its receive by separate handles; here a post is
  // waited for whole, at the first of the two waits (the second is then a no-op).
  void wait(int64_t handle) {
    Post& posted = posts_.at(static_cast<size_t>(handle));
    if (posted.waited) return;
    posted.waited = true;
    PipelineStep step;
    step.kind = PipelineStep::Kind::wait;
    step.handle = handle;
    step.transfers = steps_[posted.step].transfers;
    steps_.push_back(std::move(step));
  }

  // Every post not yet waited for, in posting order.
  void wait_all() {
    for (size_t handle = 0; handle < posts_.size(); ++handle) wait(static_cast<int64_t>(handle));
  }

  std::vector<PipelineStep> take() {
    wait_all();
    return std::move(steps_);
  }

 private:
  struct Post {
    size_t step = 0;  // its place in steps_
    bool waited = false;
  };

  // Appends a step of `kind` with the call's transfers; false (nothing appended) when there are
  // none: Megatron's _communicate posts nothing when every part is None/False.
  bool add(PipelineStep::Kind kind, const std::optional<Buffer>& send_prev,
           const std::optional<int64_t>& recv_prev, const std::optional<Buffer>& send_next,
           const std::optional<int64_t>& recv_next) {
    const int64_t prev = (rank_ - 1 + pipeline_parallel_) % pipeline_parallel_;
    const int64_t next = (rank_ + 1) % pipeline_parallel_;
    std::vector<PipelineTransfer> transfers;
    if (send_prev) {
      transfers.push_back(
          {true, PipelineMessage::gradient, send_prev->micro_batch, send_prev->chunk, prev});
    }
    if (recv_prev) {
      const int64_t chunk = *recv_prev;
      transfers.push_back({false, PipelineMessage::activation,
                           activations_received_[static_cast<size_t>(chunk)]++, chunk, prev});
    }
    if (send_next) {
      transfers.push_back(
          {true, PipelineMessage::activation, send_next->micro_batch, send_next->chunk, next});
    }
    if (recv_next) {
      const int64_t chunk = *recv_next;
      transfers.push_back({false, PipelineMessage::gradient,
                           gradients_received_[static_cast<size_t>(chunk)]++, chunk, next});
    }
    if (transfers.empty()) return false;
    PipelineStep step;
    step.kind = kind;
    step.transfers = std::move(transfers);
    steps_.push_back(std::move(step));
    return true;
  }

  int64_t pipeline_parallel_;
  int64_t rank_;
  std::vector<int64_t> activations_received_;
  std::vector<int64_t> gradients_received_;
  std::vector<PipelineStep> steps_;
  std::vector<Post> posts_;  // by handle
};

// forward_backward_pipelining_without_interleaving, training (not forward_only).
std::vector<PipelineStep> one_f_one_b(int64_t pp, int64_t rank, int64_t num_micro_batches) {
  ScheduleBuilder builder(pp, rank, 1);
  const bool first_stage = rank == 0;
  const bool last_stage = rank == pp - 1;
  // p2p_communication's recv_forward / send_forward / ... skip the whole call on the stage that
  // has no neighbour in that direction.
  const auto recv_forward = [&] {
    if (!first_stage) builder.exchange(std::nullopt, 0, std::nullopt, std::nullopt);
  };
  const auto send_forward = [&](int64_t micro_batch) {
    if (!last_stage) {
      builder.exchange(std::nullopt, std::nullopt, Buffer{micro_batch, 0}, std::nullopt);
    }
  };
  const auto recv_backward = [&] {
    if (!last_stage) builder.exchange(std::nullopt, std::nullopt, std::nullopt, 0);
  };
  const auto send_backward = [&](int64_t micro_batch) {
    if (!first_stage) {
      builder.exchange(Buffer{micro_batch, 0}, std::nullopt, std::nullopt, std::nullopt);
    }
  };
  const auto send_forward_recv_backward = [&](int64_t micro_batch) {
    if (!last_stage) builder.exchange(std::nullopt, std::nullopt, Buffer{micro_batch, 0}, 0);
  };
  const auto send_backward_recv_forward = [&](int64_t micro_batch) {
    if (!first_stage) builder.exchange(Buffer{micro_batch, 0}, 0, std::nullopt, std::nullopt);
  };

  const int64_t warmup = std::min(pp - rank - 1, num_micro_batches);
  const int64_t remaining = num_micro_batches - warmup;
  for (int64_t i = 0; i < warmup; ++i) {
    recv_forward();
    builder.compute(PipelineWork::forward, {i, 0});
    send_forward(i);
  }
  if (remaining > 0) recv_forward();
  for (int64_t i = 0; i < remaining; ++i) {
    const bool last_iteration = i == remaining - 1;
    builder.compute(PipelineWork::forward, {i + warmup, 0});
    send_forward_recv_backward(i + warmup);
    // Backwards pop the oldest stored forward: micro batch i.
    builder.compute(PipelineWork::backward, {i, 0});
    if (last_iteration) {
      send_backward(i);
    } else {
      send_backward_recv_forward(i);
    }
  }
  for (int64_t i = 0; i < warmup; ++i) {
    const int64_t micro_batch = remaining + i;
    recv_backward();
    builder.compute(PipelineWork::backward, {micro_batch, 0});
    send_backward(micro_batch);
  }
  return builder.take();
}

// forward_backward_pipelining_with_interleaving, training, overlap_p2p_comm on or off (not
// overlap_p2p_comm_warmup_flush), microbatch_group_size_per_vp_stage = pp (its default), which
// makes get_schedule_table's groups pp micro batches long: all chunks of one group, chunk by chunk,
// before the next group.
class Interleaved {
 public:
  Interleaved(int64_t pp, int64_t rank, int64_t vp, int64_t num_micro_batches)
      : pp_(pp), rank_(rank), vp_(vp), total_(num_micro_batches * vp) {}

  int64_t total() const { return total_; }

  // get_model_chunk_id (the table lookup wraps modulo the total, as Megatron's does).
  int64_t chunk(int64_t virtual_micro_batch, bool forward) const {
    const int64_t k = virtual_micro_batch % total_;
    const int64_t forward_chunk = (k % (pp_ * vp_)) / pp_;
    return forward ? forward_chunk : vp_ - 1 - forward_chunk;
  }
  // get_microbatch_id_in_model_chunk; a backward's micro batch is its table entry too, since each
  // chunk meets its micro batches in increasing order in the table.
  int64_t micro_batch(int64_t virtual_micro_batch) const {
    return (virtual_micro_batch / (pp_ * vp_)) * pp_ + virtual_micro_batch % pp_;
  }
  Buffer forward_buffer(int64_t k) const { return {micro_batch(k), chunk(k, true)}; }
  Buffer backward_buffer(int64_t k) const { return {micro_batch(k), chunk(k, false)}; }

  bool first_virtual_stage(int64_t chunk_id) const { return rank_ == 0 && chunk_id == 0; }
  bool last_virtual_stage(int64_t chunk_id) const {
    return rank_ == pp_ - 1 && chunk_id == vp_ - 1;
  }

  struct Receive {
    bool receive = true;
    int64_t chunk = 0;
  };
  // recv_tensor_from_previous_stage: whether the peer sends something after this rank's
  // iteration `k`, and for which of this rank's chunks. The leading stage (rank 0 forward, the
  // last rank backward) is pp − 1 iterations ahead of the stage that feeds it across the wrap.
  Receive receive_after(int64_t k, bool forward) const {
    Receive result;
    const bool leading = forward ? rank_ == 0 : rank_ == pp_ - 1;
    if (!leading) {
      result.chunk = chunk(k + 1, forward);
      return result;
    }
    const int64_t last_chunk = forward ? vp_ - 1 : 0;
    int64_t next_chunk = 0;
    if (k < pp_ - 1) {
      result.receive = false;
      next_chunk = chunk(k + 1, forward);
    } else {
      next_chunk = chunk(k - (pp_ - 1), forward);
    }
    if (next_chunk == last_chunk) result.receive = false;
    result.chunk = forward ? next_chunk + 1 : next_chunk - 1;
    return result;
  }

 private:
  int64_t pp_;
  int64_t rank_;
  int64_t vp_;
  int64_t total_;
};

std::vector<PipelineStep> interleaved_one_f_one_b(int64_t pp, int64_t rank, int64_t vp,
                                                  int64_t num_micro_batches, bool overlap) {
  const Interleaved schedule(pp, rank, vp, num_micro_batches);
  ScheduleBuilder builder(pp, rank, vp);
  const int64_t total = schedule.total();
  // get_pp_rank_microbatches.
  int64_t warmup = (pp - rank - 1) * 2 + (vp - 1) * pp;
  bool all_warmup = false;
  if (warmup >= total) {
    warmup = total;
    all_warmup = true;
  }
  const int64_t remaining = total - warmup;

  const auto output_to_send = [&](int64_t k) -> std::optional<Buffer> {
    const Buffer buffer = schedule.forward_buffer(k);
    if (schedule.last_virtual_stage(buffer.chunk)) return std::nullopt;
    return buffer;
  };
  const auto input_gradient_to_send = [&](int64_t k) -> std::optional<Buffer> {
    const Buffer buffer = schedule.backward_buffer(k);
    if (schedule.first_virtual_stage(buffer.chunk)) return std::nullopt;
    return buffer;
  };

  const auto into = [](bool receive, int64_t chunk) -> std::optional<int64_t> {
    if (!receive) return std::nullopt;
    return chunk;
  };

  // overlap_p2p_comm's handles: recv_prev_wait_handles and recv_next_wait_handles (the posts
  // with a receive, oldest first), send_next_wait_handle and send_prev_wait_handle (the last
  // post with a send).
  std::deque<int64_t> forward_receives, backward_receives;
  std::optional<int64_t> forward_send, backward_send;
  // A post's handles filed as Megatron files them; the previous send is waited for first.
  const auto file = [&](std::optional<int64_t> handle, bool sends, bool receives,
                        std::optional<int64_t>& last_send, std::deque<int64_t>& receiving) {
    if (last_send) builder.wait(*last_send);
    last_send = handle && sends ? handle : std::nullopt;
    if (handle && receives) receiving.push_back(*handle);
  };
  const auto wait_oldest = [&](std::deque<int64_t>& receiving) {
    if (receiving.empty()) return;
    builder.wait(receiving.front());
    receiving.pop_front();
  };

  // recv_forward for chunk 0 before the loop.
  if (!schedule.first_virtual_stage(0)) {
    builder.exchange(std::nullopt, 0, std::nullopt, std::nullopt);
  }

  for (int64_t k = 0; k < warmup; ++k) {
    auto [recv_prev, next_forward_chunk] = schedule.receive_after(k, true);
    // No receive in the last iteration: there is no iteration k + 1.
    if (k == total - 1) recv_prev = false;
    builder.compute(PipelineWork::forward, schedule.forward_buffer(k));
    // The last warmup iteration also receives the first backward's output gradient (chunk vp − 1)
    // unless all iterations are warmup; the last rank's first backward is the last virtual
    // stage's, which receives none. Without the overlap in the same batch
    // (send_forward_backward_recv_forward_backward); with it, posted apart after the blocking
    // forward batch (send_backward_recv_backward with overlap_p2p_comm).
    const bool recv_next = k == warmup - 1 && !all_warmup && rank != pp - 1;
    if (!overlap) {
      builder.exchange(std::nullopt, into(recv_prev, next_forward_chunk), output_to_send(k),
                       into(recv_next, vp - 1));
      continue;
    }
    builder.exchange(std::nullopt, into(recv_prev, next_forward_chunk), output_to_send(k),
                     std::nullopt);
    if (k == warmup - 1 && !all_warmup) {
      file(builder.post(std::nullopt, std::nullopt, std::nullopt, into(recv_next, vp - 1)), false,
           recv_next, backward_send, backward_receives);
    }
  }

  for (int64_t k = 0; k < remaining; ++k) {
    const int64_t forward_k = k + warmup;
    const int64_t backward_k = k;
    auto [recv_prev, next_forward_chunk] = schedule.receive_after(forward_k, true);
    const auto [recv_next, next_backward_chunk] = schedule.receive_after(backward_k, false);
    // The last iteration receives no input: the one before the loop was the extra one.
    if (k == remaining - 1) recv_prev = false;
    if (!overlap) {
      builder.compute(PipelineWork::forward, schedule.forward_buffer(forward_k));
      builder.compute(PipelineWork::backward, schedule.backward_buffer(backward_k));
      builder.exchange(input_gradient_to_send(backward_k), into(recv_prev, next_forward_chunk),
                       output_to_send(forward_k), into(recv_next, next_backward_chunk));
      continue;
    }
    // pp_pre_forward, the forward, pp_post_forward.
    const Buffer forward = schedule.forward_buffer(forward_k);
    if (!schedule.first_virtual_stage(forward.chunk)) wait_oldest(forward_receives);
    builder.compute(PipelineWork::forward, forward);
    const std::optional<Buffer> output = output_to_send(forward_k);
    file(builder.post(std::nullopt, into(recv_prev, next_forward_chunk), output, std::nullopt),
         output.has_value(), recv_prev, forward_send, forward_receives);
    // pp_pre_backward, the backward, pp_post_backward.
    const Buffer backward = schedule.backward_buffer(backward_k);
    if (!schedule.last_virtual_stage(backward.chunk)) wait_oldest(backward_receives);
    builder.compute(PipelineWork::backward, backward);
    const std::optional<Buffer> input_gradient = input_gradient_to_send(backward_k);
    file(builder.post(input_gradient, std::nullopt, std::nullopt,
                      into(recv_next, next_backward_chunk)),
         input_gradient.has_value(), recv_next, backward_send, backward_receives);
  }

  if (all_warmup && !schedule.last_virtual_stage(vp - 1)) {
    builder.exchange(std::nullopt, std::nullopt, std::nullopt, vp - 1);
  }
  for (int64_t k = remaining; k < total; ++k) {
    auto [recv_next, next_backward_chunk] = schedule.receive_after(k, false);
    if (k == total - 1) recv_next = false;
    // With the overlap, the steady state's last posted receive is waited for here.
    if (overlap && !schedule.last_virtual_stage(schedule.backward_buffer(k).chunk) && k != 0) {
      wait_oldest(backward_receives);
    }
    builder.compute(PipelineWork::backward, schedule.backward_buffer(k));
    builder.exchange(input_gradient_to_send(k), std::nullopt, std::nullopt,
                     into(recv_next, next_backward_chunk));
  }
  // Megatron waits for send_prev_wait_handle here; take() waits for anything else still
  // posted (the last forward send, which Megatron leaves to torch), so nothing outlives the step.
  if (backward_send) builder.wait(*backward_send);
  return builder.take();
}

}  // namespace

std::vector<PipelineStep> pipeline_schedule(int64_t pipeline_parallel, int64_t rank,
                                            int64_t virtual_chunks, int64_t num_micro_batches,
                                            bool overlap_p2p_communication) {
  if (pipeline_parallel < 1) {
    common::fail("--pipeline-model-parallel-size must be ≥ 1, got {}", pipeline_parallel);
  }
  if (rank < 0 || rank >= pipeline_parallel) {
    common::fail(
        "pipeline rank {} is out of range for --pipeline-model-parallel-size {} "
        "(valid: 0 to {})",
        rank, pipeline_parallel, pipeline_parallel - 1);
  }
  if (virtual_chunks < 1) {
    common::fail(
        "the number of model chunks per pipeline rank (--num-layers-per-virtual-"
        "pipeline-stage) must be ≥ 1, got {}",
        virtual_chunks);
  }
  if (num_micro_batches < 1) {
    common::fail(
        "the number of micro batches per global batch (--global-batch-size / "
        "(--micro-batch-size × data-parallel size)) must be ≥ 1, got {}",
        num_micro_batches);
  }
  if (virtual_chunks > 1) {
    // Megatron's validate_args: with p2p overlap off, pp ≤ 2 would put two sends or two receives
    // between the same two ranks into one batch.
    if (pipeline_parallel == 1) {
      common::fail(
          "the interleaved schedule (--num-layers-per-virtual-pipeline-stage, {} model "
          "chunks per rank) needs --pipeline-model-parallel-size greater than 1",
          virtual_chunks);
    }
    if (pipeline_parallel == 2 && !overlap_p2p_communication) {
      common::fail(
          "the interleaved schedule (--num-layers-per-virtual-pipeline-stage, {} model "
          "chunks per rank) with --no-overlap-p2p-communication needs "
          "--pipeline-model-parallel-size greater than 2, got {}, to avoid having multiple p2p "
          "sends and recvs between the same 2 ranks per communication batch",
          virtual_chunks, pipeline_parallel);
    }
    // forward_backward_pipelining_with_interleaving: micro batches run in groups of pp per
    // virtual stage; a short last group would leave bubbles, so Megatron refuses it.
    if (num_micro_batches % pipeline_parallel != 0) {
      common::fail(
          "the number of micro batches ({}, from --global-batch-size / "
          "(--micro-batch-size × data-parallel size)) is not divisible by "
          "--pipeline-model-parallel-size {} when using the interleaved schedule "
          "(--num-layers-per-virtual-pipeline-stage)",
          num_micro_batches, pipeline_parallel);
    }
  }

  if (pipeline_parallel == 1) {
    // forward_backward_no_pipelining: each micro batch's forward, then its backward.
    std::vector<PipelineStep> steps;
    steps.reserve(static_cast<size_t>(2 * num_micro_batches));
    for (int64_t micro_batch = 0; micro_batch < num_micro_batches; ++micro_batch) {
      for (PipelineWork work : {PipelineWork::forward, PipelineWork::backward}) {
        PipelineStep step;
        step.work = work;
        step.micro_batch = micro_batch;
        steps.push_back(std::move(step));
      }
    }
    return steps;
  }
  if (virtual_chunks == 1) return one_f_one_b(pipeline_parallel, rank, num_micro_batches);
  return interleaved_one_f_one_b(pipeline_parallel, rank, virtual_chunks, num_micro_batches,
                                 overlap_p2p_communication);
}

int64_t pipeline_slots(const std::vector<PipelineStep>& steps) {
  // The first and last step that mention each micro batch.
  std::map<int64_t, std::pair<size_t, size_t>> extent;
  const auto mention = [&](int64_t micro_batch, size_t step) {
    const auto [it, inserted] = extent.try_emplace(micro_batch, step, step);
    if (!inserted) it->second.second = step;
  };
  for (size_t step = 0; step < steps.size(); ++step) {
    if (steps[step].kind == PipelineStep::Kind::compute) {
      mention(steps[step].micro_batch, step);
    } else {
      for (const PipelineTransfer& transfer : steps[step].transfers) {
        mention(transfer.micro_batch, step);
      }
    }
  }
  std::vector<std::vector<int64_t>> starting(steps.size());
  std::vector<std::vector<int64_t>> ending(steps.size());
  for (const auto& [micro_batch, first_last] : extent) {
    starting[first_last.first].push_back(micro_batch);
    ending[first_last.second].push_back(micro_batch);
  }
  // Sweep the steps keeping the set in flight, so a long schedule costs O(n log n).
  std::set<int64_t> in_flight;
  int64_t slots = 1;
  for (size_t step = 0; step < steps.size(); ++step) {
    in_flight.insert(starting[step].begin(), starting[step].end());
    if (!in_flight.empty()) slots = std::max(slots, *in_flight.rbegin() - *in_flight.begin() + 1);
    for (int64_t micro_batch : ending[step]) in_flight.erase(micro_batch);
  }
  return slots;
}

}  // namespace backend
