// torch.save's zip format written (the header says which entries and globals). The pickle
// opcodes are protocol 2's (Python's Lib/pickle.py); the zip records are PKWARE's APPNOTE
// (local header, central directory, zip64 end records), every entry stored with its CRC-32.
#include "backend/ckpt/torch_checkpoint_writer.hpp"

#include <fmt/format.h>

#include <array>
#include <bit>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/core/element_type.hpp"

namespace backend {

// ---- the tree

TorchValue TorchValue::boolean(bool value) {
  TorchValue result(Kind::boolean);
  result.boolean_ = value;
  return result;
}
TorchValue TorchValue::integer(int64_t value) {
  TorchValue result(Kind::integer);
  result.integer_ = value;
  return result;
}
TorchValue TorchValue::real(double value) {
  TorchValue result(Kind::real);
  result.real_ = value;
  return result;
}
TorchValue TorchValue::text(std::string value) {
  TorchValue result(Kind::text);
  result.text_ = std::move(value);
  return result;
}
TorchValue TorchValue::tuple(std::vector<TorchValue> items) {
  TorchValue result(Kind::tuple);
  result.items_ = std::move(items);
  return result;
}
TorchValue TorchValue::list(std::vector<TorchValue> items) {
  TorchValue result(Kind::list);
  result.items_ = std::move(items);
  return result;
}
TorchValue TorchValue::dict() {
  return TorchValue(Kind::dict);
}
TorchValue TorchValue::ordered_dict() {
  return TorchValue(Kind::ordered_dict);
}
TorchValue TorchValue::name_space() {
  return TorchValue(Kind::name_space);
}

TorchValue TorchValue::tensor(TorchDtype dtype, std::vector<int64_t> shape,
                              std::span<const std::byte> data) {
  int64_t numel = 1;
  for (const int64_t size : shape) numel *= size;
  if (static_cast<int64_t>(data.size()) != numel * torch_dtype_size(dtype)) {
    common::fail("a {} tensor of {} elements needs {} bytes, got {}", torch_dtype_name(dtype),
                 numel, numel * torch_dtype_size(dtype), data.size());
  }
  TorchValue result(Kind::tensor);
  result.dtype_ = dtype;
  result.shape_ = std::move(shape);
  result.data_ = data;
  return result;
}

TorchValue TorchValue::tensor(TorchDtype dtype, std::vector<int64_t> shape,
                              std::vector<std::byte> bytes) {
  auto owned = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  TorchValue result = tensor(dtype, std::move(shape), std::span<const std::byte>(*owned));
  result.owned_ = std::move(owned);
  return result;
}

TorchValue TorchValue::tensor_from_floats(TorchDtype dtype, std::vector<int64_t> shape,
                                          std::span<const float> values) {
  if (dtype != TorchDtype::float32 && dtype != TorchDtype::bfloat16 &&
      dtype != TorchDtype::float16) {
    common::fail("floats are written as float32, bfloat16 or float16 tensors, not {}",
                 torch_dtype_name(dtype));
  }
  std::vector<std::byte> bytes(values.size() * static_cast<size_t>(torch_dtype_size(dtype)));
  auto put = [&](size_t i, auto element) {
    std::memcpy(bytes.data() + i * sizeof(element), &element, sizeof(element));
  };
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == TorchDtype::float32) {
      put(i, values[i]);
    } else if (dtype == TorchDtype::bfloat16) {
      put(i, to_bfloat16(values[i]).bits);
    } else {
      put(i, to_float16(values[i]).bits);
    }
  }
  return tensor(dtype, std::move(shape), std::move(bytes));
}

TorchValue& TorchValue::set(std::string key, TorchValue value) {
  entries_.emplace_back(text(std::move(key)), std::move(value));
  return entries_.back().second;
}

TorchValue& TorchValue::set(int64_t key, TorchValue value) {
  entries_.emplace_back(integer(key), std::move(value));
  return entries_.back().second;
}

