// Communicator: the collectives of one process group, over Views (Megatron's torch.distributed
// calls: all_reduce, reduce_scatter_tensor, all_gather_into_tensor, broadcast, send/recv,
// batch_isend_irecv, barrier). One interface, implemented over Open MPI for CPU ranks
// (mpi_session.hpp) and NCCL for GPU ranks (nccl_communicator.hpp); never a home-made
// transport. A communicator is an object made from the world's by split(), held by whatever
// needs it (ProcessGroups): no global state.
//
// Every collective is called by every member with the same sizes and types (a point-to-point
// batch by the members it names, each listing its side of the transfers); `values` is
// overwritten in place where it is both input and output. A call returns once what the caller
// does next sees its results: host memory is complete; a device's memory may still be in
// flight, ordered before everything the caller later queues on that device (the NCCL
// communicator), so the host reads it through the device's copies. Sums are in the views' element
// type (NCCL's bf16 and fp16 included; Open MPI has no 16-bit floats, so its communicator sums them
// in fp32 and rounds once); the order in which the members' contributions are added is the
// library's, fixed for a given library, size and group (so runs repeat), but not the order of a
// single-process sum.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "backend/core/view.hpp"

namespace backend {

enum class ReduceOperation { sum, max };

// Member `rank`'s shard of a buffer of `numel` elements cut into `members` contiguous shards:
// the first numel % members shards one element longer, so any size shards without padding.
struct ShardRange {
  int64_t offset = 0;
  int64_t numel = 0;
};
ShardRange shard_range(int64_t numel, int64_t members, int64_t rank);
// The member whose shard_range holds element `element` (0 <= element < numel): found by
// arithmetic, so a reader of shards need not walk every member before the ones it wants.
int64_t shard_member_holding(int64_t numel, int64_t members, int64_t element);

// One point-to-point transfer of a batch (Megatron's P2POp).
struct PointToPoint {
  enum class Direction { send, receive };
  Direction direction = Direction::send;
  View values;
  int64_t peer = 0;  // rank in this group
  // A sender's and its receiver's transfers with equal tags match in posting order.
  int64_t tag = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int64_t rank() const = 0;  // in this group
  virtual int64_t size() const = 0;
  virtual std::string name() const = 0;  // "data parallel", for messages
  // Whether its collectives on device memory are queued in the device's order of work without
  // the host waiting (NCCL's, on the device's streams), so that a GPU's stream capture can
  // hold them (captured_collectives.hpp); not those the host stages through host memory.
  virtual bool queued_on_device() const { return false; }
  // Hands the work queued on the device's compute stream so far to the watchdog of this group's
  // queued collectives, as one more of them named `what` ("the collectives of a replayed
  // step's forward and backward"): how a replayed graph that holds collectives
  // (captured_collectives.hpp) is watched, since its calls were queued at capture, where no
  // thread can ask about them. The rank ends when that work fails or outlives the timeout, as
  // for an eager call. Nothing for a communicator the host waits for (its own watchdog bounds
  // each call), or whose calls queue nothing (one process).
  virtual void watch_queued_work(const std::string& what) { (void)what; }

  // values = op over the members' values, on every member.
  virtual void all_reduce(View values, ReduceOperation operation) = 0;
  // A buffer of N elements is cut into size() contiguous shards, shard_range(N, size, r) for
  // member r (the distributed optimizer's ranges of the flat gradient buffer).
  // output (this member's shard of input.numel) = this member's shard of Σ inputs.
  virtual void reduce_scatter(View output, View input) = 0;
  // output (N elements) = the members' shards in rank order; input is this member's shard of
  // N. input may be output's own shard (in place).
  virtual void all_gather(View output, View input) = 0;
  virtual void broadcast(View values, int64_t root) = 0;
  virtual void send(View values, int64_t peer) = 0;
  virtual void receive(View values, int64_t peer) = 0;
  // Posts every transfer at once and returns when all have completed (torch's batch_isend_irecv
  // and wait): a batch never deadlocks on its own sends, whatever order the members list them in.
  // A receive is given the sender's element count and type (a mismatch that the message's size
  // shows is an error); an empty batch returns at once.
  virtual void exchange(std::span<const PointToPoint> transfers) = 0;
  virtual void barrier() = 0;

