// NPY writer and memory-mapped reader; see npy_file.hpp. The header layout is numpy's
// numpy/lib/format.py (_write_array_header: the dict's repr, padded to ARRAY_ALIGN = 64).
#include "backend/data/npy_file.hpp"

#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "backend/common/checked_math.hpp"
#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/python_format.hpp"

namespace backend {

using common::format_python_shape;

namespace {

constexpr std::string_view kNpyMagic = "\x93NUMPY";
constexpr size_t kAlignment = 64;

// The value of 'key' in the header dict, as the raw text up to the next top-level comma.
std::string_view dict_value(std::string_view header, std::string_view key,
                            const std::filesystem::path& path) {
  const std::string quoted = fmt::format("'{}'", key);
  const size_t at = header.find(quoted);
  if (at == std::string_view::npos) {
    common::fail("{}: the .npy header has no '{}' entry: {}", path.string(), key, header);
  }
  size_t begin = header.find(':', at + quoted.size());
  if (begin == std::string_view::npos) common::fail("{}: malformed .npy header: {}", path.string(), header);
  ++begin;
  while (begin < header.size() && header[begin] == ' ') ++begin;
  size_t end = begin;
  int depth = 0;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' && depth == 0) || c == '}') break;
  }
  return header.substr(begin, end - begin);
}

}  // namespace

int npy_element_size(NpyElement element) {
  switch (element) {
    case NpyElement::int16: return 2;
    case NpyElement::int32:
    case NpyElement::uint32: return 4;
    case NpyElement::int64: return 8;
  }
  return 8;
}

const char* npy_descr(NpyElement element) {
  switch (element) {
    case NpyElement::int16: return "<i2";
    case NpyElement::int32: return "<i4";
    case NpyElement::uint32: return "<u4";
    case NpyElement::int64: return "<i8";
  }
  return "<i8";
}

std::string npy_header(NpyElement element, std::span<const int64_t> shape) {
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                 npy_descr(element), format_python_shape(shape));
  // 10 bytes of magic, version and length, then the dict, spaces, '\n'.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((kAlignment - unpadded % kAlignment) % kAlignment, ' ');
  dict.push_back('\n');
  if (dict.size() > 65535) common::fail("npy header of {} bytes does not fit version 1.0", dict.size());
  std::string header(kNpyMagic);
  header.push_back('\x01');
  header.push_back('\x00');
  header.push_back(static_cast<char>(dict.size() & 0xff));
  header.push_back(static_cast<char>(dict.size() >> 8));
  return header + dict;
}

void write_npy(const std::filesystem::path& path, NpyElement element,
               std::span<const int64_t> shape, std::span<const std::byte> data) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  if (count * npy_element_size(element) != static_cast<int64_t>(data.size())) {
    common::fail("{}: {} bytes of data for shape {} of {}", path.string(), data.size(),
                 format_python_shape(shape), npy_descr(element));
  }
  const std::filesystem::path target = common::replaceable_output_file(path, "the index cache");
  common::DurableFileWriter writer = common::DurableFileWriter::temporary_for(target);
  const std::filesystem::path temporary = writer.path();
  std::error_code ignored;
  try {
    const std::string header = npy_header(element, shape);
    writer.write(std::as_bytes(std::span(header.data(), header.size())));
    writer.write(data);
    writer.finish();
    common::rename_path(temporary, target);
  } catch (...) {
    std::filesystem::remove(temporary, ignored);
    throw;
  }
  common::fsync_directory(target.parent_path().empty() ? std::filesystem::path(".")
                                                       : target.parent_path());
}

// The mapping is a member: a refused file is unmapped as the constructor throws.
NpyArray::NpyArray(const std::filesystem::path& path)
    : path_(path), mapping_(path, ".npy file") {
  parse_header();
}

void NpyArray::parse_header() {
  const std::filesystem::path& path = path_;
  const auto* bytes = reinterpret_cast<const char*>(mapping_.bytes().data());
  const size_t size = mapping_.bytes().size();
  if (size < 10 || std::string_view(bytes, 6) != kNpyMagic) {
    common::fail("{}: not a .npy file (it does not start with \"\\x93NUMPY\")", path.string());
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_length = 0, header_start = 0;
  if (major == 1) {
    header_length = static_cast<unsigned char>(bytes[8]) | static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8;
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) common::fail("{}: truncated .npy header", path.string());
    for (int i = 0; i < 4; ++i) header_length |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    header_start = 12;
  } else {
    common::fail("{}: .npy format version {} is unknown (valid: 1, 2, 3)", path.string(), major);
  }
  if (header_start + header_length > size) common::fail("{}: truncated .npy header", path.string());
  const std::string_view header(bytes + header_start, header_length);

  const std::string_view descr = dict_value(header, "descr", path);
  bool known = false;
  for (NpyElement candidate : {NpyElement::int16, NpyElement::int32, NpyElement::int64, NpyElement::uint32}) {
    if (descr == fmt::format("'{}'", npy_descr(candidate))) {
      element_ = candidate;
      known = true;
    }
  }
  if (!known) {
    common::fail("{}: element type {} is not one of the index types ('<i2', '<i4', '<i8', '<u4')",
                 path.string(), descr);
  }
  item_size_ = npy_element_size(element_);
  const std::string_view order = dict_value(header, "fortran_order", path);
  const std::string_view shape = dict_value(header, "shape", path);
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') {
    common::fail("{}: the .npy shape {} is not a tuple", path.string(), shape);
  }
  std::string_view inner = shape.substr(1, shape.size() - 2);
  while (!inner.empty()) {
    const size_t comma = inner.find(',');
    std::string_view field = inner.substr(0, comma);
    while (!field.empty() && field.front() == ' ') field.remove_prefix(1);
    while (!field.empty() && field.back() == ' ') field.remove_suffix(1);
    // Python's tuple syntax: a field may be empty only after the last comma, as in "(10, )".
    if (field.empty() && (comma != std::string_view::npos || shape_.empty())) {
      common::fail("{}: the .npy shape {} is not a tuple of sizes", path.string(), shape);
    }
    if (!field.empty()) {
      int64_t extent = 0;
      for (char c : field) {
        if (c < '0' || c > '9' || extent > (int64_t{1} << 50)) {
          common::fail("{}: the .npy shape {} is not a tuple of sizes", path.string(), shape);
        }
        extent = extent * 10 + (c - '0');
      }
      shape_.push_back(extent);
    }
    if (comma == std::string_view::npos) break;
    inner.remove_prefix(comma + 1);
  }
  if (order != "False" && shape_.size() > 1) {
    common::fail("{}: a Fortran-ordered array; the index arrays are C-ordered", path.string());
  }
  const size_t data_start = header_start + header_length;
  // The element count in exact arithmetic: a product of extents that wrapped could match the
  // data's length.
  const std::optional<int64_t> elements = common::exact_product(shape_);
  int64_t needed = 0;
  if (!elements || __builtin_mul_overflow(*elements, item_size_, &needed)) {
    common::fail("{}: its header's shape {} of {} needs more than the {} bytes of data it holds",
                 path.string(), shape, descr, size - data_start);
  }
  size_ = *elements;
  const auto expected = static_cast<size_t>(needed);
  if (size - data_start != expected) {
    common::fail("{}: {} bytes of data, but its header's shape {} of {} needs {}", path.string(),
                 size - data_start, shape, descr, expected);
  }
  data_ = reinterpret_cast<const std::byte*>(bytes + data_start);
}

}  // namespace backend
