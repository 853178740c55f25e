// Reader and writer of the safetensors format (Hugging Face, github.com/huggingface/safetensors,
// "Format" in its README), the file Hugging Face models are shipped in:
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   JSON: {"<tensor name>": {"dtype": "F32", "shape": [d0, d1, ...],
//                                      "data_offsets": [begin, end]}, ...,
//                    "__metadata__": {"<key>": "<string value>", ...}}
//             padded with spaces so the data starts at an 8-byte boundary
//   the rest  the data region: each tensor's elements, row-major, little-endian, at bytes
//             [begin, end) counted from the start of the data region
// We write F32 only (the precision the CPU path trains in). We read F32, F64, F16 and BF16 and
// convert to float: F16/BF16 checkpoints are common on the Hub, and widening them is exact.
// The reader checks what the reference implementation checks (header length against the file
// size, JSON, dtype, shape × element size = byte count, tensors tiling the data region without
// gaps or overlaps) and fails with common::Error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <istream>
#include <map>
#include <string>
#include <vector>

namespace backend {

// A named dense tensor of floats, row-major; values.size() is the product of shape.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;  // in the order of their data offsets
  std::map<std::string, std::string> metadata;  // "__metadata__"; empty when absent
};

// Writes the tensors as F32 in the given order. Fails on duplicate or empty names, the reserved
// name "__metadata__", or a shape that does not match the values.
void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

SafetensorsFile read_safetensors(const std::filesystem::path& path);
// The same from a stream of `file_size` bytes, `file` naming it in messages (the path reader
// is this over the file; the fuzz target gives it bytes from memory).
SafetensorsFile read_safetensors(std::istream& in, uint64_t file_size, const std::string& file);

// Byte size of one element of a safetensors dtype ("F32" → 4), 0 when the dtype is not one of
// the format's.
int64_t safetensors_dtype_size(const std::string& dtype);

}  // namespace backend
