// TensorBoard event files, written without TensorFlow or protobuf (--tensorboard-dir, as
// Megatron's torch.utils.tensorboard.SummaryWriter writes them):
//   file   <dir>/events.out.tfevents.<unix seconds, 10 digits>.<hostname>.<pid>.<n>
//          (n = 0, or the next free number if that name exists)
//   record TFRecord framing (tensorflow/core/lib/io/record_writer.cc):
//          uint64 length | uint32 masked CRC-32C of the 8 length bytes | data |
//          uint32 masked CRC-32C of the data          (integers little-endian)
//   data   a serialized tensorflow.Event (tensorboard/compat/proto/event.proto):
//          1: double wall_time, 2: int64 step, 3: string file_version, 5: Summary summary;
//          Summary (summary.proto) 1: repeated Value value; Value 1: string tag, 2: float
//          simple_value — what SummaryWriter.add_scalar writes.
// The first record is Event{wall_time, file_version: "brain.Event:2"}. Records are queued in
// memory (up to --tensorboard-queue-size) and written on flush(), which the trainer calls at
// every log interval and at the end; close() (also the destructor) flushes and closes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace backend {

class TensorBoardWriter {
 public:
  // Creates `directory` if needed and the event file in it; `queue_size` records are held
  // before they are written out even without flush().
  explicit TensorBoardWriter(const std::filesystem::path& directory, int64_t queue_size = 1000);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // A scalar at `step`, stamped with the current time (or `wall_time`, seconds since the epoch).
  void add_scalar(std::string_view tag, double value, int64_t step);
  void add_scalar(std::string_view tag, double value, int64_t step, double wall_time);
  void flush();
  void close();
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_pending();
  std::filesystem::path path_;
  std::ofstream file_;
  std::vector<std::string> pending_;
  int64_t queue_size_;
};

// The pieces, for tests and for anyone who wants the bytes without a file.
std::string encode_file_version_event(double wall_time);
std::string encode_scalar_event(std::string_view tag, float value, int64_t step, double wall_time);
std::string frame_tfrecord(std::string_view data);

}  // namespace backend
