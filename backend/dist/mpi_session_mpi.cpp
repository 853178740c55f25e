// MpiSession and the Open MPI communicator; see mpi_session.hpp and communicator.hpp.
// Every MPI call returns its error (MPI_ERRORS_RETURN on every communicator) and is checked:
// a failure is a common::Error naming the call, the group and MPI's message. Views must be
// host memory (CPU ranks); the element types map to MPI's (bf16 moves as 16-bit words and is
// never summed here).
#include <mpi.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
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

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm communicator, std::string name, bool owned)
      : communicator_(communicator), name_(std::move(name)), owned_(owned) {
    check(MPI_Comm_set_errhandler(communicator_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
          name_);
    int value = 0;
    check(MPI_Comm_rank(communicator_, &value), "MPI_Comm_rank", name_);
    rank_ = value;
    check(MPI_Comm_size(communicator_, &value), "MPI_Comm_size", name_);
    size_ = value;
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
    check_summable(values, "MPI_Allreduce");
    const MPI_Op op = operation == ReduceOperation::sum ? MPI_SUM : MPI_MAX;
    check(MPI_Allreduce(MPI_IN_PLACE, values.data, count,
                        mpi_type(values.type, "MPI_Allreduce", name_), op, communicator_),
          "MPI_Allreduce", name_);
  }

  void reduce_scatter(View output, View input) override {
    mpi_count(input, "MPI_Reduce_scatter", name_);
    const int count = mpi_count(output, "MPI_Reduce_scatter", name_);
    same_type(output, input, "MPI_Reduce_scatter");
    check_summable(input, "MPI_Reduce_scatter");
    const std::vector<int> counts = shard_counts(input.numel);
    if (count != counts[static_cast<size_t>(rank_)]) {
      common::fail("MPI_Reduce_scatter in the {} group: {} elements out, but rank {}'s shard of "
                   "{} is {}", name_, output.numel, rank_, input.numel,
                   counts[static_cast<size_t>(rank_)]);
    }
    check(MPI_Reduce_scatter(input.data, output.data, counts.data(),
                             mpi_type(input.type, "MPI_Reduce_scatter", name_), MPI_SUM,
                             communicator_),
          "MPI_Reduce_scatter", name_);
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
    check(MPI_Allgatherv(send, count, type, output.data, counts.data(), offsets.data(), type,
                         communicator_),
          "MPI_Allgatherv", name_);
  }

  void broadcast(View values, int64_t root) override {
    check_member(root, "MPI_Bcast");
    check(MPI_Bcast(values.data, mpi_count(values, "MPI_Bcast", name_),
                    mpi_type(values.type, "MPI_Bcast", name_), static_cast<int>(root),
                    communicator_),
          "MPI_Bcast", name_);
  }

  void send(View values, int64_t peer) override {
    check_member(peer, "MPI_Send");
    check(MPI_Send(values.data, mpi_count(values, "MPI_Send", name_),
                   mpi_type(values.type, "MPI_Send", name_), static_cast<int>(peer), 0,
                   communicator_),
          "MPI_Send", name_);
  }

  void receive(View values, int64_t peer) override {
    check_member(peer, "MPI_Recv");
    check(MPI_Recv(values.data, mpi_count(values, "MPI_Recv", name_),
                   mpi_type(values.type, "MPI_Recv", name_), static_cast<int>(peer), 0,
                   communicator_, MPI_STATUS_IGNORE),
          "MPI_Recv", name_);
  }

  void barrier() override { check(MPI_Barrier(communicator_), "MPI_Barrier", name_); }

  std::unique_ptr<Communicator> split(int64_t color, int64_t key, std::string name) override {
    MPI_Comm part = MPI_COMM_NULL;
    check(MPI_Comm_split(communicator_, static_cast<int>(color), static_cast<int>(key), &part),
          "MPI_Comm_split", name_);
    return std::make_unique<MpiCommunicator>(part, std::move(name), true);
  }

 private:
  std::vector<int> shard_counts(int64_t numel) const {
    std::vector<int> counts(static_cast<size_t>(size_));
    for (int64_t r = 0; r < size_; ++r) {
      counts[static_cast<size_t>(r)] = static_cast<int>(shard_range(numel, size_, r).numel);
    }
    return counts;
  }
  // 16-bit floats travel as 16-bit words (MPI has no bf16): moved, never summed.
  void check_summable(const View& values, const char* call) const {
    if (values.type == ElementType::bf16 || values.type == ElementType::f16) {
      common::fail("{} in the {} group: {} is not summed on CPU ranks", call, name_,
                   element_name(values.type));
    }
  }
  void same_type(const View& output, const View& input, const char* call) const {
    if (output.type != input.type) {
      common::fail("{} in the {} group: {} in, {} out", call, name_, element_name(input.type),
                   element_name(output.type));
    }
  }
  void check_member(int64_t rank, const char* call) const {
    if (rank < 0 || rank >= size_) {
      common::fail("{} in the {} group: rank {} is not one of its {} members", call, name_, rank,
                   size_);
    }
  }

  MPI_Comm communicator_;
  std::string name_;
  bool owned_;
  int64_t rank_ = 0;
  int64_t size_ = 1;
};

class OpenMpiSession final : public MpiSession {
 public:
  OpenMpiSession(int& argc, char**& argv) {
    int provided = 0;
    // Funneled: only the main thread calls MPI (OpenMP threads compute between the calls).
    const int status = MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    if (status != MPI_SUCCESS) common::fail("MPI_Init_thread failed (status {})", status);
  }
  ~OpenMpiSession() override { MPI_Finalize(); }
  OpenMpiSession(const OpenMpiSession&) = delete;
  OpenMpiSession& operator=(const OpenMpiSession&) = delete;

  std::unique_ptr<Communicator> world() override {
    return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", false);
  }
  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);  // MPI_Abort does not return; this is for the compiler
  }
};

}  // namespace

std::unique_ptr<MpiSession> start_mpi_session(int& argc, char**& argv) {
  return std::make_unique<OpenMpiSession>(argc, argv);
}

}  // namespace backend
