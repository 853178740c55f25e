// Reading a file torch.save wrote in PyTorch's zip format (torch/serialization.py, the default
// since PyTorch 1.6, which Megatron-LM's and NeMo's checkpoints are): a zip archive whose
// entries are stored, not compressed, under one top directory PREFIX:
//   PREFIX/data.pkl     the pickled object (restricted_pickle.hpp reads it: no code runs)
//   PREFIX/data/<key>   each storage's raw elements, little-endian
//   PREFIX/byteorder    "little" (absent from files of before PyTorch 1.12: little)
//   PREFIX/version      the format's version
// A tensor in data.pkl is torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)
// whose storage is the persistent id ('storage', torch.<Type>Storage, key, location, numel);
// TorchCheckpointFile::tensor reads that into a TorchTensor, checked against its storage entry,
// and tensor_values gathers its elements. The zip's own structure (end of central directory,
// zip64 included, central directory, local headers) is read from the file as it is; every
// offset and size is checked against the file before it is used, and every refusal is a
// common::Error naming the file and what is wrong. The entries' CRCs are not checked; an entry
// named outside the archive's directory ("..", an absolute path) or a symbolic link is refused.
// The legacy (pre-1.6, tar or raw pickle sequence) format is not read yet: refused as such.
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

namespace common {
class MappedFile;
}

namespace backend {

enum class TorchDtype {
  float32,
  float64,
  float16,
  bfloat16,
  int64,
  int32,
  int16,
  int8,
  uint8,
  boolean
};

// Bytes per element of `dtype`.
int64_t torch_dtype_size(TorchDtype dtype);
// "torch.float32", ... as PyTorch prints them.
std::string_view torch_dtype_name(TorchDtype dtype);
// "FloatStorage", ...: the storage class of a storage's persistent id (torch.<class>).
std::string_view torch_storage_class(TorchDtype dtype);

struct TorchTensor {
  TorchDtype dtype = TorchDtype::float32;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;  // in elements, as torch's
  int64_t storage_offset = 0;   // in elements
  std::string storage_key;      // PREFIX/data/<key>
  int64_t numel() const;
};

class TorchCheckpointFile {
 public:
  explicit TorchCheckpointFile(const std::filesystem::path& path, const PickleLimits& limits = {});
  // The same over bytes in memory, `source` naming them (the fuzz target's way in); the bytes
  // must outlive the object.
  TorchCheckpointFile(std::span<const std::byte> bytes, std::string source,
                      const PickleLimits& limits = {});
  ~TorchCheckpointFile();
  TorchCheckpointFile(TorchCheckpointFile&&) noexcept;
  TorchCheckpointFile& operator=(TorchCheckpointFile&&) noexcept;

  const PickleValue& root() const { return *root_; }
  const std::string& source() const { return source_; }

  // Whether `value` is a tensor (a _rebuild_tensor_v2 object).
  static bool is_tensor(const PickleValue& value);
  // The tensor `value` is, its elements within its storage; `what` names it in errors ("model
  // tensor 'decoder.layers.0.mlp.linear_fc1.weight'").
  TorchTensor tensor(const PickleValue& value, std::string_view what) const;
  // Its elements in row-major order as doubles (exact for every dtype but int64 beyond 2^53).
  std::vector<double> tensor_values(const TorchTensor& tensor) const;

 private:
  void open(const PickleLimits& limits);
  void check_entry_name(const std::string& name, uint64_t attributes) const;
  std::span<const std::byte> entry(std::string_view name) const;  // empty span: absent

  std::unique_ptr<common::MappedFile> mapped_;
  std::span<const std::byte> bytes_;
  std::string source_;
  std::string prefix_;
  std::map<std::string, std::span<const std::byte>, std::less<>> entries_;
  PicklePointer root_;
};

}  // namespace backend
