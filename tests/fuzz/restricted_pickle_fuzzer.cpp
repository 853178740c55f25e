// libFuzzer target: the restricted unpickler (backend/ckpt/restricted_pickle.cpp) on arbitrary
// bytes as a pickle. It must return a tree within the limits given, or fail with common::Error;
// any other exception, a crash, a sanitizer report, a value nested deeper than the limit, a
// cycle, or an allocation beyond run_fuzzer.sh's -malloc_limit_mb is a finding. A tree that
// comes back is also read as PyTorch Distributed Checkpoint's .metadata
// (torch_distributed_checkpoint.cpp's read_distributed_checkpoint_index), which must succeed or
// fail with common::Error alike.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

#include "backend/ckpt/restricted_pickle.hpp"
#include "backend/ckpt/torch_distributed_checkpoint.hpp"
#include "backend/common/error.hpp"

namespace {

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "FINDING: restricted_pickle_fuzzer: %s\n", what);
    std::abort();
  }
}

constexpr backend::PickleLimits kLimits{.max_values = 100000, .max_depth = 32};

// Walks the tree, each value once along each path: its depth within the limit, no value inside
// itself (`open` holds the path).
void walk(const backend::PickleValue& value, int64_t depth,
          std::unordered_set<const backend::PickleValue*>& open) {
  check(depth <= kLimits.max_depth, "a value nested deeper than the limit");
  check(open.insert(&value).second, "a value inside itself");
  for (const auto& item : value.items) walk(*item, depth + 1, open);
  for (const auto& [key, item] : value.entries) {
    walk(*key, depth + 1, open);
    walk(*item, depth + 1, open);
  }
  if (value.state != nullptr) walk(*value.state, depth + 1, open);
  open.erase(&value);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  backend::PicklePointer root;
  try {
    root = backend::read_restricted_pickle({reinterpret_cast<const std::byte*>(data), size},
                                           "fuzz.pkl", kLimits);
  } catch (const common::Error&) {
    return 0;
  }
  check(root != nullptr, "no value and no error");
  std::unordered_set<const backend::PickleValue*> open;
  walk(*root, 1, open);
  try {
    backend::read_distributed_checkpoint_index(*root, "fuzz.pkl");
  } catch (const common::Error&) {
  }
  return 0;
}
