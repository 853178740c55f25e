// checkpoint_util --target-tensor-parallel-size, end to end with real Open MPI ranks: a run
// stopped at iteration 10 at TP=2, refused at TP=1 with the resharding command, resharded by
// that very command and resumed by one process, trains the losses of the uninterrupted TP=2 run
// (within 1e-6 relative); TP=1 → TP=2 under mpirun -np 2 likewise, for a GPT-2-style and a
// Llama-style model (tensor_parallel_training_flags). A round trip TP=2 → 1 → 2 gives back
// every tensor (parameters and Adam moments) bit for bit, and every metadata field but the
// record of the resharding, and --export-hf of the TP=2 checkpoint writes the files the TP=1
// one gives; a change of the padded vocabulary cuts its padding rows or adds
// copies of the last row, and the result trains; bad input exits 2 naming the flag or file,
// with nothing written. With pipeline stages: a TP=2 × PP=2 run stopped at iteration 10
// (mp_rank_XX_YYY files, the last stage holding the tied copy of the word embedding), refused
// by one process with the resharding command, resharded by it to TP=1 × PP=1 and resumed by one
// process, trains the uninterrupted TP=2 × PP=2 run's losses within 1e-6 relative; resharded
// back to TP=2 × PP=2 it is the original checkpoint bit for bit and resumes with the
// uninterrupted losses exactly; --export-hf reads the pipelined files whole.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_file.hpp"
#include "bounded_run.hpp"
#include "e2e/mpi_runs.hpp"
#include "launcher/process.hpp"
#include "logged_losses.hpp"
#include "sanitized_build.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using test_support::check_resumed_bit_for_bit;
using test_support::check_same_losses;
using test_support::logged_losses;
using test_support::mpirun_path;
using test_support::output_tail;
using test_support::read_file;
using test_support::release_only;
using test_support::run_pretrain;
using test_support::TemporaryDirectory;
using test_support::tensor_parallel_training_flags;
using test_support::whole_parameters;

namespace fs = std::filesystem;

