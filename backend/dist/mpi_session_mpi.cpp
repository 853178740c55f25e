// MpiSession and the Open MPI communicator; see mpi_session.hpp and communicator.hpp.
// Every MPI call returns its error (MPI_ERRORS_RETURN on every communicator) and is checked:
// a failure is a common::Error naming the call, the group and MPI's message. Views must be
// host memory (CPU ranks); the element types map to MPI's (bf16 and fp16 move as 16-bit words;
// MPI has no such float types, so their sums and maxima are taken in fp32: widened into a host
// buffer, reduced as MPI_FLOAT, rounded back to nearest even: one rounding of the fp32 result,
// where NCCL rounds after each addition of its ring, so the two may differ in the last bit). Every
// call that waits for other ranks is marked on the session's collective watchdog
// (collective_watchdog.hpp), which ends this rank when one waits longer than
// --distributed-timeout-minutes. A batch of point-to-point transfers (exchange) is an MPI_Isend or
// MPI_Irecv for each, then an MPI_Wait on each: torch's batch_isend_irecv and the waits Megatron's
// pipeline makes on its requests; start_exchange posts them and leaves the waits to its wait().
#include <fmt/format.h>
#include <mpi.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/dist/collective_watchdog.hpp"
#include "backend/dist/mpi_session.hpp"

