// --ckpt-format torch saves (megatron_checkpoint_writer.hpp): the file PyTorch loads
// (load_torch_checkpoint.py: torch.load with its weights_only loader's globals) holds Megatron's
// keys in nn.Module.state_dict's order for both module specs, the model's tensors and AdamW's
// moments value for value, Megatron's param groups and scheduler state, and the args Megatron's
// load reads; a PyTorch forward of the file (megatron_loss_reference.py) gives the model's loss;
// under --fp16 and --bf16 the model's tensors are 16-bit, with the fp32 main weights and the
// loss scaler where Float16OptimizerWithFloat16Params keeps them; a run stopped at a
// --ckpt-format torch save and resumed from it equals one that never stopped, bit for bit; with
// the distributed optimizer, distrib_optim.pt holds each parameter's state where Megatron's
// grad-buffer layout puts it (megatron_parameter_state.py finds it there), and resumes as
// exactly; what is not built is refused before training.
#include "backend/ckpt/megatron_checkpoint_writer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/megatron_checkpoint.hpp"
#include "backend/common/error.hpp"
#include "backend/core/element_type.hpp"
#include "backend/data/mock_dataset.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/trainer.hpp"
#include "backend/train/training_schedule.hpp"
#include "tests/backend/ckpt/live_training_state.hpp"
#include "tests/backend/ckpt/python_fixtures.hpp"
#include "tests/backend/train/tiny_gpt_arguments.hpp"
#include "tests/reference_tools.hpp"
#include "tests/temporary_directory.hpp"

using namespace backend;
namespace fs = std::filesystem;

namespace {

TrainingArguments torch_format_arguments(const fs::path& save) {
  TrainingArguments a = test_support::resumable_gpt_arguments(8);
  a.checkpointing.save = save.string();
  a.checkpointing.ckpt_format = CheckpointFormat::torch;
  validate_arguments(a);
  return a;
}

// The model, optimizer and scheduler of the arguments after three real steps, and one
// tensor's values of a buffer of the model's layout.
struct TrainedState : test_support::LiveState {
  explicit TrainedState(const TrainingArguments& a) : LiveState(a) { train(a, 3); }

