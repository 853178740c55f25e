// Megatron-LM's legacy checkpoints read here: write_megatron_checkpoints.py saves, with PyTorch
// itself, Megatron's structures for known whole weights (a GPT in core's names at TP=2 x PP=2,
// a Llama-like model in the legacy model's nested dicts at TP=2 x PP=2 and in Transformer
// Engine's names at TP=1), with the optimizer state each of Megatron's optimizers keeps, and
// says what the whole model holds (expected.json, expected_moments.json). Read whole here, and
// resharded into this backend's format at TP=1 x PP=1 and TP=2 x PP=1, every tensor must be
// the expected one exactly (the fp32 main weights where the optimizer has them, and AdamW's
// moments); the iteration, the consumed samples, the step and the schedule come along. Files
// Megatron would not write, or that hold a model this backend does not build, are refused by
// name.
//
// It needs torch in Debian's /usr/bin/python3 (python3-torch, container/install-deps.sh
// --tests). Without it the test is skipped with a message, except under CI, where that fails.
#include "backend/ckpt/megatron_checkpoint.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/ckpt/checkpoint_reshard.hpp"
#include "backend/common/error.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "tests/backend/ckpt/expected_weights.hpp"
#include "tests/backend/ckpt/python_fixtures.hpp"
#include "tests/reference_tools.hpp"
#include "tests/temporary_directory.hpp"
#include "tests/test_files.hpp"

namespace {

namespace fs = std::filesystem;

// The checkpoints write_megatron_checkpoints.py writes, made once for every test case here.
const fs::path* megatron_checkpoints() {
  return test_support::python_fixtures("write_megatron_checkpoints.py", "torch, numpy",
                                       "python3-torch python3-numpy");
}

backend::GptModel<float> load_whole(const fs::path& directory) {
  std::ostringstream out;
  return backend::load_whole_checkpoint_weights(directory, out);
}

}  // namespace

TEST_CASE(
    "megatron checkpoint: names of core, Transformer Engine and the legacy model map to ours") {
  using backend::megatron_tensor_name;
  CHECK(megatron_tensor_name("embedding.word_embeddings.weight", 2, "f") ==
        "embedding.word_embeddings.weight");
  CHECK(megatron_tensor_name("decoder.layers.1.mlp.linear_fc1.weight", 2, "f") ==
        "decoder.layers.3.mlp.linear_fc1.weight");
  CHECK(megatron_tensor_name("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", 4,
                             "f") == "decoder.layers.4.input_layernorm.weight");
  CHECK(megatron_tensor_name("decoder.layers.0.mlp.linear_fc1.layer_norm_bias", 0, "f") ==
        "decoder.layers.0.pre_mlp_layernorm.bias");
  CHECK(megatron_tensor_name("decoder.layers.0.self_attention.linear_qkv._extra_state", 0, "f") ==
        std::nullopt);
  CHECK(megatron_tensor_name("language_model.encoder.layers.1.post_attention_norm.bias", 2, "f") ==
        "decoder.layers.3.pre_mlp_layernorm.bias");
  CHECK(megatron_tensor_name("language_model.encoder.layers.0.post_attention_layernorm.weight", 0,
                             "f") == "decoder.layers.0.pre_mlp_layernorm.weight");
  CHECK(megatron_tensor_name("language_model.transformer.layers.0.attention.query_key_value.bias",
                             0, "f") == "decoder.layers.0.self_attention.linear_qkv.bias");
  CHECK(megatron_tensor_name("language_model.encoder.final_norm.weight", 0, "f") ==
        "decoder.final_layernorm.weight");
  CHECK(megatron_tensor_name("language_model.embedding.position_embeddings.weight", 0, "f") ==
        "embedding.position_embeddings.weight");
  CHECK(megatron_tensor_name("word_embeddings_for_head.weight", 0, "f") == "output_layer.weight");
  const std::string unknown = test_support::refusal_of(
      [] { megatron_tensor_name("language_model.encoder.layers.0.mlp.router.weight", 0, "f.pt"); });
  CHECK(unknown.find("f.pt") != std::string::npos);
  CHECK(unknown.find("'language_model.encoder.layers.0.mlp.router.weight'") != std::string::npos);
  CHECK_FALSE(test_support::refusal_of([] {
                megatron_tensor_name("pooler.dense.weight", 0, "f");
              }).empty());
  CHECK_FALSE(test_support::refusal_of([] {
                megatron_tensor_name("decoder.layers.x.foo", 0, "f");
              }).empty());
}

