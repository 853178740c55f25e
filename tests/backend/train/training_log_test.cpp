// Megatron's log lines, compared character by character with the format in the issue.
#include <doctest/doctest.h>

#include "backend/train/training_log.hpp"

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
}
