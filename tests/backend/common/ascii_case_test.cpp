// common::ascii_lowercase: A-Z only, so UTF-8 and the other bytes pass through unchanged.
#include <doctest/doctest.h>

#include "backend/common/ascii_case.hpp"

TEST_CASE("ascii_lowercase lowers A-Z and keeps every other byte") {
  CHECK(common::ascii_lowercase("LayerNorm") == "layernorm");
  CHECK(common::ascii_lowercase("RMSNorm1p_-09") == "rmsnorm1p_-09");
  CHECK(common::ascii_lowercase("") == "");
  // "ÄÖ İ" in UTF-8: multi-byte sequences and bytes ≥ 0x80 are not letters here.
  CHECK(common::ascii_lowercase("\xC3\x84\xC3\x96 \xC4\xB0X") == "\xC3\x84\xC3\x96 \xC4\xB0x");
  CHECK(common::ascii_lowercase(std::string_view("A\0B", 3)) == std::string("a\0b", 3));
}
