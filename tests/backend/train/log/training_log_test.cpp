// Megatron's log lines, compared character by character with the format in the issue, and
// training_log's interval sums, iteration lines and TensorBoard scalars.
#include <doctest/doctest.h>

#include "temporary_directory.hpp"
#include "test_files.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "backend/train/log/training_log.hpp"

using namespace backend;

TEST_CASE("the iteration line is Megatron's, byte for byte after the timestamp") {
  IterationLogFields fields;
  fields.timestamp = 0;
  fields.iteration = 5;
  fields.train_iters = 10;
  fields.consumed_samples = 40;
  fields.elapsed_ms_per_iteration = 812.3;
  fields.learning_rate = 1e-4;
  fields.global_batch_size = 8;
  fields.lm_loss = 10.82345;
  fields.grad_norm = 1.2344;
  const std::string line = format_iteration_line(fields);
  const std::string expected_tail =
      " iteration        5/      10 | consumed samples:           40 | elapsed time per iteration "
      "(ms): 812.3 | learning rate: 1.000000E-04 | global batch size:     8 | lm loss: "
      "1.082345E+01 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | "
      "number of nan iterations:   0 |";
  REQUIRE(line.size() == 22 + expected_tail.size());
  CHECK(line.substr(0, 2) == " [");
  CHECK(line.substr(21, 1) == "]");
  CHECK(line.substr(22) == expected_tail);
  CHECK(line.substr(2, 19) == format_timestamp(0));
}

TEST_CASE("throughput appears only when given, before the learning rate") {
  IterationLogFields fields;
  fields.throughput_tflops_per_gpu = 123.45;
  const std::string line = format_iteration_line(fields);
  CHECK(line.find("| throughput per GPU (TFLOP/s/GPU): 123.5 | learning rate:") != std::string::npos);
}

TEST_CASE("the params norm appears only when given, after the grad norm (Megatron's order)") {
  IterationLogFields fields;
  fields.grad_norm = 1.5;
  CHECK(format_iteration_line(fields).find("params norm") == std::string::npos);
  fields.params_norm = 123.4567;
  CHECK(format_iteration_line(fields).find(
            "| grad norm: 1.500 | params norm: 123.457 | number of skipped iterations:") !=
        std::string::npos);
}

TEST_CASE("the zeros of the gradient appear only when given, between grad and params norm") {
  IterationLogFields fields;
  fields.grad_norm = 1.5;
  fields.params_norm = 2.0;
  CHECK(format_iteration_line(fields).find("num zeros") == std::string::npos);
  fields.num_zeros_in_grad = 8192;
  CHECK(format_iteration_line(fields).find(
            "| grad norm: 1.500 | num zeros: 8192.0 | params norm: 2.000 |") != std::string::npos);
}

TEST_CASE("the validation block: dashes one longer than the line, PPL capped at exp(20)") {
  const auto block = format_evaluation_block("iteration 100", 2.0);
  REQUIRE(block.size() == 3);
  CHECK(block[1] ==
        " validation loss at iteration 100 | lm loss value: 2.000000E+00 | lm loss PPL: "
        "7.389056E+00 | ");
  CHECK(block[0] == std::string(block[1].size() + 1, '-'));
  CHECK(block[2] == block[0]);
  const auto capped = format_evaluation_block("iteration 1 on test set", 50.0);
  CHECK(capped[1].find("lm loss PPL: 4.851652E+08 | ") != std::string::npos);
}

TEST_CASE("--log-throughput's extension line: tokens/s and MFU against the measured peak") {
  CHECK(format_throughput_extension_line(41120.24, 2.7e10, 2.35e11) ==
        " throughput: 41120.2 tokens/s | MFU: 11.5% of the measured 0.235 TFLOP/s sgemm peak |");
  CHECK(format_throughput_extension_line(61182.3, 4.88e13, 8.0e14, "bf16 GEMM peak") ==
        " throughput: 61182.3 tokens/s | MFU: 6.1% of the measured 800.000 TFLOP/s bf16 GEMM "
        "peak |");
}

TEST_CASE("Megatron's memory line: megabytes as Python prints floats, reserved as allocated") {
  CHECK(format_memory_line(0, 10, {.allocated_bytes = 2006188032, .peak_bytes = 2505572352}) ==
        "[Rank 0] (after 10 iterations) memory (MB) | allocated: 1913.25 | max allocated: 2389.5 "
        "| reserved: 1913.25 | max reserved: 2389.5");
  // An integral number of megabytes prints as Python's 1024.0, not 1024.
  CHECK(format_memory_line(3, 100, {.allocated_bytes = 1073741824, .peak_bytes = 1073741824}) ==
        "[Rank 3] (after 100 iterations) memory (MB) | allocated: 1024.0 | max allocated: 1024.0 "
        "| reserved: 1024.0 | max reserved: 1024.0");
}

