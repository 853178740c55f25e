// TensorBoard event files: the Event bytes assembled by hand from event.proto/summary.proto
// field numbers, the TFRecord framing checked with a bitwise CRC-32C of the test's own, the
// file name, the first record, and when queued records reach the file.
#include <doctest/doctest.h>

#include "temporary_directory.hpp"
#include "test_files.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/modular_arithmetic.hpp"
#include "backend/train/log/tensorboard_writer.hpp"

using namespace backend;
namespace fs = std::filesystem;

namespace {

using test_support::read_file;

// Bit by bit, reflected polynomial 0x82F63B78 (RFC 3720 §B.4): independent of the table-driven one.
uint32_t bitwise_crc32c(const std::string& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : data) {
    crc ^= static_cast<unsigned char>(c);
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
  }
  return crc ^ 0xFFFFFFFFu;
}

COMMON_MODULAR_ARITHMETIC uint32_t tfrecord_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t little_endian(const std::string& bytes, size_t at, int size) {
  uint64_t value = 0;
  for (int i = size - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

std::string hex(const std::string& bytes) {
  std::string out;
  for (const char c : bytes) out += fmt::format("{:02x}", static_cast<unsigned char>(c));
  return out;
}

}  // namespace

TEST_CASE("the test's CRC-32C agrees with the catalogue check value") {
  CHECK(bitwise_crc32c("123456789") == 0xE3069283u);
}

TEST_CASE("a scalar event is Event{wall_time, step, summary{value{tag, simple_value}}}") {
  const std::string event = encode_scalar_event("lm loss", 2.5f, 3, 1.5);
  // 09 <1.5 as a little-endian double> | 10 03 | 2a 10 <Summary: 0a 0e <Value: 0a 07 "lm loss"
  //                                                              15 <2.5f little-endian>>>
  const std::string expected = std::string("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f", 9) +
                               std::string("\x10\x03", 2) + std::string("\x2a\x10\x0a\x0e", 4) +
                               std::string("\x0a\x07lm loss", 9) +
                               std::string("\x15\x00\x00\x20\x40", 5);
  CHECK(hex(event) == hex(expected));
  // step 0 is proto3's default and left out, like every proto3 encoder does
  CHECK(encode_scalar_event("x", 1.0f, 0, 1.5).find('\x10') == std::string::npos);
  const std::string version = encode_file_version_event(1.5);
  CHECK(hex(version) == hex(std::string("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f", 9) +
                            std::string("\x1a\x0d", 2) + "brain.Event:2"));
}

TEST_CASE("TFRecord framing: length, masked CRC of the length, data, masked CRC of the data") {
  const std::string data = encode_scalar_event("learning-rate", 1e-4f, 7, 1700000000.25);
  const std::string record = frame_tfrecord(data);
  REQUIRE(record.size() == data.size() + 16);
  CHECK(little_endian(record, 0, 8) == data.size());
  CHECK(little_endian(record, 8, 4) == tfrecord_mask(bitwise_crc32c(record.substr(0, 8))));
  CHECK(record.substr(12, data.size()) == data);
  CHECK(little_endian(record, 12 + data.size(), 4) == tfrecord_mask(bitwise_crc32c(data)));
}

TEST_CASE("the event file: TensorBoard's name, the version record first, records on flush") {
  test_support::TemporaryDirectory temporary;
  const fs::path directory = temporary.path / "tb";
  TensorBoardWriter writer(directory);
  const std::string name = writer.path().filename().string();
  CHECK(writer.path().parent_path() == directory);
  CHECK(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\..+\.\d+\.0)")));
  const std::string first = read_file(writer.path());  // written at once
  REQUIRE(first.size() >= 16);
  const std::string version = first.substr(12, little_endian(first, 0, 8));
  CHECK(version.find("brain.Event:2") != std::string::npos);
  CHECK(first.size() == version.size() + 16);

  writer.add_scalar("lm loss", 3.0, 1, 1700000000.0);
  CHECK(read_file(writer.path()).size() == first.size());  // queued, not yet written
  writer.flush();
  const std::string after = read_file(writer.path());
  CHECK(after.substr(first.size()) ==
        frame_tfrecord(encode_scalar_event("lm loss", 3.0f, 1, 1700000000.0)));

  // A second writer in the same second takes the next free number instead of clobbering.
  TensorBoardWriter second(directory, 1);
  CHECK(second.path() != writer.path());
  second.add_scalar("grad-norm", 1.0, 2);  // queue size 1: straight to the file
  CHECK(read_file(second.path()).size() > first.size());
  second.close();
  CHECK_THROWS_AS(second.add_scalar("grad-norm", 1.0, 3), common::Error);
}

TEST_CASE("an event directory that cannot be created is an error naming the flag") {
  test_support::TemporaryDirectory temporary;
  std::ofstream(temporary.path / "file") << "x";
  CHECK_THROWS_WITH_AS(TensorBoardWriter(temporary.path / "file" / "tb"),
                       doctest::Contains("--tensorboard-dir"), common::Error);
}
