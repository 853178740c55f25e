// A byte stream over an input file that may be compressed: plain, gzip (.gz), zstd (.zst) or
// xz (.xz), told apart by their magic bytes rather than the file name (1F 8B; 28 B5 2F FD;
// FD 37 7A 58 5A 00), so a corpus named .jsonl that is really gzip still reads. Concatenated
// members/frames/streams (what pigz, zstd -T and parallel xz produce) are read through to the
// end. Corrupt or truncated data is a common::Error naming the file. So is a file whose name
// promises a compression (.gz, .zst, .xz, .bz2) its content does not have (a plain file named
// .gz is a failed download or a renamed file, not a corpus to read as text), and bzip2 content,
// which is recognised and refused by name (no libbz2 here) rather than read as text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace backend {

class CompressedInput {
 public:
  explicit CompressedInput(const std::string& path);
  ~CompressedInput();
  CompressedInput(const CompressedInput&) = delete;
  CompressedInput& operator=(const CompressedInput&) = delete;

  // Reads up to `capacity` decompressed bytes into `buffer`; returns 0 only at the end.
  size_t read(char* buffer, size_t capacity);

  const std::string& path() const { return path_; }
  const char* format() const;  // "plain", "gzip", "zstd" or "xz"

 private:
  struct Decoder;
  std::string path_;
  std::unique_ptr<Decoder> decoder_;
};

}  // namespace backend
