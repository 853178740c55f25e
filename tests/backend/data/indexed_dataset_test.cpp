// MMapIndexedDataset: the writer's bytes checked by a parser written here from the format
// description (not the reader under test), the reader's checks on damaged files, merging, and
// crash safety (no file under a final name, and no temporary, unless finalize() ran).
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/indexed_dataset.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using namespace backend;
using test_support::directory_entries;
using test_support::TemporaryDirectory;

namespace {

std::vector<unsigned char> read_unsigned_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::filesystem::path& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// The .idx layout as Megatron's _IndexWriter writes it, parsed field by field.
struct ParsedIndex {
  std::string magic;
  uint64_t version = 0;
  uint8_t dtype_code = 0;
  uint64_t sequence_count = 0, document_index_count = 0;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, documents;
  size_t trailing_bytes = 0;
};

template <typename T>
T take(const std::vector<unsigned char>& bytes, size_t& offset) {
  REQUIRE(offset + sizeof(T) <= bytes.size());
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  offset += sizeof(T);
  return value;
}

ParsedIndex parse_index(const std::vector<unsigned char>& bytes) {
  ParsedIndex index;
  REQUIRE(bytes.size() >= 34);
  index.magic.assign(reinterpret_cast<const char*>(bytes.data()), 9);
  size_t offset = 9;
  index.version = take<uint64_t>(bytes, offset);
  index.dtype_code = take<uint8_t>(bytes, offset);
  index.sequence_count = take<uint64_t>(bytes, offset);
  index.document_index_count = take<uint64_t>(bytes, offset);
  for (uint64_t i = 0; i < index.sequence_count; ++i) index.lengths.push_back(take<int32_t>(bytes, offset));
  for (uint64_t i = 0; i < index.sequence_count; ++i) index.pointers.push_back(take<int64_t>(bytes, offset));
  for (uint64_t i = 0; i < index.document_index_count; ++i) {
    index.documents.push_back(take<int64_t>(bytes, offset));
  }
  index.trailing_bytes = bytes.size() - offset;
  return index;
}

}  // namespace

TEST_CASE("the writer produces Megatron's .idx layout and the .bin tokens") {
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "data").string();
  {
    IndexedDatasetWriter writer(prefix, DType::uint16);
    writer.add_document(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{3});
    writer.add_document(std::vector<int32_t>{}, std::vector<int32_t>{});  // empty document
    writer.add_document(std::vector<int32_t>{65535, 0, 7, 8, 9}, std::vector<int32_t>{2, 3});
    CHECK(writer.document_count() == 3);
    CHECK(writer.sequence_count() == 3);
    CHECK(writer.token_count() == 8);
    writer.finalize();
  }
  CHECK(directory_entries(directory.path) == std::vector<std::string>{"data.bin", "data.idx"});
  const ParsedIndex index = parse_index(read_unsigned_bytes(prefix + ".idx"));
  CHECK(index.magic == std::string("MMIDIDX\0\0", 9));
  CHECK(index.version == 1);
  CHECK(index.dtype_code == 8);  // uint16
  CHECK(index.sequence_count == 3);
  CHECK(index.document_index_count == 4);
  CHECK(index.lengths == std::vector<int32_t>{3, 2, 3});
  CHECK(index.pointers == std::vector<int64_t>{0, 6, 10});  // bytes: 2 per token
  CHECK(index.documents == std::vector<int64_t>{0, 1, 1, 3});
  CHECK(index.trailing_bytes == 0);
  CHECK(read_unsigned_bytes(prefix + ".bin") ==
        std::vector<unsigned char>{1, 0, 2, 0, 3, 0, 0xFF, 0xFF, 0, 0, 7, 0, 8, 0, 9, 0});

  const IndexedDataset dataset(prefix);
  CHECK(dataset.dtype() == DType::uint16);
  CHECK(dataset.sequence_count() == 3);
  CHECK(dataset.document_count() == 3);
  CHECK(dataset.document_index(2) == 1);
  std::vector<int32_t> tokens(3);
  dataset.read_tokens(2, 0, tokens);
  CHECK(tokens == std::vector<int32_t>{7, 8, 9});
  std::vector<int32_t> middle(1);
  dataset.read_tokens(1, 1, middle);
  CHECK(middle == std::vector<int32_t>{0});
  CHECK_THROWS_AS(dataset.read_tokens(1, 1, tokens), common::Error);
  CHECK_THROWS_AS(dataset.read_tokens(3, 0, middle), common::Error);
}

