// Megatron core's torch_dist checkpoints read at any layout; see megatron_dist_checkpoint.hpp.
// Reference: Megatron-LM megatron/core/dist_checkpointing (serialization.py: load and
// load_common_state_dict; strategies/torch.py: sharded_tensor_to_torch_sharded_tensor, the
// prepended layer axis), megatron/core/transformer/transformer_block.py (sharded_state_dict: the
// stacked decoder.layers.* keys), megatron/core/optimizer/optimizer.py (sharded_state_dict:
// optimizer.state.<state key>.<parameter key>).
#include "backend/ckpt/megatron_dist_checkpoint.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_record.hpp"
#include "backend/ckpt/megatron_optimizer.hpp"
#include "backend/ckpt/torch_distributed_checkpoint.hpp"
#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/model/parameter_layout.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace backend {

namespace {

constexpr const char* kTiedWordEmbeddings = "embedding.word_embeddings.weight";

// Which of a parameter's tensors: the model's, its fp32 main weight, Adam's two moments.
enum Part : size_t { model_part, main_weight_part, exp_avg_part, exp_avg_sq_part, part_count };

// The optimizer's keys, optimizer.state.<state key>.<parameter key>.
constexpr std::pair<std::string_view, Part> kOptimizerPrefixes[] = {
    {"optimizer.state.exp_avg.", exp_avg_part},
    {"optimizer.state.exp_avg_sq.", exp_avg_sq_part},
    {"optimizer.state.fp32_param.", main_weight_part}};

// Where a tensor of this backend is in the checkpoint: the key, and its layer on the stacked
// first axis (-1: the key is the tensor itself).
struct StoredTensor {
  std::string key;
  int64_t layer = -1;
};

// The checkpoint as every rank's view reads it.
struct DistributedState {
  MegatronCheckpointLayout layout;
  std::unique_ptr<MegatronRankFile> common;
  MegatronCommon shared;
  GptConfig config;  // the whole model, its vocabulary padded as saved
  std::unique_ptr<DistributedCheckpoint> checkpoint;
  std::map<std::string, std::array<std::optional<StoredTensor>, part_count>> stored;
  std::string optimizer_not_read;  // empty: the optimizer's state is read
  bool main_weights = false;       // the fp32 main weights are stored (a bf16 or fp16 run)
  json optimizer, scheduler;
};

std::shared_ptr<const DistributedState> open_distributed_state(
    const MegatronCheckpointLayout& layout) {
  auto state = std::make_shared<DistributedState>();
  state->layout = layout;
  state->common = std::make_unique<MegatronRankFile>(layout.rank_file(0, 0));
  const MegatronRankFile& common = *state->common;
  const std::string common_name = common.path().string();
  state->shared = read_megatron_common(layout, common);
  state->shared.metadata["format"] = "megatron-lm torch_dist checkpoint";
  if (!layout.release && common.iteration() != layout.iteration) {
    common::fail("{} holds iteration {}, but the tracker {} says {}", common_name,
                 common.iteration(), checkpoint_tracker_path(layout.directory).string(),
                 layout.iteration);
  }
  if (common.checkpoint_version() < 2.0) {
    common::fail(
        "{}: checkpoint_version {} is older than 2.0, whose query/key/value rows are "
        "ordered otherwise",
        common_name, common.checkpoint_version());
  }
  const CheckpointModelRecord& record = state->shared.record;
  state->config = model_config(record);
  if (state->config.padded_vocab_size != state->shared.padded_vocab_size) {
    common::fail(
        "{}: its args.padded_vocab_size is {}, but its tokenizer ({} tokens) padded to "
        "--make-vocab-size-divisible-by {} × --tensor-model-parallel-size {} gives {}",
        common_name, state->shared.padded_vocab_size, state->config.vocab_size,
        record.model.make_vocab_size_divisible_by, layout.tensor_parallel,
        state->config.padded_vocab_size);
  }
  state->checkpoint = std::make_unique<DistributedCheckpoint>(layout.iteration_directory);
  const DistributedCheckpoint& checkpoint = *state->checkpoint;
  const std::string source =
      (layout.iteration_directory / kDistributedCheckpointMetadataFile).string();

  // Every tensor by this backend's name, checked against the whole model's layout.
  const ParameterLayout whole(state->config);
  std::map<std::string, const ParameterTensor*> model_tensors;
  for (const ParameterTensor& tensor : whole.tensors()) model_tensors[tensor.name] = &tensor;
  const int64_t num_layers = record.model.num_layers;
  std::string unread_optimizer_key;
  for (const auto& item : checkpoint.tensors()) {
    const std::string& key = item.first;
    const DistributedCheckpointTensor& tensor = item.second;
    Part part = model_part;
    std::string_view model_key = key;
    if (model_key.starts_with("optimizer.")) {
      bool known = false;
      for (const auto& [prefix, prefix_part] : kOptimizerPrefixes) {
        if (model_key.starts_with(prefix)) {
          model_key.remove_prefix(prefix.size());
          part = prefix_part;
          known = true;
          break;
        }
      }
      if (!known) {
        if (unread_optimizer_key.empty()) unread_optimizer_key = key;
        continue;
      }
    }
    auto add = [&](const std::string& megatron_name, int64_t layer) {
      const std::optional<std::string> name = megatron_tensor_name(megatron_name, 0, source);
      if (!name) return;
      const auto found = model_tensors.find(*name);
      if (found == model_tensors.end()) {
        common::fail(
            "{}: it holds '{}' (this backend's '{}'), which the model its args ({}) "
            "describe does not have",
            source, key, *name, common_name);
      }
      std::vector<int64_t> expected = found->second->full_shape;
      if (layer >= 0) expected.insert(expected.begin(), num_layers);
      if (tensor.size != expected) {
        common::fail("{}: '{}' has the shape [{}], where the model its args describe has [{}]",
                     source, key, fmt::join(tensor.size, ", "), fmt::join(expected, ", "));
      }
      auto& slot = state->stored[*name][part];
      if (slot) {
        common::fail("{}: '{}' and '{}' are both this backend's '{}'", source, slot->key, key,
                     *name);
      }
      slot = StoredTensor{.key = key, .layer = layer};
    };
    // decoder.layers.<name>: the layers stacked on the first axis; decoder.layers.<N>.<name>:
    // one layer's.
    constexpr std::string_view kLayers = "decoder.layers.";
    if (model_key.starts_with(kLayers) && model_key.size() > kLayers.size() &&
        std::isdigit(static_cast<unsigned char>(model_key[kLayers.size()])) == 0) {
      const std::string_view rest = model_key.substr(kLayers.size());
      for (int64_t layer = 0; layer < num_layers; ++layer) {
        add(fmt::format("{}{}.{}", kLayers, layer, rest), layer);
      }
    } else {
      add(std::string(model_key), -1);
    }
  }

  // The optimizer's state: read when every parameter has both moments and the common state
  // the step and the scheduler.
  const PickleValue* saved_optimizer = common.file().root().find("optimizer");
  const MegatronArguments args = common.arguments();
  const std::optional<json> scheduler = read_megatron_scheduler(common, args);
  if (saved_optimizer == nullptr || saved_optimizer->kind == PickleKind::none) {
    state->optimizer_not_read = "it was saved without optimizer state (--no-save-optim)";
  } else if (!unread_optimizer_key.empty()) {
    state->optimizer_not_read = fmt::format(
        "its optimizer state is stored as '{}' and the like (the distributed optimizer's "
        "dp_zero_gather_scatter or dp_reshardable form), which is not read yet; the "
        "fully_sharded_model_space form (--dist-ckpt-optim-fully-reshardable) and the "
        "non-distributed optimizer's are",
        unread_optimizer_key);
  } else if (!scheduler) {
    state->optimizer_not_read = "it has no 'opt_param_scheduler'";
  } else {
    bool any_main = false, all_main = true;
    for (const ParameterTensor& tensor : whole.tensors()) {
      const auto found = state->stored.find(tensor.name);
      const bool has = found != state->stored.end();
      for (const Part part : {exp_avg_part, exp_avg_sq_part}) {
        if ((!has || !found->second[part]) && state->optimizer_not_read.empty()) {
          state->optimizer_not_read = fmt::format(
              "it has no {} of '{}'",
              part == exp_avg_part ? "optimizer.state.exp_avg" : "optimizer.state.exp_avg_sq",
              tensor.name);
        }
      }
      const bool main = has && found->second[main_weight_part].has_value();
      any_main = any_main || main;
      all_main = all_main && main;
    }
    if (any_main && !all_main && state->optimizer_not_read.empty()) {
      state->optimizer_not_read =
          "it holds the fp32 main weights (optimizer.state.fp32_param) of some parameters only";
    }
    if (state->optimizer_not_read.empty()) {
      state->main_weights = all_main;
      state->optimizer = megatron_common_optimizer_metadata(common, args, common.iteration());
      state->scheduler = *scheduler;
    }
  }
  return state;
}

class MegatronDistShardFile final : public ShardFile {
 public:
  MegatronDistShardFile(std::shared_ptr<const DistributedState> state, int64_t tensor_parallel,
                        int64_t rank, const PipelineStage& stage)
      : state_(std::move(state)),
        layout_(state_->config, tensor_parallel, rank, stage),
        path_(state_->layout.iteration_directory) {
    const DistributedState& s = *state_;
    metadata_ = s.shared.metadata;
    metadata_["tensor_parallel"] = {{"size", tensor_parallel}, {"rank", rank}};
    metadata_["pipeline_parallel"] = {{"size", stage.pipeline_parallel}, {"rank", stage.rank}};
    CheckpointModelRecord record = s.shared.record;
    const int64_t num_layers = record.model.num_layers;
    record.parallelism.tensor_model_parallel_size = tensor_parallel;
    record.parallelism.pipeline_model_parallel_size = stage.pipeline_parallel;
    record.parallelism.num_layers_per_virtual_pipeline_stage =
        stage.virtual_chunks > 1 ? num_layers / (stage.pipeline_parallel * stage.virtual_chunks)
                                 : 0;
    json arguments = metadata_["arguments"];
    record_model(record, arguments);
    metadata_["arguments"] = arguments;
    read_native_dropout_state(*s.common, metadata_);
    metadata_["rng_not_read"] =
        "Megatron's RNG states (Python's, NumPy's, torch's and the CUDA tracker's generators) "
        "do not map to this backend's dropout masks, which come from --seed and the step";
    const bool optimizer = s.optimizer_not_read.empty();
    if (optimizer) {
      metadata_["no_save_optim"] = false;
      metadata_["optimizer"] = s.optimizer;
      metadata_["opt_param_scheduler"] = s.scheduler;
    } else {
      metadata_["optimizer_not_read"] = s.optimizer_not_read;
    }
    // The parameters the checkpoint stores, in the layout's order, then each one's two moments.
    std::vector<std::pair<std::string, Entry>> moments;
    for (size_t t = 0; t < layout_.tensors().size(); ++t) {
      const std::string& name = layout_.tensors()[t].name;
      if (stored(layout_.tensors()[t], model_part) == nullptr) continue;
      index_.emplace(name, Entry{t, model_part});
      names_.push_back(name);
      if (!optimizer) continue;
      moments.emplace_back(kCheckpointExpAvgPrefix + name, Entry{t, exp_avg_part});
      moments.emplace_back(kCheckpointExpAvgSqPrefix + name, Entry{t, exp_avg_sq_part});
    }
    for (auto& [name, entry] : moments) {
      index_.emplace(name, entry);
      names_.push_back(std::move(name));
    }
  }

