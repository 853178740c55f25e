// safetensors reader and writer; see safetensors.hpp. The checks follow the reference
// implementation's Metadata::validate (safetensors/src/tensor.rs): a header of at most 100 MB
// that fits in the file, tensors whose byte ranges, sorted by begin, tile the data region
// exactly, and byte counts equal to the element count times the dtype's size.
#include "backend/ckpt/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <istream>
#include <limits>
#include <set>
#include <span>
#include <streambuf>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/user_file.hpp"
#include "backend/core/element_type.hpp"

namespace backend {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies bytes as they are");

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr const char* kMetadataKey = "__metadata__";

// A mapped file's bytes as a std::istream's buffer, read-only, with the seeking
// read_safetensors(istream) does to reach each tensor.
class MappedBytesBuffer : public std::streambuf {
 public:
  explicit MappedBytesBuffer(std::span<const std::byte> bytes) {
    // The get area is char* by the interface; nothing writes through it (no putback of
    // another character), and the mapping is read-only.
    char* begin = const_cast<char*>(reinterpret_cast<const char*>(bytes.data()));
    setg(begin, begin, begin + bytes.size());
  }

 protected:
  pos_type seekoff(off_type offset, std::ios_base::seekdir direction,
                   std::ios_base::openmode which) override {
    const off_type base = direction == std::ios_base::beg   ? 0
                          : direction == std::ios_base::cur ? gptr() - eback()
                                                            : egptr() - eback();
    return seekpos(pos_type(base + offset), which);
  }
  pos_type seekpos(pos_type position, std::ios_base::openmode) override {
    const off_type at = position;
    if (at < 0 || at > egptr() - eback()) return pos_type(off_type(-1));
    setg(eback(), eback() + at, egptr());
    return position;
  }
};

// IEEE binary16 → binary32, exact for every input (subnormals, infinities, NaN payloads).
float half_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise the mantissa into a normal float.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    bits = sign | (static_cast<uint32_t>(127 - 15 + 1 - shift) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

// Reads an unsigned integer JSON value or fails naming what it is.
uint64_t json_unsigned(const nlohmann::json& value, const std::string& where) {
  if (!value.is_number_unsigned() && !(value.is_number_integer() && value.get<int64_t>() >= 0)) {
    common::fail("{} must be a non-negative integer, got {}", where, value.dump());
  }
  return value.get<uint64_t>();
}

struct HeaderEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

}  // namespace

int64_t safetensors_dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E5M2" ||
      dtype == "F8_E4M3") {
    return 1;
  }
  return 0;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const NamedTensor& tensor : tensors) {
    if (tensor.name.empty() || tensor.name == kMetadataKey) {
      common::fail("{}: a tensor may not be named '{}'", path.string(), tensor.name);
    }
    if (!names.insert(tensor.name).second) {
      common::fail("{}: tensor '{}' is given twice", path.string(), tensor.name);
    }
    int64_t numel = 1;
    for (const int64_t dim : tensor.shape) {
      if (dim < 0) common::fail("{}: tensor '{}' has a negative dimension", path.string(), tensor.name);
      numel *= dim;
    }
    if (numel != static_cast<int64_t>(tensor.values.size())) {
      common::fail("{}: tensor '{}' has {} values but its shape holds {}", path.string(),
                   tensor.name, tensor.values.size(), numel);
    }
    const uint64_t bytes = static_cast<uint64_t>(numel) * sizeof(float);
    header[tensor.name] = {{"dtype", "F32"},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  // Written beside the target and renamed over it, so a reader never sees half a file; the
  // target follows common::output_target's rule (a device or FIFO is refused).
  const std::filesystem::path target =
      common::replaceable_output_file(path, "the safetensors file");
  common::DurableFileWriter writer = common::DurableFileWriter::temporary_for(target);
  const std::filesystem::path temporary = writer.path();
  try {
    const uint64_t header_length = header_text.size();
    writer.write(std::as_bytes(std::span(&header_length, 1)));
    writer.write(std::as_bytes(std::span(header_text.data(), header_text.size())));
    for (const NamedTensor& tensor : tensors) {
      writer.write(std::as_bytes(std::span(tensor.values.data(), tensor.values.size())));
    }
    writer.finish();
    common::rename_path(temporary, target);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
  common::fsync_directory(target.parent_path().empty() ? std::filesystem::path(".")
                                                       : target.parent_path());
}

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  // Mapped, not opened as a stream: a directory, FIFO or device is refused before a byte is
  // read (a FIFO is not waited on), whatever replaces the path between a check and an open.
  const common::MappedFile file(path, "the safetensors file");
  MappedBytesBuffer buffer(file.bytes());
  std::istream in(&buffer);
  return read_safetensors(in, file.bytes().size(), path.string());
}

SafetensorsFile read_safetensors(std::istream& in, uint64_t file_size, const std::string& file) {
  if (file_size < 8) {
    common::fail("{} is not a safetensors file: {} bytes, shorter than the 8-byte header length",
                 file, file_size);
  }
  uint64_t header_length = 0;
  in.read(reinterpret_cast<char*>(&header_length), sizeof(header_length));
  if (header_length > kMaxHeaderBytes) {
    common::fail("{}: header length {} exceeds the format's limit of {} bytes (corrupt or not a "
                 "safetensors file)", file, header_length, kMaxHeaderBytes);
  }
  if (header_length > file_size - 8) {
    common::fail("{}: header length {} runs past the end of the {}-byte file (truncated or not a "
                 "safetensors file)", file, header_length, file_size);
  }
  std::string header_text(header_length, '\0');
  in.read(header_text.data(), static_cast<std::streamsize>(header_length));
  if (!in) common::fail("{}: cannot read the {}-byte header", file, header_length);

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text);
  } catch (const nlohmann::json::exception& error) {
    // parse_error, and out_of_range for a number beyond a double's range (1e999).
    common::fail("{}: the header is not valid JSON: {}", file, error.what());
  }
  if (!header.is_object()) common::fail("{}: the header must be a JSON object", file);

  SafetensorsFile result;
  std::vector<HeaderEntry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) common::fail("{}: __metadata__ must be an object of strings", file);
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          common::fail("{}: __metadata__ value '{}' must be a string, got {}", file, key, text.dump());
        }
        result.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("{}: tensor '{}'", file, name);
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets")) {
      common::fail("{} must be an object with dtype, shape and data_offsets, got {}", where,
                   value.dump());
    }
    HeaderEntry entry;
    entry.name = name;
    if (!value["dtype"].is_string()) common::fail("{}: dtype must be a string", where);
    entry.dtype = value["dtype"].get<std::string>();
    if (!value["shape"].is_array()) common::fail("{}: shape must be an array", where);
    for (const auto& dim : value["shape"]) {
      entry.shape.push_back(static_cast<int64_t>(json_unsigned(dim, where + " shape entry")));
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) {
      common::fail("{}: data_offsets must be [begin, end], got {}", where, offsets.dump());
    }
    entry.begin = json_unsigned(offsets[0], where + " data_offsets[0]");
    entry.end = json_unsigned(offsets[1], where + " data_offsets[1]");
    if (entry.end < entry.begin) {
      common::fail("{}: data_offsets [{}, {}] end before they begin", where, entry.begin, entry.end);
    }
    const int64_t element_size = safetensors_dtype_size(entry.dtype);
    if (element_size == 0) {
      common::fail("{}: '{}' is not a safetensors dtype", where, entry.dtype);
    }
    if (entry.dtype != "F32" && entry.dtype != "F64" && entry.dtype != "F16" &&
        entry.dtype != "BF16") {
      common::fail("{}: dtype {} is not supported here (valid: F32, F64, F16, BF16)", where,
                   entry.dtype);
    }
    uint64_t numel = 1;
    for (const int64_t dim : entry.shape) {
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / static_cast<uint64_t>(dim)) {
        common::fail("{}: shape {} is too large", where, value["shape"].dump());
      }
      numel *= static_cast<uint64_t>(dim);
    }
    if (numel * static_cast<uint64_t>(element_size) != entry.end - entry.begin) {
      common::fail("{}: shape {} of {} needs {} bytes, but data_offsets [{}, {}] span {}", where,
                   value["shape"].dump(), entry.dtype, numel * element_size, entry.begin,
                   entry.end, entry.end - entry.begin);
    }
    entries.push_back(std::move(entry));
  }

  // Sorted by begin, the byte ranges must tile [0, data size) exactly.
  std::sort(entries.begin(), entries.end(), [](const HeaderEntry& a, const HeaderEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_size = file_size - 8 - header_length;
  uint64_t expected_begin = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const HeaderEntry& entry = entries[i];
    if (entry.begin < expected_begin) {
      common::fail("{}: tensor '{}' at bytes [{}, {}) overlaps tensor '{}' (which ends at {})",
                   file, entry.name, entry.begin, entry.end, entries[i - 1].name, expected_begin);
    }
    if (entry.begin > expected_begin) {
      common::fail("{}: {} unaccounted bytes before tensor '{}' at [{}, {}) (corrupt header)",
                   file, entry.begin - expected_begin, entry.name, entry.begin, entry.end);
    }
    if (entry.end > data_size) {
      common::fail("{}: tensor '{}' at bytes [{}, {}) runs past the {}-byte data region "
                   "(truncated file?)", file, entry.name, entry.begin, entry.end, data_size);
    }
    expected_begin = entry.end;
  }
  if (expected_begin != data_size) {
    common::fail("{}: the tensors cover {} bytes of the {}-byte data region ({} trailing bytes)",
                 file, expected_begin, data_size, data_size - expected_begin);
  }

  std::vector<char> bytes;
  for (HeaderEntry& entry : entries) {
    NamedTensor tensor;
    tensor.name = entry.name;
    tensor.shape = entry.shape;
    const uint64_t byte_count = entry.end - entry.begin;
    bytes.resize(byte_count);
    in.seekg(static_cast<std::streamoff>(8 + header_length + entry.begin));
    in.read(bytes.data(), static_cast<std::streamsize>(byte_count));
    if (!in) common::fail("{}: cannot read the data of tensor '{}'", file, entry.name);
    const int64_t element_size = safetensors_dtype_size(entry.dtype);
    const size_t numel = byte_count / static_cast<uint64_t>(element_size);
    tensor.values.resize(numel);
    if (entry.dtype == "F32") {
      // An empty tensor's vectors may hold no buffer, and memcpy from null is undefined.
      if (byte_count > 0) std::memcpy(tensor.values.data(), bytes.data(), byte_count);
    } else if (entry.dtype == "F64") {
      for (size_t i = 0; i < numel; ++i) {
        double value;
        std::memcpy(&value, bytes.data() + 8 * i, 8);
        tensor.values[i] = static_cast<float>(value);
      }
    } else {
      const bool is_half = entry.dtype == "F16";
      for (size_t i = 0; i < numel; ++i) {
        uint16_t value;
        std::memcpy(&value, bytes.data() + 2 * i, 2);
        tensor.values[i] = is_half ? half_to_float(value) : to_float(bfloat16{value});
      }
    }
    result.tensors.push_back(std::move(tensor));
  }
  return result;
}

}  // namespace backend
