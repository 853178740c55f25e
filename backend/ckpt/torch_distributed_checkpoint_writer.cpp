// PyTorch Distributed Checkpoint directories written; see torch_distributed_checkpoint_writer.hpp.
// Reference: torch/distributed/checkpoint/filesystem.py (_write_item: torch.save of each tensor
// at the file's current offset, FileSystemWriter.finish: storage_data and pickle.dump of the
// Metadata), metadata.py (the dataclasses, TensorProperties.__getstate__), default_planner.py
// (create_default_global_save_plan's planner_data).
#include "backend/ckpt/torch_distributed_checkpoint_writer.hpp"

#include <fmt/format.h>

#include <map>
#include <stdexcept>
#include <utility>

#include "backend/ckpt/torch_checkpoint_writer.hpp"
#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace backend {

namespace {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kFilesystemModule = "torch.distributed.checkpoint.filesystem";

TorchValue dcp_size(const std::vector<int64_t>& sizes) {
  std::vector<TorchValue> items;
  for (const int64_t size : sizes) items.push_back(TorchValue::integer(size));
  return TorchValue::call("torch", "Size", {TorchValue::tuple(std::move(items))});
}

TorchValue dcp_record(const char* module, const char* name,
                      std::vector<std::pair<std::string, TorchValue>> fields) {
  TorchValue state = TorchValue::dict();
  for (auto& [field, value] : fields) state.set(field, std::move(value));
  return TorchValue::object(module, name, std::move(state));
}

// TensorProperties' __getstate__: (dtype, layout, requires_grad, memory format, pin_memory).
TorchValue dcp_tensor_properties(TorchDtype dtype) {
  TorchValue state = TorchValue::tuple(
      {TorchValue::dtype(dtype),
       TorchValue::call("torch.serialization", "_get_layout", {TorchValue::text("torch.strided")}),
       TorchValue::boolean(false),
       TorchValue::call(kMetadataModule, "_MEM_FORMAT_ENCODING",
                        {TorchValue::integer(0)}),  // TORCH_CONTIGUOUS_FORMAT
       TorchValue::boolean(false)});
  return TorchValue::object(kMetadataModule, "TensorProperties", std::move(state));
}

}  // namespace

DistributedCheckpointFileWriter::DistributedCheckpointFileWriter(const fs::path& directory,
                                                                 int64_t writer)
    : name_(fmt::format("__{}_0.distcp", writer)),
      file_(std::make_unique<common::DurableFileWriter>(directory / name_)) {}

DistributedCheckpointFileWriter::~DistributedCheckpointFileWriter() = default;

void DistributedCheckpointFileWriter::add_chunk(std::string key, TorchDtype dtype,
                                                std::vector<int64_t> size,
                                                std::vector<int64_t> offsets,
                                                std::vector<int64_t> sizes,
                                                std::span<const float> values) {
  const std::vector<std::byte> blob =
      torch_checkpoint_bytes(TorchValue::tensor_from_floats(dtype, sizes, values));
  const auto offset = static_cast<int64_t>(file_->bytes_written());
  file_->write(blob);
  items_.push_back({.key = std::move(key),
                    .dtype = dtype,
                    .size = std::move(size),
                    .offsets = std::move(offsets),
                    .sizes = std::move(sizes),
                    .storage = {name_, offset, static_cast<int64_t>(blob.size())}});
}

void DistributedCheckpointFileWriter::add_object(std::string key,
                                                 std::span<const std::byte> bytes) {
  const auto offset = static_cast<int64_t>(file_->bytes_written());
  file_->write(bytes);
  DistributedCheckpointItem item;
  item.key = std::move(key);
  item.object = true;
  item.storage = {name_, offset, static_cast<int64_t>(bytes.size())};
  items_.push_back(std::move(item));
}

std::vector<DistributedCheckpointItem> DistributedCheckpointFileWriter::finish() {
  file_->finish();
  return std::move(items_);
}

json distributed_items_json(std::span<const DistributedCheckpointItem> items) {
  json out = json::array();
  for (const DistributedCheckpointItem& item : items) {
    json entry = {{"key", item.key},
                  {"file", item.storage.file},
                  {"offset", item.storage.offset},
                  {"length", item.storage.length}};
    if (!item.object) {
      entry["dtype"] = std::string(torch_dtype_name(item.dtype));
      entry["size"] = item.size;
      entry["offsets"] = item.offsets;
      entry["sizes"] = item.sizes;
    }
    out.push_back(std::move(entry));
  }
  return out;
}

