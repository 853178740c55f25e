// Megatron flag parsing: defaults, derived values, every refusal naming its flag, and
// evaluate_gpt's command line (the task flags, without the training schedule and data).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trainer.hpp"
#include "temporary_directory.hpp"

using backend::parse_arguments;

namespace {
std::vector<std::string> base_flags() {
  return {"pretrain_gpt", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
          "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
          "--train-iters", "10", "--lr", "1e-3", "--mock-data", "--vocab-size", "100",
          "--hidden-dropout", "0", "--attention-dropout", "0"};
}
std::optional<backend::TrainingArguments> parse_words(std::vector<std::string> words) {
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
  auto arguments = parse_words(base_flags());
  REQUIRE(arguments);
  CHECK(arguments->model.ffn_hidden_size == 256);
  CHECK(arguments->model.max_position_embeddings == 32);
  CHECK(arguments->optimizer.lr_decay_iters == 10);
  CHECK(arguments->optimizer.lr_decay_style == backend::LearningRateDecayStyle::linear);
  CHECK(arguments->optimizer.weight_decay == doctest::Approx(0.01));
  CHECK(arguments->optimizer.clip_grad == doctest::Approx(1.0));
  CHECK(arguments->model.make_vocab_size_divisible_by == 128);
  CHECK(arguments->run.seed == 1234);
  CHECK(arguments->tokenizer.tokenizer_type == "NullTokenizer");
  CHECK(arguments->command_line.front() == "pretrain_gpt");
}

TEST_CASE("bad and unsupported flags are refused with the flag named") {
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--no-such-flag"}, "unknown argument --no-such-flag"},
      {{"--num-layrs", "2"}, "unknown argument --num-layrs Did you mean '--num-layers'?"},
      {{"--num-layer", "2"},
       "ambiguous option: --num-layer could match --num-layers, "
       "--num-layers-per-virtual-pipeline-stage"},
      {{"--num-layers", "zero"}, "--num-layers"},
      {{"--global-batch-size", "7"},
       "--global-batch-size 7 is not divisible by --micro-batch-size 2"},
      {{"--max-position-embeddings", "16"}, "--seq-length 32 exceeds --max-position-embeddings 16"},
      {{"--lr-decay-style", "exponential"}, "--lr-decay-style"},
      {{"--deepspeed-activation-checkpointing"},
       "--deepspeed-activation-checkpointing is a Megatron-LM flag this backend does not support "
       "yet"},
      {{"--position-embedding-type", "alibi"},
       "--position-embedding-type: 'alibi' is not a valid choice; --position-embedding-type takes "
       "one of learned_absolute, rope"},
      {{"--normalization", "RmsNorm"}, "--normalization: 'RmsNorm' is not a valid choice"},
      {{"--rotary-percent", "0"},
       "--rotary-percent: '0' is out of range; --rotary-percent takes a real number in (0, 1]"},
      {{"--rotary-percent", "1.5"}, "--rotary-percent: '1.5' is out of range"},
      {{"--rotary-base", "0"},
       "--rotary-base: '0' is out of range; --rotary-base takes an integer ≥ 1"},
      {{"--norm-epsilon", "0"},
       "--norm-epsilon: '0' is out of range; --norm-epsilon takes a real number > 0"},
      {{"--layernorm-epsilon", "-1"}, "--norm-epsilon: '-1' is out of range"},
      {{"--group-query-attention", "--num-query-groups", "3"},
       "--num-query-groups 3 must divide --num-attention-heads 4"},
      {{"--group-query-attention", "--num-query-groups", "0"},
       "--num-query-groups: '0' is out of range; --num-query-groups takes an integer ≥ 1"},
      {{"--recompute-granularity", "partial"},
       "--recompute-granularity: 'partial' is not a valid choice"},
      {{"--recompute-granularity", "full", "--recompute-num-layers", "1"},
       "--recompute-granularity full needs --recompute-method uniform or block"},
      {{"--recompute-granularity", "full", "--recompute-method", "block"},
       "--recompute-granularity full needs --recompute-num-layers N"},
      {{"--recompute-activations", "--recompute-method", "uniform"},
       "--recompute-method uniform: a recompute method is not supported with selective"},
      {{"--recompute-granularity", "selective", "--recompute-num-layers", "2"},
       "--recompute-num-layers 2: with selective recompute it must not be given"},
      {{"--tensor-model-parallel-size", "2"},
       "--tensor-model-parallel-size 2 × --pipeline-model-parallel-size 1 needs 2 ranks or a "
       "multiple, and this is one process, started without an MPI launcher: pretrain_gpt's CPU "
       "ranks "
       "are started by an MPI launcher; launch with mpirun/mpiexec (Open MPI: `mpirun -np 2 "
       "pretrain_gpt <flags>`)"},
      {{"--tensor-model-parallel-size", "3", "--sequence-parallel"},
       "--seq-length 32 must be divisible by --tensor-model-parallel-size 3 with "
       "--sequence-parallel"},
      {{"--pipeline-model-parallel-size", "2"},
       "--tensor-model-parallel-size 1 × --pipeline-model-parallel-size 2 needs 2 ranks or a "
       "multiple, and this is one process"},
      {{"--num-layers-per-virtual-pipeline-stage", "0"},
       "--num-layers-per-virtual-pipeline-stage: '0' is out of range"},
      {{"--data-path", "my_text_document"}, "--mock-data and --data-path are exclusive"},
      {{"--finetune"}, "--finetune needs --load DIR"},
      {{"--save-interval", "-5"},
       "--save-interval: '-5' is out of range; --save-interval takes an integer ≥ 1"},
      {{"--exit-interval", "-1"}, "--exit-interval: '-1' is out of range"},
      {{"--load", "/tmp/ckpt", "--override-opt_param-scheduler",
        "--use-checkpoint-opt_param-scheduler"},
       "mutually exclusive"},
      {{"--min-lr", "1"}, "--min-lr 1 must lie in [0, --lr 0.001]"},
      {{"--adam-beta2", "1.5"},
       "--adam-beta2: '1.5' is out of range; --adam-beta2 takes a real number in [0, 1)"},
      {{"--bf16", "--fp16"}, "mutually exclusive"},
      {{"--lr-warmup-iters", "10"},
       "--lr-warmup-iters 10 must be smaller than --lr-decay-iters 10"},
      {{"--lr-warmup-iters", "10", "--lr-decay-style", "constant"},
       "--lr-warmup-iters 10 must be smaller than --lr-decay-iters 10"},  // Megatron: any style
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    CHECK_THROWS_WITH_AS(parse_words(with(c.extra)), doctest::Contains(c.message.c_str()), common::Error);
  }
}

TEST_CASE("the Llama switches: Megatron's defaults, then each flag") {
  const auto defaults = parse_words(base_flags());
  REQUIRE(defaults);
  CHECK(defaults->model.position_embedding_type ==
        backend::PositionEmbeddingType::learned_absolute);
  CHECK(defaults->model.rotary_base == 10000);
  CHECK(defaults->model.rotary_percent == 1.0);
  CHECK(defaults->model.normalization == backend::Normalization::layer_norm);
  CHECK(defaults->model.norm_epsilon == 1e-5);
  CHECK_FALSE(defaults->model.swiglu);
  CHECK(defaults->model.add_bias_linear);
  CHECK_FALSE(defaults->model.untie_embeddings_and_output_weights);

  const auto llama = parse_words(with({"--position-embedding-type", "rope", "--rotary-base", "500000",
                                 "--rotary-percent", "0.5", "--normalization", "RMSNorm",
                                 "--norm-epsilon", "1e-6", "--swiglu", "--disable-bias-linear",
                                 "--untie-embeddings-and-output-weights", "--ffn-hidden-size",
                                 "172"}));
  REQUIRE(llama);
  CHECK(llama->model.position_embedding_type == backend::PositionEmbeddingType::rope);
  CHECK(llama->model.rotary_base == 500000);
  CHECK(llama->model.rotary_percent == 0.5);
  CHECK(llama->model.normalization == backend::Normalization::rms_norm);
  CHECK(llama->model.norm_epsilon == 1e-6);
  CHECK(llama->model.swiglu);
  CHECK_FALSE(llama->model.add_bias_linear);
  CHECK(llama->model.untie_embeddings_and_output_weights);
  CHECK(llama->model.ffn_hidden_size == 172);
  CHECK_FALSE(llama->model.group_query_attention);
  CHECK(llama->model.num_query_groups == 1);  // Megatron's default, read only with the switch
  const auto grouped = parse_words(with({"--group-query-attention", "--num-query-groups", "2"}));
  REQUIRE(grouped);
  CHECK(grouped->model.group_query_attention);
  CHECK(grouped->model.num_query_groups == 2);
  // Without --group-query-attention the count is not checked (nor used), as in Megatron.
  CHECK(parse_words(with({"--num-query-groups", "3"})));

  // Without --ffn-hidden-size, SwiGLU's default is Megatron's int(4h · 2/3 / 64) · 64.
  CHECK(parse_words(with({"--swiglu"}))->model.ffn_hidden_size == 128);  // h = 64: 170.7 → 128
  auto wide = base_flags();
  wide[4] = "4096";  // --hidden-size
  wide.insert(wide.end(), {"--num-attention-heads", "32", "--swiglu"});
  CHECK(parse_words(wide)->model.ffn_hidden_size == 10880);  // 10922.7 → 170 · 64

  // --layernorm-epsilon is the old name of --norm-epsilon; the last one given wins.
  CHECK(parse_words(with({"--layernorm-epsilon", "1e-3"}))->model.norm_epsilon == 1e-3);
  CHECK(parse_words(with({"--layernorm-epsilon", "1e-3", "--norm-epsilon", "1e-4"}))
            ->model.norm_epsilon == 1e-4);

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
  const auto none = parse_words(base_flags());
  CHECK(none->model.recompute_granularity == backend::RecomputeGranularity::none);
  CHECK_FALSE(none->model.recompute_num_layers.has_value());
  CHECK(parse_words(with({"--recompute-activations"}))->model.recompute_granularity ==
        backend::RecomputeGranularity::selective);
  const auto full = parse_words(with({"--recompute-granularity", "full", "--recompute-method", "uniform",
                                "--recompute-num-layers", "2"}));
  REQUIRE(full);
  CHECK(full->model.recompute_granularity == backend::RecomputeGranularity::full);
  CHECK(full->model.recompute_method == backend::RecomputeMethod::uniform);
  CHECK(full->model.recompute_num_layers == 2);
  const auto lines = backend::format_arguments(*full);
  CHECK(std::find(lines.begin(), lines.end(),
                  "  recompute_num_layers ............................ 2") != lines.end());
  const auto none_lines = backend::format_arguments(*none);
  CHECK(std::find(none_lines.begin(), none_lines.end(),
                  "  recompute_granularity ........................... None") != none_lines.end());
}

