// Megatron core's torch_dist checkpoints read here: write_torch_dist_checkpoints.py saves, with
// PyTorch's own distributed-checkpoint writer over tp × pp gloo ranks, Megatron core's sharded
// state (the layers stacked on a first axis, each rank's tensor-parallel shards as chunks,
// SwiGLU's two halves, the optimizer's optimizer.state.* tensors) of the same whole weights and
// moments as write_megatron_checkpoints.py, with common.pt and metadata.json beside it: a GPT at
// TP=2 x PP=2 with fp32 Adam, a bf16 Llama at TP=2 with fp32 main weights, a GPT saved without
// optimizer state. Read whole, resharded, or loaded by pretrain_gpt's load at a layout other than
// the saved one, every tensor must be the expected one exactly, with the step and the schedule.
// Damaged or foreign directories are refused by name.
//
// It needs torch in Debian's /usr/bin/python3 (python3-torch, container/install-deps.sh
// --tests). Without it the test is skipped with a message, except under CI, where that fails.
#include "backend/ckpt/megatron_dist_checkpoint.hpp"

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
#include "backend/ckpt/checkpoint_record.hpp"
#include "backend/ckpt/checkpoint_reshard.hpp"
#include "backend/ckpt/megatron_checkpoint.hpp"
#include "backend/ckpt/torch_distributed_checkpoint.hpp"
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

// The checkpoints write_torch_dist_checkpoints.py writes, made once for every test case here.
const fs::path* dist_checkpoints() {
  return test_support::python_fixtures("write_torch_dist_checkpoints.py", "torch, numpy",
                                       "python3-torch python3-numpy");
}

backend::GptModel<float> load_whole_dist(const fs::path& directory) {
  std::ostringstream out;
  return backend::load_whole_checkpoint_weights(directory, out);
}

// Every moment the expected_moments.json of `directory` lists, against `read(name)`.
void check_expected_moments(const fs::path& directory,
                            const std::function<std::vector<float>(const std::string&)>& read) {
  const nlohmann::json expected =
      nlohmann::json::parse(std::ifstream(directory / "expected_moments.json"));
  for (const auto& item : expected.items()) {
    CAPTURE(item.key());
    CHECK(read(item.key()) == item.value()["values"].get<std::vector<float>>());
  }
  CHECK(expected.size() > 0);
}

}  // namespace

TEST_CASE("torch_dist checkpoint: the layout from common.pt, the DCP metadata PyTorch wrote") {
  const fs::path* root = dist_checkpoints();
  if (root == nullptr) return;
  const fs::path directory = *root / "gpt_dist";
  CHECK(backend::is_megatron_checkpoint(directory));
  const backend::MegatronCheckpointLayout layout = backend::read_megatron_layout(directory);
  CHECK(layout.distributed);
  CHECK(layout.tensor_parallel == 2);
  CHECK(layout.pipeline_parallel == 2);
  CHECK(layout.iteration == 20);
  CHECK(layout.rank_file(1, 1) == directory / "iter_0000020" / "common.pt");

  const backend::DistributedCheckpoint checkpoint(directory / "iter_0000020");
  // The layers stacked: [layers, rows, columns], one chunk per layer and tensor-parallel rank.
  const backend::DistributedCheckpointTensor* qkv =
      checkpoint.tensor("decoder.layers.self_attention.linear_qkv.weight");
  REQUIRE(qkv != nullptr);
  CHECK(qkv->size == std::vector<int64_t>{4, 48, 16});
  CHECK(qkv->chunks.size() == 8);
  CHECK(qkv->dtype == backend::TorchDtype::float32);
  CHECK(checkpoint.tensor("optimizer.state.exp_avg_sq.decoder.final_layernorm.weight") != nullptr);
  // With tied embeddings the output layer is not stored; the RNG states are objects.
  CHECK(checkpoint.tensor("output_layer.weight") == nullptr);
  CHECK(checkpoint.object_keys() ==
        std::vector<std::string>{"rng_state/shard_0.0_2.2", "rng_state/shard_0.1_2.2",
                                 "rng_state/shard_1.0_2.2", "rng_state/shard_1.1_2.2"});
  CHECK_FALSE(checkpoint.object("rng_state/shard_1.1_2.2").empty());
  // A box across the tensor-parallel chunks of two layers: rows 20..27 of layers 1 and 2.
  const std::vector<int64_t> start{1, 20, 3}, count{2, 8, 5};
  const std::vector<float> box =
      checkpoint.read("decoder.layers.self_attention.linear_qkv.weight", start, count);
  const nlohmann::json expected = nlohmann::json::parse(std::ifstream(directory / "expected.json"));
  for (int64_t layer = 0; layer < 2; ++layer) {
    const auto values = expected[fmt::format("decoder.layers.{}.self_attention.linear_qkv.weight",
                                             1 + layer)]["values"]
                            .get<std::vector<float>>();
    for (int64_t row = 0; row < 8; ++row) {
      for (int64_t column = 0; column < 5; ++column) {
        CHECK(box[static_cast<size_t>((layer * 8 + row) * 5 + column)] ==
              values[static_cast<size_t>((20 + row) * 16 + 3 + column)]);
      }
    }
  }
}

