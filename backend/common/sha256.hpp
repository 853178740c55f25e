// SHA-256 (FIPS 180-4, §6.2), for verifying downloads against published checksums
// (`sha256sum` files, Hugging Face's LFS oids). Incremental: update() any number of times,
// then finish(). Plain portable code, one 64-byte block at a time (about 200–300 MB/s), which
// keeps pace with the network it checks; no third-party code and no new dependency.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace common {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  // The digest; the object is then reset, ready for a new message.
  std::array<uint8_t, 32> finish();
  // The digest as 64 lowercase hexadecimal digits (sha256sum's form).
  std::string finish_hex();
  void reset();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_;
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// SHA-256 of a whole string, as lowercase hex.
std::string sha256_hex(std::string_view bytes);

// True when `text` is 64 hexadecimal digits (either case): a well-formed SHA-256 digest.
bool is_sha256_hex(std::string_view text);

}  // namespace common
