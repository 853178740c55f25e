// The protobuf wire format, against the worked examples of the encoding guide
// (https://protobuf.dev/programming-guides/encoding/) and IEEE 754 bit patterns.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "backend/train/log/protobuf_writer.hpp"

using backend::ProtobufWriter;

namespace {
std::vector<int> bytes_of(const ProtobufWriter& writer) {
  std::vector<int> bytes;
  for (const char c : writer.bytes()) bytes.push_back(static_cast<unsigned char>(c));
  return bytes;
}
}  // namespace

TEST_CASE("varints: the guide's 150 and 300, and a negative int64 in ten bytes") {
  ProtobufWriter a;
  a.add_varint(1, 150);  // the guide's Test1 { a: 150 } = 08 96 01
  CHECK(bytes_of(a) == std::vector<int>{0x08, 0x96, 0x01});
  ProtobufWriter b;
  b.add_varint(1, 300);
  CHECK(bytes_of(b) == std::vector<int>{0x08, 0xAC, 0x02});
  ProtobufWriter c;
  c.add_int64(2, -1);  // two's complement: nine 0xFF groups and a final 0x01
  CHECK(bytes_of(c) ==
        std::vector<int>{0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01});
  ProtobufWriter d;
  d.add_varint(16, 1);  // field 16: the tag itself needs two bytes (0x80 0x01)
  CHECK(bytes_of(d) == std::vector<int>{0x80, 0x01, 0x01});
}

TEST_CASE("strings, embedded messages and fixed-width floats") {
  ProtobufWriter text;
  text.add_bytes(2, "testing");  // the guide's Test2 { b: "testing" }
  CHECK(bytes_of(text) == std::vector<int>{0x12, 0x07, 't', 'e', 's', 't', 'i', 'n', 'g'});
  ProtobufWriter inner;
  inner.add_varint(1, 150);
  ProtobufWriter outer;
  outer.add_message(3, inner);  // the guide's Test3 { c: { a: 150 } } = 1a 03 08 96 01
  CHECK(bytes_of(outer) == std::vector<int>{0x1A, 0x03, 0x08, 0x96, 0x01});
  ProtobufWriter numbers;
  numbers.add_double(1, 1.5);  // 0x3FF8000000000000, little-endian
  numbers.add_float(2, -2.0f); // 0xC0000000
  CHECK(bytes_of(numbers) == std::vector<int>{0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F,
                                              0x15, 0, 0, 0, 0xC0});
}
