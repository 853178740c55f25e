// MMapIndexedDataset writer and reader (format, streaming and crash-safety rules in
// indexed_dataset.hpp).
#include "backend/data/indexed_dataset.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <string_view>

#include "backend/common/durable_file.hpp"
#include "backend/common/file_lock.hpp"
#include "backend/common/error.hpp"
#include "backend/common/write_all.hpp"

namespace backend {
namespace {

constexpr std::array<char, 9> kIndexMagic = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

bool valid_dtype_code(uint8_t code) { return code >= 1 && code <= 8; }

std::string temporary_name(const std::string& path) {
  return path + ".tmp-" + std::to_string(::getpid());
}

std::filesystem::path directory_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

// The pid of `name` when it is `<stem><suffix>.tmp-<pid>` for one of the writer's files.
std::optional<long> leftover_pid(std::string_view name, std::string_view stem) {
  if (!name.starts_with(stem)) return std::nullopt;
  name.remove_prefix(stem.size());
  for (std::string_view suffix : {".bin.tmp-", ".idx.tmp-", ".idx.pointers.tmp-", ".idx.documents.tmp-"}) {
    if (!name.starts_with(suffix)) continue;
    const std::string_view digits = name.substr(suffix.size());
    long pid = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (error == std::errc() && end == digits.data() + digits.size() && !digits.empty()) return pid;
  }
  return std::nullopt;
}

// Under the prefix's lock no other writer of it is alive, so every temporary of the prefix is
// what a killed run left.
void remove_leftovers(const std::string& prefix) {
  const std::string stem = std::filesystem::path(prefix).filename().string();
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory_of(prefix), error)) {
    const std::string name = entry.path().filename().string();
    const auto pid = leftover_pid(name, stem);
    if (!pid) continue;
    std::error_code remove_error;
    if (std::filesystem::remove(entry.path(), remove_error)) {
      spdlog::warn("removed {}, left by an interrupted run (pid {})", entry.path().string(), *pid);
    }
  }
}

// "(<idx>.tmp-N is there: ...)" when the .idx is missing because a run publishing the pair
// was interrupted, else "".
std::string interrupted_write_note(const std::string& index_path) {
  std::error_code error;
  const std::filesystem::path path(index_path);
  for (const auto& entry : std::filesystem::directory_iterator(directory_of(index_path), error)) {
    const std::string name = entry.path().filename().string();
    const std::string stem = path.filename().string();
    if (name.starts_with(stem + ".tmp-")) {
      return fmt::format("; {} is there: a run writing this dataset was interrupted, run it again",
                         entry.path().string());
    }
  }
  return "";
}

void sync_directory_of(const std::string& path) { common::fsync_directory(directory_of(path)); }

}  // namespace

int dtype_size(DType dtype) {
  switch (dtype) {
    case DType::uint8: case DType::int8: return 1;
    case DType::int16: case DType::uint16: return 2;
    case DType::int32: case DType::float32: return 4;
    case DType::int64: case DType::float64: return 8;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::uint8: return "uint8";
    case DType::int8: return "int8";
    case DType::int16: return "int16";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::float64: return "float64";
    case DType::float32: return "float32";
    case DType::uint16: return "uint16";
  }
  return "unknown";
}

DType optimal_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? DType::uint16 : DType::int32;
}

std::string index_file_path(const std::string& prefix) { return prefix + ".idx"; }
std::string data_file_path(const std::string& prefix) { return prefix + ".bin"; }

