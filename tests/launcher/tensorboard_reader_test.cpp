// The launcher's TensorBoard event reader: scalars read back from hand-made records, unknown
// fields skipped, a record cut short at the end ignored (a job still writing), a damaged one
// refused naming the file and the byte offset.
#include <doctest/doctest.h>

#include "temporary_directory.hpp"
#include "tensorboard_event_bytes.hpp"
#include "test_files.hpp"

#include <filesystem>
#include <fstream>

#include "backend/common/error.hpp"
#include "launcher/tensorboard_reader.hpp"

using namespace launcher;
using test_support::file_version_event;
using test_support::put_bytes_field;
using test_support::put_little_endian;
using test_support::put_varint;
using test_support::scalar_event;
using test_support::TemporaryDirectory;
using test_support::tfrecord;
namespace fs = std::filesystem;

namespace {

std::string three_records() {
  return tfrecord(file_version_event(1700000000.5)) +
         tfrecord(scalar_event("lm loss", 10.25f, 0, 1700000001.0)) +
         tfrecord(scalar_event("learning-rate", 6e-4f, 12, 1700000002.0));
}

}  // namespace

TEST_CASE("event records read back: tags, steps, float values, wall times") {
  const auto events = parse_tensorboard_events(three_records(), "events.out.tfevents.1");
  REQUIRE(events.size() == 2);  // the file-version event holds no scalar
  CHECK(events[0].tag == "lm loss");
  CHECK(events[0].step == 0);
  CHECK(events[0].value == 10.25);
  CHECK(events[0].wall_time == 1700000001.0);
  CHECK(events[1].tag == "learning-rate");
  CHECK(events[1].step == 12);
  CHECK(events[1].value == doctest::Approx(6e-4).epsilon(1e-6));
}

TEST_CASE("fields the report does not use are skipped by their wire type") {
  std::string event = scalar_event("grad-norm", 2.5f, 3, 1.0);
  put_varint(event, (9 << 3) | 0);  // an unknown varint field
  put_varint(event, 300);
  put_bytes_field(event, 7, "graph bytes");
  put_varint(event, (8 << 3) | 5);  // an unknown fixed32
  put_little_endian(event, 7, 4);
  const auto events = parse_tensorboard_events(tfrecord(event), "f");
  REQUIRE(events.size() == 1);
  CHECK(events[0].tag == "grad-norm");
  CHECK(events[0].value == 2.5);
}

TEST_CASE("a record cut short at the end is a job still writing: the records before it count") {
  const std::string whole = three_records();
  const std::string last = tfrecord(scalar_event("lm loss", 9.0f, 13, 3.0));
  // Cut inside the header, inside the data, and inside the trailing CRC.
  for (const size_t keep : {size_t{5}, size_t{12}, size_t{20}, last.size() - 1}) {
    CAPTURE(keep);
    const auto events = parse_tensorboard_events(whole + last.substr(0, keep), "f");
    CHECK(events.size() == 2);
  }
  CHECK(parse_tensorboard_events(whole + last, "f").size() == 3);
  CHECK(parse_tensorboard_events("", "f").empty());
}

TEST_CASE("a damaged record is an error naming the file and its byte offset") {
  const std::string first = tfrecord(file_version_event(1.0));
  std::string bytes = three_records();
  // A flipped bit in the second record's data.
  bytes[first.size() + 14] ^= 0x01;
  const std::string expected = fmt::format(
      "/runs/a/events.out.tfevents.1: corrupt event record at byte offset {}: the data's CRC",
      first.size());
  CHECK_THROWS_WITH_AS(parse_tensorboard_events(bytes, "/runs/a/events.out.tfevents.1"),
                       doctest::Contains(expected.c_str()), common::Error);
  // A damaged length: its CRC no longer matches.
  bytes = three_records();
  bytes[first.size()] ^= 0x40;
  CHECK_THROWS_WITH_AS(parse_tensorboard_events(bytes, "f"),
                       doctest::Contains("the length's CRC does not match"), common::Error);
  // Not an event file at all.
  CHECK_THROWS_WITH_AS(parse_tensorboard_events("this is a text file, not events\n", "notes.txt"),
                       doctest::Contains("notes.txt: corrupt event record at byte offset 0"),
                       common::Error);
  // Well framed, but the data is not a protobuf message.
  CHECK_THROWS_WITH_AS(parse_tensorboard_events(tfrecord("\x0f\x01"), "f"),
                       doctest::Contains("not a tensorflow.Event"), common::Error);
}

TEST_CASE("event files are found below a run directory in name (creation time) order") {
  TemporaryDirectory run;
  fs::create_directories(run.path / "results");
  std::ofstream(run.path / "results" / "events.out.tfevents.1700000100.host.2.0") << three_records();
  std::ofstream(run.path / "results" / "events.out.tfevents.1700000000.host.1.0") << three_records();
  std::ofstream(run.path / "results" / "hparams.yaml") << "a: 1\n";
  const auto files = find_tensorboard_files(run.path);
  REQUIRE(files.size() == 2);
  CHECK(files[0].filename() == "events.out.tfevents.1700000000.host.1.0");
  CHECK(read_tensorboard_file(files[1]).size() == 2);
  CHECK_THROWS_WITH_AS(read_tensorboard_file(run.path / "results"),
                       doctest::Contains("the TensorBoard event file"), common::Error);
}