  const fs::path& path() const override { return path_; }
  const json& metadata() const override { return metadata_; }
  std::vector<std::string> tensor_names() const override { return names_; }
  const std::vector<int64_t>* shape(const std::string& name) const override {
    const auto found = index_.find(name);
    return found == index_.end() ? nullptr : &layout_.tensors()[found->second.tensor].shape;
  }

  // This rank's boxes of the tensor (shard_boxes; within a layer's slice of a stacked one),
  // each read from the chunks it meets into its place in the shard.
  void read(const std::string& name, std::span<float> destination) const override {
    const Entry& entry = index_.at(name);
    const ParameterTensor& tensor = layout_.tensors()[entry.tensor];
    const Part part =
        entry.part == model_part && state_->main_weights ? main_weight_part : entry.part;
    const StoredTensor* stored_tensor = stored(tensor, part);
    if (stored_tensor == nullptr || destination.size() != static_cast<size_t>(tensor.numel)) {
      throw std::logic_error(fmt::format("reading '{}' of the torch_dist checkpoint", name));
    }
    for (ShardBox box : shard_boxes(tensor, layout_.tensor_parallel_rank())) {
      if (stored_tensor->layer >= 0) {
        box.offsets.insert(box.offsets.begin(), stored_tensor->layer);
        box.sizes.insert(box.sizes.begin(), 1);
      }
      const std::vector<float> values =
          state_->checkpoint->read(stored_tensor->key, box.offsets, box.sizes);
      std::copy(values.begin(), values.end(), destination.begin() + box.shard_offset);
    }
  }