TEST_CASE("missing required flags and missing data are named") {
  CHECK_THROWS_WITH_AS(parse_words({"pretrain_gpt", "--mock-data"}), doctest::Contains("--num-layers"),
                       common::Error);
  auto words = base_flags();
  std::erase(words, std::string("--mock-data"));
  CHECK_THROWS_WITH_AS(parse_words(words), doctest::Contains("no training data: pass --data-path PREFIX"),
                       common::Error);
}

TEST_CASE("data flags: Megatron's default split, exclusive sources, the dump") {
  auto words = base_flags();
  std::erase(words, std::string("--mock-data"));
  auto with_data = [&](std::vector<std::string> extra) {
    auto all = words;
    all.insert(all.end(), extra.begin(), extra.end());
    return parse_words(all);
  };
  // Megatron's legacy default split, with its warning.
  const auto defaulted = with_data({"--data-path", "0.3", "a", "0.7", "b"});
  REQUIRE(defaulted);
  CHECK(defaulted->data.split == "969, 30, 1");
  CHECK(defaulted->data.data_path == std::vector<std::string>{"0.3", "a", "0.7", "b"});
  const auto values = backend::argument_values(*defaulted);
  CHECK(values.at("data_path") == "['0.3', 'a', '0.7', 'b']");
  CHECK(values.at("split") == "969, 30, 1");
  CHECK(values.at("train_data_path") == "None");
  CHECK(values.at("data_cache_path") == "None");
  CHECK(values.at("eod_mask_loss") == "False");
  const auto masked = with_data({"--data-path", "a", "--eod-mask-loss"});
  REQUIRE(masked);
  CHECK(masked->data.eod_mask_loss);
  CHECK(backend::argument_values(*masked).at("eod_mask_loss") == "True");

  const auto per_split = with_data({"--train-data-path", "t", "--valid-data-path", "0.5", "v", "0.5", "w",
                                    "--data-cache-path", "/tmp/cache"});
  REQUIRE(per_split);
  CHECK(per_split->data.split.empty());
  CHECK(per_split->data.valid_data_path.size() == 4);
  CHECK(backend::argument_values(*per_split).at("data_cache_path") == "/tmp/cache");

  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--data-path", "a", "--data-args-path", "f"}, "--data-path and --data-args-path are exclusive"},
      {{"--data-path", "a", "--train-data-path", "t"}, "--data-path and --train-data-path are exclusive"},
      {{"--train-data-path", "t", "--split", "9,1,0"}, "--split 9,1,0 applies to one blend"},
      {{"--data-path", "a", "--split", "1,2,3,4"}, "--split: '1,2,3,4': 4 shares"},
      {{"--data-path", "a", "--split", "0,0,0"}, "the shares sum to 0"},
      {{"--data-path", "a", "--seed", "4294967296"},
       "--seed: '4294967296' is out of range; --seed takes an integer in [1, 4294967295] (Megatron "
       "requires a positive seed, and numpy's RandomState one below 2^32)"},
      {{"--data-path", "a", "--num-dataset-builder-threads", "-1"},
       "--num-dataset-builder-threads: '-1' is out of range"},
      {{"--per-split-data-args-path", "p.json", "--test-data-path", "t"}, "are exclusive"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    CHECK_THROWS_WITH_AS(with_data(c.extra), doctest::Contains(c.message.c_str()), common::Error);
  }
}

TEST_CASE("--help prints usage and asks the caller to stop") {
  CHECK_FALSE(parse_words({"pretrain_gpt", "--help"}).has_value());
}

namespace {
// The base flags with --train-iters 10 swapped for `length` (e.g. --train-samples 80).
std::vector<std::string> with_length(std::vector<std::string> length, std::vector<std::string> extra) {
  auto words = base_flags();
  const auto at = std::find(words.begin(), words.end(), "--train-iters");
  words.erase(at, at + 2);
  words.insert(words.end(), length.begin(), length.end());
  words.insert(words.end(), extra.begin(), extra.end());
  return words;
}
}  // namespace