// ---- a buffered output file under a temporary name
// `published`: the file gets `path` when finished (the .bin and the .idx), so `path` follows
// common::output_target's rule: a link has its target file replaced, a device, FIFO or
// directory is refused before anything is written. The scratch files are never published.
class IndexedDatasetWriter::File {
 public:
  File(const std::string& path, bool published)
      : path_(published ? common::replaceable_output_file(path, "the dataset file").string()
                        : path),
        temporary_(temporary_name(path_)) {
    fd_ = ::open(temporary_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) common::fail("cannot create {}: {}", temporary_, std::strerror(errno));
    buffer_.reserve(kBufferBytes);
  }
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }

  void write(const void* data, size_t size) {
    const auto* bytes = static_cast<const char*>(data);
    if (buffer_.size() + size > kBufferBytes) flush();
    if (size >= kBufferBytes) {
      write_fully(bytes, size);
      return;
    }
    buffer_.insert(buffer_.end(), bytes, bytes + size);
  }
  template <typename T>
  void write_value(T value) {
    write(&value, sizeof value);
  }

  void flush() {
    write_fully(buffer_.data(), buffer_.size());
    buffer_.clear();
  }

  void write_at(int64_t offset, const void* data, size_t size) {
    flush();
    if (const int error = common::write_all(fd_, data, size, offset); error != 0) {
      common::fail("cannot write {}: {}", temporary_, std::strerror(error));
    }
  }

  // Appends the whole contents of `other` (flushed) to this file.
  void append(File& other) {
    other.flush();
    flush();
    std::vector<char> chunk(kBufferBytes);
    for (off_t offset = 0;;) {
      const ssize_t got = ::pread(other.fd_, chunk.data(), chunk.size(), offset);
      if (got < 0) common::fail("cannot read {}: {}", other.temporary_, std::strerror(errno));
      if (got == 0) break;
      write_fully(chunk.data(), static_cast<size_t>(got));
      offset += got;
    }
  }

  // Flushes to disk, under the temporary name.
  void sync() {
    flush();
    if (::fsync(fd_) != 0) common::fail("cannot write {}: {}", temporary_, std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
  }

  // Gives the synced file its final name.
  void publish() {
    if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
      common::fail("cannot rename {} to {}: {}", temporary_, path_, std::strerror(errno));
    }
    committed_ = true;
  }

  const std::string& path() const { return path_; }

  void remove_temporary() {
    if (!committed_) ::unlink(temporary_.c_str());
  }

 private:
  static constexpr size_t kBufferBytes = size_t(4) << 20;

  void write_fully(const char* data, size_t size) {
    if (const int error = common::write_all(fd_, data, size); error != 0) {
      common::fail("cannot write {}: {}", temporary_, std::strerror(error));
    }
  }

  std::string path_, temporary_;
  int fd_ = -1;
  std::vector<char> buffer_;
  bool committed_ = false;
};

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, DType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  if (!valid_dtype_code(static_cast<uint8_t>(dtype))) common::fail("unknown dtype code");
  const std::string lock_path = prefix_ + ".lock";
  common::LockHolder holder;
  auto lock = common::ExclusiveFileLock::try_lock(lock_path, holder);
  if (!lock) {
    common::fail("{}: another process (pid {} on {}) is writing this dataset now (it holds {}); "
                 "wait for it to finish, or write to another --output-prefix",
                 prefix_, holder.pid.empty() ? "unknown" : holder.pid,
                 holder.host.empty() ? "an unknown host" : holder.host, lock_path);
  }
  lock_ = std::make_unique<common::ExclusiveFileLock>(std::move(*lock));
  remove_leftovers(prefix_);
  try {
    data_ = std::make_unique<File>(data_file_path(prefix_), true);
    index_ = std::make_unique<File>(index_file_path(prefix_), true);
    pointers_ = std::make_unique<File>(index_file_path(prefix_) + ".pointers", false);
    documents_ = std::make_unique<File>(index_file_path(prefix_) + ".documents", false);
  } catch (...) {
    for (File* file : {data_.get(), index_.get(), pointers_.get(), documents_.get()}) {
      if (file != nullptr) file->remove_temporary();
    }
    throw;
  }
  const std::array<char, kHeaderBytes> placeholder{};
  index_->write(placeholder.data(), placeholder.size());
  documents_->write_value<int64_t>(0);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  for (File* file : {data_.get(), index_.get(), pointers_.get(), documents_.get()}) {
    file->remove_temporary();
  }
}

void IndexedDatasetWriter::add_sequence_lengths(std::span<const int32_t> lengths) {
  const int64_t item = dtype_size(dtype_);
  for (const int32_t length : lengths) {
    if (length < 0) common::fail("{}: negative sequence length {}", prefix_, length);
    pointers_->write_value<int64_t>(data_bytes_);
    index_->write_value<int32_t>(length);
    data_bytes_ += length * item;
    ++sequence_count_;
  }
}

