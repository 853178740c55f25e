// Megatron-LM's optimizer and scheduler state read into this backend's terms (the header says
// which of Megatron's structures, and how the parameters are matched).
#include "backend/ckpt/megatron_optimizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <map>

#include "backend/common/error.hpp"

namespace backend {

namespace {

class OptimizerReader {
 public:
  OptimizerReader(const MegatronRankFile& file) : file_(file) {}

  [[noreturn]] void fail(std::string_view what) const {
    common::fail("{}: its optimizer state {}", file_.path().string(), what);
  }

  // An int, a float or a one-element tensor (a step or a scale saved as a tensor).
  double number(const PickleValue& value, std::string_view what) const {
    if (value.kind == PickleKind::integer) return static_cast<double>(value.integer);
    if (value.kind == PickleKind::real) return value.real;
    if (TorchCheckpointFile::is_tensor(value)) {
      const TorchTensor tensor = file_.file().tensor(value, what);
      if (tensor.numel() == 1) return file_.file().tensor_values(tensor).front();
    }
    fail(fmt::format("has {} that is not a number", what));
  }

  const PickleValue& entry(const PickleValue& dict, std::string_view key, PickleKind kind,
                           std::string_view where) const {
    const PickleValue* value = dict.find(key);
    if (value == nullptr || value->kind != kind) {
      fail(fmt::format("has no {} '{}' in {}", kind == PickleKind::list ? "list" : "dict", key,
                       where));
    }
    return *value;
  }

  // A tensor of the parameter's shape, `what` naming it.
  TorchTensor tensor_like(const PickleValue* value, const MegatronParameter& parameter,
                          std::string_view what) const {
    if (value == nullptr || !TorchCheckpointFile::is_tensor(*value)) {
      fail(fmt::format("has no {} of parameter '{}'", what, parameter.megatron_name));
    }
    TorchTensor tensor = file_.file().tensor(*value, what);
    if (tensor.shape != parameter.tensor.shape) {
      fail(
          fmt::format("has a {} of parameter '{}' with {} elements in the shape [{}], where the "
                      "parameter's is [{}]",
                      what, parameter.megatron_name, tensor.numel(), fmt::join(tensor.shape, ", "),
                      fmt::join(parameter.tensor.shape, ", ")));
    }
    return tensor;
  }