TEST_CASE("megatron checkpoint: the layout, the args and the model they describe") {
  const fs::path* root = megatron_checkpoints();
  if (root == nullptr) return;
  const backend::MegatronCheckpointLayout layout =
      backend::read_megatron_layout(*root / "gpt_core");
  CHECK(layout.tensor_parallel == 2);
  CHECK(layout.pipeline_parallel == 2);
  CHECK(layout.iteration == 20);
  CHECK_FALSE(layout.release);
  CHECK(layout.rank_file(1, 1) ==
        *root / "gpt_core" / "iter_0000020" / "mp_rank_01_001" / "model_optim_rng.pt");
  CHECK(backend::is_megatron_checkpoint(*root / "gpt_core"));

  const backend::MegatronShards llama = backend::open_megatron_shards(*root / "llama_legacy");
  const backend::CheckpointModelRecord& record = llama.record;
  CHECK(record.model.num_layers == 4);
  CHECK(record.model.hidden_size == 16);
  CHECK(record.model.ffn_hidden_size == 24);
  CHECK(record.model.normalization == backend::Normalization::rms_norm);
  CHECK(record.model.position_embedding_type == backend::PositionEmbeddingType::rope);
  CHECK(record.model.swiglu);
  CHECK_FALSE(record.model.add_bias_linear);
  CHECK(record.model.untie_embeddings_and_output_weights);
  CHECK(record.model.group_query_attention);
  CHECK(record.model.num_query_groups == 2);
  CHECK(record.tokenizer.tokenizer_type == "NullTokenizer");
  CHECK(record.tokenizer.vocab_size == 40);
  CHECK(record.parallelism.tensor_model_parallel_size == 2);
  CHECK(record.parallelism.pipeline_model_parallel_size == 2);
  CHECK(llama.padded_vocab_size == 64);
  REQUIRE(llama.files.size() == 4);
  // Stage 1, rank 1: the second half of the layers, numbered globally; the untied head.
  const backend::ShardFile& last = *llama.files[3];
  CHECK(last.metadata()["iteration"] == 20);
  CHECK(last.metadata()["consumed_train_samples"] == 160);
  CHECK(last.metadata()["tensor_parallel"]["rank"] == 1);
  CHECK(last.metadata()["pipeline_parallel"]["rank"] == 1);
  const std::vector<int64_t>* qkv = last.shape("decoder.layers.2.self_attention.linear_qkv.weight");
  REQUIRE(qkv != nullptr);
  CHECK(*qkv == std::vector<int64_t>{16, 16});  // (4 + 2·2) heads of 4 rows, halved
  CHECK(last.shape("output_layer.weight") != nullptr);
  CHECK(last.shape("decoder.layers.0.input_layernorm.weight") == nullptr);
}

TEST_CASE("megatron checkpoint: the weights, read whole, are the ones PyTorch saved") {
  const fs::path* root = megatron_checkpoints();
  if (root == nullptr) return;
  for (const char* name :
       {"gpt_core", "llama_legacy", "llama_te", "gpt_distributed", "llama_distributed"}) {
    CAPTURE(name);
    test_support::check_expected_weights(load_whole(*root / name), *root / name / "expected.json");
  }
}

TEST_CASE("megatron checkpoint: resharded into this backend's format at TP=1 and at TP=2 x PP=1") {
  const fs::path* root = megatron_checkpoints();
  if (root == nullptr) return;
  test_support::TemporaryDirectory out;
  for (const char* name : {"gpt_core", "llama_legacy"}) {
    for (const int64_t tensor_parallel : {1, 2}) {
      CAPTURE(name);
      CAPTURE(tensor_parallel);
      const fs::path save = out.path / (std::string(name) + std::to_string(tensor_parallel));
      std::ostringstream progress;
      const backend::ReshardResult result =
          backend::reshard_checkpoint({.load = *root / name,
                                       .save = save,
                                       .target_tensor_parallel = tensor_parallel,
                                       .target_pipeline_parallel = 1,
                                       .command_line = {"checkpoint_util", "test"}},
                                      progress);
      CHECK(result.iteration == 20);
      CHECK(result.source_tensor_parallel == 2);
      CHECK(result.source_pipeline_parallel == 2);
      CHECK(result.optimizer_state);
      CHECK_FALSE(result.rng_state);
      test_support::check_expected_weights(load_whole(save), *root / name / "expected.json");
      const backend::CheckpointFileReader file(backend::checkpoint_file_path(save, 20));
      CHECK(file.metadata()["iteration"] == 20);
      CHECK(file.metadata()["consumed_train_samples"] == 160);
      CHECK(file.metadata()["consumed_valid_samples"] == 32);
      CHECK(file.metadata()["arguments"]["tensor_model_parallel_size"] == tensor_parallel);
    }
  }
}