namespace {

// What TrainingLog is made from: the logging flags and the run they log.
struct LogSetup {
  LoggingArguments logging;
  LoggedRun run;
};

LogSetup log_arguments() {
  LogSetup a;
  a.run.model.num_layers = 2;
  a.run.model.hidden_size = 32;
  a.run.model.ffn_hidden_size = 128;
  a.run.model.num_attention_heads = 4;
  a.run.model.seq_length = 16;
  a.run.padded_vocab_size = 256;
  a.run.micro_batch_size = 2;
  a.run.global_batch_size = 4;
  a.run.train_iters = 10;
  a.logging.log_interval = 2;
  return a;
}

// A skipped record with a non-finite loss is a nan iteration, as the trainer marks it.
IterationRecord record(int64_t iteration, double lm_loss, double elapsed_ms, bool skipped = false) {
  return {.iteration = iteration,
          .lm_loss = lm_loss,
          .grad_norm = 0.5 * static_cast<double>(iteration),
          .learning_rate = 1e-3,
          .skipped = skipped,
          .elapsed_ms = elapsed_ms,
          .global_batch_size = 4,
          .consumed_samples = 4 * iteration,
          .nan = !std::isfinite(lm_loss)};
}

// fp16 with a dynamic scaler: `scale` is the scale after this iteration's update; an overflow
// skips the update with a finite loss (not a nan iteration).
IterationRecord fp16_record(int64_t iteration, double lm_loss, bool overflow, double scale) {
  IterationRecord r = record(iteration, lm_loss, 100, overflow);
  r.loss_scale = scale;
  return r;
}

// The protobuf of a Summary.Value{tag, simple_value}, as it appears in the event file.
std::string scalar_value_bytes(const std::string& tag, float value) {
  std::string bytes{'\x0a', static_cast<char>(tag.size())};
  bytes += tag;
  bytes += '\x15';
  char little_endian[4];
  std::memcpy(little_endian, &value, 4);  // x86 and ARM: already little-endian
  bytes.append(little_endian, 4);
  return bytes;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The TFRecord frames of the one event file in `directory`.
int count_event_records(const std::filesystem::path& directory) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    files.push_back(entry.path());
  }
  REQUIRE(files.size() == 1);
  const std::string bytes = test_support::read_file(files[0]);
  int records = 0;
  for (size_t at = 0; at + 12 <= bytes.size(); ++records) {
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(bytes[at + i]);
    at += 16 + length;
  }
  return records;
}

}  // namespace

TEST_CASE("an interval's loss is over the iterations that advanced, its time over all of them") {
  IntervalTotals totals;
  totals.add(record(1, 2.0, 100));
  totals.add(record(2, std::nan(""), 200, /*skipped=*/true));
  totals.add(record(3, 4.0, 300));
  CHECK(totals.iterations() == 3);
  CHECK(totals.mean_lm_loss() == 3.0);
  CHECK(totals.elapsed_ms_per_iteration() == 200.0);
  CHECK(totals.skipped_iterations == 1);
  CHECK(totals.nan_iterations == 1);

  IntervalTotals all_skipped;
  all_skipped.add(record(1, std::nan(""), 100, /*skipped=*/true));
  CHECK(all_skipped.mean_lm_loss() == 0.0);
  CHECK(all_skipped.elapsed_ms_per_iteration() == 100.0);
}

TEST_CASE("skipped and nan are counted apart: an fp16 overflow is skipped, not nan") {
  IntervalTotals totals;
  totals.add(fp16_record(1, 2.0, /*overflow=*/true, 2147483648.0));  // finite loss, inf grads
  totals.add(fp16_record(2, 4.0, /*overflow=*/false, 2147483648.0));
  totals.add(record(3, std::numeric_limits<double>::infinity(), 100, /*skipped=*/true));
  CHECK(totals.skipped_iterations == 2);
  CHECK(totals.nan_iterations == 1);
  CHECK(totals.advanced_iterations == 1);
  CHECK(totals.mean_lm_loss() == 4.0);  // the skipped iterations' losses are left out
  // Megatron looks for a non-finite loss among the skipped iterations only: a record marked
  // nan that still advanced is not a nan iteration.
  IterationRecord advanced = record(4, 1.0, 100);
  advanced.nan = true;
  IntervalTotals advanced_only;
  advanced_only.add(advanced);
  CHECK(advanced_only.nan_iterations == 0);
  CHECK(advanced_only.skipped_iterations == 0);
  // A caller that sets neither new field: skipped only, scale 1.0.
  IterationRecord plain{.iteration = 5, .lm_loss = 3.0, .skipped = true, .elapsed_ms = 1};
  CHECK(plain.loss_scale == 1.0);
  CHECK_FALSE(plain.nan);
  IntervalTotals plain_totals;
  plain_totals.add(plain);
  CHECK(plain_totals.skipped_iterations == 1);
  CHECK(plain_totals.nan_iterations == 0);
}

