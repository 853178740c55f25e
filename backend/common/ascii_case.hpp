// ASCII lower-casing for names compared without regard to case (NeMo's `normalization:
// LayerNorm`, a SHA-256 digest, an HTTP header, sbatch's "hetjob"): bytes outside A-Z are kept,
// so UTF-8 text passes through unchanged, whatever the C locale says.
#pragma once

#include <string>
#include <string_view>

namespace common {

inline std::string ascii_lowercase(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return lower;
}

}  // namespace common
