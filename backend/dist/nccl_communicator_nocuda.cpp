// The NCCL communicator in a build without CUDA or NCCL (backend/CMakeLists.txt picks this
// file then): refused with what to do instead. The bootstrap (nccl_world.cpp) is built either
// way.
#include "backend/common/error.hpp"
#include "backend/device/cuda_device.hpp"
#include "backend/dist/nccl_communicator.hpp"

namespace backend {
namespace {

[[noreturn]] void built_without_nccl(const char* what) {
  common::fail(
      "{} needs NCCL, but pretrain_gpt was built without CUDA/NCCL (rebuild with the "
      "CUDA toolkit on PATH and NCCL ≥ 2.18 installed, e.g. Debian's libnccl-dev; CPU "
      "ranks use MPI)",
      what);
}

}  // namespace

NcclUniqueId make_nccl_unique_id() {
  built_without_nccl("an NCCL unique id");
}

std::unique_ptr<Communicator> make_nccl_communicator(Device& device, const NcclUniqueId&, int64_t,
                                                     int64_t, std::string name,
                                                     std::chrono::milliseconds) {
  cuda_placement(device);  // a device that is no GPU is named as such in every build
  built_without_nccl(("the NCCL " + name + " group").c_str());
}

}  // namespace backend
