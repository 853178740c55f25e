// libFuzzer target: the .npy reader (backend/data/npy_file.hpp: NpyArray, which maps the
// dataset index caches, doc_idx / sample_idx / shuffle_idx) on arbitrary bytes as the whole
// file, written under /dev/shm since the reader memory-maps it. An array it opens must hold
// exactly as many elements as its shape's product, and every element must read from inside
// the file (the map is not ASan-tracked memory, so that bound is checked here). Anything but
// an array or a common::Error, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "backend/common/error.hpp"
#include "backend/data/npy_file.hpp"
#include "tests/fuzz/scratch_file.hpp"

namespace {

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "FINDING: npy_file_fuzzer: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz_support::ScratchFile scratch("npy_file_fuzzer");
  scratch.write(std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const backend::NpyArray array(scratch.path);
    unsigned __int128 count = 1;
    for (const int64_t extent : array.shape()) {
      check(extent >= 0, "a negative extent");
      if (extent == 0) count = 0;
    }
    for (const int64_t extent : array.shape()) {
      if (count == 0 || count > size) break;
      count *= static_cast<uint64_t>(extent);
    }
    check(count == static_cast<uint64_t>(array.size()), "the size is not the shape's product");
    const auto item = static_cast<uint64_t>(backend::npy_element_size(array.element()));
    check(array.size() >= 0 && static_cast<uint64_t>(array.size()) * item <= size,
          "more elements than the file has bytes");
    int64_t sum = 0;
    for (int64_t i = 0; i < array.size(); ++i) sum ^= array[i];
    (void)sum;
  } catch (const common::Error&) {
  }
  return 0;
}
