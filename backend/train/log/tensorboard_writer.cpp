// TensorBoard event files (TFRecord-framed tensorflow.Event messages); see tensorboard_writer.hpp.
#include "backend/train/log/tensorboard_writer.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>

#include "backend/common/crc32c.hpp"
#include "backend/common/error.hpp"
#include "backend/train/log/protobuf_writer.hpp"

namespace backend {

namespace {

// Field numbers of tensorboard/compat/proto/event.proto and summary.proto.
constexpr int kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr int kSummaryValue = 1;
constexpr int kValueTag = 1, kValueSimpleValue = 2;

double wall_time_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

void append_little_endian(std::string& out, uint64_t value, int size) {
  for (int i = 0; i < size; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

std::string encode_file_version_event(double wall_time) {
  ProtobufWriter event;
  event.add_double(kEventWallTime, wall_time);
  event.add_bytes(kEventFileVersion, "brain.Event:2");
  return event.bytes();
}

std::string encode_scalar_event(std::string_view tag, float value, int64_t step, double wall_time) {
  ProtobufWriter summary_value;
  summary_value.add_bytes(kValueTag, tag);
  summary_value.add_float(kValueSimpleValue, value);
  ProtobufWriter summary;
  summary.add_message(kSummaryValue, summary_value);
  ProtobufWriter event;
  event.add_double(kEventWallTime, wall_time);
  if (step != 0) event.add_int64(kEventStep, step);  // proto3 leaves default values out
  event.add_message(kEventSummary, summary);
  return event.bytes();
}

std::string frame_tfrecord(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  append_little_endian(record, data.size(), 8);
  append_little_endian(record, common::mask_crc32c(common::crc32c(record.data(), 8)), 4);
  record.append(data);
  append_little_endian(record, common::mask_crc32c(common::crc32c(data.data(), data.size())), 4);
  return record;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& directory, int64_t queue_size)
    : queue_size_(std::max<int64_t>(1, queue_size)) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) common::fail("--tensorboard-dir {}: {}", directory.string(), error.message());
  const double wall_time = wall_time_seconds();
  const std::string stem = fmt::format("events.out.tfevents.{:010d}.{}.{}",
                                       static_cast<int64_t>(wall_time), hostname(), getpid());
  for (int n = 0;; ++n) {
    path_ = directory / fmt::format("{}.{}", stem, n);
    if (!std::filesystem::exists(path_)) break;
  }
  file_.open(path_, std::ios::binary | std::ios::trunc);
  if (!file_) common::fail("--tensorboard-dir {}: cannot create {}", directory.string(), path_.string());
  pending_.push_back(frame_tfrecord(encode_file_version_event(wall_time)));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    close();
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
  }
}

void TensorBoardWriter::add_scalar(std::string_view tag, double value, int64_t step) {
  add_scalar(tag, value, step, wall_time_seconds());
}

void TensorBoardWriter::add_scalar(std::string_view tag, double value, int64_t step,
                                   double wall_time) {
  if (!file_.is_open()) common::fail("TensorBoard writer for {} is closed", path_.string());
  pending_.push_back(frame_tfrecord(encode_scalar_event(tag, static_cast<float>(value), step, wall_time)));
  if (static_cast<int64_t>(pending_.size()) >= queue_size_) flush();
}

void TensorBoardWriter::write_pending() {
  for (const auto& record : pending_) file_.write(record.data(), static_cast<std::streamsize>(record.size()));
  pending_.clear();
  if (!file_) common::fail("--tensorboard-dir: cannot write {}", path_.string());
}

void TensorBoardWriter::flush() {
  if (!file_.is_open()) return;
  write_pending();
  file_.flush();
  if (!file_) common::fail("--tensorboard-dir: cannot write {}", path_.string());
}

void TensorBoardWriter::close() {
  if (!file_.is_open()) return;
  flush();
  file_.close();
}

}  // namespace backend
