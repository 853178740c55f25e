// Megatron flag parsing: defaults, derived values, and every refusal naming its flag.
#include <doctest/doctest.h>

#include <algorithm>
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
      {{"--sequence-parallel"},
       "--sequence-parallel is a Megatron-LM flag this backend does not support yet"},
      {{"--position-embedding-type", "alibi"}, "--position-embedding-type: alibi not in"},
      {{"--normalization", "rmsnorm"}, "--normalization: rmsnorm not in"},
      {{"--rotary-percent", "0"}, "--rotary-percent must lie in (0, 1], got 0"},
      {{"--rotary-percent", "1.5"}, "--rotary-percent must lie in (0, 1], got 1.5"},
      {{"--rotary-base", "0"}, "--rotary-base must be positive, got 0"},
      {{"--norm-epsilon", "0"}, "--norm-epsilon must be positive, got 0"},
      {{"--group-query-attention", "--num-query-groups", "3"},
       "--num-query-groups 3 must be positive and divide --num-attention-heads 4"},
      {{"--group-query-attention", "--num-query-groups", "0"},
       "--num-query-groups 0 must be positive and divide --num-attention-heads 4"},
      {{"--recompute-granularity", "partial"}, "--recompute-granularity: partial not in"},
      {{"--recompute-granularity", "full", "--recompute-num-layers", "1"},
       "--recompute-granularity full needs --recompute-method uniform or block"},
      {{"--recompute-granularity", "full", "--recompute-method", "block"},
       "--recompute-granularity full needs --recompute-num-layers N"},
      {{"--recompute-activations", "--recompute-method", "uniform"},
       "--recompute-method uniform: a recompute method is not supported with selective"},
      {{"--recompute-granularity", "selective", "--recompute-num-layers", "2"},
       "--recompute-num-layers 2: with selective recompute it must not be given"},
      {{"--tensor-model-parallel-size", "2"}, "model parallelism is not built yet"},
      {{"--data-path", "my_text_document"}, "--data-path my_text_document"},
      {{"--save", "/tmp/ckpt"}, "checkpointing is not built yet"},
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

TEST_CASE("the Llama switches: Megatron's defaults, then each flag") {
  const auto defaults = parse(base_flags());
  REQUIRE(defaults);
  CHECK(defaults->position_embedding_type == "learned_absolute");
  CHECK(defaults->rotary_base == 10000);
  CHECK(defaults->rotary_percent == 1.0);
  CHECK(defaults->normalization == "LayerNorm");
  CHECK(defaults->norm_epsilon == 1e-5);
  CHECK_FALSE(defaults->swiglu);
  CHECK(defaults->add_bias_linear);
  CHECK_FALSE(defaults->untie_embeddings_and_output_weights);

  const auto llama = parse(with({"--position-embedding-type", "rope", "--rotary-base", "500000",
                                 "--rotary-percent", "0.5", "--normalization", "RMSNorm",
                                 "--norm-epsilon", "1e-6", "--swiglu", "--disable-bias-linear",
                                 "--untie-embeddings-and-output-weights", "--ffn-hidden-size",
                                 "172"}));
  REQUIRE(llama);
  CHECK(llama->position_embedding_type == "rope");
  CHECK(llama->rotary_base == 500000);
  CHECK(llama->rotary_percent == 0.5);
  CHECK(llama->normalization == "RMSNorm");
  CHECK(llama->norm_epsilon == 1e-6);
  CHECK(llama->swiglu);
  CHECK_FALSE(llama->add_bias_linear);
  CHECK(llama->untie_embeddings_and_output_weights);
  CHECK(llama->ffn_hidden_size == 172);
  CHECK_FALSE(llama->group_query_attention);
  CHECK(llama->num_query_groups == 1);  // Megatron's default, read only with the switch
  const auto grouped = parse(with({"--group-query-attention", "--num-query-groups", "2"}));
  REQUIRE(grouped);
  CHECK(grouped->group_query_attention);
  CHECK(grouped->num_query_groups == 2);
  // Without --group-query-attention the count is not checked (nor used), as in Megatron.
  CHECK(parse(with({"--num-query-groups", "3"})));

  // --layernorm-epsilon is the old name of --norm-epsilon; the last one given wins.
  CHECK(parse(with({"--layernorm-epsilon", "1e-3"}))->norm_epsilon == 1e-3);
  CHECK(parse(with({"--layernorm-epsilon", "1e-3", "--norm-epsilon", "1e-4"}))->norm_epsilon ==
        1e-4);

  // The arguments dump names them as Megatron does.
  const auto lines = backend::format_arguments(*llama);
  auto has_line = [&](const std::string& name, const std::string& value) {
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& line) {
      return line.starts_with("  " + name + " .") && line.ends_with(" " + value);
    });
  };
  CHECK(has_line("position_embedding_type", "rope"));
  CHECK(has_line("normalization", "RMSNorm"));
  CHECK(has_line("norm_epsilon", "1e-06"));
  CHECK(has_line("swiglu", "True"));
  CHECK(has_line("add_bias_linear", "False"));
  CHECK(has_line("untie_embeddings_and_output_weights", "True"));
  CHECK(has_line("rotary_base", "500000"));
}

TEST_CASE("activation recompute flags, as Megatron reads them") {
  const auto none = parse(base_flags());
  CHECK(none->recompute_granularity.empty());
  CHECK_FALSE(none->recompute_num_layers.has_value());
  CHECK(parse(with({"--recompute-activations"}))->recompute_granularity == "selective");
  const auto full = parse(with({"--recompute-granularity", "full", "--recompute-method", "uniform",
                                "--recompute-num-layers", "2"}));
  REQUIRE(full);
  CHECK(full->recompute_granularity == "full");
  CHECK(full->recompute_method == "uniform");
  CHECK(full->recompute_num_layers == 2);
  const auto lines = backend::format_arguments(*full);
  CHECK(std::find(lines.begin(), lines.end(),
                  "  recompute_num_layers ............................ 2") != lines.end());
  const auto none_lines = backend::format_arguments(*none);
  CHECK(std::find(none_lines.begin(), none_lines.end(),
                  "  recompute_granularity ........................... None") != none_lines.end());
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
