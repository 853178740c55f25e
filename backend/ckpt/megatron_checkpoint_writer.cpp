// Megatron-LM's legacy checkpoint files written (the header says what each key holds, after
// which of Megatron's functions). The names are the inverse of megatron_checkpoint.cpp's
// reading: this backend's names are Megatron core's local spec with global layer indices.
#include "backend/ckpt/megatron_checkpoint_writer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/megatron_checkpoint.hpp"
#include "backend/ckpt/megatron_optimizer.hpp"
#include "backend/ckpt/torch_checkpoint_writer.hpp"
#include "backend/common/error.hpp"

namespace backend {

namespace {

// One entry of a layer's state dict: Megatron's name after "decoder.layers.N.", and this
// backend's after "decoder.layers.N." (nullptr: the module's '_extra_state', None).
struct LayerEntry {
  std::string_view megatron;
  const char* native;
};

// nn.Module.state_dict's order for a TransformerLayer of each spec (megatron/core/models/gpt/
// gpt_layer_specs.py): input_layernorm, self_attention (core_attention, linear_proj,
// linear_qkv), pre_mlp_layernorm, mlp (linear_fc1, linear_fc2). Entries whose tensor the model
// does not have (a norm's bias under RMSNorm, the linear biases under --disable-bias-linear)
// are left out.
constexpr LayerEntry kLocalSpecLayer[] = {
    {"input_layernorm.weight", "input_layernorm.weight"},
    {"input_layernorm.bias", "input_layernorm.bias"},
    {"self_attention.linear_proj.weight", "self_attention.linear_proj.weight"},
    {"self_attention.linear_proj.bias", "self_attention.linear_proj.bias"},
    {"self_attention.linear_proj._extra_state", nullptr},
    {"self_attention.linear_qkv.weight", "self_attention.linear_qkv.weight"},
    {"self_attention.linear_qkv.bias", "self_attention.linear_qkv.bias"},
    {"self_attention.linear_qkv._extra_state", nullptr},
    {"pre_mlp_layernorm.weight", "pre_mlp_layernorm.weight"},
    {"pre_mlp_layernorm.bias", "pre_mlp_layernorm.bias"},
    {"mlp.linear_fc1.weight", "mlp.linear_fc1.weight"},
    {"mlp.linear_fc1.bias", "mlp.linear_fc1.bias"},
    {"mlp.linear_fc1._extra_state", nullptr},
    {"mlp.linear_fc2.weight", "mlp.linear_fc2.weight"},
    {"mlp.linear_fc2.bias", "mlp.linear_fc2.bias"},
    {"mlp.linear_fc2._extra_state", nullptr},
};
// Transformer Engine's: the norms inside TELayerNormColumnParallelLinear, which registers the
// norm's parameters before the linear's; TEDotProductAttention has extra state of its own.
constexpr LayerEntry kTransformerEngineSpecLayer[] = {
    {"self_attention.core_attention._extra_state", nullptr},
    {"self_attention.linear_proj.weight", "self_attention.linear_proj.weight"},
    {"self_attention.linear_proj.bias", "self_attention.linear_proj.bias"},
    {"self_attention.linear_proj._extra_state", nullptr},
    {"self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
    {"self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"},
    {"self_attention.linear_qkv.weight", "self_attention.linear_qkv.weight"},
    {"self_attention.linear_qkv.bias", "self_attention.linear_qkv.bias"},
    {"self_attention.linear_qkv._extra_state", nullptr},
    {"mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"},
    {"mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias"},
    {"mlp.linear_fc1.weight", "mlp.linear_fc1.weight"},
    {"mlp.linear_fc1.bias", "mlp.linear_fc1.bias"},
    {"mlp.linear_fc1._extra_state", nullptr},
    {"mlp.linear_fc2.weight", "mlp.linear_fc2.weight"},
    {"mlp.linear_fc2.bias", "mlp.linear_fc2.bias"},
    {"mlp.linear_fc2._extra_state", nullptr},
};

// A parameter as the optimizer's state numbers it: its Megatron name, its tensor (this
// backend's name) and its model chunk.
struct WrittenParameter {
  std::string megatron_name;
  const CheckpointTensor* tensor = nullptr;
  size_t chunk = 0;
};

TorchValue from_json(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return TorchValue::none();
    case nlohmann::json::value_t::boolean:
      return TorchValue::boolean(value.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return TorchValue::integer(value.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto number = value.get<uint64_t>();
      if (!std::in_range<int64_t>(number)) return TorchValue::real(static_cast<double>(number));
      return TorchValue::integer(static_cast<int64_t>(number));
    }
    case nlohmann::json::value_t::number_float:
      return TorchValue::real(value.get<double>());
    case nlohmann::json::value_t::string:
      return TorchValue::text(value.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<TorchValue> items;
      for (const auto& item : value) items.push_back(from_json(item));
      return TorchValue::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      TorchValue dict = TorchValue::dict();
      for (const auto& [key, item] : value.items()) dict.set(key, from_json(item));
      return dict;
    }
    default:
      common::fail("internal error: a checkpoint value of JSON type {}", value.type_name());
  }
}

class RankFileWriter {
 public:
  // `common`: torch_dist's common.pt, without the model and the parameters' optimizer state.
  explicit RankFileWriter(const MegatronRankFileContents& contents, bool common = false)
      : contents_(contents), common_(common) {
    for (const CheckpointTensor& tensor : contents.tensors) by_name_.emplace(tensor.name, &tensor);
  }

  TorchValue root() {
    const nlohmann::json& metadata = *contents_.metadata;
    TorchValue root = TorchValue::dict();
    root.set("args", arguments());
    root.set("checkpoint_version", TorchValue::real(3.0));
    root.set("iteration", TorchValue::integer(metadata.at("iteration").get<int64_t>()));
    const size_t chunks = common_ ? 0 : contents_.chunks.size();
    for (size_t chunk = 0; chunk < chunks; ++chunk) {
      root.set(chunks == 1 ? std::string("model") : fmt::format("model{}", chunk),
               model_chunk(chunk));
    }
    if (metadata.contains("optimizer")) {
      root.set("optimizer", optimizer());
      root.set("opt_param_scheduler", scheduler(metadata.at("opt_param_scheduler")));
    }
    if (metadata.contains("rng_state")) {
      const nlohmann::json& rng = metadata.at("rng_state");
      TorchValue dropout = TorchValue::dict();
      dropout.set("seed", from_json(rng.at("dropout_seed")));
      dropout.set("step", from_json(rng.at("dropout_step")));
      root.set("native_dropout_state", std::move(dropout));
    }
    return root;
  }

 private:
  const CheckpointTensor* find(const std::string& name) const {
    const auto found = by_name_.find(name);
    return found == by_name_.end() ? nullptr : found->second;
  }

  const CheckpointTensor& require(const std::string& name) const {
    const CheckpointTensor* tensor = find(name);
    if (tensor == nullptr) common::fail("internal error: a Megatron save without '{}'", name);
    return *tensor;
  }

  TorchValue arguments() const {
    nlohmann::json args = contents_.args;
    const nlohmann::json& metadata = *contents_.metadata;
    for (const char* key :
         {"consumed_train_samples", "consumed_valid_samples", "padded_vocab_size"}) {
      args[key] = metadata.at(key);
    }
    TorchValue space = TorchValue::name_space();
    for (const auto& [key, value] : args.items()) space.set(key, from_json(value));
    return space;
  }

  TorchDtype model_dtype() const {
    switch (contents_.precision) {
      case MixedPrecision::bf16:
        return TorchDtype::bfloat16;
      case MixedPrecision::fp16:
        return TorchDtype::float16;
      case MixedPrecision::none:
        break;
    }
    return TorchDtype::float32;
  }

  static TorchValue fp32(const CheckpointTensor& tensor) {
    return TorchValue::tensor(TorchDtype::float32, tensor.shape, std::as_bytes(tensor.data));
  }

  // The model's tensor `native` under `megatron` in `dict`, a parameter of the optimizer's.
  void add_parameter(TorchValue& dict, std::string megatron, const std::string& native) {
    const CheckpointTensor& tensor = require(native);
    dict.set(megatron,
             contents_.precision == MixedPrecision::none
                 ? fp32(tensor)
                 : TorchValue::tensor_from_floats(model_dtype(), tensor.shape, tensor.data));
    parameters_.push_back({std::move(megatron), &tensor, chunk_});
  }

  TorchValue model_chunk(size_t chunk) {
    chunk_ = chunk;
    TorchValue dict = TorchValue::ordered_dict();
    if (contents_.first_stage && chunk == 0) {
      add_parameter(dict, "embedding.word_embeddings.weight", "embedding.word_embeddings.weight");
      if (find("embedding.position_embeddings.weight") != nullptr) {
        add_parameter(dict, "embedding.position_embeddings.weight",
                      "embedding.position_embeddings.weight");
      }
    }
    const LayerRange layers = contents_.chunks[chunk];
    const std::span<const LayerEntry> entries = contents_.spec == MegatronModuleSpec::local
                                                    ? std::span<const LayerEntry>(kLocalSpecLayer)
                                                    : kTransformerEngineSpecLayer;
    for (int64_t layer = layers.begin; layer < layers.end; ++layer) {
      const std::string megatron = fmt::format("decoder.layers.{}.", layer - layers.begin);
      const std::string native = fmt::format("decoder.layers.{}.", layer);
      for (const LayerEntry& entry : entries) {
        if (entry.native == nullptr) {
          dict.set(megatron + std::string(entry.megatron), TorchValue::none());
        } else if (find(native + entry.native) != nullptr) {
          add_parameter(dict, megatron + std::string(entry.megatron), native + entry.native);
        }
      }
    }
    if (contents_.last_stage && chunk + 1 == contents_.chunks.size()) {
      add_parameter(dict, "decoder.final_layernorm.weight", "decoder.final_layernorm.weight");
      if (find("decoder.final_layernorm.bias") != nullptr) {
        add_parameter(dict, "decoder.final_layernorm.bias", "decoder.final_layernorm.bias");
      }
      // Tied at one stage, the output layer has no weight of its own, but its extra state.
      if (find("output_layer.weight") != nullptr) {
        add_parameter(dict, "output_layer.weight", "output_layer.weight");
      }
      dict.set("output_layer._extra_state", TorchValue::none());
    }
    return dict;
  }

  // Megatron's default no_weight_decay_cond: biases and 1-D parameters go without.
  static bool without_weight_decay(const WrittenParameter& parameter) {
    return parameter.megatron_name.ends_with(".bias") || parameter.tensor->shape.size() == 1;
  }

  TorchValue optimizer() const {
    const nlohmann::json& saved = contents_.metadata->at("optimizer");
    const int64_t step = saved.at("step").get<int64_t>();
    const double max_lr = contents_.metadata->at("opt_param_scheduler").at("max_lr");
    const double min_lr = contents_.metadata->at("opt_param_scheduler").at("min_lr");
    const bool mixed_precision = contents_.precision != MixedPrecision::none;
    // torch_dist's common state has what is not sharded: the groups without their
    // parameters, the step as Megatron core's common_step (optim_state_to_sharding_state).
    const bool distributed = contents_.distributed_optimizer || common_;
    TorchValue state = TorchValue::dict();
    if (common_) state.set("common_step", TorchValue::integer(step));
    std::vector<TorchValue> groups, main_weight_groups;
    int64_t index = 0;
    for (const bool no_decay : {false, true}) {
      std::vector<TorchValue> indices, main_weights;
      for (const WrittenParameter& parameter : parameters_) {
        if (without_weight_decay(parameter) != no_decay) continue;
        if (distributed) continue;
        const CheckpointTensor& tensor = *parameter.tensor;
        TorchValue moments = TorchValue::dict();
        moments.set("exp_avg", fp32(require(kCheckpointExpAvgPrefix + tensor.name)));
        moments.set("exp_avg_sq", fp32(require(kCheckpointExpAvgSqPrefix + tensor.name)));
        state.set(index, std::move(moments));
        indices.push_back(TorchValue::integer(index++));
        if (mixed_precision) main_weights.push_back(fp32(tensor));
      }
      const double wd_mult = no_decay ? 0.0 : 1.0;
      TorchValue group = TorchValue::dict();
      group.set("is_expert_parallel", TorchValue::boolean(false));
      group.set("default_config", TorchValue::boolean(true));
      group.set("wd_mult", TorchValue::real(wd_mult));
      group.set("lr_mult", TorchValue::real(1.0));
      group.set("is_decoupled_lr", TorchValue::boolean(false));
      group.set("max_lr", TorchValue::real(max_lr));
      group.set("min_lr", TorchValue::real(min_lr));
      group.set("lr", TorchValue::real(contents_.learning_rate));
      group.set("bias_correction", TorchValue::boolean(true));
      group.set("betas", TorchValue::tuple({TorchValue::real(saved.at("adam_beta1")),
                                            TorchValue::real(saved.at("adam_beta2"))}));
      group.set("eps", TorchValue::real(saved.at("adam_eps")));
      group.set("weight_decay", TorchValue::real(contents_.weight_decay * wd_mult));
      group.set("step", TorchValue::integer(step));
      if (!distributed) group.set("params", TorchValue::list(std::move(indices)));
      groups.push_back(std::move(group));
      main_weight_groups.push_back(TorchValue::list(std::move(main_weights)));
    }
    TorchValue torch_state = TorchValue::dict();
    if (!distributed || common_) torch_state.set("state", std::move(state));
    torch_state.set("param_groups", TorchValue::list(std::move(groups)));
    if (!mixed_precision && (!distributed || common_)) return torch_state;
    TorchValue wrapped = TorchValue::dict();
    wrapped.set("optimizer", std::move(torch_state));
    if (saved.contains("grad_scaler")) {
      const nlohmann::json& scaler = saved.at("grad_scaler");
      const float scale = scaler.at("scale").get<float>();
      TorchValue grad_scaler = TorchValue::dict();
      grad_scaler.set("scale", TorchValue::tensor_from_floats(TorchDtype::float32, {1},
                                                              std::span<const float>(&scale, 1)));
      grad_scaler.set("growth_tracker", from_json(scaler.at("growth_tracker")));
      grad_scaler.set("hysteresis_tracker", from_json(scaler.at("hysteresis_tracker")));
      wrapped.set("grad_scaler", std::move(grad_scaler));
    }
    if (!distributed) {
      wrapped.set("fp32_from_fp16_params", TorchValue::list(std::move(main_weight_groups)));
    }
    return wrapped;
  }

 public:
  // distrib_optim.pt's dict (get_parameter_state_dp_zero's) of the parameters root() wrote.
  TorchValue parameter_state() const {
    const nlohmann::json& args = contents_.args;
    const bool tied = !args.value("untie_embeddings_and_output_weights", false);
    const MegatronBucketing bucketing{
        .overlap_grad_reduce = args.value("overlap_grad_reduce", false),
        .overlap_param_gather_with_optimizer_step =
            args.value("overlap_param_gather_with_optimizer_step", false),
        .ddp_bucket_size = json_integer(args, "ddp_bucket_size"),
        .ddp_num_buckets = json_integer(args, "ddp_num_buckets"),
        .data_parallel_size = std::max<int64_t>(json_integer(args, "data_parallel_size"), 1) *
                              std::max<int64_t>(json_integer(args, "context_parallel_size"), 1),
        .tied_across_stages = tied && !(contents_.first_stage && contents_.last_stage)};
    std::vector<MegatronBufferParameter> in_buffers;
    for (const WrittenParameter& parameter : parameters_) {
      in_buffers.push_back({parameter.tensor->name,
                            static_cast<int64_t>(parameter.tensor->data.size()), parameter.chunk});
    }
    const MegatronGradBuffers buffers = megatron_grad_buffers(in_buffers, bucketing);
    // Megatron accumulates and reduces a bf16 run's gradients in fp32 (arguments.py), an fp16
    // run's in fp16 unless --accumulate-allreduce-grads-in-fp32.
    const TorchDtype grad_dtype = contents_.precision == MixedPrecision::fp16 &&
                                          !args.value("accumulate_allreduce_grads_in_fp32", false)
                                      ? TorchDtype::float16
                                      : TorchDtype::float32;
    TorchValue root = TorchValue::dict();
    root.set("buckets_coalesced", TorchValue::boolean(true));
    for (size_t chunk = 0; chunk < buffers.numel.size(); ++chunk) {
      TorchValue world = TorchValue::dict();
      const auto numel = static_cast<size_t>(buffers.numel[chunk]);
      for (const char* key : {"param", "exp_avg", "exp_avg_sq"}) {
        const std::string_view which = key;
        std::vector<float> values(numel, 0.0f);
        for (size_t p = 0; p < parameters_.size(); ++p) {
          if (parameters_[p].chunk != chunk) continue;
          const CheckpointTensor& tensor = *parameters_[p].tensor;
          const CheckpointTensor& source = which == "param" ? tensor
                                           : which == "exp_avg"
                                               ? require(kCheckpointExpAvgPrefix + tensor.name)
                                               : require(kCheckpointExpAvgSqPrefix + tensor.name);
          std::copy(source.data.begin(), source.data.end(), values.begin() + buffers.offsets[p]);
        }
        world.set(std::string(key),
                  TorchValue::tensor_from_floats(TorchDtype::float32, {static_cast<int64_t>(numel)},
                                                 values));
      }
      world.set("numel_unpadded", TorchValue::integer(buffers.numel[chunk]));
      TorchValue dtypes =
          TorchValue::tuple({TorchValue::dtype(model_dtype()), TorchValue::dtype(grad_dtype)});
      TorchValue buffer = TorchValue::dict();
      buffer.set(std::move(dtypes), std::move(world));
      root.set(static_cast<int64_t>(chunk), std::move(buffer));
    }
    return root;
  }

 private:
  // An integer argument, 0 when absent or None.
  static int64_t json_integer(const nlohmann::json& args, const char* key) {
    const auto found = args.find(key);
    return found != args.end() && found->is_number_integer() ? found->get<int64_t>() : 0;
  }

  // OptimizerParamScheduler.state_dict() of this backend's schedule (checkpoint.cpp's).
  static TorchValue scheduler(const nlohmann::json& schedule) {
    constexpr std::pair<const char*, const char*> kKeys[] = {
        {"max_lr", "max_lr"},
        {"lr_warmup_steps", "warmup_steps"},
        {"num_steps", "num_steps"},
        {"lr_decay_style", "decay_style"},
        {"lr_decay_steps", "decay_steps"},
        {"min_lr", "min_lr"},
        {"start_wd", "start_weight_decay"},
        {"end_wd", "end_weight_decay"},
        {"wd_incr_style", "weight_decay_increment_style"},
        {"wd_incr_steps", "weight_decay_increment_steps"},
    };
    TorchValue dict = TorchValue::dict();
    for (const auto& [megatron, native] : kKeys) {
      // Megatron's step counts are ints (a warm-up given as a fraction of the decay is a float).
      const nlohmann::json& value = schedule.at(native);
      const bool whole = std::string_view(native) == "warmup_steps" && value.is_number_float() &&
                         std::trunc(value.get<double>()) == value.get<double>() &&
                         std::abs(value.get<double>()) < 0x1p53;
      dict.set(megatron, whole ? TorchValue::integer(static_cast<int64_t>(value.get<double>()))
                               : from_json(value));
    }
    return dict;
  }

  const MegatronRankFileContents& contents_;
  bool common_ = false;
  std::map<std::string, const CheckpointTensor*, std::less<>> by_name_;
  std::vector<WrittenParameter> parameters_;  // in the state dict's order, chunk by chunk
  size_t chunk_ = 0;                          // the chunk model_chunk is writing
};

}  // namespace

std::string megatron_layer_tensor_name(std::string_view native, MegatronModuleSpec spec) {
  const std::span<const LayerEntry> entries = spec == MegatronModuleSpec::local
                                                  ? std::span<const LayerEntry>(kLocalSpecLayer)
                                                  : kTransformerEngineSpecLayer;
  for (const LayerEntry& entry : entries) {
    if (entry.native != nullptr && native == entry.native) return std::string(entry.megatron);
  }
  common::fail("internal error: no Megatron name for the layer tensor '{}'", native);
}

void write_megatron_common_file(const std::filesystem::path& file,
                                const MegatronRankFileContents& contents) {
  if (contents.metadata == nullptr) {
    common::fail("internal error: a Megatron save without its metadata");
  }
  RankFileWriter writer(contents, true);
  write_torch_checkpoint(file, writer.root());
}

void write_megatron_rank_file(const std::filesystem::path& file,
                              const MegatronRankFileContents& contents) {
  if (contents.metadata == nullptr) {
    common::fail("internal error: a Megatron save without its metadata");
  }
  RankFileWriter writer(contents);
  // The tensors' spans (and the owned 16-bit copies) live until the file is written.
  const TorchValue root = writer.root();
  write_torch_checkpoint(file, root);
  if (contents.distributed_optimizer && contents.metadata->contains("optimizer")) {
    write_torch_checkpoint(file.parent_path() / kMegatronDistributedOptimizerFile,
                           writer.parameter_state());
  }
}

}  // namespace backend
