// CRC-32C against the published check values (RFC 3720 §B.4 and the "123456789" check of the
// CRC catalogue), and continuation across pieces.
#include "backend/common/crc32c.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace {

uint32_t crc_of(const std::string& text) { return common::crc32c(text.data(), text.size()); }

}  // namespace

TEST_CASE("crc32c matches the catalogue check value and RFC 3720's vectors") {
  CHECK(crc_of("123456789") == 0xE3069283u);
  CHECK(crc_of("") == 0u);
  CHECK(common::crc32c(std::vector<unsigned char>(32, 0).data(), 32) == 0x8A9136AAu);
  CHECK(common::crc32c(std::vector<unsigned char>(32, 0xFF).data(), 32) == 0x62A8AB43u);
  std::vector<unsigned char> ascending(32);
  for (int i = 0; i < 32; ++i) ascending[static_cast<size_t>(i)] = static_cast<unsigned char>(i);
  CHECK(common::crc32c(ascending.data(), 32) == 0x46DD794Eu);
}

TEST_CASE("crc32c continues across pieces, whatever the split") {
  const std::string text = "The quick brown fox jumps over the lazy dog, twice over.";
  const uint32_t whole = crc_of(text);
  for (size_t split = 0; split <= text.size(); ++split) {
    const uint32_t first = common::crc32c(text.data(), split);
    CHECK(common::crc32c(text.data() + split, text.size() - split, first) == whole);
  }
}