TEST_CASE(
    "megatron checkpoint: Adam's moments, the step and the schedule come along from each of "
    "Megatron's optimizers") {
  const fs::path* root = megatron_checkpoints();
  if (root == nullptr) return;
  test_support::TemporaryDirectory out;
  // FP32Optimizer's, Float16OptimizerWithFloat16Params' (fp32 main weights), the same with
  // apex's group step and groups told apart by weight_decay (no wd_mult), and the distributed
  // optimizer's distrib_optim.pt (at TP=2 x PP=2 with several buckets on the first stage and
  // the tied embedding's copies in buckets of their own; bf16 at TP=1).
  for (const char* name :
       {"gpt_core", "llama_legacy", "llama_te", "gpt_distributed", "llama_distributed"}) {
    CAPTURE(name);
    const fs::path save = out.path / name;
    std::ostringstream progress;
    const backend::ReshardResult result =
        backend::reshard_checkpoint({.load = *root / name, .save = save}, progress);
    CHECK(result.optimizer_state);
    CHECK(result.optimizer_not_read.empty());
    CHECK(progress.str().find("(parameters and optimizer state)") != std::string::npos);
    test_support::check_expected_weights(load_whole(save), *root / name / "expected.json");
    const backend::CheckpointFileReader file(backend::checkpoint_file_path(save, 20));
    const nlohmann::json& optimizer = file.metadata()["optimizer"];
    CHECK(optimizer["step"] == 20);
    CHECK(optimizer["adam_beta1"] == 0.9);
    CHECK(optimizer["adam_beta2"] == 0.95);
    CHECK(optimizer["weight_decay"] == 0.1);
    CHECK_FALSE(optimizer.contains("grad_scaler"));  // bf16 and fp32 runs have none
    const nlohmann::json& schedule = file.metadata()["opt_param_scheduler"];
    CHECK(schedule["num_steps"] == 160);
    CHECK(schedule["max_lr"] == 3e-4);
    CHECK(schedule["min_lr"] == 3e-5);
    CHECK(schedule["warmup_steps"] == 40.0);
    CHECK(schedule["decay_steps"] == 800);
    CHECK(schedule["decay_style"] == "cosine");
    CHECK(schedule["start_weight_decay"] == 0.1);
    CHECK(schedule["weight_decay_increment_steps"] == 800);
    CHECK(schedule["wsd_decay_steps"] == -1);
    CHECK(file.metadata()["no_save_optim"] == false);
    // Every moment of the whole model, value for value.
    const nlohmann::json expected =
        nlohmann::json::parse(std::ifstream(*root / name / "expected_moments.json"));
    size_t checked = 0;
    for (const auto& item : expected.items()) {
      const std::string moment = item.key();
      const nlohmann::json& want = item.value();
      CAPTURE(moment);
      const backend::TensorEntry* entry = file.find(moment);
      REQUIRE(entry != nullptr);
      CHECK(entry->shape == want["shape"].get<std::vector<int64_t>>());
      std::vector<float> values(static_cast<size_t>(entry->numel()));
      file.read(*entry, values);
      CHECK(values == want["values"].get<std::vector<float>>());
      ++checked;
    }
    CHECK(checked > 0);
  }
  // Saved with --no-save-optim: the 16-bit weights, and the reason said.
  std::ostringstream progress;
  const backend::ReshardResult weights = backend::reshard_checkpoint(
      {.load = *root / "llama_weights", .save = out.path / "weights"}, progress);
  CHECK_FALSE(weights.optimizer_state);
  CHECK(weights.optimizer_not_read.find("--no-save-optim") != std::string::npos);
  CHECK(progress.str().find("no optimizer state: it was saved without") != std::string::npos);
  test_support::check_expected_weights(load_whole(out.path / "weights"), *root / "llama_weights" / "expected.json");
}