TEST_CASE("fp16: the line prints the last iteration's scale after its update, skips apart from nans") {
  std::ostringstream out;
  auto a = log_arguments();
  a.logging.log_interval = 4;
  TrainingLog log(a.logging, a.run, std::nullopt, out);
  // Dynamic scaling from 2^32 with hysteresis 2: the first overflow keeps the scale, the
  // second halves it; the line comes after that second one.
  log.add_iteration(fp16_record(1, 2.0, /*overflow=*/true, 4294967296.0), 1e-3);
  log.add_iteration(fp16_record(2, 3.0, /*overflow=*/false, 4294967296.0), 1e-3);
  log.add_iteration(fp16_record(3, 5.0, /*overflow=*/false, 4294967296.0), 1e-3);
  log.add_iteration(fp16_record(4, 2.5, /*overflow=*/true, 2147483648.0), 1e-3);
  const auto lines = lines_of(out.str());
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].substr(22) ==
        " iteration        4/      10 | consumed samples:           16 | elapsed time per "
        "iteration (ms): 100.0 | learning rate: 1.000000E-03 | global batch size:     4 | lm "
        "loss: 4.000000E+00 | loss scale: 2147483648.0 | grad norm: 2.000 | number of skipped "
        "iterations:   2 | number of nan iterations:   0 |");
}

TEST_CASE("the iteration line comes every --log-interval, from that interval's iterations alone") {
  std::ostringstream out;
  const LogSetup a = log_arguments();
  TrainingLog log(a.logging, a.run, std::nullopt, out);
  log.add_iteration(record(1, 2.0, 100), 7e-4);
  CHECK(out.str().empty());
  log.add_iteration(record(2, 4.0, 200), 6e-4);
  log.add_iteration(record(3, std::nan(""), 500, /*skipped=*/true), 6e-4);
  log.add_iteration(record(4, 5.0, 300), 5e-4);
  const auto lines = lines_of(out.str());
  REQUIRE(lines.size() == 2);
  // The learning rate is the next iteration's; grad norm and batch size the last iteration's.
  CHECK(lines[0].substr(22) ==
        " iteration        2/      10 | consumed samples:            8 | elapsed time per "
        "iteration (ms): 150.0 | learning rate: 6.000000E-04 | global batch size:     4 | lm "
        "loss: 3.000000E+00 | loss scale: 1.0 | grad norm: 1.000 | number of skipped "
        "iterations:   0 | number of nan iterations:   0 |");
  CHECK(lines[1].substr(22) ==
        " iteration        4/      10 | consumed samples:           16 | elapsed time per "
        "iteration (ms): 400.0 | learning rate: 5.000000E-04 | global batch size:     4 | lm "
        "loss: 5.000000E+00 | loss scale: 1.0 | grad norm: 2.000 | number of skipped "
        "iterations:   1 | number of nan iterations:   1 |");
}

TEST_CASE("--log-throughput: the TFLOP/s field, and the extension line when the peak is known") {
  auto a = log_arguments();
  a.logging.log_throughput = true;
  std::ostringstream out;
  TrainingLog log(a.logging, a.run, 1e12, out);
  log.add_iteration(record(1, 2.0, 100), 1e-3);
  log.add_iteration(record(2, 2.0, 100), 1e-3);
  const auto lines = lines_of(out.str());
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].find("| throughput per GPU (TFLOP/s/GPU): ") != std::string::npos);
  // 4 samples × 16 tokens in 0.1 s.
  CHECK(lines[1].rfind(" throughput: 640.0 tokens/s | MFU: ", 0) == 0);
}

TEST_CASE("an evaluation prints Megatron's block") {
  std::ostringstream out;
  const LogSetup a = log_arguments();
  TrainingLog log(a.logging, a.run, std::nullopt, out);
  log.add_evaluation("iteration 4 on test set", 4, 16, 2.0);
  const auto block = format_evaluation_block("iteration 4 on test set", 2.0);
  CHECK(lines_of(out.str()) == block);
}