TorchValue& TorchValue::set(TorchValue key, TorchValue value) {
  entries_.emplace_back(std::move(key), std::move(value));
  return entries_.back().second;
}

TorchValue TorchValue::object(std::string module, std::string name, TorchValue state) {
  TorchValue value(Kind::object);
  value.text_ = std::move(module);
  value.name_ = std::move(name);
  value.items_.push_back(std::move(state));
  return value;
}

TorchValue TorchValue::call(std::string module, std::string name,
                            std::vector<TorchValue> arguments) {
  TorchValue value(Kind::call);
  value.text_ = std::move(module);
  value.name_ = std::move(name);
  value.items_ = std::move(arguments);
  return value;
}

TorchValue TorchValue::dtype(TorchDtype dtype) {
  TorchValue value(Kind::dtype);
  value.dtype_ = dtype;
  return value;
}

// ---- pickling (protocol 2)

namespace {

namespace opcode {
constexpr uint8_t kProto = 0x80, kStop = '.', kNone = 'N', kTrue = 0x88, kFalse = 0x89,
                  kBinInt = 'J', kLong1 = 0x8a, kBinFloat = 'G', kBinUnicode = 'X', kMark = '(',
                  kTuple = 't', kEmptyTuple = ')', kEmptyList = ']', kAppends = 'e',
                  kEmptyDict = '}', kSetItems = 'u', kGlobal = 'c', kReduce = 'R', kNewObj = 0x81,
                  kBuild = 'b', kBinPersId = 'Q';
}  // namespace opcode

// Python's pickle batches APPENDS and SETITEMS by 1000; a reader need not, but this is its shape.
constexpr size_t kBatch = 1000;

}  // namespace

class PickleWriter {
 public:
  struct Storage {
    std::string key;
    std::span<const std::byte> data;
  };

  std::vector<std::byte> pickle(const TorchValue& root) {
    byte(opcode::kProto);
    byte(2);
    value(root);
    byte(opcode::kStop);
    return std::move(out_);
  }
  const std::vector<Storage>& storages() const { return storages_; }

 private:
  void byte(uint8_t b) { out_.push_back(static_cast<std::byte>(b)); }
  void bytes(const void* data, size_t size) {
    const auto* first = static_cast<const std::byte*>(data);
    out_.insert(out_.end(), first, first + size);
  }
  void little_endian(uint64_t value, int size) {
    for (int i = 0; i < size; ++i) byte(static_cast<uint8_t>(value >> (8 * i)));
  }

  void integer(int64_t value) {
    if (value >= std::numeric_limits<int32_t>::min() &&
        value <= std::numeric_limits<int32_t>::max()) {
      byte(opcode::kBinInt);
      little_endian(static_cast<uint32_t>(static_cast<int32_t>(value)), 4);
      return;
    }
    byte(opcode::kLong1);  // two's complement, little-endian, 8 bytes (always enough)
    byte(8);
    little_endian(static_cast<uint64_t>(value), 8);
  }
  void real(double value) {
    byte(opcode::kBinFloat);  // big-endian
    const auto bits = std::bit_cast<uint64_t>(value);
    for (int i = 7; i >= 0; --i) byte(static_cast<uint8_t>(bits >> (8 * i)));
  }
  void text(const std::string& value) {
    byte(opcode::kBinUnicode);
    little_endian(value.size(), 4);
    bytes(value.data(), value.size());
  }
  void global(std::string_view module, std::string_view name) {
    byte(opcode::kGlobal);
    bytes(module.data(), module.size());
    byte('\n');
    bytes(name.data(), name.size());
    byte('\n');
  }
  void entries(const TorchValue& value) {
    const auto& all = value.entries_;
    for (size_t first = 0; first < all.size(); first += kBatch) {
      byte(opcode::kMark);
      for (size_t i = first; i < std::min(all.size(), first + kBatch); ++i) {
        this->value(all[i].first);
        this->value(all[i].second);
      }
      byte(opcode::kSetItems);
    }
  }
  void tuple_of(const std::vector<int64_t>& numbers) {
    byte(opcode::kMark);
    for (const int64_t number : numbers) integer(number);
    byte(opcode::kTuple);
  }