TEST_CASE("schedule and length flags that Megatron refuses together name both flags") {
  const std::vector<std::string> samples = {"--train-samples", "80"};
  const std::vector<std::string> iters = {"--train-iters", "10"};
  struct Case {
    std::vector<std::string> words;
    std::string message;
  };
  const std::vector<Case> cases = {
      {with_length({"--train-iters", "10", "--train-samples", "80"}, {}),
       "--train-iters 10 and --train-samples 80 are mutually exclusive"},
      {with_length({}, {}), "pass --train-iters N (iterations) or --train-samples N (samples)"},
      {with_length(iters, {"--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"}),
       "--lr-warmup-fraction and --lr-warmup-iters are mutually exclusive"},
      {with_length(iters, {"--lr-decay-samples", "40"}),
       "--lr-decay-samples does not go with --train-iters (Megatron refuses the mix); use --lr-decay-iters"},
      {with_length(iters, {"--lr-warmup-samples", "8"}),
       "--lr-warmup-samples does not go with --train-iters"},
      {with_length(iters, {"--lr-wsd-decay-samples", "8"}),
       "--lr-wsd-decay-samples does not go with --train-iters"},
      {with_length(iters, {"--rampup-batch-size", "2", "2", "40"}),
       "--rampup-batch-size does not go with --train-iters"},
      {with_length(samples, {"--lr-decay-iters", "5"}),
       "--lr-decay-iters does not go with --train-samples (Megatron refuses the mix); use --lr-decay-samples"},
      {with_length(samples, {"--lr-warmup-iters", "2"}), "--lr-warmup-iters does not go with --train-samples"},
      {with_length(samples, {"--lr-wsd-decay-iters", "2"}),
       "--lr-wsd-decay-iters does not go with --train-samples"},
      {with_length(samples, {"--lr-warmup-fraction", "0.1", "--lr-warmup-samples", "8"}),
       "--lr-warmup-fraction and --lr-warmup-samples are mutually exclusive"},
      {with_length(samples, {"--lr-warmup-samples", "80"}),
       "--lr-warmup-samples 80 must be smaller than --lr-decay-samples 80"},
      {with_length({"--train-samples", "4"}, {}), "--train-samples 4 is less than one global batch (8)"},
      {with_length(iters, {"--lr-decay-style", "WSD"}),
       "--lr-decay-style WSD needs the length of its final decay: --lr-wsd-decay-iters N"},
      {with_length(samples, {"--lr-decay-style", "WSD"}),
       "--lr-decay-style WSD needs the length of its final decay: --lr-wsd-decay-samples N"},
      {with_length(iters, {"--lr-wsd-decay-style", "square"}), "--lr-wsd-decay-style"},
      {with_length(iters, {"--lr-warmup-fraction", "1"}), "--lr-warmup-fraction: '1' is out of range; --lr-warmup-fraction takes a real number in [0, 1)"},
      {with_length(iters, {"--lr-warmup-init", "0.01"}), "--lr-warmup-init 0.01 must not exceed --lr 0.001"},
      {with_length(samples, {"--rampup-batch-size", "3", "1", "40"}),
       "iteration 1 (after 0 samples) has a global batch of 3, which --micro-batch-size 2"},
      {with_length(samples, {"--rampup-batch-size", "8", "2", "40"}), "nothing to ramp up"},
      {with_length(samples, {"--rampup-batch-size", "2", "2"}), "--rampup-batch-size"},
      {with_length(iters, {"--start-weight-decay", "0.1"}),
       "--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine"},
      {with_length(iters, {"--weight-decay-incr-style", "linear", "--end-weight-decay", "0.1"}),
       "--weight-decay-incr-style linear needs both --start-weight-decay and --end-weight-decay"},
      {with_length(iters, {"--tensorboard-log-interval", "0"}), "--tensorboard-log-interval: '0' is out of range"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    CHECK_THROWS_WITH_AS(parse_words(c.words), doctest::Contains(c.message.c_str()), common::Error);
  }
}

TEST_CASE("sample-based training with ramp-up parses into Megatron's derived values") {
  auto arguments = parse_words(with_length({"--train-samples", "80"},
                                     {"--rampup-batch-size", "4", "2", "16", "--lr-decay-style",
                                      "inverse-square-root", "--lr-warmup-fraction", "0.25",
                                      "--tensorboard-dir", "/tmp/tb", "--log-throughput",
                                      "--no-log-loss-scale-to-tensorboard"}));
  REQUIRE(arguments);
  // Ramp 4 → 8 by 2 over 16 samples (every 8): batches 4, 4 (to 8), 6, 6 (to 20 > 16), then
  // (80 − 20) // 8 = 7 full batches: 11 iterations.
  CHECK(arguments->run.train_iters == 11);
  CHECK(arguments->optimizer.lr_decay_samples == 80);
  CHECK(arguments->optimizer.lr_decay_iters == 0);
  CHECK(arguments->run.rampup_batch_size == std::vector<int64_t>{4, 2, 16});
  CHECK(arguments->logging.log_throughput);
  CHECK(arguments->logging.tensorboard_dir == "/tmp/tb");
  CHECK_FALSE(arguments->logging.log_loss_scale_to_tensorboard);
  const auto dump = format_arguments(*arguments);
  auto line_for = [&](const std::string& name) {
    for (const auto& line : dump) {
      if (line.find("  " + name + " ") == 0) return line;
    }
    return std::string();
  };
  CHECK(line_for("rampup_batch_size").ends_with(" ['4', '2', '16']"));
  CHECK(line_for("lr_decay_iters").ends_with(" None"));
  CHECK(line_for("train_samples").ends_with(" 80"));
  CHECK(line_for("lr_warmup_fraction").ends_with(" 0.25"));
  CHECK(line_for("tensorboard_dir").ends_with(" /tmp/tb"));
}

TEST_CASE("the new logging flags default as Megatron's") {
  auto arguments = parse_words(base_flags());
  REQUIRE(arguments);
  CHECK_FALSE(arguments->logging.log_throughput);
  CHECK(arguments->logging.tensorboard_dir.empty());
  CHECK(arguments->logging.tensorboard_log_interval == 1);
  CHECK(arguments->logging.tensorboard_queue_size == 1000);
  CHECK(arguments->logging.log_loss_scale_to_tensorboard);
  CHECK_FALSE(arguments->logging.log_validation_ppl_to_tensorboard);
  CHECK_FALSE(arguments->logging.log_timers_to_tensorboard);
  CHECK(arguments->optimizer.lr_wsd_decay_style == backend::WsdDecayStyle::exponential);
  CHECK(arguments->optimizer.weight_decay_incr_style ==
        backend::WeightDecayIncrementStyle::constant);
  CHECK(arguments->optimizer.start_weight_decay == doctest::Approx(0.01));
  CHECK(arguments->optimizer.end_weight_decay == doctest::Approx(0.01));
  CHECK_FALSE(arguments->logging.log_num_zeros_in_grad);
  CHECK(backend::argument_values(*arguments).at("log_num_zeros_in_grad") == "False");
  const auto zeros = parse_words(with({"--log-num-zeros-in-grad"}));
  REQUIRE(zeros);
  CHECK(zeros->logging.log_num_zeros_in_grad);
  CHECK(backend::argument_values(*zeros).at("log_num_zeros_in_grad") == "True");
}

TEST_CASE("the checkpointing flags parse as Megatron's and show in the arguments dump") {
  auto arguments = parse_words(with({"--save", "/tmp/ckpt", "--load", "/tmp/ckpt", "--save-interval",
                               "50", "--exit-interval", "200", "--no-load-optim", "--no-load-rng",
                               "--no-save-optim", "--no-save-rng", "--finetune",
                               "--override-opt_param-scheduler"}));
  REQUIRE(arguments);
  CHECK(arguments->checkpointing.save == "/tmp/ckpt");
  CHECK(arguments->checkpointing.load == "/tmp/ckpt");
  CHECK(arguments->checkpointing.save_interval == 50);
  CHECK(arguments->run.exit_interval == 200);
  CHECK(arguments->checkpointing.no_load_optim);
  CHECK(arguments->checkpointing.no_load_rng);
  CHECK(arguments->checkpointing.no_save_optim);
  CHECK(arguments->checkpointing.no_save_rng);
  CHECK(arguments->checkpointing.finetune);
  CHECK(arguments->checkpointing.override_opt_param_scheduler);
  CHECK_FALSE(arguments->checkpointing.use_checkpoint_opt_param_scheduler);
  const auto values = backend::argument_values(*arguments);
  CHECK(values.at("save_interval") == "50");
  CHECK(values.at("no_load_optim") == "True");
  // Megatron prints None for what was not given.
  const auto defaults = backend::argument_values(*parse_words(base_flags()));
  CHECK(defaults.at("save") == "None");
  CHECK(defaults.at("save_interval") == "None");
  CHECK(defaults.at("finetune") == "False");
  // --save-interval without --save is accepted, as Megatron accepts it.
  CHECK(parse_words(with({"--save-interval", "10"})).has_value());
}

TEST_CASE("a refused Megatron flag is named even when required flags are missing too") {
  // It used to say "--num-layers is required" and leave the refused flag for the next try.
  CHECK_THROWS_WITH_AS(parse_words({"pretrain_gpt", "--deepspeed-activation-checkpointing"}),
                       doctest::Contains("--deepspeed-activation-checkpointing is a Megatron-LM "
                                         "flag this backend does not support yet"),
                       common::Error);
}

TEST_CASE("--data-path-file is the issue's name for --data-file-list") {
  auto words = base_flags();
  words.erase(std::find(words.begin(), words.end(), "--mock-data"));
  words.insert(words.end(), {"--data-path-file", "/data/list.txt", "--eval-iters", "0"});
  const auto arguments = parse_words(words);
  REQUIRE(arguments);
  CHECK(arguments->data.data_file_list == "/data/list.txt");
}

TEST_CASE("every value is checked with the shared flag rules before it is used") {
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--lr", "abc"}, "pretrain_gpt: --lr: 'abc' is not a number; --lr takes a real number ≥ 0"},
      {{"--lr", "inf"}, "--lr: 'inf' is not a finite number"},
      {{"--min-lr", "nan"}, "--min-lr: 'nan' is not a finite number"},
      {{"--end-weight-decay", "inf"}, "--end-weight-decay: 'inf' is not a finite number"},
      // As argparse, a word that starts with '-' and is not a negative number is a flag.
      {{"--weight-decay", "-inf"}, "--weight-decay needs a value, but the next argument is the flag -inf"},
      // Given with '=', the word is the value whatever it looks like, and its rule judges it.
      {{"--weight-decay=-inf"}, "--weight-decay: '-inf' is not a finite number; --weight-decay takes"},
      {{"--lr=-1e-4"}, "--lr: '-1e-4' is out of range; --lr takes a real number ≥ 0"},
      {{"--lr", "-1e-4"}, "--lr: '-1e-4' is out of range; --lr takes a real number ≥ 0"},
      {{"--num-layers=--hidden-size"}, "--num-layers: '--hidden-size' is not an integer"},
      {{"--init-method-std", "inf"}, "--init-method-std: 'inf' is not a finite number"},
      {{"--global-batch-size", "-4"}, "'-4' is out of range; --global-batch-size takes an integer ≥ 1"},
      {{"--train-iters", "-5"}, "'-5' is out of range; --train-iters takes an integer ≥ 1"},
      {{"--hidden-dropout", "2"}, "'2' is out of range; --hidden-dropout takes a real number in [0, 1)"},
      {{"--seed", "-1"}, "--seed: '-1' is out of range; --seed takes an integer in [1, 4294967295]"},
      {{"--seed", "99999999999999999999"}, "--seed: '99999999999999999999' is larger than any"},
      {{"--num-layers", "99999999999999999999"}, "--num-layers: '99999999999999999999' is larger"},
      {{"--rampup-batch-size", "4", "-2", "100"}, "--rampup-batch-size: '-2' is out of range"},
      {{"--lr-decay-style", "exponential"}, "'exponential' is not a valid choice; --lr-decay-style "
                                            "takes one of constant, linear, cosine"},
      {{"--num-layers", "--hidden-size", "64"},
       "pretrain_gpt: --num-layers needs a value, but the next argument is the flag --hidden-size"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    CHECK_THROWS_WITH_AS(parse_words(with(c.extra)), doctest::Contains(c.message.c_str()), common::Error);
  }
  // Values are read as Megatron's argparse reads them: "010" is ten.
  CHECK(parse_words(with({"--num-layers", "010"}))->model.num_layers == 10);
}

TEST_CASE("a default is a flag not given, never a 0 given") {
  for (const char* flag : {"--max-position-embeddings", "--global-batch-size", "--ffn-hidden-size",
                           "--lr-decay-iters", "--save-interval", "--exit-interval"}) {
    CAPTURE(flag);
    CHECK_THROWS_WITH_AS(parse_words(with({flag, "0"})), doctest::Contains("'0' is out of range"),
                         common::Error);
  }
  const auto defaults = parse_words(base_flags());
  CHECK(defaults->model.max_position_embeddings == 32);
  CHECK(defaults->run.global_batch_size == 8);
  CHECK(defaults->model.ffn_hidden_size == 256);
}

TEST_CASE("derived sizes and lengths that overflow are refused naming the flags") {
  CHECK_THROWS_WITH_AS(parse_words(with({"--hidden-size", "2305843009213693952"})),
                       doctest::Contains("--ffn-hidden-size (default 4 × --hidden-size)"),
                       common::Error);
  CHECK_THROWS_WITH_AS(parse_words(with({"--train-iters", "9223372036854775807"})),
                       doctest::Contains("--train-iters × --global-batch-size (the samples the run trains on): "
                                         "9223372036854775807 × 8 exceeds"),
                       common::Error);
  // One iteration of 2^63 − 2 samples of 32 tokens: more tokens than the counters hold.
  CHECK_THROWS_WITH_AS(
      parse_words(with({"--train-iters", "1", "--global-batch-size", "9223372036854775806"})),
      doctest::Contains("exceeds 9223372036854775807"), common::Error);
  CHECK_THROWS_WITH_AS(parse_words(with({"--lr-warmup-iters", "9223372036854775806",
                                   "--lr-decay-iters", "9223372036854775807"})),
                       doctest::Contains("exceeds 9223372036854775807"), common::Error);
}

TEST_CASE("Megatron tokenizers that are valid but not built are refused as not built yet") {
  CHECK_THROWS_WITH_AS(parse_words(with({"--tokenizer-type", "TikTokenizer"})),
                       doctest::Contains("--tokenizer-type TikTokenizer is not built yet"),
                       common::Error);
  // HuggingFaceTokenizer is built and, like the SentencePiece types, reads --tokenizer-model.
  CHECK_THROWS_WITH_AS(parse_words(with({"--tokenizer-type", "HuggingFaceTokenizer"})),
                       doctest::Contains("--tokenizer-type HuggingFaceTokenizer needs "
                                         "--tokenizer-model (the directory holding tokenizer.json"),
                       common::Error);
  const auto hf = parse_words(with({"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                              "/models/llama3"}));
  REQUIRE(hf);
  CHECK(hf->tokenizer.tokenizer_model == "/models/llama3");
  CHECK_THROWS_WITH_AS(parse_words(with({"--tokenizer-type", "Llama3"})),
                       doctest::Contains("'Llama3' is not a valid choice; --tokenizer-type takes"),
                       common::Error);
}

TEST_CASE("the SentencePiece tokenizers: --tokenizer-model is needed by them and only by them") {
  const auto llama = parse_words(with({"--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model",
                                 "tokenizer.model"}));
  REQUIRE(llama);
  CHECK(llama->tokenizer.tokenizer_type == "Llama2Tokenizer");
  CHECK(llama->tokenizer.tokenizer_model == "tokenizer.model");
  CHECK(backend::argument_values(*llama).at("tokenizer_model") == "tokenizer.model");
  CHECK(backend::argument_values(*parse_words(base_flags())).at("tokenizer_model") == "None");
  for (const char* type : {"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"}) {
    CAPTURE(type);
    CHECK_THROWS_WITH_AS(parse_words(with({"--tokenizer-type", type})),
                         doctest::Contains("needs --tokenizer-model (the SentencePiece model file"),
                         common::Error);
  }
  CHECK_THROWS_WITH_AS(parse_words(with({"--tokenizer-type", "NullTokenizer", "--tokenizer-model",
                                   "tokenizer.model"})),
                       doctest::Contains("--tokenizer-model tokenizer.model is read only by the "
                                         "SentencePiece and HuggingFace tokenizers"),
                       common::Error);
  CHECK_THROWS_WITH_AS(parse_words(with({"--tokenizer-model", "tokenizer.model"})),
                       doctest::Contains("not by --tokenizer-type NullTokenizer"), common::Error);
}

TEST_CASE("loss-scaling flags: Megatron's defaults, each flag, and the arguments dump") {
  const auto defaults = parse_words(base_flags());
  REQUIRE(defaults);
  CHECK_FALSE(defaults->precision.loss_scale.has_value());
  CHECK(defaults->precision.initial_loss_scale == 4294967296.0);
  CHECK(defaults->precision.min_loss_scale == 1.0);
  CHECK(defaults->precision.loss_scale_window == 1000);
  CHECK(defaults->precision.hysteresis == 2);
  const auto default_values = backend::argument_values(*defaults);
  CHECK(default_values.at("loss_scale") == "None");
  CHECK(default_values.at("initial_loss_scale") == "4294967296");
  CHECK(default_values.at("min_loss_scale") == "1");
  CHECK(default_values.at("loss_scale_window") == "1000");
  CHECK(default_values.at("hysteresis") == "2");

  const auto given = parse_words(with({"--fp16", "--loss-scale", "1024", "--initial-loss-scale", "65536",
                                 "--min-loss-scale", "0.5", "--loss-scale-window", "200",
                                 "--hysteresis", "3"}));
  REQUIRE(given);
  CHECK(given->precision.loss_scale == 1024.0);
  CHECK(given->precision.initial_loss_scale == 65536.0);
  CHECK(given->precision.min_loss_scale == 0.5);
  CHECK(given->precision.loss_scale_window == 200);
  CHECK(given->precision.hysteresis == 3);
  const auto values = backend::argument_values(*given);
  CHECK(values.at("loss_scale") == "1024");
  CHECK(values.at("initial_loss_scale") == "65536");
  CHECK(values.at("min_loss_scale") == "0.5");
  CHECK(values.at("loss_scale_window") == "200");
  CHECK(values.at("hysteresis") == "3");
}

TEST_CASE("loss-scaling flags: each refused value names the flag and what is valid") {
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--loss-scale", "0"}, "--loss-scale: '0' is out of range; --loss-scale takes a real number > 0"},
      {{"--loss-scale=-8"}, "--loss-scale: '-8' is out of range; --loss-scale takes a real number > 0"},
      {{"--loss-scale", "inf"}, "--loss-scale: 'inf' is not a finite number"},
      {{"--initial-loss-scale", "0"},
       "--initial-loss-scale: '0' is out of range; --initial-loss-scale takes a real number > 0"},
      {{"--min-loss-scale", "0"},
       "--min-loss-scale: '0' is out of range; --min-loss-scale takes a real number > 0"},
      {{"--loss-scale-window", "0"},
       "--loss-scale-window: '0' is out of range; --loss-scale-window takes an integer ≥ 1"},
      {{"--loss-scale-window", "1.5"}, "--loss-scale-window: '1.5' is not an integer"},
      {{"--hysteresis", "0"}, "--hysteresis: '0' is out of range; --hysteresis takes an integer ≥ 1"},
      {{"--fp16", "--initial-loss-scale", "8", "--min-loss-scale", "16"},
       "--min-loss-scale 16 exceeds --initial-loss-scale 8: dynamic loss scaling (--fp16 without "
       "--loss-scale) starts at the initial scale and never goes below the minimum"},
      {{"--fp16", "--loss-scale", "1e39"}, "--loss-scale 1e+39 exceeds 3.40282e+38, the largest float32"},
      {{"--fp16", "--initial-loss-scale", "1e39", "--min-loss-scale", "1"},
       "--initial-loss-scale 1e+39 exceeds 3.40282e+38"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    CHECK_THROWS_WITH_AS(parse_words(with(c.extra)), doctest::Contains(c.message.c_str()), common::Error);
  }
  // Megatron asserts min ≤ initial only where it builds the dynamic scaler: without --fp16, or
  // with a constant --loss-scale, the two are not used and not compared.
  CHECK(parse_words(with({"--initial-loss-scale", "8", "--min-loss-scale", "16"})).has_value());
  CHECK(parse_words(with({"--fp16", "--loss-scale", "4", "--initial-loss-scale", "8",
                    "--min-loss-scale", "16"})).has_value());
  CHECK(parse_words(with({"--fp16", "--initial-loss-scale", "16", "--min-loss-scale", "16"})).has_value());
}

TEST_CASE("--use-flash-attn is accepted: attention is fused on every device") {
  CHECK_FALSE(parse_words(base_flags())->model.use_flash_attn);
  auto words = base_flags();
  words.push_back("--use-flash-attn");
  const auto arguments = parse_words(words);
  REQUIRE(arguments.has_value());
  CHECK(arguments->model.use_flash_attn);
  CHECK(backend::argument_values(*arguments).at("use_flash_attn") == "True");
}

TEST_CASE("--attention-backend picks the GPU's attention kernels, and --use-flash-attn is flash") {
  const auto defaults = parse_words(base_flags());
  REQUIRE(defaults.has_value());
  CHECK(defaults->model.attention_backend == backend::AttentionBackend::automatic);
  CHECK(backend::argument_values(*defaults).at("attention_backend") == "auto");
  for (const auto& choice : {std::pair{"fused", backend::AttentionBackend::fused},
                             std::pair{"flash", backend::AttentionBackend::flash},
                             std::pair{"unfused", backend::AttentionBackend::unfused},
                             std::pair{"local", backend::AttentionBackend::local},
                             std::pair{"auto", backend::AttentionBackend::automatic}}) {
    const std::string word = choice.first;  // (clang 14: no CAPTURE of a structured binding)
    const backend::AttentionBackend backend_choice = choice.second;
    CAPTURE(word);
    auto words = base_flags();
    words.insert(words.end(), {"--attention-backend", word});
    const auto arguments = parse_words(words);
    REQUIRE(arguments.has_value());
    CHECK(arguments->model.attention_backend == backend_choice);
    CHECK(backend::argument_values(*arguments).at("attention_backend") == word);
  }
  auto words = base_flags();
  words.insert(words.end(), {"--attention-backend", "cudnn"});
  CHECK_THROWS_WITH_AS(parse_words(words), doctest::Contains("--attention-backend"), common::Error);
  // --use-flash-attn asks for flash: with another explicit backend it is a contradiction.
  words = base_flags();
  words.insert(words.end(), {"--use-flash-attn", "--attention-backend", "fused"});
  CHECK_THROWS_WITH_AS(parse_words(words),
                       doctest::Contains("--use-flash-attn asks for --attention-backend flash"),
                       common::Error);
  words = base_flags();
  words.insert(words.end(), {"--use-flash-attn", "--attention-backend", "flash"});
  CHECK(parse_words(words).has_value());
  // What the GPU device is made with: --use-flash-attn makes auto flash; local stays local.
  backend::ModelArguments model;
  model.use_flash_attn = true;
  CHECK(backend::gpu_attention_backend(model) == backend::AttentionBackend::flash);
  model.use_flash_attn = false;
  model.attention_backend = backend::AttentionBackend::local;
  CHECK(backend::gpu_attention_backend(model) == backend::AttentionBackend::local);
}

TEST_CASE("Megatron-DeepSpeed's flags are accepted with their meaning") {
  auto words = base_flags();
  words.insert(words.end(), {"--checkpoint-activations", "--checkpoint-num-layers", "2",
                             "--data-impl", "mmap", "--distributed-backend", "gloo", "--DDP-impl",
                             "torch"});
  const auto arguments = parse_words(words);
  REQUIRE(arguments.has_value());
  CHECK(arguments->model.recompute_granularity == backend::RecomputeGranularity::full);
  CHECK(arguments->model.recompute_method == backend::RecomputeMethod::uniform);
  CHECK(arguments->model.recompute_num_layers == 2);
  const auto values = backend::argument_values(*arguments);
  CHECK(values.at("data_impl") == "mmap");
  CHECK(values.at("distributed_backend") == "gloo");
  CHECK(values.at("DDP_impl") == "torch");
  // --checkpoint-activations alone: chunks of one layer.
  auto plain = base_flags();
  plain.push_back("--checkpoint-activations");
  CHECK(parse_words(plain)->model.recompute_num_layers == 1);
}

TEST_CASE("a GPT-2 vocabulary and merges give GPT2BPETokenizer when no type is named") {
  auto words = base_flags();
  // base_flags names a tokenizer; drop it, as the Megatron-DeepSpeed scripts do.
  const auto type = std::find(words.begin(), words.end(), "--tokenizer-type");
  if (type != words.end()) words.erase(type, type + 2);
  const auto size = std::find(words.begin(), words.end(), "--vocab-size");
  if (size != words.end()) words.erase(size, size + 2);
  const std::string vocab = std::string(TEST_SOURCE_DIR) + "/tests/data/gpt2-vocab.json";
  const std::string merges = std::string(TEST_SOURCE_DIR) + "/tests/data/gpt2-merges.txt";
  words.insert(words.end(), {"--vocab-file", vocab, "--merge-file", merges});
  const auto arguments = parse_words(words);
  REQUIRE(arguments.has_value());
  CHECK(arguments->tokenizer.tokenizer_type == "GPT2BPETokenizer");
}

TEST_CASE("legacy and DeepSpeed flags that are not built are refused, naming the flag") {
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--data-impl", "lazy"}, "--data-impl lazy: only the memory-mapped reader is built"},
      {{"--data-impl", "sparse"}, "--data-impl: 'sparse' is not a valid choice"},
      {{"--distributed-backend", "mpi"}, "--distributed-backend: 'mpi' is not a valid choice"},
      {{"--checkpoint-num-layers", "2"}, "--checkpoint-num-layers 2 needs --checkpoint-activations"},
      {{"--checkpoint-activations", "--recompute-granularity", "selective"},
       "--checkpoint-activations is the old spelling of --recompute-granularity full"},
      {{"--deepspeed"}, "--deepspeed needs --deepspeed_config FILE"},
      {{"--deepspeed_config", "ds.json"}, "--deepspeed_config needs --deepspeed"},
      {{"--zero-stage", "1"}, "--zero-stage needs --deepspeed"},
      {{"--deepspeed", "--deepspeed_config", "/nonexistent/ds.json"},
       "cannot read --deepspeed_config /nonexistent/ds.json"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    auto words = base_flags();
    words.insert(words.end(), c.extra.begin(), c.extra.end());
    CHECK_THROWS_WITH_AS(parse_words(words), doctest::Contains(c.message.c_str()), common::Error);
  }
}

TEST_CASE("--distributed-timeout-minutes: Megatron's default 10, fractions, and refusals naming it") {
  const auto defaults = parse_words(base_flags());
  REQUIRE(defaults);
  CHECK(defaults->parallelism.distributed_timeout_minutes == 10);
  CHECK(backend::argument_values(*defaults).at("distributed_timeout_minutes") == "10");
  const auto given = parse_words(with({"--distributed-timeout-minutes", "30"}));
  REQUIRE(given);
  CHECK(given->parallelism.distributed_timeout_minutes == 30);
  // Fractions are our extension (Megatron's is an int), so a test need not wait minutes.
  const auto fraction = parse_words(with({"--distributed-timeout-minutes", "0.05"}));
  REQUIRE(fraction);
  CHECK(fraction->parallelism.distributed_timeout_minutes == 0.05);
  const auto lines = backend::format_arguments(*fraction);
  CHECK(std::find(lines.begin(), lines.end(),
                  "  distributed_timeout_minutes " + std::string(48 - 27, '.') + " 0.05") !=
        lines.end());
  struct Case {
    std::string value;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"0", "--distributed-timeout-minutes: '0' is out of range; "
                 "--distributed-timeout-minutes takes a real number > 0"},
           {"-1", "--distributed-timeout-minutes: '-1' is out of range; "
                  "--distributed-timeout-minutes takes a real number > 0"},
           {"=-0.5", "--distributed-timeout-minutes: '-0.5' is out of range; "
                     "--distributed-timeout-minutes takes a real number > 0"},
           {"ten", "--distributed-timeout-minutes: 'ten' is not a number; "
                   "--distributed-timeout-minutes takes a real number > 0"},
           {"inf", "--distributed-timeout-minutes: 'inf' is not a finite number"},
       }) {
    CAPTURE(c.value);
    const auto words = c.value.starts_with("=")
                           ? with({"--distributed-timeout-minutes" + c.value})
                           : with({"--distributed-timeout-minutes", c.value});
    CHECK_THROWS_WITH_AS(parse_words(words), doctest::Contains(c.message.c_str()), common::Error);
  }
}

TEST_CASE("evaluate_gpt's command line: the task flags, and no training schedule or data needed") {
  auto evaluate = [](std::vector<std::string> extra) {
    std::vector<std::string> words = {"evaluate_gpt", "--num-layers", "2", "--hidden-size", "8",
                                      "--num-attention-heads", "2", "--seq-length", "16",
                                      "--micro-batch-size", "2", "--vocab-size", "100",
                                      "--tokenizer-type", "NullTokenizer", "--load", "ckpt"};
    words.insert(words.end(), extra.begin(), extra.end());
    std::vector<const char*> argv;
    for (const auto& word : words) argv.push_back(word.c_str());
    return parse_arguments(static_cast<int>(argv.size()), argv.data(),
                           backend::ArgumentsProgram::evaluate_gpt);
  };
  const auto arguments = evaluate({"--task", "WIKITEXT103", "--valid-data", "a.tokens", "b.tokens"});
  REQUIRE(arguments);
  CHECK(arguments->program == backend::ArgumentsProgram::evaluate_gpt);
  CHECK(arguments->tasks.task == backend::ZeroShotTask::wikitext103);
  CHECK(arguments->tasks.valid_data == std::vector<std::string>{"a.tokens", "b.tokens"});
  CHECK(arguments->tasks.overlapping_eval == 32);  // Megatron's default
  CHECK_FALSE(arguments->tasks.strict_lambada);
  const auto values = backend::argument_values(*arguments);
  CHECK(values.at("task") == "WIKITEXT103");
  CHECK(values.at("valid_data") == "['a.tokens', 'b.tokens']");
  CHECK(values.at("overlapping_eval") == "32");
  CHECK(values.at("strict_lambada") == "False");
  CHECK(values.at("results_json") == "None");

  const auto lambada = evaluate({"--task", "LAMBADA", "--valid-data", "l.jsonl", "--strict-lambada",
                                 "--overlapping-eval", "8", "--results-json", "r.json"});
  REQUIRE(lambada);
  CHECK(lambada->tasks.strict_lambada);
  CHECK(lambada->tasks.overlapping_eval == 8);
  CHECK(lambada->tasks.results_json == "r.json");
  CHECK(backend::argument_values(*lambada).at("results_json") == "r.json");
  CHECK(backend::argument_values(*lambada).at("strict_lambada") == "True");

  CHECK_THROWS_WITH_AS(evaluate({"--task", "RACE", "--valid-data", "x"}),
                       doctest::Contains("--task takes one of WIKITEXT103, LAMBADA"), common::Error);
  CHECK_THROWS_WITH_AS(evaluate({"--valid-data", "x"}), doctest::Contains("--task is required"),
                       common::Error);
  CHECK_THROWS_WITH_AS(evaluate({"--task", "LAMBADA", "--valid-data", "x", "--overlapping-eval", "0"}),
                       doctest::Contains("--overlapping-eval"), common::Error);
  // pretrain_gpt does not know the task flags.
  CHECK_THROWS_WITH_AS(parse_words(with({"--task", "LAMBADA"})), doctest::Contains("--task"),
                       common::Error);
  CHECK_FALSE(backend::argument_values(*parse_words(base_flags())).contains("task"));
}

TEST_CASE("text_generation_server's command line: the server flags, no batch or schedule needed") {
  auto serve = [](std::vector<std::string> extra) {
    std::vector<std::string> words = {"text_generation_server", "--num-layers", "2",
                                      "--hidden-size", "8", "--num-attention-heads", "2",
                                      "--seq-length", "16", "--vocab-size", "100",
                                      "--tokenizer-type", "NullTokenizer", "--load", "ckpt"};
    words.insert(words.end(), extra.begin(), extra.end());
    std::vector<const char*> argv;
    for (const auto& word : words) argv.push_back(word.c_str());
    return parse_arguments(static_cast<int>(argv.size()), argv.data(),
                           backend::ArgumentsProgram::text_generation_server);
  };
  const auto defaults = serve({});
  REQUIRE(defaults);
  CHECK(defaults->program == backend::ArgumentsProgram::text_generation_server);
  CHECK(defaults->serving.host == "127.0.0.1");
  CHECK(defaults->serving.port == 5000);  // Megatron's
  CHECK(defaults->serving.max_batch_size == 8);
  CHECK(defaults->run.micro_batch_size == 1);
  const auto arguments =
      serve({"--host", "0.0.0.0", "--port", "0", "--max-batch-size", "3",
             "--max-concurrent-requests", "5", "--max-request-bytes", "100",
             "--max-prompt-bytes", "50", "--max-tokens-to-generate", "7", "--socket-timeout", "60"});
  REQUIRE(arguments);
  CHECK(arguments->serving.host == "0.0.0.0");
  CHECK(arguments->serving.port == 0);
  CHECK(arguments->serving.max_batch_size == 3);
  CHECK(arguments->serving.max_concurrent_requests == 5);
  CHECK(arguments->serving.max_request_bytes == 100);
  CHECK(arguments->serving.max_prompt_bytes == 50);
  CHECK(arguments->serving.max_tokens_to_generate == 7);
  CHECK(arguments->serving.socket_timeout == 60);
  CHECK(defaults->serving.socket_timeout == 10);
  CHECK_THROWS_WITH_AS(serve({"--socket-timeout", "0"}), doctest::Contains("--socket-timeout"),
                       common::Error);
  const auto values = backend::argument_values(*arguments);
  CHECK(values.at("port") == "0");
  CHECK(values.at("max_batch_size") == "3");
  CHECK(values.at("host") == "0.0.0.0");
  CHECK(values.at("socket_timeout") == "60");
  CHECK_THROWS_WITH_AS(serve({"--port", "65536"}), doctest::Contains("--port"), common::Error);
  CHECK_THROWS_WITH_AS(serve({"--max-batch-size", "0"}), doctest::Contains("--max-batch-size"),
                       common::Error);
  CHECK_THROWS_WITH_AS(serve({"--max-concurrent-requests", "-1"}),
                       doctest::Contains("--max-concurrent-requests"), common::Error);
  // Bounded: each request holds a connection (once, 100000000 made as many threads).
  CHECK_THROWS_WITH_AS(serve({"--max-concurrent-requests", "100000000"}),
                       doctest::Contains("--max-concurrent-requests takes an integer in [1, 4096]"),
                       common::Error);
  CHECK(serve({"--max-concurrent-requests", "4096"})->serving.max_concurrent_requests == 4096);
  // The task flags are evaluate_gpt's, the server flags the server's.
  CHECK_THROWS_WITH_AS(serve({"--task", "LAMBADA"}), doctest::Contains("--task"), common::Error);
  CHECK_THROWS_WITH_AS(parse_words(with({"--port", "5000"})), doctest::Contains("--port"),
                       common::Error);
  CHECK_FALSE(backend::argument_values(*parse_words(base_flags())).contains("port"));
}

TEST_CASE("evaluate_gpt --use-checkpoint-args: no model flag is required, and --load must hold a checkpoint") {
  auto evaluate = [](std::vector<std::string> words) {
    words.insert(words.begin(), {"evaluate_gpt", "--micro-batch-size", "2"});
    std::vector<const char*> argv;
    for (const auto& word : words) argv.push_back(word.c_str());
    return parse_arguments(static_cast<int>(argv.size()), argv.data(),
                           backend::ArgumentsProgram::evaluate_gpt);
  };
  // Without the switch the model flags are required, as before.
  CHECK_THROWS_WITH_AS(evaluate({"--task", "LAMBADA", "--valid-data", "x", "--load", "ckpt"}),
                       doctest::Contains("--num-layers is required"), common::Error);
  // With it, they come from the checkpoint, which must exist (the values taken are checked end
  // to end in tests/e2e/launcher_main_test.cpp's evaluation stage).
  test_support::TemporaryDirectory empty;
  const std::string no_checkpoint = "--use-checkpoint-args: --load " + empty.path.string() + " holds no checkpoint";
  CHECK_THROWS_WITH_AS(evaluate({"--task", "LAMBADA", "--valid-data", "x", "--use-checkpoint-args",
                                 "--load", empty.path.string()}),
                       doctest::Contains(no_checkpoint.c_str()), common::Error);
  CHECK_THROWS_WITH_AS(evaluate({"--task", "LAMBADA", "--valid-data", "x", "--use-checkpoint-args"}),
                       doctest::Contains("--use-checkpoint-args needs --load DIR"), common::Error);
  // pretrain_gpt takes it too (below); without --load it has nothing to read.
  CHECK_THROWS_WITH_AS(parse_words(with({"--use-checkpoint-args"})),
                       doctest::Contains("--use-checkpoint-args needs --load DIR"), common::Error);
}

TEST_CASE("flags may be abbreviated as argparse allows, in every program of the parser") {
  // Unique prefixes, with a value after '=' too; --seq-length is a name itself, so it is not a
  // prefix of --seq-length's longer neighbours.
  const auto arguments = parse_words({"pretrain_gpt", "--num-layers", "2", "--hidden-s=64",
                                      "--num-attention", "4", "--seq-length", "32",
                                      "--micro", "2", "--global-b", "8", "--train-it", "10",
                                      "--lr", "1e-3", "--mock", "--vocab-s", "100"});
  REQUIRE(arguments);
  CHECK(arguments->model.hidden_size == 64);
  CHECK(arguments->model.num_attention_heads == 4);
  CHECK(arguments->run.micro_batch_size == 2);
  CHECK(arguments->run.global_batch_size == 8);
  CHECK(arguments->run.train_iters == 10);
  CHECK(arguments->tokenizer.vocab_size == 100);
  CHECK(arguments->data.mock_data);
  // A prefix of a flag without effect is that flag; of a default-only flag or one whose value
  // may be refused, judged as it.
  CHECK(parse_words(with({"--no-masked-soft", "--ckpt-form", "torch"})).has_value());
  CHECK_THROWS_WITH_AS(parse_words(with({"--dataloader-t", "cyclic"})),
                       doctest::Contains("--dataloader-type cyclic: not built"), common::Error);
  CHECK(parse_words(with({"--ckpt-form", "torch_dist"})).has_value());
  CHECK_THROWS_WITH_AS(parse_words(with({"--ckpt-form", "zarr"})),
                       doctest::Contains("--ckpt-format zarr: not built"), common::Error);
  // A prefix of a refused flag is refused as the flag, with its reason.
  CHECK_THROWS_WITH_AS(parse_words(with({"--qk-layer"})),
                       doctest::Contains("--qk-layernorm is a Megatron-LM flag this backend does not "
                                         "support yet"),
                       common::Error);
  CHECK_THROWS_WITH_AS(parse_words(with({"--vocab", "v.json"})),
                       "pretrain_gpt: ambiguous option: --vocab could match --vocab-size, "
                       "--vocab-file, --vocab-extra-ids",
                       common::Error);
  // Flags read before the parse see the abbreviation written out.
  CHECK_THROWS_WITH_AS(parse_words(with({"--encoder-seq", "32"})),
                       doctest::Contains("--seq-length and --encoder-seq-length are the same setting"),
                       common::Error);
  // --use-checkpoint-args abbreviated: the model flags are not required.
  std::vector<const char*> evaluate = {"evaluate_gpt", "--micro-batch-size", "2", "--task",
                                       "LAMBADA", "--valid-data", "x", "--use-checkpoint-a"};
  CHECK_THROWS_WITH_AS(parse_arguments(static_cast<int>(evaluate.size()), evaluate.data(),
                                       backend::ArgumentsProgram::evaluate_gpt),
                       doctest::Contains("--use-checkpoint-args needs --load DIR"), common::Error);
  std::vector<const char*> server = {"text_generation_server", "--num-layers", "2", "--hidden-size",
                                     "64", "--num-attention-heads", "4", "--seq-length", "32",
                                     "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
                                     "--load", "ckpt", "--max-batch", "3"};
  const auto serving = parse_arguments(static_cast<int>(server.size()), server.data(),
                                       backend::ArgumentsProgram::text_generation_server);
  REQUIRE(serving);
  CHECK(serving->serving.max_batch_size == 3);
}

TEST_CASE("older Megatron's activation checkpointing flags are the full recompute") {
  const auto uniform = parse_words(with({"--activations-checkpoint-method", "uniform",
                                         "--activations-checkpoint-num-layers", "2"}));
  REQUIRE(uniform);
  CHECK(uniform->model.recompute_granularity == backend::RecomputeGranularity::full);
  CHECK(uniform->model.recompute_method == backend::RecomputeMethod::uniform);
  CHECK(uniform->model.recompute_num_layers == 2);
  const auto block = parse_words(with({"--activations-checkpoint-method", "block"}));
  REQUIRE(block);
  CHECK(block->model.recompute_granularity == backend::RecomputeGranularity::full);
  CHECK(block->model.recompute_method == backend::RecomputeMethod::block);
  CHECK(block->model.recompute_num_layers == 1);  // Megatron's default then
  // --checkpoint-activations set the method uniform, with either name of the layer count.
  const auto old = parse_words(with({"--checkpoint-activations", "--activations-checkpoint-num-layers", "2"}));
  REQUIRE(old);
  CHECK(old->model.recompute_method == backend::RecomputeMethod::uniform);
  CHECK(old->model.recompute_num_layers == 2);
  CHECK(parse_words(with({"--checkpoint-activations", "--activations-checkpoint-method", "uniform"}))
            ->model.recompute_method == backend::RecomputeMethod::uniform);

  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--activations-checkpoint-method", "chunks"},
       "--activations-checkpoint-method: 'chunks' is not a valid choice"},
      {{"--activations-checkpoint-num-layers", "2"},
       "--activations-checkpoint-num-layers 2 needs --checkpoint-activations or "
       "--activations-checkpoint-method"},
      {{"--activations-checkpoint-method", "uniform", "--recompute-num-layers", "2"},
       "--activations-checkpoint-method is the old spelling of --recompute-granularity full "
       "--recompute-method uniform: give one or the other"},
      {{"--checkpoint-activations", "--activations-checkpoint-method", "block"},
       "--checkpoint-activations is --activations-checkpoint-method uniform, but "
       "--activations-checkpoint-method block is given too"},
      {{"--checkpoint-activations", "--checkpoint-num-layers", "2",
        "--activations-checkpoint-num-layers", "3"},
       "--checkpoint-num-layers 2 and --activations-checkpoint-num-layers 3 disagree"},
      {{"--distribute-checkpointed-activations"},
       "--distribute-checkpointed-activations is a Megatron-LM flag this backend does not support "
       "yet: spreading the recompute inputs"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    CHECK_THROWS_WITH_AS(parse_words(with(c.extra)), doctest::Contains(c.message.c_str()),
                         common::Error);
  }
  // evaluate_gpt shares the parser.
  std::vector<const char*> evaluate = {"evaluate_gpt", "--num-layers", "2", "--hidden-size", "64",
                                       "--num-attention-heads", "4", "--seq-length", "32",
                                       "--micro-batch-size", "2", "--task", "LAMBADA",
                                       "--valid-data", "x", "--tokenizer-type", "NullTokenizer",
                                       "--vocab-size", "100", "--activations-checkpoint-method",
                                       "uniform"};
  const auto evaluating = parse_arguments(static_cast<int>(evaluate.size()), evaluate.data(),
                                          backend::ArgumentsProgram::evaluate_gpt);
  REQUIRE(evaluating);
  CHECK(evaluating->model.recompute_granularity == backend::RecomputeGranularity::full);
}

TEST_CASE("Megatron's switches without effect here are accepted, and change nothing") {
  // The flags of Megatron's Llama and GPT-3 example scripts and docs/llama_mistral.md that
  // select its own kernels or PyTorch machinery.
  const auto plain = parse_words(base_flags());
  const auto with_switches = parse_words(with({"--use-mcore-models",
                                               "--no-masked-softmax-fusion",
                                               "--no-bias-gelu-fusion",
                                               "--no-bias-swiglu-fusion",
                                               "--no-bias-dropout-fusion",
                                               "--no-rope-fusion",
                                               "--no-persist-layer-norm",
                                               "--no-gradient-accumulation-fusion",
                                               "--cross-entropy-loss-fusion",
                                               "--no-async-tensor-model-parallel-allreduce",
                                               "--attention-softmax-in-fp32",
                                               "--apply-query-key-layer-scaling",
                                               "--accumulate-allreduce-grads-in-fp32",
                                               "--no-create-attention-mask-in-dataloader",
                                               "--no-mmap-bin-files",
                                               "--deterministic-mode",
                                               "--use-cpu-initialization",
                                               "--manual-gc",
                                               "--manual-gc-interval",
                                               "100",
                                               "--transformer-impl",
                                               "transformer_engine",
                                               "--attention-backend",
                                               "auto",
                                               "--num-workers",
                                               "8",
                                               "--empty-unused-memory-level",
                                               "1",
                                               "--timing-log-option",
                                               "minmax",
                                               "--timing-log-level",
                                               "0",
                                               "--optimizer",
                                               "adam",
                                               "--dataloader-type",
                                               "single",
                                               "--ckpt-format",
                                               "native",
                                               "--kv-channels",
                                               "16",
                                               "--vocab-extra-ids",
                                               "0",
                                               "--context-parallel-size",
                                               "1",
                                               "--expert-model-parallel-size",
                                               "1",
                                               "--wandb-project",
                                               "",
                                               "--wandb-exp-name",
                                               "run",
                                               "--log-batch-size-to-tensorboard"}));
  REQUIRE(plain);
  REQUIRE(with_switches);
  // The model, schedule and data are the same: the arguments dump differs in the command line
  // alone.
  auto without_command = [](std::vector<std::string> lines) {
    std::erase_if(lines, [](const std::string& line) {
      return line.find("command_line") != std::string::npos;
    });
    return lines;
  };
  CHECK(without_command(backend::format_arguments(*plain)) ==
        without_command(backend::format_arguments(*with_switches)));
}

TEST_CASE("Megatron's old RoPE switches and --encoder-seq-length") {
  auto words = base_flags();
  const auto seq = std::find(words.begin(), words.end(), "--seq-length");
  *seq = "--encoder-seq-length";
  words.insert(words.end(), {"--use-rotary-position-embeddings", "--no-position-embedding"});
  const auto arguments = parse_words(words);
  REQUIRE(arguments);
  CHECK(arguments->model.position_embedding_type == backend::PositionEmbeddingType::rope);
  CHECK(arguments->model.seq_length == 32);
  CHECK(parse_words(with({"--position-embedding-type", "rope", "--no-position-embedding"}))
            ->model.position_embedding_type == backend::PositionEmbeddingType::rope);
}

TEST_CASE("Megatron flags built for one value, or not at all, are refused with the reason") {
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--no-position-embedding"},
       "--no-position-embedding without --position-embedding-type rope: a model without "
       "position embeddings is not built"},
      {{"--encoder-seq-length", "32"},
       "--seq-length and --encoder-seq-length are the same setting in a GPT model"},
      {{"--kv-channels", "32"},
       "--kv-channels 32: a head dimension other than --hidden-size / --num-attention-heads "
       "(64 / 4) is not built"},
      {{"--optimizer", "sgd"}, "--optimizer sgd: not built"},
      {{"--optimizer", "lion"},
       "--optimizer: 'lion' is not a valid choice; --optimizer takes one of adam, sgd"},
      {{"--dataloader-type", "cyclic"}, "--dataloader-type cyclic: not built"},
      {{"--ckpt-format", "zarr"}, "--ckpt-format zarr: not built"},
      {{"--vocab-extra-ids", "100"},
       "--vocab-extra-ids 100: training with SentencePieceTokenizer's <extra_id_N> tokens is not "
       "built"},
      {{"--context-parallel-size", "2"},
       "--context-parallel-size 2: context parallelism is not built"},
      {{"--expert-model-parallel-size", "8"}, "--expert-model-parallel-size 8: mixture-of-experts"},
      {{"--timing-log-level", "2"},
       "--timing-log-level 2: Megatron's timer breakdown is not built"},
      {{"--timing-log-level", "3"}, "--timing-log-level: '3' is out of range"},
      {{"--wandb-project", "gpt"}, "--wandb-project gpt: Weights & Biases logging is not built"},
      {{"--transformer-impl", "te"}, "--transformer-impl: 'te' is not a valid choice"},
      {{"--num-workers", "-1"}, "--num-workers: '-1' is out of range"},
      {{"--empty-unused-memory-level", "3"}, "--empty-unused-memory-level: '3' is out of range"},
      {{"--qk-layernorm"},
       "--qk-layernorm is a Megatron-LM flag this backend does not support yet: a norm on the "
       "queries and keys is not built"},
      {{"--num-experts", "8"},
       "--num-experts is a Megatron-LM flag this backend does not support yet: mixture-of-experts"},
      {{"--fp8-format", "hybrid"},
       "--fp8-format is a Megatron-LM flag this backend does not support yet: fp8 training is not "
       "built"},
      {{"--use-dist-ckpt"},
       "--use-dist-ckpt is a Megatron-LM flag this backend does not support yet"},
      {{"--profile"}, "--profile is a Megatron-LM flag this backend does not support yet"},
      {{"--overlap-p2p-communication", "--no-overlap-p2p-communication"},
       "--overlap-p2p-communication and --no-overlap-p2p-communication contradict each other"},
      {{"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
        "--no-overlap-p2p-communication"},
       "--num-layers-per-virtual-pipeline-stage with --no-overlap-p2p-communication needs "
       "--pipeline-model-parallel-size greater than 2"},
      {{"--num-layers-per-virtual-pipeline-stage", "1"},
       "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size greater "
       "than 1"},
      {{"--cuda-graph-impl", "transformer_engine"},
       "--cuda-graph-impl transformer_engine (--external-cuda-graph) captures through NVIDIA "
       "Transformer Engine, which this backend does not use; --cuda-graph-impl local"},
      {{"--external-cuda-graph"}, "captures through NVIDIA Transformer Engine"},
      {{"--enable-cuda-graph", "--cuda-graph-impl", "local"},
       "Do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl"},
      {{"--enable-cuda-graph", "--external-cuda-graph"},
       "--enable-cuda-graph and --external-cuda-graph cannot be enabled at the same time"},
      {{"--cuda-graph-impl", "local", "--cuda-graph-warmup-steps", "0"},
       "--cuda-graph-warmup-steps 0: at least 1"},
      {{"--cuda-graph-impl", "layer"}, "--cuda-graph-impl"},
      {{"--train-tokens", "1000"},
       "--train-tokens is a Megatron-LM flag this backend does not support yet: "
       "Megatron-DeepSpeed's token-based schedule is not built"},
      {{"--hf-ckpt-dir", "llama"}, "checkpoint_util --import-hf DIR --save CKPT"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    CHECK_THROWS_WITH_AS(parse_words(with(c.extra)), doctest::Contains(c.message.c_str()),
                         common::Error);
  }
}

