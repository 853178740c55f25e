// PyTorch Distributed Checkpoint directories read without running their pickles; see
// torch_distributed_checkpoint.hpp. Reference: torch/distributed/checkpoint/metadata.py and
// filesystem.py (FileSystemWriter._write_item: torch.save of each tensor chunk into the file,
// its offset and length recorded; FileSystemReader: the same ranges read back).
#include "backend/ckpt/torch_distributed_checkpoint.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "backend/common/error.hpp"
#include "backend/common/user_file.hpp"

namespace fs = std::filesystem;

namespace backend {

namespace {

constexpr std::string_view kModules[] = {
    "torch.distributed.checkpoint.metadata.", "torch.distributed._shard.checkpoint.metadata.",
    "torch.distributed.checkpoint.filesystem.", "torch.distributed._shard.checkpoint.filesystem.",
    "torch.distributed._shard.sharded_tensor.metadata."};

// Reads the pickled Metadata of one directory, `source` naming its .metadata in messages.
class MetadataReader {
 public:
  explicit MetadataReader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(std::string_view what) const {
    common::fail("{}: {} (not a PyTorch distributed checkpoint's metadata)", source_, what);
  }

  // Whether `value` is an object of the DCP class `name` (under either PyTorch's modules).
  static bool is(const PickleValue& value, std::string_view name) {
    if (value.kind != PickleKind::object) return false;
    for (std::string_view module : kModules) {
      if (value.name.size() == module.size() + name.size() && value.name.starts_with(module) &&
          value.name.ends_with(name)) {
        return true;
      }
    }
    return false;
  }

  // A dataclass's fields: BUILD's state dict (or the dict of a (None, slots) pair).
  const PickleValue& fields(const PickleValue& object, std::string_view what) const {
    const PickleValue* state = object.state.get();
    if (state != nullptr && state->kind == PickleKind::tuple && state->items.size() == 2 &&
        state->items[1]->kind == PickleKind::dict) {
      state = state->items[1].get();
    }
    if (state == nullptr || state->kind != PickleKind::dict) {
      fail(fmt::format("{} has no fields", what));
    }
    return *state;
  }

  const PickleValue& field(const PickleValue& fields, std::string_view name,
                           std::string_view what) const {
    const PickleValue* value = fields.find(name);
    if (value == nullptr) fail(fmt::format("{} has no '{}'", what, name));
    return *value;
  }

  int64_t integer(const PickleValue& value, std::string_view what) const {
    if (value.kind != PickleKind::integer || value.integer < 0) {
      fail(fmt::format("{} is not a count", what));
    }
    return value.integer;
  }

  std::string text(const PickleValue& value, std::string_view what) const {
    if (value.kind != PickleKind::text) fail(fmt::format("{} is not a string", what));
    return value.text;
  }

  // A torch.Size (the tuple it wraps) of counts.
  std::vector<int64_t> shape(const PickleValue& value, std::string_view what) const {
    if (value.kind != PickleKind::tuple && value.kind != PickleKind::list) {
      fail(fmt::format("{} is not a torch.Size", what));
    }
    std::vector<int64_t> sizes;
    for (const PicklePointer& item : value.items) sizes.push_back(integer(*item, what));
    return sizes;
  }

  // TensorProperties' dtype: the first of its state's tuple, a torch dtype's global.
  TorchDtype dtype(const PickleValue& properties, std::string_view what) const {
    if (!is(properties, "TensorProperties")) fail(fmt::format("{} has no TensorProperties", what));
    const PickleValue* state = properties.state.get();
    const PickleValue* dtype = nullptr;
    if (state != nullptr && state->kind == PickleKind::tuple && !state->items.empty()) {
      dtype = state->items[0].get();
    } else if (state != nullptr && state->kind == PickleKind::dict) {
      dtype = state->find("dtype");
    }
    if (dtype != nullptr && dtype->kind == PickleKind::global && dtype->text == "torch") {
      for (const TorchDtype candidate :
           {TorchDtype::float32, TorchDtype::float64, TorchDtype::float16, TorchDtype::bfloat16,
            TorchDtype::int64, TorchDtype::int32, TorchDtype::int16, TorchDtype::int8,
            TorchDtype::uint8, TorchDtype::boolean}) {
        if (torch_dtype_name(candidate) == "torch." + dtype->name) return candidate;
      }
    }
    fail(fmt::format("{} has no dtype this reader knows", what));
  }

