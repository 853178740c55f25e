// The checkpoint file format: a round trip keeps every byte, the layout is the documented one
// (docs/checkpoints.md), and each kind of damage (magic, version, truncation anywhere, a
// flipped bit in a block or a tensor, a table entry whose shape wraps, trailing bytes) is
// refused naming the file and, where one is at fault, the tensor, and leaves no descriptor
// open.
#include "backend/ckpt/checkpoint_file.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "backend/common/crc32c.hpp"
#include "backend/common/error.hpp"
#include "temporary_directory.hpp"

using namespace backend;
namespace fs = std::filesystem;

namespace {

struct Sample {
  std::vector<float> embedding, bias;
  nlohmann::json metadata = {{"iteration", 7}, {"args", {{"hidden_size", "4"}}}};
  std::vector<CheckpointTensor> tensors() const {
    return {{"embedding.word_embeddings.weight", {3, 4}, embedding},
            {"decoder.final_layernorm.bias", {4}, bias}};
  }
  Sample() {
    for (int i = 0; i < 12; ++i) embedding.push_back(0.25f * static_cast<float>(i) - 1.0f);
    bias = {1.5f, -2.0f, 3.25f, 1e-30f};
  }
};

std::vector<char> read_file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
T field(const std::vector<char>& bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

// The process's open file descriptors.
size_t open_descriptors() {
  return static_cast<size_t>(
      std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator()));
}

std::string open_error(const fs::path& path) {
  try {
    CheckpointFileReader reader(path);
    for (const auto& entry : reader.tensors()) reader.read_bytes(entry);
  } catch (const common::Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a checkpoint file round-trips metadata and tensors bit for bit") {
  test_support::TemporaryDirectory directory;
  const fs::path file = directory.path / "model_optim_rng.bin";
  const Sample sample;
  write_checkpoint_file(file, sample.metadata, sample.tensors());

  CheckpointFileReader reader(file);
  CHECK(reader.format_version() == kCheckpointFormatVersion);
  CHECK(reader.metadata() == sample.metadata);
  REQUIRE(reader.tensors().size() == 2);
  const TensorEntry& embedding = reader.tensors()[0];
  CHECK(embedding.name == "embedding.word_embeddings.weight");
  CHECK(embedding.shape == std::vector<int64_t>{3, 4});
  CHECK(embedding.size == 48);
  CHECK(embedding.offset == 0);
  CHECK(reader.tensors()[1].offset == 64);  // 64-byte aligned
  CHECK(reader.tensors()[1].crc32c == common::crc32c(sample.bias.data(), 16));
  std::vector<float> values(12);
  reader.read(embedding, values);
  CHECK(std::memcmp(values.data(), sample.embedding.data(), 48) == 0);
  std::vector<float> bias(4);
  reader.read(*reader.find("decoder.final_layernorm.bias"), bias);
  CHECK(bias == sample.bias);
  CHECK(reader.find("no.such.tensor") == nullptr);
  std::vector<float> wrong_size(5);
  CHECK_THROWS_AS(reader.read(embedding, wrong_size), common::Error);
}

TEST_CASE("the header is the documented 64 bytes: magic, version, sizes, checksums") {
  test_support::TemporaryDirectory directory;
  const fs::path file = directory.path / "model_optim_rng.bin";
  const Sample sample;
  write_checkpoint_file(file, sample.metadata, sample.tensors());
  const auto bytes = read_file_bytes(file);
  CHECK(std::string(bytes.data(), 8) == "MNATCKPT");
  CHECK(field<uint32_t>(bytes, 8) == 1);   // format version
  CHECK(field<uint32_t>(bytes, 12) == 64); // header size
  const auto metadata_size = field<uint64_t>(bytes, 16);
  const auto table_size = field<uint64_t>(bytes, 24);
  const auto data_offset = field<uint64_t>(bytes, 32);
  const auto data_size = field<uint64_t>(bytes, 40);
  CHECK(data_offset % 64 == 0);
  CHECK(data_offset >= 64 + metadata_size + table_size);
  CHECK(bytes.size() == data_offset + data_size);
  CHECK(data_size == 128);  // 48 bytes padded to 64, then 16 padded to 64
  // The metadata is JSON text right after the header; its CRC-32C is at byte 48.
  const std::string metadata(bytes.data() + 64, metadata_size);
  CHECK(nlohmann::json::parse(metadata) == sample.metadata);
  CHECK(field<uint32_t>(bytes, 48) == common::crc32c(metadata.data(), metadata.size()));
  CHECK(field<uint32_t>(bytes, 52) ==
        common::crc32c(bytes.data() + 64 + metadata_size, table_size));
  CHECK(field<uint32_t>(bytes, 60) == common::crc32c(bytes.data(), 60));
  // The table starts with the tensor count, then the first name, length-prefixed.
  const size_t table = 64 + metadata_size;
  CHECK(field<uint64_t>(bytes, table) == 2);
  CHECK(field<uint32_t>(bytes, table + 8) == 32);
  CHECK(std::string(bytes.data() + table + 12, 32) == "embedding.word_embeddings.weight");
  // And the values are the floats as they are in memory (little-endian).
  CHECK(field<float>(bytes, data_offset + 4) == sample.embedding[1]);
}

TEST_CASE("each kind of damage is refused, naming the file and the tensor at fault") {
  test_support::TemporaryDirectory directory;
  const fs::path file = directory.path / "model_optim_rng.bin";
  const Sample sample;
  write_checkpoint_file(file, sample.metadata, sample.tensors());
  const auto good = read_file_bytes(file);
  const auto data_offset = field<uint64_t>(good, 32);
  const auto metadata_size = field<uint64_t>(good, 16);
  REQUIRE(open_error(file).empty());

  auto damaged = [&](auto change) {
    auto bytes = good;
    change(bytes);
    write_all(file, bytes);
    const size_t descriptors = open_descriptors();
    const std::string message = open_error(file);
    CHECK_MESSAGE(message.find(file.string()) != std::string::npos, message);
    // A refused file leaves no descriptor open (the fuzzer ran out of them before).
    CHECK(open_descriptors() == descriptors);
    return message;
  };

  SUBCASE("magic") {
    const auto message = damaged([](auto& bytes) { bytes[0] = 'X'; });
    CHECK(message.find("is not a megatron-native checkpoint") != std::string::npos);
  }
  SUBCASE("version") {
    const auto message = damaged([](auto& bytes) { bytes[8] = 2; });
    CHECK(message.find("has format version 2; this build reads version 1") != std::string::npos);
  }
  SUBCASE("header bit") {
    const auto message = damaged([](auto& bytes) { bytes[20] ^= 1; });
    CHECK(message.find("the header fails its CRC-32C check") != std::string::npos);
  }
  SUBCASE("metadata bit") {
    const auto message = damaged([](auto& bytes) { bytes[64 + 3] ^= 0x10; });
    CHECK(message.find("the metadata block fails its CRC-32C check") != std::string::npos);
  }
  SUBCASE("table bit") {
    const auto message = damaged([&](auto& bytes) { bytes[64 + metadata_size + 20] ^= 0x01; });
    CHECK(message.find("the tensor table fails its CRC-32C check") != std::string::npos);
  }
  SUBCASE("a flipped byte in a tensor names that tensor") {
    const auto message = damaged([&](auto& bytes) { bytes[data_offset + 64 + 5] ^= 0x40; });
    CHECK(message.find("tensor 'decoder.final_layernorm.bias' fails its CRC-32C check") !=
          std::string::npos);
    // The other tensor still reads.
    CheckpointFileReader reader(file);
    std::vector<float> values(12);
    CHECK_NOTHROW(reader.read(reader.tensors()[0], values));
  }
  SUBCASE("truncated inside the header") {
    const auto message = damaged([](auto& bytes) { bytes.resize(40); });
    CHECK(message.find("is truncated: 40 bytes, shorter than the 64-byte header") != std::string::npos);
  }
  SUBCASE("truncated inside the metadata") {
    const auto message = damaged([](auto& bytes) { bytes.resize(70); });
    CHECK(message.find("is truncated") != std::string::npos);
  }
  SUBCASE("truncated inside the last tensor names it") {
    const auto message = damaged([&](auto& bytes) { bytes.resize(data_offset + 70); });
    CHECK(message.find("is truncated") != std::string::npos);
    CHECK(message.find("tensor 'decoder.final_layernorm.bias' is cut short") != std::string::npos);
  }
  SUBCASE("truncated inside the first tensor names it") {
    const auto message = damaged([&](auto& bytes) { bytes.resize(data_offset + 10); });
    CHECK(message.find("tensor 'embedding.word_embeddings.weight' is cut short") != std::string::npos);
  }
  SUBCASE("trailing bytes") {
    const auto message = damaged([](auto& bytes) { bytes.push_back(0); });
    CHECK(message.find("1 bytes after the end its header announces") != std::string::npos);
  }
  SUBCASE("a shape whose element count wraps around 2^64, checksums intact") {
    // (2^62 + 3) × 4 elements wrap to 12, the 48 bytes the entry has: before the exact count
    // the table was accepted with that shape (found by tests/fuzz/checkpoint_file_fuzzer.cpp).
    const auto message = damaged([&](auto& bytes) {
      const uint64_t table_offset = 64 + metadata_size;
      const uint64_t table_size = field<uint64_t>(bytes, 24);
      const size_t first_dimension =
          table_offset + 8 + 4 + std::strlen("embedding.word_embeddings.weight") + 4 + 4;
      REQUIRE(field<int64_t>(bytes, first_dimension) == 3);
      const int64_t wrapping = (int64_t{1} << 62) + 3;
      std::memcpy(bytes.data() + first_dimension, &wrapping, 8);
      const uint32_t table_crc = common::crc32c(bytes.data() + table_offset, table_size);
      std::memcpy(bytes.data() + 52, &table_crc, 4);
      const uint32_t header_crc = common::crc32c(bytes.data(), 60);
      std::memcpy(bytes.data() + 60, &header_crc, 4);
    });
    CHECK(message.find("tensor 'embedding.word_embeddings.weight' has an inconsistent table "
                       "entry (shape (4611686018427387907, 4), 48 bytes") != std::string::npos);
  }
  SUBCASE("an empty file") {
    const auto message = damaged([](auto& bytes) { bytes.clear(); });
    CHECK(message.find("is truncated: 0 bytes") != std::string::npos);
  }
}

TEST_CASE("a missing file and a tensor whose shape does not match its values are errors") {
  test_support::TemporaryDirectory directory;
  CHECK_THROWS_WITH_AS(CheckpointFileReader(directory.path / "absent.bin"),
                       doctest::Contains("cannot read checkpoint"), common::Error);
  std::vector<float> values(5);
  const std::vector<CheckpointTensor> tensors = {{"bad", {2, 3}, values}};
  CHECK_THROWS_WITH_AS(write_checkpoint_file(directory.path / "x.bin", {}, tensors),
                       doctest::Contains("tensor 'bad' has shape (2, 3) but 5 values"), common::Error);
  // The writer never overwrites: the file name is the temporary one of a fresh save.
  const fs::path existing = directory.path / "existing.bin";
  write_all(existing, {'x'});
  CHECK_THROWS_WITH_AS(write_checkpoint_file(existing, {}, {}), doctest::Contains("cannot create"),
                       common::Error);
}
