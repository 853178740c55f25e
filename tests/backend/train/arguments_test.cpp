// Megatron flag parsing: defaults, derived values, and every refusal naming its flag.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/train/arguments.hpp"

using backend::parse_arguments;

namespace {
std::vector<std::string> base_flags() {
  return {"pretrain_gpt", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
          "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
          "--train-iters", "10", "--lr", "1e-3", "--mock-data", "--vocab-size", "100",
          "--hidden-dropout", "0", "--attention-dropout", "0"};
}
std::optional<backend::TrainingArguments> parse(std::vector<std::string> words) {
  std::vector<const char*> argv;
  for (const auto& word : words) argv.push_back(word.c_str());
  return parse_arguments(static_cast<int>(argv.size()), argv.data());
}
std::vector<std::string> with(std::vector<std::string> extra) {
  auto words = base_flags();
  words.insert(words.end(), extra.begin(), extra.end());
  return words;
}
}  // namespace

TEST_CASE("Megatron's defaults and derived values") {
  auto arguments = parse(base_flags());
  REQUIRE(arguments);
  CHECK(arguments->ffn_hidden_size == 256);
  CHECK(arguments->max_position_embeddings == 32);
  CHECK(arguments->lr_decay_iters == 10);
  CHECK(arguments->lr_decay_style == "linear");
  CHECK(arguments->weight_decay == doctest::Approx(0.01));
  CHECK(arguments->clip_grad == doctest::Approx(1.0));
  CHECK(arguments->make_vocab_size_divisible_by == 128);
  CHECK(arguments->seed == 1234);
  CHECK(arguments->tokenizer_type == "NullTokenizer");
  CHECK(arguments->command_line.front() == "pretrain_gpt");
}

TEST_CASE("bad and unsupported flags are refused with the flag named") {
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--no-such-flag"}, "unknown argument --no-such-flag"},
      {{"--num-layer", "2"}, "unknown argument --num-layer Did you mean '--num-layers'?"},
      {{"--num-layers", "zero"}, "--num-layers"},
      {{"--global-batch-size", "7"}, "--global-batch-size 7 is not divisible by --micro-batch-size 2"},
      {{"--max-position-embeddings", "16"}, "--seq-length 32 exceeds --max-position-embeddings 16"},
      {{"--lr-decay-style", "exponential"}, "--lr-decay-style"},
      {{"--swiglu"}, "--swiglu is a Megatron-LM flag this backend does not support yet"},
      {{"--tensor-model-parallel-size", "2"}, "model parallelism is not built yet"},
      {{"--data-path", "my_text_document"}, "--data-path my_text_document"},
      {{"--finetune"}, "--finetune needs --load DIR"},
      {{"--save-interval", "-5"}, "--save-interval must be positive, got -5"},
      {{"--exit-interval", "-1"}, "--exit-interval must be positive, got -1"},
      {{"--load", "/tmp/ckpt", "--override-opt_param-scheduler",
        "--use-checkpoint-opt_param-scheduler"}, "mutually exclusive"},
      {{"--min-lr", "1"}, "--min-lr 1 must lie in [0, --lr 0.001]"},
      {{"--adam-beta2", "1.5"}, "--adam-beta2 must lie in [0, 1)"},
      {{"--bf16", "--fp16"}, "mutually exclusive"},
      {{"--lr-warmup-iters", "10"}, "--lr-warmup-iters 10 must be smaller than --lr-decay-iters 10"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    CHECK_THROWS_WITH_AS(parse(with(c.extra)), doctest::Contains(c.message.c_str()), common::Error);
  }
}

TEST_CASE("missing required flags and missing data are named") {
  CHECK_THROWS_WITH_AS(parse({"pretrain_gpt", "--mock-data"}), doctest::Contains("--num-layers"),
                       common::Error);
  auto words = base_flags();
  std::erase(words, std::string("--mock-data"));
  CHECK_THROWS_WITH_AS(parse(words), doctest::Contains("pass --mock-data"), common::Error);
}

TEST_CASE("--help prints usage and asks the caller to stop") {
  CHECK_FALSE(parse({"pretrain_gpt", "--help"}).has_value());
}

TEST_CASE("the checkpointing flags parse as Megatron's and show in the arguments dump") {
  auto arguments = parse(with({"--save", "/tmp/ckpt", "--load", "/tmp/ckpt", "--save-interval",
                               "50", "--exit-interval", "200", "--no-load-optim", "--no-load-rng",
                               "--no-save-optim", "--no-save-rng", "--finetune",
                               "--override-opt_param-scheduler"}));
  REQUIRE(arguments);
  CHECK(arguments->save == "/tmp/ckpt");
  CHECK(arguments->load == "/tmp/ckpt");
  CHECK(arguments->save_interval == 50);
  CHECK(arguments->exit_interval == 200);
  CHECK(arguments->no_load_optim);
  CHECK(arguments->no_load_rng);
  CHECK(arguments->no_save_optim);
  CHECK(arguments->no_save_rng);
  CHECK(arguments->finetune);
  CHECK(arguments->override_opt_param_scheduler);
  CHECK_FALSE(arguments->use_checkpoint_opt_param_scheduler);
  const auto values = backend::argument_values(*arguments);
  CHECK(values.at("save_interval") == "50");
  CHECK(values.at("no_load_optim") == "True");
  // Megatron prints None for what was not given.
  const auto defaults = backend::argument_values(*parse(base_flags()));
  CHECK(defaults.at("save") == "None");
  CHECK(defaults.at("save_interval") == "None");
  CHECK(defaults.at("finetune") == "False");
  // --save-interval without --save is accepted, as Megatron accepts it.
  CHECK(parse(with({"--save-interval", "10"})).has_value());
}
