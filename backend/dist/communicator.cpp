// The one-process communicator; see communicator.hpp.
#include "backend/dist/communicator.hpp"

#include <algorithm>
#include <cstring>

#include "backend/common/error.hpp"
#include "backend/core/element_type.hpp"

namespace backend {

ShardRange shard_range(int64_t numel, int64_t members, int64_t rank) {
  if (members < 1 || rank < 0 || rank >= members || numel < 0) {
    common::fail("shard_range: rank {} of {} members, {} elements", rank, members, numel);
  }
  const int64_t base = numel / members, longer = numel % members;
  return {.offset = rank * base + std::min(rank, longer), .numel = base + (rank < longer ? 1 : 0)};
}

int64_t shard_member_holding(int64_t numel, int64_t members, int64_t element) {
  if (members < 1 || element < 0 || element >= numel) {
    common::fail("shard_member_holding: element {} of {} elements over {} members", element, numel,
                 members);
  }
  // The first `longer` shards hold base + 1 elements each, the others base (base > 0 there:
  // with base == 0 every element is in the longer shards). longer × (base + 1) <= numel.
  const int64_t base = numel / members, longer = numel % members;
  const int64_t in_longer = longer * (base + 1);
  return element < in_longer ? element / (base + 1) : longer + (element - in_longer) / base;
}

double all_reduce_sum(Communicator& group, double value) {
  if (group.size() > 1) group.all_reduce(host_view(std::span(&value, 1)), ReduceOperation::sum);
  return value;
}

namespace {

class CompletedCollective final : public Communicator::PendingCollective {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<Communicator::PendingCollective> finished_collective() {
  return std::make_unique<CompletedCollective>();
}

void Communicator::check_member(int64_t rank, const char* call) const {
  if (rank < 0 || rank >= size()) {
    common::fail("{} in the {} group: rank {} is not one of its {} members", call, name(), rank,
                 size());
  }
}

void Communicator::same_type(const View& output, const View& input, const char* call) const {
  if (output.type != input.type) {
    common::fail("{} in the {} group: {} in, {} out", call, name(), element_name(input.type),
                 element_name(output.type));
  }
}

void Communicator::check_counts(const View& part, const View& whole,
                                std::span<const int64_t> counts, const char* call) const {
  same_type(part, whole, call);
  if (static_cast<int64_t>(counts.size()) != size()) {
    common::fail("{} in the {} group: {} counts for {} members", call, name(), counts.size(),
                 size());
  }
  int64_t total = 0;
  for (const int64_t count : counts) {
    if (count < 0) common::fail("{} in the {} group: a count of {}", call, name(), count);
    total += count;
  }
  if (total != whole.numel || counts[static_cast<size_t>(rank())] != part.numel) {
    common::fail(
        "{} in the {} group: counts summing to {} for a whole of {} elements, rank {}'s {} "
        "for its part of {}",
        call, name(), total, whole.numel, rank(), counts[static_cast<size_t>(rank())], part.numel);
  }
}

std::unique_ptr<Communicator::PendingCollective> Communicator::start_all_reduce(
    View values, ReduceOperation operation) {
  all_reduce(values, operation);
  return finished_collective();
}

std::unique_ptr<Communicator::PendingCollective> Communicator::start_exchange(
    std::span<const PointToPoint> transfers) {
  exchange(transfers);
  return finished_collective();
}

namespace {

class SingleProcessCommunicator final : public Communicator {
 public:
  explicit SingleProcessCommunicator(std::string name) : name_(std::move(name)) {}
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  std::string name() const override { return name_; }
  bool queued_on_device() const override { return true; }  // no call queues anything
  void all_reduce(View, ReduceOperation) override {}
  void reduce_scatter(View output, View input) override { copy(output, input, "reduce_scatter"); }
  std::unique_ptr<PendingCollective> start_reduce_scatter(
      View output, View input, std::span<const int64_t> counts) override {
    check_counts(output, input, counts, "start_reduce_scatter");
    copy(output, input, "start_reduce_scatter");
    return finished_collective();
  }
  void all_gather(View output, View input) override { copy(output, input, "all_gather"); }
  std::unique_ptr<PendingCollective> start_all_gather(View output, View input,
                                                      std::span<const int64_t> counts) override {
    check_counts(input, output, counts, "start_all_gather");
    copy(output, input, "start_all_gather");
    return finished_collective();
  }
  void broadcast(View, int64_t root) override { check_peer(root, "broadcast"); }
  void send(View, int64_t peer) override { no_peer(peer, "send to"); }
  void receive(View, int64_t peer) override { no_peer(peer, "receive from"); }
  // Nothing to exchange with: an empty batch is a batch of no transfers, anything else names
  // its first transfer.
  void exchange(std::span<const PointToPoint> transfers) override {
    if (transfers.empty()) return;
    const PointToPoint& first = transfers.front();
    const bool send = first.direction == PointToPoint::Direction::send;
    no_peer(first.peer, send ? "exchange: send to" : "exchange: receive from");
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int64_t, int64_t, std::string name) override {
    return std::make_unique<SingleProcessCommunicator>(std::move(name));
  }

 private:
  void copy(View output, View input, const char* what) const {
    if (output.bytes() != input.bytes()) {
      common::fail("{} in the {} group: {} bytes out for {} bytes in", what, name_,
                   output.bytes(), input.bytes());
    }
    if (output.on != MemoryKind::host || input.on != MemoryKind::host) {
      common::fail("{} in the one-process {} group moves host memory only", what, name_);
    }
    if (output.data != input.data && input.bytes() > 0) {
      std::memmove(output.data, input.data, static_cast<size_t>(input.bytes()));
    }
  }
  [[noreturn]] void no_peer(int64_t peer, const char* what) const {
    common::fail("{} rank {}: the one-process {} group has no other member", what, peer, name_);
  }
  void check_peer(int64_t peer, const char* what) const {
    if (peer != 0) common::fail("{} to rank {} of the one-process {} group", what, peer, name_);
  }
  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_process_communicator(std::string name) {
  return std::make_unique<SingleProcessCommunicator>(std::move(name));
}

}  // namespace backend