TEST_CASE("int32 datasets, token range checks and dtype choice") {
  CHECK(optimal_dtype(50257) == DType::uint16);
  CHECK(optimal_dtype(65499) == DType::uint16);
  CHECK(optimal_dtype(65500) == DType::int32);
  CHECK(optimal_dtype(128256) == DType::int32);
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "wide").string();
  {
    IndexedDatasetWriter writer(prefix, DType::int32);
    writer.add_document(std::vector<int32_t>{100000, 5}, std::vector<int32_t>{2});
    writer.finalize();
  }
  const ParsedIndex index = parse_index(read_unsigned_bytes(prefix + ".idx"));
  CHECK(index.dtype_code == 4);
  CHECK(read_unsigned_bytes(prefix + ".bin") ==
        std::vector<unsigned char>{0xA0, 0x86, 0x01, 0x00, 5, 0, 0, 0});
  IndexedDatasetWriter narrow((directory.path / "narrow").string(), DType::uint16);
  CHECK_THROWS_WITH_AS(narrow.add_document(std::vector<int32_t>{70000}, std::vector<int32_t>{1}),
                       doctest::Contains("does not fit the dataset's dtype uint16"), common::Error);
}

TEST_CASE("a writer that is not finalized leaves no files behind") {
  TemporaryDirectory directory;
  {
    IndexedDatasetWriter writer((directory.path / "partial").string(), DType::uint16);
    writer.add_document(std::vector<int32_t>{1, 2}, std::vector<int32_t>{2});
    CHECK(directory_entries(directory.path).size() == 5);  // temporaries and the lock only
    for (const std::string& name : directory_entries(directory.path)) {
      CHECK((name.find(".tmp-") != std::string::npos || name == "partial.lock"));
    }
  }
  CHECK(directory_entries(directory.path).empty());
  CHECK_THROWS_WITH_AS(IndexedDatasetWriter((directory.path / "no/such/dir/x").string(), DType::uint16),
                       doctest::Contains("cannot create"), common::Error);
  CHECK(directory_entries(directory.path).empty());
}

TEST_CASE("one writer per prefix at a time — what a killed writer left is removed") {
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "shared").string();
  // Temporaries of a run killed earlier (any pid: under the lock no writer of them is alive),
  // and a file of another prefix that merely starts alike, which stays.
  for (const char* name : {"shared.bin.tmp-999999", "shared.idx.tmp-12", "shared.idx.pointers.tmp-12",
                           "shared.idx.documents.tmp-12", "shared_other.bin.tmp-12"}) {
    write_bytes(directory.path / name, {1, 2, 3});
  }
  {
    IndexedDatasetWriter first(prefix, DType::uint16);
    CHECK(directory_entries(directory.path).size() == 6);  // 4 temporaries, the lock, the other
    CHECK(std::filesystem::exists(directory.path / "shared_other.bin.tmp-12"));
    CHECK(!std::filesystem::exists(directory.path / "shared.idx.tmp-12"));
    // A second writer of the prefix (here another file description; a second process alike)
    // is refused, naming the holder.
    const std::string holder = "(pid " + std::to_string(::getpid()) + " on ";
    CHECK_THROWS_WITH_AS(IndexedDatasetWriter(prefix, DType::uint16),
                         doctest::Contains(("another process " + holder).c_str()), common::Error);
    CHECK_THROWS_WITH_AS(IndexedDatasetWriter(prefix, DType::uint16),
                         doctest::Contains((prefix + ".lock").c_str()), common::Error);
    // Another prefix in the same directory is free (job arrays write shards side by side).
    IndexedDatasetWriter other((directory.path / "shared_other").string(), DType::uint16);
    first.add_document(std::vector<int32_t>{1, 2}, std::vector<int32_t>{2});
    first.finalize();
  }
  // After finalize the lock is gone and the next writer of the prefix may start.
  CHECK(!std::filesystem::exists(prefix + ".lock"));
  IndexedDatasetWriter next(prefix, DType::uint16);
  next.finalize();
  CHECK(IndexedDataset(prefix).document_count() == 0);
}