TEST_CASE(
    "megatron checkpoint: what Megatron would not write, or this backend cannot build, is "
    "refused") {
  const fs::path* root = megatron_checkpoints();
  if (root == nullptr) return;
  auto refusal = [](const fs::path& directory) {
    return test_support::refusal_of([&] { load_whole(directory); });
  };
  const std::string version = refusal(*root / "bad_version");
  CHECK(version.find("checkpoint_version 1") != std::string::npos);
  CHECK(version.find("bad_version") != std::string::npos);
  CHECK(refusal(*root / "bad_moe").find("num_experts") != std::string::npos);
  const std::string name = refusal(*root / "bad_name");
  CHECK(name.find("'language_model.encoder.layers.0.self_attention.rotary.inv_freq'") !=
        std::string::npos);
  // Param groups split otherwise than by weight decay (the embedding in a group of its own).
  const std::string groups = refusal(*root / "bad_groups");
  CHECK(groups.find("bad_groups") != std::string::npos);
  CHECK(groups.find("param group 0 with weight decay holding 1 parameters") != std::string::npos);
  // An exp_avg of another shape than its parameter's.
  const std::string moment = refusal(*root / "bad_moment");
  CHECK(moment.find("exp_avg of parameter 'decoder.layers.0.self_attention.linear_qkv.weight' "
                    "with 768 elements in the shape [768]") != std::string::npos);
  // A distrib_optim.pt of a buffer one element short.
  const std::string buffer = refusal(*root / "bad_distributed");
  CHECK(buffer.find("bad_distributed/iter_0000020/mp_rank_00/distrib_optim.pt: model chunk 0's "
                    "grad buffer holds") != std::string::npos);
  CHECK(buffer.find("--ddp-bucket-size") != std::string::npos);

  test_support::TemporaryDirectory scratch;
  const fs::path copy = scratch.path / "gpt_core";
  fs::copy(*root / "gpt_core", copy, fs::copy_options::recursive);
  const fs::path iteration = copy / "iter_0000020";
  // A rank's file gone.
  fs::rename(iteration / "mp_rank_01_001" / "model_optim_rng.pt", scratch.path / "moved.pt");
  const std::string missing = refusal(copy);
  CHECK(missing.find("mp_rank_01_001/model_optim_rng.pt is missing") != std::string::npos);
  CHECK(missing.find("2 tensor-parallel rank(s) × 2 pipeline stage(s)") != std::string::npos);
  fs::rename(scratch.path / "moved.pt", iteration / "mp_rank_01_001" / "model_optim_rng.pt");
  // Both namings in one iteration.
  fs::create_directory(iteration / "mp_rank_00");
  CHECK(refusal(copy).find("both of Megatron's namings") != std::string::npos);
  fs::remove(iteration / "mp_rank_00");
  // An expert-parallel rank's directory.
  fs::create_directory(iteration / "mp_rank_00_000_001");
  CHECK(refusal(copy).find("expert-parallel") != std::string::npos);
  fs::remove(iteration / "mp_rank_00_000_001");
  // A tracker naming another iteration.
  std::ofstream(copy / "latest_checkpointed_iteration.txt") << "30";
  CHECK(refusal(copy).find("iter_0000030") != std::string::npos);
  // A tracker that is not one.
  std::ofstream(copy / "latest_checkpointed_iteration.txt") << "twenty";
  CHECK(refusal(copy).find("'twenty'") != std::string::npos);

  // The distributed optimizer's file: missing, and in the per-bucket format of before 2024.
  const fs::path distributed = scratch.path / "gpt_distributed";
  fs::copy(*root / "gpt_distributed", distributed, fs::copy_options::recursive);
  const fs::path state = distributed / "iter_0000020" / "mp_rank_01_001" / "distrib_optim.pt";
  fs::rename(state, scratch.path / "moved.pt");
  const std::string no_state = refusal(distributed);
  CHECK(no_state.find("mp_rank_01_001/model_optim_rng.pt: its optimizer state is the "
                      "distributed optimizer's, whose parameters and moments are in") !=
        std::string::npos);
  CHECK(no_state.find("mp_rank_01_001/distrib_optim.pt, which is missing") != std::string::npos);
  fs::copy_file(*root / "gpt_core" / "iter_0000020" / "mp_rank_01_001" / "model_optim_rng.pt",
                state);
  CHECK(refusal(distributed)
            .find("distrib_optim.pt: it is in the distributed optimizer's format "
                  "of before February 2024") != std::string::npos);
}

namespace {

// A one-process model, AdamW and scheduler for the checkpoint `directory` holds.
struct LoadTarget {
  explicit LoadTarget(const backend::MegatronShards& shards)
      : model(backend::model_config(shards.record)),
        optimizer(backend::AdamWConfig{}, {}, static_cast<int64_t>(model.parameters().size())),
        scheduler(backend::LearningRateSchedule{.decay_steps = 100}) {}

  backend::GptModel<float> model;
  backend::AdamW optimizer;
  backend::LearningRateScheduler scheduler;
};

}  // namespace

