// Megatron's MMapIndexedDataset (megatron/core/datasets/indexed_dataset.py): token sequences
// in a .bin file, described by a .idx file. Byte for byte, all integers little-endian:
//
//   .idx  "MMIDIDX\0\0"                9 bytes, magic
//         version                      uint64 = 1
//         dtype code                   uint8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
//                                             6 float64, 7 float32, 8 uint16
//         sequence count S             uint64
//         document count D + 1         uint64 (the document index array's length)
//         sequence lengths             int32[S], tokens per sequence
//         sequence pointers            int64[S], byte offset of each sequence in the .bin
//         document indices             int64[D + 1], 0 then the sequence count after each
//                                      document, so document d is sequences [idx[d], idx[d+1])
//         (multimodal datasets add int8[S] modes; not written here, tolerated when read)
//   .bin  the sequences' tokens, back to back, in the dtype
//
// A document is usually one sequence (preprocess_data without --split-sentences); an empty
// document is recorded as zero sequences (its document index repeats the previous one), as
// IndexedDatasetBuilder.add_document does with an empty length list. The dtype is uint16 when
// the vocabulary has fewer than 65,500 ids, else int32 (DType.optimal_dtype).
//
// The writer streams: tokens go straight to the .bin, sequence lengths straight into the .idx
// after its header, pointers and document indices to two spill files, so memory stays constant
// whatever the corpus (Megatron keeps Python lists of all three, which is what runs machines
// out of memory on tens of millions of documents).
//
// The two files are one pair, and appear together or not at all. Both are written under
// `<name>.tmp-<pid>` next to the outputs and fsynced; finalize() then removes the old .idx,
// renames the .bin, renames the .idx last, fsyncing the directory after each step. Two
// renames cannot be one atomic step, so a kill in between leaves a .bin without an .idx, which
// no reader takes, never a new .bin beside the old .idx. The writer holds `<prefix>.lock`
// (file_lock.hpp) from construction to finalize, so a second writer of the same prefix is
// refused while the first lives, and under it removes the temporaries a killed writer of the
// prefix left (reported). Temporaries of a writer destroyed without finalize() are removed.
//
// The reader memory-maps both files and checks them (magic, version, dtype, sizes, pointers
// within the .bin, document indices ordered, and the .bin exactly as long as the sequences the
// .idx describes, so that a .bin and an .idx of different runs are refused as not one pair)
// with messages naming the files. The index arrays
// start at byte 34, so they are not aligned for their types: they are read through accessors
// (unaligned loads), never as spans.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/common/user_file.hpp"

namespace common {
class ExclusiveFileLock;
}  // namespace common

namespace backend {

enum class DType : uint8_t {
  uint8 = 1, int8 = 2, int16 = 3, int32 = 4, int64 = 5, float64 = 6, float32 = 7, uint16 = 8,
};

int dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// DType.optimal_dtype: uint16 for a vocabulary of fewer than 65,500 ids, else int32.
DType optimal_dtype(int64_t vocab_size);

std::string index_file_path(const std::string& prefix);  // prefix + ".idx"
std::string data_file_path(const std::string& prefix);   // prefix + ".bin"

class IndexedDatasetWriter {
 public:
  // Token dtype must be uint16 or int32 (what preprocessing writes).
  IndexedDatasetWriter(std::string prefix, DType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends documents: `token_bytes` holds their tokens already in the dtype, split into
  // sequences by `sequence_lengths` (tokens each), which belong to the documents in order,
  // `sequences_per_document[d]` of them to document d (0 for an empty document).
  void add_documents(std::span<const std::byte> token_bytes,
                     std::span<const int32_t> sequence_lengths,
                     std::span<const int32_t> sequences_per_document);
  // One document from int32 ids, converted to the dtype (an id that does not fit is an error).
  void add_document(std::span<const int32_t> tokens, std::span<const int32_t> sequence_lengths);
  // Appends every document of an existing dataset, which must have the same dtype
  // (IndexedDatasetBuilder.add_index, used by tools/merge_datasets.py).
  void add_dataset(const std::string& prefix);

  // Writes the index and publishes the pair (the steps above).
  void finalize();

  DType dtype() const { return dtype_; }
  int64_t sequence_count() const { return sequence_count_; }
  int64_t document_count() const { return document_count_; }
  int64_t token_count() const { return data_bytes_ / dtype_size(dtype_); }

 private:
  class File;
  void add_sequence_lengths(std::span<const int32_t> lengths);

  std::string prefix_;
  DType dtype_;
  std::unique_ptr<common::ExclusiveFileLock> lock_;
  std::unique_ptr<File> data_, index_, pointers_, documents_;
  int64_t sequence_count_ = 0, document_count_ = 0, data_bytes_ = 0;
  bool finalized_ = false;
};

class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  DType dtype() const { return dtype_; }
  int64_t sequence_count() const { return sequence_count_; }
  int64_t document_count() const { return document_index_count_ - 1; }
  int32_t sequence_length(int64_t sequence) const { return load<int32_t>(lengths_, sequence); }
  int64_t sequence_pointer(int64_t sequence) const { return load<int64_t>(pointers_, sequence); }
  // Entry i of the document indices (i in [0, document_count()]).
  int64_t document_index(int64_t i) const { return load<int64_t>(documents_, i); }
  // The .bin bytes of all sequences, and the .idx file's bytes.
  std::span<const std::byte> data() const { return data_; }
  std::span<const std::byte> index_bytes() const { return index_; }

  // Tokens [offset, offset + out.size()) of sequence `sequence`, as int32 (Megatron's
  // get(idx, offset, length)); the dtype must be an integer type.
  void read_tokens(int64_t sequence, int64_t offset, std::span<int32_t> out) const;

 private:
  template <typename T>
  static T load(const std::byte* base, int64_t i) {
    T value;
    std::memcpy(&value, base + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return value;
  }

  std::string prefix_;
  common::MappedFile index_mapping_, data_mapping_;
  DType dtype_ = DType::uint16;
  int64_t sequence_count_ = 0, document_index_count_ = 0;
  const std::byte *lengths_ = nullptr, *pointers_ = nullptr, *documents_ = nullptr;
  std::span<const std::byte> index_, data_;
};

}  // namespace backend
