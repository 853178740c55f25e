// checkpoint_util's command line: both Hugging Face directions, --replace-training-tracker,
// resharding (--target-tensor-parallel-size, --target-pipeline-parallel-size), Megatron's
// convert.py spelling (--model-type GPT --loader --saver --load-dir --save-dir), and every
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
  const auto to_nemo = parse_checkpoint_util({"--load", "ckpt", "--export-nemo", "out.nemo"});
  REQUIRE(to_nemo);
  CHECK(to_nemo->export_nemo == "out.nemo");
  CHECK_FALSE(to_nemo->importing());
  const auto from_nemo = parse_checkpoint_util(
      {"--import-nemo", "in.nemo", "--save", "ckpt", "--replace-training-tracker"});
  REQUIRE(from_nemo);
  CHECK(from_nemo->import_nemo == "in.nemo");
  CHECK(from_nemo->importing());
  CHECK(from_nemo->replace_training_tracker);
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
      {{"--load", "x", "--export-hf", "y", "--replace-training-tracker"}, "--replace-training-tracker requires --import-hf DIR or --import-nemo FILE"},
      {{"--import-nemo", "x"}, "--import-nemo requires --save"},
      {{"--export-nemo", "x"}, "--export-nemo requires --load"},
      {{"--load", "x", "--export-nemo", "y", "--save", "z"}, "excludes"},
      {{"--import-nemo", "x", "--import-hf", "y", "--save", "z"}, "excludes"},
      {{"--load", "x", "--import-nemo", "y", "--save", "z"}, "excludes"},
      {{"--import-nemo", "x", "--save", "y", "--target-tensor-parallel-size", "2"}, "excludes"},
      {{"--model-type", "GPT", "--load-dir", "x", "--save-dir", "y", "--export-nemo", "z"},
       "--export-nemo requires --load"},
      {{"--load", "x", "--export-hf", "y", "--import-hf", "z", "--save", "w"}, "excludes"},
      {{"--frobnicate"}, "unknown argument --frobnicate"},
      {{"--load"}, "--load"},
      {{"--load", "x", "--save", "y"}, "--load requires --export-hf DIR (export to Hugging Face), --export-nemo FILE (export to NeMo), or --save DIR with --target-tensor-parallel-size N"},
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

TEST_CASE(
    "Megatron's convert.py spelling: --saver writes Megatron's format, at the checkpoint's sizes "
    "by default") {
  const auto converter = parse_checkpoint_util(
      {"--model-type", "GPT", "--loader", "mcore", "--saver", "mcore", "--load-dir", "ckpt",
       "--save-dir", "out", "--target-tensor-parallel-size", "2"});
  REQUIRE(converter);
  CHECK(converter->resharding());
  CHECK(converter->megatron_converter);
  CHECK(converter->load == "ckpt");
  CHECK(converter->save == "out");
  CHECK(converter->target_tensor_parallel_size == 2);
  CHECK(converter->target_pipeline_parallel_size == 0);  // the checkpoint's
  CHECK(converter->saver_transformer_impl == MegatronModuleSpec::transformer_engine);
  // convert.py's defaults (--loader megatron --saver megatron), the local spec's names, and its
  // flags that change nothing here.
  const auto defaults = parse_checkpoint_util(
      {"--model-type", "GPT", "--load-dir", "ckpt", "--save-dir", "out", "--saver-transformer-impl",
       "local", "--megatron-path", "/opt/megatron", "--max-queue-size", "10", "--no-checking",
       "--target-pipeline-parallel-size", "2"});
  REQUIRE(defaults);
  CHECK(defaults->megatron_converter);
  CHECK(defaults->target_tensor_parallel_size == 0);
  CHECK(defaults->target_pipeline_parallel_size == 2);
  CHECK(defaults->saver_transformer_impl == MegatronModuleSpec::local);

  const std::vector<std::pair<std::vector<const char*>, const char*>> misuses = {
      {{"--loader", "mcore", "--load-dir", "a", "--save-dir", "b"},
       "--model-type is required with Megatron's spelling (GPT)"},
      {{"--model-type", "BERT", "--load-dir", "a", "--save-dir", "b"},
       "--model-type BERT: not built"},
      {{"--model-type", "GPT", "--loader", "llama_mistral", "--load-dir", "a", "--save-dir", "b"},
       "--loader llama_mistral: not built"},
      {{"--model-type", "GPT", "--saver", "llava", "--load-dir", "a", "--save-dir", "b"},
       "--saver llava: not built"},
      {{"--model-type", "GPT", "--load-dir", "a"},
       "--load-dir (the checkpoint to convert) and "
       "--save-dir (the directory to write it to) are "
       "both required"},
      {{"--model-type", "GPT", "--load", "a", "--save-dir", "b"},
       "--load is this tool's spelling, and --model-type, --loader, --saver, --load-dir and "
       "--save-dir Megatron's convert.py's: give one or the other"},
      {{"--model-type", "GPT", "--load-dir", "a", "--save-dir", "b", "--saver-transformer-impl",
        "te"},
       "--saver-transformer-impl: 'te' is not a valid choice"},
  };
  for (const auto& misuse : misuses) {
    CAPTURE(misuse.second);
    CHECK_THROWS_WITH_AS(parse_checkpoint_util(misuse.first), doctest::Contains(misuse.second),
                         common::Error);
  }
}

TEST_CASE("checkpoint_util's flags may be abbreviated as argparse allows") {
  // argparse's rule: a prefix of one flag only; --lo and --sa also begin Megatron's
  // --load-dir/--loader and --save-dir/--saver.
  CHECK_THROWS_WITH_AS(parse_checkpoint_util({"--lo", "ckpt", "--save", "out", "--target-t", "2"}),
                       doctest::Contains("ambiguous option: --lo could match --load, "),
                       common::Error);
  const auto resharding =
      parse_checkpoint_util({"--load", "ckpt", "--save=out", "--target-t", "2"});
  REQUIRE(resharding);
  CHECK(resharding->load == "ckpt");
  CHECK(resharding->save == "out");
  CHECK(resharding->target_tensor_parallel_size == 2);
  CHECK_THROWS_WITH_AS(parse_checkpoint_util({"--load", "ckpt", "--save", "out", "--target", "2"}),
                       "checkpoint_util: ambiguous option: --target could match "
                       "--target-tensor-parallel-size, --target-pipeline-parallel-size",
                       common::Error);
}