TEST_CASE("megatron checkpoint: pretrain_gpt's load reads one at its own layout directly") {
  const fs::path* root = megatron_checkpoints();
  if (root == nullptr) return;
  // TP=1 x PP=1, bf16 with fp32 main weights: Float16Optimizer's and the distributed one's.
  for (const char* name : {"llama_te", "llama_distributed"}) {
    CAPTURE(name);
    const fs::path directory = *root / name;
    LoadTarget target(backend::open_megatron_shards(directory));
    std::ostringstream out;
    const backend::CheckpointLoadOptions options{
        .directory = directory, .no_load_rng = true, .use_checkpoint_opt_param_scheduler = true};
    const auto progress =
        backend::load_checkpoint(options, target.model, target.optimizer, target.scheduler, out);
    INFO(out.str());
    REQUIRE(progress.has_value());
    CHECK(progress->iteration == 20);
    CHECK(progress->consumed_train_samples == 160);
    CHECK(progress->consumed_valid_samples == 32);
    CHECK(out.str().find("successfully loaded checkpoint from " + directory.string()) !=
          std::string::npos);
    test_support::check_expected_weights(target.model, directory / "expected.json");
    CHECK(target.optimizer.steps_taken() == 20);
    CHECK(target.scheduler.num_steps() == 160);
    CHECK(target.scheduler.schedule().max_lr == 3e-4);
    CHECK(target.scheduler.schedule().warmup_steps == 40);
    // The moments, by parameter.
    const auto numel = static_cast<size_t>(target.model.parameter_buffer().numel);
    std::vector<float> exp_avg(numel), exp_avg_sq(numel);
    target.optimizer.copy_moments_to_host(exp_avg, exp_avg_sq);
    const nlohmann::json expected =
        nlohmann::json::parse(std::ifstream(directory / "expected_moments.json"));
    for (const auto& tensor : target.model.tensors()) {
      CAPTURE(tensor.name);
      const auto first = exp_avg.begin() + tensor.offset;
      CHECK(std::vector<float>(first, first + tensor.numel) ==
            expected["optimizer.exp_avg." + tensor.name]["values"].get<std::vector<float>>());
      const auto first_sq = exp_avg_sq.begin() + tensor.offset;
      CHECK(std::vector<float>(first_sq, first_sq + tensor.numel) ==
            expected["optimizer.exp_avg_sq." + tensor.name]["values"].get<std::vector<float>>());
    }
  }

  const fs::path directory = *root / "llama_te";
  std::ostringstream out;
  // Megatron's RNG state does not map: without --no-load-rng the load says so.
  LoadTarget again(backend::open_megatron_shards(directory));
  const std::string rng = test_support::refusal_of([&] {
    backend::load_checkpoint({.directory = directory, .use_checkpoint_opt_param_scheduler = true},
                             again.model, again.optimizer, again.scheduler, out);
  });
  CHECK(rng.find("Megatron's RNG states (Python's, NumPy's, torch's and the CUDA tracker's "
                 "generators) do not map") != std::string::npos);
  CHECK(rng.find("Specify --no-load-rng") != std::string::npos);
  // Saved without optimizer state: the load says why, and what to pass; with --no-load-optim,
  // the model's bf16 weights.
  const fs::path saved_without = *root / "llama_weights";
  LoadTarget weights(backend::open_megatron_shards(saved_without));
  const std::string optimizer = test_support::refusal_of([&] {
    backend::load_checkpoint({.directory = saved_without, .no_load_rng = true}, weights.model,
                             weights.optimizer, weights.scheduler, out);
  });
  CHECK(optimizer.find("Unable to load optimizer from checkpoint") != std::string::npos);
  CHECK(optimizer.find("it was saved without optimizer state (--no-save-optim). Specify "
                       "--no-load-optim") != std::string::npos);
  backend::load_checkpoint({.directory = saved_without, .no_load_optim = true, .no_load_rng = true},
                           weights.model, weights.optimizer, weights.scheduler, out);
  test_support::check_expected_weights(weights.model, saved_without / "expected.json");
}

TEST_CASE("megatron checkpoint: --load at another layout says how to reshard it") {
  const fs::path* root = megatron_checkpoints();
  if (root == nullptr) return;
  LoadTarget target(backend::open_megatron_shards(*root / "gpt_core"));  // TP=2 x PP=2
  std::ostringstream out;
  const std::string refusal = test_support::refusal_of([&] {
    backend::load_checkpoint({.directory = *root / "gpt_core"}, target.model, target.optimizer,
                             target.scheduler, out);
  });
  CHECK(refusal.find("was saved with --tensor-model-parallel-size 2") != std::string::npos);
  CHECK(refusal.find("checkpoint_util --load " + (*root / "gpt_core").string() +
                     " --save NEWDIR --target-tensor-parallel-size 1 "
                     "--target-pipeline-parallel-size 1") != std::string::npos);
}
