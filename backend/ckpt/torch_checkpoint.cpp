// torch.save's zip format; see torch_checkpoint.hpp. The zip structures: PKWARE's APPNOTE.TXT
// (4.3.7 local file header, 4.3.12 central directory header, 4.3.14-16 zip64 end of central
// directory record and locator, 4.5.3 the zip64 extra field); the layout inside:
// torch/serialization.py (_save, _load) and caffe2/serialize/inline_container.cc.
#include "backend/ckpt/torch_checkpoint.hpp"

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "backend/common/error.hpp"
#include "backend/common/user_file.hpp"
#include "backend/core/element_type.hpp"

namespace backend {

namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kZip64EndOfCentralDirectory = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint16_t kZip64ExtraField = 0x0001;

// An element's bytes as a double.
template <typename T>
double element_as_double(const std::byte* element) {
  T value;
  std::memcpy(&value, element, sizeof(T));
  return static_cast<double>(value);
}
// A bool's byte is read as a byte: a file's 2 is true, not undefined behaviour.
double bool_as_double(const std::byte* element) {
  return element_as_double<uint8_t>(element) != 0 ? 1.0 : 0.0;
}
template <typename Half>
double half_as_double(const std::byte* element) {
  uint16_t bits;
  std::memcpy(&bits, element, sizeof(bits));
  return to_float(Half{bits});
}

// Everything the reader knows of a dtype, one row each: its storage class (torch.<storage> in
// a storage's persistent id), its name as PyTorch prints it, its size and how to read it.
struct DtypeFacts {
  TorchDtype dtype;
  std::string_view storage;
  std::string_view name;
  int64_t size;
  double (*value)(const std::byte*);
};
constexpr DtypeFacts kDtypes[] = {
    {TorchDtype::float32, "FloatStorage", "torch.float32", 4, element_as_double<float>},
    {TorchDtype::float64, "DoubleStorage", "torch.float64", 8, element_as_double<double>},
    {TorchDtype::float16, "HalfStorage", "torch.float16", 2, half_as_double<float16>},
    {TorchDtype::bfloat16, "BFloat16Storage", "torch.bfloat16", 2, half_as_double<bfloat16>},
    {TorchDtype::int64, "LongStorage", "torch.int64", 8, element_as_double<int64_t>},
    {TorchDtype::int32, "IntStorage", "torch.int32", 4, element_as_double<int32_t>},
    {TorchDtype::int16, "ShortStorage", "torch.int16", 2, element_as_double<int16_t>},
    {TorchDtype::int8, "CharStorage", "torch.int8", 1, element_as_double<int8_t>},
    {TorchDtype::uint8, "ByteStorage", "torch.uint8", 1, element_as_double<uint8_t>},
    {TorchDtype::boolean, "BoolStorage", "torch.bool", 1, bool_as_double},
};

const DtypeFacts& facts_of(TorchDtype dtype) {
  for (const DtypeFacts& facts : kDtypes) {
    if (facts.dtype == dtype) return facts;
  }
  return kDtypes[0];  // unreachable: every enumerator has its row
}

// Little-endian fields of a byte range, each read checked against its end.
class FieldReader {
 public:
  FieldReader(std::span<const std::byte> bytes, const std::string& source)
      : bytes_(bytes), source_(source) {}
  uint64_t at(uint64_t offset, int width, std::string_view what) const {
    if (offset > bytes_.size() || static_cast<uint64_t>(width) > bytes_.size() - offset) {
      common::fail(
          "{}: the zip archive's {} at byte {} lies past its end ({} bytes): the file "
          "is truncated or not a torch.save archive",
          source_, what, offset, bytes_.size());
    }
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i) {
      value = (value << 8) | static_cast<uint8_t>(bytes_[static_cast<size_t>(offset) + i]);
    }
    return value;
  }
  std::span<const std::byte> span(uint64_t offset, uint64_t size, std::string_view what) const {
    if (offset > bytes_.size() || size > bytes_.size() - offset) {
      common::fail("{}: the zip archive's {} (bytes {} to {}) lies past its end ({} bytes)",
                   source_, what, offset, offset + size, bytes_.size());
    }
    return bytes_.subspan(static_cast<size_t>(offset), static_cast<size_t>(size));
  }

 private:
  std::span<const std::byte> bytes_;
  const std::string& source_;
};

