// libFuzzer target: torch.save's zip format (backend/ckpt/torch_checkpoint.cpp) on arbitrary
// bytes as a file. Opening must succeed or fail with common::Error; on success every tensor in
// the pickled tree is read (tensor() checks it against its storage, tensor_values gathers its
// elements), again only succeeding or failing with common::Error. Any other exception, a crash,
// a sanitizer report or an allocation beyond run_fuzzer.sh's -malloc_limit_mb is a finding.
#include <cstddef>
#include <cstdint>

#include "backend/ckpt/torch_checkpoint.hpp"
#include "backend/common/error.hpp"

namespace {

constexpr backend::PickleLimits kLimits{.max_values = 100000, .max_depth = 32};

// Reads each tensor under `value` (the tree is finite and at most kLimits.max_depth deep: the
// reader checked it).
void read_tensors(const backend::TorchCheckpointFile& file, const backend::PickleValue& value) {
  if (backend::TorchCheckpointFile::is_tensor(value)) {
    try {
      const backend::TorchTensor tensor = file.tensor(value, "fuzzed tensor");
      if (tensor.numel() <= 4096) file.tensor_values(tensor);
    } catch (const common::Error&) {
    }
    return;
  }
  for (const auto& item : value.items) read_tensors(file, *item);
  for (const auto& [key, item] : value.entries) read_tensors(file, *item);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const backend::TorchCheckpointFile file({reinterpret_cast<const std::byte*>(data), size},
                                            "fuzz.pt", kLimits);
    read_tensors(file, file.root());
  } catch (const common::Error&) {
  }
  return 0;
}
