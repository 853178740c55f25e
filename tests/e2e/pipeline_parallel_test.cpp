// Pipeline parallelism end to end with real Open MPI ranks (mpirun --oversubscribe on the CI's
// two cores): PP=2 (1F1B), PP=4 and PP=2 with the interleaved schedule (two chunks per stage; its
// transfers overlapped, Megatron's default, and at PP=4 also not) and TP=2 × PP=2 × DP=2 on eight
// ranks with the distributed optimizer and sequence parallelism (each also with
// --overlap-grad-reduce: PP=2 × DP=2 and the eight ranks) train the losses one process trains on
// the same global batch, and the weights after 20 steps (every stage's and tensor-parallel rank's
// file of mp_rank_XX_YYY, assembled) agree with one process's within 1e-5, for a GPT-2-style model
// (tied embeddings, hidden dropout) and a Llama-style one (GQA, SwiGLU, RoPE, untied output layer).
// A PP=2 checkpoint resumes with the uninterrupted losses, and loading it with another pipeline
// size is refused with the resharding command.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "bounded_run.hpp"
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
using test_support::release_only;
using test_support::run_pretrain;
using test_support::stage_collectives_for;
using test_support::TemporaryDirectory;
using test_support::tensor_parallel_training_flags;
using test_support::weight_difference;

namespace {

// The tensor-parallel tests' model with 8 layers (4 stages of two, or of two chunks).
std::vector<std::string> pipeline_training_flags(const std::string& style, int tensor_parallel,
                                                 const fs::path& save) {
  auto flags = tensor_parallel_training_flags(style, tensor_parallel, save);
  const auto layers = std::find(flags.begin(), flags.end(), "--num-layers");
  *(layers + 1) = "8";
  return flags;
}

}  // namespace

// release-only: 3 minutes under the sanitizers; the sanitized build runs the pipeline schedule
// over Open MPI in "a PP=2 checkpoint resumes at PP=2" (checkpoint tests) and the schedules'
// unit tests.
TEST_CASE(
    "PP=2, PP=4 interleaved and TP=2 x PP=2 x DP=2 over Open MPI, with and without "
    "--overlap-grad-reduce, train as one process" *
    release_only()) {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  for (const std::string style : {"gpt2", "llama"}) {
    CAPTURE(style);
    const fs::path single_save = directory.path / (style + "_one");
    const fs::path single_log = directory.path / (style + "_one.log");
    REQUIRE(run_pretrain(1, pipeline_training_flags(style, 1, single_save), single_log) == 0);
    const auto expected = logged_losses(read_file(single_log));
    REQUIRE(expected.size() == 20);
    struct Layout {
      int ranks;
      int tensor_parallel;
      int pipeline_parallel;
      bool interleaved;
      bool overlap = false;  // --overlap-grad-reduce, every unit its own bucket
      bool blocking_p2p = false;  // --no-overlap-p2p-communication (interleaved)
    };
    // With --overlap-grad-reduce: PP=2 x DP=2 all-reducing each unit's bucket as the last micro
    // batch's backward on its stage finishes it, and TP=2 x PP=2 x DP=2 reduce-scattering them
    // into the distributed optimizer's shards (then summing the norms over the tensor-parallel
    // group on the shards); except where the word embedding is tied across the stages (the
    // GPT-2 style), whose two gradients are summed on the whole buffer: reduced after the
    // backward there, with a warning.
    // The interleaved schedule overlaps its pipeline transfers by default (PP=4, and PP=2, which
    // only the overlap allows) and completes each batch before the next compute with
    // --no-overlap-p2p-communication: the same losses, to the bit.
    std::map<std::string, std::map<int, double>> interleaved_losses;
    for (const Layout layout :
         {Layout{2, 1, 2, false}, Layout{4, 1, 4, true}, Layout{4, 1, 4, true, false, true},
          Layout{2, 1, 2, true}, Layout{8, 2, 2, false}, Layout{4, 1, 2, false, true},
          Layout{8, 2, 2, false, true}}) {
      const std::string name = fmt::format(
          "{}_tp{}_pp{}_np{}{}{}{}", style, layout.tensor_parallel, layout.pipeline_parallel,
          layout.ranks, layout.interleaved ? "_interleaved" : "", layout.overlap ? "_overlap" : "",
          layout.blocking_p2p ? "_blocking_p2p" : "");
      CAPTURE(name);
      const fs::path save = directory.path / name;
      const fs::path log = directory.path / (name + ".log");
      auto flags = pipeline_training_flags(style, layout.tensor_parallel, save);
      flags.insert(flags.end(),
                   {"--pipeline-model-parallel-size", std::to_string(layout.pipeline_parallel)});
      // Two chunks per stage: of one layer at PP=4, of two at PP=2.
      if (layout.interleaved) {
        flags.insert(flags.end(), {"--num-layers-per-virtual-pipeline-stage",
                                   std::to_string(8 / layout.pipeline_parallel / 2)});
      }
      if (layout.blocking_p2p) flags.push_back("--no-overlap-p2p-communication");
      if (layout.ranks == 8) {
        flags.insert(flags.end(), {"--use-distributed-optimizer", "--sequence-parallel"});
      }
      if (layout.overlap) {
        flags.insert(flags.end(), {"--overlap-grad-reduce", "--ddp-bucket-size", "1"});
      }
      stage_collectives_for(style, flags);
      const int status = run_pretrain(layout.ranks, flags, log);
      const std::string output = read_file(log);
      INFO(output_tail(output));
      REQUIRE(status == 0);
      check_staged_for(style, output);
      if (layout.overlap) {
        const bool after_backward = layout.ranks == 8 && style == "gpt2";
        // A warning of the flags, said once by rank 0 rather than by each of the eight ranks.
        size_t warnings = 0;
        for (size_t at = output.find("a word embedding tied across pipeline stages");
             at != std::string::npos;
             at = output.find("a word embedding tied across pipeline stages", at + 1)) {
          ++warnings;
        }
        CHECK(warnings == (after_backward ? 1u : 0u));
        // Rank 0's stage: the embedding and four layers, each its own bucket.
        CHECK((output.find("\nNumber of buckets for gradient all-reduce / reduce-scatter: 5\n") !=
               std::string::npos) == !after_backward);
      }
      int lines = 0;
      check_same_losses(logged_losses(output, &lines), expected);
      if (layout.interleaved && layout.pipeline_parallel == 4) {
        interleaved_losses[layout.blocking_p2p ? "blocking" : "overlapped"] = logged_losses(output);
      }
      CHECK(lines == 20);  // printed once, by the last rank
      CHECK(output.find(fmt::format("> initialized pipeline model parallel with size {}",
                                    layout.pipeline_parallel)) != std::string::npos);
      CHECK(output.find(fmt::format("model parallel rank (0, {}): ",
                                    layout.pipeline_parallel - 1)) != std::string::npos);
      CHECK(output.find(fmt::format("[ t 1/{}, p 1/{} ]", layout.tensor_parallel,
                                    layout.pipeline_parallel)) != std::string::npos);
      CHECK(fs::is_regular_file(backend::checkpoint_file_path(
          save, 20, layout.tensor_parallel - 1, layout.pipeline_parallel - 1,
          layout.pipeline_parallel)));
      CHECK_FALSE(fs::exists(backend::checkpoint_file_path(save, 20, 0)));  // no mp_rank_00
      std::string worst_tensor;
      const double difference = weight_difference(save, single_save, 20, &worst_tensor);
      CAPTURE(worst_tensor);
      CHECK(difference <= 1e-5);
    }
    REQUIRE(interleaved_losses.size() == 2);
    CHECK(interleaved_losses["overlapped"] == interleaved_losses["blocking"]);
  }
}