struct CentralDirectory {
  uint64_t entries = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

CentralDirectory find_central_directory(const FieldReader& zip, uint64_t file_size,
                                        const std::string& source) {
  // The end record is the last 22 bytes, unless a comment (at most 65535 bytes) follows it.
  if (file_size < 22)
    common::fail("{}: {} bytes is too short for a zip archive", source, file_size);
  uint64_t end = file_size - 22;
  const uint64_t lowest = file_size - 22 > 65535 ? file_size - 22 - 65535 : 0;
  while (zip.at(end, 4, "end of central directory") != kEndOfCentralDirectory) {
    if (end == lowest) {
      common::fail(
          "{}: no zip end of central directory record: not a torch.save archive of "
          "PyTorch 1.6 or later (the legacy format is not read yet)",
          source);
    }
    --end;
  }
  CentralDirectory directory{.entries = zip.at(end + 10, 2, "entry count"),
                             .offset = zip.at(end + 16, 4, "central directory offset"),
                             .size = zip.at(end + 12, 4, "central directory size")};
  if (directory.entries == 0xFFFF || directory.offset == 0xFFFFFFFF ||
      directory.size == 0xFFFFFFFF) {
    if (end < 20 || zip.at(end - 20, 4, "zip64 locator") != kZip64Locator) {
      common::fail("{}: a zip64 archive without its zip64 locator", source);
    }
    const uint64_t record = zip.at(end - 20 + 8, 8, "zip64 end record offset");
    if (zip.at(record, 4, "zip64 end of central directory") != kZip64EndOfCentralDirectory) {
      common::fail("{}: the zip64 locator points at byte {}, which holds no zip64 end record",
                   source, record);
    }
    directory = {.entries = zip.at(record + 32, 8, "zip64 entry count"),
                 .offset = zip.at(record + 48, 8, "zip64 central directory offset"),
                 .size = zip.at(record + 40, 8, "zip64 central directory size")};
  }
  return directory;
}

// The zip64 extra field's values, in APPNOTE's order, of the fields the header left at their
// all-ones mark.
void read_zip64_extra(const FieldReader& zip, uint64_t extra, uint64_t extra_size,
                      uint64_t& uncompressed, uint64_t& compressed, uint64_t& local_offset) {
  uint64_t at = extra;
  while (at + 4 <= extra + extra_size) {
    const uint64_t id = zip.at(at, 2, "extra field id");
    const uint64_t size = zip.at(at + 2, 2, "extra field size");
    if (id == kZip64ExtraField) {
      uint64_t field = at + 4;
      for (uint64_t* value : {&uncompressed, &compressed, &local_offset}) {
        if (*value == 0xFFFFFFFF && field + 8 <= at + 4 + size) {
          *value = zip.at(field, 8, "zip64 extra field");
          field += 8;
        }
      }
      return;
    }
    at += 4 + size;
  }
}

const DtypeFacts* storage_type(const PickleValue& value) {
  if (value.kind != PickleKind::global || value.text != "torch") return nullptr;
  for (const DtypeFacts& facts : kDtypes) {
    if (facts.storage == value.name) return &facts;
  }
  return nullptr;
}

}  // namespace

int64_t torch_dtype_size(TorchDtype dtype) {
  return facts_of(dtype).size;
}

std::string_view torch_storage_class(TorchDtype dtype) {
  return facts_of(dtype).storage;
}

std::string_view torch_dtype_name(TorchDtype dtype) {
  return facts_of(dtype).name;
}

int64_t TorchTensor::numel() const {
  int64_t count = 1;
  for (const int64_t size : shape) count *= size;
  return count;
}

TorchCheckpointFile::TorchCheckpointFile(const std::filesystem::path& path,
                                         const PickleLimits& limits)
    : mapped_(std::make_unique<common::MappedFile>(path, "checkpoint")),
      bytes_(mapped_->bytes()),
      source_(path.string()) {
  open(limits);
}

TorchCheckpointFile::TorchCheckpointFile(std::span<const std::byte> bytes, std::string source,
                                         const PickleLimits& limits)
    : bytes_(bytes), source_(std::move(source)) {
  open(limits);
}

TorchCheckpointFile::~TorchCheckpointFile() = default;
TorchCheckpointFile::TorchCheckpointFile(TorchCheckpointFile&&) noexcept = default;
TorchCheckpointFile& TorchCheckpointFile::operator=(TorchCheckpointFile&&) noexcept = default;