void IndexedDatasetWriter::add_documents(std::span<const std::byte> token_bytes,
                                         std::span<const int32_t> sequence_lengths,
                                         std::span<const int32_t> sequences_per_document) {
  const int64_t tokens = std::accumulate(sequence_lengths.begin(), sequence_lengths.end(),
                                         int64_t{0});
  const int64_t sequences = std::accumulate(sequences_per_document.begin(),
                                            sequences_per_document.end(), int64_t{0});
  if (tokens * dtype_size(dtype_) != static_cast<int64_t>(token_bytes.size()) ||
      sequences != static_cast<int64_t>(sequence_lengths.size())) {
    common::fail("{}: add_documents got {} bytes for {} tokens and {} sequences for {}",
                 prefix_, token_bytes.size(), tokens, sequences, sequence_lengths.size());
  }
  data_->write(token_bytes.data(), token_bytes.size());
  add_sequence_lengths(sequence_lengths);
  int64_t sequence_end = sequence_count_ - sequences;
  for (const int32_t count : sequences_per_document) {
    sequence_end += count;
    documents_->write_value<int64_t>(sequence_end);
    ++document_count_;
  }
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens,
                                        std::span<const int32_t> sequence_lengths) {
  std::vector<std::byte> bytes(tokens.size() * static_cast<size_t>(dtype_size(dtype_)));
  const auto check = [&](int32_t token, int64_t low, int64_t high) {
    if (token < low || token > high) {
      common::fail("{}: token {} does not fit the dataset's dtype {}", prefix_, token,
                   dtype_name(dtype_));
    }
  };
  for (size_t i = 0; i < tokens.size(); ++i) {
    switch (dtype_) {
      case DType::uint16: {
        check(tokens[i], 0, 65535);
        const auto value = static_cast<uint16_t>(tokens[i]);
        std::memcpy(bytes.data() + 2 * i, &value, 2);
        break;
      }
      case DType::int32:
        std::memcpy(bytes.data() + 4 * i, &tokens[i], 4);
        break;
      default:
        common::fail("{}: add_document writes uint16 or int32 tokens, not {}", prefix_,
                     dtype_name(dtype_));
    }
  }
  const int32_t sequences = static_cast<int32_t>(sequence_lengths.size());
  add_documents(bytes, sequence_lengths, std::span<const int32_t>(&sequences, 1));
}

void IndexedDatasetWriter::add_dataset(const std::string& prefix) {
  const IndexedDataset input(prefix);
  if (input.dtype() != dtype_) {
    common::fail("{}: dtype {} differs from {}, the dtype of the datasets merged before it",
                 index_file_path(prefix), dtype_name(input.dtype()), dtype_name(dtype_));
  }
  // The merged pointers are recomputed from the lengths (as Megatron's _IndexWriter does), so
  // the input's sequences must lie back to back in its .bin.
  const int64_t item = dtype_size(dtype_);
  int64_t expected_pointer = 0;
  for (int64_t i = 0; i < input.sequence_count(); ++i) {
    if (input.sequence_pointer(i) != expected_pointer) {
      common::fail("{}: sequence {} starts at byte {}, not right after the previous one ({}); "
                   "only contiguous datasets can be merged", index_file_path(prefix), i,
                   input.sequence_pointer(i), expected_pointer);
    }
    expected_pointer += int64_t{input.sequence_length(i)} * item;
  }
  const std::span<const std::byte> data = input.data().first(static_cast<size_t>(expected_pointer));
  data_->write(data.data(), data.size());
  const int64_t sequence_offset = sequence_count_;
  for (int64_t i = 0; i < input.sequence_count(); ++i) {
    const int32_t length = input.sequence_length(i);
    add_sequence_lengths(std::span<const int32_t>(&length, 1));
  }
  for (int64_t d = 1; d <= input.document_count(); ++d) {
    documents_->write_value<int64_t>(sequence_offset + input.document_index(d));
    ++document_count_;
  }
}