  std::vector<float> values(std::span<const float> buffer, const std::string& name) const {
    for (const auto& tensor : model.tensors()) {
      if (tensor.name == name) {
        const auto part =
            buffer.subspan(static_cast<size_t>(tensor.offset), static_cast<size_t>(tensor.numel));
        return {part.begin(), part.end()};
      }
    }
    FAIL("no tensor " << name);
    return {};
  }
};

// The loss megatron_loss_reference.py computes in PyTorch, in float64, from `checkpoint` (a
// rank's model_optim_rng.pt, or a torch_dist iteration directory) on the two mock samples after
// the first three, equal to the model's own on them (`scratch` takes the batch's JSON).
void check_pytorch_loss(TrainedState& state, const TrainingArguments& a, const fs::path& checkpoint,
                        const fs::path& scratch) {
  const MockDataset data(a.run.seed, a.tokenizer.vocab_size + 1, a.model.seq_length);
  std::vector<int32_t> tokens(static_cast<size_t>(2 * a.model.seq_length)), labels(tokens.size());
  data.fill_batch(Split::train, 3, 2, tokens, labels);
  state.model.set_training(false);
  const double ours = state.model.forward(tokens, labels, 2, a.model.seq_length);
  nlohmann::json batch = {{"tokens", nlohmann::json::array()}, {"labels", nlohmann::json::array()}};
  for (size_t row = 0; row < 2; ++row) {
    const auto begin = static_cast<std::ptrdiff_t>(row * a.model.seq_length);
    const auto end = begin + a.model.seq_length;
    batch["tokens"].push_back(std::vector<int32_t>(tokens.begin() + begin, tokens.begin() + end));
    batch["labels"].push_back(std::vector<int32_t>(labels.begin() + begin, labels.begin() + end));
  }
  const fs::path batch_file = scratch / "batch.json";
  std::ofstream(batch_file) << batch.dump();
  const auto reference = test_support::run_command(
      std::string(test_support::kPython) + " " + test_support::kTestSource +
      "/tests/backend/ckpt/megatron_loss_reference.py " + checkpoint.string() + " " +
      batch_file.string());
  REQUIRE_MESSAGE(reference.exit_status == 0, reference.output);
  REQUIRE(reference.output.starts_with("loss "));
  const double theirs = std::stod(reference.output.substr(5));
  CAPTURE(ours);
  CAPTURE(theirs);
  CHECK(std::abs(ours - theirs) <= 1e-5 * std::abs(theirs));
}

// nn.Module.state_dict's keys of one layer of each spec, for the tiny GPT (LayerNorm, biases).
const std::vector<std::string> kLocalLayerKeys = {"input_layernorm.weight",
                                                  "input_layernorm.bias",
                                                  "self_attention.linear_proj.weight",
                                                  "self_attention.linear_proj.bias",
                                                  "self_attention.linear_proj._extra_state",
                                                  "self_attention.linear_qkv.weight",
                                                  "self_attention.linear_qkv.bias",
                                                  "self_attention.linear_qkv._extra_state",
                                                  "pre_mlp_layernorm.weight",
                                                  "pre_mlp_layernorm.bias",
                                                  "mlp.linear_fc1.weight",
                                                  "mlp.linear_fc1.bias",
                                                  "mlp.linear_fc1._extra_state",
                                                  "mlp.linear_fc2.weight",
                                                  "mlp.linear_fc2.bias",
                                                  "mlp.linear_fc2._extra_state"};
const std::vector<std::string> kTransformerEngineLayerKeys = {
    "self_attention.core_attention._extra_state",
    "self_attention.linear_proj.weight",
    "self_attention.linear_proj.bias",
    "self_attention.linear_proj._extra_state",
    "self_attention.linear_qkv.layer_norm_weight",
    "self_attention.linear_qkv.layer_norm_bias",
    "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv.bias",
    "self_attention.linear_qkv._extra_state",
    "mlp.linear_fc1.layer_norm_weight",
    "mlp.linear_fc1.layer_norm_bias",
    "mlp.linear_fc1.weight",
    "mlp.linear_fc1.bias",
    "mlp.linear_fc1._extra_state",
    "mlp.linear_fc2.weight",
    "mlp.linear_fc2.bias",
    "mlp.linear_fc2._extra_state"};

// This backend's name of a Megatron key of the tiny GPT's file (TE's fused norms are the
// local spec's norms).
std::string native_name(std::string key) {
  const std::pair<std::string, std::string> renames[] = {
      {"self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
      {"self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"},
      {"mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"},
      {"mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias"}};
  for (const auto& [from, to] : renames) {
    if (const size_t at = key.find(from); at != std::string::npos) key.replace(at, from.size(), to);
  }
  return key;
}

// The entries of a load_torch_checkpoint.py dict ({"dict": [[key, value], ...]}) by key.
std::map<std::string, nlohmann::json> entries(const nlohmann::json& dict, const char* kind) {
  std::map<std::string, nlohmann::json> by_key;
  for (const auto& entry : dict.at(kind)) by_key[entry[0].dump()] = entry[1];
  return by_key;
}

// `base` trained whole, and stopped at iteration 4 (--exit-interval) then resumed from its save
// in `directory`/resumed: the whole run's result, and the resumed half's, checked to be 8 and 4
// iterations long.
std::pair<TrainingResult, TrainingResult> whole_and_resumed(const TrainingArguments& base,
                                                            const fs::path& directory) {
  auto uninterrupted = base;
  uninterrupted.checkpointing.save = (directory / "uninterrupted").string();
  std::ostringstream log_whole;
  TrainingResult whole = pretrain(uninterrupted, log_whole);
  auto first_half = base;
  first_half.checkpointing.save = (directory / "resumed").string();
  first_half.run.exit_interval = 4;
  std::ostringstream log_first;
  const TrainingResult first = pretrain(first_half, log_first);
  auto second_half = base;
  second_half.checkpointing.save = second_half.checkpointing.load = first_half.checkpointing.save;
  std::ostringstream log_second;
  TrainingResult second = pretrain(second_half, log_second);
  INFO(log_second.str());
  REQUIRE(whole.iterations.size() == 8);
  REQUIRE(first.iterations.size() == 4);
  REQUIRE(second.iterations.size() == 4);
  return {std::move(whole), std::move(second)};
}

}  // namespace

TEST_CASE("a --ckpt-format torch save as PyTorch loads it: Megatron's keys and values") {
  if (!test_support::python_imports("torch", "python3-torch")) return;
  for (const MegatronModuleSpec spec :
       {MegatronModuleSpec::local, MegatronModuleSpec::transformer_engine}) {
    CAPTURE(common::enum_name(spec));
    test_support::TemporaryDirectory directory;
    TrainingArguments a = torch_format_arguments(directory.path);
    a.checkpointing.transformer_impl = spec;
    TrainedState state(a);
    std::ostringstream log;
    save_checkpoint(a, {3, 12, 8}, state.model, state.optimizer, state.scheduler, log);
    CHECK(log.str().find("saving checkpoint at iteration       3 to " + directory.path.string() +
                         " in torch format") != std::string::npos);
    const fs::path file = directory.path / "iter_0000003" / "mp_rank_00" / "model_optim_rng.pt";
    REQUIRE(fs::exists(file));
    CHECK(read_checkpoint_tracker(directory.path)->iteration == 3);

    const nlohmann::json json =
        test_support::python_json("load_torch_checkpoint.py", file.string());
    CHECK(json["bad_entry"].is_null());
    const nlohmann::json& top = json["value"]["dict"];
    std::vector<std::string> keys;
    for (const auto& entry : top) keys.push_back(entry[0]);
    CHECK(keys == std::vector<std::string>{"args", "checkpoint_version", "iteration", "model",
                                           "optimizer", "opt_param_scheduler",
                                           "native_dropout_state"});
    auto root = entries(json["value"], "dict");

    // The args Megatron's load_checkpoint and check_checkpoint_args read, with Python's types.
    const nlohmann::json& args = root["\"args\""]["namespace"];
    CHECK(args["num_layers"] == a.model.num_layers);
    CHECK(args["hidden_size"] == a.model.hidden_size);
    CHECK(args["num_attention_heads"] == a.model.num_attention_heads);
    CHECK(args["max_position_embeddings"] == a.model.max_position_embeddings);
    CHECK(args["tensor_model_parallel_size"] == 1);
    CHECK(args["pipeline_model_parallel_size"] == 1);
    CHECK(args["padded_vocab_size"] == state.model.config().padded_vocab_size);
    CHECK(args["consumed_train_samples"] == 12);
    CHECK(args["consumed_valid_samples"] == 8);
    CHECK(args["tokenizer_type"] == a.tokenizer.tokenizer_type);
    CHECK(args["bf16"] == false);
    CHECK(args["lr"] == a.optimizer.lr);
    CHECK(args["ckpt_format"] == "torch");
    CHECK(args["transformer_impl"] == std::string(common::enum_name(spec)));
    CHECK(args["tokenizer_model"].is_null());
    CHECK(root["\"checkpoint_version\""] == 3.0);
    CHECK(root["\"iteration\""] == 3);

    // The model: keys in state_dict's order, every parameter's values exactly (fp32 run).
    std::vector<std::string> expected = {"embedding.word_embeddings.weight",
                                         "embedding.position_embeddings.weight"};
    for (int layer = 0; layer < a.model.num_layers; ++layer) {
      for (const std::string& key :
           spec == MegatronModuleSpec::local ? kLocalLayerKeys : kTransformerEngineLayerKeys) {
        expected.push_back(fmt::format("decoder.layers.{}.{}", layer, key));
      }
    }
    for (const char* key : {"decoder.final_layernorm.weight", "decoder.final_layernorm.bias",
                            "output_layer._extra_state"}) {
      expected.push_back(key);
    }
    const nlohmann::json& model = root["\"model\""]["ordered_dict"];
    std::vector<std::string> model_keys;
    std::vector<std::string> parameters;  // the optimizer's order
    for (const nlohmann::json& entry : model) {
      const std::string key = entry[0];
      const nlohmann::json& value = entry[1];
      model_keys.push_back(key);
      if (key.ends_with("._extra_state")) {
        CHECK(value.is_null());
        continue;
      }
      CAPTURE(key);
      CHECK(value["tensor"] == "torch.float32");
      CHECK(value["values"].get<std::vector<float>>() ==
            state.values(state.model.parameters(), native_name(key)));
      parameters.push_back(key);
    }
    CHECK(model_keys == expected);

    // The optimizer: FP32Optimizer's torch state dict, the weight-decay group first, the
    // moments numbered across the groups.
    const nlohmann::json& optimizer = root["\"optimizer\""];
    auto torch_state = entries(optimizer, "dict");
    const nlohmann::json& groups = torch_state["\"param_groups\""];
    REQUIRE(groups.size() == 2);
    auto moments = entries(torch_state["\"state\""], "dict");
    int64_t index = 0;
    for (int g = 0; g < 2; ++g) {
      CAPTURE(g);
      auto group = entries(groups[g], "dict");
      CHECK(group["\"wd_mult\""] == (g == 0 ? 1.0 : 0.0));
      CHECK(group["\"lr_mult\""] == 1.0);
      CHECK(group["\"step\""] == 3);
      CHECK(group["\"lr\""] == state.scheduler.learning_rate());
      CHECK(group["\"weight_decay\""] == (g == 0 ? state.scheduler.weight_decay() : 0.0));
      CHECK(group["\"betas\""]["tuple"] ==
            nlohmann::json::array({a.optimizer.adam_beta1, a.optimizer.adam_beta2}));
      for (const std::string& key : parameters) {
        const bool no_decay = key.ends_with("bias") || key.find("norm") != std::string::npos;
        if (no_decay != (g == 1)) continue;
        CAPTURE(key);
        REQUIRE(group["\"params\""].size() > 0);
        CHECK(std::find(group["\"params\""].begin(), group["\"params\""].end(), index) !=
              group["\"params\""].end());
        auto moment = entries(moments[std::to_string(index)], "dict");
        CHECK(moment["\"exp_avg\""]["values"].get<std::vector<float>>() ==
              state.values(state.optimizer.exp_avg(), native_name(key)));
        CHECK(moment["\"exp_avg_sq\""]["values"].get<std::vector<float>>() ==
              state.values(state.optimizer.exp_avg_sq(), native_name(key)));
        ++index;
      }
    }
    CHECK(index == static_cast<int64_t>(parameters.size()));
    auto scheduler = entries(root["\"opt_param_scheduler\""], "dict");
    CHECK(scheduler["\"num_steps\""] == state.scheduler.num_steps());
    CHECK(scheduler["\"max_lr\""] == a.optimizer.lr);
    CHECK(scheduler["\"lr_decay_style\""] == "cosine");
    CHECK(scheduler["\"lr_warmup_steps\""].is_number_integer());  // Megatron's int
    CHECK(scheduler["\"max_lr\""].is_number_float());

    // This backend's reader takes the file back: the same record, weights and moments.
    const MegatronShards shards = open_megatron_shards(directory.path);
    CHECK(shards.optimizer_not_read.empty());
    CHECK(shards.record.model.num_layers == a.model.num_layers);
    REQUIRE(shards.files.size() == 1);
    const ShardFile& shard = *shards.files[0];
    for (const auto& tensor : state.model.tensors()) {
      CAPTURE(tensor.name);
      std::vector<float> read(static_cast<size_t>(tensor.numel));
      shard.read(tensor.name, read);
      CHECK(read == state.values(state.model.parameters(), tensor.name));
      shard.read(kCheckpointExpAvgSqPrefix + tensor.name, read);
      CHECK(read == state.values(state.optimizer.exp_avg_sq(), tensor.name));
    }
    CHECK(shard.metadata()["rng_state"]["dropout_step"] == state.model.dropout_step());

    // A PyTorch forward of the saved file (Megatron core's GPTModel in plain torch, float64)
    // gives this model's loss on the next two samples.
    check_pytorch_loss(state, a, file, directory.path);
  }
}

TEST_CASE("a run stopped at a --ckpt-format torch save and resumed equals an uninterrupted one") {
  test_support::TemporaryDirectory directory;
  TrainingArguments base = torch_format_arguments(directory.path / "unused");
  base.run.train_iters = 8;
  base.checkpointing.transformer_impl = MegatronModuleSpec::local;

  const auto [whole, second] = whole_and_resumed(base, directory.path);
  CHECK(fs::exists(directory.path / "resumed" / "iter_0000004" / "mp_rank_00" /
                   "model_optim_rng.pt"));
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(second.iterations[i].iteration == whole.iterations[4 + i].iteration);
    CHECK(second.iterations[i].lm_loss == whole.iterations[4 + i].lm_loss);  // exact
    CHECK(second.iterations[i].grad_norm == whole.iterations[4 + i].grad_norm);
    CHECK(second.iterations[i].learning_rate == whole.iterations[4 + i].learning_rate);
  }
}