TEST_CASE("merging datasets concatenates documents and checks the dtype") {
  TemporaryDirectory directory;
  const std::string a = (directory.path / "a").string(), b = (directory.path / "b").string();
  {
    IndexedDatasetWriter writer(a, DType::uint16);
    writer.add_document(std::vector<int32_t>{1, 2}, std::vector<int32_t>{2});
    writer.add_document(std::vector<int32_t>{3}, std::vector<int32_t>{1});
    writer.finalize();
  }
  {
    IndexedDatasetWriter writer(b, DType::uint16);
    writer.add_document(std::vector<int32_t>{}, std::vector<int32_t>{});
    writer.add_document(std::vector<int32_t>{4, 5, 6}, std::vector<int32_t>{1, 2});
    writer.finalize();
  }
  const std::string merged = (directory.path / "merged").string();
  {
    IndexedDatasetWriter writer(merged, DType::uint16);
    writer.add_dataset(a);
    writer.add_dataset(b);
    writer.finalize();
  }
  const ParsedIndex index = parse_index(read_unsigned_bytes(merged + ".idx"));
  CHECK(index.lengths == std::vector<int32_t>{2, 1, 1, 2});
  CHECK(index.pointers == std::vector<int64_t>{0, 4, 6, 8});
  CHECK(index.documents == std::vector<int64_t>{0, 1, 2, 2, 4});
  CHECK(read_unsigned_bytes(merged + ".bin") ==
        std::vector<unsigned char>{1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0});

  const std::string wide = (directory.path / "wide").string();
  {
    IndexedDatasetWriter writer(wide, DType::int32);
    writer.add_document(std::vector<int32_t>{1}, std::vector<int32_t>{1});
    writer.finalize();
  }
  IndexedDatasetWriter writer((directory.path / "mixed").string(), DType::uint16);
  writer.add_dataset(a);
  CHECK_THROWS_WITH_AS(writer.add_dataset(wide), doctest::Contains("dtype int32 differs from uint16"),
                       common::Error);
}

TEST_CASE("damaged datasets are refused with the file and what is wrong") {
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "good").string();
  {
    IndexedDatasetWriter writer(prefix, DType::uint16);
    writer.add_document(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{3});
    writer.add_document(std::vector<int32_t>{4}, std::vector<int32_t>{1});
    writer.finalize();
  }
  const auto good_index = read_unsigned_bytes(prefix + ".idx");
  const auto good_data = read_unsigned_bytes(prefix + ".bin");
  const std::string bad = (directory.path / "bad").string();
  const auto error_with = [&](std::vector<unsigned char> index, std::vector<unsigned char> data) {
    write_bytes(bad + ".idx", index);
    write_bytes(bad + ".bin", data);
    try {
      IndexedDataset dataset(bad);
    } catch (const common::Error& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  CHECK(error_with(good_index, good_data).empty());

  std::filesystem::remove(bad + ".bin");
  try {
    IndexedDataset dataset(bad);
    FAIL("a missing .bin was accepted");
  } catch (const common::Error& error) {
    CHECK(std::string(error.what()).find("cannot read dataset file " + bad + ".bin") == 0);
  }
  auto index = good_index;
  index[0] = 'X';
  CHECK(error_with(index, good_data).find("not a Megatron MMapIndexedDataset index") != std::string::npos);
  index = good_index;
  index[9] = 2;
  CHECK(error_with(index, good_data).find("index version 2") != std::string::npos);
  index = good_index;
  index[17] = 9;
  CHECK(error_with(index, good_data).find("dtype code 9 is unknown") != std::string::npos);
  index = good_index;
  index.resize(20);
  CHECK(error_with(index, good_data).find("too short") != std::string::npos);
  index = good_index;
  index.pop_back();
  CHECK(error_with(index, good_data).find("need") != std::string::npos);
  auto data = good_data;
  data.resize(6);
  const std::string not_one_pair = bad + ".bin (6 bytes) and " + bad + ".idx are not one pair";
  CHECK(error_with(good_index, data).find(not_one_pair) == 0);
  // A .bin longer than its .idx describes: the .bin of another run beside this .idx.
  data = good_data;
  data.insert(data.end(), {7, 0});
  CHECK(error_with(good_index, data) ==
        bad + ".bin (10 bytes) and " + bad + ".idx are not one pair: the index's 2 sequences end "
        "at byte 8, and the .bin holds 2 more; they were written by different runs, or a write "
        "was interrupted. Write the dataset again (preprocess_data)");
  index = good_index;
  index[index.size() - 8] = 1;  // the last document index: 1 instead of 2
  CHECK(error_with(index, good_data).find("document index 2 is 1") != std::string::npos);
}

// Input tests/fuzz/indexed_dataset_fuzzer.cpp found, reduced by hand: the message for a
// sequence past the end of the .bin added its pointer and byte count, which overflowed int64
// for a pointer near 2^63 (undefined behaviour; UBSan).
TEST_CASE("fuzz finding: a sequence pointer near 2^63 is refused with its numbers") {
  TemporaryDirectory directory;
  const std::string prefix = (directory.path / "far").string();
  {
    IndexedDatasetWriter writer(prefix, DType::int32);
    writer.add_document(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{3});
    writer.finalize();
  }
  auto index = read_unsigned_bytes(prefix + ".idx");
  const int64_t far = std::numeric_limits<int64_t>::max();
  std::memcpy(index.data() + 34 + 4, &far, sizeof(far));  // sequence 0's pointer
  write_bytes(prefix + ".idx", index);
  CHECK_THROWS_WITH_AS(IndexedDataset dataset(prefix),
                       doctest::Contains("(3 tokens from byte 9223372036854775807)"),
                       common::Error);
}
