// splitmix64 (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number generators"):
// the one counter-based generator of the project. Output i of the stream keyed by k is
// mix(k + (i + 1)·γ), so any element of any stream is computed directly from (key, index):
// parameter initialisation, dropout masks and mock tokens are reproducible whatever the thread
// count or device, and regenerating a value costs the same as storing it. constexpr header
// code, so a CUDA twin computes the same numbers.
#pragma once

#include <cstdint>

#include "backend/common/modular_arithmetic.hpp"

namespace common {

inline constexpr uint64_t kSplitmixIncrement = 0x9E3779B97F4A7C15ull;  // γ, the golden ratio

// splitmix64's finaliser: a bijective mix of 64 bits (products modulo 2^64).
COMMON_MODULAR_ARITHMETIC constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The counter-th output of the splitmix64 stream whose state starts at `key`.
COMMON_MODULAR_ARITHMETIC constexpr uint64_t splitmix64_at(uint64_t key, uint64_t counter) {
  return splitmix64_mix(key + (counter + 1) * kSplitmixIncrement);
}

}  // namespace common