  // torch._utils._rebuild_tensor_v2(('storage', torch.<Type>Storage, key, 'cpu', numel), 0,
  // shape, contiguous strides, False, OrderedDict()), as torch.save writes a tensor.
  void tensor(const TorchValue& value) {
    const std::string key = std::to_string(storages_.size());
    storages_.push_back({key, value.data_});
    const int64_t numel = static_cast<int64_t>(value.data_.size()) / torch_dtype_size(value.dtype_);
    std::vector<int64_t> strides(value.shape_.size());
    int64_t stride = 1;
    for (auto d = static_cast<int64_t>(value.shape_.size()) - 1; d >= 0; --d) {
      strides[static_cast<size_t>(d)] = stride;
      stride *= value.shape_[static_cast<size_t>(d)];
    }
    global("torch._utils", "_rebuild_tensor_v2");
    byte(opcode::kMark);
    byte(opcode::kMark);
    text("storage");
    global("torch", torch_storage_class(value.dtype_));
    text(key);
    text("cpu");
    integer(numel);
    byte(opcode::kTuple);
    byte(opcode::kBinPersId);
    integer(0);
    tuple_of(value.shape_);
    tuple_of(strides);
    byte(opcode::kFalse);
    global("collections", "OrderedDict");
    byte(opcode::kEmptyTuple);
    byte(opcode::kReduce);
    byte(opcode::kTuple);
    byte(opcode::kReduce);
  }

  void value(const TorchValue& value) {
    using Kind = TorchValue::Kind;
    switch (value.kind_) {
      case Kind::none:
        byte(opcode::kNone);
        break;
      case Kind::boolean:
        byte(value.boolean_ ? opcode::kTrue : opcode::kFalse);
        break;
      case Kind::integer:
        integer(value.integer_);
        break;
      case Kind::real:
        real(value.real_);
        break;
      case Kind::text:
        text(value.text_);
        break;
      case Kind::tuple:
        byte(opcode::kMark);
        for (const TorchValue& item : value.items_) this->value(item);
        byte(opcode::kTuple);
        break;
      case Kind::list:
        byte(opcode::kEmptyList);
        for (size_t first = 0; first < value.items_.size(); first += kBatch) {
          byte(opcode::kMark);
          for (size_t i = first; i < std::min(value.items_.size(), first + kBatch); ++i) {
            this->value(value.items_[i]);
          }
          byte(opcode::kAppends);
        }
        break;
      case Kind::dict:
        byte(opcode::kEmptyDict);
        entries(value);
        break;
      case Kind::ordered_dict:
        global("collections", "OrderedDict");
        byte(opcode::kEmptyTuple);
        byte(opcode::kReduce);
        entries(value);
        break;
      case Kind::name_space:  // as Python pickles an object: cls.__new__(cls), then its __dict__
        global("argparse", "Namespace");
        byte(opcode::kEmptyTuple);
        byte(opcode::kNewObj);
        byte(opcode::kEmptyDict);
        entries(value);
        byte(opcode::kBuild);
        break;
      case Kind::tensor:
        tensor(value);
        break;
      case Kind::dtype: {  // torch.dtype.__reduce__ gives its name in module torch
        const std::string_view name = torch_dtype_name(value.dtype_);
        global("torch", name.substr(name.find('.') + 1));
        break;
      }
      case Kind::object:
        global(value.text_, value.name_);
        byte(opcode::kEmptyTuple);
        byte(opcode::kNewObj);
        this->value(value.items_.front());
        byte(opcode::kBuild);
        break;
      case Kind::call:
        global(value.text_, value.name_);
        byte(opcode::kMark);
        for (const TorchValue& item : value.items_) this->value(item);
        byte(opcode::kTuple);
        byte(opcode::kReduce);
        break;
    }
  }

