// End to end: the real pretrain_gpt writes a TensorBoard event file that an independent reader
// (tests/e2e/check_tensorboard_events.py: its own CRC-32C, Debian's python3-protobuf decoding
// a .proto written from TensorBoard's field numbers) accepts, with every scalar the trainer
// printed. Skips with a message when python3-protobuf or protoc is missing, except under CI
// (CI=true), where container/install-deps.sh --tests installs them and their absence fails.
#include <doctest/doctest.h>

#include "temporary_directory.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "launcher/process.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::running_under_ci;

// A python3 that imports google.protobuf, with protoc beside it; empty (and a message or, under
// CI, a failure) when there is none.
std::string python_with_protobuf() {
  const bool have_protoc = std::system("protoc --version >/dev/null 2>&1") == 0;
  for (const char* candidate : {"/usr/bin/python3", "python3"}) {
    const std::string probe = std::string(candidate) + " -c 'import google.protobuf' >/dev/null 2>&1";
    if (have_protoc && std::system(probe.c_str()) == 0) return candidate;
  }
  const std::string problem =
      "python3-protobuf or protobuf-compiler is missing (apt-get install python3-protobuf "
      "protobuf-compiler, or bash container/install-deps.sh --tests)";
  if (running_under_ci()) {
    FAIL("under CI the TensorBoard reader must run: " << problem);
  }
  MESSAGE("skipping the TensorBoard event-file check: " << problem);
  return "";
}

std::vector<std::string> tiny_tensorboard_run(const fs::path& tensorboard_dir, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      std::string(TEST_BIN_DIR) + "/pretrain_gpt", "--num-layers", "2", "--hidden-size", "32",
      "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2", "--lr", "1e-3",
      "--mock-data", "--vocab-size", "100", "--log-interval", "1", "--eval-interval", "2",
      "--eval-iters", "1", "--tensorboard-dir", tensorboard_dir.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// Runs pretrain_gpt, then the reader over its event file and its output.
void check_with_reader(const std::string& python, const fs::path& work,
                       const std::vector<std::string>& run_flags,
                       const std::vector<std::string>& reader_flags) {
  const auto run = launcher::run_and_capture(tiny_tensorboard_run(work / "tb", run_flags));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  std::ofstream(work / "log.txt") << run.output;
  std::string command = python + " -B " + std::string(TEST_SOURCE_DIR) +
                        "/tests/e2e/check_tensorboard_events.py --events " + (work / "tb").string() +
                        " --log " + (work / "log.txt").string() + " --proto " +
                        std::string(TEST_SOURCE_DIR) + "/tests/e2e/tensorboard_event.proto --work " +
                        work.string();
  for (const auto& flag : reader_flags) command += " " + flag;
  const auto reader = launcher::run_and_capture({"/bin/sh", "-c", command});
  INFO(reader.output);
  CHECK(reader.exit_code == 0);
}

}  // namespace

TEST_CASE("pretrain_gpt's TensorBoard events decode independently and match its log") {
  const std::string python = python_with_protobuf();
  if (python.empty()) return;
  test_support::TemporaryDirectory work;
  check_with_reader(python, work.path,
                    {"--train-iters", "4", "--global-batch-size", "4", "--lr-warmup-iters", "1",
                     "--lr-decay-style", "cosine", "--log-throughput", "--log-timers-to-tensorboard",
                     "--log-validation-ppl-to-tensorboard"},
                    {"--expect-ppl", "--expect-throughput"});
}

TEST_CASE("with --train-samples and --rampup-batch-size the batch-size scalars follow the ramp") {
  const std::string python = python_with_protobuf();
  if (python.empty()) return;
  test_support::TemporaryDirectory work;
  check_with_reader(python, work.path,
                    {"--train-samples", "24", "--global-batch-size", "6", "--rampup-batch-size",
                     "2", "2", "8", "--lr-decay-style", "WSD", "--lr-wsd-decay-samples", "8",
                     "--no-log-loss-scale-to-tensorboard"},
                    {"--no-loss-scale"});
}