  DistributedCheckpointStorage storage(const PickleValue& info, std::string_view what) const {
    if (!is(info, "_StorageInfo")) fail(fmt::format("{} is not a _StorageInfo", what));
    const PickleValue& f = fields(info, what);
    DistributedCheckpointStorage storage{.file = text(field(f, "relative_path", what), what),
                                         .offset = integer(field(f, "offset", what), what),
                                         .length = integer(field(f, "length", what), what)};
    // A name in the directory, nothing that leads out of it.
    if (storage.file.empty() || storage.file == "." || storage.file == ".." ||
        storage.file.find('/') != std::string::npos ||
        storage.file.find('\0') != std::string::npos) {
      fail(
          fmt::format("{} names the file '{}', which is not a file of the checkpoint's "
                      "directory",
                      what, storage.file));
    }
    return storage;
  }

 private:
  std::string source_;
};

int64_t volume(std::span<const int64_t> sizes) {
  int64_t count = 1;
  for (const int64_t size : sizes) count *= size;
  return count;
}

}  // namespace

DistributedCheckpoint::DistributedCheckpoint(fs::path directory, const PickleLimits& limits)
    : directory_(std::move(directory)), limits_(limits) {
  const fs::path path = directory_ / kDistributedCheckpointMetadataFile;
  const common::MappedFile file(path, "distributed checkpoint metadata");
  DistributedCheckpointIndex index = read_distributed_checkpoint_index(
      *read_restricted_pickle(file.bytes(), path.string(), limits), path.string());
  tensors_ = std::move(index.tensors);
  objects_ = std::move(index.objects);
}

DistributedCheckpointIndex read_distributed_checkpoint_index(const PickleValue& root,
                                                             std::string_view source_name) {
  const std::string source(source_name);
  DistributedCheckpointIndex index_of_items;
  auto& tensors_ = index_of_items.tensors;
  auto& objects_ = index_of_items.objects;
  const MetadataReader reader(source);
  if (!MetadataReader::is(root, "Metadata")) reader.fail("the pickle is not a Metadata");
  const PickleValue& metadata = reader.fields(root, "Metadata");

  // Where each item is: (key, the chunk's offsets) → its storage. Objects have no offsets.
  std::map<std::pair<std::string, std::vector<int64_t>>, DistributedCheckpointStorage> stored;
  const PickleValue& storage_data = reader.field(metadata, "storage_data", "Metadata");
  if (storage_data.kind != PickleKind::dict) reader.fail("Metadata.storage_data is not a dict");
  for (const auto& [index, info] : storage_data.entries) {
    if (!MetadataReader::is(*index, "MetadataIndex")) {
      reader.fail("a key of Metadata.storage_data is not a MetadataIndex");
    }
    const PickleValue& f = reader.fields(*index, "a MetadataIndex");
    const std::string key = reader.text(reader.field(f, "fqn", "a MetadataIndex"), "its fqn");
    const PickleValue* offset = f.find("offset");
    std::vector<int64_t> offsets;
    if (offset != nullptr && offset->kind != PickleKind::none) {
      offsets = reader.shape(*offset, fmt::format("the offset of '{}'", key));
    }
    const std::string what = fmt::format("the storage of '{}'", key);
    if (!stored.emplace(std::pair(key, offsets), reader.storage(*info, what)).second) {
      reader.fail(
          fmt::format("'{}' at offset [{}] is stored twice", key, fmt::join(offsets, ", ")));
    }
  }

  const PickleValue& items = reader.field(metadata, "state_dict_metadata", "Metadata");
  if (items.kind != PickleKind::dict) reader.fail("Metadata.state_dict_metadata is not a dict");
  for (const auto& [key_value, item] : items.entries) {
    const std::string key = reader.text(*key_value, "a key of Metadata.state_dict_metadata");
    if (tensors_.count(key) != 0 || objects_.count(key) != 0) {
      reader.fail(fmt::format("'{}' is listed twice", key));
    }
    if (MetadataReader::is(*item, "BytesStorageMetadata")) {
      const auto found = stored.find(std::pair(key, std::vector<int64_t>{}));
      if (found == stored.end()) reader.fail(fmt::format("the object '{}' is not stored", key));
      objects_.emplace(key, found->second);
      continue;
    }
    if (!MetadataReader::is(*item, "TensorStorageMetadata")) {
      reader.fail(fmt::format("'{}' is neither a tensor nor an object", key));
    }
    const std::string what = fmt::format("tensor '{}'", key);
    const PickleValue& f = reader.fields(*item, what);
    DistributedCheckpointTensor tensor;
    tensor.dtype = reader.dtype(reader.field(f, "properties", what), what);
    tensor.size = reader.shape(reader.field(f, "size", what), what + "'s size");
    const PickleValue& chunks = reader.field(f, "chunks", what);
    if (chunks.kind != PickleKind::list) reader.fail(fmt::format("{} has no list of chunks", what));
    int64_t elements = 0;
    for (const PicklePointer& chunk_value : chunks.items) {
      if (!MetadataReader::is(*chunk_value, "ChunkStorageMetadata")) {
        reader.fail(fmt::format("{} has a chunk that is not a ChunkStorageMetadata", what));
      }
      const PickleValue& c = reader.fields(*chunk_value, what + "'s chunk");
      DistributedCheckpointChunk chunk;
      chunk.offsets = reader.shape(reader.field(c, "offsets", what), what + "'s chunk offsets");
      chunk.sizes = reader.shape(reader.field(c, "sizes", what), what + "'s chunk sizes");
      bool inside =
          chunk.offsets.size() == tensor.size.size() && chunk.sizes.size() == tensor.size.size();
      for (size_t axis = 0; inside && axis < tensor.size.size(); ++axis) {
        inside = chunk.offsets[axis] <= tensor.size[axis] &&
                 chunk.sizes[axis] <= tensor.size[axis] - chunk.offsets[axis];
      }
      if (!inside) {
        reader.fail(fmt::format("{} of size [{}] has a chunk at [{}] of [{}], outside it", what,
                                fmt::join(tensor.size, ", "), fmt::join(chunk.offsets, ", "),
                                fmt::join(chunk.sizes, ", ")));
      }
      const auto found = stored.find(std::pair(key, chunk.offsets));
      if (found == stored.end()) {
        reader.fail(
            fmt::format("{}'s chunk at [{}] is not stored", what, fmt::join(chunk.offsets, ", ")));
      }
      chunk.storage = found->second;
      elements += volume(chunk.sizes);
      tensor.chunks.push_back(std::move(chunk));
    }
    if (elements > volume(tensor.size)) {
      reader.fail(fmt::format("{}'s chunks hold {} elements, more than its {}", what, elements,
                              volume(tensor.size)));
    }
    tensors_.emplace(key, std::move(tensor));
  }
  return index_of_items;
}

DistributedCheckpoint::~DistributedCheckpoint() = default;

const DistributedCheckpointTensor* DistributedCheckpoint::tensor(std::string_view key) const {
  const auto found = tensors_.find(key);
  return found == tensors_.end() ? nullptr : &found->second;
}

std::vector<std::string> DistributedCheckpoint::object_keys() const {
  std::vector<std::string> keys;
  for (const auto& [key, storage] : objects_) keys.push_back(key);
  return keys;
}

std::span<const std::byte> DistributedCheckpoint::stored(
    const DistributedCheckpointStorage& storage, std::string_view key) const {
  auto found = files_.find(storage.file);
  if (found == files_.end()) {
    found =
        files_
            .emplace(storage.file, std::make_unique<common::MappedFile>(
                                       directory_ / storage.file, "distributed checkpoint file"))
            .first;
  }
  const std::span<const std::byte> bytes = found->second->bytes();
  if (storage.offset > static_cast<int64_t>(bytes.size()) ||
      storage.length > static_cast<int64_t>(bytes.size()) - storage.offset) {
    common::fail(
        "{}: '{}' is stored at bytes {}..{}, past the file's end ({} bytes): the file "
        "is truncated or not this checkpoint's",
        (directory_ / storage.file).string(), key, storage.offset, storage.offset + storage.length,
        bytes.size());
  }
  return bytes.subspan(static_cast<size_t>(storage.offset), static_cast<size_t>(storage.length));
}

std::span<const std::byte> DistributedCheckpoint::object(std::string_view key) const {
  const auto found = objects_.find(key);
  if (found == objects_.end()) {
    common::fail("{}: the checkpoint has no object '{}'", directory_.string(), key);
  }
  return stored(found->second, key);
}

std::vector<float> DistributedCheckpoint::read(std::string_view key, std::span<const int64_t> start,
                                               std::span<const int64_t> count) const {
  const DistributedCheckpointTensor* tensor = this->tensor(key);
  if (tensor == nullptr) {
    common::fail("{}: the checkpoint has no tensor '{}'", directory_.string(), key);
  }
  const size_t rank = tensor->size.size();
  bool inside = start.size() == rank && count.size() == rank;
  for (size_t axis = 0; inside && axis < rank; ++axis) {
    inside = start[axis] >= 0 && count[axis] >= 0 && start[axis] <= tensor->size[axis] &&
             count[axis] <= tensor->size[axis] - start[axis];
  }
  if (!inside) {
    throw std::logic_error(fmt::format("reading [{}] + [{}] of '{}' of size [{}]",
                                       fmt::join(start, ", "), fmt::join(count, ", "), key,
                                       fmt::join(tensor->size, ", ")));
  }
  const int64_t total = volume(count);
  std::vector<float> values(static_cast<size_t>(total));
  std::vector<bool> covered(static_cast<size_t>(total), false);
  // Row-major strides of the box.
  std::vector<int64_t> box_stride(rank, 1);
  for (size_t axis = rank; axis > 1; --axis) {
    box_stride[axis - 2] = box_stride[axis - 1] * count[axis - 1];
  }

  for (const DistributedCheckpointChunk& chunk : tensor->chunks) {
    std::vector<int64_t> low(rank), high(rank);
    bool meets = true;
    for (size_t axis = 0; axis < rank; ++axis) {
      low[axis] = std::max(start[axis], chunk.offsets[axis]);
      high[axis] = std::min(start[axis] + count[axis], chunk.offsets[axis] + chunk.sizes[axis]);
      meets = meets && low[axis] < high[axis];
    }
    if (!meets && rank > 0) continue;
    const std::string what = fmt::format("'{}' chunk at [{}]", key, fmt::join(chunk.offsets, ", "));
    const TorchCheckpointFile blob(
        stored(chunk.storage, key),
        fmt::format("{} ({})", (directory_ / chunk.storage.file).string(), what), limits_);
    if (!TorchCheckpointFile::is_tensor(blob.root())) {
      common::fail("{}: the {} is not a tensor", blob.source(), what);
    }
    const TorchTensor stored_tensor = blob.tensor(blob.root(), what);
    if (stored_tensor.shape != chunk.sizes || stored_tensor.dtype != tensor->dtype) {
      common::fail("{}: the {} is a {} tensor of shape [{}], where the metadata says {} of [{}]",
                   blob.source(), what, torch_dtype_name(stored_tensor.dtype),
                   fmt::join(stored_tensor.shape, ", "), torch_dtype_name(tensor->dtype),
                   fmt::join(chunk.sizes, ", "));
    }
    const std::vector<double> chunk_values = blob.tensor_values(stored_tensor);
    std::vector<int64_t> chunk_stride(rank, 1);
    for (size_t axis = rank; axis > 1; --axis) {
      chunk_stride[axis - 2] = chunk_stride[axis - 1] * chunk.sizes[axis - 1];
    }
    // Runs along the last axis, over every index of the others.
    std::vector<int64_t> index = low;
    const int64_t run = rank == 0 ? 1 : high[rank - 1] - low[rank - 1];
    while (true) {
      int64_t from = 0, to = 0;
      for (size_t axis = 0; axis < rank; ++axis) {
        from += (index[axis] - chunk.offsets[axis]) * chunk_stride[axis];
        to += (index[axis] - start[axis]) * box_stride[axis];
      }
      for (int64_t i = 0; i < run; ++i) {
        const auto at = static_cast<size_t>(to + i);
        if (covered[at]) {
          common::fail("{}: the chunks of '{}' overlap (the {} meets another)", directory_.string(),
                       key, what);
        }
        covered[at] = true;
        values[at] = static_cast<float>(chunk_values[static_cast<size_t>(from + i)]);
      }
      // The next index of the axes before the last; done when the first wraps around.
      auto axis = static_cast<int64_t>(rank) - 2;
      for (; axis >= 0; --axis) {
        const auto a = static_cast<size_t>(axis);
        if (++index[a] < high[a]) break;
        index[a] = low[a];
      }
      if (axis < 0) break;
    }
  }
  const auto missing = std::count(covered.begin(), covered.end(), false);
  if (missing > 0) {
    common::fail(
        "{}: {} element(s) of '{}' at [{}] + [{}] are in none of its chunks: a "
        "writer's part of the checkpoint is missing",
        directory_.string(), missing, key, fmt::join(start, ", "), fmt::join(count, ", "));
  }
  return values;
}

}  // namespace backend
