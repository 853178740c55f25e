// MD5 after RFC 1321 §3: pad to 56 mod 64 bytes with 0x80 then zeros, append the bit length
// (64-bit little-endian), then four rounds of 16 operations per 64-byte block over the state
// (A, B, C, D), with the sine-derived constants T[i] = floor(2^32 · |sin(i + 1)|).
#include "backend/common/md5.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/common/modular_arithmetic.hpp"

namespace common {

namespace {

constexpr std::array<uint32_t, 64> kShifts = {
    7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
    5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
    4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
    6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};

// RFC 1321's table T, computed as the RFC defines it (every value is exact in double).
std::array<uint32_t, 64> sine_table() {
  std::array<uint32_t, 64> table{};
  for (int i = 0; i < 64; ++i) {
    table[static_cast<size_t>(i)] =
        static_cast<uint32_t>(std::floor(4294967296.0 * std::fabs(std::sin(i + 1.0))));
  }
  return table;
}

// MD5 is defined modulo 2^32 (RFC 1321): its sums and rotations wrap.
COMMON_MODULAR_ARITHMETIC uint32_t rotate_left(uint32_t x, uint32_t n) { return (x << n) | (x >> (32 - n)); }

COMMON_MODULAR_ARITHMETIC void process_block(const unsigned char* block, std::array<uint32_t, 4>& state,
                   const std::array<uint32_t, 64>& table) {
  uint32_t words[16];
  for (int i = 0; i < 16; ++i) {
    words[i] = static_cast<uint32_t>(block[4 * i]) | static_cast<uint32_t>(block[4 * i + 1]) << 8 |
               static_cast<uint32_t>(block[4 * i + 2]) << 16 |
               static_cast<uint32_t>(block[4 * i + 3]) << 24;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
  for (uint32_t i = 0; i < 64; ++i) {
    uint32_t f = 0, g = 0;
    if (i < 16) {
      f = (b & c) | (~b & d);
      g = i;
    } else if (i < 32) {
      f = (d & b) | (~d & c);
      g = (5 * i + 1) % 16;
    } else if (i < 48) {
      f = b ^ c ^ d;
      g = (3 * i + 5) % 16;
    } else {
      f = c ^ (b | ~d);
      g = (7 * i) % 16;
    }
    const uint32_t rotated = rotate_left(a + f + table[i] + words[g], kShifts[i]);
    a = d;
    d = c;
    c = b;
    b = b + rotated;
  }
  state[0] += a;
  state[1] += b;
  state[2] += c;
  state[3] += d;
}

}  // namespace

std::string md5_hex(std::string_view bytes) {
  static const std::array<uint32_t, 64> table = sine_table();
  std::array<uint32_t, 4> state = {0x67452301u, 0xefcdab89u, 0x98badcfeu, 0x10325476u};
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  size_t offset = 0;
  for (; offset + 64 <= size; offset += 64) process_block(data + offset, state, table);

  // The tail, the 0x80 marker, zeros, and the length in bits: one or two more blocks.
  unsigned char tail[128] = {};
  const size_t rest = size - offset;
  std::memcpy(tail, data + offset, rest);
  tail[rest] = 0x80;
  const size_t tail_size = rest + 1 + 8 <= 64 ? 64 : 128;
  const uint64_t bits = static_cast<uint64_t>(size) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_size - 8 + i] = static_cast<unsigned char>(bits >> (8 * i));
  for (size_t block = 0; block < tail_size; block += 64) process_block(tail + block, state, table);

  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(32);
  for (uint32_t word : state) {
    for (int i = 0; i < 4; ++i) {
      const auto byte = static_cast<unsigned char>(word >> (8 * i));
      hex.push_back(kHex[byte >> 4]);
      hex.push_back(kHex[byte & 15]);
    }
  }
  return hex;
}

}  // namespace common
