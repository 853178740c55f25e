// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78; RFC 3720 §B.4), the one
// checksum of the project: checkpoints checksum every tensor with it, and TensorBoard's
// TFRecord framing needs it (with TFRecord's mask, tensorflow/core/lib/hash/crc32c.h):
//   masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8
// Table-driven, slicing by 8 bytes; about 1–2 GB/s, enough next to the disk it guards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/common/modular_arithmetic.hpp"

namespace common {

// CRC-32C of `bytes`, continuing from `crc` (0 for a fresh checksum), so a large buffer can be
// checksummed in pieces: crc32c(b, crc32c(a)) == crc32c(a ++ b).
uint32_t crc32c(std::span<const std::byte> bytes, uint32_t crc = 0);
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// TFRecord's masked CRC (a CRC of data that itself holds CRCs is weak, hence the rotation),
// modulo 2^32.
COMMON_MODULAR_ARITHMETIC constexpr uint32_t mask_crc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace common
