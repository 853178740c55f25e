// Writing a PyTorch Distributed Checkpoint directory (torch_distributed_checkpoint.hpp says
// what it holds), as FileSystemWriter(single_file_per_rank=True) writes one: each writer (a
// process) puts its items into DIR/__<writer>_0.distcp, a tensor chunk as the bytes of
// torch.save (torch_checkpoint_writer.hpp's archive, directory "archive") and an object as its
// bytes, one after another; then one process writes DIR/.metadata for every writer's items.
// The .metadata is pickled with PyTorch 2.x's names (torch.distributed.checkpoint.metadata's
// Metadata, TensorStorageMetadata, ChunkStorageMetadata, BytesStorageMetadata, MetadataIndex,
// TensorProperties with its __getstate__ tuple, filesystem._StorageInfo), which is what
// Megatron core needs (it requires PyTorch 2); planner_data maps each key to the one-element
// path (key,), as DefaultSavePlanner's flattening of a flat state dict does.
//
// The writers pass their items to the one writing .metadata as JSON
// (distributed_items_json): a file each in the directory, on the shared filesystem the ranks
// save to, removed once .metadata is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "backend/ckpt/torch_checkpoint.hpp"
#include "backend/ckpt/torch_distributed_checkpoint.hpp"

namespace common {
class DurableFileWriter;
}

namespace backend {

// One stored item: a tensor's chunk, or an object (`object`: no dtype, size or chunk).
struct DistributedCheckpointItem {
  std::string key;
  bool object = false;
  TorchDtype dtype = TorchDtype::float32;
  std::vector<int64_t> size;            // the tensor's global shape
  std::vector<int64_t> offsets, sizes;  // the chunk's
  DistributedCheckpointStorage storage;
};

class DistributedCheckpointFileWriter {
 public:
  // Creates DIR/__<writer>_0.distcp (a new file).
  DistributedCheckpointFileWriter(const std::filesystem::path& directory, int64_t writer);
  ~DistributedCheckpointFileWriter();
  DistributedCheckpointFileWriter(const DistributedCheckpointFileWriter&) = delete;
  DistributedCheckpointFileWriter& operator=(const DistributedCheckpointFileWriter&) = delete;

  // The chunk of tensor `key` (global shape `size`) at `offsets` of `sizes`, its elements
  // `values` (row-major) stored as `dtype` (float32, or rounded to bfloat16 or float16).
  void add_chunk(std::string key, TorchDtype dtype, std::vector<int64_t> size,
                 std::vector<int64_t> offsets, std::vector<int64_t> sizes,
                 std::span<const float> values);
  void add_object(std::string key, std::span<const std::byte> bytes);
  // Syncs and closes the file; the items it holds.
  std::vector<DistributedCheckpointItem> finish();

 private:
  std::string name_;
  std::unique_ptr<common::DurableFileWriter> file_;
  std::vector<DistributedCheckpointItem> items_;
};

// The items as JSON, and back (`source` names the JSON in errors: it is read from a file).
nlohmann::json distributed_items_json(std::span<const DistributedCheckpointItem> items);
std::vector<DistributedCheckpointItem> distributed_items_from_json(const nlohmann::json& items,
                                                                   std::string_view source);

// Writes DIR/.metadata (a new file, fsynced) for `items`, every writer's. A tensor's chunks
// must agree on its dtype and global shape; an item stored twice is an internal error.
void write_distributed_checkpoint_metadata(const std::filesystem::path& directory,
                                           std::span<const DistributedCheckpointItem> items);

}  // namespace backend