void IndexedDatasetWriter::finalize() {
  if (finalized_) return;
  index_->append(*pointers_);
  index_->append(*documents_);
  std::array<char, kHeaderBytes> header{};
  std::memcpy(header.data(), kIndexMagic.data(), kIndexMagic.size());
  const uint64_t version = 1;
  const auto code = static_cast<uint8_t>(dtype_);
  const auto sequences = static_cast<uint64_t>(sequence_count_);
  const auto document_indices = static_cast<uint64_t>(document_count_ + 1);
  std::memcpy(header.data() + 9, &version, 8);
  std::memcpy(header.data() + 17, &code, 1);
  std::memcpy(header.data() + 18, &sequences, 8);
  std::memcpy(header.data() + 26, &document_indices, 8);
  index_->write_at(0, header.data(), header.size());
  data_->sync();
  index_->sync();
  common::crash_point("indexed-dataset:written");
  // The old .idx goes first: from here until the new .idx is in place, the prefix has no
  // .idx, which every reader refuses, instead of an old .idx beside a new .bin.
  const std::string& index_path = index_->path();
  if (::unlink(index_path.c_str()) != 0 && errno != ENOENT) {
    common::fail("cannot remove the previous {}: {}", index_path, std::strerror(errno));
  }
  sync_directory_of(index_path);
  common::crash_point("indexed-dataset:index-removed");
  data_->publish();
  sync_directory_of(data_->path());
  common::crash_point("indexed-dataset:data-renamed");
  index_->publish();
  sync_directory_of(index_path);
  common::crash_point("indexed-dataset:index-renamed");
  pointers_->remove_temporary();
  documents_->remove_temporary();
  lock_.reset();
  finalized_ = true;
}

// ---- reader
namespace {

// One of the pair mapped, or an error that says the prefix needs both (and, when the .idx is
// missing because a run publishing the pair was interrupted, that it was).
common::MappedFile map_dataset_file(const std::string& path, const std::string& prefix) {
  try {
    return common::MappedFile(path, "dataset file");
  } catch (const common::Error& error) {
    common::fail("{} (the dataset prefix {} needs both {}.idx and {}.bin{})", error.what(), prefix,
                 prefix, prefix, interrupted_write_note(path));
  }
}

}  // namespace

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix),
      index_mapping_(map_dataset_file(index_file_path(prefix), prefix)),
      data_mapping_(map_dataset_file(data_file_path(prefix), prefix)) {
  const std::string index_path = index_file_path(prefix), data_path = data_file_path(prefix);
  index_ = index_mapping_.bytes();
  data_ = data_mapping_.bytes();

  const auto size = static_cast<int64_t>(index_.size());
  if (size < kHeaderBytes) {
    common::fail("{}: {} bytes, too short for the {}-byte MMIDIDX header", index_path, size,
                 kHeaderBytes);
  }
  if (std::memcmp(index_.data(), kIndexMagic.data(), kIndexMagic.size()) != 0) {
    common::fail("{}: not a Megatron MMapIndexedDataset index (it does not start with "
                 "\"MMIDIDX\\0\\0\")", index_path);
  }
  uint64_t version = 0, sequences = 0, document_indices = 0;
  uint8_t code = 0;
  std::memcpy(&version, index_.data() + 9, 8);
  std::memcpy(&code, index_.data() + 17, 1);
  std::memcpy(&sequences, index_.data() + 18, 8);
  std::memcpy(&document_indices, index_.data() + 26, 8);
  if (version != 1) common::fail("{}: index version {}; only version 1 exists", index_path, version);
  if (!valid_dtype_code(code)) {
    common::fail("{}: dtype code {} is unknown (valid: 1 uint8, 2 int8, 3 int16, 4 int32, "
                 "5 int64, 6 float64, 7 float32, 8 uint16)", index_path, code);
  }
  dtype_ = static_cast<DType>(code);
  const auto limit = static_cast<uint64_t>(size);
  if (sequences > limit / 12 || document_indices > limit / 8) {
    common::fail("{}: {} bytes, but its header claims {} sequences and {} document indices",
                 index_path, size, sequences, document_indices);
  }
  const int64_t expected = kHeaderBytes + 12 * static_cast<int64_t>(sequences) +
                           8 * static_cast<int64_t>(document_indices);
  if (size != expected && size != expected + static_cast<int64_t>(sequences)) {
    common::fail("{}: {} bytes, but its header's {} sequences and {} document indices need {} "
                 "(or {} with multimodal modes)", index_path, size, sequences, document_indices,
                 expected, expected + static_cast<int64_t>(sequences));
  }
  if (document_indices == 0) {
    common::fail("{}: the document index array is empty (it always starts with 0)", index_path);
  }
  sequence_count_ = static_cast<int64_t>(sequences);
  document_index_count_ = static_cast<int64_t>(document_indices);
  lengths_ = index_.data() + kHeaderBytes;
  pointers_ = lengths_ + 4 * sequence_count_;
  documents_ = pointers_ + 8 * sequence_count_;

  int64_t previous = 0;
  for (int64_t i = 0; i < document_index_count_; ++i) {
    const int64_t value = document_index(i);
    if ((i == 0 && value != 0) || value < previous || value > sequence_count_ ||
        (i + 1 == document_index_count_ && value != sequence_count_)) {
      common::fail("{}: document index {} is {}; the indices must rise from 0 to the sequence "
                   "count {}", index_path, i, value, sequence_count_);
    }
    previous = value;
  }
  // The .bin must hold exactly the sequences the .idx describes: a longer or shorter one is
  // the .bin of another run (or of an interrupted write), whatever its sequences read as.
  const int64_t item = dtype_size(dtype_);
  const auto data_size = static_cast<int64_t>(data_.size());
  const auto not_one_pair = [&](const std::string& what) {
    common::fail("{} ({} bytes) and {} are not one pair: {}; they were written by different "
                 "runs, or a write was interrupted. Write the dataset again (preprocess_data)",
                 data_path, data_size, index_path, what);
  };
  int64_t extent = 0;
  for (int64_t i = 0; i < sequence_count_; ++i) {
    const int64_t length = sequence_length(i), pointer = sequence_pointer(i);
    if (length < 0 || pointer < 0) {
      common::fail("{}: sequence {} has length {} at byte {}", index_path, i, length, pointer);
    }
    if (pointer > data_size || length * item > data_size - pointer) {
      not_one_pair(fmt::format("sequence {} of the index ({} tokens from byte {}) ends past the "
                               ".bin", i, length, pointer));
    }
    extent = std::max(extent, pointer + length * item);
  }
  if (extent != data_size) {
    not_one_pair(fmt::format("the index's {} sequences end at byte {}, and the .bin holds {} "
                             "more", sequence_count_, extent, data_size - extent));
  }
}

