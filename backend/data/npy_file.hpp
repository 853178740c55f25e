// NumPy's .npy format (numpy/lib/format.py, "NPY format version 1.0"), for the index arrays
// Megatron caches next to a dataset (numpy.save / numpy.load(mmap_mode='r')):
//
//   "\x93NUMPY"  major 1  minor 0  uint16 LE header length H
//   header       H bytes of a Python dict literal, e.g.
//                {'descr': '<i4', 'fortran_order': False, 'shape': (10,), }
//                padded with spaces and ended by '\n' so that 10 + H is a multiple of 64
//   data         the elements, C order, little-endian
//
// write_npy produces the bytes numpy.save writes for the same array, under a temporary name
// that is renamed into place after fsync (a crash leaves no partial file under the final name).
// NpyArray memory-maps a file for reading (versions 1, 2 and 3 of the header are accepted) and
// refuses, naming the file, anything that is not a C-ordered array of the integer types below or
// whose size does not match its header.
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

namespace backend {

// The element types of Megatron's index arrays (and the blend's dataset index, int16).
enum class NpyElement { int16, int32, int64, uint32 };

int npy_element_size(NpyElement element);
const char* npy_descr(NpyElement element);  // '<i2', '<i4', '<i8', '<u4'

template <typename T>
constexpr NpyElement npy_element_of();
template <> constexpr NpyElement npy_element_of<int16_t>() { return NpyElement::int16; }
template <> constexpr NpyElement npy_element_of<int32_t>() { return NpyElement::int32; }
template <> constexpr NpyElement npy_element_of<int64_t>() { return NpyElement::int64; }
template <> constexpr NpyElement npy_element_of<uint32_t>() { return NpyElement::uint32; }

// The header bytes (magic to '\n') numpy.save writes for an array of this type and shape.
std::string npy_header(NpyElement element, std::span<const int64_t> shape);

// Writes `data` (the elements, already little-endian) as `path`, crash-safely.
void write_npy(const std::filesystem::path& path, NpyElement element,
               std::span<const int64_t> shape, std::span<const std::byte> data);

template <typename T>
void write_npy(const std::filesystem::path& path, std::span<const T> values,
               std::span<const int64_t> shape) {
  write_npy(path, npy_element_of<T>(), shape, std::as_bytes(values));
}

class NpyArray {
 public:
  explicit NpyArray(const std::filesystem::path& path);

  NpyElement element() const { return element_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t size() const { return size_; }  // elements in all
  const std::filesystem::path& path() const { return path_; }

  // Element i of the flattened array, widened to int64.
  int64_t operator[](int64_t i) const {
    const std::byte* p = data_ + i * item_size_;
    switch (element_) {
      case NpyElement::int16: { int16_t v; std::memcpy(&v, p, 2); return v; }
      case NpyElement::int32: { int32_t v; std::memcpy(&v, p, 4); return v; }
      case NpyElement::uint32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
      case NpyElement::int64: break;
    }
    int64_t v;
    std::memcpy(&v, p, 8);
    return v;
  }

 private:
  // The header and length checks of the constructor, over the mapping; fills the fields.
  void parse_header();
  std::filesystem::path path_;
  common::MappedFile mapping_;
  const std::byte* data_ = nullptr;
  NpyElement element_ = NpyElement::int32;
  int64_t item_size_ = 4;
  std::vector<int64_t> shape_;
  int64_t size_ = 0;
};

}  // namespace backend
