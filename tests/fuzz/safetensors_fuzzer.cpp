// libFuzzer target: the safetensors reader (backend/ckpt/safetensors.cpp) on arbitrary bytes,
// given as the whole file: 8-byte header length, JSON header, data region. It must return
// tensors whose values fill their shapes, or fail with common::Error; any other exception, a
// crash, a sanitizer report or an allocation beyond run_fuzzer.sh's -malloc_limit_mb (a size
// from the file used before it is checked against the file's size) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include "backend/ckpt/safetensors.hpp"
#include "backend/common/error.hpp"

namespace {

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "FINDING: safetensors_fuzzer: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  backend::SafetensorsFile file;
  try {
    file = backend::read_safetensors(in, size, "fuzz.safetensors");
  } catch (const common::Error&) {
    return 0;
  }
  std::set<std::string> names;
  for (const backend::NamedTensor& tensor : file.tensors) {
    check(names.insert(tensor.name).second, "a tensor name is returned twice");
    check(tensor.name != "__metadata__", "__metadata__ is returned as a tensor");
    uint64_t count = 1;
    for (const int64_t dim : tensor.shape) {
      check(dim >= 0, "a negative dimension");
      count *= static_cast<uint64_t>(dim);
    }
    check(count == tensor.values.size(), "the values do not fill the shape");
    check(count <= size, "more values than the file has bytes");
  }
  return 0;
}