TEST_CASE("--ckpt-format: Megatron core's zarr and torch_dcp formats are refused") {
  TrainingArguments a = test_support::resumable_gpt_arguments(8);
  for (const CheckpointFormat format : {CheckpointFormat::zarr, CheckpointFormat::torch_dcp}) {
    a.checkpointing.ckpt_format = format;
    const std::string refusal =
        fmt::format("--ckpt-format {}: not built; --save writes", common::enum_name(format));
    CHECK_THROWS_WITH_AS(validate_arguments(a), doctest::Contains(refusal.c_str()), common::Error);
  }
}

namespace {

// megatron_parameter_state.py's JSON of one rank directory: each parameter's fp32 weight and
// moments as Megatron's code finds them (the distributed optimizer's in distrib_optim.pt at
// Megatron's grad-buffer layout).
nlohmann::json parameter_state(const fs::path& rank_directory) {
  return test_support::python_json("megatron_parameter_state.py", rank_directory.string());
}

}  // namespace

TEST_CASE(
    "--ckpt-format torch with the distributed optimizer: distrib_optim.pt at Megatron's "
    "layout, and an exact resume") {
  if (!test_support::python_imports("torch", "python3-torch")) return;
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    test_support::TemporaryDirectory directory;
    // The same three steps with torch's optimizer state and with the distributed optimizer's.
    nlohmann::json states[2];
    for (const bool distributed : {false, true}) {
      TrainingArguments a = torch_format_arguments(directory.path / "unused");
      a.run.train_iters = 3;
      a.precision.bf16 = bf16;
      a.parallelism.use_distributed_optimizer = distributed;
      a.checkpointing.save = (directory.path / (distributed ? "distributed" : "torch")).string();
      validate_arguments(a);
      std::ostringstream log;
      pretrain(a, log);
      const fs::path rank = fs::path(a.checkpointing.save) / "iter_0000003" / "mp_rank_00";
      CHECK(fs::exists(rank / "distrib_optim.pt") == distributed);
      CHECK_FALSE(fs::exists(rank / "distrib_optim_000.bin"));
      states[distributed ? 1 : 0] = parameter_state(rank);
    }
    CHECK(states[0]["distributed"] == false);
    CHECK(states[1]["distributed"] == true);
    // Megatron's buffer key: (param dtype, grad dtype); a bf16 run's grads are fp32.
    CHECK(states[1]["dtypes"] ==
          nlohmann::json::array({bf16 ? "torch.bfloat16" : "torch.float32", "torch.float32"}));
    const nlohmann::json& want = states[0]["parameters"];
    const nlohmann::json& got = states[1]["parameters"];
    CHECK(got.size() == want.size());
    for (const auto& item : want.items()) {
      CAPTURE(item.key());
      REQUIRE(got.contains(item.key()));
      for (const char* key : {"param", "exp_avg", "exp_avg_sq"}) {
        CAPTURE(key);
        CHECK(got[item.key()][key] == item.value()[key]);
      }
    }
  }

  // Stopped at a save with the distributed optimizer in Megatron's format, and resumed.
  test_support::TemporaryDirectory directory;
  TrainingArguments base = torch_format_arguments(directory.path / "unused");
  base.run.train_iters = 8;
  base.parallelism.use_distributed_optimizer = true;
  validate_arguments(base);
  const auto [whole, second] = whole_and_resumed(base, directory.path);
  CHECK(
      fs::exists(directory.path / "resumed" / "iter_0000004" / "mp_rank_00" / "distrib_optim.pt"));
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(second.iterations[i].lm_loss == whole.iterations[4 + i].lm_loss);  // exact
    CHECK(second.iterations[i].grad_norm == whole.iterations[4 + i].grad_norm);
    CHECK(second.iterations[i].learning_rate == whole.iterations[4 + i].learning_rate);
  }
}

