// A Megatron-LM checkpoint continued here, end to end: write_megatron_checkpoints.py saves, with
// PyTorch, a GPT in Megatron core's structures at TP=2 × PP=2, iteration 20, with its AdamW
// state and learning-rate schedule; pretrain_gpt --load of it is refused with the checkpoint_util
// command that converts it; that command converts it to TP=1 with the optimizer state and prints
// how to continue; pretrain_gpt continues from iteration 20 with the consumed samples, the
// moments and the schedule carried over (the learning rate Megatron's schedule gives), and
// trains (finite losses, iterations 21 and 22, saved at --exit-interval). Four Open MPI ranks at
// the checkpoint's own layout load it directly (no conversion) and train the same losses.
// The other way: four ranks at TP=2 × PP=2 save with --ckpt-format torch; PyTorch loads every
// rank's model_optim_rng.pt (each stage's Megatron keys, the shards' shapes, the args' layout),
// the ranks resume from it bit for bit, and checkpoint_util converts it to one process, which
// continues with the same losses. With the distributed optimizer (four ranks at PP=2 × DP=2),
// each stage's distrib_optim.pt holds every parameter's state where Megatron's grad buffer puts
// it, and the ranks resume from it bit for bit.
// Four ranks at TP=2 × PP=2 save with --ckpt-format torch_dist: PyTorch's distributed-checkpoint
// reader reads every tensor whole from the four writers' files, the ranks resume from it bit for
// bit, and one process loads it directly and continues with the same losses.
// A Megatron core torch_dist checkpoint of the same model (PyTorch's distributed-checkpoint
// writer at TP=2 × PP=2) is loaded directly, resharded on load, by one process and by two ranks
// at TP=2, which continue with the converted legacy checkpoint's losses.
// Needs torch in Debian's /usr/bin/python3, as the unit tests of the reader
// (tests/backend/ckpt/megatron_checkpoint_test.cpp); skipped without it except under CI.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "e2e/mpi_runs.hpp"
#include "launcher/process.hpp"
#include "logged_losses.hpp"
#include "sanitized_build.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"
#include "tests/reference_tools.hpp"

namespace {

namespace fs = std::filesystem;
using test_support::kCheckpointUtil;
using test_support::kPretrainGpt;

// The data and schedule of write_megatron_checkpoints.py's runs (its args and
// opt_param_scheduler: cosine from 3e-4 to 3e-5 after 5 warmup iterations, 100 iterations of 8
// samples), on mock data, stopping after iteration `exit_interval`.
std::vector<std::string> schedule_flags(const std::string& exit_interval) {
  return {"--mock-data",
          "--micro-batch-size",
          "2",
          "--global-batch-size",
          "8",
          "--lr",
          "3e-4",
          "--min-lr",
          "3e-5",
          "--lr-decay-style",
          "cosine",
          "--lr-warmup-iters",
          "5",
          "--weight-decay",
          "0.1",
          "--adam-beta2",
          "0.95",
          "--train-iters",
          "100",
          "--exit-interval",
          exit_interval,
          "--eval-iters",
          "0",
          "--log-interval",
          "1"};
}

// The model write_megatron_checkpoints.py saves as gpt_core: four layers of width 16, four
// heads, FFN 32, sequences of 8, NullTokenizer's 41 tokens padded to 64 rows; no dropout.
std::vector<std::string> model_flags() {
  return {"--num-layers",
          "4",
          "--hidden-size",
          "16",
          "--num-attention-heads",
          "4",
          "--ffn-hidden-size",
          "32",
          "--seq-length",
          "8",
          "--max-position-embeddings",
          "8",
          "--tokenizer-type",
          "NullTokenizer",
          "--vocab-size",
          "40",
          "--make-vocab-size-divisible-by",
          "32",
          "--hidden-dropout",
          "0",
          "--attention-dropout",
          "0"};
}

// The output of a run that continued the fixtures' iteration 20 (160 samples) from `directory`
// until iteration 22: loaded, the samples and Megatron's cosine schedule carried on, finite.
void check_continued_from_iteration_20(const std::string& output, const fs::path& directory) {
  CHECK(output.find("successfully loaded checkpoint from " + directory.string()) !=
        std::string::npos);
  CHECK(output.find("iteration       21/     100") != std::string::npos);
  CHECK(output.find("consumed samples:          168") != std::string::npos);
  // Megatron's cosine schedule continued from the checkpoint's 160 samples: after iteration
  // 21's step, 168 of 800 (warmup 40) give 3e-5 + (3e-4 − 3e-5) · (1 + cos(π · 128/760)) / 2.
  CHECK(output.find("learning rate: 2.815396E-04") != std::string::npos);
  CHECK(output.find("iteration       22/     100") != std::string::npos);
  CHECK(output.find("number of nan iterations:   0") != std::string::npos);
  CHECK(output.find("lm loss: nan") == std::string::npos);
}

}  // namespace

