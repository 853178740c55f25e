// Reading the scalars back from TensorBoard event files, for `launcher report --html`. The
// format is the one backend/train/log/tensorboard_writer.hpp writes (and TensorFlow's
// record_writer.cc frames): records of
//   uint64 length | uint32 masked CRC-32C of the 8 length bytes | data | uint32 masked CRC-32C
//   of the data                                                   (integers little-endian)
// whose data is a tensorflow.Event (event.proto: 1 double wall_time, 2 int64 step, 5 Summary;
// Summary 1: repeated Value; Value 1 string tag, 2 float simple_value). Fields of other
// numbers are skipped by their wire type, so files from torch's SummaryWriter read too.
// A record cut short at the end of the file is a job still writing and is ignored; a record
// whose length or data CRC does not match is corruption: common::Error naming file and offset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace launcher {

struct ScalarEvent {
  std::string tag;
  int64_t step = 0;
  double value = 0;
  double wall_time = 0;
};

// The simple_value scalars of the event records in `bytes`; `file` names them in errors.
std::vector<ScalarEvent> parse_tensorboard_events(std::string_view bytes, const std::string& file);

// The same for a file read whole.
std::vector<ScalarEvent> read_tensorboard_file(const std::filesystem::path& path);

// The event files (events.out.tfevents.*) of a directory and its subdirectories up to two
// levels down, in name order (the name starts with the creation time), so that a resumed run's
// later file comes last.
std::vector<std::filesystem::path> find_tensorboard_files(const std::filesystem::path& directory);

}  // namespace launcher
