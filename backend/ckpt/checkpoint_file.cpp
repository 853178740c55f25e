// The checkpoint file format: writer and validating reader; see checkpoint_file.hpp and
// docs/checkpoints.md for the byte layout.
#include "backend/ckpt/checkpoint_file.hpp"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <set>

#include "backend/common/checked_math.hpp"
#include "backend/common/crc32c.hpp"
#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/python_format.hpp"
#include "backend/common/small_file.hpp"

namespace backend {

using common::format_python_shape;

// The format is little-endian and written from memory as it is; a big-endian host would
// need byte swapping, which nothing here needs yet.
static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian; add byte swapping for this host");

namespace {

uint64_t align_up(uint64_t value) {
  return (value + kCheckpointAlignment - 1) / kCheckpointAlignment * kCheckpointAlignment;
}

// Little-endian encoding into a byte buffer.
class ByteBuilder {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* bytes = reinterpret_cast<const std::byte*>(&value);
    bytes_.insert(bytes_.end(), bytes, bytes + sizeof(T));
  }
  void put_bytes(const void* data, size_t size) {
    const auto* bytes = static_cast<const std::byte*>(data);
    bytes_.insert(bytes_.end(), bytes, bytes + size);
  }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

// Bounds-checked little-endian decoding; running off the end is a corrupt table.
class ByteParser {
 public:
  ByteParser(std::span<const std::byte> bytes, const std::filesystem::path& path)
      : bytes_(bytes), path_(path) {}
  template <typename T>
  T get() {
    T value;
    std::memcpy(&value, take(sizeof(T)).data(), sizeof(T));
    return value;
  }
  std::string get_string(size_t size) {
    const auto bytes = take(size);
    return {reinterpret_cast<const char*>(bytes.data()), size};
  }
  bool done() const { return position_ == bytes_.size(); }