TEST_CASE("torch_dist checkpoint: the weights, read whole, are the ones PyTorch saved") {
  const fs::path* root = dist_checkpoints();
  if (root == nullptr) return;
  for (const char* name : {"gpt_dist", "llama_dist", "gpt_dist_weights"}) {
    CAPTURE(name);
    test_support::check_expected_weights(load_whole_dist(*root / name),
                                         *root / name / "expected.json");
  }
}

TEST_CASE(
    "torch_dist checkpoint: resharded into this backend's format with the moments, the step and "
    "the schedule") {
  const fs::path* root = dist_checkpoints();
  if (root == nullptr) return;
  test_support::TemporaryDirectory out;
  for (const char* name : {"gpt_dist", "llama_dist"}) {
    for (const int64_t tensor_parallel : {1, 2}) {
      CAPTURE(name);
      CAPTURE(tensor_parallel);
      const fs::path save = out.path / (std::string(name) + std::to_string(tensor_parallel));
      std::ostringstream progress;
      const backend::ReshardResult result = backend::reshard_checkpoint(
          {.load = *root / name, .save = save, .target_tensor_parallel = tensor_parallel},
          progress);
      CHECK(result.iteration == 20);
      CHECK(result.optimizer_state);
      CHECK_FALSE(result.rng_state);
      test_support::check_expected_weights(load_whole_dist(save), *root / name / "expected.json");
      if (tensor_parallel != 1) continue;
      const backend::CheckpointFileReader file(backend::checkpoint_file_path(save, 20));
      CHECK(file.metadata()["consumed_train_samples"] == 160);
      const nlohmann::json& optimizer = file.metadata()["optimizer"];
      CHECK(optimizer["step"] == 20);  // the common_step, or the iteration without one
      CHECK(optimizer["adam_beta2"] == 0.95);
      const nlohmann::json& schedule = file.metadata()["opt_param_scheduler"];
      CHECK(schedule["num_steps"] == 160);
      CHECK(schedule["decay_style"] == "cosine");
      check_expected_moments(*root / name, [&](const std::string& moment) {
        const backend::TensorEntry* entry = file.find(moment);
        REQUIRE(entry != nullptr);
        std::vector<float> values(static_cast<size_t>(entry->numel()));
        file.read(*entry, values);
        return values;
      });
    }
  }
  // Saved without optimizer state: the weights, and why.
  std::ostringstream progress;
  const backend::ReshardResult weights = backend::reshard_checkpoint(
      {.load = *root / "gpt_dist_weights", .save = out.path / "weights"}, progress);
  CHECK_FALSE(weights.optimizer_state);
  CHECK(weights.optimizer_not_read.find("--no-save-optim") != std::string::npos);
}