// Nothing is ever extracted, but an entry torch.save would not write is a sign of a crafted
// archive: a name climbing out of the archive (a ".." part, an absolute path, a backslash) or
// a symbolic link (Unix mode S_IFLNK in the high half of the external attributes).
void TorchCheckpointFile::check_entry_name(const std::string& name, uint64_t attributes) const {
  const uint64_t mode = attributes >> 16;
  if ((mode & 0170000) == 0120000) {
    common::fail("{}: entry {} is a symbolic link, which torch.save never writes", source_, name);
  }
  bool climbs = name.empty() || name.front() == '/' || name.find('\\') != std::string::npos;
  for (size_t begin = 0; !climbs && begin <= name.size();) {
    const size_t end = std::min(name.find('/', begin), name.size());
    climbs = name.compare(begin, end - begin, "..") == 0;
    begin = end + 1;
  }
  if (climbs) {
    common::fail(
        "{}: entry name '{}' leaves the archive's directory, which torch.save never "
        "writes",
        source_, name);
  }
}

void TorchCheckpointFile::open(const PickleLimits& limits) {
  const FieldReader zip(bytes_, source_);
  const CentralDirectory directory = find_central_directory(zip, bytes_.size(), source_);
  uint64_t at = directory.offset;
  for (uint64_t i = 0; i < directory.entries; ++i) {
    if (zip.at(at, 4, "central directory entry") != kCentralHeader) {
      common::fail("{}: central directory entry {} at byte {} has no entry signature", source_, i,
                   at);
    }
    const uint64_t method = zip.at(at + 10, 2, "compression method");
    uint64_t compressed = zip.at(at + 20, 4, "compressed size");
    uint64_t uncompressed = zip.at(at + 24, 4, "size");
    const uint64_t name_size = zip.at(at + 28, 2, "name length");
    const uint64_t attributes = zip.at(at + 38, 4, "external attributes");
    const uint64_t extra_size = zip.at(at + 30, 2, "extra length");
    const uint64_t comment_size = zip.at(at + 32, 2, "comment length");
    uint64_t local = zip.at(at + 42, 4, "local header offset");
    const auto name_bytes = zip.span(at + 46, name_size, "entry name");
    const std::string name(reinterpret_cast<const char*>(name_bytes.data()), name_bytes.size());
    read_zip64_extra(zip, at + 46 + name_size, extra_size, uncompressed, compressed, local);
    check_entry_name(name, attributes);
    if (method != 0 || compressed != uncompressed) {
      common::fail(
          "{}: entry {} is compressed (method {}); torch.save stores its entries "
          "uncompressed, so this is not a file it wrote",
          source_, name, method);
    }
    if (zip.at(local, 4, "local header") != kLocalHeader) {
      common::fail("{}: entry {}'s local header at byte {} has no header signature", source_, name,
                   local);
    }
    const uint64_t data = local + 30 + zip.at(local + 26, 2, "local name length") +
                          zip.at(local + 28, 2, "local extra length");
    if (!entries_.emplace(name, zip.span(data, uncompressed, fmt::format("entry {}", name)))
             .second) {
      common::fail("{}: the archive holds two entries named {}", source_, name);
    }
    at += 46 + name_size + extra_size + comment_size;
  }
  for (const auto& [name, bytes] : entries_) {
    const auto slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash) == "/data.pkl") {
      prefix_ = name.substr(0, slash);
      break;
    }
  }
  if (prefix_.empty()) {
    common::fail("{}: the archive has no <name>/data.pkl: not a torch.save file", source_);
  }
  if (entries_.contains(prefix_ + "/byteorder")) {
    const auto order = entry(prefix_ + "/byteorder");
    if (std::string_view(reinterpret_cast<const char*>(order.data()), order.size()) != "little") {
      common::fail("{}: its byteorder is not little-endian; only little-endian files are read",
                   source_);
    }
  }
  root_ = read_restricted_pickle(entry(prefix_ + "/data.pkl"),
                                 fmt::format("{}: {}/data.pkl", source_, prefix_), limits);
}

std::span<const std::byte> TorchCheckpointFile::entry(std::string_view name) const {
  const auto found = entries_.find(name);
  return found == entries_.end() ? std::span<const std::byte>() : found->second;
}

bool TorchCheckpointFile::is_tensor(const PickleValue& value) {
  return value.kind == PickleKind::object && value.name == "torch._utils._rebuild_tensor_v2";
}

