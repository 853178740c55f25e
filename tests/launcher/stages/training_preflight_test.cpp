// Preflight: layouts Megatron would reject after queueing are refused up front, all at once,
// and the memory estimate has the right magnitudes.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/stages/training_preflight.hpp"
#include "launcher/stages/training_stage.hpp"

using namespace launcher;

namespace {
Node composed(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "training=gpt3/126m");
  overrides.push_back("launcher_scripts_path=/opt/launcher");
  ComposedConfig config = compose({std::string(TEST_SOURCE_DIR) + "/conf", "config", overrides});
  return resolve(config.config, ResolveContext{config.choices});
}

// On the local cluster: the checks of every cluster, none of the GPU cluster's.
PreflightReport local_preflight(const Node& config) {
  return training_preflight(config, "local");
}

bool mentions(const PreflightReport& report, const std::string& text) {
  for (const auto& problem : report.problems) {
    if (problem.find(text) != std::string::npos) return true;
  }
  return false;
}
}  // namespace

TEST_CASE("the shipped gpt3/126m passes, with a memory table of the right size") {
  const auto report = local_preflight(composed({}));
  CHECK(report.problems.empty());
  CHECK(report.parameters > 120'000'000);
  CHECK(report.parameters < 130'000'000);
  // bf16 weights: 2 bytes per parameter on one GPU.
  CHECK(report.memory.weights_bytes == doctest::Approx(2.0 * report.parameters).epsilon(0.02));
  CHECK(report.memory.optimizer_bytes == doctest::Approx(12.0 * report.parameters).epsilon(0.02));
  const auto lines = format_preflight(report);
  CHECK(lines.front().find("1 GPU(s) (1 node(s) × 1) = tp 1 × pp 1 × dp 1") != std::string::npos);
  CHECK(lines.back().find("total") != std::string::npos);
}

TEST_CASE("every layout problem is reported, naming the keys") {
  const auto report = local_preflight(composed(
      {"training.trainer.num_nodes=2", "training.trainer.devices=8",
       "training.model.tensor_model_parallel_size=5",
       "training.model.pipeline_model_parallel_size=5", "training.model.encoder_seq_length=4096",
       "training.model.max_position_embeddings=2048"}));
  CHECK(mentions(report, "tensor_model_parallel_size 5 × pipeline_model_parallel_size 5 = 25 does "
                         "not divide the 16 GPUs"));
  CHECK(mentions(report, "num_attention_heads 12 is not divisible by tensor_model_parallel_size 5"));
  CHECK(mentions(report, "num_layers 12 is not divisible by pipeline_model_parallel_size 5"));
  CHECK(mentions(report, "encoder_seq_length 4096 exceeds max_position_embeddings 2048"));
}

TEST_CASE("the global batch must split into micro batches over the data-parallel ranks") {
  const auto report =
      local_preflight(composed({"training.trainer.devices=8", "training.model.global_batch_size=36",
                                "training.model.micro_batch_size=4"}));
  CHECK(mentions(report, "global_batch_size 36 is not divisible by micro_batch_size 4 × "
                         "data-parallel size 8"));
}

