// Megatron-DeepSpeed's --deepspeed --deepspeed_config FILE [--zero-stage N] (deepspeed_config.hpp):
// the JSON of Megatron-DeepSpeed's example scripts maps onto the distributed optimizer, fp16 loss
// scaling, the batch sizes and clipping; what is not built (ZeRO-3, offload, an optimizer
// section, unknown keys) is refused naming the file and the key.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/train/arguments.hpp"
#include "temporary_directory.hpp"

namespace {

const std::string kData = std::string(TEST_SOURCE_DIR) + "/tests/data/deepspeed/";

std::vector<std::string> flags_with(std::vector<std::string> extra) {
  std::vector<std::string> words = {
      "pretrain_gpt", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--train-iters", "10", "--lr", "1e-3", "--mock-data",
      "--vocab-size", "100", "--micro-batch-size", "2"};
  words.insert(words.end(), extra.begin(), extra.end());
  return words;
}

std::optional<backend::TrainingArguments> parse(const std::vector<std::string>& words) {
  std::vector<const char*> argv;
  for (const auto& word : words) argv.push_back(word.c_str());
  return backend::parse_arguments(static_cast<int>(argv.size()), argv.data());
}

std::string write(const test_support::TemporaryDirectory& directory, const std::string& name,
                  const std::string& text) {
  const auto path = directory.path / name;
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace

TEST_CASE("a ZeRO-2 + fp16 configuration of Megatron-DeepSpeed's examples maps onto our flags") {
  const auto arguments =
      parse(flags_with({"--deepspeed", "--deepspeed_config", kData + "ds_config_gpt_zero2.json",
                        "--zero-stage", "2"}));
  REQUIRE(arguments);
  CHECK(arguments->deepspeed);
  CHECK(arguments->parallelism.zero_stage == 2);
  CHECK(arguments->parallelism.use_distributed_optimizer);
  CHECK(arguments->precision.fp16);
  CHECK_FALSE(arguments->precision.bf16);
  CHECK_FALSE(arguments->precision.loss_scale.has_value());  // 0: dynamic
  CHECK(arguments->precision.initial_loss_scale == 2048.0);  // 2^11
  CHECK(arguments->precision.loss_scale_window == 500);
  CHECK(arguments->precision.hysteresis == 2);
  CHECK(arguments->precision.min_loss_scale == 1.0);
  CHECK(arguments->run.micro_batch_size == 2);   // train_micro_batch_size_per_gpu
  CHECK(arguments->run.global_batch_size == 8);  // train_batch_size
  CHECK(arguments->optimizer.clip_grad == 1.0);
  // overlap_comm: the reduction in buckets of reduce_bucket_size during the backward.
  CHECK(arguments->parallelism.overlap_grad_reduce);
  CHECK(arguments->parallelism.ddp_bucket_size == 50'000'000);
  const auto values = backend::argument_values(*arguments);
  CHECK(values.at("deepspeed") == "True");
  CHECK(values.at("zero_stage") == "2");
}

TEST_CASE("overlap_comm and reduce_bucket_size map onto --overlap-grad-reduce at stages 1 and 2") {
  test_support::TemporaryDirectory directory;
  // DeepSpeed's default bucket (5e8 elements) when the file gives none; a float that is a whole
  // number is one.
  const auto plain = write(directory, "plain.json",
                           R"({"zero_optimization": {"stage": 1, "overlap_comm": true}})");
  auto arguments = parse(flags_with({"--deepspeed", "--deepspeed_config", plain}));
  REQUIRE(arguments);
  CHECK(arguments->parallelism.overlap_grad_reduce);
  CHECK(arguments->parallelism.ddp_bucket_size == 500'000'000);
  const auto written = write(directory, "written.json",
                             R"({"zero_optimization": {"stage": 2, "overlap_comm": true,
                                 "reduce_bucket_size": 2e7, "allgather_bucket_size": 5e8}})");
  arguments = parse(flags_with({"--deepspeed", "--deepspeed_config", written}));
  REQUIRE(arguments);
  CHECK(arguments->parallelism.ddp_bucket_size == 20'000'000);
  arguments = parse(
      flags_with({"--deepspeed", "--deepspeed_config", written, "--ddp-bucket-size", "20000000"}));
  REQUIRE(arguments);
  CHECK_THROWS_WITH_AS(
      parse(flags_with({"--deepspeed", "--deepspeed_config", written, "--ddp-bucket-size", "5"})),
      doctest::Contains("zero_optimization.reduce_bucket_size 20000000 disagrees with "
                        "--ddp-bucket-size 5"),
      common::Error);
  // Without overlap_comm nothing changes; stage 3's overlap is not built, so it maps to nothing.
  const auto off = write(directory, "off.json",
                         R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1000}})");
  arguments = parse(flags_with({"--deepspeed", "--deepspeed_config", off}));
  REQUIRE(arguments);
  CHECK_FALSE(arguments->parallelism.overlap_grad_reduce);
  CHECK_FALSE(arguments->parallelism.ddp_bucket_size.has_value());
  const auto fraction = write(directory, "fraction.json",
                              R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 2.5}})");
  CHECK_THROWS_WITH_AS(parse(flags_with({"--deepspeed", "--deepspeed_config", fraction})),
                       doctest::Contains("zero_optimization.reduce_bucket_size is 2.5; expected a "
                                         "whole number of elements ≥ 1"),
                       common::Error);
}

