// End to end: NeMo's exp_manager defaults (a checkpoint callback, resume_if_exists) make a
// second launch of the same run resume from the first one's checkpoint, on the local
// cluster with the real launcher and pretrain_gpt, and leave the first one's files intact.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::read_file;

std::vector<std::string> tiny_run(const fs::path& results, int max_steps) {
  return {std::string(TEST_BIN_DIR) + "/launcher", "main", "training=gpt3/126m",
          "cluster_type=local", "base_results_dir=" + results.string(),
          "training.trainer.max_steps=" + std::to_string(max_steps),
          "training.model.global_batch_size=4", "training.model.micro_batch_size=2",
          "training.model.encoder_seq_length=32", "training.model.num_layers=2",
          "training.model.hidden_size=64", "training.model.num_attention_heads=4",
          "training.trainer.limit_val_batches=1"};
}

int count(const std::string& text, const std::string& pattern) {
  const std::regex expression(pattern);
  return static_cast<int>(std::distance(
      std::sregex_iterator(text.begin(), text.end(), expression), std::sregex_iterator()));
}

}  // namespace

TEST_CASE("launching the same run again resumes from its checkpoint and keeps the first one's") {
  test_support::TemporaryDirectory temporary;
  const fs::path checkpoints = temporary.path / "gpt3_126m" / "results" / "checkpoints";

  const auto first = launcher::run_and_capture(tiny_run(temporary.path, 3));
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  // No checkpoint yet: Megatron's warning, a start from scratch, a save of the last step.
  CHECK(first.output.find("WARNING: could not find the metadata file " + checkpoints.string() +
                          "/latest_checkpointed_iteration.txt") != std::string::npos);
  CHECK(count(first.output, R"( iteration +1/ +3 \|)") == 1);
  CHECK(first.output.find("successfully saved checkpoint from iteration       3 to " +
                          checkpoints.string()) != std::string::npos);
  const fs::path first_checkpoint = checkpoints / "iter_0000003" / "mp_rank_00" / "model_optim_rng.bin";
  REQUIRE(fs::is_regular_file(first_checkpoint));
  const std::string first_bytes = read_file(first_checkpoint);

  // The second launch trains further: it resumes at 3 and runs 4 and 5.
  const auto second = launcher::run_and_capture(tiny_run(temporary.path, 5));
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK(second.output.find(" loading checkpoint from " + checkpoints.string() + " at iteration 3\n") !=
        std::string::npos);
  CHECK(second.output.find("  successfully loaded checkpoint from " + checkpoints.string() +
                           " [ t 1/1, p 1/1 ] at iteration 3") != std::string::npos);
  CHECK(count(second.output, R"( iteration +[1-3]/ +5 \|)") == 0);
  CHECK(count(second.output, R"( iteration +4/ +5 \| consumed samples: +16 \|)") == 1);
  CHECK(count(second.output, R"( iteration +5/ +5 \| consumed samples: +20 \|)") == 1);
  CHECK(read_file(checkpoints / "latest_checkpointed_iteration.txt") == "5");

  // The first launch's checkpoint is still there, byte for byte, and so are both job logs.
  CHECK(read_file(first_checkpoint) == first_bytes);
  CHECK(fs::is_regular_file(checkpoints / "iter_0000005" / "mp_rank_00" / "model_optim_rng.bin"));
  int job_logs = 0;
  for (const auto& entry : fs::directory_iterator(temporary.path / "gpt3_126m")) {
    if (entry.path().filename().string().starts_with("log-gpt3_126m_")) ++job_logs;
  }
  CHECK(job_logs == 2);
  // The job script carries the flags the exp_manager keys map to.
  const std::string script = read_file(temporary.path / "gpt3_126m" / "gpt3_126m_submission.sh");
  CHECK(script.find("--save") != std::string::npos);
  CHECK(script.find("--use-checkpoint-opt_param-scheduler") != std::string::npos);
}

TEST_CASE("the jobs of a multirun keep their own checkpoints and never resume each other's") {
  // Before each job had its own run.results_dir in the config, every job's exp_manager log dir
  // (hence --save/--load) was the same: job 1 resumed job 0's checkpoint.
  test_support::TemporaryDirectory temporary;
  auto command = tiny_run(temporary.path, 2);
  command.insert(command.begin() + 2, "-m");
  command.push_back("training.model.micro_batch_size=1,2");
  const auto sweep = launcher::run_and_capture(command);
  INFO(sweep.output);
  REQUIRE(sweep.exit_code == 0);
  CHECK(sweep.output.find("loading checkpoint from") == std::string::npos);
  for (const char* job : {"0", "1"}) {
    CAPTURE(job);
    const fs::path checkpoints = temporary.path / "gpt3_126m" / job / "results" / "checkpoints";
    CHECK(fs::is_regular_file(checkpoints / "iter_0000002" / "mp_rank_00" / "model_optim_rng.bin"));
    CHECK(read_file(checkpoints / "latest_checkpointed_iteration.txt") == "2");
  }
  CHECK_FALSE(fs::exists(temporary.path / "gpt3_126m" / "results"));
}