TEST_CASE("the interleaved schedule's rules are checked before queueing, naming the keys") {
  // 4 GPUs, pp 4, dp 1; gpt3/126m's 256 / 4 = 64 micro batches per step.
  auto interleaved = [](std::vector<std::string> overrides) {
    overrides.insert(overrides.end(), {"training.trainer.devices=4", "training.model.num_layers=24",
                                       "training.model.pipeline_model_parallel_size=4"});
    return composed(overrides);
  };
  const auto fits =
      local_preflight(interleaved({"+training.model.virtual_pipeline_model_parallel_size=3"}));
  for (const auto& problem : fits.problems) MESSAGE(problem);
  CHECK(fits.problems.empty());
  CHECK(fits.virtual_pipeline == 3);
  CHECK(format_preflight(fits).front().find("4 GPU(s) (1 node(s) × 4) = tp 1 × pp 4 (interleaved, "
                                            "3 model chunks per stage) × dp 1") !=
        std::string::npos);
  // Null and 1 are the plain schedule, whatever pp is.
  for (const std::string chunks : {"null", "1"}) {
    CAPTURE(chunks);
    const auto plain = local_preflight(
        composed({"+training.model.virtual_pipeline_model_parallel_size=" + chunks}));
    CHECK(plain.problems.empty());
    CHECK(plain.virtual_pipeline == 1);
    CHECK(format_preflight(plain).front().find("interleaved") == std::string::npos);
  }

  // pp ≤ 2: Megatron's interleaved schedule without overlapped p2p (NeMo's default) needs more
  // stages; with model.overlap_p2p_comm true, two are enough, one is not.
  const auto stages = [&](const std::string& pp, const std::string& overlap) {
    std::vector<std::string> overrides = {"training.trainer.devices=" + pp,
                                          "training.model.num_layers=24",
                                          "training.model.pipeline_model_parallel_size=" + pp,
                                          "+training.model.virtual_pipeline_model_parallel_size=2"};
    if (!overlap.empty()) overrides.push_back("training.model.overlap_p2p_comm=" + overlap);
    if (overlap == "true") overrides.push_back("training.model.batch_p2p_comm=false");
    return local_preflight(composed(overrides));
  };
  for (const std::string overlap : {"", "false"}) {
    CAPTURE(overlap);
    for (const std::string pp : {"1", "2"}) {
      CAPTURE(pp);
      const auto report = stages(pp, overlap);
      REQUIRE(report.problems.size() == 1);
      CHECK(report.problems.front() ==
            "training.model.virtual_pipeline_model_parallel_size 2 needs "
            "pipeline_model_parallel_size > 2 for Megatron's interleaved schedule without "
            "overlap_p2p_comm, got " +
                pp + ": raise pipeline_model_parallel_size" +
                (pp == "2" ? ", set overlap_p2p_comm to true" : "") +
                " or set virtual_pipeline_model_parallel_size to null");
    }
  }
  CHECK(stages("2", "true").problems.empty());
  // NeMo passes both keys to Megatron core's interleaved schedule, which refuses the overlap
  // with batched transfers (batch_p2p_comm's default is true); without interleaving neither is
  // read.
  for (const std::string batched : {"true", "null"}) {
    CAPTURE(batched);
    const auto both = local_preflight(composed(
        {"training.trainer.devices=4", "training.model.num_layers=24",
         "training.model.pipeline_model_parallel_size=4",
         "+training.model.virtual_pipeline_model_parallel_size=2",
         "training.model.overlap_p2p_comm=true", "training.model.batch_p2p_comm=" + batched}));
    REQUIRE(both.problems.size() == 1);
    CHECK(both.problems.front() ==
          "training.model.overlap_p2p_comm true needs training.model.batch_p2p_comm false "
          "(NeMo's default is true): Megatron core's interleaved schedule can not use both "
          "overlap_p2p_comm and batch_p2p_comm");
  }
  CHECK(local_preflight(composed({"training.model.overlap_p2p_comm=true",
                                  "training.model.batch_p2p_comm=true"}))
            .problems.empty());
  const auto one_stage = stages("1", "true");
  REQUIRE(one_stage.problems.size() == 1);
  CHECK(one_stage.problems.front() ==
        "training.model.virtual_pipeline_model_parallel_size 2 needs "
        "pipeline_model_parallel_size > 1 for Megatron's interleaved schedule, got 1: raise "
        "pipeline_model_parallel_size or set virtual_pipeline_model_parallel_size to null");
  // 24 layers in 4 stages of 5 chunks.
  const auto uneven =
      local_preflight(interleaved({"+training.model.virtual_pipeline_model_parallel_size=5"}));
  REQUIRE(uneven.problems.size() == 1);
  CHECK(uneven.problems.front() ==
        "training.model.num_layers 24 is not divisible by pipeline_model_parallel_size 4 × "
        "virtual_pipeline_model_parallel_size 5 = 20 (every model chunk holds the same number of "
        "layers)");
  // 24 / (4 × 1) = 6 micro batches per step, not a whole number of rounds of pp 4.
  const auto batches =
      local_preflight(interleaved({"+training.model.virtual_pipeline_model_parallel_size=3",
                                   "training.model.global_batch_size=24"}));
  REQUIRE(batches.problems.size() == 1);
  CHECK(batches.problems.front() ==
        "training.model.global_batch_size 24 / (micro_batch_size 4 × data-parallel size 1) = 6 "
        "micro batches per step is not divisible by pipeline_model_parallel_size 4, as Megatron's "
        "interleaved schedule (virtual_pipeline_model_parallel_size 3) needs");
  // The same batch is fine without interleaving.
  CHECK(local_preflight(interleaved({"training.model.global_batch_size=24"})).problems.empty());
  // All of them at once.
  const auto all = local_preflight(composed(
      {"training.trainer.devices=2", "training.model.num_layers=25",
       "training.model.pipeline_model_parallel_size=2", "training.model.global_batch_size=12",
       "+training.model.virtual_pipeline_model_parallel_size=2"}));
  CHECK(mentions(all, "num_layers 25 is not divisible by pipeline_model_parallel_size 2"));
  CHECK(mentions(all, "needs pipeline_model_parallel_size > 2"));
  CHECK(mentions(all, "× virtual_pipeline_model_parallel_size 2 = 4"));
  CHECK(mentions(all, "= 3 micro batches per step is not divisible by "
                      "pipeline_model_parallel_size 2"));
  CHECK_THROWS_WITH_AS(
      enforce_training_preflight(
          interleaved({"+training.model.virtual_pipeline_model_parallel_size=5"}), "local", false),
      doctest::Contains("preflight refused the training stage before queueing it:\n  - "
                        "training.model.num_layers 24 is not divisible by"),
      common::Error);
}