TEST_CASE("stage 0 and stage 1 and the flags' agreement with the file") {
  test_support::TemporaryDirectory directory;
  const auto stage1 = write(directory, "stage1.json",
                            R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                                "gradient_accumulation_steps": 4,
                                "zero_optimization": {"stage": 1}, "gradient_clipping": 0.5,
                                "bf16": {"enabled": true}})");
  auto arguments = parse(flags_with({"--deepspeed", "--deepspeed_config", stage1}));
  REQUIRE(arguments);
  CHECK(arguments->parallelism.use_distributed_optimizer);
  CHECK(arguments->precision.bf16);
  CHECK(arguments->run.global_batch_size == 8);
  CHECK(arguments->optimizer.clip_grad == 0.5);
  const auto stage0 = write(directory, "stage0.json", R"({"zero_optimization": {"stage": 0}})");
  arguments = parse(flags_with({"--deepspeed", "--deepspeed_config", stage0,
                                "--micro-batch-size", "2", "--global-batch-size", "4"}));
  REQUIRE(arguments);
  CHECK_FALSE(arguments->parallelism.use_distributed_optimizer);
  // The flags and the file must agree where both speak.
  CHECK_THROWS_WITH_AS(parse(flags_with({"--deepspeed", "--deepspeed_config", stage1,
                                         "--global-batch-size", "32"})),
                       doctest::Contains("train_batch_size 8 disagrees with --global-batch-size 32"),
                       common::Error);
  CHECK_THROWS_WITH_AS(parse(flags_with({"--deepspeed", "--deepspeed_config", stage1,
                                         "--clip-grad", "1.0"})),
                       doctest::Contains("gradient_clipping 0.5 disagrees with --clip-grad 1"),
                       common::Error);
  CHECK_THROWS_WITH_AS(parse(flags_with({"--deepspeed", "--deepspeed_config", stage1,
                                         "--zero-stage", "2"})),
                       doctest::Contains("--zero-stage 2 disagrees with zero_optimization.stage 1"),
                       common::Error);
  const auto accumulation = write(directory, "accumulation.json",
                                  R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                                      "gradient_accumulation_steps": 2})");
  CHECK_THROWS_WITH_AS(parse(flags_with({"--deepspeed", "--deepspeed_config", accumulation})),
                       doctest::Contains("gradient_accumulation_steps 2 × micro batch 2 × "
                                         "data-parallel size 1 = 4 is not the global batch size 16"),
                       common::Error);
}

TEST_CASE("what is not built is refused naming the file and the key") {
  test_support::TemporaryDirectory directory;
  struct Case {
    std::string json, message;
  };
  const std::vector<Case> cases = {
      {R"({"zero_optimization": {"stage": 0, "cpu_offload": true}})",
       "optimizer offload needs a ZeRO stage of 1 to 3 (DeepSpeed's rule), got stage 0"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})",
       "zero_optimization.offload_optimizer.device is \"nvme\": offload to \"cpu\" is built, not "
       "to \"nvme\""},
      {R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
       "zero_optimization.offload_param.device needs ZeRO stage 3"},
      {R"({"zero_optimization": {"stage": 2, "zero_quantized_weights": true}})",
       "zero_optimization.zero_quantized_weights is not supported"},
      {R"({"optimizer": {"type": "Adam", "params": {"lr": 0.001}}})",
       "optimizer is not supported: this backend trains with Megatron's own optimizer"},
      {R"({"scheduler": {}, "activation_checkpointing": {}})",
       "activation_checkpointing, scheduler are not supported"},
      {R"({"fp16": {"enabled": true, "auto_cast": true}})", "fp16.auto_cast is not supported"},
      {R"({"fp16": {"enabled": true, "loss_scale": -1}})", "fp16.loss_scale is -1"},
      {R"({"zero_optimization": {"stage": "two"}})",
       "zero_optimization.stage is \"two\"; expected an integer ≥ 0"},
      {R"({"zero_optimization": {"stage": 4}})", "ZeRO stage 4"},
      {R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})", "enables both fp16 and bf16"},
      {R"({"curriculum_learning": {"enabled": true}})", "curriculum_learning.enabled true is not built"},
      {R"([1, 2])", "expected a JSON object at the top"},
      {R"({"train_batch_size": )", "not valid JSON"},
  };
  int index = 0;
  for (const auto& c : cases) {
    CAPTURE(c.json);
    const auto file = write(directory, "case" + std::to_string(index++) + ".json", c.json);
    CHECK_THROWS_WITH_AS(parse(flags_with({"--deepspeed", "--deepspeed_config", file})),
                         doctest::Contains(c.message.c_str()), common::Error);
  }
  // ZeRO-3 with tensor or pipeline parallelism, or on a GPU, is not built.
  const std::string zero3 = kData + "ds_config_gpt_zero3_offload.json";
  CHECK_THROWS_WITH_AS(
      parse(flags_with({"--deepspeed", "--deepspeed_config", zero3, "--device", "cuda"})),
      doctest::Contains("ZeRO stage 3 and offload run on CPU ranks (--device cpu)"),
      common::Error);
}

TEST_CASE("Megatron-DeepSpeed's ZeRO-3 + CPU offload configuration maps to ZeRO-3 with offload") {
  const auto a = parse(flags_with(
      {"--deepspeed", "--deepspeed_config", kData + "ds_config_gpt_zero3_offload.json",
       "--zero-stage", "3"}));
  REQUIRE(a.has_value());
  CHECK(a->parallelism.zero_stage == 3);
  CHECK_FALSE(a->parallelism.use_distributed_optimizer);
  CHECK(a->parallelism.offload_optimizer);
  CHECK_FALSE(a->parallelism.offload_parameters);
  CHECK(a->run.global_batch_size == 8);
  CHECK(a->run.micro_batch_size == 2);
}
