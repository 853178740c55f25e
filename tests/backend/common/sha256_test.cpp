// SHA-256 against FIPS 180-2's example messages (Appendix B: "abc", the 448-bit two-block
// message, a million 'a') and the empty string, then against coreutils' `sha256sum` on random
// data of every length around the block and padding boundaries, fed in pieces of every size.
#include "backend/common/sha256.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "temporary_directory.hpp"

namespace {

std::string sha256sum_of_file(const std::string& path) {
  const std::string command = "sha256sum '" + path + "'";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char digest[65] = {};
  const size_t read = fread(digest, 1, 64, pipe);
  pclose(pipe);
  REQUIRE(read == 64);
  return digest;
}

}  // namespace

TEST_CASE("sha256 gives FIPS 180-2's digests for its example messages") {
  CHECK(common::sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(common::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(common::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  common::Sha256 million;
  const std::string thousand(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.update(thousand);
  CHECK(million.finish_hex() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // finish() resets: the same object hashes the next message from scratch.
  million.update("abc");
  CHECK(million.finish_hex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("sha256 agrees with coreutils' sha256sum across block boundaries and piece sizes") {
  if (std::system("command -v sha256sum >/dev/null 2>&1") != 0) {
    MESSAGE("skipping: sha256sum (coreutils) not on PATH");
    return;
  }
  test_support::TemporaryDirectory directory;
  std::mt19937 random(20240611);
  for (size_t length : {1u, 55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 127u, 128u, 129u, 1000u, 70000u}) {
    CAPTURE(length);
    std::string data(length, '\0');
    for (char& c : data) c = static_cast<char>(random() & 0xFF);
    const std::string path = (directory.path / "data.bin").string();
    std::ofstream(path, std::ios::binary) << data;
    const std::string expected = sha256sum_of_file(path);
    CHECK(common::sha256_hex(data) == expected);
    for (size_t piece : {1u, 3u, 63u, 64u, 65u, 4096u}) {
      common::Sha256 hash;
      for (size_t at = 0; at < data.size(); at += piece) {
        hash.update(data.data() + at, std::min(piece, data.size() - at));
      }
      CHECK(hash.finish_hex() == expected);
    }
  }
}

TEST_CASE("is_sha256_hex accepts 64 hex digits only") {
  CHECK(common::is_sha256_hex(std::string(64, 'a')));
  CHECK(common::is_sha256_hex("E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855"));
  CHECK_FALSE(common::is_sha256_hex(std::string(63, 'a')));
  CHECK_FALSE(common::is_sha256_hex(std::string(65, 'a')));
  CHECK_FALSE(common::is_sha256_hex(std::string(63, 'a') + "g"));
  CHECK_FALSE(common::is_sha256_hex(""));
}
