// Test support: TensorBoard event-file bytes made by hand (protobuf wire format and TFRecord
// framing, as tensorflow/core/lib/io/record_writer.cc frames them), for the launcher's reader
// tests, which do not link the backend's writer. The CRC is the project's crc32c.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

#include "backend/common/crc32c.hpp"

namespace test_support {

inline void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

inline void put_little_endian(std::string& out, uint64_t value, int size) {
  for (int i = 0; i < size; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

inline void put_bytes_field(std::string& out, int number, std::string_view bytes) {
  put_varint(out, (static_cast<uint64_t>(number) << 3) | 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event{wall_time, step, summary{value{tag, simple_value}}}; step 0 left out as proto3 does.
inline std::string scalar_event(std::string_view tag, float value, int64_t step, double wall_time) {
  std::string summary_value;
  put_bytes_field(summary_value, 1, tag);
  put_varint(summary_value, (2 << 3) | 5);
  put_little_endian(summary_value, std::bit_cast<uint32_t>(value), 4);
  std::string summary;
  put_bytes_field(summary, 1, summary_value);
  std::string event;
  put_varint(event, (1 << 3) | 1);
  put_little_endian(event, std::bit_cast<uint64_t>(wall_time), 8);
  if (step != 0) {
    put_varint(event, 2 << 3);
    put_varint(event, static_cast<uint64_t>(step));
  }
  put_bytes_field(event, 5, summary);
  return event;
}

inline std::string file_version_event(double wall_time) {
  std::string event;
  put_varint(event, (1 << 3) | 1);
  put_little_endian(event, std::bit_cast<uint64_t>(wall_time), 8);
  put_bytes_field(event, 3, "brain.Event:2");
  return event;
}

inline std::string tfrecord(std::string_view data) {
  std::string record;
  put_little_endian(record, data.size(), 8);
  put_little_endian(record, common::mask_crc32c(common::crc32c(record.data(), 8)), 4);
  record.append(data);
  put_little_endian(record, common::mask_crc32c(common::crc32c(data.data(), data.size())), 4);
  return record;
}

}  // namespace test_support
