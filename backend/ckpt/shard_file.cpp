// This backend's checkpoint files as ShardFiles (shard_file.hpp).
#include "backend/ckpt/shard_file.hpp"

#include "backend/ckpt/checkpoint_file.hpp"

namespace backend {

namespace {

class NativeShardFile final : public ShardFile {
 public:
  explicit NativeShardFile(const std::filesystem::path& file) : reader_(file) {}

  const std::filesystem::path& path() const override { return reader_.path(); }
  const nlohmann::json& metadata() const override { return reader_.metadata(); }
  std::vector<std::string> tensor_names() const override {
    std::vector<std::string> names;
    for (const TensorEntry& entry : reader_.tensors()) names.push_back(entry.name);
    return names;
  }
  const std::vector<int64_t>* shape(const std::string& name) const override {
    const TensorEntry* entry = reader_.find(name);
    return entry == nullptr ? nullptr : &entry->shape;
  }
  void read(const std::string& name, std::span<float> destination) const override {
    reader_.read(*reader_.find(name), destination);
  }

 private:
  CheckpointFileReader reader_;
};

}  // namespace

std::unique_ptr<ShardFile> open_native_shard_file(const std::filesystem::path& file) {
  return std::make_unique<NativeShardFile>(file);
}

}  // namespace backend
