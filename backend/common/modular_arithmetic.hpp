// COMMON_MODULAR_ARITHMETIC marks a function whose unsigned arithmetic wraps on purpose: hashes
// (MD5, SHA-256, CRC-32C) and generators (splitmix64, MT19937) are defined modulo 2^32 or 2^64.
// Wrapping is well defined in C++, but the asan preset builds with clang's integer checks
// (-fsanitize=integer: unsigned overflow, unsigned shifts past the top bit, implicit
// truncation), which exist to catch sizes and counts that wrap by mistake; this exempts only the
// functions whose definition is the wrap (docs/architecture.md, "Sanitizers and fuzzing").
// GCC has none of these checks, and warns about sanitizer names it does not know, so there the
// macro is empty.
#pragma once

#if defined(__clang__)
#define COMMON_MODULAR_ARITHMETIC \
  __attribute__((no_sanitize("unsigned-integer-overflow", "unsigned-shift-base", "implicit-conversion")))
#else
#define COMMON_MODULAR_ARITHMETIC
#endif
