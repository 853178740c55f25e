// checkpoint_util's command line: both directions, --replace-training-tracker, and every misuse
// a clear common::Error, with nothing read or written (parse_checkpoint_util_arguments).
#include "backend/ckpt/checkpoint_util_options.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "backend/common/error.hpp"

using namespace backend;

namespace {

std::optional<CheckpointUtilOptions> parse(std::vector<const char*> arguments) {
  arguments.insert(arguments.begin(), "checkpoint_util");
  return parse_checkpoint_util_arguments(static_cast<int>(arguments.size()), arguments.data());
}

}  // namespace

TEST_CASE("checkpoint_util's command line") {
  const auto exporting = parse({"--load", "ckpt", "--export-hf", "hf"});
  REQUIRE(exporting);
  CHECK(exporting->load == "ckpt");
  CHECK(exporting->export_hf == "hf");
  const auto importing = parse({"--import-hf", "hf", "--save", "ckpt", "--replace-training-tracker"});
  REQUIRE(importing);
  CHECK(importing->import_hf == "hf");
  CHECK(importing->save == "ckpt");
  CHECK(importing->replace_training_tracker);
  CHECK_FALSE(parse({"--import-hf", "hf", "--save", "ckpt"})->replace_training_tracker);

  const std::vector<std::pair<std::vector<const char*>, const char*>> misuses = {
      {{}, "nothing to do"},
      {{"--load", "x"}, "--load requires --export-hf"},
      {{"--import-hf", "x"}, "--import-hf requires --save"},
      {{"--load", "x", "--export-hf", "y", "--replace-training-tracker"}, "--replace-training-tracker requires --import-hf"},
      {{"--load", "x", "--export-hf", "y", "--import-hf", "z", "--save", "w"}, "excludes"},
      {{"--frobnicate"}, "unknown argument --frobnicate"},
      {{"--load"}, "--load"},
  };
  // Not a structured binding: clang 14 (the asan preset) cannot capture one in CAPTURE's lambda.
  for (const auto& misuse : misuses) {
    const char* message = misuse.second;
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(parse(misuse.first), doctest::Contains(message), common::Error);
  }
}
