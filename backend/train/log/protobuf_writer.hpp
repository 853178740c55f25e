// A tiny Protocol Buffers encoder: just the wire format (https://protobuf.dev/programming-guides/
// encoding/) that TensorBoard's Event and Summary messages need, so no protobuf library is
// linked. Each field is a tag = (field number << 3) | wire type, as a varint, then
//   wire type 0 (VARINT)  the value in base-128 groups of 7 bits, least significant first,
//                         high bit set on all but the last byte (int64 as its two's complement)
//   wire type 1 (I64)     8 bytes little-endian (double)
//   wire type 2 (LEN)     a varint length, then the bytes (string, bytes, embedded message)
//   wire type 5 (I32)     4 bytes little-endian (float)
// Fields are written in the order the caller adds them; readers accept any order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace backend {

class ProtobufWriter {
 public:
  void add_varint(int field, uint64_t value);
  void add_int64(int field, int64_t value) { add_varint(field, static_cast<uint64_t>(value)); }
  void add_double(int field, double value);
  void add_float(int field, float value);
  void add_bytes(int field, std::string_view bytes);  // also strings
  void add_message(int field, const ProtobufWriter& message) { add_bytes(field, message.bytes()); }
  const std::string& bytes() const { return bytes_; }

 private:
  void append_varint(uint64_t value);
  void append_tag(int field, int wire_type);
  void append_little_endian(uint64_t value, int size);
  std::string bytes_;
};

}  // namespace backend