 private:
  struct Entry {
    size_t tensor = 0;  // in layout_.tensors()
    Part part = model_part;
  };

  // Where `part` of `tensor` is stored (a tied copy's: the word embedding's); nullptr if not.
  const StoredTensor* stored(const ParameterTensor& tensor, Part part) const {
    const auto found = state_->stored.find(tensor.tied_copy ? kTiedWordEmbeddings : tensor.name);
    if (found == state_->stored.end() || !found->second[part]) return nullptr;
    return &*found->second[part];
  }

  std::shared_ptr<const DistributedState> state_;
  ParameterLayout layout_;
  fs::path path_;
  json metadata_;
  std::map<std::string, Entry> index_;
  std::vector<std::string> names_;
};

}  // namespace

bool is_megatron_dist_directory(const fs::path& iteration_directory) {
  std::error_code error;
  return fs::is_regular_file(iteration_directory / kMegatronDistConfigFile, error);
}

void read_megatron_dist_layout(MegatronCheckpointLayout& layout) {
  const fs::path config_path = layout.iteration_directory / kMegatronDistConfigFile;
  const json config = json::parse(
      common::read_small_file(config_path, "Megatron checkpoint metadata"), nullptr, false);
  const std::string backend = config.is_object() && config.contains("sharded_backend") &&
                                      config["sharded_backend"].is_string()
                                  ? config["sharded_backend"].get<std::string>()
                                  : std::string();
  if (backend.empty()) {
    common::fail(
        "{}: not a Megatron distributed checkpoint's metadata (a JSON object with a "
        "'sharded_backend')",
        config_path.string());
  }
  if (backend != "torch_dist") {
    common::fail(
        "{}: the checkpoint's sharded_backend is '{}'; of Megatron core's distributed "
        "formats only torch_dist is read (Megatron converts others with "
        "--ckpt-convert-format torch_dist)",
        config_path.string(), backend);
  }
  const fs::path common_path = layout.iteration_directory / kMegatronCommonFile;
  std::error_code error;
  if (!fs::is_regular_file(common_path, error)) {
    const bool inside =
        fs::is_regular_file(layout.iteration_directory / kDistributedCheckpointMetadataFile, error);
    common::fail("{}: {}", layout.iteration_directory.string(),
                 inside ? "it keeps its common state (args, iteration, optimizer groups) inside "
                          "the distributed checkpoint as Megatron core 0.15's 'common_state' "
                          "object, which is not read yet (no common.pt)"
                        : "it has metadata.json but no common.pt: the checkpoint is incomplete");
  }
  const MegatronRankFile common(common_path);
  const MegatronArguments args = common.arguments();
  layout.distributed = true;
  layout.tensor_parallel = args.integer("tensor_model_parallel_size");
  layout.pipeline_parallel = args.integer("pipeline_model_parallel_size");
  if (layout.tensor_parallel < 1 || layout.pipeline_parallel < 1) {
    common::fail("{}: its args say tensor-parallel size {} and pipeline-parallel size {}",
                 common_path.string(), layout.tensor_parallel, layout.pipeline_parallel);
  }
}