namespace backend {
namespace {

void check(int status, const char* call, const std::string& group) {
  if (status == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(status, message, &length);
  common::fail("{} in the {} group failed: {}", call, group, std::string(message, length));
}

MPI_Datatype mpi_type(ElementType type, const char* call, const std::string& group) {
  switch (type) {
    case ElementType::f32: return MPI_FLOAT;
    case ElementType::f64: return MPI_DOUBLE;
    case ElementType::i32: return MPI_INT32_T;
    case ElementType::u64:
      return MPI_UINT64_T;
    case ElementType::bf16:
    case ElementType::f16: return MPI_UINT16_T;
  }
  common::fail("{} in the {} group: no MPI type for {}", call, group, element_name(type));
}

int mpi_count(const View& view, const char* call, const std::string& group) {
  if (view.on != MemoryKind::host && !view.empty()) {
    common::fail("{} in the {} group was given GPU memory: the MPI communicator moves host "
                 "memory (GPU ranks use NCCL)", call, group);
  }
  if (view.numel > std::numeric_limits<int>::max()) {
    common::fail("{} in the {} group: {} elements is more than one MPI call moves", call, group,
                 view.numel);
  }
  return static_cast<int>(view.numel);
}

bool is_16_bit_float(ElementType type) {
  return type == ElementType::bf16 || type == ElementType::f16;
}

// A 16-bit float view's values as fp32 (the sums' working type), and the fp32 results rounded
// back into such a view (to nearest even, as the ops' conversions).
std::vector<float> widened(const View& values) {
  std::vector<float> wide(static_cast<size_t>(values.numel));
  const auto* words = static_cast<const uint16_t*>(values.data);
  for (size_t i = 0; i < wide.size(); ++i) {
    wide[i] = values.type == ElementType::bf16 ? to_float(bfloat16{words[i]})
                                               : to_float(float16{words[i]});
  }
  return wide;
}

void round_into(const View& values, std::span<const float> wide) {
  auto* words = static_cast<uint16_t*>(values.data);
  for (size_t i = 0; i < wide.size(); ++i) {
    words[i] =
        values.type == ElementType::bf16 ? to_bfloat16(wide[i]).bits : to_float16(wide[i]).bits;
  }
}

// What an MPI reduction reads and writes: the views' own memory in their MPI type, or, for bf16
// and fp16 (which MPI cannot add), fp32 copies whose result finish() rounds back into the
// output view. In place (an all-reduce: `input` is `output`) the send buffer is MPI_IN_PLACE.
// The vectors keep their storage when the object moves, so a started reduction can hold it
// until MPI is done with it.
class ReductionBuffers {
 public:
  // In place: `values` in and out (an all-reduce).
  ReductionBuffers(View values, const char* call, const std::string& group)
      : ReductionBuffers(values, values, true, call, group) {}
  // `input` in, `output` out (a reduce-scatter).
  ReductionBuffers(View output, View input, const char* call, const std::string& group)
      : ReductionBuffers(output, input, false, call, group) {}
  const void* send() const {
    if (in_place_) return MPI_IN_PLACE;
    return narrow_ ? wide_input_.data() : input_.data;
  }
  void* receive() {
    if (!narrow_) return output_.data;
    return in_place_ ? wide_input_.data() : wide_output_.data();
  }
  MPI_Datatype type() const { return type_; }
  // After the reduction: a 16-bit output gets its fp32 result, rounded.
  void finish() {
    if (narrow_) round_into(output_, in_place_ ? wide_input_ : wide_output_);
  }

 private:
  ReductionBuffers(View output, View input, bool in_place, const char* call,
                   const std::string& group)
      : output_(output),
        input_(input),
        in_place_(in_place),
        narrow_(is_16_bit_float(input.type)),
        type_(narrow_ ? MPI_FLOAT : mpi_type(input.type, call, group)) {
    if (!narrow_) return;
    wide_input_ = widened(input);
    if (!in_place_) wide_output_.resize(static_cast<size_t>(output.numel));
  }

  View output_, input_;
  bool in_place_;
  bool narrow_;
  MPI_Datatype type_;
  std::vector<float> wide_input_, wide_output_;
};

// A started MPI_Iallreduce, MPI_Ireduce_scatter or MPI_Iallgatherv: wait() finishes it under
// the watchdog (and a reduction's 16-bit result); one never waited for is finished by the
// destructor, so no collective outlives the caller's buffers. It holds what MPI reads until the
// end: a reduction's buffers, the counts and offsets of the uneven calls (moved in after the
// call: a vector keeps its storage when it moves).
class StartedMpiCollective final : public Communicator::PendingCollective {
 public:
  StartedMpiCollective(MPI_Request request, std::shared_ptr<CollectiveWatchdog> watchdog,
                       std::string group, std::optional<ReductionBuffers> buffers,
                       std::vector<int> counts = {}, std::vector<int> offsets = {})
      : request_(request),
        watchdog_(std::move(watchdog)),
        group_(std::move(group)),
        buffers_(std::move(buffers)),
        counts_(std::move(counts)),
        offsets_(std::move(offsets)) {}
  ~StartedMpiCollective() override {
    if (request_ == MPI_REQUEST_NULL) return;
    const auto watched = watchdog_->watch("MPI_Wait", group_);
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  StartedMpiCollective(const StartedMpiCollective&) = delete;
  StartedMpiCollective& operator=(const StartedMpiCollective&) = delete;
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    {
      const auto watched = watchdog_->watch("MPI_Wait", group_);
      check(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait", group_);
    }
    if (buffers_) buffers_->finish();
  }

 private:
  MPI_Request request_;
  std::shared_ptr<CollectiveWatchdog> watchdog_;
  std::string group_;
  std::optional<ReductionBuffers> buffers_;
  std::vector<int> counts_, offsets_;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm communicator, std::string name, bool owned,
                  std::shared_ptr<CollectiveWatchdog> watchdog)
      : communicator_(communicator), name_(std::move(name)), owned_(owned),
        watchdog_(std::move(watchdog)) {
    check(MPI_Comm_set_errhandler(communicator_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
          name_);
    int value = 0;
    check(MPI_Comm_rank(communicator_, &value), "MPI_Comm_rank", name_);
    rank_ = value;
    check(MPI_Comm_size(communicator_, &value), "MPI_Comm_size", name_);
    size_ = value;
    // The largest tag this library carries (at least 32767, MPI 4.0 §8.1.2); a local query.
    int* tag_upper_bound = nullptr;
    int found = 0;
    check(MPI_Comm_get_attr(communicator_, MPI_TAG_UB, &tag_upper_bound, &found),
          "MPI_Comm_get_attr", name_);
    if (found != 0 && tag_upper_bound != nullptr) tag_upper_bound_ = *tag_upper_bound;
    // The members' world ranks, so that a send or receive that waits too long names its peer
    // as the launcher does (local calls: no communication).
    MPI_Group group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
    check(MPI_Comm_group(communicator_, &group), "MPI_Comm_group", name_);
    check(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group", name_);
    std::vector<int> members(static_cast<size_t>(size_));
    std::iota(members.begin(), members.end(), 0);
    world_ranks_.resize(members.size());
    const int status = MPI_Group_translate_ranks(group, static_cast<int>(size_), members.data(),
                                                 world_group, world_ranks_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    check(status, "MPI_Group_translate_ranks", name_);
  }
  ~MpiCommunicator() override {
    if (owned_) MPI_Comm_free(&communicator_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  std::string name() const override { return name_; }

  void all_reduce(View values, ReduceOperation operation) override {
    const int count = mpi_count(values, "MPI_Allreduce", name_);
    const MPI_Op op = operation == ReduceOperation::sum ? MPI_SUM : MPI_MAX;
    ReductionBuffers buffers(values, "MPI_Allreduce", name_);
    {
      const auto watched = watchdog_->watch("MPI_Allreduce", name_);
      check(MPI_Allreduce(buffers.send(), buffers.receive(), count, buffers.type(), op,
                          communicator_),
            "MPI_Allreduce", name_);
    }
    buffers.finish();
  }

  // MPI_Iallreduce. Open MPI progresses it inside later MPI calls (no progress thread by
  // default), so on CPU ranks the overlap is whatever MPI calls the backward makes meanwhile.
  std::unique_ptr<PendingCollective> start_all_reduce(View values,
                                                      ReduceOperation operation) override {
    const int count = mpi_count(values, "MPI_Iallreduce", name_);
    const MPI_Op op = operation == ReduceOperation::sum ? MPI_SUM : MPI_MAX;
    ReductionBuffers buffers(values, "MPI_Iallreduce", name_);
    MPI_Request request = MPI_REQUEST_NULL;
    {
      const auto watched = watchdog_->watch("MPI_Iallreduce", name_);
      check(MPI_Iallreduce(buffers.send(), buffers.receive(), count, buffers.type(), op,
                           communicator_, &request),
            "MPI_Iallreduce", name_);
    }
    return std::make_unique<StartedMpiCollective>(request, watchdog_, name_, std::move(buffers));
  }

  std::unique_ptr<PendingCollective> start_reduce_scatter(
      View output, View input, std::span<const int64_t> counts) override {
    const char* call = "MPI_Ireduce_scatter";
    mpi_count(input, call, name_);
    mpi_count(output, call, name_);
    check_counts(output, input, counts, call);
    ReductionBuffers buffers(output, input, call, name_);
    std::vector<int> mpi_counts(counts.begin(), counts.end());
    MPI_Request request = MPI_REQUEST_NULL;
    {
      const auto watched = watchdog_->watch(call, name_);
      check(MPI_Ireduce_scatter(buffers.send(), buffers.receive(), mpi_counts.data(),
                                buffers.type(), MPI_SUM, communicator_, &request),
            call, name_);
    }
    return std::make_unique<StartedMpiCollective>(request, watchdog_, name_, std::move(buffers),
                                                  std::move(mpi_counts));
  }

  // MPI_Iallgatherv of the members' parts; in place (MPI_IN_PLACE) when `input` is this
  // member's part of `output`. Nothing is summed, so 16-bit values move as they are.
  std::unique_ptr<PendingCollective> start_all_gather(View output, View input,
                                                      std::span<const int64_t> counts) override {
    const char* call = "MPI_Iallgatherv";
    mpi_count(output, call, name_);
    const int count = mpi_count(input, call, name_);
    check_counts(input, output, counts, call);
    std::vector<int> mpi_counts(counts.begin(), counts.end()), offsets(counts.size());
    int64_t offset = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      offsets[r] = static_cast<int>(offset);
      offset += counts[r];
    }
    const MPI_Datatype type = mpi_type(input.type, call, name_);
    const auto* own_part =
        static_cast<const char*>(output.data) +
        static_cast<int64_t>(offsets[static_cast<size_t>(rank_)]) * element_size(output.type);
    const void* send = input.data == own_part ? MPI_IN_PLACE : input.data;
    MPI_Request request = MPI_REQUEST_NULL;
    {
      const auto watched = watchdog_->watch(call, name_);
      check(MPI_Iallgatherv(send, count, type, output.data, mpi_counts.data(), offsets.data(), type,
                            communicator_, &request),
            call, name_);
    }
    return std::make_unique<StartedMpiCollective>(request, watchdog_, name_, std::nullopt,
                                                  std::move(mpi_counts), std::move(offsets));
  }

  void reduce_scatter(View output, View input) override {
    mpi_count(input, "MPI_Reduce_scatter", name_);
    const int count = mpi_count(output, "MPI_Reduce_scatter", name_);
    same_type(output, input, "MPI_Reduce_scatter");
    const std::vector<int> counts = shard_counts(input.numel);
    if (count != counts[static_cast<size_t>(rank_)]) {
      common::fail("MPI_Reduce_scatter in the {} group: {} elements out, but rank {}'s shard of "
                   "{} is {}", name_, output.numel, rank_, input.numel,
                   counts[static_cast<size_t>(rank_)]);
    }
    ReductionBuffers buffers(output, input, "MPI_Reduce_scatter", name_);
    {
      const auto watched = watchdog_->watch("MPI_Reduce_scatter", name_);
      check(MPI_Reduce_scatter(buffers.send(), buffers.receive(), counts.data(), buffers.type(),
                               MPI_SUM, communicator_),
            "MPI_Reduce_scatter", name_);
    }
    buffers.finish();
  }

  void all_gather(View output, View input) override {
    mpi_count(output, "MPI_Allgatherv", name_);
    const int count = mpi_count(input, "MPI_Allgatherv", name_);
    same_type(output, input, "MPI_Allgatherv");
    const std::vector<int> counts = shard_counts(output.numel);
    if (count != counts[static_cast<size_t>(rank_)]) {
      common::fail("MPI_Allgatherv in the {} group: {} elements out, so rank {}'s shard is {} "
                   "elements, but {} came in", name_, output.numel, rank_,
                   counts[static_cast<size_t>(rank_)], input.numel);
    }
    std::vector<int> offsets(counts.size());
    for (size_t r = 0; r < counts.size(); ++r) {
      offsets[r] = static_cast<int>(shard_range(output.numel, size_, static_cast<int64_t>(r)).offset);
    }
    const MPI_Datatype type = mpi_type(input.type, "MPI_Allgatherv", name_);
    // In place when the input is this member's own shard of the output.
    const auto* own_shard = static_cast<const char*>(output.data) +
                            static_cast<int64_t>(offsets[static_cast<size_t>(rank_)]) *
                                element_size(output.type);
    const void* send = input.data == own_shard ? MPI_IN_PLACE : input.data;
    const auto watched = watchdog_->watch("MPI_Allgatherv", name_);
    check(MPI_Allgatherv(send, count, type, output.data, counts.data(), offsets.data(), type,
                         communicator_),
          "MPI_Allgatherv", name_);
  }

  void broadcast(View values, int64_t root) override {
    check_member(root, "MPI_Bcast");
    const int count = mpi_count(values, "MPI_Bcast", name_);
    const MPI_Datatype type = mpi_type(values.type, "MPI_Bcast", name_);
    const auto watched = watchdog_->watch("MPI_Bcast", name_);
    check(MPI_Bcast(values.data, count, type, static_cast<int>(root), communicator_), "MPI_Bcast",
          name_);
  }

  void send(View values, int64_t peer) override {
    check_member(peer, "MPI_Send");
    const int count = mpi_count(values, "MPI_Send", name_);
    const MPI_Datatype type = mpi_type(values.type, "MPI_Send", name_);
    const auto watched = watchdog_->watch("MPI_Send", name_, world_rank(peer));
    check(MPI_Send(values.data, count, type, static_cast<int>(peer), 0, communicator_),
          "MPI_Send", name_);
  }

  void receive(View values, int64_t peer) override {
    check_member(peer, "MPI_Recv");
    const int count = mpi_count(values, "MPI_Recv", name_);
    const MPI_Datatype type = mpi_type(values.type, "MPI_Recv", name_);
    const auto watched = watchdog_->watch("MPI_Recv", name_, world_rank(peer));
    check(MPI_Recv(values.data, count, type, static_cast<int>(peer), 0, communicator_,
                   MPI_STATUS_IGNORE),
          "MPI_Recv", name_);
  }

  void exchange(std::span<const PointToPoint> transfers) override {
    if (transfers.empty()) return;
    PostedExchange posted = post_exchange(transfers);
    finish_exchange(posted);
  }

  // The same MPI_Isend/MPI_Irecv, waited for by the pending call's wait() (or its destructor,
  // which waits without reporting: no transfer outlives the caller's buffers).
  std::unique_ptr<PendingCollective> start_exchange(
      std::span<const PointToPoint> transfers) override {
    if (transfers.empty()) return finished_collective();
    return std::make_unique<StartedExchange>(*this, post_exchange(transfers));
  }

  void barrier() override {
    const auto watched = watchdog_->watch("MPI_Barrier", name_);
    check(MPI_Barrier(communicator_), "MPI_Barrier", name_);
  }

  std::unique_ptr<Communicator> split(int64_t color, int64_t key, std::string name) override {
    MPI_Comm part = MPI_COMM_NULL;
    {
      const auto watched = watchdog_->watch("MPI_Comm_split", name_);
      check(MPI_Comm_split(communicator_, static_cast<int>(color), static_cast<int>(key), &part),
            "MPI_Comm_split", name_);
    }
    return std::make_unique<MpiCommunicator>(part, std::move(name), true, watchdog_);
  }

 private:
  // A batch's requests, posted; what finish_exchange waits for and checks.
  struct PostedExchange {
    std::vector<PointToPoint> transfers;
    std::vector<int> counts;
    std::vector<MPI_Datatype> types;
    std::vector<MPI_Request> requests;
  };

  PostedExchange post_exchange(std::span<const PointToPoint> transfers) {
    // Every transfer is checked before any is posted, so bad input leaves nothing in flight.
    PostedExchange posted;
    posted.transfers.assign(transfers.begin(), transfers.end());
    for (const PointToPoint& transfer : transfers) {
      const char* call = posting_call(transfer);
      check_member(transfer.peer, call);
      if (transfer.tag < 0 || transfer.tag > tag_upper_bound_) {
        common::fail("{} in the {} group: tag {} is not one of 0 to {} (MPI_TAG_UB)", call, name_,
                     transfer.tag, tag_upper_bound_);
      }
      posted.counts.push_back(mpi_count(transfer.values, call, name_));
      posted.types.push_back(mpi_type(transfer.values.type, call, name_));
    }
    posted.requests.assign(transfers.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < transfers.size(); ++i) {
      const PointToPoint& transfer = transfers[i];
      const int peer = static_cast<int>(transfer.peer), tag = static_cast<int>(transfer.tag);
      const int status = transfer.direction == PointToPoint::Direction::send
                             ? MPI_Isend(transfer.values.data, posted.counts[i], posted.types[i],
                                         peer, tag, communicator_, &posted.requests[i])
                             : MPI_Irecv(transfer.values.data, posted.counts[i], posted.types[i],
                                         peer, tag, communicator_, &posted.requests[i]);
      if (status != MPI_SUCCESS) {
        abandon(posted.requests, transfers);
        check(status, posting_call(transfer), name_);
      }
    }
    return posted;
  }

  void finish_exchange(PostedExchange& posted) {
    const std::span<const PointToPoint> transfers = posted.transfers;
    std::vector<MPI_Request>& requests = posted.requests;
    // One MPI_Wait per transfer, in posting order, as Megatron waits on each of
    // batch_isend_irecv's requests: every transfer is already posted, so waiting on one never
    // holds up another, and the watchdog names the peer of the transfer that has not completed.
    // Not one MPI_Waitall: Open MPI 4.1's hangs (under MPI_THREAD_FUNNELED) when a request has
    // already failed before the call, e.g. a receive truncated on posting.
    std::vector<MPI_Status> statuses(transfers.size());
    for (size_t i = 0; i < transfers.size(); ++i) {
      int status = MPI_SUCCESS;
      {
        const auto watched = watchdog_->watch("MPI_Wait", name_, world_rank(transfers[i].peer));
        status = MPI_Wait(&requests[i], &statuses[i]);
      }
      if (status != MPI_SUCCESS) {
        abandon(requests, transfers);
        fail_transfer(transfers[i], status);
      }
    }
    // MPI accepts a message shorter than the receive's buffer: a sender's other count or element
    // type (fp32 into fp64) would go unnoticed, so each receive's size is checked.
    for (size_t i = 0; i < transfers.size(); ++i) {
      const PointToPoint& transfer = transfers[i];
      if (transfer.direction != PointToPoint::Direction::receive) continue;
      int received = 0;
      check(MPI_Get_count(&statuses[i], posted.types[i], &received), "MPI_Get_count", name_);
      if (received != posted.counts[i]) {
        const std::string type(element_name(transfer.values.type));
        common::fail("MPI_Irecv in the {} group: rank {} sent {} with tag {} where {} elements of "
                     "{} were expected: the two sides' sizes or element types differ",
                     name_, transfer.peer,
                     received == MPI_UNDEFINED
                         ? fmt::format("no whole number of {} elements", type)
                         : fmt::format("{} elements' worth of {}", received, type),
                     transfer.tag, transfer.values.numel, type);
      }
    }
  }

  // start_exchange's pending batch.
  class StartedExchange final : public PendingCollective {
   public:
    StartedExchange(MpiCommunicator& group, PostedExchange posted)
        : group_(&group), posted_(std::move(posted)) {}
    ~StartedExchange() override {
      if (finished_) return;
      const auto watched = group_->watchdog_->watch("MPI_Wait", group_->name_);
      for (MPI_Request& request : posted_.requests) MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
    StartedExchange(const StartedExchange&) = delete;
    StartedExchange& operator=(const StartedExchange&) = delete;
    void wait() override {
      if (finished_) return;
      finished_ = true;
      group_->finish_exchange(posted_);
    }

   private:
    MpiCommunicator* group_;
    PostedExchange posted_;
    bool finished_ = false;
  };

  std::vector<int> shard_counts(int64_t numel) const {
    std::vector<int> counts(static_cast<size_t>(size_));
    for (int64_t r = 0; r < size_; ++r) {
      counts[static_cast<size_t>(r)] = static_cast<int>(shard_range(numel, size_, r).numel);
    }
    return counts;
  }
  static const char* posting_call(const PointToPoint& transfer) {
    return transfer.direction == PointToPoint::Direction::send ? "MPI_Isend" : "MPI_Irecv";
  }
  // After a failure, leaves nothing in flight that could later write into (or read from) the
  // caller's views: the pending receives are cancelled (one not yet matched ends at once) and
  // every pending request is waited for; a send (whose cancelling MPI 4.0 deprecates) completes
  // when its peer receives it, under the watchdog. Their own errors are ignored: the first
  // failure is the one reported.
  void abandon(std::vector<MPI_Request>& requests, std::span<const PointToPoint> transfers) {
    const auto watched = watchdog_->watch("MPI_Wait", name_);
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i] != MPI_REQUEST_NULL &&
          transfers[i].direction == PointToPoint::Direction::receive) {
        MPI_Cancel(&requests[i]);
      }
    }
    for (MPI_Request& request : requests) MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
  [[noreturn]] void fail_transfer(const PointToPoint& transfer, int error) const {
    int error_class = 0;
    MPI_Error_class(error, &error_class);
    const bool send = transfer.direction == PointToPoint::Direction::send;
    if (error_class == MPI_ERR_TRUNCATE && !send) {
      common::fail("MPI_Irecv in the {} group: rank {} sent more than the {} elements of {} "
                   "expected with tag {}: the two sides' sizes or element types differ",
                   name_, transfer.peer, transfer.values.numel,
                   element_name(transfer.values.type), transfer.tag);
    }
    char message[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(error, message, &length);
    common::fail("{} {} rank {} (tag {}) in the {} group failed: {}", posting_call(transfer),
                 send ? "to" : "from", transfer.peer, transfer.tag, name_,
                 std::string(message, length));
  }
  int64_t world_rank(int64_t member) const { return world_ranks_[static_cast<size_t>(member)]; }

  MPI_Comm communicator_;
  std::string name_;
  bool owned_;
  std::shared_ptr<CollectiveWatchdog> watchdog_;
  int64_t rank_ = 0;
  int64_t size_ = 1;
  int64_t tag_upper_bound_ = 32767;  // MPI_TAG_UB's value; MPI's guaranteed least until read
  std::vector<int> world_ranks_;  // member → world rank
};

// What the watchdog does when a call has waited too long: this rank's line on stderr, then the
// end of this process with status 2. Not MPI_Abort: MPI runs MPI_THREAD_FUNNELED (only the main
// thread calls MPI, MPI 4.0 §11.6.3), and the main thread is inside the call that waits, so
// MPI_Abort from the watchdog's thread would be a second thread in the library, which only
// MPI_THREAD_MULTIPLE permits (and Open MPI may hold locks there that MPI_Abort needs).
// Leaving the process is safe from any thread, and is what the launchers act on: mpirun ends
// the whole job when one rank exits non-zero (killing a stopped rank too), as srun does with
// --kill-on-bad-exit=1; without it every rank that waits times out on its own
// (docs/parallelism.md, "Failure behaviour"). end_this_rank (collective_watchdog.hpp) does that.

class OpenMpiSession final : public MpiSession {
 public:
  OpenMpiSession(int& argc, char**& argv, const ProcessEnvironment& process)
      : watchdog_(std::make_shared<CollectiveWatchdog>(
            fmt::format("rank {} (host {})", process.rank,
                        process.node.empty() ? "unknown" : process.node),
            CollectiveWatchdog::Clock::now, end_this_rank)) {
    // The watchdog runs from before MPI_Init_thread (which waits for every rank to start) to
    // after MPI_Finalize (which waits for every rank to finish).
    watchdog_->start();
    int provided = 0;
    // Funneled: only the main thread calls MPI (OpenMP threads compute between the calls, the
    // watchdog's thread never calls it).
    const auto watched = watchdog_->watch("MPI_Init_thread", "world");
    const int status = MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    if (status != MPI_SUCCESS) common::fail("MPI_Init_thread failed (status {})", status);
  }
  ~OpenMpiSession() override {
    {
      const auto watched = watchdog_->watch("MPI_Finalize", "world");
      MPI_Finalize();
    }
    watchdog_->stop();
  }
  OpenMpiSession(const OpenMpiSession&) = delete;
  OpenMpiSession& operator=(const OpenMpiSession&) = delete;

  std::unique_ptr<Communicator> world() override {
    return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", false, watchdog_);
  }
  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);  // MPI_Abort does not return; this is for the compiler
  }
  void set_timeout_minutes(double minutes) override { watchdog_->set_timeout_minutes(minutes); }

 private:
  // Shared with the communicators, which the session outlives in main.
  std::shared_ptr<CollectiveWatchdog> watchdog_;
};

}  // namespace

std::unique_ptr<MpiSession> start_mpi_session(int& argc, char**& argv,
                                              const ProcessEnvironment& process) {
  return std::make_unique<OpenMpiSession>(argc, argv, process);
}

}  // namespace backend
