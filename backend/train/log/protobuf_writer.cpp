// Protocol Buffers wire format, the encoding side only; see protobuf_writer.hpp.
#include "backend/train/log/protobuf_writer.hpp"

#include <bit>

namespace backend {

namespace {
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;
}  // namespace

void ProtobufWriter::append_varint(uint64_t value) {
  while (value >= 0x80) {
    bytes_.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  bytes_.push_back(static_cast<char>(value));
}

void ProtobufWriter::append_tag(int field, int wire_type) {
  append_varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

void ProtobufWriter::append_little_endian(uint64_t value, int size) {
  for (int i = 0; i < size; ++i) bytes_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void ProtobufWriter::add_varint(int field, uint64_t value) {
  append_tag(field, kVarint);
  append_varint(value);
}

void ProtobufWriter::add_double(int field, double value) {
  append_tag(field, kFixed64);
  append_little_endian(std::bit_cast<uint64_t>(value), 8);
}

void ProtobufWriter::add_float(int field, float value) {
  append_tag(field, kFixed32);
  append_little_endian(std::bit_cast<uint32_t>(value), 4);
}

void ProtobufWriter::add_bytes(int field, std::string_view bytes) {
  append_tag(field, kLengthDelimited);
  append_varint(bytes.size());
  bytes_.append(bytes);
}

}  // namespace backend
