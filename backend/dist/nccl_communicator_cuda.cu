// The NCCL communicator; see nccl_communicator.hpp. Follows NCCL's API as nccl.h (≥ 2.18)
// documents it, the way torch.distributed's NCCL backend uses it.
//
// - Every call checks its views first (GPU memory or empty; one of fp32, fp64, bf16, fp16, int32,
//   mapped to NCCL's types; sums and maxima in the views' type, bf16 and fp16 included, as
//   NCCL computes them), then enqueues on the communicator's own stream (as torch's NCCL
//   process group has one per device), which first waits, through an event, for everything
//   enqueued so far on the device's compute stream (cuda_placement). Then the compute stream
//   waits, through an event, for the collective, and the call returns: events, not the host,
//   order the two streams, and the host goes on queueing compute (the views are GPU memory, which
//   the host reads only through the device's copies, on the compute stream, after it). The
//   world's watchdog thread (queued_collective_watchdog.hpp) asks every queued collective's
//   event and ncclCommGetAsyncError every 100 ms, and ends this rank with NCCL's reason when one
//   failed, or naming the call and the group when one has been outstanding longer than the
//   timeout, rather than let a later copy wait forever for a rank that died (PyTorch's NCCL
//   watchdog and TORCH_NCCL_ASYNC_ERROR_HANDLING do the same). barrier() alone waits on the
//   host, polling the stream and ncclCommGetAsyncError, and fails (aborting the communicator
//   with ncclCommAbort, which then refuses every later call) on an error or the timeout: a
//   barrier is for the host. ncclCommInitRank and ncclCommSplit wait for the other ranks
//   without that bound.
// - reduce_scatter and all_gather over shard_range's shards: ncclReduceScatter and
//   ncclAllGather need equal shards, so they serve a buffer that size() divides; any other
//   is one ncclReduce (rooted at the shard's owner) or ncclBroadcast (from it) per shard, all in
//   one ncclGroupStart/ncclGroupEnd, which NCCL runs as one launch, as torch does for uneven
//   shards. No scratch and no padding: each shard moves once, at its own length. A shard of
//   no elements (fewer elements than members) is skipped on every member alike.
// - exchange: ncclSend/ncclRecv in one group. NCCL has no tags: between two ranks the sends
//   one way match the receives in posting order. The interface matches equal tags in posting
//   order, so each rank posts its transfers sorted (stably) by peer, direction and tag: a
//   complete batch, which every batch must be, then pairs exactly as MPI pairs it. Tags must be
//   ≥ 0, as MPI's. A receive whose size differs from its send is not detected by NCCL (MPI
//   names it): it hangs or corrupts, and ends at the timeout. A zero-element transfer moves
//   nothing and is skipped on both sides (their counts agree). Transfers to itself are posted
//   like any other (NCCL pairs them within the group).
// - send/receive to itself would never complete outside a group and is refused (exchange
//   does it). barrier is an all-reduce of one int32 in a buffer allocated with the
//   communicator. split is ncclCommSplit (the child shares the device, stream and timeout).
// - Destruction: ncclCommDestroy, or ncclCommAbort while an exception unwinds (another rank
//   may be gone, and ncclCommDestroy would wait for it).
// - start_all_reduce (--overlap-grad-reduce's buckets), start_reduce_scatter and start_all_gather
//   (the distributed optimizer's buckets, --overlap-param-gather's), start_exchange (the
//   pipeline's overlapped transfers) enqueue the same way and return at once, watched from the
//   start, without making the compute stream wait: the NCCL kernels run on the communicator's
//   stream beside the compute stream's kernels until wait() makes the compute stream wait for
//   the collective's event. One never waited for still orders the compute stream after it when
//   it is dropped. The split communicators each get their own stream and share the world's
//   watchdog.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/core/cuda_check.cuh"
#include "backend/device/cuda_device.hpp"
#include "backend/dist/collective_watchdog.hpp"
#include "backend/dist/nccl_communicator.hpp"
#include "backend/dist/queued_collective_watchdog.hpp"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the NCCL communicator needs NCCL 2.18 or newer (ncclCommSplit); this nccl.h is older"
#endif