TEST_CASE("--exit-signal-handler and --exit-on-missing-checkpoint are parsed and dumped") {
  const auto plain = parse_words(base_flags());
  REQUIRE(plain);
  CHECK_FALSE(plain->run.exit_signal_handler);
  CHECK_FALSE(plain->checkpointing.exit_on_missing_checkpoint);
  const auto arguments =
      parse_words(with({"--exit-signal-handler", "--exit-on-missing-checkpoint"}));
  REQUIRE(arguments);
  CHECK(arguments->run.exit_signal_handler);
  CHECK(arguments->checkpointing.exit_on_missing_checkpoint);
  const auto lines = backend::format_arguments(*arguments);
  auto has = [&](const std::string& key) {
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& line) {
      return line.find(key + " ") != std::string::npos && line.ends_with(" True");
    });
  };
  CHECK(has("exit_signal_handler"));
  CHECK(has("exit_on_missing_checkpoint"));
  CHECK(arguments->run.exit_signal == "SIGTERM");
  CHECK(parse_words(with({"--exit-signal-handler", "--exit-signal", "SIGUSR1"}))->run.exit_signal ==
        "SIGUSR1");
  CHECK_THROWS_WITH_AS(parse_words(with({"--exit-signal", "SIGKILL"})),
                       doctest::Contains("--exit-signal: 'SIGKILL' is not a valid choice"),
                       common::Error);
}