TEST_CASE("a Megatron-LM checkpoint is converted by checkpoint_util and continues training") {
  if (!test_support::python_imports("torch, numpy", "python3-torch python3-numpy")) return;
  test_support::TemporaryDirectory temporary;
  const auto written = test_support::run_command(
      std::string(test_support::kPython) + " " + test_support::kTestSource +
      "/tests/backend/ckpt/write_megatron_checkpoints.py " + temporary.path.string());
  REQUIRE_MESSAGE(written.exit_status == 0, written.output);
  const fs::path megatron = temporary.path / "gpt_core";
  const fs::path converted = temporary.path / "converted";
  // The model write_megatron_checkpoints.py saved, and a run continuing it.
  std::vector<std::string> run = {kPretrainGpt};
  const std::vector<std::string> model = model_flags();
  run.insert(run.end(), model.begin(), model.end());
  const std::vector<std::string> schedule = schedule_flags("22");
  run.insert(run.end(), schedule.begin(), schedule.end());
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> argv = run;
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
  };

  // One process: the checkpoint's TP=2 × PP=2 is not this run's; the refusal names the command.
  const auto refused =
      launcher::run_and_capture(with({"--load", megatron.string(), "--no-load-rng"}));
  INFO(refused.output);
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("was saved with --tensor-model-parallel-size 2") != std::string::npos);
  CHECK(refused.output.find("checkpoint_util --load " + megatron.string() +
                            " --save NEWDIR --target-tensor-parallel-size 1 "
                            "--target-pipeline-parallel-size 1") != std::string::npos);

  const auto conversion =
      launcher::run_and_capture({kCheckpointUtil, "--load", megatron.string(), "--save",
                                 converted.string(), "--target-tensor-parallel-size", "1"});
  INFO(conversion.output);
  REQUIRE(conversion.exit_code == 0);
  CHECK(conversion.output.find("loading checkpoint from " + megatron.string() +
                               " at iteration 20") != std::string::npos);
  CHECK(conversion.output.find("(parameters and optimizer state)") != std::string::npos);
  CHECK(conversion.output.find("adding --no-load-rng (the checkpoint has no RNG state)") !=
        std::string::npos);

  const auto continued = launcher::run_and_capture(
      with({"--load", converted.string(), "--no-load-rng", "--save", converted.string()}));
  INFO(continued.output);
  REQUIRE(continued.exit_code == 0);
  check_continued_from_iteration_20(continued.output, converted);
  CHECK(fs::is_regular_file(converted / "iter_0000022" / "mp_rank_00" / "model_optim_rng.bin"));

  // Four Open MPI ranks at the checkpoint's own TP=2 × PP=2 load it directly, and continue with
  // the losses and learning rate of the converted run.
  REQUIRE_MESSAGE(!test_support::mpirun_path().empty(), "Open MPI's mpirun");
  const fs::path direct = temporary.path / "direct";
  std::vector<std::string> flags(run.begin() + 1, run.end());
  flags.insert(flags.end(),
               {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                "--load", megatron.string(), "--no-load-rng", "--save", direct.string()});
  const fs::path log = temporary.path / "direct.log";
  const int status = test_support::run_pretrain(4, flags, log);
  const std::string output = test_support::read_file(log);
  INFO(test_support::output_tail(output));
  REQUIRE(status == 0);
  CHECK(output.find("successfully loaded checkpoint from " + megatron.string() +
                    " [ t 1/2, p 1/2 ] at iteration 20") != std::string::npos);
  CHECK(output.find("learning rate: 2.815396E-04") != std::string::npos);
  const auto losses = test_support::logged_losses(output);
  CHECK(losses.size() == 2);
  test_support::check_same_losses(losses, test_support::logged_losses(continued.output));
  CHECK(fs::is_regular_file(direct / "iter_0000022" / "mp_rank_01_001" / "model_optim_rng.bin"));

  // --use-checkpoint-args takes the model from a Megatron checkpoint's args (a Llama-like model
  // saved by Megatron's bf16 optimizer at TP=1 × PP=1), and the run continues it directly.
  const fs::path llama = temporary.path / "llama_te";
  std::vector<std::string> from_checkpoint = {kPretrainGpt, "--use-checkpoint-args", "--load",
                                              llama.string(), "--no-load-rng"};
  const std::vector<std::string> until_21 = schedule_flags("21");
  from_checkpoint.insert(from_checkpoint.end(), until_21.begin(), until_21.end());
  const auto from_args = launcher::run_and_capture(from_checkpoint);
  INFO(from_args.output);
  REQUIRE(from_args.exit_code == 0);
  CHECK(from_args.output.find("Setting num_layers to 4 from checkpoint") != std::string::npos);
  CHECK(from_args.output.find("Setting num_query_groups to 2 from checkpoint") !=
        std::string::npos);
  CHECK(from_args.output.find("successfully loaded checkpoint from " + llama.string()) !=
        std::string::npos);
  CHECK(test_support::logged_losses(from_args.output).count(21) == 1);
}

