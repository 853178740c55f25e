// libFuzzer target: a checkpoint's model_optim_rng.bin (backend/ckpt/checkpoint_file.hpp) as
// checkpoint_util, evaluate_gpt and the text generation server read one from a user's --load:
// CheckpointFileReader, every tensor read, the saved arguments (arguments_from_checkpoint) and
// the model they describe (model_config, its shape and memory estimate). Random bytes would
// stop at the header's CRC-32C, so the input is the blocks behind an honest header:
//   u16 metadata length | u16 table length | metadata (JSON) | tensor table | data
// (lengths little-endian, cut to what the input holds); this harness writes the header with
// the blocks' sizes and checksums, as write_checkpoint_file does. Everything must end in
// success or common::Error; a crash, another exception, a sanitizer report (an overflow in a
// size taken from the table), an allocation beyond run_fuzzer.sh's -malloc_limit_mb, or a
// tensor whose table entry does not fit its shape is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/common/crc32c.hpp"
#include "backend/common/error.hpp"
#include "backend/common/memory_estimate.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/trainer.hpp"
#include "tests/fuzz/scratch_file.hpp"

namespace {

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "FINDING: checkpoint_file_fuzzer: %s\n", what);
    std::abort();
  }
}

template <typename T>
void put(std::string& bytes, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    bytes.push_back(static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff));
  }
}

uint64_t align_up(uint64_t offset) {
  return (offset + backend::kCheckpointAlignment - 1) / backend::kCheckpointAlignment *
         backend::kCheckpointAlignment;
}

// The input's blocks behind the header write_checkpoint_file would give them.
std::string checkpoint_bytes(const uint8_t* data, size_t size) {
  const auto length_at = [&](size_t at) -> size_t {
    return at + 1 < size ? size_t{data[at]} | (size_t{data[at + 1]} << 8) : 0;
  };
  size_t position = std::min<size_t>(size, 4);
  const std::string_view rest(reinterpret_cast<const char*>(data) + position, size - position);
  const size_t metadata_size = std::min(length_at(0), rest.size());
  const size_t table_size = std::min(length_at(2), rest.size() - metadata_size);
  const std::string_view metadata = rest.substr(0, metadata_size);
  const std::string_view table = rest.substr(metadata_size, table_size);
  const std::string_view tensor_data = rest.substr(metadata_size + table_size);

  const uint64_t data_offset =
      align_up(backend::kCheckpointHeaderSize + metadata.size() + table.size());
  std::string bytes(backend::kCheckpointMagic.begin(), backend::kCheckpointMagic.end());
  put<uint32_t>(bytes, backend::kCheckpointFormatVersion);
  put<uint32_t>(bytes, static_cast<uint32_t>(backend::kCheckpointHeaderSize));
  put<uint64_t>(bytes, metadata.size());
  put<uint64_t>(bytes, table.size());
  put<uint64_t>(bytes, data_offset);
  put<uint64_t>(bytes, tensor_data.size());
  put<uint32_t>(bytes, common::crc32c(metadata.data(), metadata.size()));
  put<uint32_t>(bytes, common::crc32c(table.data(), table.size()));
  put<uint32_t>(bytes, 0);
  put<uint32_t>(bytes, common::crc32c(bytes.data(), bytes.size()));
  bytes.append(metadata);
  bytes.append(table);
  bytes.resize(data_offset, '\0');
  bytes.append(tensor_data);
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz_support::ScratchFile scratch("checkpoint_file_fuzzer");
  const std::string bytes = checkpoint_bytes(data, size);
  scratch.write(bytes);
  try {
    const backend::CheckpointFileReader reader(scratch.path);
    for (const backend::TensorEntry& entry : reader.tensors()) {
      // The table's entry fits its shape and the file, in exact arithmetic.
      unsigned __int128 count = 1;
      for (const int64_t dimension : entry.shape) {
        check(dimension >= 0, "a negative dimension");
        count *= static_cast<uint64_t>(dimension);
        if (count > bytes.size()) break;
      }
      check(count * sizeof(float) == entry.size, "a tensor's byte size is not its shape's");
      check(entry.size <= bytes.size(), "a tensor larger than the file");
      try {
        std::vector<float> values(static_cast<size_t>(entry.numel()));
        reader.read(entry, values);
      } catch (const common::Error&) {
      }
    }
    const backend::TrainingArguments arguments =
        backend::arguments_from_checkpoint(reader.metadata(), reader.path());
    const backend::GptConfig config = backend::model_config(arguments);
    (void)common::estimate_conversion_memory(backend::model_shape(config));
  } catch (const common::Error&) {
  }
  return 0;
}
