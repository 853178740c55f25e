// Megatron core's torch_dist checkpoints written; see megatron_dist_checkpoint_writer.hpp.
// Reference: Megatron-LM megatron/core/transformer/transformer_block.py (sharded_state_dict:
// the layer offset (0, layer, num_layers)), megatron/core/utils.py
// (make_sharded_tensors_for_checkpoint: the tensor-parallel axis of column- and row-parallel
// linears, replica 0 of the rest), megatron/core/transformer/mlp.py
// (apply_swiglu_sharded_factory), megatron/core/dist_checkpointing/core.py (metadata.json).
#include "backend/ckpt/megatron_dist_checkpoint_writer.hpp"

#include <fmt/format.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/megatron_dist_checkpoint.hpp"
#include "backend/ckpt/torch_distributed_checkpoint_writer.hpp"
#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace backend {

namespace {

std::string items_file_name(int64_t writer) {
  return fmt::format(".items_{}.json", writer);
}

// A tensor's key and, for a layer's, its layer (-1 otherwise).
std::pair<std::string, int64_t> megatron_dist_key(const std::string& name,
                                                  MegatronModuleSpec spec) {
  constexpr std::string_view kLayers = "decoder.layers.";
  if (!name.starts_with(kLayers)) return {name, -1};
  const size_t dot = name.find('.', kLayers.size());
  const int64_t layer = std::stoll(name.substr(kLayers.size(), dot - kLayers.size()));
  return {std::string(kLayers) + megatron_layer_tensor_name(name.substr(dot + 1), spec), layer};
}

}  // namespace

void write_megatron_dist_part(const fs::path& directory, int64_t writer,
                              const MegatronDistPart& part) {
  std::map<std::string, const CheckpointTensor*, std::less<>> by_name;
  for (const CheckpointTensor& tensor : part.tensors) by_name.emplace(tensor.name, &tensor);
  auto require = [&](const std::string& name) -> const CheckpointTensor& {
    const auto found = by_name.find(name);
    if (found == by_name.end())
      common::fail("internal error: a torch_dist save without '{}'", name);
    return *found->second;
  };
  const bool optimizer = part.metadata->contains("optimizer");
  const TorchDtype model_dtype = part.precision == MixedPrecision::bf16   ? TorchDtype::bfloat16
                                 : part.precision == MixedPrecision::fp16 ? TorchDtype::float16
                                                                          : TorchDtype::float32;
  // The stored tensors of one parameter: (key prefix, dtype, its values' name).
  std::vector<std::tuple<std::string, TorchDtype, std::string>> parts = {{"", model_dtype, ""}};
  if (optimizer) {
    parts.emplace_back("optimizer.state.exp_avg.", TorchDtype::float32, kCheckpointExpAvgPrefix);
    parts.emplace_back("optimizer.state.exp_avg_sq.", TorchDtype::float32,
                       kCheckpointExpAvgSqPrefix);
    if (part.precision != MixedPrecision::none) {
      parts.emplace_back("optimizer.state.fp32_param.", TorchDtype::float32, "");
    }
  }
  DistributedCheckpointFileWriter file(directory, writer);
  for (const ParameterTensor& tensor : part.layout) {
    // The last stage's tied embedding is the first stage's replica; a replicated tensor is
    // saved by tensor-parallel rank 0 (replica_id 0).
    if (tensor.tied_copy) continue;
    if (tensor.partition == TensorPartition::replicated && part.tensor_parallel_rank != 0) continue;
    const auto [key, layer] = megatron_dist_key(tensor.name, part.spec);
    std::vector<int64_t> size = tensor.full_shape;
    if (layer >= 0) size.insert(size.begin(), part.num_layers);
    const std::vector<ShardBox> boxes = shard_boxes(tensor, part.tensor_parallel_rank);
    for (const auto& [prefix, dtype, values_prefix] : parts) {
      const CheckpointTensor& values = require(values_prefix + tensor.name);
      for (const ShardBox& box : boxes) {
        std::vector<int64_t> offsets = box.offsets, sizes = box.sizes;
        if (layer >= 0) {
          offsets.insert(offsets.begin(), layer);
          sizes.insert(sizes.begin(), 1);
        }
        int64_t numel = 1;
        for (const int64_t s : box.sizes) numel *= s;
        file.add_chunk(
            prefix + key, dtype, size, std::move(offsets), std::move(sizes),
            values.data.subspan(static_cast<size_t>(box.shard_offset), static_cast<size_t>(numel)));
      }
    }
  }
  const std::vector<DistributedCheckpointItem> items = file.finish();
  common::DurableFileWriter list(directory / items_file_name(writer));
  const std::string text = distributed_items_json(items).dump();
  list.write(std::as_bytes(std::span(text.data(), text.size())));
  list.finish();
}

void finish_megatron_dist_checkpoint(const fs::path& directory, int64_t writers,
                                     const MegatronRankFileContents& common) {
  std::vector<DistributedCheckpointItem> items;
  for (int64_t writer = 0; writer < writers; ++writer) {
    const fs::path list = directory / items_file_name(writer);
    const std::vector<DistributedCheckpointItem> written = distributed_items_from_json(
        json::parse(common::read_small_file(list, "torch_dist save's item list"), nullptr, false),
        list.string());
    items.insert(items.end(), written.begin(), written.end());
  }
  write_distributed_checkpoint_metadata(directory, items);
  write_megatron_common_file(directory / kMegatronCommonFile, common);
  const std::string config = json{
      {"sharded_backend", "torch_dist"},
      {"sharded_backend_version", 1},
      {"common_backend", "torch"},
      {"common_backend_version",
       1}}.dump();
  common::DurableFileWriter file(directory / kMegatronDistConfigFile);
  file.write(std::as_bytes(std::span(config.data(), config.size())));
  file.finish();
  for (int64_t writer = 0; writer < writers; ++writer) {
    fs::remove(directory / items_file_name(writer));
  }
}

}  // namespace backend