TEST_CASE("torch_dist checkpoint: pretrain_gpt's load reads it at a layout other than the saved") {
  const fs::path* root = dist_checkpoints();
  if (root == nullptr) return;
  // Saved at TP=2 x PP=2 (fp32) and at TP=2 (bf16 with main weights), loaded by one process.
  for (const char* name : {"gpt_dist", "llama_dist"}) {
    CAPTURE(name);
    const fs::path directory = *root / name;
    const backend::MegatronShards shards = backend::open_megatron_shards(directory);
    backend::GptModel<float> model(backend::model_config(shards.record));
    backend::AdamW optimizer(backend::AdamWConfig{}, {},
                             static_cast<int64_t>(model.parameters().size()));
    backend::LearningRateScheduler scheduler(backend::LearningRateSchedule{.decay_steps = 100});
    std::ostringstream out;
    const auto progress = backend::load_checkpoint(
        {.directory = directory, .no_load_rng = true, .use_checkpoint_opt_param_scheduler = true},
        model, optimizer, scheduler, out);
    INFO(out.str());
    REQUIRE(progress.has_value());
    CHECK(progress->iteration == 20);
    CHECK(progress->consumed_train_samples == 160);
    test_support::check_expected_weights(model, directory / "expected.json");
    CHECK(optimizer.steps_taken() == 20);
    CHECK(scheduler.num_steps() == 160);
    const auto numel = static_cast<size_t>(model.parameter_buffer().numel);
    std::vector<float> exp_avg(numel), exp_avg_sq(numel);
    optimizer.copy_moments_to_host(exp_avg, exp_avg_sq);
    check_expected_moments(directory, [&](const std::string& moment) {
      const bool second = moment.starts_with(backend::kCheckpointExpAvgSqPrefix);
      const std::string name = moment.substr(std::string(second ? backend::kCheckpointExpAvgSqPrefix
                                                                : backend::kCheckpointExpAvgPrefix)
                                                 .size());
      for (const auto& tensor : model.tensors()) {
        if (tensor.name != name) continue;
        const auto first = (second ? exp_avg_sq : exp_avg).begin() + tensor.offset;
        return std::vector<float>(first, first + tensor.numel);
      }
      FAIL("no tensor " << name);
      return std::vector<float>{};
    });
  }
}

TEST_CASE("torch_dist checkpoint: a damaged or foreign directory is refused by name") {
  const fs::path* root = dist_checkpoints();
  if (root == nullptr) return;
  test_support::TemporaryDirectory scratch;
  const fs::path copy = scratch.path / "gpt_dist";
  fs::copy(*root / "gpt_dist", copy, fs::copy_options::recursive);
  const fs::path iteration = copy / "iter_0000020";
  auto refusal = [&] { return test_support::refusal_of([&] { load_whole_dist(copy); }); };

  // A writer's file gone.
  fs::rename(iteration / "__3_0.distcp", scratch.path / "moved");
  const std::string missing = refusal();
  CHECK(missing.find("__3_0.distcp") != std::string::npos);
  // Cut short.
  fs::copy_file(scratch.path / "moved", iteration / "__3_0.distcp");
  fs::resize_file(iteration / "__3_0.distcp", 1000);
  const std::string truncated = refusal();
  CHECK(truncated.find("__3_0.distcp") != std::string::npos);
  CHECK(truncated.find("past the file's end") != std::string::npos);
  fs::remove(iteration / "__3_0.distcp");
  fs::rename(scratch.path / "moved", iteration / "__3_0.distcp");
  CHECK_NOTHROW(load_whole_dist(copy));

  // Another backend, and a metadata.json that is not one.
  std::ofstream(iteration / "metadata.json") << R"({"sharded_backend": "zarr"})";
  CHECK(refusal().find("sharded_backend is 'zarr'") != std::string::npos);
  std::ofstream(iteration / "metadata.json") << "[1, 2]";
  CHECK(refusal().find("not a Megatron distributed checkpoint's metadata") != std::string::npos);
  std::ofstream(iteration / "metadata.json") << R"({"sharded_backend": "torch_dist"})";
  // The common state inside the checkpoint (Megatron core 0.15), not in common.pt.
  fs::rename(iteration / "common.pt", scratch.path / "common.pt");
  CHECK(refusal().find("'common_state' object, which is not read yet") != std::string::npos);
  fs::rename(scratch.path / "common.pt", iteration / "common.pt");

  // A .metadata that names a global no checkpoint needs, or getattr on anything but an enum.
  const fs::path metadata = iteration / backend::kDistributedCheckpointMetadataFile;
  using namespace std::string_literals;
  std::ofstream(metadata, std::ios::binary) << "\x80\x02"
                                               "cposix\nsystem\n"
                                               "X\x02\0\0\0"
                                               "ls\x85R."s;
  const std::string hostile = refusal();
  CHECK(hostile.find("posix.system") != std::string::npos);
  std::ofstream(metadata, std::ios::binary) << "\x80\x02"
                                               "cbuiltins\ngetattr\n"
                                               "ctorch\nSize\n"
                                               "X\x03\0\0\0"
                                               "mro\x86R."s;
  CHECK(refusal().find("builtins.getattr is called with other than (an allowed enum, a name)") !=
        std::string::npos);
  // Not a Metadata at all.
  std::ofstream(metadata, std::ios::binary) << "\x80\x02]q\0."s;
  CHECK(refusal().find("the pickle is not a Metadata") != std::string::npos);
}