TEST_CASE("preflight memory: the interleaved schedule's extra activations are in the estimate") {
  // gpt3/126m at 24 layers on pp 4 (bf16, s 2048, b 4, h 768, no recompute, distributed
  // optimizer at dp 1). 1F1B: the first stage's 4 micro batches of 6 layers (24 layers' worth)
  // outweigh the last stage's one micro batch and the logits. V = 3: the first stage keeps
  // 2·3 + 2·4 + 1 = 15 chunks of 2 layers (24 · (1 + 3/12) = 30), more than the last's
  // 2·4 + 1 = 9 chunks (18 layers) with the bf16 logits, s·b·V·2.
  auto layout = [](std::vector<std::string> overrides) {
    overrides.insert(overrides.end(), {"training.trainer.devices=4", "training.model.num_layers=24",
                                       "training.model.pipeline_model_parallel_size=4"});
    return local_preflight(composed(overrides));
  };
  const auto plain = layout({});
  const auto interleaved = layout({"+training.model.virtual_pipeline_model_parallel_size=3"});
  REQUIRE(plain.problems.empty());
  REQUIRE(interleaved.problems.empty());
  const double layer = 2048.0 * 4 * 768 * 34;
  CHECK(plain.memory.activations_bytes == doctest::Approx(24 * layer));
  CHECK(interleaved.memory.activations_bytes == doctest::Approx(30 * layer));
}

TEST_CASE("preflight memory: the table shows host memory when the estimate offloads some") {
  // NeMo has no ZeRO-3 or offload keys, so the launcher's own estimates never offload; the
  // table is the shared one, which prints the host figure whenever there is one.
  auto report = local_preflight(composed({}));
  REQUIRE(report.problems.empty());
  for (const auto& line : format_preflight(report)) {
    CHECK(line.find("host memory") == std::string::npos);
  }
  report.memory.host_bytes = 12.5e9;
  const auto lines = format_preflight(report);
  CHECK(lines.back() == "  host memory         12.50 GB (offloaded, not in the total)");
  CHECK(lines[lines.size() - 2].starts_with("  total "));
}

TEST_CASE("a virtual_pipeline_model_parallel_size below 1 or not an integer is refused first") {
  for (const std::string chunks : {"0", "-1", "two", "2.5"}) {
    CAPTURE(chunks);
    const auto report = local_preflight(
        composed({"+training.model.virtual_pipeline_model_parallel_size=" + chunks}));
    REQUIRE(report.problems.size() == 1);
    CHECK(report.problems.front().starts_with(
        "training.model.virtual_pipeline_model_parallel_size: '" + chunks + "' is "));
    CHECK(report.problems.front().find(
              "virtual_pipeline_model_parallel_size takes an integer ≥ 1 (the model chunks per "
              "pipeline stage; null or 1: no interleaving)") != std::string::npos);
    CHECK(report.parameters == 0);  // nothing was computed from it
  }
}