TEST_CASE("a PP=2 checkpoint resumes at PP=2 with the uninterrupted losses — another size is refused") {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  auto pipelined = [&](const fs::path& save) {
    auto flags = pipeline_training_flags("gpt2", 1, save);
    flags.insert(flags.end(), {"--pipeline-model-parallel-size", "2"});
    return flags;
  };
  const fs::path whole_save = directory.path / "whole";
  const fs::path whole_log = directory.path / "whole.log";
  REQUIRE(run_pretrain(2, pipelined(whole_save), whole_log) == 0);
  const auto expected = logged_losses(read_file(whole_log));

  const fs::path save = directory.path / "halves";
  auto first_half = pipelined(save);
  first_half.insert(first_half.end(), {"--exit-interval", "10", "--eval-iters", "0"});
  REQUIRE(run_pretrain(2, first_half, directory.path / "first.log") == 0);
  auto second_half = pipelined(save);
  second_half.insert(second_half.end(), {"--load", save.string()});
  const fs::path log = directory.path / "second.log";
  REQUIRE(run_pretrain(2, second_half, log) == 0);
  const std::string output = read_file(log);
  INFO(output_tail(output));
  check_resumed_bit_for_bit(output, expected, 10);  // bit for bit: the same layout

  // One process with the PP=2 save: refused, naming both sizes and the resharding command.
  auto one_process = pipeline_training_flags("gpt2", 1, directory.path / "other");
  one_process.insert(one_process.end(), {"--load", save.string()});
  const fs::path refused_log = directory.path / "refused.log";
  CHECK(run_pretrain(1, one_process, refused_log) != 0);
  const std::string refused = read_file(refused_log);
  INFO(output_tail(refused));
  CHECK(refused.find("was saved with --pipeline-model-parallel-size 2") != std::string::npos);
  CHECK(refused.find("--target-tensor-parallel-size 1 --target-pipeline-parallel-size 1, then "
                     "--load NEWDIR") != std::string::npos);
}

TEST_CASE("pipeline layouts Megatron refuses are refused before training, naming the flags" *
          test_support::release_only()) {
  TemporaryDirectory directory;
  struct Refusal {
    std::vector<std::string> flags;
    int ranks;
    std::string message;
  };
  const std::vector<Refusal> refusals = {
      {{"--pipeline-model-parallel-size", "3"},
       3,
       "--num-layers 8 must be divisible by --pipeline-model-parallel-size 3"},
      {{"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2",
        "--no-overlap-p2p-communication"},
       2,
       "needs --pipeline-model-parallel-size greater than 2"},
      {{"--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "3"},
       4,
       "--num-layers-per-virtual-pipeline-stage 3 must divide the 2 layers of each pipeline stage"},
      {{"--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "1",
        "--global-batch-size", "6"},
       4,
       "divisible by --pipeline-model-parallel-size 4"},
  };
  for (const Refusal& refusal : refusals) {
    CAPTURE(refusal.message);
    auto flags = pipeline_training_flags("gpt2", 1, directory.path / "save");
    flags.insert(flags.end(), refusal.flags.begin(), refusal.flags.end());
    const fs::path log = directory.path / "refused.log";
    CHECK(run_pretrain(refusal.ranks, flags, log) != 0);
    const std::string output = read_file(log);
    INFO(output_tail(output));
    CHECK(output.find(refusal.message) != std::string::npos);
  }
}