 private:
  std::span<const std::byte> take(size_t size) {
    if (size > bytes_.size() - position_) {
      common::fail("checkpoint {}: the tensor table is malformed (it ends inside an entry)",
                   path_.string());
    }
    auto piece = bytes_.subspan(position_, size);
    position_ += size;
    return piece;
  }
  std::span<const std::byte> bytes_;
  const std::filesystem::path& path_;
  size_t position_ = 0;
};

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t count = 1;
  for (int64_t dimension : shape) count *= dimension;
  return count;
}

void write_checkpoint_file(const std::filesystem::path& path, const nlohmann::json& metadata,
                           std::span<const CheckpointTensor> tensors) {
  const std::string metadata_text = metadata.dump(1);

  // The table first: it holds every tensor's offset and checksum.
  ByteBuilder table;
  table.put<uint64_t>(tensors.size());
  uint64_t data_size = 0;
  for (const auto& tensor : tensors) {
    int64_t numel = 1;
    for (int64_t dimension : tensor.shape) numel *= dimension;
    if (numel != static_cast<int64_t>(tensor.data.size())) {
      common::fail("checkpoint {}: tensor '{}' has shape {} but {} values", path.string(),
                   tensor.name, format_python_shape(tensor.shape), tensor.data.size());
    }
    const uint64_t size = tensor.data.size_bytes();
    table.put<uint32_t>(static_cast<uint32_t>(tensor.name.size()));
    table.put_bytes(tensor.name.data(), tensor.name.size());
    table.put<uint32_t>(static_cast<uint32_t>(TensorDtype::float32));
    table.put<uint32_t>(static_cast<uint32_t>(tensor.shape.size()));
    for (int64_t dimension : tensor.shape) table.put<int64_t>(dimension);
    table.put<uint64_t>(data_size);
    table.put<uint64_t>(size);
    table.put<uint32_t>(common::crc32c(tensor.data.data(), size));
    data_size = align_up(data_size + size);
  }

  const uint64_t data_offset =
      align_up(kCheckpointHeaderSize + metadata_text.size() + table.bytes().size());
  ByteBuilder header;
  header.put_bytes(kCheckpointMagic.data(), kCheckpointMagic.size());
  header.put<uint32_t>(kCheckpointFormatVersion);
  header.put<uint32_t>(static_cast<uint32_t>(kCheckpointHeaderSize));
  header.put<uint64_t>(metadata_text.size());
  header.put<uint64_t>(table.bytes().size());
  header.put<uint64_t>(data_offset);
  header.put<uint64_t>(data_size);
  header.put<uint32_t>(common::crc32c(metadata_text.data(), metadata_text.size()));
  header.put<uint32_t>(common::crc32c(table.bytes().data(), table.bytes().size()));
  header.put<uint32_t>(0);  // reserved
  header.put<uint32_t>(common::crc32c(header.bytes().data(), header.bytes().size()));

  common::DurableFileWriter writer(path);
  writer.write(header.bytes());
  writer.write(std::as_bytes(std::span(metadata_text.data(), metadata_text.size())));
  writer.write(table.bytes());
  writer.write_zeros(data_offset - writer.bytes_written());
  for (const auto& tensor : tensors) {
    writer.write(std::as_bytes(tensor.data));
    writer.write_zeros(align_up(writer.bytes_written()) - writer.bytes_written());
  }
  writer.finish();
}

// The file is a member: a refused file is closed as the constructor throws.
CheckpointFileReader::CheckpointFileReader(std::filesystem::path path)
    : path_(std::move(path)), file_(path_, "checkpoint") {
  validate();
}

void CheckpointFileReader::validate() {
  const std::string name = path_.string();
  file_size_ = file_.size();

  if (file_size_ < kCheckpointHeaderSize) {
    common::fail("checkpoint {} is truncated: {} bytes, shorter than the {}-byte header", name,
                 file_size_, kCheckpointHeaderSize);
  }
  std::array<std::byte, kCheckpointHeaderSize> header{};
  read_at(0, header, "the header");
  if (std::memcmp(header.data(), kCheckpointMagic.data(), kCheckpointMagic.size()) != 0) {
    common::fail("{} is not a megatron-native checkpoint: its first bytes are not the magic "
                 "\"MNATCKPT\" (a Megatron-LM .pt checkpoint needs converting first)", name);
  }
  ByteParser fields(header, path_);
  fields.get<uint64_t>();  // the magic
  format_version_ = fields.get<uint32_t>();
  if (format_version_ != kCheckpointFormatVersion) {
    common::fail("checkpoint {} has format version {}; this build reads version {}", name,
                 format_version_, kCheckpointFormatVersion);
  }
  const uint32_t header_size = fields.get<uint32_t>();
  const uint64_t metadata_size = fields.get<uint64_t>();
  const uint64_t table_size = fields.get<uint64_t>();
  data_offset_ = fields.get<uint64_t>();
  const uint64_t data_size = fields.get<uint64_t>();
  const uint32_t metadata_crc = fields.get<uint32_t>();
  const uint32_t table_crc = fields.get<uint32_t>();
  fields.get<uint32_t>();  // reserved
  const uint32_t header_crc = fields.get<uint32_t>();
  if (common::crc32c(header.data(), kCheckpointHeaderSize - 4) != header_crc) {
    common::fail("checkpoint {}: the header fails its CRC-32C check: the file is corrupt", name);
  }
  if (header_size != kCheckpointHeaderSize || metadata_size > data_offset_ ||
      table_size > data_offset_ || data_offset_ < header_size + metadata_size + table_size) {
    common::fail("checkpoint {}: the header's block sizes are inconsistent: the file is corrupt",
                 name);
  }

  // The metadata and the tensor table are read whole: bounded as every file read whole is
  // (common/small_file; a real model's are kilobytes), whatever a crafted header claims.
  if (metadata_size > common::kSmallFileLimit || table_size > common::kSmallFileLimit) {
    common::fail("checkpoint {}: its header claims a {}-byte metadata block and a {}-byte tensor "
                 "table; at most {} bytes each are read", name, metadata_size, table_size,
                 common::kSmallFileLimit);
  }
  if (header_size + metadata_size + table_size > file_size_) {
    common::fail("checkpoint {} is truncated: {} bytes, it ends inside its metadata or tensor "
                 "table (the header says {} bytes)", name, file_size_, data_offset_ + data_size);
  }
  std::string metadata_text(metadata_size, '\0');
  read_at(header_size, std::as_writable_bytes(std::span(metadata_text.data(), metadata_size)),
          "the metadata");
  if (common::crc32c(metadata_text.data(), metadata_text.size()) != metadata_crc) {
    common::fail("checkpoint {}: the metadata block fails its CRC-32C check: the file is corrupt",
                 name);
  }
  metadata_ = nlohmann::json::parse(metadata_text, nullptr, false);
  if (metadata_.is_discarded() || !metadata_.is_object()) {
    common::fail("checkpoint {}: the metadata block is not a JSON object", name);
  }

  std::vector<std::byte> table(table_size);
  read_at(header_size + metadata_size, table, "the tensor table");
  if (common::crc32c(table.data(), table.size()) != table_crc) {
    common::fail("checkpoint {}: the tensor table fails its CRC-32C check: the file is corrupt",
                 name);
  }
  ByteParser parser(table, path_);
  const uint64_t count = parser.get<uint64_t>();
  std::set<std::string> names;
  for (uint64_t i = 0; i < count; ++i) {
    TensorEntry entry;
    entry.name = parser.get_string(parser.get<uint32_t>());
    const uint32_t dtype = parser.get<uint32_t>();
    if (dtype != static_cast<uint32_t>(TensorDtype::float32)) {
      common::fail("checkpoint {}: tensor '{}' has dtype code {}; this build reads 1 (float32)",
                   name, entry.name, dtype);
    }
    const uint32_t rank = parser.get<uint32_t>();
    for (uint32_t d = 0; d < rank; ++d) {
      const int64_t dimension = parser.get<int64_t>();
      if (dimension < 0) common::fail("checkpoint {}: tensor '{}' has a negative dimension", name, entry.name);
      entry.shape.push_back(dimension);
    }
    entry.offset = parser.get<uint64_t>();
    entry.size = parser.get<uint64_t>();
    entry.crc32c = parser.get<uint32_t>();
    // The element count in exact arithmetic: a table entry may claim any shape, and a product
    // that wrapped could match a small byte size (numel() is safe on the entries kept).
    const std::optional<int64_t> elements = common::exact_product(entry.shape);
    const bool fits_data =
        elements && static_cast<uint64_t>(*elements) <= data_size / sizeof(float);
    if (!fits_data || entry.size != static_cast<uint64_t>(*elements) * sizeof(float) ||
        entry.offset > data_size ||
        entry.size > data_size - entry.offset) {
      common::fail("checkpoint {}: tensor '{}' has an inconsistent table entry (shape {}, {} "
                   "bytes at offset {} of {})", name, entry.name, format_python_shape(entry.shape),
                   entry.size, entry.offset, data_size);
    }
    if (!names.insert(entry.name).second) {
      common::fail("checkpoint {}: tensor '{}' appears twice in the table", name, entry.name);
    }
    tensors_.push_back(std::move(entry));
  }
  if (!parser.done()) common::fail("checkpoint {}: the tensor table has trailing bytes", name);

  const uint64_t expected_size = data_offset_ + data_size;
  if (file_size_ < expected_size) {
    for (const auto& entry : tensors_) {
      if (data_offset_ + entry.offset + entry.size > file_size_) {
        common::fail("checkpoint {} is truncated: {} bytes of the {} its header announces; tensor "
                     "'{}' is cut short", name, file_size_, expected_size, entry.name);
      }
    }
    common::fail("checkpoint {} is truncated: {} bytes of the {} its header announces", name,
                 file_size_, expected_size);
  }
  if (file_size_ > expected_size) {
    common::fail("checkpoint {} has {} bytes after the end its header announces: the file is "
                 "corrupt", name, file_size_ - expected_size);
  }
}

const TensorEntry* CheckpointFileReader::find(const std::string& name) const {
  for (const auto& entry : tensors_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

void CheckpointFileReader::read_at(uint64_t offset, std::span<std::byte> destination,
                                   const std::string& what) const {
  size_t done = 0;
  while (done < destination.size()) {
    const ssize_t got = ::pread(file_.descriptor(), destination.data() + done,
                                destination.size() - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      common::fail("cannot read {} of checkpoint {}: {}", what, path_.string(), std::strerror(errno));
    }
    if (got == 0) {
      common::fail("checkpoint {} is truncated: it ends inside {}", path_.string(), what);
    }
    done += static_cast<size_t>(got);
  }
}

void CheckpointFileReader::check_crc(const TensorEntry& entry, std::span<const std::byte> bytes) const {
  const uint32_t actual = common::crc32c(bytes);
  if (actual != entry.crc32c) {
    common::fail("checkpoint {}: tensor '{}' fails its CRC-32C check (stored {:08x}, computed "
                 "{:08x}): the file is corrupt", path_.string(), entry.name, entry.crc32c, actual);
  }
}

void CheckpointFileReader::read(const TensorEntry& entry, std::span<float> destination) const {
  if (static_cast<int64_t>(destination.size()) != entry.numel()) {
    common::fail("checkpoint {}: tensor '{}' has {} values, the destination {}", path_.string(),
                 entry.name, entry.numel(), destination.size());
  }
  const auto bytes = std::as_writable_bytes(destination);
  read_at(data_offset_ + entry.offset, bytes, "tensor '" + entry.name + "'");
  check_crc(entry, bytes);
}

std::vector<std::byte> CheckpointFileReader::read_bytes(const TensorEntry& entry) const {
  std::vector<std::byte> bytes(entry.size);
  read_at(data_offset_ + entry.offset, bytes, "tensor '" + entry.name + "'");
  check_crc(entry, bytes);
  return bytes;
}

}  // namespace backend