  std::vector<std::byte> out_;
  std::vector<Storage> storages_;
};

// ---- the zip archive

namespace {

constexpr std::array<uint32_t, 256> kCrcTable = [] {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}();

// The zip's CRC-32 (ISO 3309, the reflected polynomial 0xEDB88320).
uint32_t zip_crc32(std::span<const std::byte> data) {
  uint32_t c = 0xFFFFFFFFu;
  for (const std::byte b : data) {
    c = kCrcTable[(c ^ static_cast<uint8_t>(b)) & 0xFFu] ^ (c >> 8);
  }
  return c ^ 0xFFFFFFFFu;
}

constexpr uint64_t kZip32Limit = 0xFFFFFFFFu;
constexpr uint64_t kAlignment = 64;  // PyTorch's writer aligns every entry's data to 64 bytes

class ZipWriter {
 public:
  // `write` takes the archive's bytes in order; offsets count from the first.
  explicit ZipWriter(std::function<void(std::span<const std::byte>)> write)
      : write_(std::move(write)) {}

  void add(const std::string& name, std::span<const std::byte> data) {
    Entry entry{name, zip_crc32(data), data.size(), written_};
    const bool zip64 = data.size() >= kZip32Limit;
    // Local header: 30 bytes, the name, then the extra fields: zip64 sizes where needed, and
    // "FB" padding that puts the data on a 64-byte boundary.
    const uint64_t zip64_extra = zip64 ? 20 : 0;
    const uint64_t before_padding = entry.offset + 30 + name.size() + zip64_extra + 4;
    const uint64_t padding = (kAlignment - before_padding % kAlignment) % kAlignment;
    std::vector<std::byte> header;
    put(header, 0x04034b50u, 4);
    put(header, zip64 ? 45 : 20, 2);  // version needed
    put(header, 0, 2);                // flags
    put(header, 0, 2);                // stored
    put(header, 0, 4);                // time and date
    put(header, entry.crc, 4);
    put(header, zip64 ? kZip32Limit : data.size(), 4);
    put(header, zip64 ? kZip32Limit : data.size(), 4);
    put(header, name.size(), 2);
    put(header, zip64_extra + 4 + padding, 2);
    append(header, name);
    if (zip64) {
      put(header, 0x0001, 2);
      put(header, 16, 2);
      put(header, data.size(), 8);
      put(header, data.size(), 8);
    }
    put(header, 0x4246, 2);  // "FB"
    put(header, padding, 2);
    header.resize(header.size() + padding, std::byte{'Z'});
    emit(header);
    emit(data);
    entries_.push_back(std::move(entry));
  }

