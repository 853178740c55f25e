// Writing a file torch.load reads (PyTorch's zip format, torch/serialization.py's
// _save): the inverse of torch_checkpoint.hpp, for saving checkpoints in Megatron-LM's own
// format. The archive's entries are stored (not compressed), each one's data 64-byte aligned as
// PyTorch's writer aligns it (padding in the local header's extra field, id "FB"), with zip64
// records where a size or offset needs them:
//   archive/data.pkl    the object, pickled with protocol 2
//   archive/byteorder   "little"
//   archive/data/<key>  each tensor's storage, its elements little-endian
//   archive/version     "3\n"
// The object is a TorchValue tree built of what a checkpoint holds: None, booleans, integers,
// floats, strings, tuples, lists, dicts, OrderedDicts, argparse.Namespaces, tensors and
// dtypes. Only the globals PyTorch's weights_only loader accepts are written
// (collections.OrderedDict, torch._utils._rebuild_tensor_v2, the storage classes, the dtypes),
// plus argparse.Namespace for Megatron's
// args (which Megatron itself adds to that loader's safe globals), so the file loads with
// torch.load(weights_only=True) and with restricted_pickle.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/ckpt/torch_checkpoint.hpp"

namespace backend {

class TorchValue {
 public:
  enum class Kind {
    none,
    boolean,
    integer,
    real,
    text,
    tuple,
    list,
    dict,
    ordered_dict,
    name_space,
    tensor,
    dtype,
    object,  // module.name.__new__(module.name), then BUILD with its state
    call     // module.name(*arguments): REDUCE
  };

  static TorchValue none() { return TorchValue(Kind::none); }
  static TorchValue boolean(bool value);
  static TorchValue integer(int64_t value);
  static TorchValue real(double value);
  static TorchValue text(std::string value);
  static TorchValue tuple(std::vector<TorchValue> items);
  static TorchValue list(std::vector<TorchValue> items);
  // Entries in order; keys are strings (what a checkpoint's dicts have) unless given as values.
  static TorchValue dict();
  static TorchValue ordered_dict();
  // argparse.Namespace: its attributes, in order.
  static TorchValue name_space();
  // A contiguous tensor of `shape` whose elements (row-major, little-endian, of `dtype`) are
  // `data`, which the caller keeps alive until the file is written; or owns `bytes`.
  static TorchValue tensor(TorchDtype dtype, std::vector<int64_t> shape,
                           std::span<const std::byte> data);
  static TorchValue tensor(TorchDtype dtype, std::vector<int64_t> shape,
                           std::vector<std::byte> bytes);
  // float32 values as a tensor of `dtype` (float32, bfloat16 rounded to nearest even, float16).
  static TorchValue tensor_from_floats(TorchDtype dtype, std::vector<int64_t> shape,
                                       std::span<const float> values);
  // torch.float32, ...: the dtype itself (pickled as its global, as torch pickles a dtype).
  static TorchValue dtype(TorchDtype dtype);
  // An instance of the class module.name as Python pickles a plain one (a dataclass): the
  // class's __new__, then BUILD with `state` (its __dict__, or what its __getstate__ gives).
  // For the few record classes a format needs (PyTorch Distributed Checkpoint's metadata).
  static TorchValue object(std::string module, std::string name, TorchValue state);
  // module.name(*arguments), as pickled by an object's __reduce__ (torch.Size, an enum).
  static TorchValue call(std::string module, std::string name, std::vector<TorchValue> arguments);

  Kind kind() const { return kind_; }
  // A dict's, an OrderedDict's or a Namespace's entry under a string key, added at the end.
  TorchValue& set(std::string key, TorchValue value);
  // A dict's entry under an integer key (torch's optimizer state: {0: {...}, 1: ...}).
  TorchValue& set(int64_t key, TorchValue value);
  // A dict's entry under any key (a tuple of dtypes: the distributed optimizer's buffers).
  TorchValue& set(TorchValue key, TorchValue value);

 private:
  explicit TorchValue(Kind kind) : kind_(kind) {}
  friend class PickleWriter;

  Kind kind_;
  bool boolean_ = false;
  int64_t integer_ = 0;
  double real_ = 0;
  std::string text_;               // a text; an object's or a call's module
  std::string name_;               // an object's or a call's class or function
  std::vector<TorchValue> items_;  // a tuple's or list's items; an object's state; arguments
  std::vector<std::pair<TorchValue, TorchValue>> entries_;
  TorchDtype dtype_ = TorchDtype::float32;
  std::vector<int64_t> shape_;
  std::span<const std::byte> data_;
  std::shared_ptr<std::vector<std::byte>> owned_;
};

// Writes `root` to `path` (a new file: an existing one is an error) and fsyncs it; the archive's
// directory name is the file's stem, as torch.save names it. Errors name the file.
void write_torch_checkpoint(const std::filesystem::path& path, const TorchValue& root);

// The same archive in memory, its directory "archive" as torch.save names it when writing to a
// stream (what PyTorch Distributed Checkpoint stores for each tensor chunk).
std::vector<std::byte> torch_checkpoint_bytes(const TorchValue& root);

// `root` pickled alone (protocol 2), without tensors: what pickle.dump writes.
std::vector<std::byte> pickle_bytes(const TorchValue& root);

}  // namespace backend