TEST_CASE("a split that leaves validation empty is refused while validation runs") {
  auto with_data = [](std::string split, std::string val_batches) {
    return composed({"training.model.data.data_impl=mmap",
                     "training.model.data.data_prefix=[1.0,/data/x]",
                     "training.model.data.splits_string='" + split + "'",
                     "training.trainer.limit_val_batches=" + val_batches});
  };
  CHECK(
      mentions(local_preflight(with_data("100,0,0", "50")),
               "leaves the validation split empty while training.trainer.limit_val_batches is 50"));
  CHECK(local_preflight(with_data("100,0,0", "0")).problems.empty());
  CHECK(local_preflight(with_data("99990/8/2", "50")).problems.empty());
  // The split string is checked with the backend's --split rule, naming the key.
  CHECK(mentions(local_preflight(with_data("99,x,1", "50")),
                 "training.model.data.splits_string: '99,x,1': 'x' is not a number; "
                 "training.model.data.splits_string (--split) takes"));
  CHECK(mentions(local_preflight(with_data("1,1,1,1", "50")), "4 shares"));
  // An empty test split is no problem: pretrain_gpt skips the test pass, as Megatron does.
  CHECK(local_preflight(with_data("98,2,0", "50")).problems.empty());
  // Lightning's float 0.0 is no validation, so no validation share is needed either.
  CHECK(local_preflight(with_data("100,0,0", "0.0")).problems.empty());
  CHECK(mentions(local_preflight(with_data("98,2,0", "0.5")),
                 "training.trainer.limit_val_batches 0.5: a float is Lightning's fraction"));
}

TEST_CASE("a model that cannot fit the cluster's GPUs is refused with the ways out") {
  // 175B-like shape on 8 GPUs without model parallelism.
  const Node config = composed({"cluster_type=bcm", "cluster=bcm", "training.trainer.devices=8",
                                "training.model.num_layers=96", "training.model.hidden_size=12288",
                                "training.model.num_attention_heads=96",
                                "training.model.micro_batch_size=1",
                                "training.model.global_batch_size=8"});
  const auto report = local_preflight(config);
  CHECK(report.gpu_memory_bytes == doctest::Approx(80e9));
  CHECK(mentions(report, "exceed cluster.gpu_memory_gb 80"));
  CHECK(mentions(report, "distributed_fused_adam"));
  CHECK_THROWS_WITH_AS(enforce_training_preflight(config, "local", false),
                       doctest::Contains("preflight refused the training stage"), common::Error);
}

TEST_CASE("a GPU memory that is not a finite positive number is refused, not a disabled check") {
  // NaN compares false with every estimate: the 175B-like shape below once passed with it.
  for (const std::string value : {"nan", "inf", "-80", "0"}) {
    CAPTURE(value);
    const Node config = composed({"cluster_type=bcm", "cluster=bcm", "training.trainer.devices=8",
                                  "training.model.num_layers=96", "training.model.hidden_size=12288",
                                  "training.model.num_attention_heads=96",
                                  "training.model.micro_batch_size=1",
                                  "training.model.global_batch_size=8",
                                  "cluster.gpu_memory_gb=" + value});
    const auto report = local_preflight(config);
    CHECK(mentions(report, "cluster.gpu_memory_gb " + value));
    CHECK(mentions(report, "a finite number > 0"));
  }
}

