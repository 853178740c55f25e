// libFuzzer target: the tar reader (backend/ckpt/tar_archive.hpp: TarArchive, which opens NeMo's
// .nemo files) on arbitrary bytes as the whole file, written under /dev/shm since the reader
// memory-maps it (a gzip one is decompressed to memory). Every member it lists must read whole
// (the map is not ASan-tracked memory, so each byte is touched: one outside the file faults),
// and no name it keeps may be absolute or climb out with "..". Anything but an archive or a
// common::Error, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backend/ckpt/tar_archive.hpp"
#include "backend/common/error.hpp"
#include "tests/fuzz/scratch_file.hpp"

namespace {

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "FINDING: tar_archive_fuzzer: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz_support::ScratchFile scratch("tar_archive_fuzzer");
  scratch.write(std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const backend::TarArchive archive(scratch.path);
    for (const std::string& name : archive.names()) {
      check(!name.starts_with('/'), "an absolute member name kept");
      check(name != ".." && !name.starts_with("../") && name.find("/../") == std::string::npos &&
                !name.ends_with("/.."),
            "a member name climbing out kept");
      check(archive.has(name), "a listed member not found");
      unsigned checksum = 0;
      for (const std::byte byte : archive.member(name)) checksum ^= static_cast<unsigned>(byte);
      (void)checksum;
    }
  } catch (const common::Error&) {
  }
  return 0;
}
