// libFuzzer target: Megatron's .idx reader (backend::IndexedDataset) on arbitrary bytes. The
// input is [uint16 N, little-endian][N bytes: the .bin][the rest: the .idx] (N is cut to what
// is there); both go to files under /dev/shm, since the reader memory-maps them. A dataset it
// opens must describe only bytes inside its .bin, with document indices rising from 0 to the
// sequence count, and every sequence must read back (or fail with common::Error for a token
// that is not an id). Anything else, a crash or a sanitizer report is a finding. The maps are
// not ASan-tracked memory, so the bounds are checked here explicitly.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/indexed_dataset.hpp"

namespace {

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "FINDING: indexed_dataset_fuzzer: %s\n", what);
    std::abort();
  }
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "indexed_dataset_fuzzer: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

// The .idx/.bin pair each input is written to, one per process, removed when the run ends.
struct ScratchDataset {
  std::string prefix;
  ScratchDataset() {
    const std::filesystem::path directory = std::filesystem::is_directory("/dev/shm")
                                                ? "/dev/shm"
                                                : std::filesystem::temp_directory_path();
    prefix = (directory / ("indexed_dataset_fuzzer-" + std::to_string(::getpid()))).string();
  }
  ~ScratchDataset() {
    std::error_code ignored;
    std::filesystem::remove(backend::index_file_path(prefix), ignored);
    std::filesystem::remove(backend::data_file_path(prefix), ignored);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ScratchDataset scratch;
  const std::string& prefix = scratch.prefix;
  size_t bin_size = size >= 2 ? static_cast<size_t>(data[0] | (data[1] << 8)) : 0;
  const size_t header = size >= 2 ? 2 : size;
  if (bin_size > size - header) bin_size = size - header;
  write_file(backend::data_file_path(prefix), data + header, bin_size);
  write_file(backend::index_file_path(prefix), data + header + bin_size, size - header - bin_size);

  try {
    const backend::IndexedDataset dataset(prefix);
    const int64_t item = backend::dtype_size(dataset.dtype());
    const auto bin_bytes = static_cast<int64_t>(dataset.data().size());
    check(dataset.sequence_count() >= 0 && dataset.document_count() >= 0, "negative counts");
    check(dataset.document_index(0) == 0, "the document indices do not start at 0");
    for (int64_t d = 0; d < dataset.document_count(); ++d) {
      check(dataset.document_index(d) <= dataset.document_index(d + 1),
            "the document indices fall");
    }
    check(dataset.document_index(dataset.document_count()) == dataset.sequence_count(),
          "the document indices do not end at the sequence count");
    for (int64_t s = 0; s < dataset.sequence_count(); ++s) {
      const int64_t length = dataset.sequence_length(s), pointer = dataset.sequence_pointer(s);
      check(length >= 0 && pointer >= 0 && pointer <= bin_bytes &&
                length <= (bin_bytes - pointer) / item,
            "a sequence lies outside the .bin");
      std::vector<int32_t> tokens(static_cast<size_t>(length));
      try {
        dataset.read_tokens(s, 0, tokens);
      } catch (const common::Error&) {
        // float dtypes and values that are not ids are refused with a message
      }
    }
  } catch (const common::Error&) {
  }
  return 0;
}