TEST_CASE("NeMo's own llama2_7b layout fits 80 GB: the fused attention keeps no s² scores") {
  // NeMo 23.08's training/llama/llama2_7b: tp 1, pp 1, micro batch 1, sequence 4096, no
  // recompute, distributed optimizer, bf16, 16 nodes of 8 GPUs. With the attention scores
  // counted (5·a·s²·b per layer, 2.7 GB × 32 layers) it came to about 151 GB per GPU.
  ComposedConfig composed = compose(
      {std::string(TEST_SOURCE_DIR) + "/conf", "config",
       {"training=llama/llama2_7b", "cluster_type=bcm", "cluster=bcm",
        "launcher_scripts_path=/opt/launcher", "training.trainer.num_nodes=16",
        "training.model.global_batch_size=2048",
        "training.model.activations_checkpoint_granularity=null"}});
  const Node config = resolve(composed.config, ResolveContext{composed.choices});
  const auto report = local_preflight(config);
  for (const auto& problem : report.problems) MESSAGE(problem);
  CHECK(report.problems.empty());
  CHECK(report.recompute == "none");
  CHECK(report.memory.total_bytes() < 80e9);
  // Activations: 32 layers of s·b·h·34 bytes (4096 · 4096 · 34 ≈ 0.57 GB), no s² term.
  CHECK(report.memory.activations_bytes < 25e9);
  CHECK(format_preflight(report).front().find("attention fused (no s² scores kept)") !=
        std::string::npos);
}

TEST_CASE("recompute and the distributed optimizer shrink the estimate") {
  const auto plain = local_preflight(composed({"training.trainer.devices=8"}));
  const auto recompute = local_preflight(composed(
      {"training.trainer.devices=8", "training.model.activations_checkpoint_granularity=full"}));
  const auto adam = local_preflight(
      composed({"training.trainer.devices=8", "training.model.optim.name=fused_adam"}));
  // gpt3/126m (bf16, s 2048, b 4, h 768, L 12, V 50304 padded to 50304): per layer
  // s·b·h·34 bytes without recompute, 2·s·b·h with full recompute plus one layer's worth, and
  // the bf16 logits (s·b·V·2; the fused classifier writes their gradient over them) either way.
  const double sbh = 2048.0 * 4 * 768;
  const double logits = 2048.0 * 4 * 50304 * 2;
  CHECK(plain.memory.activations_bytes == doctest::Approx(12 * 34 * sbh + logits));
  CHECK(recompute.memory.activations_bytes == doctest::Approx((12 * 2 + 34) * sbh + logits));
  CHECK(plain.distributed_optimizer);
  CHECK_FALSE(adam.distributed_optimizer);
  CHECK(plain.memory.optimizer_bytes == doctest::Approx(adam.memory.optimizer_bytes / 8));
}

TEST_CASE("tensor and sequence parallelism divide each GPU's activations") {
  const auto tp2 = local_preflight(
      composed({"training.trainer.devices=8", "training.model.tensor_model_parallel_size=2"}));
  const auto sp = local_preflight(
      composed({"training.trainer.devices=8", "training.model.tensor_model_parallel_size=2",
                "++training.model.sequence_parallel=true"}));
  REQUIRE(tp2.problems.empty());
  REQUIRE(sp.problems.empty());
  // Per layer s·b·h·(10 + 24/2) without sequence parallelism, s·b·h·(4 + 30/2) with it (the
  // gathered norm outputs stay whole); the vocab-parallel logits (50257 padded to a multiple of
  // 128 × 2: 50432) are halved either way.
  const double sbh = 2048.0 * 4 * 768;
  const double logits = 2048.0 * 4 * 50432 * 2 / 2;
  CHECK(tp2.memory.activations_bytes == doctest::Approx(12 * 22 * sbh + logits));
  CHECK(sp.memory.activations_bytes == doctest::Approx(12 * 19 * sbh + logits));
}

TEST_CASE("every shipped training config composes, translates and fits its cluster") {
  const std::string conf = std::string(TEST_SOURCE_DIR) + "/conf";
  const auto options = list_group_options(conf, "training");
  for (const char* expected : {"gpt3/126m", "gpt3/400m", "gpt3/1b", "gpt3/5b", "gpt3/20b",
                               "gpt3/40b", "gpt3/175b", "llama/llama2_7b", "llama/llama2_13b",
                               "llama/llama2_70b"}) {
    CHECK(std::find(options.begin(), options.end(), expected) != options.end());
  }
  for (const auto& option : options) {
    CAPTURE(option);
    ComposedConfig composed = compose({conf, "config",
                                       {"training=" + option, "cluster_type=bcm", "cluster=bcm",
                                        "launcher_scripts_path=/opt/launcher"}});
    const Node config = resolve(composed.config, ResolveContext{composed.choices});
    const auto report = local_preflight(config);
    for (const auto& problem : report.problems) MESSAGE(problem);
    CHECK(report.problems.empty());
    CHECK(report.memory.total_bytes() < 80e9);
    CHECK_NOTHROW(megatron_training_arguments(config));
  }
}