TEST_CASE("--fp16 and --bf16 torch saves: 16-bit model, fp32 main weights, the loss scaler") {
  test_support::TemporaryDirectory directory;
  TrainingArguments base = torch_format_arguments(directory.path / "unused");
  base.run.train_iters = 8;
  base.precision.fp16 = true;
  base.precision.initial_loss_scale = 1024;
  base.precision.loss_scale_window = 3;  // grows at iterations 3 and 6: across the save at 4
  const auto [whole, second] = whole_and_resumed(base, directory.path);
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(second.iterations[i].loss_scale == whole.iterations[i + 4].loss_scale);
    CHECK(second.iterations[i].lm_loss == whole.iterations[i + 4].lm_loss);
  }

  if (!test_support::python_imports("torch", "python3-torch")) return;
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    fs::path file =
        directory.path / "resumed" / "iter_0000004" / "mp_rank_00" / "model_optim_rng.pt";
    if (bf16) {
      auto run = base;
      run.precision.fp16 = false;
      run.precision.bf16 = true;
      run.run.train_iters = 2;
      run.checkpointing.save = (directory.path / "bf16").string();
      std::ostringstream log;
      pretrain(run, log);
      file =
          fs::path(run.checkpointing.save) / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt";
    }
    const nlohmann::json json =
        test_support::python_json("load_torch_checkpoint.py", file.string());
    auto root = entries(json["value"], "dict");
    const nlohmann::json& model = root["\"model\""]["ordered_dict"];
    const nlohmann::json& word_embeddings = model[0][1];
    CHECK(word_embeddings["tensor"] == (bf16 ? "torch.bfloat16" : "torch.float16"));
    auto optimizer = entries(root["\"optimizer\""], "dict");
    REQUIRE(optimizer.count("\"fp32_from_fp16_params\"") == 1);
    CHECK(optimizer.count("\"grad_scaler\"") == (bf16 ? 0u : 1u));
    if (!bf16) {
      auto scaler = entries(optimizer["\"grad_scaler\""], "dict");
      CHECK(scaler["\"scale\""]["values"] == nlohmann::json::array({2048.0}));
      CHECK(scaler["\"growth_tracker\""] == 1);
      CHECK(scaler["\"hysteresis_tracker\""] == 2);
    }
    // The main weights are fp32, and the model's 16-bit tensors are them rounded.
    const nlohmann::json& main_weight = optimizer["\"fp32_from_fp16_params\""][0][0];
    CHECK(main_weight["tensor"] == "torch.float32");
    const auto main_values = main_weight["values"].get<std::vector<float>>();
    const auto model_values = word_embeddings["values"].get<std::vector<float>>();
    REQUIRE(main_values.size() == model_values.size());
    size_t rounded_differently = 0;
    for (size_t i = 0; i < main_values.size(); ++i) {
      const float rounded =
          bf16 ? to_float(to_bfloat16(main_values[i])) : to_float(to_float16(main_values[i]));
      rounded_differently += rounded != model_values[i] ? 1 : 0;
    }
    CHECK(rounded_differently == 0);
    CHECK(main_values != model_values);
  }
}

