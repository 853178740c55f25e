// TFRecord framing and the few tensorflow.Event fields the report plots; see
// tensorboard_reader.hpp.
#include "launcher/tensorboard_reader.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "backend/common/crc32c.hpp"
#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"

namespace launcher {

namespace fs = std::filesystem;

namespace {

uint64_t little_endian(std::string_view bytes, size_t offset, int size) {
  uint64_t value = 0;
  for (int i = 0; i < size; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  }
  return value;
}

// A protobuf message's fields, one at a time (wire types 0 varint, 1 fixed64, 2 bytes,
// 5 fixed32; https://protobuf.dev/programming-guides/encoding/).
class ProtobufFields {
 public:
  ProtobufFields(std::string_view bytes, const std::string& file, uint64_t offset)
      : bytes_(bytes), file_(file), offset_(offset) {}

  bool next() {
    if (position_ >= bytes_.size()) return false;
    const uint64_t key = varint();
    number_ = static_cast<int>(key >> 3);
    wire_type_ = static_cast<int>(key & 7);
    switch (wire_type_) {
      case 0: integer_ = varint(); break;
      case 1: integer_ = fixed(8); break;
      case 5: integer_ = fixed(4); break;
      case 2: {
        const uint64_t size = varint();
        if (size > bytes_.size() - position_) malformed("a field runs past its message");
        payload_ = bytes_.substr(position_, size);
        position_ += size;
        break;
      }
      default: malformed("unknown protobuf wire type " + std::to_string(wire_type_));
    }
    return true;
  }
  int number() const { return number_; }
  int wire_type() const { return wire_type_; }
  uint64_t integer() const { return integer_; }
  std::string_view payload() const { return payload_; }

  [[noreturn]] void malformed(const std::string& why) const {
    common::fail("{}: the event record at byte offset {} is not a tensorflow.Event: {}", file_,
                 offset_, why);
  }

 private:
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (position_ >= bytes_.size()) malformed("a varint runs past its message");
      const auto byte = static_cast<unsigned char>(bytes_[position_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    malformed("a varint longer than 10 bytes");
  }
  uint64_t fixed(int size) {
    if (bytes_.size() - position_ < static_cast<size_t>(size)) malformed("a fixed field runs past its message");
    const uint64_t value = little_endian(bytes_, position_, size);
    position_ += size;
    return value;
  }

  std::string_view bytes_;
  const std::string& file_;
  uint64_t offset_;
  size_t position_ = 0;
  int number_ = 0, wire_type_ = 0;
  uint64_t integer_ = 0;
  std::string_view payload_;
};

constexpr int kEventWallTime = 1, kEventStep = 2, kEventSummary = 5;
constexpr int kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2;

void parse_event(std::string_view data, const std::string& file, uint64_t offset,
                 std::vector<ScalarEvent>& out) {
  double wall_time = 0;
  int64_t step = 0;
  std::vector<std::pair<std::string, double>> values;
  ProtobufFields event(data, file, offset);
  while (event.next()) {
    if (event.number() == kEventWallTime && event.wire_type() == 1) {
      wall_time = std::bit_cast<double>(event.integer());
    } else if (event.number() == kEventStep && event.wire_type() == 0) {
      step = static_cast<int64_t>(event.integer());
    } else if (event.number() == kEventSummary && event.wire_type() == 2) {
      ProtobufFields summary(event.payload(), file, offset);
      while (summary.next()) {
        if (summary.number() != kSummaryValue || summary.wire_type() != 2) continue;
        ProtobufFields value(summary.payload(), file, offset);
        std::string tag;
        bool has_value = false;
        double simple_value = 0;
        while (value.next()) {
          if (value.number() == kValueTag && value.wire_type() == 2) tag = value.payload();
          if (value.number() == kValueSimpleValue && value.wire_type() == 5) {
            simple_value = std::bit_cast<float>(static_cast<uint32_t>(value.integer()));
            has_value = true;
          }
        }
        if (has_value) values.emplace_back(std::move(tag), simple_value);
      }
    }
  }
  for (auto& [tag, value] : values) out.push_back({std::move(tag), step, value, wall_time});
}

}  // namespace

std::vector<ScalarEvent> parse_tensorboard_events(std::string_view bytes, const std::string& file) {
  std::vector<ScalarEvent> events;
  uint64_t offset = 0;
  while (offset < bytes.size()) {
    const uint64_t left = bytes.size() - offset;
    if (left < 12) break;  // a header still being written
    const uint32_t length_crc = static_cast<uint32_t>(little_endian(bytes, offset + 8, 4));
    if (common::mask_crc32c(common::crc32c(bytes.data() + offset, 8)) != length_crc) {
      common::fail("{}: corrupt event record at byte offset {}: the length's CRC does not match "
                   "(not a TensorBoard event file, or damaged)", file, offset);
    }
    const uint64_t length = little_endian(bytes, offset, 8);
    if (length > left - 12 || left - 12 - length < 4) break;  // the last record, cut short
    const std::string_view data = bytes.substr(offset + 12, length);
    const uint32_t data_crc = static_cast<uint32_t>(little_endian(bytes, offset + 12 + length, 4));
    if (common::mask_crc32c(common::crc32c(data.data(), data.size())) != data_crc) {
      common::fail("{}: corrupt event record at byte offset {}: the data's CRC does not match",
                   file, offset);
    }
    parse_event(data, file, offset, events);
    offset += 12 + length + 4;
  }
  return events;
}

std::vector<ScalarEvent> read_tensorboard_file(const fs::path& path) {
  // Event files of long runs grow past the small-file default; a GiB still reads in seconds.
  const std::string bytes = common::read_small_file(path, "the TensorBoard event file", uint64_t{1} << 30);
  return parse_tensorboard_events(bytes, path.string());
}

std::vector<fs::path> find_tensorboard_files(const fs::path& directory) {
  std::vector<fs::path> files;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(directory, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (it.depth() > 2) {
      it.disable_recursion_pending();
      continue;
    }
    std::error_code type_error;
    if (it->is_regular_file(type_error) &&
        it->path().filename().string().starts_with("events.out.tfevents.")) {
      files.push_back(it->path());
    }
  }
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    return a.filename() == b.filename() ? a < b : a.filename() < b.filename();
  });
  return files;
}

}  // namespace launcher
