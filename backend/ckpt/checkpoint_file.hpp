// model_optim_rng.bin, the one file of a checkpoint (docs/checkpoints.md gives it byte by
// byte). Megatron pickles a state dict with torch.save; this backend has no Python, so the
// same content (arguments, iteration, model, optimizer, scheduler, RNG state) is written as
//   header (64 bytes): magic "MNATCKPT", format version, block sizes, CRC-32C of each block
//   metadata: JSON (iteration, consumed samples, scheduler, optimizer step, RNG, arguments)
//   tensor table: per tensor name, dtype, shape, byte offset, byte size, CRC-32C
//   tensor data: raw little-endian values, each tensor 64-byte aligned
// Every block and every tensor is checksummed (CRC-32C, backend/common/crc32c.hpp), so a
// flipped bit anywhere is found on load and reported with the file and the tensor's name.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "backend/common/user_file.hpp"

namespace backend {

inline constexpr std::array<char, 8> kCheckpointMagic = {'M', 'N', 'A', 'T', 'C', 'K', 'P', 'T'};
inline constexpr uint32_t kCheckpointFormatVersion = 1;
inline constexpr uint64_t kCheckpointHeaderSize = 64;
inline constexpr uint64_t kCheckpointAlignment = 64;  // of the data block and of every tensor

enum class TensorDtype : uint32_t { float32 = 1 };

// A tensor to write: its values are read from `data` (numel = product of shape).
struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> data;
};

// One row of the tensor table, as read back.
struct TensorEntry {
  std::string name;
  TensorDtype dtype = TensorDtype::float32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the start of the data block
  uint64_t size = 0;    // bytes
  uint32_t crc32c = 0;
  int64_t numel() const;
};

// Writes the whole file at `path` (which must not exist) and fsyncs it.
void write_checkpoint_file(const std::filesystem::path& path, const nlohmann::json& metadata,
                           std::span<const CheckpointTensor> tensors);

// Opens a checkpoint file and validates everything but the tensor data: magic, version,
// header/metadata/table checksums, the table's consistency and the file's length. Tensor data
// is checksummed as it is read. Every failure is a common::Error naming the file (and the
// tensor, when one is at fault).
class CheckpointFileReader {
 public:
  explicit CheckpointFileReader(std::filesystem::path path);
  CheckpointFileReader(const CheckpointFileReader&) = delete;
  CheckpointFileReader& operator=(const CheckpointFileReader&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint32_t format_version() const { return format_version_; }
  const nlohmann::json& metadata() const { return metadata_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const TensorEntry* find(const std::string& name) const;  // nullptr when absent

  // Reads a float32 tensor into `destination` (its size must be the tensor's element count)
  // and checks its CRC-32C.
  void read(const TensorEntry& entry, std::span<float> destination) const;
  // The tensor's bytes as stored, CRC-checked.
  std::vector<std::byte> read_bytes(const TensorEntry& entry) const;

 private:
  // The header, metadata, table and length checks of the constructor; fills the fields.
  void validate();
  void read_at(uint64_t offset, std::span<std::byte> destination, const std::string& what) const;
  void check_crc(const TensorEntry& entry, std::span<const std::byte> bytes) const;

  std::filesystem::path path_;
  common::OpenFile file_;
  uint64_t file_size_ = 0;
  uint32_t format_version_ = 0;
  uint64_t data_offset_ = 0;
  nlohmann::json metadata_;
  std::vector<TensorEntry> tensors_;
};

}  // namespace backend
