// Reading a directory PyTorch Distributed Checkpoint (torch.distributed.checkpoint, "DCP";
// torch/distributed/checkpoint/filesystem.py's FileSystemWriter) wrote, which Megatron core's
// torch_dist format is (megatron_dist_checkpoint.hpp), without running any of its pickles:
//   DIR/.metadata        a pickled Metadata: state_dict_metadata {key: TensorStorageMetadata
//                        (properties: TensorProperties (dtype, ...), size: the global shape,
//                        chunks: [ChunkStorageMetadata(offsets, sizes)]) or
//                        BytesStorageMetadata()}, storage_data {MetadataIndex(fqn, offset of
//                        the chunk): _StorageInfo(relative_path, offset, length)}
//   DIR/__R_N.distcp     each writer's items one after another: a tensor chunk as torch.save
//                        wrote it (a zip of its own, torch_checkpoint.hpp), an object as the
//                        bytes of its io.BytesIO
// The dataclasses are read under PyTorch 2.x's module names (torch.distributed.checkpoint.*)
// and 1.13's (torch.distributed._shard.checkpoint.*); TensorProperties' state is the tuple its
// __getstate__ gives (dtype, layout, requires_grad, memory format, pin_memory). A tensor is
// read here by any box of its global shape, from the chunks that box meets: each chunk is
// checked against its storage entry (its file, a range inside it, a tensor of the chunk's
// sizes and the recorded dtype), and the box must be covered by the chunks exactly once.
// Every refusal is a common::Error naming the file and what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/ckpt/restricted_pickle.hpp"
#include "backend/ckpt/torch_checkpoint.hpp"

namespace common {
class MappedFile;
}

namespace backend {

inline constexpr const char* kDistributedCheckpointMetadataFile = ".metadata";

// Where a stored item's bytes are: a file of the directory and a range inside it.
struct DistributedCheckpointStorage {
  std::string file;  // a name in the directory ("__0_0.distcp")
  int64_t offset = 0;
  int64_t length = 0;
};

struct DistributedCheckpointChunk {
  std::vector<int64_t> offsets, sizes;  // in the global tensor
  DistributedCheckpointStorage storage;
};

struct DistributedCheckpointTensor {
  TorchDtype dtype = TorchDtype::float32;
  std::vector<int64_t> size;  // the global shape
  std::vector<DistributedCheckpointChunk> chunks;
};

// What a .metadata's Metadata lists: every tensor with its chunks and every object, each
// checked as the header says (the fuzz target's way in; DistributedCheckpoint reads it).
struct DistributedCheckpointIndex {
  std::map<std::string, DistributedCheckpointTensor, std::less<>> tensors;
  std::map<std::string, DistributedCheckpointStorage, std::less<>> objects;
};
DistributedCheckpointIndex read_distributed_checkpoint_index(const PickleValue& metadata,
                                                             std::string_view source);

class DistributedCheckpoint {
 public:
  explicit DistributedCheckpoint(std::filesystem::path directory, const PickleLimits& limits = {});
  ~DistributedCheckpoint();
  DistributedCheckpoint(const DistributedCheckpoint&) = delete;
  DistributedCheckpoint& operator=(const DistributedCheckpoint&) = delete;

  const std::filesystem::path& directory() const { return directory_; }
  // Every tensor, by its key.
  const std::map<std::string, DistributedCheckpointTensor, std::less<>>& tensors() const {
    return tensors_;
  }
  // The tensor `key`; nullptr when the checkpoint has none of that key.
  const DistributedCheckpointTensor* tensor(std::string_view key) const;
  // The keys of the objects stored as bytes (BytesStorageMetadata).
  std::vector<std::string> object_keys() const;

  // The elements [start, start + count) of each axis of tensor `key` (which the checkpoint
  // has), in row-major order, as floats.
  std::vector<float> read(std::string_view key, std::span<const int64_t> start,
                          std::span<const int64_t> count) const;
  // The bytes of the object `key`; a common::Error when there is none.
  std::span<const std::byte> object(std::string_view key) const;

 private:
  std::span<const std::byte> stored(const DistributedCheckpointStorage& storage,
                                    std::string_view key) const;

  std::filesystem::path directory_;
  std::map<std::string, DistributedCheckpointTensor, std::less<>> tensors_;
  std::map<std::string, DistributedCheckpointStorage, std::less<>> objects_;
  PickleLimits limits_;
  mutable std::map<std::string, std::unique_ptr<common::MappedFile>> files_;
};

}  // namespace backend