namespace {

// read_torch_dist_checkpoint.py's JSON of a torch_dist iteration directory, as PyTorch's
// FileSystemReader and load_state_dict read it.
nlohmann::json read_with_pytorch(const fs::path& iteration_directory) {
  return test_support::python_json("read_torch_dist_checkpoint.py", iteration_directory.string());
}

// The layer `layer`'s slice of a stacked tensor's values ([layers, ...]).
std::vector<float> layer_slice(const nlohmann::json& tensor, int64_t layer) {
  const auto values = tensor["values"].get<std::vector<float>>();
  const size_t per_layer = values.size() / tensor["shape"][0].get<size_t>();
  const auto first = values.begin() + static_cast<std::ptrdiff_t>(per_layer * layer);
  return {first, first + static_cast<std::ptrdiff_t>(per_layer)};
}

}  // namespace

TEST_CASE("a --ckpt-format torch_dist save as PyTorch's distributed-checkpoint reader reads it") {
  if (!test_support::python_imports("torch", "python3-torch")) return;
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    test_support::TemporaryDirectory directory;
    TrainingArguments a = torch_format_arguments(directory.path);
    a.checkpointing.ckpt_format = CheckpointFormat::torch_dist;
    // Core's local spec in fp32; Transformer Engine's names under --bf16.
    a.checkpointing.transformer_impl =
        bf16 ? MegatronModuleSpec::transformer_engine : MegatronModuleSpec::local;
    a.precision.bf16 = bf16;
    validate_arguments(a);
    TrainedState state(a);
    std::ostringstream log;
    save_checkpoint(a, {3, 12, 8}, state.model, state.optimizer, state.scheduler, log);
    CHECK(log.str().find("in torch_dist format") != std::string::npos);
    const fs::path iteration = directory.path / "iter_0000003";
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(iteration)) {
      files.push_back(entry.path().filename().string());
    }
    std::sort(files.begin(), files.end());
    CHECK(files ==
          std::vector<std::string>{".metadata", "__0_0.distcp", "common.pt", "metadata.json"});

    const nlohmann::json read = read_with_pytorch(iteration);
    CHECK(read["config"]["sharded_backend"] == "torch_dist");
    auto common = entries(read["common"], "dict");
    CHECK(common["\"iteration\""] == 3);
    CHECK(common["\"checkpoint_version\""] == 3.0);
    const nlohmann::json& args = common["\"args\""]["namespace"];
    CHECK(args["ckpt_format"] == "torch_dist");
    CHECK(args["consumed_train_samples"] == 12);
    CHECK(args["padded_vocab_size"] == state.model.config().padded_vocab_size);
    CHECK(entries(common["\"opt_param_scheduler\""], "dict")["\"num_steps\""] ==
          state.scheduler.num_steps());
    auto optimizer = entries(common["\"optimizer\""], "dict");
    auto torch_state = bf16 ? entries(optimizer["\"optimizer\""], "dict") : optimizer;
    CHECK(entries(torch_state["\"state\""], "dict")["\"common_step\""] == 3);
    CHECK(torch_state["\"param_groups\""].size() == 2);

    // Every tensor at its global shape, the layers stacked; every value PyTorch reads is the
    // model's, its moments', and the fp32 main weights' under --bf16.
    const nlohmann::json& tensors = read["tensors"];
    const int64_t layers = a.model.num_layers;
    const std::string norm_key = bf16 ? "decoder.layers.self_attention.linear_qkv.layer_norm_weight"
                                      : "decoder.layers.input_layernorm.weight";
    REQUIRE(tensors.contains(norm_key));
    CHECK(tensors[norm_key]["shape"] == nlohmann::json::array({layers, a.model.hidden_size}));
    CHECK(tensors[norm_key]["chunks"].size() == static_cast<size_t>(layers));
    CHECK(tensors["embedding.word_embeddings.weight"]["dtype"] ==
          (bf16 ? "torch.bfloat16" : "torch.float32"));
    CHECK(tensors.contains("output_layer.weight") == false);  // tied
    CHECK(tensors.contains("optimizer.state.fp32_param.decoder.final_layernorm.weight") == bf16);
    size_t checked = 0;
    for (const auto& tensor : state.model.tensors()) {
      CAPTURE(tensor.name);
      std::string key = tensor.name;
      int64_t layer = -1;
      if (key.starts_with("decoder.layers.")) {
        const size_t dot = key.find('.', 15);
        layer = std::stoll(key.substr(15, dot - 15));
        key = "decoder.layers." +
              megatron_layer_tensor_name(key.substr(dot + 1), a.checkpointing.transformer_impl);
      }
      auto values = [&](const std::string& stored) {
        REQUIRE(tensors.contains(stored));
        return layer >= 0 ? layer_slice(tensors[stored], layer)
                          : tensors[stored]["values"].get<std::vector<float>>();
      };
      const std::string parameter = bf16 ? "optimizer.state.fp32_param." + key : key;
      CHECK(values(parameter) == state.values(state.model.parameters(), tensor.name));
      CHECK(values("optimizer.state.exp_avg." + key) ==
            state.values(state.optimizer.exp_avg(), tensor.name));
      CHECK(values("optimizer.state.exp_avg_sq." + key) ==
            state.values(state.optimizer.exp_avg_sq(), tensor.name));
      if (bf16) {
        const std::vector<float> main = values(parameter), model = values(key);
        REQUIRE(main.size() == model.size());
        for (size_t i = 0; i < main.size(); ++i) CHECK(to_float(to_bfloat16(main[i])) == model[i]);
      }
      ++checked;
    }
    CHECK(checked == state.model.tensors().size());

    // This backend reads it back: the same weights and moments, step and dropout position.
    const MegatronShards shards = open_megatron_shards(directory.path);
    CHECK(shards.layout.distributed);
    CHECK(shards.optimizer_not_read.empty());
    REQUIRE(shards.files.size() == 1);
    const ShardFile& shard = *shards.files[0];
    CHECK(shard.metadata()["optimizer"]["step"] == 3);
    CHECK(shard.metadata()["rng_state"]["dropout_step"] == state.model.dropout_step());
    for (const auto& tensor : state.model.tensors()) {
      CAPTURE(tensor.name);
      std::vector<float> values(static_cast<size_t>(tensor.numel));
      shard.read(tensor.name, values);
      CHECK(values == state.values(state.model.parameters(), tensor.name));
      shard.read(kCheckpointExpAvgPrefix + tensor.name, values);
      CHECK(values == state.values(state.optimizer.exp_avg(), tensor.name));
    }
    if (bf16) continue;

    // A PyTorch forward of the checkpoint as PyTorch's reader gives it is this model's loss.
    check_pytorch_loss(state, a, iteration, directory.path);
  }
}