std::vector<DistributedCheckpointItem> distributed_items_from_json(const json& items,
                                                                   std::string_view source) {
  std::vector<DistributedCheckpointItem> out;
  try {
    for (const json& entry : items) {
      DistributedCheckpointItem item;
      item.key = entry.at("key").get<std::string>();
      item.storage = {entry.at("file").get<std::string>(), entry.at("offset").get<int64_t>(),
                      entry.at("length").get<int64_t>()};
      item.object = !entry.contains("dtype");
      if (!item.object) {
        const std::string dtype = entry.at("dtype").get<std::string>();
        bool known = false;
        for (const TorchDtype candidate :
             {TorchDtype::float32, TorchDtype::bfloat16, TorchDtype::float16}) {
          if (torch_dtype_name(candidate) == dtype) {
            item.dtype = candidate;
            known = true;
          }
        }
        if (!known) common::fail("{}: an item of dtype '{}'", source, dtype);
        item.size = entry.at("size").get<std::vector<int64_t>>();
        item.offsets = entry.at("offsets").get<std::vector<int64_t>>();
        item.sizes = entry.at("sizes").get<std::vector<int64_t>>();
      }
      out.push_back(std::move(item));
    }
  } catch (const json::exception& error) {
    common::fail("{}: not a list of a distributed checkpoint's items ({})", source, error.what());
  }
  return out;
}

void write_distributed_checkpoint_metadata(const fs::path& directory,
                                           std::span<const DistributedCheckpointItem> items) {
  // Each key's entry, in the order the items come; a tensor's chunks under one.
  struct Key {
    const DistributedCheckpointItem* first = nullptr;
    std::vector<const DistributedCheckpointItem*> chunks;
  };
  std::vector<std::string> order;
  std::map<std::string, Key> keys;
  for (const DistributedCheckpointItem& item : items) {
    auto [found, added] = keys.try_emplace(item.key);
    Key& key = found->second;
    if (added) {
      order.push_back(item.key);
      key.first = &item;
    } else if (item.object || key.first->object || item.dtype != key.first->dtype ||
               item.size != key.first->size) {
      throw std::logic_error(fmt::format(
          "distributed checkpoint item '{}' stored twice or unlike its chunks", item.key));
    }
    key.chunks.push_back(&item);
  }
  TorchValue state_dict_metadata = TorchValue::dict();
  TorchValue planner_data = TorchValue::dict();
  TorchValue storage_data = TorchValue::dict();
  for (const std::string& name : order) {
    const Key& key = keys.at(name);
    planner_data.set(name, TorchValue::tuple({TorchValue::text(name)}));
    if (key.first->object) {
      state_dict_metadata.set(
          name, TorchValue::object(kMetadataModule, "BytesStorageMetadata", TorchValue::dict()));
    } else {
      std::vector<TorchValue> chunks;
      for (const DistributedCheckpointItem* chunk : key.chunks) {
        chunks.push_back(
            dcp_record(kMetadataModule, "ChunkStorageMetadata",
                       {{"offsets", dcp_size(chunk->offsets)}, {"sizes", dcp_size(chunk->sizes)}}));
      }
      state_dict_metadata.set(name,
                              dcp_record(kMetadataModule, "TensorStorageMetadata",
                                         {{"properties", dcp_tensor_properties(key.first->dtype)},
                                          {"size", dcp_size(key.first->size)},
                                          {"chunks", TorchValue::list(std::move(chunks))}}));
    }
    for (const DistributedCheckpointItem* chunk : key.chunks) {
      TorchValue index =
          dcp_record(kMetadataModule, "MetadataIndex",
                     {{"fqn", TorchValue::text(name)},
                      {"offset", chunk->object ? TorchValue::none() : dcp_size(chunk->offsets)},
                      {"index", TorchValue::none()}});
      storage_data.set(std::move(index),
                       dcp_record(kFilesystemModule, "_StorageInfo",
                                  {{"relative_path", TorchValue::text(chunk->storage.file)},
                                   {"offset", TorchValue::integer(chunk->storage.offset)},
                                   {"length", TorchValue::integer(chunk->storage.length)}}));
    }
  }
  const TorchValue metadata = dcp_record(kMetadataModule, "Metadata",
                                         {{"state_dict_metadata", std::move(state_dict_metadata)},
                                          {"planner_data", std::move(planner_data)},
                                          {"storage_data", std::move(storage_data)}});
  common::DurableFileWriter file(directory / kDistributedCheckpointMetadataFile);
  file.write(pickle_bytes(metadata));
  file.finish();
}

}  // namespace backend
