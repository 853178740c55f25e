// MD5 against RFC 1321's test suite (appendix A.5) and against Python's hashlib on inputs whose
// lengths sit on the padding boundaries (55/56 and 119/120 bytes need one more block).
#include <doctest/doctest.h>

#include <string>

#include "backend/common/md5.hpp"

TEST_CASE("md5_hex reproduces RFC 1321's test suite") {
  CHECK(common::md5_hex("") == "d41d8cd98f00b204e9800998ecf8427e");
  CHECK(common::md5_hex("a") == "0cc175b9c0f1b6a831c399e269772661");
  CHECK(common::md5_hex("abc") == "900150983cd24fb0d6963f7d28e17f72");
  CHECK(common::md5_hex("message digest") == "f96b697d7cb7938d525a2f31aaf161d0");
  CHECK(common::md5_hex("abcdefghijklmnopqrstuvwxyz") == "c3fcd3d76192e4007dfb496cca67e13b");
  CHECK(common::md5_hex("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") ==
        "d174ab98d277d9f5a5611c2c9f419d9f");
  CHECK(common::md5_hex("1234567890123456789012345678901234567890123456789012345678901234567890"
                        "1234567890") == "57edf4a22be3c955ac49da2e2107b67a");
}

TEST_CASE("md5_hex matches hashlib across the padding boundaries") {
  // hashlib.md5(bytes((i * 7 + 3) % 256 for i in range(n))).hexdigest()
  const std::pair<int, const char*> expected[] = {
      {55, "52c0e574e1198de5fe3f8f11440dcb1b"},  {56, "46c9907fc908ee68b1e7b8e71286a518"},
      {63, "a62f6d59e837867693f042f5b8f5a236"},  {64, "7160b8fb5e9e4023d549c3971fbaeead"},
      {65, "70bd662e7aefbda85a0f7244167b7897"},  {119, "e84905d4214f4d1ca56c2cdcc152b143"},
      {120, "e3eb5a6c8669ea01a8c185b8abc8a5dc"}, {1000, "10046f077f2082ac19676b8079f1cb1a"}};
  for (const auto& [length, digest] : expected) {
    std::string bytes;
    for (int i = 0; i < length; ++i) bytes.push_back(static_cast<char>((i * 7 + 3) % 256));
    const int byte_count = length;  // clang 14 cannot capture a structured binding (CAPTURE)
    CAPTURE(byte_count);
    CHECK(common::md5_hex(bytes) == digest);
  }
}