std::unique_ptr<ShardFile> open_megatron_dist_shard_file(const MegatronCheckpointLayout& layout,
                                                         int64_t tensor_parallel, int64_t rank,
                                                         const PipelineStage& stage) {
  return std::make_unique<MegatronDistShardFile>(open_distributed_state(layout), tensor_parallel,
                                                 rank, stage);
}

namespace {

// Stage `stage` of the layout the checkpoint was saved with (its args' interleaving).
PipelineStage saved_stage(const DistributedState& state, int64_t stage) {
  const CheckpointModelRecord& record = state.shared.record;
  return {.pipeline_parallel = state.layout.pipeline_parallel,
          .rank = stage,
          .virtual_chunks = record.parallelism.virtual_pipeline_chunks(record.model.num_layers)};
}

}  // namespace

std::unique_ptr<ShardFile> open_megatron_dist_saved_shard_file(
    const MegatronCheckpointLayout& layout, int64_t tensor_parallel_rank, int64_t pipeline_rank) {
  const std::shared_ptr<const DistributedState> state = open_distributed_state(layout);
  return std::make_unique<MegatronDistShardFile>(
      state, layout.tensor_parallel, tensor_parallel_rank, saved_stage(*state, pipeline_rank));
}

MegatronShards open_megatron_dist_shards(const MegatronCheckpointLayout& layout) {
  const std::shared_ptr<const DistributedState> state = open_distributed_state(layout);
  MegatronShards shards;
  shards.layout = layout;
  shards.record = state->shared.record;
  shards.padded_vocab_size = state->shared.padded_vocab_size;
  shards.optimizer_not_read = state->optimizer_not_read;
  for (int64_t stage = 0; stage < layout.pipeline_parallel; ++stage) {
    for (int64_t rank = 0; rank < layout.tensor_parallel; ++rank) {
      shards.files.push_back(std::make_unique<MegatronDistShardFile>(
          state, layout.tensor_parallel, rank, saved_stage(*state, stage)));
    }
  }
  return shards;
}

}  // namespace backend