namespace {

using test_support::kCheckpointUtil;

std::vector<std::string> with(std::vector<std::string> flags, const std::vector<std::string>& more) {
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

// The first half of a run: iterations 1..10, saved at 10.
std::vector<std::string> first_half(const std::string& style, int tensor_parallel,
                                    const fs::path& save) {
  return with(tensor_parallel_training_flags(style, tensor_parallel, save),
              {"--exit-interval", "10", "--eval-iters", "0"});
}

launcher::CapturedRun checkpoint_util(const std::vector<std::string>& arguments) {
  std::vector<std::string> argv = {kCheckpointUtil};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  return launcher::run_and_capture(argv);
}

// pretrain_gpt's output, after it ran to the end with status 0.
std::string run_ok(int ranks, const std::vector<std::string>& flags, const fs::path& log) {
  const int status = run_pretrain(ranks, flags, log);
  const std::string output = read_file(log);
  INFO(output_tail(output));
  REQUIRE(status == 0);
  return output;
}

// The arguments of the resharding command a refused --load suggests ("checkpoint_util --load
// DIR --save NEWDIR --target-tensor-parallel-size N [...], then --load NEWDIR"), NEWDIR
// replaced by `new_directory`.
std::vector<std::string> suggested_reshard(const std::string& refusal, const fs::path& new_directory) {
  std::smatch match;
  REQUIRE(std::regex_search(refusal, match, std::regex(R"(checkpoint_util (--load [^,]*), then --load NEWDIR)")));
  std::istringstream words(match[1].str());
  std::vector<std::string> arguments;
  for (std::string word; words >> word;) {
    arguments.push_back(word == "NEWDIR" ? new_directory.string() : word);
  }
  return arguments;
}

// Every tensor of the two files: the same names in the same order, shapes and bytes.
void check_same_tensors(const fs::path& actual, const fs::path& expected) {
  const std::string file = actual.string();
  CAPTURE(file);
  const backend::CheckpointFileReader a(actual);
  const backend::CheckpointFileReader b(expected);
  REQUIRE(a.tensors().size() == b.tensors().size());
  for (size_t i = 0; i < b.tensors().size(); ++i) {
    const auto& entry = b.tensors()[i];
    CAPTURE(entry.name);
    REQUIRE(a.tensors()[i].name == entry.name);
    CHECK(a.tensors()[i].shape == entry.shape);
    CHECK(a.read_bytes(a.tensors()[i]) == b.read_bytes(entry));
  }
}

}  // namespace

// release-only: training runs over Open MPI, 100 s under the sanitizers; the resharding code
// runs sanitized in "TP=2 → TP=1 → TP=2 gives back every tensor bit for bit" and its unit
// tests.
TEST_CASE(
    "checkpoint_util reshards TP=2 → TP=1 and TP=1 → TP=2: the resumed runs train the "
    "uninterrupted losses" *
    release_only()) {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  for (const std::string style : {"gpt2", "llama"}) {
    CAPTURE(style);
    TemporaryDirectory directory;
    const fs::path& d = directory.path;
    using test_support::tensor_parallel_training_flags;

    for (const int from : {2, 1}) {
      const int to = 3 - from;
      CAPTURE(from);
      const std::string name = "tp" + std::to_string(from) + "_to_tp" + std::to_string(to);
      // The uninterrupted run at the source's size, and its first half; at TP=2 with the
      // distributed optimizer, whose moments the resharding reads from their own files.
      const std::vector<std::string> optimizer =
          from == 2 ? std::vector<std::string>{"--use-distributed-optimizer"}
                    : std::vector<std::string>{};
      const auto expected = logged_losses(run_ok(
          from, with(tensor_parallel_training_flags(style, from, d / (name + "_whole")), optimizer),
          d / (name + "_whole.log")));
      REQUIRE(expected.size() == 20);
      const fs::path source = d / (name + "_source");
      run_ok(from, with(first_half(style, from, source), optimizer), d / (name + "_first.log"));
      for (int rank = 0; rank < from; ++rank) {
        CHECK(fs::is_regular_file(backend::checkpoint_file_path(source, 10, rank).parent_path() /
                                  backend::distributed_optimizer_file_name(0)) == (from == 2));
      }

      // The second half at the target's size: refused with the resharding command, which works.
      const fs::path target = d / (name + "_target");
      const auto second_half = with(tensor_parallel_training_flags(style, to, target),
                                    {"--load", source.string()});
      const fs::path refused_log = d / (name + "_refused.log");
      CHECK(run_pretrain(to, second_half, refused_log) != 0);
      const std::string refusal = read_file(refused_log);
      INFO(output_tail(refusal));
      const auto command = suggested_reshard(refusal, target);
      // The flags pad the vocabulary to 384 rows at either size; the suggestion keeps that.
      CHECK(command == std::vector<std::string>{"--load", source.string(), "--save", target.string(),
                                                "--target-tensor-parallel-size", std::to_string(to),
                                                "--make-vocab-size-divisible-by",
                                                std::to_string(128 / to)});
      const auto resharded = checkpoint_util(command);
      INFO(resharded.output);
      REQUIRE(resharded.exit_code == 0);
      CHECK(resharded.output.find("loading checkpoint from " + source.string() + " at iteration 10") !=
            std::string::npos);
      CHECK(resharded.output.find("successfully saved checkpoint from iteration      10 to " +
                                  target.string() + " [ t 1/" + std::to_string(to)) !=
            std::string::npos);
      CHECK(resharded.output.find("padded vocabulary") == std::string::npos);
      CHECK(read_file(backend::checkpoint_tracker_path(target)) == "10");
      for (int rank = 0; rank < 3; ++rank) {
        CHECK(fs::is_regular_file(backend::checkpoint_file_path(target, 10, rank)) == (rank < to));
      }

      const auto second_with_target = with(tensor_parallel_training_flags(style, to, target),
                                           {"--load", target.string()});
      const std::string output = run_ok(to, second_with_target, d / (name + "_second.log"));
      CHECK(output.find("successfully loaded checkpoint from " + target.string() + " [ t 1/" +
                        std::to_string(to)) != std::string::npos);
      const auto resumed = logged_losses(output);
      REQUIRE(resumed.size() == 10);
      CHECK(resumed.begin()->first == 11);
      check_same_losses(resumed, expected, false);
    }
  }
}

TEST_CASE("checkpoint_util: TP=2 → TP=1 → TP=2 gives back every tensor bit for bit, and both export alike") {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  for (const std::string style : {"gpt2", "llama"}) {
    CAPTURE(style);
    TemporaryDirectory directory;
    const fs::path original = directory.path / "tp2";
    const fs::path one = directory.path / "tp1";
    const fs::path back = directory.path / "tp2_again";
    run_ok(2, first_half(style, 2, original), directory.path / "train.log");
    for (const auto& step : {std::tuple{original, one, "1", "128"}, std::tuple{one, back, "2", "64"}}) {
      const auto run = checkpoint_util({"--load", std::get<0>(step).string(), "--save",
                                        std::get<1>(step).string(), "--target-tensor-parallel-size",
                                        std::get<2>(step), "--make-vocab-size-divisible-by",
                                        std::get<3>(step)});
      INFO(run.output);
      REQUIRE(run.exit_code == 0);
    }
    // TP=1 holds the whole tensors: the shards of TP=2 put together, moments included.
    for (const std::string prefix : {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."}) {
      CAPTURE(prefix);
      const auto whole = whole_parameters(original, 10, prefix);
      REQUIRE(!whole.empty());
      CHECK(whole_parameters(one, 10, prefix) == whole);
    }
    // The Hugging Face export reads the TP=2 shards whole: the same files as from TP=1.
    for (const auto& checkpoint : {original, one}) {
      const auto exported = checkpoint_util({"--load", checkpoint.string(), "--export-hf",
                                             (checkpoint.string() + "_hf")});
      INFO(exported.output);
      REQUIRE(exported.exit_code == 0);
    }
    for (const char* file : {"model.safetensors", "config.json"}) {
      CAPTURE(file);
      CHECK(read_file(original.string() + "_hf/" + file) ==
            read_file(one.string() + "_hf/" + file));
    }
    for (int rank = 0; rank < 2; ++rank) {
      CAPTURE(rank);
      const fs::path expected = backend::checkpoint_file_path(original, 10, rank);
      const fs::path actual = backend::checkpoint_file_path(back, 10, rank);
      check_same_tensors(actual, expected);
      auto metadata = backend::CheckpointFileReader(actual).metadata();
      const auto original_metadata = backend::CheckpointFileReader(expected).metadata();
      CHECK(metadata["resharded"]["from_tensor_parallel_size"] == 1);
      metadata.erase("resharded");
      CHECK(metadata == original_metadata);
    }
  }
}

TEST_CASE("checkpoint_util: another padded vocabulary cuts padding rows or repeats the last row, and trains") {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  // Llama style: an untied output_layer besides the word embedding.
  TemporaryDirectory directory;
  const fs::path original = directory.path / "tp2";
  run_ok(2, first_half("llama", 2, original), directory.path / "train.log");  // 384 rows
  // Megatron's default: the checkpoint's --make-vocab-size-divisible-by 64 at TP=1 gives 320.
  const fs::path cut = directory.path / "tp1_cut";
  const auto cutting = checkpoint_util({"--load", original.string(), "--save", cut.string(),
                                        "--target-tensor-parallel-size", "1"});
  INFO(cutting.output);
  REQUIRE(cutting.exit_code == 0);
  CHECK(cutting.output.find("padding rows 320..383 dropped; --make-vocab-size-divisible-by 128 "
                            "keeps 384 rows") != std::string::npos);
  CHECK(cutting.output.find("--tensor-model-parallel-size 1 --make-vocab-size-divisible-by 64 "
                            "--load " + cut.string()) != std::string::npos);
  // And back to TP=2 (64 × 2: 384 rows again), the 64 new rows copies of row 319.
  const fs::path padded = directory.path / "tp2_padded";
  const auto padding = checkpoint_util({"--load", cut.string(), "--save", padded.string(),
                                        "--target-tensor-parallel-size", "2"});
  INFO(padding.output);
  REQUIRE(padding.exit_code == 0);
  CHECK(padding.output.find("rows 320..383 added as copies of row 319") != std::string::npos);

  const backend::CheckpointFileReader cut_file(backend::checkpoint_file_path(cut, 10, 0));
  CHECK(cut_file.metadata()["padded_vocab_size"] == 320);
  CHECK(cut_file.metadata()["arguments"]["tensor_model_parallel_size"] == 1);
  CHECK(cut_file.metadata()["arguments"]["make_vocab_size_divisible_by"] == 64);
  CHECK(cut_file.metadata()["tensor_parallel"] == nlohmann::json{{"size", 1}, {"rank", 0}});
  const int64_t hidden = 64;
  for (const std::string prefix : {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."}) {
    CAPTURE(prefix);
    const auto whole = whole_parameters(original, 10, prefix);
    const auto cut_whole = whole_parameters(cut, 10, prefix);
    const auto padded_whole = whole_parameters(padded, 10, prefix);
    for (const std::string name : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
      CAPTURE(name);
      const auto& rows384 = whole.at(name);
      const auto& rows320 = cut_whole.at(name);
      const auto& again = padded_whole.at(name);
      REQUIRE(rows384.size() == 384 * hidden);
      REQUIRE(rows320.size() == 320 * hidden);
      REQUIRE(again.size() == 384 * hidden);
      CHECK(std::equal(rows320.begin(), rows320.end(), rows384.begin()));
      CHECK(std::equal(rows320.begin(), rows320.end(), again.begin()));
      bool copies = true;
      for (int64_t row = 320; row < 384; ++row) {
        copies = copies && std::equal(again.begin() + row * hidden, again.begin() + (row + 1) * hidden,
                                      rows320.begin() + 319 * hidden);
      }
      CHECK(copies);
    }
    // Every other tensor is the original's.
    for (const auto& entry : whole) {
      const std::string& name = entry.first;
      if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight") continue;
      CAPTURE(name);
      CHECK(padded_whole.at(name) == entry.second);
    }
  }
  // The cut checkpoint trains on at TP=1 with its flags.
  const auto resumed =
      logged_losses(run_ok(1,
                           with(tensor_parallel_training_flags("llama", 1, cut),
                                {"--make-vocab-size-divisible-by", "64", "--load", cut.string()}),
                           directory.path / "cut.log"));
  CHECK(resumed.size() == 10);
}

TEST_CASE("checkpoint_util: bad resharding input exits 2 naming the flag or file, writing nothing") {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  const fs::path original = directory.path / "tp2";
  run_ok(2, first_half("gpt2", 2, original), directory.path / "train.log");
  // A copy without its mp_rank_01 file.
  const fs::path incomplete = directory.path / "incomplete";
  fs::copy(original, incomplete, fs::copy_options::recursive);
  fs::remove(backend::checkpoint_file_path(incomplete, 10, 1));
  const fs::path done = directory.path / "done";
  const auto resharded = checkpoint_util({"--load", original.string(), "--save", done.string(),
                                          "--target-tensor-parallel-size", "1"});
  REQUIRE(resharded.exit_code == 0);

  const fs::path out = directory.path / "out";
  struct Case {
    std::vector<std::string> arguments;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--load", incomplete.string(), "--save", out.string(), "--target-tensor-parallel-size", "1"},
       backend::checkpoint_file_path(incomplete, 10, 1).string() + " is missing"},
      {{"--load", original.string(), "--save", out.string(), "--target-tensor-parallel-size", "3"},
       "--target-tensor-parallel-size 3: the model of"},
      {{"--load", original.string(), "--save", out.string(), "--target-tensor-parallel-size", "3"},
       "--num-attention-heads (4) must be divisible by --tensor-model-parallel-size (3)"},
      {{"--load", original.string(), "--save", out.string(), "--target-tensor-parallel-size", "1",
        "--target-pipeline-parallel-size", "3"},
       "--target-pipeline-parallel-size 3 does not divide the 2 layers of the model of"},
      {{"--load", original.string(), "--save", out.string(), "--target-tensor-parallel-size", "1",
        "--target-pipeline-parallel-size", "3"},
       "(--num-layers 2): every pipeline stage holds the same number of layers; valid sizes: 1, 2"},
      {{"--load", original.string(), "--save", out.string(), "--target-tensor-parallel-size", "1",
        "--target-pipeline-parallel-size", "0"},
       "--target-pipeline-parallel-size"},
      {{"--load", original.string(), "--save", original.string(), "--target-tensor-parallel-size", "1"},
       "is the --load directory"},
      {{"--load", original.string(), "--save", (original / "." ).string(), "--target-tensor-parallel-size", "1"},
       "is the --load directory"},
      {{"--load", original.string(), "--save", done.string(), "--target-tensor-parallel-size", "1"},
       "holds a checkpoint already"},
      {{"--load", (directory.path / "none").string(), "--save", out.string(),
        "--target-tensor-parallel-size", "1"},
       "holds no checkpoint"},
      {{"--load", original.string(), "--save", out.string(), "--target-tensor-parallel-size", "0"},
       "--target-tensor-parallel-size"},
      {{"--load", original.string(), "--target-tensor-parallel-size", "1"},
       "--target-tensor-parallel-size requires --load"},
  };
  for (const auto& entry : cases) {
    CAPTURE(entry.message);
    const auto run = checkpoint_util(entry.arguments);
    INFO(run.output);
    CHECK(run.exit_code == 2);
    CHECK(run.output.find(entry.message) != std::string::npos);
    CHECK_FALSE(fs::exists(backend::checkpoint_tracker_path(out)));
  }
  CHECK(read_file(backend::checkpoint_tracker_path(original)) == "10");
}

// (No semicolon in a test name: CTest would cut the name there, and run none.)
// release-only: as the test above (80 s under the sanitizers).
TEST_CASE(
    "checkpoint_util reshards TP=2 x PP=2 → TP=1 x PP=1 and back: the resumed runs train the "
    "uninterrupted losses" *
    release_only()) {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  const fs::path& d = directory.path;
  // pipeline_parallel_test's model: GPT-2 style (tied embeddings, hidden dropout), 8 layers.
  auto flags = [](int tensor_parallel, int pipeline_parallel, const fs::path& save) {
    auto result = tensor_parallel_training_flags("gpt2", tensor_parallel, save);
    *(std::find(result.begin(), result.end(), "--num-layers") + 1) = "8";
    return with(result, {"--pipeline-model-parallel-size", std::to_string(pipeline_parallel)});
  };
  const auto expected = logged_losses(run_ok(4, flags(2, 2, d / "whole"), d / "whole.log"));
  REQUIRE(expected.size() == 20);
  const fs::path source = d / "tp2_pp2";
  run_ok(4, with(flags(2, 2, source), {"--exit-interval", "10", "--eval-iters", "0"}),
         d / "first.log");
  // The last stage's tied copy is the first stage's word embedding, moments included: what the
  // resharding leaves out and makes again.
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    const backend::CheckpointFileReader first(
        backend::checkpoint_file_path(source, 10, rank, 0, 2));
    const backend::CheckpointFileReader last(
        backend::checkpoint_file_path(source, 10, rank, 1, 2));
    for (const std::string prefix : {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."}) {
      CAPTURE(prefix);
      const auto* embedding = first.find(prefix + "embedding.word_embeddings.weight");
      const auto* copy = last.find(prefix + "output_layer.weight");
      REQUIRE(embedding != nullptr);
      REQUIRE(copy != nullptr);
      CHECK(first.read_bytes(*embedding) == last.read_bytes(*copy));
    }
  }

  // One process: refused with the resharding command, which makes the checkpoint it resumes.
  const fs::path one = d / "tp1_pp1";
  const fs::path refused_log = d / "refused.log";
  CHECK(run_pretrain(1, with(flags(1, 1, d / "unused"), {"--load", source.string()}),
                     refused_log) != 0);
  const std::string refusal = read_file(refused_log);
  INFO(output_tail(refusal));
  const auto command = suggested_reshard(refusal, one);
  CHECK(command == std::vector<std::string>{"--load", source.string(), "--save", one.string(),
                                            "--target-tensor-parallel-size", "1",
                                            "--target-pipeline-parallel-size", "1",
                                            "--make-vocab-size-divisible-by", "128"});
  const auto merged = checkpoint_util(command);
  INFO(merged.output);
  REQUIRE(merged.exit_code == 0);
  CHECK(merged.output.find("resharding from tensor-parallel size 2, pipeline-parallel size 2 to "
                           "tensor-parallel size 1, pipeline-parallel size 1") !=
        std::string::npos);
  CHECK(merged.output.find("successfully saved checkpoint from iteration      10 to " +
                           one.string() + " [ t 1/1, p 1/1 ]") != std::string::npos);
  CHECK(merged.output.find("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
                           "--make-vocab-size-divisible-by 128 --load " + one.string()) !=
        std::string::npos);
  CHECK(fs::is_regular_file(backend::checkpoint_file_path(one, 10, 0)));
  const std::string resumed_output =
      run_ok(1, with(flags(1, 1, d / "one_resumed"), {"--load", one.string()}), d / "one.log");
  CHECK(resumed_output.find("successfully loaded checkpoint from " + one.string() +
                            " [ t 1/1, p 1/1 ] at iteration 10") != std::string::npos);
  const auto resumed = logged_losses(resumed_output);
  REQUIRE(resumed.size() == 10);
  CHECK(resumed.begin()->first == 11);
  check_same_losses(resumed, expected, false);

  // Both export the same Hugging Face files: the pipelined files are read whole.
  for (const auto& checkpoint : {source, one}) {
    const auto exported = checkpoint_util({"--load", checkpoint.string(), "--export-hf",
                                           checkpoint.string() + "_hf"});
    INFO(exported.output);
    REQUIRE(exported.exit_code == 0);
  }
  for (const char* file : {"model.safetensors", "config.json"}) {
    CAPTURE(file);
    CHECK(read_file(source.string() + "_hf/" + file) == read_file(one.string() + "_hf/" + file));
  }

  // Back to TP=2 × PP=2: the original files bit for bit (the tied copy made again), and the
  // run resumes with the uninterrupted losses exactly.
  const fs::path back = d / "back";
  const auto split = checkpoint_util({"--load", one.string(), "--save", back.string(),
                                      "--target-tensor-parallel-size", "2",
                                      "--target-pipeline-parallel-size", "2",
                                      "--make-vocab-size-divisible-by", "64"});
  INFO(split.output);
  REQUIRE(split.exit_code == 0);
  CHECK(split.output.find("[ t 1/2, p 1/2 ]") != std::string::npos);
  for (int stage = 0; stage < 2; ++stage) {
    for (int rank = 0; rank < 2; ++rank) {
      CAPTURE(stage);
      CAPTURE(rank);
      const fs::path expected_file = backend::checkpoint_file_path(source, 10, rank, stage, 2);
      const fs::path actual = backend::checkpoint_file_path(back, 10, rank, stage, 2);
      check_same_tensors(actual, expected_file);
      auto metadata = backend::CheckpointFileReader(actual).metadata();
      CHECK(metadata["resharded"]["from_pipeline_parallel_size"] == 1);
      metadata.erase("resharded");
      CHECK(metadata == backend::CheckpointFileReader(expected_file).metadata());
    }
  }
  const std::string back_output =
      run_ok(4, with(flags(2, 2, d / "back_resumed"), {"--load", back.string()}), d / "back.log");
  CHECK(back_output.find("successfully loaded checkpoint from " + back.string() +
                         " [ t 1/2, p 1/2 ] at iteration 10") != std::string::npos);
  check_resumed_bit_for_bit(back_output, expected, 10);  // the same layout and the same bits
}