  // A collective started by one of the start_* calls below and finished by wait() (torch's
  // async_op=True work handle): a second wait() returns at once; one dropped unwaited is
  // finished (or ordered before later work on the device) by its destructor.
  class PendingCollective {
   public:
    virtual ~PendingCollective() = default;
    virtual void wait() = 0;
  };
  // An all-reduce started now and finished by wait() (torch's all_reduce(async_op=True), which
  // Megatron's --overlap-grad-reduce buckets use): `values` must stay untouched until then.
  // Every member starts the same all-reduces in the same order. The default runs it at once
  // (a communicator without non-blocking collectives is still correct, only not overlapped).
  virtual std::unique_ptr<PendingCollective> start_all_reduce(View values,
                                                              ReduceOperation operation);
  // A batch of point-to-point transfers posted now and finished by wait() (torch's
  // batch_isend_irecv without the wait; Megatron's overlapped pipeline communication): the sent
  // views stay unwritten and the receiving ones unread until then. Matches as exchange() does;
  // the transfers of the members' batches pair in posting order across batches too. The
  // default runs it at once, like start_all_reduce's.
  virtual std::unique_ptr<PendingCollective> start_exchange(
      std::span<const PointToPoint> transfers);
  // A sum of `input` cut into uneven parts, started now and finished by wait(): member r gets
  // the sum of the members' counts[r] elements (after counts[0..r)) in `output` (counts[r]
  // elements; zeros allowed), as MPI_Ireduce_scatter. It is how a bucket of the gradient buffer
  // (--overlap-grad-reduce) lands in the distributed optimizer's shards: a member's count is
  // the part of the bucket inside its shard. `input` and `output` stay untouched until wait().
  // Every member starts the same ones in the same order, with the same counts.
  virtual std::unique_ptr<PendingCollective> start_reduce_scatter(
      View output, View input, std::span<const int64_t> counts) = 0;
  // The reverse, started now and finished by wait(): `output` (the counts' sum of elements) gets
  // each member's `input` (counts[r] elements for member r) in rank order, as MPI_Iallgatherv.
  // `input` may be this member's own part of `output` (in place). It is how the distributed
  // optimizer's updated shards return in buckets (--overlap-param-gather): a member's count is
  // the part of the bucket inside its shard. Both views stay untouched until wait() (the
  // members' parts of `output` are written then); the same calls, in the same order, on every
  // member.
  virtual std::unique_ptr<PendingCollective> start_all_gather(View output, View input,
                                                              std::span<const int64_t> counts) = 0;

  // A new communicator of the members that pass the same `color`, ranked by `key` (MPI's
  // MPI_Comm_split); called by every member.
  virtual std::unique_ptr<Communicator> split(int64_t color, int64_t key, std::string name) = 0;

 protected:
  // The checks every implementation makes before a call, naming the call and this group: a root
  // or peer `rank` that is one of its members; an output of the input's element type.
  void check_member(int64_t rank, const char* call) const;
  void same_type(const View& output, const View& input, const char* call) const;
  // The counts of start_reduce_scatter (part: its output, whole: its input) or
  // start_all_gather (part: its input, whole: its output): one per member, none negative,
  // summing to whole's count, this member's equal to part's; both views of one type.
  void check_counts(const View& part, const View& whole, std::span<const int64_t> counts,
                    const char* call) const;
};

// A pending collective that has already finished: what a call that ran at once returns.
std::unique_ptr<Communicator::PendingCollective> finished_collective();

// Σ value over the members (one double all-reduced): a loss, a sum of squares. Every member
// gets the same total.
double all_reduce_sum(Communicator& group, double value);

// The group of one process: every collective is the identity (a single rank's sum is its own
// values). What a one-process run's groups are.
std::unique_ptr<Communicator> make_single_process_communicator(std::string name);

}  // namespace backend