namespace backend {
namespace {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes &&
                  NCCL_UNIQUE_ID_BYTES == kNcclUniqueIdBytes,
              "nccl_communicator.hpp's kNcclUniqueIdBytes must be NCCL's NCCL_UNIQUE_ID_BYTES");

using Clock = std::chrono::steady_clock;

// NCCL's text for a status, and its last error's detail where it has one.
std::string nccl_text(ncclResult_t status, ncclComm_t comm) {
  std::string text = ncclGetErrorString(status);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += fmt::format(" ({})", last);
  return text;
}

void check(ncclResult_t status, const char* call, const std::string& group, ncclComm_t comm) {
  if (status == ncclSuccess) return;
  common::fail("{} in the {} group failed: {} (NCCL_DEBUG=WARN or INFO says more)", call, group,
               nccl_text(status, comm));
}

ncclDataType_t nccl_type(ElementType type) {
  switch (type) {
    case ElementType::f32:
      return ncclFloat32;
    case ElementType::f64:
      return ncclFloat64;
    case ElementType::bf16:
      return ncclBfloat16;
    case ElementType::f16:
      return ncclFloat16;
    case ElementType::i32:
      return ncclInt32;
    case ElementType::u64:
      return ncclUint64;
  }
  common::fail("no NCCL type for element type {}", static_cast<int>(type));
}

// The element at `offset` of a view (in bytes from its start), as NCCL takes buffers.
void* element(const View& view, int64_t offset) {
  return static_cast<char*>(view.data) + offset * element_size(view.type);
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, cudaStream_t compute_stream, std::string name,
                   std::chrono::milliseconds timeout,
                   std::shared_ptr<QueuedCollectiveWatchdog> watchdog)
      : comm_(comm),
        device_(device),
        compute_stream_(compute_stream),
        name_(std::move(name)),
        timeout_(timeout),
        watchdog_(std::move(watchdog)) {
    try {
      int value = 0;
      check(ncclCommUserRank(comm_, &value), "ncclCommUserRank", name_, comm_);
      rank_ = value;
      check(ncclCommCount(comm_, &value), "ncclCommCount", name_, comm_);
      size_ = value;
      CUDA_CHECK(cudaSetDevice(device_));
      // The communication stream at the device's highest priority, so that a reduction's
      // kernel is scheduled ahead of the backward's queued kernels (as torch's NCCL streams).
      int lowest_priority = 0, highest_priority = 0;
      CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest_priority, &highest_priority));
      CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, highest_priority));
      CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
      CUDA_CHECK(cudaMalloc(&barrier_, sizeof(int32_t)));
      CUDA_CHECK(cudaMemsetAsync(barrier_, 0, sizeof(int32_t), stream_));
    } catch (...) {
      release(true);
      throw;
    }
  }
  ~NcclCommunicator() override { release(std::uncaught_exceptions() > 0); }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  std::string name() const override { return name_; }
  bool queued_on_device() const override { return true; }
  // An event after the compute stream's work so far (a replayed graph and the collectives it
  // holds), watched as this group's collectives are: NCCL's asynchronous error of this
  // communicator is asked too, and a peer that died inside the replay ends this rank after the
  // timeout rather than leaving it in the step's read. Outside a capture only (a replay is).
  void watch_queued_work(const std::string& what) override {
    if (watchdog_ == nullptr || capturing()) return;
    watch_until(fmt::format("{} (through the {} group's communicator)", what, name_),
                end_of(compute_stream_));
  }

  void all_reduce(View values, ReduceOperation operation) override {
    const char* call = "ncclAllReduce";
    const size_t count = count_of(values, call);
    const ncclComm_t comm = live(call);
    if (count == 0) return;
    enter();
    check(ncclAllReduce(values.data, values.data, count, nccl_type(values.type),
                        operation == ReduceOperation::sum ? ncclSum : ncclMax, comm, stream_),
          call, name_, comm);
    queued(call);
  }

  std::unique_ptr<PendingCollective> start_all_reduce(View values,
                                                      ReduceOperation operation) override {
    const char* call = "ncclAllReduce (started)";
    const size_t count = count_of(values, call);
    const ncclComm_t comm = live(call);
    if (count == 0) return finished_collective();
    return started(call, [&] {
      check(ncclAllReduce(values.data, values.data, count, nccl_type(values.type),
                          operation == ReduceOperation::sum ? ncclSum : ncclMax, comm, stream_),
            call, name_, comm);
    });
  }

  // reduce_to_owners, returning at once like start_all_reduce.
  std::unique_ptr<PendingCollective> start_reduce_scatter(
      View output, View input, std::span<const int64_t> counts) override {
    const char* call = "ncclReduce (started reduce-scatter)";
    count_of(input, call);
    count_of(output, call);
    check_counts(output, input, counts, call);
    const ncclComm_t comm = live(call);
    if (input.numel == 0) return finished_collective();
    return started(call, [&] { reduce_to_owners(call, comm, output, input, counts); });
  }

  // One ncclBroadcast per member with a part (in one group), from that member: its input to
  // its place in the output; returns at once like start_all_reduce.
  std::unique_ptr<PendingCollective> start_all_gather(View output, View input,
                                                      std::span<const int64_t> counts) override {
    const char* call = "ncclBroadcast (started all-gather)";
    count_of(input, call);
    count_of(output, call);
    check_counts(input, output, counts, call);
    const ncclComm_t comm = live(call);
    if (output.numel == 0) return finished_collective();
    return started(call, [&] { broadcast_from_owners(call, comm, output, input, counts); });
  }

  void reduce_scatter(View output, View input) override {
    const char* call = "ncclReduceScatter";
    count_of(input, call);
    const size_t count = count_of(output, call);
    same_type(output, input, call);
    const ShardRange mine = shard_range(input.numel, size_, rank_);
    if (output.numel != mine.numel) {
      common::fail("{} in the {} group: {} elements out, but rank {}'s shard of {} is {}", call,
                   name_, output.numel, rank_, input.numel, mine.numel);
    }
    const ncclComm_t comm = live(call);
    if (input.numel == 0) return;
    enter();
    const ncclDataType_t type = nccl_type(input.type);
    if (input.numel % size_ == 0) {
      check(ncclReduceScatter(input.data, output.data, count, type, ncclSum, comm, stream_), call,
            name_, comm);
    } else {
      // One ncclReduce per shard, to its owner.
      reduce_to_owners("ncclReduce (reduce_scatter's uneven shards)", comm, output, input,
                       shard_counts(input.numel));
    }
    queued(call);
  }

  void all_gather(View output, View input) override {
    const char* call = "ncclAllGather";
    count_of(output, call);
    const size_t count = count_of(input, call);
    same_type(output, input, call);
    const ShardRange mine = shard_range(output.numel, size_, rank_);
    if (input.numel != mine.numel) {
      common::fail(
          "{} in the {} group: {} elements out, so rank {}'s shard is {} elements, but "
          "{} came in",
          call, name_, output.numel, rank_, mine.numel, input.numel);
    }
    const ncclComm_t comm = live(call);
    if (output.numel == 0) return;
    enter();
    const ncclDataType_t type = nccl_type(output.type);
    if (output.numel % size_ == 0) {
      // In place when the input is this member's own shard of the output (NCCL's in-place
      // condition is that very address).
      check(ncclAllGather(input.data, output.data, count, type, comm, stream_), call, name_, comm);
    } else {
      // One ncclBroadcast per shard, from its owner.
      broadcast_from_owners("ncclBroadcast (all_gather's uneven shards)", comm, output, input,
                            shard_counts(output.numel));
    }
    queued(call);
  }

  void broadcast(View values, int64_t root) override {
    const char* call = "ncclBroadcast";
    check_member(root, call);
    const size_t count = count_of(values, call);
    const ncclComm_t comm = live(call);
    if (count == 0) return;
    enter();
    check(ncclBroadcast(values.data, values.data, count, nccl_type(values.type),
                        static_cast<int>(root), comm, stream_),
          call, name_, comm);
    queued(call);
  }

  void send(View values, int64_t peer) override {
    transfer_alone({.direction = PointToPoint::Direction::send, .values = values, .peer = peer});
  }

  void receive(View values, int64_t peer) override {
    transfer_alone({.direction = PointToPoint::Direction::receive, .values = values, .peer = peer});
  }

  void exchange(std::span<const PointToPoint> transfers) override {
    if (transfers.empty()) return;
    const ncclComm_t comm = check_exchange(transfers);
    enter();
    post_exchange(transfers, comm);
    queued("ncclSend/ncclRecv (exchange)");
  }

  // The same group, returning at once like start_all_reduce (overlapped pipeline transfers).
  std::unique_ptr<PendingCollective> start_exchange(
      std::span<const PointToPoint> transfers) override {
    if (transfers.empty()) return finished_collective();
    const ncclComm_t comm = check_exchange(transfers);
    return started("ncclSend/ncclRecv (started exchange)", [&] { post_exchange(transfers, comm); });
  }

  void barrier() override {
    const char* call = "ncclAllReduce (barrier)";
    const ncclComm_t comm = live(call);
    enter();
    check(ncclAllReduce(barrier_, barrier_, 1, ncclInt32, ncclSum, comm, stream_), call, name_,
          comm);
    wait(call);
  }

  std::unique_ptr<Communicator> split(int64_t color, int64_t key, std::string name) override {
    const char* call = "ncclCommSplit";
    // NCCL_SPLIT_NOCOLOR (and any negative color) leaves a rank out of every group; the
    // interface gives every member a group.
    if (color < 0 || color > INT_MAX) {
      common::fail("{} in the {} group: color {} is not one of 0 to {}", call, name_, color,
                   INT_MAX);
    }
    if (key < INT_MIN || key > INT_MAX) {
      common::fail("{} in the {} group: key {} is not an int", call, name_, key);
    }
    const ncclComm_t comm = live(call);
    CUDA_CHECK(cudaSetDevice(device_));
    ncclComm_t part = nullptr;
    check(ncclCommSplit(comm, static_cast<int>(color), static_cast<int>(key), &part, nullptr), call,
          name_, comm);
    if (part == nullptr) {
      common::fail("{} in the {} group gave no communicator for color {}", call, name_, color);
    }
    return std::make_unique<NcclCommunicator>(part, device_, compute_stream_, std::move(name),
                                              timeout_, watchdog_);
  }

 private:
  // The view's element count, once it is known to be GPU memory (or empty) of a type NCCL has.
  size_t count_of(const View& view, const char* call) const {
    if (!view.empty() && view.on != MemoryKind::cuda) {
      common::fail(
          "{} in the {} group was given host memory ({} elements of {}): the NCCL "
          "communicator moves GPU memory (copy it to the device first; CPU ranks use "
          "MPI)",
          call, name_, view.numel, element_name(view.type));
    }
    if (view.numel < 0) common::fail("{} in the {} group: {} elements", call, name_, view.numel);
    nccl_type(view.type);
    return static_cast<size_t>(view.numel);
  }
  void not_itself(int64_t peer, const char* call) const {
    if (peer == rank_) {
      common::fail(
          "{} in the {} group: rank {} to itself would never complete (NCCL pairs a "
          "rank's send to itself with its receive only within one group): use "
          "exchange",
          call, name_, peer);
    }
  }
  static const char* posting_call(const PointToPoint& transfer) {
    return transfer.direction == PointToPoint::Direction::send ? "ncclSend" : "ncclRecv";
  }
  // ncclSend or ncclRecv of the transfer's values, posted on the stream.
  ncclResult_t post(const PointToPoint& transfer, ncclComm_t comm) const {
    const auto count = static_cast<size_t>(transfer.values.numel);
    const ncclDataType_t type = nccl_type(transfer.values.type);
    const int peer = static_cast<int>(transfer.peer);
    return transfer.direction == PointToPoint::Direction::send
               ? ncclSend(transfer.values.data, count, type, peer, comm, stream_)
               : ncclRecv(transfer.values.data, count, type, peer, comm, stream_);
  }
  // send or receive: one transfer, waited for.
  void transfer_alone(const PointToPoint& transfer) {
    const char* call = posting_call(transfer);
    check_member(transfer.peer, call);
    not_itself(transfer.peer, call);
    const size_t count = count_of(transfer.values, call);
    const ncclComm_t comm = live(call);
    if (count == 0) return;
    enter();
    check(post(transfer, comm), call, name_, comm);
    queued(call);
  }
  // The communicator, unless an earlier failure aborted it.
  ncclComm_t live(const char* call) const {
    if (comm_ == nullptr) {
      common::fail(
          "{} in the {} group: the group was aborted after an earlier failure or "
          "timeout, and takes no more calls",
          call, name_);
    }
    return comm_;
  }

  // post() between ncclGroupStart and ncclGroupEnd, which always pair up; the first failure
  // (posting's, else the group's) is reported as `call`'s.
  template <typename Post>
  void grouped(const char* call, ncclComm_t comm, Post post) {
    check(ncclGroupStart(), "ncclGroupStart", name_, comm);
    const ncclResult_t posted = post();
    const ncclResult_t ended = ncclGroupEnd();
    check(posted != ncclSuccess ? posted : ended, call, name_, comm);
  }

  // Each member's shard_range count of a buffer of `numel` elements.
  std::vector<int64_t> shard_counts(int64_t numel) const {
    std::vector<int64_t> counts(static_cast<size_t>(size_));
    for (int64_t r = 0; r < size_; ++r)
      counts[static_cast<size_t>(r)] = shard_range(numel, size_, r).numel;
    return counts;
  }

  // post(root, part) for each member with a part of a buffer cut by `counts` (counts[r]
  // elements after the members before it; none for a count of 0), in member order, in one
  // group; the first failing post ends the loop.
  template <typename Post>
  void each_part(const char* call, ncclComm_t comm, std::span<const int64_t> counts, Post post) {
    grouped(call, comm, [&] {
      int64_t offset = 0;
      for (int64_t root = 0; root < size_; ++root) {
        const int64_t count = counts[static_cast<size_t>(root)];
        if (count == 0) continue;
        const ncclResult_t status = post(static_cast<int>(root), ShardRange{offset, count});
        offset += count;
        if (status != ncclSuccess) return status;
      }
      return ncclSuccess;
    });
  }

  // One ncclReduce per member with a part of `input`, to that member, whose part lands in
  // `output`; on the communication stream. recvbuff is used on the root only (nccl.h): the
  // others pass their part of the input, a buffer of the right length that NCCL reads and never
  // writes.
  void reduce_to_owners(const char* call, ncclComm_t comm, View output, View input,
                        std::span<const int64_t> counts) {
    const ncclDataType_t type = nccl_type(input.type);
    each_part(call, comm, counts, [&](int root, ShardRange part) {
      void* send = element(input, part.offset);
      return ncclReduce(send, root == rank_ ? output.data : send, static_cast<size_t>(part.numel),
                        type, ncclSum, root, comm, stream_);
    });
  }

  // One ncclBroadcast per member with a part of `output`, from that member's `input`. sendbuff
  // is read on the root only; the others pass the part's place in the output (NCCL's in-place
  // form), as does the root when its input is that place.
  void broadcast_from_owners(const char* call, ncclComm_t comm, View output, View input,
                             std::span<const int64_t> counts) {
    const ncclDataType_t type = nccl_type(output.type);
    each_part(call, comm, counts, [&](int root, ShardRange part) {
      void* place = element(output, part.offset);
      return ncclBroadcast(root == rank_ ? input.data : place, place,
                           static_cast<size_t>(part.numel), type, root, comm, stream_);
    });
  }

  // Every transfer is checked before any is posted, so bad input leaves nothing in flight;
  // returns the live communicator.
  ncclComm_t check_exchange(std::span<const PointToPoint> transfers) {
    for (const PointToPoint& transfer : transfers) {
      const char* call = posting_call(transfer);
      check_member(transfer.peer, call);
      if (transfer.tag < 0 || transfer.tag > INT_MAX) {
        common::fail("{} in the {} group: tag {} is not one of 0 to {}", call, name_, transfer.tag,
                     INT_MAX);
      }
      count_of(transfer.values, call);
    }
    return live("exchange");
  }

  // ncclSend/ncclRecv of the batch in one group on the communication stream.
  void post_exchange(std::span<const PointToPoint> transfers, ncclComm_t comm) {
    // Tags by posting order (the file's comment): a stable sort keeps the caller's order
    // among transfers of one peer, direction and tag.
    std::vector<size_t> order(transfers.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::tuple(transfers[a].peer, transfers[a].direction, transfers[a].tag) <
             std::tuple(transfers[b].peer, transfers[b].direction, transfers[b].tag);
    });
    grouped("ncclSend/ncclRecv (exchange)", comm, [&] {
      for (const size_t i : order) {
        const PointToPoint& transfer = transfers[i];
        if (transfer.values.numel == 0) continue;
        const ncclResult_t status = post(transfer, comm);
        if (status != ncclSuccess) return status;
      }
      return ncclSuccess;
    });
  }

  // An event recorded at the end of what `stream` holds so far, shared by whoever still needs
  // it (the watchdog, a started call): destroyed with the last of them.
  std::shared_ptr<CUevent_st> end_of(cudaStream_t stream) {
    cudaEvent_t event = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    std::shared_ptr<CUevent_st> done(event, [](cudaEvent_t e) { (void)cudaEventDestroy(e); });
    CUDA_CHECK(cudaEventRecord(event, stream));
    return done;
  }
  // The end of the communication stream's work so far.
  std::shared_ptr<CUevent_st> end_of_stream() { return end_of(stream_); }

  // Hands the collective that ends at `done` to the world's watchdog: it asks the event and
  // NCCL's asynchronous error until the collective has completed, and ends this rank when it
  // fails or outlives the timeout (queued_collective_watchdog.hpp).
  void watch(const char* call, std::shared_ptr<CUevent_st> done) {
    watch_until(fmt::format("{} in the {} group", call, name_), std::move(done));
  }
  void watch_until(std::string description, std::shared_ptr<CUevent_st> done) {
    const ncclComm_t comm = comm_;
    const int device = device_;
    watchdog_->watch({std::move(description),
                      this,
                      [done, comm, device] {
                        QueuedCollectiveWatchdog::State state;
                        (void)cudaSetDevice(device);
                        const cudaError_t status = cudaEventQuery(done.get());
                        if (status == cudaSuccess) {
                          state.done = true;
                          return state;
                        }
                        if (status != cudaErrorNotReady) {
                          state.failure =
                              fmt::format("CUDA error {} ({})", cudaGetErrorName(status),
                                          cudaGetErrorString(status));
                          return state;
                        }
                        ncclResult_t asynchronous = ncclSuccess;
                        const ncclResult_t asked = ncclCommGetAsyncError(comm, &asynchronous);
                        if (asked != ncclSuccess) asynchronous = asked;
                        if (asynchronous != ncclSuccess && asynchronous != ncclInProgress) {
                          state.failure = nccl_text(asynchronous, comm);
                        }
                        return state;
                      },
                      // The event goes with the watchdog's entry (its query holds `done`).
                      {}});
  }

  // A blocking call's end: the compute stream waits for what was just enqueued (by an event:
  // no host wait) and the watchdog watches it. The host goes on queueing compute; a copy to the
  // host later on the compute stream sees the collective's values.
  void queued(const char* call) {
    const std::shared_ptr<CUevent_st> done = end_of_stream();
    CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, done.get(), 0));
    if (!capturing()) watch(call, done);
  }

  // Whether the compute stream is being captured (a captured training step,
  // captured_collectives.hpp): the communication stream joins the capture through enter()'s
  // event and leaves it through the compute stream's wait, so NCCL's call becomes a node of the
  // graph. An event recorded inside a capture is no point of the stream a thread could ask
  // about, so the watchdog does not watch it: a replayed graph is watched whole instead, by
  // watch_queued_work after each replay.
  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(compute_stream_, &status));
    return status != cudaStreamCaptureStatusNone;
  }

  // A started call: what `post` enqueues, on the communication stream after the compute
  // stream's work so far, and the event that marks its end, which the pending call makes the
  // compute stream wait for; watched from the start.
  template <typename Post>
  std::unique_ptr<PendingCollective> started(const char* call, Post post) {
    enter();
    post();
    std::shared_ptr<CUevent_st> done = end_of_stream();
    if (!capturing()) watch(call, done);
    return std::make_unique<StartedCollective>(compute_stream_, std::move(done));
  }

  // A started call (all-reduce, reduce-scatter, all-gather, exchange): wait() orders the
  // compute stream after its event; the watchdog, not the host, waits for it.
  class StartedCollective final : public PendingCollective {
   public:
    StartedCollective(cudaStream_t compute_stream, std::shared_ptr<CUevent_st> done)
        : compute_stream_(compute_stream), done_(std::move(done)) {}
    ~StartedCollective() override {
      // Dropped unwaited: the compute stream still waits for it, so nothing later on it
      // touches the values first. No error is raised from here.
      if (done_) (void)cudaStreamWaitEvent(compute_stream_, done_.get(), 0);
    }
    StartedCollective(const StartedCollective&) = delete;
    StartedCollective& operator=(const StartedCollective&) = delete;
    void wait() override {
      if (!done_) return;
      const std::shared_ptr<CUevent_st> done = std::move(done_);
      CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, done.get(), 0));
    }

   private:
    cudaStream_t compute_stream_;
    std::shared_ptr<CUevent_st> done_;
  };

  // The communication stream waits for everything enqueued on the compute stream so far (the
  // views' producers), by an event: no host wait.
  void enter() {
    CUDA_CHECK(cudaEventRecord(compute_ready_, compute_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
  }

  // Until the communication stream has done everything enqueued so far, NCCL's call included.
  void wait(const char* call) {
    poll(call, [&] { return cudaStreamQuery(stream_); });
  }

  // Until query() (a stream's or an event's) reports done: polled, so that NCCL's asynchronous
  // errors and the timeout end the wait (the file's comment).
  template <typename Query>
  void poll(const char* call, Query query) {
    const Clock::time_point start = Clock::now(), deadline = start + timeout_;
    for (;;) {
      const cudaError_t status = query();
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) CUDA_CHECK(status);
      ncclResult_t asynchronous = ncclSuccess;
      check(ncclCommGetAsyncError(live(call), &asynchronous), "ncclCommGetAsyncError", name_,
            comm_);
      if (asynchronous != ncclSuccess) {
        const std::string reason = nccl_text(asynchronous, comm_);
        abort_communicator();
        common::fail(
            "{} in the {} group failed while rank {} of {} waited for it: {}; the "
            "group was aborted (ncclCommAbort)",
            call, name_, rank_, size_, reason);
      }
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        abort_communicator();
        common::fail(
            "{} in the {} group did not complete in {} on rank {} of {}: another rank "
            "has probably failed or hangs; the group was aborted (ncclCommAbort)",
            call, name_,
            format_timeout(std::chrono::duration<double, std::ratio<60>>(timeout_).count()), rank_,
            size_);
      }
      // A collective usually completes within microseconds to milliseconds: yield at first,
      // then sleep briefly so that a long wait does not spin a core.
      if (now - start < std::chrono::milliseconds(2)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // The watchdog stops asking about this communicator's collectives first: it must not query
  // a communicator that is gone.
  void abort_communicator() noexcept {
    if (watchdog_) watchdog_->forget(this);
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  void release(bool aborting) noexcept {
    (void)cudaSetDevice(device_);
    if (watchdog_) watchdog_->forget(this);
    if (comm_ != nullptr) {
      if (aborting) {
        (void)ncclCommAbort(comm_);
      } else {
        (void)ncclCommDestroy(comm_);
      }
      comm_ = nullptr;
    }
    if (barrier_ != nullptr) (void)cudaFree(barrier_);
    barrier_ = nullptr;
    if (compute_ready_ != nullptr) (void)cudaEventDestroy(compute_ready_);
    compute_ready_ = nullptr;
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  ncclComm_t comm_;
  int device_;
  cudaStream_t compute_stream_;          // the device's, where the ops run
  cudaStream_t stream_ = nullptr;        // this communicator's own, where its NCCL calls run
  cudaEvent_t compute_ready_ = nullptr;  // enter()'s mark on the compute stream
  std::string name_;
  std::chrono::milliseconds timeout_;
  // The world's, shared by its splits: watches the collectives queued without a host wait.
  std::shared_ptr<QueuedCollectiveWatchdog> watchdog_;
  int64_t rank_ = 0;
  int64_t size_ = 1;
  int32_t* barrier_ = nullptr;  // one int32 on the GPU, for barrier()
};

}  // namespace

NcclUniqueId make_nccl_unique_id() {
  ncclUniqueId id{};
  const ncclResult_t status = ncclGetUniqueId(&id);
  if (status != ncclSuccess) {
    common::fail(
        "ncclGetUniqueId failed: {} (NCCL_DEBUG=WARN or INFO says more; NCCL_SOCKET_IFNAME "
        "picks the network interface it listens on)",
        nccl_text(status, nullptr));
  }
  NcclUniqueId bytes{};
  std::memcpy(bytes.data(), &id, bytes.size());
  return bytes;
}

std::unique_ptr<Communicator> make_nccl_communicator(Device& device, const NcclUniqueId& id,
                                                     int64_t rank, int64_t world_size,
                                                     std::string name,
                                                     std::chrono::milliseconds timeout) {
  const CudaPlacement placement = cuda_placement(device);
  if (world_size < 1 || world_size > INT_MAX || rank < 0 || rank >= world_size) {
    common::fail("the NCCL {} group: rank {} of {} ranks (valid: 0 to the world size - 1)", name,
                 rank, world_size);
  }
  if (timeout <= std::chrono::milliseconds(0)) {
    common::fail("the NCCL {} group's timeout is {} ms; it must be positive", name,
                 timeout.count());
  }
  ncclUniqueId unique_id{};
  std::memcpy(&unique_id, id.data(), id.size());
  // ncclCommInitRank binds the communicator to the current device.
  CUDA_CHECK(cudaSetDevice(placement.index));
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, static_cast<int>(world_size), unique_id, static_cast<int>(rank)),
        "ncclCommInitRank", name, nullptr);
  // One watchdog thread for this communicator and every group split from it.
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown");
  auto watchdog = std::make_shared<QueuedCollectiveWatchdog>(
      fmt::format("rank {} (host {})", rank, host), timeout, Clock::now, end_this_rank);
  watchdog->start();
  return std::make_unique<NcclCommunicator>(comm, placement.index, placement.stream,
                                            std::move(name), timeout, std::move(watchdog));
}

}  // namespace backend
