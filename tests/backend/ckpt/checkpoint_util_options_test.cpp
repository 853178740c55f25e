// checkpoint_util's command line: both Hugging Face directions, --replace-training-tracker,
// resharding (--target-tensor-parallel-size, --target-pipeline-parallel-size), and every
// misuse a clear common::Error, with nothing read or written (parse_checkpoint_util_arguments).
#include "backend/ckpt/checkpoint_util_options.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "backend/common/error.hpp"

using namespace backend;

namespace {

std::optional<CheckpointUtilOptions> parse_checkpoint_util(std::vector<const char*> arguments) {
  arguments.insert(arguments.begin(), "checkpoint_util");
  return parse_checkpoint_util_arguments(static_cast<int>(arguments.size()), arguments.data());
}

}  // namespace

TEST_CASE("checkpoint_util's command line") {
  const auto exporting = parse_checkpoint_util({"--load", "ckpt", "--export-hf", "hf"});
  REQUIRE(exporting);
  CHECK(exporting->load == "ckpt");
  CHECK(exporting->export_hf == "hf");
  const auto importing = parse_checkpoint_util({"--import-hf", "hf", "--save", "ckpt", "--replace-training-tracker"});
  REQUIRE(importing);
  CHECK(importing->import_hf == "hf");
  CHECK(importing->save == "ckpt");
  CHECK(importing->replace_training_tracker);
  CHECK_FALSE(parse_checkpoint_util({"--import-hf", "hf", "--save", "ckpt"})->replace_training_tracker);
  CHECK_FALSE(exporting->resharding());
  const auto resharding = parse_checkpoint_util({"--load", "ckpt", "--save", "out", "--target-tensor-parallel-size",
                                 "4", "--target-pipeline-parallel-size", "1",
                                 "--make-vocab-size-divisible-by", "32"});
  REQUIRE(resharding);
  CHECK(resharding->resharding());
  CHECK(resharding->load == "ckpt");
  CHECK(resharding->save == "out");
  CHECK(resharding->target_tensor_parallel_size == 4);
  CHECK(resharding->target_pipeline_parallel_size == 1);
  CHECK(resharding->make_vocab_size_divisible_by == 32);
  const auto defaults = parse_checkpoint_util({"--load", "ckpt", "--save", "out", "--target-tensor-parallel-size", "1"});
  REQUIRE(defaults);
  CHECK(defaults->make_vocab_size_divisible_by == 0);  // the checkpoint's
  CHECK(defaults->target_pipeline_parallel_size == 1);
  // Any pipeline size parses; whether it divides the layers is the checkpoint's to say.
  const auto pipelined = parse_checkpoint_util({"--load", "ckpt", "--save", "out", "--target-tensor-parallel-size",
                                "2", "--target-pipeline-parallel-size", "3"});
  REQUIRE(pipelined);
  CHECK(pipelined->target_pipeline_parallel_size == 3);

  const std::vector<std::pair<std::vector<const char*>, const char*>> misuses = {
      {{}, "nothing to do"},
      {{"--load", "x"}, "--load requires --export-hf"},
      {{"--import-hf", "x"}, "--import-hf requires --save"},
      {{"--load", "x", "--export-hf", "y", "--replace-training-tracker"}, "--replace-training-tracker requires --import-hf"},
      {{"--load", "x", "--export-hf", "y", "--import-hf", "z", "--save", "w"}, "excludes"},
      {{"--frobnicate"}, "unknown argument --frobnicate"},
      {{"--load"}, "--load"},
      {{"--load", "x", "--save", "y"}, "--load requires --export-hf DIR (export to Hugging Face), or --save DIR with --target-tensor-parallel-size N"},
      {{"--load", "x", "--target-tensor-parallel-size", "2"}, "--target-tensor-parallel-size requires --load (the checkpoint to reshard) and --save"},
      {{"--load", "x", "--save", "y", "--target-tensor-parallel-size", "0"}, "--target-tensor-parallel-size"},
      {{"--load", "x", "--save", "y", "--target-tensor-parallel-size", "two"}, "--target-tensor-parallel-size"},
      {{"--load", "x", "--save", "y", "--target-tensor-parallel-size", "2",
        "--target-pipeline-parallel-size", "0"},
       "--target-pipeline-parallel-size takes an integer ≥ 1"},
      {{"--load", "x", "--save", "y", "--target-pipeline-parallel-size", "2"},
       "--target-pipeline-parallel-size requires --target-tensor-parallel-size"},
      {{"--load", "x", "--save", "y", "--target-tensor-parallel-size", "2", "--make-vocab-size-divisible-by", "0"},
       "--make-vocab-size-divisible-by"},
      {{"--load", "x", "--export-hf", "y", "--target-tensor-parallel-size", "2"}, "excludes"},
      {{"--import-hf", "x", "--save", "y", "--target-tensor-parallel-size", "2"}, "excludes"},
      {{"--load", "x", "--export-hf", "y", "--make-vocab-size-divisible-by", "64"},
       "--make-vocab-size-divisible-by requires --target-tensor-parallel-size"},
  };
  // Not a structured binding: clang 14 (the asan preset) cannot capture one in CAPTURE's lambda.
  for (const auto& misuse : misuses) {
    const char* message = misuse.second;
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(parse_checkpoint_util(misuse.first), doctest::Contains(message), common::Error);
  }
}

TEST_CASE("checkpoint_util's flags may be abbreviated as argparse allows") {
  const auto resharding = parse_checkpoint_util({"--lo", "ckpt", "--sa=out", "--target-t", "2"});
  REQUIRE(resharding);
  CHECK(resharding->load == "ckpt");
  CHECK(resharding->save == "out");
  CHECK(resharding->target_tensor_parallel_size == 2);
  CHECK_THROWS_WITH_AS(parse_checkpoint_util({"--load", "ckpt", "--save", "out", "--target", "2"}),
                       "checkpoint_util: ambiguous option: --target could match "
                       "--target-tensor-parallel-size, --target-pipeline-parallel-size",
                       common::Error);
}
