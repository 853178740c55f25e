// ZeRO-3 end to end with real Open MPI ranks (mpirun --oversubscribe): Megatron-DeepSpeed's
// --deepspeed --deepspeed_config with zero_optimization.stage 3, with and without CPU offload,
// shards the parameters and gradients over DP=2 and DP=3 and trains the losses one process
// trains on the same global batch (within 1e-6 relative), its weights after 20 steps within
// 1e-5 (the checkpoint holds the gathered, one-process state), for a GPT-2-style model (tied
// embeddings, dropout) and a Llama-style one (untied output layer). A ZeRO-3 checkpoint resumes
// at ZeRO-3 bit for bit and at one process with the uninterrupted losses; ZeRO-3 with tensor
// parallelism is refused by name.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "e2e/mpi_runs.hpp"
#include "logged_losses.hpp"
#include "sanitized_build.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

using test_support::check_resumed_bit_for_bit;
using test_support::check_same_losses;
using test_support::check_staged_for;
using test_support::logged_losses;
using test_support::mpirun_path;
using test_support::output_tail;
using test_support::read_file;
using test_support::run_pretrain;
using test_support::stage_collectives_for;
using test_support::TemporaryDirectory;
using test_support::tensor_parallel_training_flags;
using test_support::weight_difference;

namespace {

fs::path write_config(const fs::path& directory, const std::string& name, const std::string& json) {
  const fs::path file = directory / name;
  std::ofstream(file) << json;
  return file;
}

std::vector<std::string> with_config(std::vector<std::string> flags, const fs::path& config) {
  flags.insert(flags.end(), {"--deepspeed", "--deepspeed_config", config.string()});
  return flags;
}

}  // namespace

TEST_CASE("ZeRO-3 with and without CPU offload over Open MPI trains as one process") {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  const fs::path zero3 = write_config(directory.path, "zero3.json",
                                      R"({"zero_optimization": {"stage": 3}})");
  const fs::path offload = write_config(
      directory.path, "zero3_offload.json",
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                "offload_param": {"device": "cpu", "pin_memory": true}}})");
  for (const std::string& style : test_support::model_styles()) {
    CAPTURE(style);
    const fs::path single_save = directory.path / (style + "_one");
    const fs::path single_log = directory.path / (style + "_one.log");
    REQUIRE(run_pretrain(1, tensor_parallel_training_flags(style, 1, single_save), single_log) ==
            0);
    const auto expected = logged_losses(read_file(single_log));
    REQUIRE(expected.size() == 20);
    {
      // DP=2 without offload.
      const fs::path save = directory.path / (style + "_zero3_dp2");
      const fs::path log = directory.path / (style + "_zero3_dp2.log");
      auto flags = with_config(tensor_parallel_training_flags(style, 1, save), zero3);
      stage_collectives_for(style, flags);
      const int status = run_pretrain(2, flags, log);
      const std::string output = read_file(log);
      INFO(output_tail(output));
      REQUIRE(status == 0);
      check_staged_for(style, output);
      check_same_losses(logged_losses(output), expected);
      std::string worst_tensor;
      const double difference = weight_difference(save, single_save, 20, &worst_tensor);
      CAPTURE(worst_tensor);
      CHECK(difference <= 1e-5);
    }
    // CPU offload on three ranks, against one process on the same 12-sample global batch.
    const std::vector<std::string> twelve = {"--global-batch-size", "12"};
    auto single_flags = tensor_parallel_training_flags(style, 1, single_save / "12");
    single_flags.insert(single_flags.end(), twelve.begin(), twelve.end());
    const fs::path single12_log = directory.path / (style + "_one12.log");
    REQUIRE(run_pretrain(1, single_flags, single12_log) == 0);
    const auto expected12 = logged_losses(read_file(single12_log));
    const fs::path save = directory.path / (style + "_zero3_dp3_offload");
    auto flags = tensor_parallel_training_flags(style, 1, save);
    flags.insert(flags.end(), twelve.begin(), twelve.end());
    const fs::path log = directory.path / (style + "_zero3_dp3_offload.log");
    stage_collectives_for(style, flags);
    const int status = run_pretrain(3, with_config(flags, offload), log);
    const std::string output = read_file(log);
    INFO(output_tail(output));
    REQUIRE(status == 0);
    check_staged_for(style, output);
    check_same_losses(logged_losses(output), expected12);
    CHECK(weight_difference(save, single_save / "12", 20) <= 1e-5);
  }
}

TEST_CASE("a ZeRO-3 checkpoint resumes at ZeRO-3 bit for bit and in one process") {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  const fs::path zero3 = write_config(directory.path, "zero3.json",
                                      R"({"zero_optimization": {"stage": 3}})");
  auto flags_for = [&](const fs::path& save) {
    return with_config(tensor_parallel_training_flags("gpt2", 1, save), zero3);
  };
  const fs::path whole_log = directory.path / "whole.log";
  REQUIRE(run_pretrain(2, flags_for(directory.path / "whole"), whole_log) == 0);
  const auto expected = logged_losses(read_file(whole_log));

  const fs::path save = directory.path / "halves";
  auto first_half = flags_for(save);
  first_half.insert(first_half.end(), {"--exit-interval", "10", "--eval-iters", "0"});
  REQUIRE(run_pretrain(2, first_half, directory.path / "first.log") == 0);
  auto second_half = flags_for(save);
  second_half.insert(second_half.end(), {"--load", save.string(), "--save",
                                         (directory.path / "second").string()});
  const fs::path log = directory.path / "second.log";
  REQUIRE(run_pretrain(2, second_half, log) == 0);
  const std::string output = read_file(log);
  INFO(output_tail(output));
  check_resumed_bit_for_bit(output, expected, 10);  // bit for bit: the same layout
  // The checkpoint is one process's state: one process resumes from it.
  auto one_process = tensor_parallel_training_flags("gpt2", 1, directory.path / "one");
  one_process.insert(one_process.end(), {"--load", save.string()});
  const fs::path one_log = directory.path / "one.log";
  REQUIRE(run_pretrain(1, one_process, one_log) == 0);
  check_same_losses(logged_losses(read_file(one_log)), expected, false);
}

TEST_CASE("ZeRO-3 with tensor parallelism is refused naming the flags") {
  TemporaryDirectory directory;
  const fs::path zero3 = write_config(directory.path, "zero3.json",
                                      R"({"zero_optimization": {"stage": 3}})");
  const fs::path log = directory.path / "refused.log";
  CHECK(run_pretrain(
            2, with_config(tensor_parallel_training_flags("gpt2", 2, directory.path / "s"), zero3),
            log) != 0);
  const std::string output = read_file(log);
  INFO(output_tail(output));
  CHECK(output.find("ZeRO stage 3 with tensor or pipeline parallelism is not built yet "
                    "(--tensor-model-parallel-size 2") != std::string::npos);
}