IndexedDataset::~IndexedDataset() = default;

void IndexedDataset::read_tokens(int64_t sequence, int64_t offset, std::span<int32_t> out) const {
  if (sequence < 0 || sequence >= sequence_count_) {
    common::fail("{}: sequence {} is out of range (the dataset has {})", prefix_, sequence,
                 sequence_count_);
  }
  const auto count = static_cast<int64_t>(out.size());
  if (offset < 0 || offset + count > sequence_length(sequence)) {
    common::fail("{}: tokens [{}, {}) of sequence {} are out of range (it has {})", prefix_,
                 offset, offset + count, sequence, sequence_length(sequence));
  }
  const int64_t item = dtype_size(dtype_);
  const std::byte* source = data_.data() + sequence_pointer(sequence) + offset * item;
  for (int64_t i = 0; i < count; ++i) {
    const std::byte* p = source + i * item;
    int64_t value = 0;
    switch (dtype_) {
      case DType::uint8: value = std::to_integer<uint8_t>(*p); break;
      case DType::int8: value = static_cast<int8_t>(std::to_integer<uint8_t>(*p)); break;
      case DType::int16: { int16_t v; std::memcpy(&v, p, 2); value = v; break; }
      case DType::uint16: { uint16_t v; std::memcpy(&v, p, 2); value = v; break; }
      case DType::int32: { int32_t v; std::memcpy(&v, p, 4); value = v; break; }
      case DType::int64: { std::memcpy(&value, p, 8); break; }
      case DType::float32:
      case DType::float64:
        common::fail("{}: dtype {} does not hold token ids", index_file_path(prefix_),
                     dtype_name(dtype_));
    }
    if (value < 0 || value > std::numeric_limits<int32_t>::max()) {
      common::fail("{}: token {} of sequence {} is {}, not a token id", prefix_, offset + i,
                   sequence, value);
    }
    out[static_cast<size_t>(i)] = static_cast<int32_t>(value);
  }
}

}  // namespace backend