TEST_CASE("the Llama configs carry the Llama switches to Megatron's flags") {
  ComposedConfig composed = compose({std::string(TEST_SOURCE_DIR) + "/conf", "config",
                                     {"training=llama/llama2_70b", "launcher_scripts_path=/opt/l"}});
  const Node config = resolve(composed.config, ResolveContext{composed.choices});
  const auto arguments = megatron_training_arguments(config);
  auto has_pair = [&](const std::string& flag, const std::string& value) {
    for (size_t i = 0; i + 1 < arguments.size(); ++i) {
      if (arguments[i] == flag && arguments[i + 1] == value) return true;
    }
    return false;
  };
  CHECK(has_pair("--position-embedding-type", "rope"));
  CHECK(has_pair("--normalization", "RMSNorm"));
  CHECK(has_pair("--num-query-groups", "8"));
  CHECK(has_pair("--ffn-hidden-size", "28672"));
  for (const char* flag : {"--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                           "--group-query-attention"}) {
    CAPTURE(flag);
    CHECK(std::find(arguments.begin(), arguments.end(), flag) != arguments.end());
  }
  const auto report = local_preflight(config);
  CHECK(report.parameters > 65'000'000'000);
  CHECK(report.parameters < 72'000'000'000);
}

TEST_CASE("a mapped value the backend would refuse is a preflight problem, before any arithmetic") {
  // make_vocab_size_divisible_by=0 once divided by zero here (SIGFPE) before anything was said.
  const auto report = local_preflight(composed({"training.model.make_vocab_size_divisible_by=0"}));
  CHECK(mentions(report, "training.model.make_vocab_size_divisible_by: '0' is out of range; "
                         "training.model.make_vocab_size_divisible_by "
                         "(--make-vocab-size-divisible-by) takes an integer ≥ 1"));
  const auto several = local_preflight(
      composed({"training.model.optim.lr=abc", "training.model.global_batch_size=-4"}));
  CHECK(mentions(several, "training.model.optim.lr: 'abc' is not a number"));
  CHECK(mentions(several, "training.model.global_batch_size: '-4' is out of range"));
  CHECK_THROWS_WITH_AS(
      enforce_training_preflight(composed({"training.model.hidden_dropout=2"}), "local", false),
      doctest::Contains("training.model.hidden_dropout: '2' is out of range"), common::Error);
}

TEST_CASE("an optimizer name pretrain_gpt does not train is refused before the estimate") {
  // Not counted as "distributed optimizer no": the estimate is never made from it.
  const auto report = local_preflight(composed({"training.model.optim.name=sgd"}));
  CHECK(mentions(report, "training.model.optim.name: 'sgd' is not an optimizer pretrain_gpt "
                         "trains (valid: fused_adam, adam, adamw, distributed_fused_adam)"));
  CHECK(report.parameters == 0);
  CHECK_THROWS_WITH_AS(
      enforce_training_preflight(composed({"training.model.optim.name=sgd"}), "local", false),
      doctest::Contains("training.model.optim.name: 'sgd'"), common::Error);
}

TEST_CASE("layout products that overflow are problems, not wrapped numbers") {
  const auto report = local_preflight(
      composed({"training.trainer.num_nodes=4611686018427387904", "training.trainer.devices=4"}));
  CHECK(mentions(report, "exceeds 9223372036854775807"));
}

TEST_CASE("the estimate counts the vocabulary of the tokenizer's file when the launcher can read it") {
  const std::string model = std::string(TEST_SOURCE_DIR) + "/tests/data/sentencepiece_bpe.model";
  // Llama 2's config carries vocab_size 32000, which is one tokenizer's; this model has 500.
  const std::vector<std::string> sentencepiece = {"training.model.tokenizer.library=sentencepiece",
                                                  "training.model.tokenizer.type=null",
                                                  "++training.model.tokenizer.vocab_size=32000"};
  auto with_file = sentencepiece;
  with_file.push_back("training.model.tokenizer.model=" + model);
  const auto report = local_preflight(composed(with_file));
  CHECK(report.problems.empty());
  CHECK(report.vocabulary == 500);
  CHECK(report.padded_vocabulary == 512);  // make_vocab_size_divisible_by 128 × tp 1
  CHECK(report.vocabulary_source == "GPTSentencePieceTokenizer's, " + model);
  CHECK(format_preflight(report).front().find("vocabulary 500 (GPTSentencePieceTokenizer's, " +
                                              model + "), padded to 512") != std::string::npos);
  // The same model as the config's 500 would count it.
  auto as_config = sentencepiece;
  as_config.back() = "++training.model.tokenizer.vocab_size=500";
  CHECK(report.parameters == local_preflight(composed(as_config)).parameters);

  // A file only the cluster has: the config's number, named as such.
  auto elsewhere = sentencepiece;
  elsewhere.push_back("training.model.tokenizer.model=/cluster/only/tokenizer.model");
  const auto fallback = local_preflight(composed(elsewhere));
  CHECK(fallback.vocabulary == 32000);
  CHECK(fallback.vocabulary_source == "training.model.tokenizer.vocab_size");

  // A file that is there but no tokenizer: the job would fail on it, so the preflight says so.
  const auto broken = local_preflight(composed(
      {"training.model.tokenizer.library=sentencepiece", "training.model.tokenizer.type=null",
       "training.model.tokenizer.model=" + std::string(TEST_SOURCE_DIR) + "/README.md"}));
  CHECK(mentions(broken, "training.model.tokenizer.model " + std::string(TEST_SOURCE_DIR) +
                             "/README.md: the job's GPTSentencePieceTokenizer cannot read it: "));
}

TEST_CASE("bf16 with tensor and pipeline parallelism runs on every cluster, and the line says so") {
  // NeMo's gpt3/126m on two nodes at TP=2 (its benchmark's shape), on Slurm's GPUs; and at PP=2.
  const Node tp2 =
      composed({"cluster=bcm", "training.trainer.num_nodes=2", "training.trainer.devices=8",
                "training.model.tensor_model_parallel_size=2"});
  const Node pp2 =
      composed({"cluster=bcm", "training.trainer.num_nodes=2", "training.trainer.devices=8",
                "training.model.pipeline_model_parallel_size=2"});
  for (const Node* config : {&tp2, &pp2}) {
    for (const char* cluster : {"bcm", "pbs", "k8s", "local"}) {
      CAPTURE(cluster);
      const auto report = training_preflight(*config, cluster);
      CHECK(report.precision == "bf16");
      CHECK(report.problems.empty());
      CHECK(report.unsupported.empty());
      CHECK(std::none_of(report.warnings.begin(), report.warnings.end(),
                         [](const std::string& warning) {
                           return warning.find("precision") != std::string::npos;
                         }));
    }
  }
  CHECK(format_preflight(training_preflight(tp2, "bcm"))
            .front()
            .find("16 GPU(s) (2 node(s) × 8) = tp 2 × pp 1 × dp 8") != std::string::npos);
}

TEST_CASE("on Slurm, more tasks per node than GPUs is unsupported, fewer leaves GPUs idle") {
  const auto crowded = training_preflight(
      composed({"cluster=bcm", "cluster.gpus_per_node=4", "training.trainer.devices=8"}), "bcm");
  REQUIRE(crowded.unsupported.size() == 1);
  CHECK(crowded.unsupported[0] ==
        "training.trainer.devices 8 tasks per node, but cluster.gpus_per_node 4: ranks would "
        "share GPUs, which NCCL refuses; set training.trainer.devices=4 (one task per GPU)");
  const auto idle =
      training_preflight(composed({"cluster=bcm", "training.trainer.devices=2"}), "bcm");
  CHECK(idle.unsupported.empty());
  CHECK(std::find(idle.warnings.begin(), idle.warnings.end(),
                  "training.trainer.devices 2 tasks per node with cluster.gpus_per_node 8: 6 "
                  "GPU(s) of each node stay idle (one task per GPU uses them all: "
                  "training.trainer.devices=8)") != idle.warnings.end());
}
