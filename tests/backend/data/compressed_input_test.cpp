// CompressedInput: plain, gzip (several members), zstd and xz read back exactly, whatever the
// read size (1-byte reads exercise the output the decoders hold back), formats told by
// content, and damaged data reported with the file name.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "backend/common/error.hpp"
#include "backend/data/compressed_input.hpp"
#include "backend/data/compressors.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using namespace backend;

namespace {

using test_support::write_file;
using test_support::gzip;
using test_support::zstd;
using test_support::xz;

std::string read_decompressed(const std::string& path, size_t read_size) {
  CompressedInput input(path);
  std::string text, chunk(read_size, '\0');
  while (const size_t got = input.read(chunk.data(), chunk.size())) text.append(chunk.data(), got);
  return text;
}

}  // namespace

TEST_CASE("compressed inputs read back exactly with any read size") {
  test_support::TemporaryDirectory directory;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "{\"text\": \"line " + std::to_string(i * 7919 % 10007) + "\"}\n";
  const auto path = [&](const char* name) { return (directory.path / name).string(); };
  write_file(path("plain.jsonl"), text);
  write_file(path("two-members.gz"), gzip(text.substr(0, 1000)) + gzip(text.substr(1000)));
  write_file(path("data.zst"), zstd(text.substr(0, 5000)) + zstd(text.substr(5000)));
  write_file(path("data.xz"), xz(text));
  write_file(path("gzip-named.jsonl"), gzip(text));  // told by content, not by name
  write_file(path("empty"), "");
  for (const char* name : {"plain.jsonl", "two-members.gz", "data.zst", "data.xz", "gzip-named.jsonl"}) {
    CAPTURE(name);
    CHECK(read_decompressed(path(name), 1 << 16) == text);
    CHECK(read_decompressed(path(name), 1) .size() == text.size());
  }
  CHECK(read_decompressed(path("two-members.gz"), 1) == text);
  CHECK(read_decompressed(path("data.xz"), 7) == text);
  CHECK(read_decompressed(path("empty"), 10).empty());
  CHECK(std::string(CompressedInput(path("gzip-named.jsonl")).format()) == "gzip");
  CHECK(std::string(CompressedInput(path("data.zst")).format()) == "zstd");
  CHECK(std::string(CompressedInput(path("data.xz")).format()) == "xz");
  CHECK(std::string(CompressedInput(path("plain.jsonl")).format()) == "plain");
}

TEST_CASE("missing, truncated and corrupt compressed inputs name the file") {
  test_support::TemporaryDirectory directory;
  const std::string text(100000, 'x');
  const auto path = [&](const char* name) { return (directory.path / name).string(); };
  CHECK_THROWS_WITH_AS(CompressedInput(path("missing.gz")),
                       doctest::Contains("cannot open --input"), common::Error);
  std::string cut = gzip(text);
  cut.resize(cut.size() - 12);
  write_file(path("cut.gz"), cut);
  CHECK_THROWS_WITH_AS(read_decompressed(path("cut.gz"), 4096), doctest::Contains("cut.gz: the gzip data ends early"),
                       common::Error);
  std::string bad = gzip(text);
  bad[3] = static_cast<char>(0xE0);  // reserved flag bits of the gzip header
  write_file(path("bad.gz"), bad);
  CHECK_THROWS_WITH_AS(read_decompressed(path("bad.gz"), 4096), doctest::Contains("bad.gz: corrupt gzip data"),
                       common::Error);
  std::string cut_zstd = zstd(text);
  cut_zstd.resize(cut_zstd.size() - 3);
  write_file(path("cut.zst"), cut_zstd);
  CHECK_THROWS_WITH_AS(read_decompressed(path("cut.zst"), 4096), doctest::Contains("cut.zst: the zstd data ends early"),
                       common::Error);
  std::string cut_xz = xz(text);
  cut_xz.resize(cut_xz.size() / 2);
  write_file(path("cut.xz"), cut_xz);
  CHECK_THROWS_WITH_AS(read_decompressed(path("cut.xz"), 4096), doctest::Contains("cut.xz"), common::Error);
}

TEST_CASE("a name that promises a compression the content lacks is refused — bzip2 is named, not copied") {
  // decompress once copied a plain file named .gz unchanged, and read bzip2 as plain text.
  test_support::TemporaryDirectory directory;
  const std::string text = "{\"text\": \"plain\"}\n";
  const auto path = [&](const char* name) { return (directory.path / name).string(); };
  write_file(path("plain.jsonl.gz"), text);
  CHECK_THROWS_WITH_AS(CompressedInput(path("plain.jsonl.gz")),
                       doctest::Contains((path("plain.jsonl.gz") + ": named .gz, but its content is not "
                                          "gzip: it is plain, uncompressed (it starts with 7b 22 74 65 78 74 22 3a)").c_str()),
                       common::Error);
  write_file(path("zstd_inside.jsonl.xz"), zstd(text));
  CHECK_THROWS_WITH_AS(CompressedInput(path("zstd_inside.jsonl.xz")),
                       doctest::Contains("named .xz, but its content is not xz: it is zstd"), common::Error);
  write_file(path("empty.gz"), "");
  CHECK_THROWS_WITH_AS(CompressedInput(path("empty.gz")),
                       doctest::Contains("named .gz, but its content is not gzip: it is empty"), common::Error);
  const std::string bzip2_header = "BZh91AY&SY";
  write_file(path("corpus.jsonl.bz2"), bzip2_header + std::string(40, '\x01'));
  CHECK_THROWS_WITH_AS(CompressedInput(path("corpus.jsonl.bz2")),
                       doctest::Contains("corpus.jsonl.bz2 is bzip2, which is not supported (gzip, zstd and xz "
                                         "are); decompress it first, e.g. bunzip2"),
                       common::Error);
  write_file(path("bzip2_inside.jsonl"), bzip2_header + std::string(40, '\x01'));
  CHECK_THROWS_WITH_AS(CompressedInput(path("bzip2_inside.jsonl")), doctest::Contains("is bzip2"), common::Error);
  write_file(path("plain.bz2"), text);
  CHECK_THROWS_WITH_AS(CompressedInput(path("plain.bz2")),
                       doctest::Contains("named .bz2, but its content is not bzip2"), common::Error);
  // Content decides where the name promises nothing: gzip named .jsonl still reads.
  write_file(path("gzip_inside.jsonl"), gzip(text));
  CHECK(read_decompressed(path("gzip_inside.jsonl"), 7) == text);
  CHECK(std::string(CompressedInput(path("gzip_inside.jsonl")).format()) == "gzip");
}