TEST_CASE("TensorBoard: loss-scale is each written iteration's scale") {
  test_support::TemporaryDirectory temporary;
  auto a = log_arguments();
  a.logging.tensorboard_dir = (temporary.path / "tb").string();
  std::ostringstream out;
  TrainingLog log(a.logging, a.run, std::nullopt, out);
  log.add_iteration(fp16_record(1, 2.0, /*overflow=*/false, 65536.0), 1e-3);
  log.add_iteration(fp16_record(2, 2.0, /*overflow=*/true, 32768.0), 1e-3);
  log.close();
  const std::string bytes = test_support::read_file(
      std::filesystem::directory_iterator(temporary.path / "tb")->path());
  CHECK(bytes.find(scalar_value_bytes("loss-scale", 65536.0f)) != std::string::npos);
  CHECK(bytes.find(scalar_value_bytes("loss-scale", 32768.0f)) != std::string::npos);
  CHECK(bytes.find(scalar_value_bytes("loss-scale vs samples", 32768.0f)) != std::string::npos);
  CHECK(bytes.find(scalar_value_bytes("loss-scale", 1.0f)) == std::string::npos);
}

TEST_CASE("TensorBoard: --log-memory-to-tensorboard writes Megatron's mem-* tags of the record") {
  test_support::TemporaryDirectory temporary;
  auto a = log_arguments();
  a.logging.tensorboard_dir = (temporary.path / "tb").string();
  std::ostringstream out;
  {
    TrainingLog log(a.logging, a.run, std::nullopt, out);
    log.add_iteration(record(1, 2.0, 100), 1e-3);
    log.close();
  }
  auto events = [&] {
    return test_support::read_file(
        std::filesystem::directory_iterator(temporary.path / "tb")->path());
  };
  CHECK(events().find("mem-allocated-bytes") == std::string::npos);  // off by default
  std::filesystem::remove_all(temporary.path / "tb");
  a.logging.log_memory_to_tensorboard = true;
  {
    TrainingLog log(a.logging, a.run, std::nullopt, out);
    IterationRecord first = record(1, 2.0, 100);
    first.memory = {.allocated_bytes = 3 << 20, .peak_bytes = 5 << 20, .allocations = 7};
    log.add_iteration(first, 1e-3);
    log.close();
  }
  const std::string bytes = events();
  // Reserved is what is allocated (no caching allocator); the peak; the live blocks.
  CHECK(bytes.find(scalar_value_bytes("mem-reserved-bytes", 3145728.0f)) != std::string::npos);
  CHECK(bytes.find(scalar_value_bytes("mem-allocated-bytes", 3145728.0f)) != std::string::npos);
  CHECK(bytes.find(scalar_value_bytes("mem-max-allocated-bytes", 5242880.0f)) != std::string::npos);
  CHECK(bytes.find(scalar_value_bytes("mem-allocated-count", 7.0f)) != std::string::npos);
  // At the iteration only, as Megatron writes them: no "vs samples" twin.
  CHECK(bytes.find("mem-allocated-bytes vs samples") == std::string::npos);
}

TEST_CASE("TensorBoard: scalars every --tensorboard-log-interval, timers per line, validation") {
  test_support::TemporaryDirectory temporary;
  auto a = log_arguments();
  a.logging.tensorboard_dir = (temporary.path / "tb").string();
  a.logging.tensorboard_log_interval = 2;
  a.logging.log_interval = 4;
  a.logging.log_timers_to_tensorboard = true;
  a.logging.log_validation_ppl_to_tensorboard = true;
  std::ostringstream out;
  TrainingLog log(a.logging, a.run, std::nullopt, out);
  for (int64_t i = 1; i <= 4; ++i) log.add_iteration(record(i, 2.0, 100), 1e-3);
  log.add_evaluation("iteration 4", 4, 16, 2.0);
  log.close();
  // The version record; at iterations 2 and 4 learning-rate, batch-size, lm loss, loss-scale
  // and grad-norm, each also vs samples; iteration-time at the line of iteration 4; the
  // validation loss and perplexity, each also vs samples.
  CHECK(count_event_records(temporary.path / "tb") == 1 + 2 * 10 + 1 + 4);
  const std::string bytes = test_support::read_file(
      std::filesystem::directory_iterator(temporary.path / "tb")->path());
  for (const char* tag :
       {"iteration-time", "lm loss validation ppl vs samples", "grad-norm vs samples"}) {
    CAPTURE(tag);
    CHECK(bytes.find(tag) != std::string::npos);
  }
}