TEST_CASE("a Megatron core torch_dist checkpoint continues here at layouts other than its own" *
          test_support::release_only()) {
  if (!test_support::python_imports("torch, numpy", "python3-torch python3-numpy")) return;
  REQUIRE_MESSAGE(!test_support::mpirun_path().empty(), "Open MPI's mpirun");
  test_support::TemporaryDirectory temporary;
  // The same GPT, moments and schedule at TP=2 × PP=2, saved by PyTorch in both of Megatron's
  // formats: legacy (gpt_core) and torch_dist (gpt_dist, by PyTorch's distributed-checkpoint
  // writer over four gloo ranks).
  for (const char* script : {"write_megatron_checkpoints.py", "write_torch_dist_checkpoints.py"}) {
    const auto written = test_support::run_command(
        std::string(test_support::kPython) + " " + test_support::kTestSource +
        "/tests/backend/ckpt/" + script + " " + temporary.path.string());
    REQUIRE_MESSAGE(written.exit_status == 0, written.output);
  }
  const fs::path dist = temporary.path / "gpt_dist";
  std::vector<std::string> run = model_flags();
  const std::vector<std::string> schedule = schedule_flags("22");
  run.insert(run.end(), schedule.begin(), schedule.end());
  run.insert(run.end(), {"--no-load-rng"});

  // The reference: the legacy checkpoint converted to TP=1 and continued.
  const fs::path converted = temporary.path / "converted";
  REQUIRE(launcher::run_and_capture({kCheckpointUtil, "--load",
                                     (temporary.path / "gpt_core").string(), "--save",
                                     converted.string(), "--target-tensor-parallel-size", "1"})
              .exit_code == 0);
  std::vector<std::string> reference = {kPretrainGpt};
  reference.insert(reference.end(), run.begin(), run.end());
  reference.insert(reference.end(), {"--load", converted.string()});
  const auto expected = launcher::run_and_capture(reference);
  INFO(expected.output);
  REQUIRE(expected.exit_code == 0);
  const auto expected_losses = test_support::logged_losses(expected.output);
  REQUIRE(expected_losses.size() == 2);

  // One process loads the torch_dist checkpoint directly: resharded on load from TP=2 × PP=2.
  std::vector<std::string> one = {kPretrainGpt};
  one.insert(one.end(), run.begin(), run.end());
  one.insert(one.end(), {"--load", dist.string(), "--save", (temporary.path / "one").string()});
  const auto direct = launcher::run_and_capture(one);
  INFO(direct.output);
  REQUIRE(direct.exit_code == 0);
  check_continued_from_iteration_20(direct.output, dist);
  test_support::check_same_losses(test_support::logged_losses(direct.output), expected_losses);

  // Two Open MPI ranks at TP=2 × PP=1, another layout again.
  std::vector<std::string> flags = run;
  flags.insert(flags.end(), {"--tensor-model-parallel-size", "2", "--load", dist.string(), "--save",
                             (temporary.path / "two").string()});
  const fs::path log = temporary.path / "two.log";
  const int status = test_support::run_pretrain(2, flags, log);
  const std::string output = test_support::read_file(log);
  INFO(test_support::output_tail(output));
  REQUIRE(status == 0);
  CHECK(output.find("successfully loaded checkpoint from " + dist.string() +
                    " [ t 1/2, p 1/1 ] at iteration 20") != std::string::npos);
  test_support::check_same_losses(test_support::logged_losses(output), expected_losses);
}

