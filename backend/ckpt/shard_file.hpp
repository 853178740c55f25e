// One file of a checkpoint as the tools that read a checkpoint whole see it (resharding,
// conversion; checkpoint_reshard.hpp): the tensors one (tensor-parallel rank, pipeline stage)
// saved, by this backend's names (model/parameter_layout.cpp), and the file's metadata in
// this backend's form (checkpoint.hpp: iteration, samples, the record of the arguments, the
// rank's place), whatever format holds them: this backend's own files (checkpoint_file.hpp)
// or Megatron-LM's torch.save'd ones (megatron_checkpoint.hpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

namespace backend {

class ShardFile {
 public:
  virtual ~ShardFile() = default;

  virtual const std::filesystem::path& path() const = 0;
  virtual const nlohmann::json& metadata() const = 0;
  // Every tensor's name, in the file's order.
  virtual std::vector<std::string> tensor_names() const = 0;
  // The shape of the tensor `name`; nullptr when the file has none of that name.
  virtual const std::vector<int64_t>* shape(const std::string& name) const = 0;
  // The tensor `name` (which the file has) as floats into `destination`, of its element count.
  virtual void read(const std::string& name, std::span<float> destination) const = 0;
};

// This backend's own checkpoint file (CheckpointFileReader's checks).
std::unique_ptr<ShardFile> open_native_shard_file(const std::filesystem::path& file);

}  // namespace backend