 private:
  const MegatronRankFile& file_;
};

// Megatron's default no_weight_decay_cond: biases and 1-D parameters go without weight decay.
bool without_weight_decay(const MegatronParameter& parameter) {
  return parameter.megatron_name.ends_with(".bias") || parameter.tensor.shape.size() == 1;
}

// Whether a group is the one without weight decay: its wd_mult (Megatron since 2023), else its
// weight_decay.
bool group_without_weight_decay(const OptimizerReader& reader, const PickleValue& group,
                                size_t index) {
  for (const char* key : {"wd_mult", "weight_decay"}) {
    if (const PickleValue* value = group.find(key)) {
      return reader.number(*value, fmt::format("param group {}'s {}", index, key)) == 0.0;
    }
  }
  reader.fail(fmt::format("has param group {} with neither wd_mult nor weight_decay", index));
}

// The per-parameter state dict under an integer key, as torch's Optimizer.state_dict() numbers
// them (a later entry wins, as in a Python dict).
std::map<int64_t, const PickleValue*> states_by_index(const PickleValue& state) {
  std::map<int64_t, const PickleValue*> states;
  for (const auto& [key, value] : state.entries) {
    if (key != nullptr && key->kind == PickleKind::integer && value != nullptr) {
      states[key->integer] = value.get();
    }
  }
  return states;
}

// This backend's "optimizer" section: the step, Adam's constants from the args, and
// DynamicGradScaler's state (fp16; a constant scaler's is empty, bf16 runs have none).
nlohmann::json optimizer_metadata(const OptimizerReader& reader, const PickleValue& saved,
                                  std::optional<double> step, bool has_parameters,
                                  const MegatronArguments& args) {
  if (!step && has_parameters) reader.fail("has no step count (no group's or parameter's)");
  nlohmann::json metadata = {{"step", static_cast<int64_t>(step.value_or(0))},
                             {"adam_beta1", args.real_or("adam_beta1", 0.9)},
                             {"adam_beta2", args.real_or("adam_beta2", 0.999)},
                             {"adam_eps", args.real_or("adam_eps", 1e-8)},
                             {"weight_decay", args.real_or("weight_decay", 0.01)}};
  if (const PickleValue* scaler = saved.find("grad_scaler");
      scaler != nullptr && scaler->kind == PickleKind::dict && scaler->find("scale") != nullptr) {
    auto integer = [&](const char* key) {
      const PickleValue* value = scaler->find(key);
      return value == nullptr ? int64_t{0} : static_cast<int64_t>(reader.number(*value, key));
    };
    metadata["grad_scaler"] = {
        {"scale", reader.number(*scaler->find("scale"), "the grad scaler's scale")},
        {"growth_tracker", integer("growth_tracker")},
        {"hysteresis_tracker", integer("hysteresis_tracker")}};
  }
  return metadata;
}

// The grad buffer of model chunk `chunk` in distrib_optim.pt: {'param', 'exp_avg',
// 'exp_avg_sq', 'numel_unpadded'} under its one dtype key.
const PickleValue& chunk_buffer(const TorchCheckpointFile& state, size_t chunk) {
  const PickleValue* buffer = nullptr;
  for (const auto& [key, value] : state.root().entries) {
    if (key->kind == PickleKind::integer && key->integer == static_cast<int64_t>(chunk)) {
      buffer = value.get();
    }
  }
  if (buffer == nullptr || buffer->kind != PickleKind::dict) {
    common::fail("{}: it has no grad buffer of model chunk {} (a dict under the key {})",
                 state.source(), chunk, chunk);
  }
  if (buffer->entries.size() != 1 || buffer->entries.front().second->kind != PickleKind::dict) {
    common::fail(
        "{}: model chunk {}'s grad buffers are {} dtype groups, where a GPT's parameters make "
        "one",
        state.source(), chunk, buffer->entries.size());
  }
  return *buffer->entries.front().second;
}

// The distributed optimizer's state: the param groups of model_optim_rng.pt, the parameters and
// moments of distrib_optim.pt beside it.
MegatronOptimizerRead read_distributed_optimizer(const OptimizerReader& reader,
                                                 const MegatronRankFile& file,
                                                 const PickleValue& saved,
                                                 const PickleValue& torch_state,
                                                 std::span<const MegatronParameter> parameters,
                                                 const MegatronArguments& args) {
  const PickleValue& groups =
      reader.entry(torch_state, "param_groups", PickleKind::list, "'optimizer'");
  std::optional<double> step;
  bool class_seen[2] = {false, false};
  for (size_t g = 0; g < groups.items.size(); ++g) {
    const PickleValue& group = *groups.items[g];
    if (group.kind != PickleKind::dict) reader.fail(fmt::format("param group {} is not a dict", g));
    const int no_decay = group_without_weight_decay(reader, group, g) ? 1 : 0;
    if (class_seen[no_decay]) {
      reader.fail(fmt::format(
          "has a second param group {} weight decay (group {}): groups split otherwise than "
          "by weight decay (--decoupled-lr, per-parameter overrides) are not read",
          no_decay ? "without" : "with", g));
    }
    class_seen[no_decay] = true;
    if (const PickleValue* group_step = group.find("step")) {
      step = reader.number(*group_step, fmt::format("param group {}'s step", g));
    }
  }

  const std::filesystem::path path = file.path().parent_path() / kMegatronDistributedOptimizerFile;
  if (!std::filesystem::exists(path)) {
    reader.fail(fmt::format(
        "is the distributed optimizer's, whose parameters and moments are in {}, which is "
        "missing",
        path.string()));
  }
  auto state = std::make_shared<const TorchCheckpointFile>(path);
  if (state->root().kind != PickleKind::dict) common::fail("{}: it is not a dict", path.string());
  if (const PickleValue* coalesced = state->root().find("buckets_coalesced");
      coalesced == nullptr || coalesced->kind != PickleKind::boolean || !coalesced->boolean) {
    common::fail(
        "{}: it is in the distributed optimizer's format of before February 2024 (a tensor per "
        "bucket, no 'buckets_coalesced'), which is not read; Megatron-LM updates it with "
        "--ckpt-convert-update-legacy-dist-opt-format",
        path.string());
  }

  const bool mixed_precision = args.boolean_or("bf16", false) || args.boolean_or("fp16", false);
  std::vector<MegatronBufferParameter> in_buffers;
  for (const MegatronParameter& parameter : parameters) {
    in_buffers.push_back({parameter.name, parameter.tensor.numel(), parameter.chunk});
  }
  const MegatronBucketing bucketing = megatron_bucketing(args);
  // The layout of today's Megatron (starts aligned to 64 elements), else of before mid-2024.
  const MegatronGradBuffers aligned = megatron_grad_buffers(in_buffers, bucketing, 64);
  const MegatronGradBuffers packed = megatron_grad_buffers(in_buffers, bucketing, 1);

  MegatronOptimizerState result;
  result.exp_avg.resize(parameters.size());
  result.exp_avg_sq.resize(parameters.size());
  if (mixed_precision) result.main_weights.resize(parameters.size());
  for (size_t chunk = 0; chunk < aligned.numel.size(); ++chunk) {  // one buffer per chunk
    const PickleValue& buffer = chunk_buffer(*state, chunk);
    const PickleValue* numel_unpadded = buffer.find("numel_unpadded");
    if (numel_unpadded == nullptr || numel_unpadded->kind != PickleKind::integer) {
      common::fail("{}: model chunk {}'s grad buffer has no integer 'numel_unpadded'",
                   path.string(), chunk);
    }
    const MegatronGradBuffers* layout = aligned.numel[chunk] == numel_unpadded->integer  ? &aligned
                                        : packed.numel[chunk] == numel_unpadded->integer ? &packed
                                                                                         : nullptr;
    if (layout == nullptr) {
      common::fail(
          "{}: model chunk {}'s grad buffer holds {} elements, where this checkpoint's model "
          "makes a buffer of {} (of {} without Megatron's 64-element alignment): it is of "
          "another model or another bucketing (--ddp-bucket-size, --overlap-grad-reduce)",
          path.string(), chunk, numel_unpadded->integer, aligned.numel[chunk], packed.numel[chunk]);
    }
    for (const char* key : {"param", "exp_avg", "exp_avg_sq"}) {
      const PickleValue* value = buffer.find(key);
      const std::string what = fmt::format("model chunk {}'s '{}'", chunk, key);
      if (value == nullptr || !TorchCheckpointFile::is_tensor(*value)) {
        common::fail("{}: it has no tensor {}", path.string(), what);
      }
      const TorchTensor world = state->tensor(*value, what);
      if (world.dtype != TorchDtype::float32 || world.shape.size() != 1 ||
          world.stride != std::vector<int64_t>{1} || world.numel() != numel_unpadded->integer) {
        common::fail("{}: {} is not a flat fp32 tensor of its {} elements", path.string(), what,
                     numel_unpadded->integer);
      }
      for (size_t p = 0; p < parameters.size(); ++p) {
        if (parameters[p].chunk != chunk) continue;
        TorchTensor slice = world;
        slice.shape = parameters[p].tensor.shape;
        slice.stride.assign(slice.shape.size(), 1);
        for (size_t d = slice.shape.size(); d > 1; --d) {
          slice.stride[d - 2] = slice.stride[d - 1] * slice.shape[d - 1];
        }
        slice.storage_offset += layout->offsets[p];
        std::string_view which = key;
        if (which == "exp_avg") {
          result.exp_avg[p] = std::move(slice);
        } else if (which == "exp_avg_sq") {
          result.exp_avg_sq[p] = std::move(slice);
        } else if (mixed_precision) {
          result.main_weights[p] = std::move(slice);
        }
      }
    }
  }
  result.metadata = optimizer_metadata(reader, saved, step, !parameters.empty(), args);
  result.parameter_state = std::move(state);
  return {.state = std::move(result), .not_read = ""};
}

}  // namespace

MegatronOptimizerRead read_megatron_optimizer(const MegatronRankFile& file,
                                              std::span<const MegatronParameter> parameters,
                                              const MegatronArguments& args) {
  const PickleValue* saved = file.file().root().find("optimizer");
  if (saved == nullptr || saved->kind == PickleKind::none) {
    return {.state = std::nullopt,
            .not_read = "it was saved without optimizer state (--no-save-optim)"};
  }
  if (saved->kind == PickleKind::list) {
    return {.state = std::nullopt,
            .not_read =
                "its optimizer is a chain of several (expert parallelism or per-group "
                "optimizers), whose state is not read yet"};
  }
  const OptimizerReader reader(file);
  if (saved->kind != PickleKind::dict) reader.fail("'optimizer' is not a dict");
  // Float16OptimizerWithFloat16Params nests torch's state dict; FP32Optimizer's is it.
  const PickleValue* torch_state = saved->find("optimizer");
  const bool mixed_precision = torch_state != nullptr;
  if (!mixed_precision) torch_state = saved;
  if (torch_state->kind != PickleKind::dict) reader.fail("'optimizer' is not a dict");
  if (torch_state->find("state") == nullptr) {
    return read_distributed_optimizer(reader, file, *saved, *torch_state, parameters, args);
  }
  const PickleValue& state = reader.entry(*torch_state, "state", PickleKind::dict, "'optimizer'");
  const PickleValue& groups =
      reader.entry(*torch_state, "param_groups", PickleKind::list, "'optimizer'");
  const std::map<int64_t, const PickleValue*> states = states_by_index(state);

  // The parameters of each weight-decay class, in the model's order.
  std::deque<size_t> of_class[2];
  for (size_t p = 0; p < parameters.size(); ++p) {
    of_class[without_weight_decay(parameters[p]) ? 1 : 0].push_back(p);
  }
  const size_t class_size[2] = {of_class[0].size(), of_class[1].size()};
  const PickleValue* main_groups = nullptr;
  if (mixed_precision) {
    main_groups = &reader.entry(*saved, "fp32_from_fp16_params", PickleKind::list, "'optimizer'");
    if (main_groups->items.size() != groups.items.size()) {
      reader.fail(fmt::format("has {} groups of fp32 main weights for {} param groups",
                              main_groups->items.size(), groups.items.size()));
    }
  }

  MegatronOptimizerState result;
  result.exp_avg.resize(parameters.size());
  result.exp_avg_sq.resize(parameters.size());
  if (mixed_precision) result.main_weights.resize(parameters.size());
  std::vector<bool> assigned(parameters.size(), false);
  std::optional<double> step;
  bool class_seen[2] = {false, false};
  for (size_t g = 0; g < groups.items.size(); ++g) {
    const PickleValue& group = *groups.items[g];
    if (group.kind != PickleKind::dict) reader.fail(fmt::format("param group {} is not a dict", g));
    const int no_decay = group_without_weight_decay(reader, group, g) ? 1 : 0;
    const PickleValue& indices =
        reader.entry(group, "params", PickleKind::list, fmt::format("param group {}", g));
    if (class_seen[no_decay] || indices.items.size() != class_size[no_decay]) {
      reader.fail(fmt::format(
          "has param group {} {} weight decay holding {} parameters, but the model has {} "
          "{} weight decay (biases and 1-D parameters go without) in one group: groups split "
          "otherwise (--decoupled-lr, per-parameter overrides) are not read",
          g, no_decay ? "without" : "with", indices.items.size(), class_size[no_decay],
          no_decay ? "without" : "with"));
    }
    class_seen[no_decay] = true;
    if (const PickleValue* group_step = group.find("step")) {  // apex's and TE's FusedAdam
      step = reader.number(*group_step, fmt::format("param group {}'s step", g));
    }
    for (size_t j = 0; j < indices.items.size(); ++j) {
      const size_t p = of_class[no_decay].front();
      of_class[no_decay].pop_front();
      const MegatronParameter& parameter = parameters[p];
      const PickleValue& index = *indices.items[j];
      if (index.kind != PickleKind::integer) {
        reader.fail(fmt::format("has a non-integer parameter index in param group {}", g));
      }
      const auto found = states.find(index.integer);
      if (found == states.end() || found->second->kind != PickleKind::dict) {
        reader.fail(fmt::format("has no Adam state for parameter '{}' (index {})",
                                parameter.megatron_name, index.integer));
      }
      const PickleValue& moments = *found->second;
      result.exp_avg[p] = reader.tensor_like(moments.find("exp_avg"), parameter, "exp_avg");
      result.exp_avg_sq[p] =
          reader.tensor_like(moments.find("exp_avg_sq"), parameter, "exp_avg_sq");
      if (const PickleValue* own_step = moments.find("step"); own_step != nullptr && !step) {
        step = reader.number(*own_step, "a parameter's step");  // torch's Adam
      }
      if (mixed_precision) {
        const PickleValue& main_group = *main_groups->items[g];
        if (main_group.kind != PickleKind::list ||
            main_group.items.size() != indices.items.size()) {
          reader.fail(
              fmt::format("has fp32 main weights for group {} that do not match its {} "
                          "parameters",
                          g, indices.items.size()));
        }
        result.main_weights[p] =
            reader.tensor_like(main_group.items[j].get(), parameter, "fp32 main weight");
      }
      assigned[p] = true;
    }
  }
  for (size_t p = 0; p < parameters.size(); ++p) {
    if (!assigned[p]) {
      reader.fail(
          fmt::format("has no param group holding parameter '{}'", parameters[p].megatron_name));
    }
  }
  result.metadata = optimizer_metadata(reader, *saved, step, !parameters.empty(), args);
  return {.state = std::move(result), .not_read = ""};
}

nlohmann::json megatron_common_optimizer_metadata(const MegatronRankFile& common,
                                                  const MegatronArguments& args,
                                                  int64_t fallback_step) {
  const OptimizerReader reader(common);
  const PickleValue* saved = common.file().root().find("optimizer");
  if (saved == nullptr || saved->kind != PickleKind::dict) reader.fail("'optimizer' is not a dict");
  // Float16OptimizerWithFloat16Params nests torch's state dict; FP32Optimizer's is it.
  const PickleValue* torch_state = saved->find("optimizer");
  if (torch_state == nullptr) torch_state = saved;
  if (torch_state->kind != PickleKind::dict) reader.fail("'optimizer' is not a dict");
  std::optional<double> step;
  if (const PickleValue* state = torch_state->find("state");
      state != nullptr && state->kind == PickleKind::dict) {
    if (const PickleValue* common_step = state->find("common_step")) {
      step = reader.number(*common_step, "the common step");
    }
    for (const auto& [index, value] : state->entries) {
      if (step) break;
      if (value == nullptr || value->kind != PickleKind::dict) continue;
      if (const PickleValue* own = value->find("step")) step = reader.number(*own, "a step");
    }
  }
  if (const PickleValue* groups = torch_state->find("param_groups");
      !step && groups != nullptr && groups->kind == PickleKind::list) {
    for (const PicklePointer& group : groups->items) {
      if (group->kind != PickleKind::dict) continue;
      if (const PickleValue* own = group->find("step")) {
        step = reader.number(*own, "a param group's step");
        break;
      }
    }
  }
  return optimizer_metadata(reader, *saved, step.value_or(static_cast<double>(fallback_step)), true,
                            args);
}

MegatronBucketing megatron_bucketing(const MegatronArguments& args) {
  return {.overlap_grad_reduce = args.boolean_or("overlap_grad_reduce", false),
          .overlap_param_gather_with_optimizer_step =
              args.boolean_or("overlap_param_gather_with_optimizer_step", false),
          .ddp_bucket_size = args.integer_or("ddp_bucket_size", 0),
          .ddp_num_buckets = args.integer_or("ddp_num_buckets", 0),
          .data_parallel_size = args.integer_or("data_parallel_size", 1) *
                                args.integer_or("context_parallel_size", 1),
          .tied_across_stages = !args.boolean_or("untie_embeddings_and_output_weights", false) &&
                                args.integer_or("pipeline_model_parallel_size", 1) > 1};
}

// Megatron's DistributedOptimizer._compute_per_buffer_param_layout, with the buckets' end
// padding left out as get_parameter_state_dp_zero leaves it out. Positions are kept relative to
// the open bucket's start: buckets start at multiples of lcm(dp, 128), so a start aligned within
// its bucket is aligned in the buffer.
MegatronGradBuffers megatron_grad_buffers(std::span<const MegatronBufferParameter> parameters,
                                          const MegatronBucketing& bucketing, int64_t alignment) {
  size_t chunks = 0;
  int64_t stage_numel = 0;
  for (const MegatronBufferParameter& parameter : parameters) {
    chunks = std::max(chunks, parameter.chunk + 1);
    stage_numel += parameter.numel;
  }
  // training.py's resolve_ddp_bucket_size; the first stage's first chunk alone has buckets.
  int64_t bucket_size = 0;  // 0: one bucket
  if (bucketing.overlap_grad_reduce && !bucketing.overlap_param_gather_with_optimizer_step) {
    bucket_size = bucketing.ddp_num_buckets > 0 ? stage_numel / bucketing.ddp_num_buckets
                  : bucketing.ddp_bucket_size > 0
                      ? bucketing.ddp_bucket_size
                      : std::max<int64_t>(40'000'000, 1'000'000 * bucketing.data_parallel_size);
  }
  MegatronGradBuffers buffers;
  buffers.offsets.assign(parameters.size(), 0);
  buffers.numel.assign(chunks, 0);
  for (size_t chunk = 0; chunk < chunks; ++chunk) {
    bool first_chunk_of_pipeline = false;
    for (const MegatronBufferParameter& parameter : parameters) {
      first_chunk_of_pipeline |=
          parameter.chunk == chunk && parameter.name == "embedding.word_embeddings.weight";
    }
    const int64_t chunk_bucket_size = first_chunk_of_pipeline ? bucket_size : 0;
    int64_t& numel = buffers.numel[chunk];  // of the buckets closed
    int64_t position = 0;                   // in the open bucket
    bool bucket_open = false;
    auto close_bucket = [&](int64_t end) {
      numel += end;
      position = 0;
      bucket_open = false;
    };
    for (size_t remaining = parameters.size(); remaining > 0; --remaining) {  // backprop order
      const size_t i = remaining - 1;
      const MegatronBufferParameter& parameter = parameters[i];
      if (parameter.chunk != chunk) continue;
      const bool shared =
          bucketing.tied_across_stages && (parameter.name == "embedding.word_embeddings.weight" ||
                                           parameter.name == "output_layer.weight");
      position = (position + alignment - 1) / alignment * alignment;
      if (shared && bucket_open) close_bucket(position);
      buffers.offsets[i] = numel + position;
      const int64_t end = position + parameter.numel;
      bucket_open = true;
      if ((chunk_bucket_size > 0 && end >= chunk_bucket_size) || shared) {
        close_bucket(end);
      } else {
        position = end;
      }
    }
    if (bucket_open) numel += position;
  }
  return buffers;
}

std::optional<nlohmann::json> read_megatron_scheduler(const MegatronRankFile& file,
                                                      const MegatronArguments& args) {
  const PickleValue* saved = file.file().root().find("opt_param_scheduler");
  if (saved == nullptr || saved->kind == PickleKind::none) return std::nullopt;
  const std::string source = file.path().string();
  if (saved->kind != PickleKind::dict)
    common::fail("{}: 'opt_param_scheduler' is not a dict", source);
  // The first of `keys` present (the current name, then the older ones load_state_dict reads).
  auto value = [&](std::initializer_list<const char*> keys) -> const PickleValue& {
    for (const char* key : keys) {
      if (const PickleValue* found = saved->find(key)) return *found;
    }
    common::fail("{}: 'opt_param_scheduler' has no '{}'", source, *keys.begin());
  };
  auto number = [&](std::initializer_list<const char*> keys) {
    const PickleValue& found = value(keys);
    if (found.kind == PickleKind::integer) return static_cast<double>(found.integer);
    if (found.kind != PickleKind::real) {
      common::fail("{}: 'opt_param_scheduler''s '{}' is not a number", source, *keys.begin());
    }
    return found.real;
  };
  auto integer = [&](std::initializer_list<const char*> keys) {
    return static_cast<int64_t>(number(keys));
  };
  auto text = [&](std::initializer_list<const char*> keys) {
    const PickleValue& found = value(keys);
    if (found.kind != PickleKind::text) {
      common::fail("{}: 'opt_param_scheduler''s '{}' is not a string", source, *keys.begin());
    }
    return found.text;
  };
  // Megatron's training.py: the WSD anneal in samples, from iterations × the global batch.
  int64_t wsd_decay_steps = -1;
  if (args.has("lr_wsd_decay_iters")) {
    wsd_decay_steps = args.integer("lr_wsd_decay_iters") * args.integer("global_batch_size");
  } else if (args.has("lr_wsd_decay_samples")) {
    wsd_decay_steps = args.integer("lr_wsd_decay_samples");
  }
  const double weight_decay = args.real_or("weight_decay", 0.01);
  const bool has_weight_decay_schedule = saved->find("start_wd") != nullptr;
  return nlohmann::json{
      {"max_lr", number({"max_lr", "start_lr"})},
      {"min_lr", number({"min_lr"})},
      {"init_lr", args.real_or("lr_warmup_init", 0.0)},
      {"warmup_steps", number({"lr_warmup_steps", "warmup_iter", "warmup_steps"})},
      {"decay_steps", integer({"lr_decay_steps", "end_iter", "decay_steps"})},
      {"decay_style", text({"lr_decay_style", "decay_style"})},
      {"wsd_decay_steps", wsd_decay_steps},
      {"wsd_decay_style", args.text_or("lr_wsd_decay_style", "exponential")},
      {"start_weight_decay", has_weight_decay_schedule ? number({"start_wd"}) : weight_decay},
      {"end_weight_decay", has_weight_decay_schedule ? number({"end_wd"}) : weight_decay},
      {"weight_decay_increment_steps",
       has_weight_decay_schedule ? integer({"wd_incr_steps"}) : int64_t{1}},
      {"weight_decay_increment_style",
       has_weight_decay_schedule ? text({"wd_incr_style"}) : std::string("constant")},
      {"num_steps", integer({"num_steps"})}};
}

}  // namespace backend