  void finish() {
    const uint64_t directory_offset = written_;
    std::vector<std::byte> directory;
    for (const Entry& entry : entries_) {
      const bool size64 = entry.size >= kZip32Limit;
      const bool offset64 = entry.offset >= kZip32Limit;
      const uint64_t extra = size64 || offset64 ? 4 + (size64 ? 16 : 0) + (offset64 ? 8 : 0) : 0;
      put(directory, 0x02014b50u, 4);
      put(directory, 45, 2);  // version made by
      put(directory, extra > 0 ? 45 : 20, 2);
      put(directory, 0, 2);
      put(directory, 0, 2);
      put(directory, 0, 4);
      put(directory, entry.crc, 4);
      put(directory, size64 ? kZip32Limit : entry.size, 4);
      put(directory, size64 ? kZip32Limit : entry.size, 4);
      put(directory, entry.name.size(), 2);
      put(directory, extra, 2);
      put(directory, 0, 2);  // comment
      put(directory, 0, 2);  // disk
      put(directory, 0, 2);  // internal attributes
      put(directory, 0, 4);  // external attributes
      put(directory, offset64 ? kZip32Limit : entry.offset, 4);
      append(directory, entry.name);
      if (extra > 0) {
        put(directory, 0x0001, 2);
        put(directory, extra - 4, 2);
        if (size64) {
          put(directory, entry.size, 8);
          put(directory, entry.size, 8);
        }
        if (offset64) put(directory, entry.offset, 8);
      }
    }
    const uint64_t directory_size = directory.size();
    const uint64_t end64_offset = directory_offset + directory_size;
    const bool zip64 = directory_offset >= kZip32Limit || entries_.size() >= 0xFFFF;
    if (zip64) {
      put(directory, 0x06064b50u, 4);  // zip64 end of central directory record
      put(directory, 44, 8);
      put(directory, 45, 2);
      put(directory, 45, 2);
      put(directory, 0, 4);
      put(directory, 0, 4);
      put(directory, entries_.size(), 8);
      put(directory, entries_.size(), 8);
      put(directory, directory_size, 8);
      put(directory, directory_offset, 8);
      put(directory, 0x07064b50u, 4);  // its locator
      put(directory, 0, 4);
      put(directory, end64_offset, 8);
      put(directory, 1, 4);
    }
    put(directory, 0x06054b50u, 4);  // end of central directory
    put(directory, 0, 2);
    put(directory, 0, 2);
    put(directory, zip64 ? 0xFFFF : entries_.size(), 2);
    put(directory, zip64 ? 0xFFFF : entries_.size(), 2);
    put(directory, zip64 ? kZip32Limit : directory_size, 4);
    put(directory, zip64 ? kZip32Limit : directory_offset, 4);
    put(directory, 0, 2);
    emit(directory);
  }

 private:
  struct Entry {
    std::string name;
    uint32_t crc;
    uint64_t size;
    uint64_t offset;
  };
  static void put(std::vector<std::byte>& out, uint64_t value, int size) {
    for (int i = 0; i < size; ++i) out.push_back(static_cast<std::byte>(value >> (8 * i)));
  }
  static void append(std::vector<std::byte>& out, const std::string& text) {
    for (const char c : text) out.push_back(static_cast<std::byte>(c));
  }

  void emit(std::span<const std::byte> bytes) {
    write_(bytes);
    written_ += bytes.size();
  }

  std::function<void(std::span<const std::byte>)> write_;
  uint64_t written_ = 0;
  std::vector<Entry> entries_;
};

std::span<const std::byte> as_bytes(std::string_view text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

}  // namespace

namespace {

// torch.save's archive of `root` under the directory `archive`, its bytes given to `write`.
void write_archive(const TorchValue& root, const std::string& archive,
                   std::function<void(std::span<const std::byte>)> write) {
  PickleWriter pickler;
  const std::vector<std::byte> pickled = pickler.pickle(root);
  ZipWriter zip(std::move(write));
  zip.add(archive + "/data.pkl", pickled);
  zip.add(archive + "/byteorder", as_bytes("little"));
  for (const PickleWriter::Storage& storage : pickler.storages()) {
    zip.add(archive + "/data/" + storage.key, storage.data);
  }
  zip.add(archive + "/version", as_bytes("3\n"));
  zip.finish();
}

}  // namespace

void write_torch_checkpoint(const std::filesystem::path& path, const TorchValue& root) {
  common::DurableFileWriter file(path);
  write_archive(root, path.stem().string(),
                [&](std::span<const std::byte> bytes) { file.write(bytes); });
  file.finish();
}

std::vector<std::byte> torch_checkpoint_bytes(const TorchValue& root) {
  std::vector<std::byte> out;
  write_archive(root, "archive", [&](std::span<const std::byte> bytes) {
    out.insert(out.end(), bytes.begin(), bytes.end());
  });
  return out;
}

std::vector<std::byte> pickle_bytes(const TorchValue& root) {
  PickleWriter pickler;
  std::vector<std::byte> pickled = pickler.pickle(root);
  if (!pickler.storages().empty()) {
    throw std::logic_error("pickle_bytes of a value holding tensors");
  }
  return pickled;
}

}  // namespace backend
