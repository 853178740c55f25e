// CRC-32C, slicing-by-8 (Kounavis & Berry 2008): eight 256-entry tables, table[k][b] is the
// CRC of byte b followed by k zero bytes, so eight input bytes fold into the register per
// step. See crc32c.hpp.
#include "backend/common/crc32c.hpp"

#include <array>
#include <cstring>

namespace common {
namespace {

constexpr uint32_t kReflectedPolynomial = 0x82F63B78u;

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kReflectedPolynomial : 0u);
    tables[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (size_t k = 1; k < 8; ++k) {
      const uint32_t previous = tables[k - 1][b];
      tables[k][b] = (previous >> 8) ^ tables[0][previous & 0xFFu];
    }
  }
  return tables;
}

constexpr Tables kTables = make_tables();

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    uint32_t low = 0, high = 0;
    std::memcpy(&low, p, 4);  // little-endian host (x86-64, aarch64)
    std::memcpy(&high, p + 4, 4);
    low ^= c;
    c = kTables[7][low & 0xFFu] ^ kTables[6][(low >> 8) & 0xFFu] ^
        kTables[5][(low >> 16) & 0xFFu] ^ kTables[4][low >> 24] ^ kTables[3][high & 0xFFu] ^
        kTables[2][(high >> 8) & 0xFFu] ^ kTables[1][(high >> 16) & 0xFFu] ^
        kTables[0][high >> 24];
    p += 8;
    size -= 8;
  }
  for (; size > 0; --size) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
  return ~c;
}

uint32_t crc32c(std::span<const std::byte> bytes, uint32_t crc) {
  return crc32c(bytes.data(), bytes.size(), crc);
}

}  // namespace common