TorchTensor TorchCheckpointFile::tensor(const PickleValue& value, std::string_view what) const {
  auto refuse = [&](std::string_view why) {
    common::fail("{}: {} is not a tensor torch.save writes: {}", source_, what, why);
  };
  if (!is_tensor(value)) refuse("not torch._utils._rebuild_tensor_v2(...)");
  const auto& args = value.items;
  if (args.size() < 4) refuse("fewer than 4 arguments");
  // The storage: the persistent id ('storage', torch.<Type>Storage, key, location, numel).
  const PickleValue& storage = *args[0];
  if (storage.kind != PickleKind::persistent || storage.items.empty() ||
      storage.items[0]->kind != PickleKind::tuple || storage.items[0]->items.size() != 5 ||
      !storage.items[0]->items[0]->is_text("storage")) {
    refuse("its storage is not ('storage', type, key, location, numel)");
  }
  const auto& id = storage.items[0]->items;
  const DtypeFacts* type = storage_type(*id[1]);
  if (type == nullptr) refuse("its storage type is not one of torch's typed storages");
  if (id[2]->kind != PickleKind::text || id[4]->kind != PickleKind::integer) {
    refuse("its storage key or size is not a text and an integer");
  }
  TorchTensor tensor;
  tensor.dtype = type->dtype;
  tensor.storage_key = prefix_ + "/data/" + id[2]->text;
  if (!entries_.contains(tensor.storage_key))
    refuse(fmt::format("no entry {}", tensor.storage_key));
  const auto data = entry(tensor.storage_key);
  const int64_t element_size = torch_dtype_size(tensor.dtype);
  const int64_t storage_numel = id[4]->integer;
  if (storage_numel < 0 ||
      static_cast<uint64_t>(storage_numel) != data.size() / static_cast<uint64_t>(element_size) ||
      data.size() % static_cast<uint64_t>(element_size) != 0) {
    refuse(fmt::format("its storage says {} elements of {} bytes but entry {} has {} bytes",
                       storage_numel, element_size, tensor.storage_key, data.size()));
  }
  auto integers = [&](const PickleValue& tuple, std::string_view field) {
    if (tuple.kind != PickleKind::tuple) refuse(fmt::format("its {} is not a tuple", field));
    std::vector<int64_t> values;
    for (const auto& item : tuple.items) {
      if (item->kind != PickleKind::integer || item->integer < 0) {
        refuse(fmt::format("its {} holds other than non-negative integers", field));
      }
      values.push_back(item->integer);
    }
    return values;
  };
  if (args[1]->kind != PickleKind::integer || args[1]->integer < 0) {
    refuse("its storage offset is not a non-negative integer");
  }
  tensor.storage_offset = args[1]->integer;
  tensor.shape = integers(*args[2], "size");
  tensor.stride = integers(*args[3], "stride");
  if (tensor.shape.size() != tensor.stride.size()) refuse("its size and stride differ in length");
  // At most as many elements as its storage (torch.save writes an expanded view's storage,
  // whose elements it would repeat: not a checkpoint's), and the last element it reaches within
  // it; every product and sum is checked, so that a file's numbers cannot overflow them.
  uint64_t count = 1;
  uint64_t last = static_cast<uint64_t>(tensor.storage_offset);
  for (size_t d = 0; d < tensor.shape.size(); ++d) {
    const auto size = static_cast<uint64_t>(tensor.shape[d]);
    uint64_t reach = 0;
    if (__builtin_mul_overflow(count, size, &count) ||
        (size > 0 &&
         (__builtin_mul_overflow(size - 1, static_cast<uint64_t>(tensor.stride[d]), &reach) ||
          __builtin_add_overflow(last, reach, &last)))) {
      refuse("its size and stride overflow 64 bits");
    }
  }
  if (count > static_cast<uint64_t>(storage_numel)) {
    refuse(fmt::format("it has {} elements, more than its storage's {}", count, storage_numel));
  }
  if (count > 0 && last >= static_cast<uint64_t>(storage_numel)) {
    refuse(fmt::format("it reaches element {} of a storage of {}", last, storage_numel));
  }
  return tensor;
}

std::vector<double> TorchCheckpointFile::tensor_values(const TorchTensor& tensor) const {
  const auto data = entry(tensor.storage_key);
  const DtypeFacts& facts = facts_of(tensor.dtype);
  const int64_t element_size = facts.size;
  const int64_t count = tensor.numel();
  std::vector<double> values;
  values.reserve(static_cast<size_t>(count));
  std::vector<int64_t> index(tensor.shape.size(), 0);
  for (int64_t n = 0; n < count; ++n) {
    int64_t element = tensor.storage_offset;
    for (size_t d = 0; d < index.size(); ++d) element += index[d] * tensor.stride[d];
    values.push_back(facts.value(data.data() + element * element_size));
    for (size_t d = index.size(); d > 0; --d) {  // row-major: the last dimension fastest
      if (++index[d - 1] < tensor.shape[d - 1]) break;
      index[d - 1] = 0;
    }
  }
  return values;
}

}  // namespace backend