TEST_CASE("Megatron-DeepSpeed's Llama 2 example flags: its spellings of the same model") {
  // examples_deepspeed/pretrain_llama2_distributed.sh, shrunk: lower-case norm names,
  // --num-key-value-heads, --use-flash-attn-v2, --rotary-position-embeddings-theta,
  // --no-pipeline-parallel, --optimizer adam, --no-query-key-layer-scaling.
  const auto arguments = parse_words(with(
      {"--ffn-hidden-size", "96", "--optimizer", "adam", "--adam-beta1", "0.9", "--adam-beta2",
       "0.95", "--no-query-key-layer-scaling", "--use-rotary-position-embeddings",
       "--rotary-position-embeddings-theta", "500000", "--untie-embeddings-and-output-weights",
       "--swiglu", "--normalization", "rmsnorm", "--disable-bias-linear", "--num-key-value-heads",
       "2", "--use-flash-attn-v2", "--no-pipeline-parallel"}));
  REQUIRE(arguments);
  CHECK(arguments->model.normalization == backend::Normalization::rms_norm);
  CHECK(arguments->model.group_query_attention);
  CHECK(arguments->model.num_query_groups == 2);
  CHECK(arguments->model.use_flash_attn);
  CHECK(arguments->model.rotary_base == 500000);
  CHECK(arguments->model.position_embedding_type == backend::PositionEmbeddingType::rope);
  CHECK(parse_words(with({"--normalization", "layernorm"}))->model.normalization ==
        backend::Normalization::layer_norm);
  // As many key/value heads as heads: plain multi-head attention.
  CHECK_FALSE(parse_words(with({"--num-key-value-heads", "4"}))->model.group_query_attention);
  CHECK_THROWS_WITH_AS(parse_words(with({"--num-key-value-heads", "3"})),
                       doctest::Contains("--num-attention-heads"), common::Error);
  CHECK_THROWS_WITH_AS(
      parse_words(with({"--num-key-value-heads", "2", "--group-query-attention",
                        "--num-query-groups", "1"})),
      doctest::Contains("--num-key-value-heads 2 and --num-query-groups 1 disagree"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      parse_words(with({"--no-pipeline-parallel", "--pipeline-model-parallel-size", "2"})),
      doctest::Contains("--no-pipeline-parallel with --pipeline-model-parallel-size 2"),
      common::Error);
}

TEST_CASE("--use-rope-scaling and --rope-scaling-factor: Megatron's default 8, the dump, the model") {
  const auto plain = parse_words(base_flags());
  REQUIRE(plain);
  CHECK_FALSE(plain->model.use_rope_scaling);
  CHECK(plain->model.rope_scaling_factor == 8.0);
  CHECK_FALSE(backend::model_config(*plain).rope_scaling.active());
  const auto llama3 = parse_words(with({"--position-embedding-type", "rope", "--use-rope-scaling",
                                        "--rope-scaling-factor", "32"}));
  REQUIRE(llama3);
  CHECK(llama3->model.use_rope_scaling);
  const auto values = backend::argument_values(*llama3);
  CHECK(values.at("use_rope_scaling") == "True");
  CHECK(values.at("rope_scaling_factor") == "32.0");
  CHECK(backend::argument_values(*plain).at("rope_scaling_factor") == "8.0");
  CHECK(backend::model_config(*llama3).rope_scaling == backend::RopeScaling{.factor = 32});
  CHECK_THROWS_WITH_AS(parse_words(with({"--rope-scaling-factor", "0.5"})),
                       doctest::Contains("--rope-scaling-factor: '0.5' is out of range"),
                       common::Error);
  // Learned positions have no frequencies to scale.
  const auto learned = parse_words(with({"--use-rope-scaling"}));
  REQUIRE(learned);
  CHECK_THROWS_WITH_AS(backend::model_config(*learned),
                       doctest::Contains("--use-rope-scaling scales RoPE's frequencies: it needs "
                                         "--position-embedding-type rope"),
                       common::Error);
}

TEST_CASE("--gemm-autotune: off by default, on by the flag, in the dump") {
  const auto plain = parse_words(base_flags());
  REQUIRE(plain);
  CHECK_FALSE(plain->gemm_autotune);
  const auto tuned = parse_words(with({"--gemm-autotune"}));
  REQUIRE(tuned);
  CHECK(tuned->gemm_autotune);
  const auto lines = backend::format_arguments(*tuned);
  CHECK(std::any_of(lines.begin(), lines.end(), [](const std::string& line) {
    return line.starts_with("  gemm_autotune") && line.ends_with("True");
  }));
}

TEST_CASE("the CUDA graph flags: Megatron's names and defaults, the older spelling, the dump") {
  const auto plain = parse_words(base_flags());
  REQUIRE(plain);
  CHECK(plain->cuda_graph_impl == backend::CudaGraphImpl::none);
  CHECK(plain->cuda_graph_warmup_steps == 3);
  const auto enabled = parse_words(with({"--enable-cuda-graph", "--cuda-graph-warmup-steps", "2"}));
  REQUIRE(enabled);
  CHECK(enabled->cuda_graph_impl == backend::CudaGraphImpl::local);
  CHECK(enabled->cuda_graph_warmup_steps == 2);
  CHECK(parse_words(with({"--cuda-graph-impl", "full_iteration"}))->cuda_graph_impl ==
        backend::CudaGraphImpl::full_iteration);
  const auto lines = backend::format_arguments(*enabled);
  auto has = [&](const std::string& line_end) {
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& line) {
      return line.starts_with("  " + line_end.substr(0, line_end.find(' '))) &&
             line.ends_with(line_end.substr(line_end.find(' ') + 1));
    });
  };
  CHECK(has("cuda_graph_impl local"));
  CHECK(has("cuda_graph_warmup_steps 2"));
}