TEST_CASE("a run at TP=2 x PP=2 saved in Megatron's format: PyTorch reads it, runs continue it" *
          test_support::release_only()) {
  if (!test_support::python_imports("torch", "python3-torch")) return;
  REQUIRE_MESSAGE(!test_support::mpirun_path().empty(), "Open MPI's mpirun");
  test_support::TemporaryDirectory temporary;
  const fs::path saved = temporary.path / "megatron_format";
  const std::vector<std::string> model = model_flags();
  const std::vector<std::string> layout = {"--tensor-model-parallel-size", "2",
                                           "--pipeline-model-parallel-size", "2"};
  auto flags = [&](const std::string& exit_interval, std::vector<std::string> more) {
    std::vector<std::string> all = model;
    const std::vector<std::string> schedule = schedule_flags(exit_interval);
    all.insert(all.end(), schedule.begin(), schedule.end());
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  std::vector<std::string> first = flags("4", {"--save", saved.string(), "--ckpt-format", "torch"});
  first.insert(first.end(), layout.begin(), layout.end());
  const fs::path first_log = temporary.path / "first.log";
  const int first_status = test_support::run_pretrain(4, first, first_log);
  const std::string first_output = test_support::read_file(first_log);
  INFO(test_support::output_tail(first_output));
  REQUIRE(first_status == 0);
  CHECK(first_output.find("saving checkpoint at iteration       4 to " + saved.string() +
                          " in torch format") != std::string::npos);

  // Every rank's file as PyTorch loads it: stage 0 has the embedding and layers 0-1 of its
  // chunk, stage 1 its layers 0-1, the final norm and the tied head's copy; the vocabulary's
  // rows are split over the tensor-parallel ranks (64 padded rows: 32 each).
  for (const std::string stage : {"000", "001"}) {
    for (const std::string rank : {"00", "01"}) {
      CAPTURE(stage);
      CAPTURE(rank);
      const fs::path file =
          saved / "iter_0000004" / ("mp_rank_" + rank + "_" + stage) / "model_optim_rng.pt";
      const auto loaded = test_support::run_command(
          std::string(test_support::kPython) + " " + test_support::kTestSource +
          "/tests/backend/ckpt/load_torch_checkpoint.py " + file.string());
      REQUIRE_MESSAGE(loaded.exit_status == 0, loaded.output);
      const nlohmann::json root = nlohmann::json::parse(loaded.output)["value"]["dict"];
      std::map<std::string, nlohmann::json> top;
      for (const auto& entry : root) top[entry[0]] = entry[1];
      const nlohmann::json& args = top["args"]["namespace"];
      CHECK(args["tensor_model_parallel_size"] == 2);
      CHECK(args["pipeline_model_parallel_size"] == 2);
      CHECK(top["iteration"] == 4);
      std::map<std::string, std::vector<int64_t>> shapes;
      for (const auto& entry : top["model"]["ordered_dict"]) {
        if (!entry[1].is_null()) shapes[entry[0]] = entry[1]["shape"].get<std::vector<int64_t>>();
      }
      CHECK(shapes.count("decoder.layers.1.self_attention.linear_qkv.weight") == 1);
      CHECK(shapes.count("decoder.layers.2.self_attention.linear_qkv.weight") == 0);
      CHECK(shapes["decoder.layers.0.self_attention.linear_qkv.weight"] ==
            std::vector<int64_t>{24, 16});  // 3 × 16 rows, half of them
      if (stage == "000") {
        CHECK(shapes["embedding.word_embeddings.weight"] == std::vector<int64_t>{32, 16});
        CHECK(shapes.count("decoder.final_layernorm.weight") == 0);
      } else {
        CHECK(shapes.count("embedding.word_embeddings.weight") == 0);
        CHECK(shapes["output_layer.weight"] == std::vector<int64_t>{32, 16});
        CHECK(shapes["decoder.final_layernorm.weight"] == std::vector<int64_t>{16});
      }
      CHECK(top.count("optimizer") == 1);
      CHECK(top.count("opt_param_scheduler") == 1);
    }
  }

  // The ranks resume from it (the dropout position too) as from this backend's own format.
  const fs::path whole_log = temporary.path / "whole.log";
  std::vector<std::string> whole = flags("8", {"--save", (temporary.path / "whole").string()});
  whole.insert(whole.end(), layout.begin(), layout.end());
  REQUIRE(test_support::run_pretrain(4, whole, whole_log) == 0);
  const auto expected = test_support::logged_losses(test_support::read_file(whole_log));
  std::vector<std::string> resume =
      flags("6", {"--load", saved.string(), "--save", saved.string(), "--ckpt-format", "torch"});
  resume.insert(resume.end(), layout.begin(), layout.end());
  const fs::path resumed_log = temporary.path / "resumed.log";
  const int resumed_status = test_support::run_pretrain(4, resume, resumed_log);
  const std::string resumed = test_support::read_file(resumed_log);
  INFO(test_support::output_tail(resumed));
  REQUIRE(resumed_status == 0);
  test_support::check_resumed_bit_for_bit(resumed, expected, 2);

  // checkpoint_util, in Megatron's convert.py spelling, takes it (now at iteration 6) to one
  // process in Megatron's format (Transformer Engine's names, the saver's default); PyTorch
  // reads it, and one process continues it with the losses of the four ranks' uninterrupted run.
  const fs::path converted = temporary.path / "converted";
  const auto conversion = launcher::run_and_capture(
      {kCheckpointUtil, "--model-type", "GPT", "--loader", "mcore", "--saver", "mcore",
       "--load-dir", saved.string(), "--save-dir", converted.string(),
       "--target-tensor-parallel-size", "1", "--target-pipeline-parallel-size", "1"});
  INFO(conversion.output);
  REQUIRE(conversion.exit_code == 0);
  CHECK(conversion.output.find("written in Megatron-LM's format") != std::string::npos);
  const fs::path converted_file = converted / "iter_0000006" / "mp_rank_00" / "model_optim_rng.pt";
  const auto converted_loaded = test_support::run_command(
      std::string(test_support::kPython) + " " + test_support::kTestSource +
      "/tests/backend/ckpt/load_torch_checkpoint.py " + converted_file.string());
  REQUIRE_MESSAGE(converted_loaded.exit_status == 0, converted_loaded.output);
  const nlohmann::json converted_root =
      nlohmann::json::parse(converted_loaded.output)["value"]["dict"];
  std::map<std::string, nlohmann::json> converted_top;
  for (const auto& entry : converted_root) converted_top[entry[0]] = entry[1];
  CHECK(converted_top["args"]["namespace"]["tensor_model_parallel_size"] == 1);
  CHECK(converted_top["args"]["namespace"]["num_layers"] == 4);
  CHECK(converted_top["iteration"] == 6);
  std::set<std::string> converted_keys;
  for (const auto& entry : converted_top["model"]["ordered_dict"]) converted_keys.insert(entry[0]);
  CHECK(converted_keys.count("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight") == 1);
  CHECK(converted_keys.count("decoder.layers.3.input_layernorm.weight") == 0);
  CHECK(converted_keys.count("output_layer.weight") == 0);  // tied, at one stage
  CHECK(converted_top.count("optimizer") == 1);
  std::vector<std::string> one = {kPretrainGpt};
  const std::vector<std::string> continued_flags =
      flags("8", {"--load", converted.string(), "--save", converted.string()});
  one.insert(one.end(), continued_flags.begin(), continued_flags.end());
  const auto continued = launcher::run_and_capture(one);
  INFO(continued.output);
  REQUIRE(continued.exit_code == 0);
  const auto continued_losses = test_support::logged_losses(continued.output);
  CHECK(continued_losses.size() == 2);
  test_support::check_same_losses(continued_losses, expected, false);
}

TEST_CASE(
    "a run at TP=2 x PP=2 saved in torch_dist: PyTorch reads it, runs at any layout continue it" *
    test_support::release_only()) {
  if (!test_support::python_imports("torch", "python3-torch")) return;
  REQUIRE_MESSAGE(!test_support::mpirun_path().empty(), "Open MPI's mpirun");
  test_support::TemporaryDirectory temporary;
  const fs::path saved = temporary.path / "torch_dist";
  const std::vector<std::string> layout = {"--tensor-model-parallel-size", "2",
                                           "--pipeline-model-parallel-size", "2"};
  auto flags = [&](const std::string& exit_interval, std::vector<std::string> more) {
    std::vector<std::string> all = model_flags();
    const std::vector<std::string> schedule = schedule_flags(exit_interval);
    all.insert(all.end(), schedule.begin(), schedule.end());
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  std::vector<std::string> first =
      flags("4", {"--save", saved.string(), "--ckpt-format", "torch_dist"});
  first.insert(first.end(), layout.begin(), layout.end());
  const fs::path first_log = temporary.path / "first.log";
  const int first_status = test_support::run_pretrain(4, first, first_log);
  const std::string first_output = test_support::read_file(first_log);
  INFO(test_support::output_tail(first_output));
  REQUIRE(first_status == 0);
  const fs::path iteration = saved / "iter_0000004";
  for (const char* file : {"metadata.json", "common.pt", ".metadata", "__0_0.distcp",
                           "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"}) {
    CAPTURE(file);
    CHECK(fs::is_regular_file(iteration / file));
  }

  // PyTorch's own reader: every tensor at its global shape, from every writer's chunks.
  const auto read = test_support::run_command(
      std::string(test_support::kPython) + " " + test_support::kTestSource +
      "/tests/backend/ckpt/read_torch_dist_checkpoint.py " + iteration.string());
  REQUIRE_MESSAGE(read.exit_status == 0, read.output);
  const nlohmann::json tensors = nlohmann::json::parse(read.output)["tensors"];
  const nlohmann::json& qkv = tensors["decoder.layers.self_attention.linear_qkv.weight"];
  CHECK(qkv["shape"] == nlohmann::json::array({4, 48, 16}));
  CHECK(qkv["chunks"].size() == 8);  // 4 layers × 2 tensor-parallel shards
  CHECK(tensors["embedding.word_embeddings.weight"]["shape"] == nlohmann::json::array({64, 16}));
  CHECK(tensors["embedding.word_embeddings.weight"]["chunks"].size() == 2);
  // The row-parallel linear's second shard: layer 0's columns 8..15.
  const nlohmann::json& proj_chunks =
      tensors["decoder.layers.self_attention.linear_proj.weight"]["chunks"];
  CHECK(std::count(proj_chunks.begin(), proj_chunks.end(),
                   nlohmann::json::array({nlohmann::json::array({0, 0, 8}),
                                          nlohmann::json::array({1, 16, 8})})) == 1);
  CHECK(tensors.contains("optimizer.state.exp_avg_sq.decoder.final_layernorm.bias"));
  CHECK_FALSE(tensors.contains("output_layer.weight"));  // the tied copy is a replica

  // The ranks resume from it bit for bit.
  const fs::path whole_log = temporary.path / "whole.log";
  std::vector<std::string> whole = flags("8", {"--save", (temporary.path / "whole").string()});
  whole.insert(whole.end(), layout.begin(), layout.end());
  REQUIRE(test_support::run_pretrain(4, whole, whole_log) == 0);
  const auto expected = test_support::logged_losses(test_support::read_file(whole_log));
  std::vector<std::string> resume = flags(
      "6", {"--load", saved.string(), "--save", saved.string(), "--ckpt-format", "torch_dist"});
  resume.insert(resume.end(), layout.begin(), layout.end());
  const fs::path resumed_log = temporary.path / "resumed.log";
  const int resumed_status = test_support::run_pretrain(4, resume, resumed_log);
  const std::string resumed = test_support::read_file(resumed_log);
  INFO(test_support::output_tail(resumed));
  REQUIRE(resumed_status == 0);
  test_support::check_resumed_bit_for_bit(resumed, expected, 2);

  // One process loads it (now at iteration 6) directly, resharded on load, and continues with
  // the four ranks' losses.
  std::vector<std::string> one = {kPretrainGpt};
  const std::vector<std::string> continued_flags =
      flags("8", {"--load", saved.string(), "--save", (temporary.path / "one").string()});
  one.insert(one.end(), continued_flags.begin(), continued_flags.end());
  const auto continued = launcher::run_and_capture(one);
  INFO(continued.output);
  REQUIRE(continued.exit_code == 0);
  CHECK(continued.output.find("successfully loaded checkpoint from " + saved.string()) !=
        std::string::npos);
  const auto continued_losses = test_support::logged_losses(continued.output);
  CHECK(continued_losses.size() == 2);
  test_support::check_same_losses(continued_losses, expected, false);
}

TEST_CASE(
    "a run at PP=2 x DP=2 with the distributed optimizer saved in Megatron's format: "
    "distrib_optim.pt at Megatron's layout, and a bit-for-bit resume" *
    test_support::release_only()) {
  if (!test_support::python_imports("torch", "python3-torch")) return;
  REQUIRE_MESSAGE(!test_support::mpirun_path().empty(), "Open MPI's mpirun");
  test_support::TemporaryDirectory temporary;
  const fs::path saved = temporary.path / "megatron_format";
  auto flags = [&](const std::string& exit_interval, std::vector<std::string> more) {
    std::vector<std::string> all = model_flags();
    const std::vector<std::string> schedule = schedule_flags(exit_interval);
    all.insert(all.end(), schedule.begin(), schedule.end());
    all.insert(all.end(), {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"});
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  const fs::path first_log = temporary.path / "first.log";
  const int first_status = test_support::run_pretrain(
      4, flags("4", {"--save", saved.string(), "--ckpt-format", "torch"}), first_log);
  const std::string first_output = test_support::read_file(first_log);
  INFO(test_support::output_tail(first_output));
  REQUIRE(first_status == 0);

  // One distrib_optim.pt per stage, data-parallel rank 0's, holding both ranks' ranges: each
  // parameter's fp32 value where Megatron's grad buffer puts it (the stages' tied embedding
  // copies in buckets of their own) is the model's tensor, and its moments are there.
  for (const std::string stage : {"000", "001"}) {
    CAPTURE(stage);
    const fs::path rank = saved / "iter_0000004" / ("mp_rank_00_" + stage);
    CHECK(fs::is_regular_file(rank / "distrib_optim.pt"));
    CHECK_FALSE(fs::exists(rank / "distrib_optim_000.bin"));
    const auto dumped = test_support::run_command(
        std::string(test_support::kPython) + " " + test_support::kTestSource +
        "/tests/backend/ckpt/megatron_parameter_state.py " + rank.string());
    REQUIRE_MESSAGE(dumped.exit_status == 0, dumped.output);
    const nlohmann::json state = nlohmann::json::parse(dumped.output);
    CHECK(state["distributed"] == true);
    CHECK(state["parameters"].contains(stage == "000" ? "0:embedding.word_embeddings.weight"
                                                      : "0:output_layer.weight"));
    for (const auto& item : state["parameters"].items()) {
      CAPTURE(item.key());
      const nlohmann::json& parameter = item.value();
      CHECK(parameter["param"] == parameter["weight"]);
      const auto second_moments = parameter["exp_avg_sq"].get<std::vector<double>>();
      CHECK(std::any_of(second_moments.begin(), second_moments.end(),
                        [](double value) { return value > 0; }));
      CHECK(std::none_of(second_moments.begin(), second_moments.end(),
                         [](double value) { return value < 0; }));
    }
  }

  // The ranks resume from it as from an uninterrupted run.
  const fs::path whole_log = temporary.path / "whole.log";
  REQUIRE(test_support::run_pretrain(4, flags("8", {"--save", (temporary.path / "whole").string()}),
                                     whole_log) == 0);
  const auto expected = test_support::logged_losses(test_support::read_file(whole_log));
  const fs::path resumed_log = temporary.path / "resumed.log";
  const int resumed_status = test_support::run_pretrain(
      4, flags("6", {"--load", saved.string(), "--save", saved.string(), "--ckpt-format", "torch"}),
      resumed_log);
  const std::string resumed = test_support::read_file(resumed_log);
  INFO(test_support::output_tail(resumed));
  REQUIRE(resumed_status == 0);
  test_support::check_resumed_bit_for_bit(resumed, expected, 2);
}