TEST_CASE(
    "a run stopped at a --ckpt-format torch_dist save and resumed equals an uninterrupted "
    "one") {
  // fp32, bf16 (16-bit model, fp32 main weights), and the distributed optimizer.
  for (const int variant : {0, 1, 2}) {
    CAPTURE(variant);
    test_support::TemporaryDirectory directory;
    TrainingArguments base = torch_format_arguments(directory.path / "unused");
    base.checkpointing.ckpt_format = CheckpointFormat::torch_dist;
    base.run.train_iters = 8;
    base.precision.bf16 = variant == 1;
    base.parallelism.use_distributed_optimizer = variant == 2;
    validate_arguments(base);
    const auto [whole, second] = whole_and_resumed(base, directory.path);
    CHECK(fs::exists(directory.path / "resumed" / "iter_0000004" / "metadata.json"));
    for (size_t i = 0; i < 4; ++i) {
      CAPTURE(i);
      CHECK(second.iterations[i].iteration == whole.iterations[4 + i].iteration);
      CHECK(second.iterations[i].lm_loss == whole.iterations[4 + i].lm_loss);  // exact
      CHECK(second.iterations[i].grad_norm == whole.iterations[4 + i].grad_norm);
      CHECK(second.iterations[i].learning_rate == whole.iterations[4 + i].learning_rate);
    }
  }
}
