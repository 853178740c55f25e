// The restricted unpickler; see restricted_pickle.hpp. Opcode values and meanings: Python's
// Lib/pickletools.py; the allowed globals follow torch/_weights_only_unpickler.py, plus the
// record classes Megatron's checkpoints hold.
#include "backend/ckpt/restricted_pickle.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <unordered_map>

#include "backend/common/error.hpp"

namespace backend {

namespace {

// What applying (REDUCE, NEWOBJ) an allowed global builds.
enum class GlobalRole {
  ordered_dict,   // an empty dict, filled by SETITEMS
  size,           // torch.Size(tuple): the tuple
  parameter,      // torch._utils._rebuild_parameter(tensor, ...): the tensor
  latin1_encode,  // _codecs.encode(text, "latin1"): bytes
  object,         // an object for the format's reader
  enumeration,    // an enum class: applied to its value, or its member by getattr's name
  enum_member,    // builtins.getattr(an enumeration, member name), as Python 3.11+ pickles one
  referenced,     // named only (storage types, dtypes, numpy.ndarray): never applied
};

struct AllowedGlobal {
  std::string_view module, name;
  GlobalRole role;
};

// The one list of what a checkpoint's pickle may name.
constexpr AllowedGlobal kAllowedGlobals[] = {
    {"collections", "OrderedDict", GlobalRole::ordered_dict},
    {"torch", "Size", GlobalRole::size},
    {"torch._utils", "_rebuild_parameter", GlobalRole::parameter},
    {"_codecs", "encode", GlobalRole::latin1_encode},
    {"torch._utils", "_rebuild_tensor_v2", GlobalRole::object},
    {"torch", "device", GlobalRole::object},
    {"argparse", "Namespace", GlobalRole::object},
    // numpy arrays and scalars as numpy pickles them (Megatron's RNG state holds numpy's).
    {"numpy.core.multiarray", "_reconstruct", GlobalRole::object},
    {"numpy._core.multiarray", "_reconstruct", GlobalRole::object},
    {"numpy.core.multiarray", "scalar", GlobalRole::object},
    {"numpy._core.multiarray", "scalar", GlobalRole::object},
    {"numpy", "dtype", GlobalRole::object},
    {"numpy", "ndarray", GlobalRole::referenced},
    // Transformer Engine 1.x's _extra_state: its FP8 metadata torch.save'd into a buffer, whose
    // bytes no reader here opens.
    {"_io", "BytesIO", GlobalRole::object},
    // The enums Megatron keeps in its args (args.model_type, args.attention_backend).
    {"megatron.core.enums", "ModelType", GlobalRole::enumeration},
    {"megatron.model.enums", "ModelType", GlobalRole::enumeration},
    {"megatron.core.transformer.enums", "AttnBackend", GlobalRole::enumeration},
    {"megatron.core.transformer.enums", "AttnMaskType", GlobalRole::enumeration},
    {"megatron.model.enums", "AttnMaskType", GlobalRole::enumeration},
    {"builtins", "getattr", GlobalRole::enum_member},
    // PyTorch Distributed Checkpoint's .metadata (torch_distributed_checkpoint.hpp): its
    // dataclasses under PyTorch 2.x's module names and 1.13's, the tensor layout, and the path
    // a 2.x writer records.
    {"torch.distributed.checkpoint.metadata", "Metadata", GlobalRole::object},
    {"torch.distributed.checkpoint.metadata", "TensorStorageMetadata", GlobalRole::object},
    {"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata", GlobalRole::object},
    {"torch.distributed.checkpoint.metadata", "BytesStorageMetadata", GlobalRole::object},
    {"torch.distributed.checkpoint.metadata", "MetadataIndex", GlobalRole::object},
    {"torch.distributed.checkpoint.metadata", "TensorProperties", GlobalRole::object},
    {"torch.distributed.checkpoint.metadata", "StorageMeta", GlobalRole::object},
    {"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", GlobalRole::enumeration},
    {"torch.distributed.checkpoint.filesystem", "_StorageInfo", GlobalRole::object},
    {"torch.distributed._shard.checkpoint.metadata", "Metadata", GlobalRole::object},
    {"torch.distributed._shard.checkpoint.metadata", "TensorStorageMetadata", GlobalRole::object},
    {"torch.distributed._shard.checkpoint.metadata", "ChunkStorageMetadata", GlobalRole::object},
    {"torch.distributed._shard.checkpoint.metadata", "BytesStorageMetadata", GlobalRole::object},
    {"torch.distributed._shard.checkpoint.metadata", "MetadataIndex", GlobalRole::object},
    {"torch.distributed._shard.checkpoint.filesystem", "_StorageInfo", GlobalRole::object},
    {"torch.distributed._shard.sharded_tensor.metadata", "TensorProperties", GlobalRole::object},
    {"torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING",
     GlobalRole::enumeration},
    {"torch.serialization", "_get_layout", GlobalRole::object},
    {"pathlib", "PosixPath", GlobalRole::object},
    // Storage types (the second element of a storage's persistent id) and dtypes.
    {"torch", "FloatStorage", GlobalRole::referenced},
    {"torch", "DoubleStorage", GlobalRole::referenced},
    {"torch", "HalfStorage", GlobalRole::referenced},
    {"torch", "BFloat16Storage", GlobalRole::referenced},
    {"torch", "LongStorage", GlobalRole::referenced},
    {"torch", "IntStorage", GlobalRole::referenced},
    {"torch", "ShortStorage", GlobalRole::referenced},
    {"torch", "CharStorage", GlobalRole::referenced},
    {"torch", "ByteStorage", GlobalRole::referenced},
    {"torch", "BoolStorage", GlobalRole::referenced},
    {"torch", "float32", GlobalRole::referenced},
    {"torch", "float64", GlobalRole::referenced},
    {"torch", "float16", GlobalRole::referenced},
    {"torch", "bfloat16", GlobalRole::referenced},
    {"torch", "int64", GlobalRole::referenced},
    {"torch", "int32", GlobalRole::referenced},
    {"torch", "int16", GlobalRole::referenced},
    {"torch", "int8", GlobalRole::referenced},
    {"torch", "uint8", GlobalRole::referenced},
    {"torch", "bool", GlobalRole::referenced},
};

const AllowedGlobal* find_allowed(std::string_view module, std::string_view name) {
  for (const AllowedGlobal& allowed : kAllowedGlobals) {
    if (allowed.module == module && allowed.name == name) return &allowed;
  }
  return nullptr;
}

const AllowedGlobal* find_allowed(const PickleValue& global) {
  return find_allowed(global.text, global.name);
}

class Unpickler {
 public:
  Unpickler(std::span<const std::byte> bytes, std::string_view source, const PickleLimits& limits)
      : bytes_(bytes), source_(source), limits_(limits) {}

  PicklePointer run() {
    try {
      return run_unguarded();
    } catch (...) {
      // A cycle (refused, or made before another refusal) would keep itself alive through its
      // shared pointers: cut every value open, so that they all go with the unpickler.
      for (const std::weak_ptr<PickleValue>& made : made_) {
        if (const PicklePointer value = made.lock()) {
          value->items.clear();
          value->entries.clear();
          value->state.reset();
        }
      }
      throw;
    }
  }

 private:
  PicklePointer run_unguarded() {
    if (bytes_.empty() || read_byte() != 0x80) {
      fail_at(0, "not a pickle of protocol 2 or later (it does not begin with PROTO)");
    }
    const int protocol = read_byte();
    if (protocol < 2 || protocol > 5) fail_at(1, fmt::format("pickle protocol {}", protocol));
    while (true) {
      const size_t at = offset_;
      const uint8_t op = read_byte();
      if (op == '.') break;  // STOP
      step(op, at);
    }
    if (stack_.size() != 1 || !marks_.empty()) {
      fail_at(offset_, fmt::format("STOP leaves {} values and {} marks (one value, no mark, "
                                   "expected)",
                                   stack_.size(), marks_.size()));
    }
    check_tree(stack_.front());
    return stack_.front();
  }

  [[noreturn]] void fail_at(size_t at, std::string_view what) const {
    common::fail("{}: {} at byte {}", source_, what, at);
  }

  uint8_t read_byte() {
    if (offset_ >= bytes_.size()) fail_at(offset_, "the pickle ends without STOP");
    return static_cast<uint8_t>(bytes_[offset_++]);
  }
  std::span<const std::byte> read_span(uint64_t count) {
    if (count > bytes_.size() - offset_) {
      fail_at(offset_, fmt::format("a length of {} bytes runs past the end ({} left)", count,
                                   bytes_.size() - offset_));
    }
    const auto span = bytes_.subspan(offset_, static_cast<size_t>(count));
    offset_ += static_cast<size_t>(count);
    return span;
  }
  uint64_t read_unsigned(int width) {  // little-endian
    const auto span = read_span(static_cast<uint64_t>(width));
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(span[i]);
    return value;
  }
  std::string read_string(uint64_t count) {
    const auto span = read_span(count);
    return {reinterpret_cast<const char*>(span.data()), span.size()};
  }
  std::string read_line() {
    const size_t start = offset_;
    while (true) {
      if (read_byte() == '\n') break;
    }
    return {reinterpret_cast<const char*>(bytes_.data() + start), offset_ - 1 - start};
  }

  PicklePointer make(PickleKind kind) {
    count_value();
    auto value = std::make_shared<PickleValue>();
    value->kind = kind;
    made_.push_back(value);
    return value;
  }
  void count_value() {
    if (++values_ > limits_.max_values) {
      fail_at(offset_, fmt::format("more than {} values", limits_.max_values));
    }
  }

  void push(PicklePointer value) {
    count_value();
    stack_.push_back(std::move(value));
  }
  PicklePointer pop(size_t at) {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) {
      fail_at(at, "an opcode takes a value from an empty stack");
    }
    PicklePointer value = std::move(stack_.back());
    stack_.pop_back();
    return value;
  }
  PicklePointer& top(size_t at) {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) {
      fail_at(at, "an opcode needs a value on an empty stack");
    }
    return stack_.back();
  }
  // The values since the last MARK, which is removed.
  std::vector<PicklePointer> pop_mark(size_t at) {
    if (marks_.empty()) fail_at(at, "an opcode needs a MARK and there is none");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PicklePointer> values(std::make_move_iterator(stack_.begin() + mark),
                                      std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return values;
  }

  PicklePointer tuple_of(std::vector<PicklePointer> values) {
    PicklePointer tuple = make(PickleKind::tuple);
    tuple->items = std::move(values);
    return tuple;
  }
  PickleValue& list_at(PicklePointer& value, size_t at) {
    if (value->kind != PickleKind::list) fail_at(at, "APPEND to a value that is not a list");
    return *value;
  }
  PickleValue& dict_at(PicklePointer& value, size_t at) {
    if (value->kind != PickleKind::dict) fail_at(at, "SETITEM on a value that is not a dict");
    return *value;
  }

  void memo_put(uint64_t index, size_t at) {
    count_value();
    memo_[index] = top(at);
  }
  PicklePointer memo_get(uint64_t index, size_t at) {
    const auto found = memo_.find(index);
    if (found == memo_.end())
      fail_at(at, fmt::format("memo entry {} is read before it is set", index));
    return found->second;
  }

  PicklePointer global(std::string module, std::string name, size_t at) {
    if (find_allowed(module, name) == nullptr) {
      fail_at(at, fmt::format("the pickle names {}.{}, which a checkpoint has no use for and is "
                              "not loaded (only tensors, their storages, plain containers, "
                              "argparse.Namespace, numpy's arrays, Megatron's enums and PyTorch's "
                              "distributed-checkpoint metadata are)",
                              module, name));
    }
    PicklePointer value = make(PickleKind::global);
    value->text = std::move(module);
    value->name = std::move(name);
    return value;
  }

  // REDUCE and NEWOBJ: `callable` applied to `arguments`.
  PicklePointer apply(const PicklePointer& callable, const PicklePointer& arguments, size_t at) {
    if (callable->kind != PickleKind::global) {
      fail_at(at, "REDUCE or NEWOBJ of a value that is not an allowed global");
    }
    if (arguments->kind != PickleKind::tuple)
      fail_at(at, "the arguments of a call are not a tuple");
    const AllowedGlobal& allowed = *find_allowed(*callable);
    const std::string qualified = fmt::format("{}.{}", allowed.module, allowed.name);
    const std::vector<PicklePointer>& args = arguments->items;
    switch (allowed.role) {
      case GlobalRole::ordered_dict:
        if (!args.empty()) fail_at(at, "collections.OrderedDict is called with arguments");
        return make(PickleKind::dict);
      case GlobalRole::size:
        if (args.size() != 1 || args[0]->kind != PickleKind::tuple) {
          fail_at(at, "torch.Size takes one tuple");
        }
        return args[0];
      case GlobalRole::parameter:
        if (args.empty()) fail_at(at, "torch._utils._rebuild_parameter without its tensor");
        return args[0];
      case GlobalRole::latin1_encode: {
        if (args.size() != 2 || args[0]->kind != PickleKind::text ||
            !(args[1]->is_text("latin1") || args[1]->is_text("latin-1"))) {
          fail_at(at, "_codecs.encode is called with other than (text, 'latin1')");
        }
        PicklePointer bytes = make(PickleKind::bytes);
        bytes->text = latin1_bytes(args[0]->text, at);
        return bytes;
      }
      case GlobalRole::object:
      case GlobalRole::enumeration: {
        PicklePointer object = make(PickleKind::object);
        object->name = qualified;
        object->items = args;
        return object;
      }
      case GlobalRole::enum_member: {
        // getattr(Class, "MEMBER"): only an allowed enum's member, as an object of that enum
        // holding the member's name.
        const AllowedGlobal* target = args.size() == 2 && args[0]->kind == PickleKind::global
                                          ? find_allowed(*args[0])
                                          : nullptr;
        if (target == nullptr || target->role != GlobalRole::enumeration ||
            args[1]->kind != PickleKind::text) {
          fail_at(at, "builtins.getattr is called with other than (an allowed enum, a name)");
        }
        PicklePointer member = make(PickleKind::object);
        member->name = fmt::format("{}.{}", target->module, target->name);
        member->items = {args[1]};
        return member;
      }
      case GlobalRole::referenced:
        break;
    }
    fail_at(at, fmt::format("{} is named by checkpoints, never called", qualified));
  }

  // The code points of UTF-8 `text`, each below 256, as bytes (what encode(text, "latin1")
  // gives).
  std::string latin1_bytes(const std::string& text, size_t at) const {
    std::string bytes;
    for (size_t i = 0; i < text.size(); ++i) {
      const auto lead = static_cast<uint8_t>(text[i]);
      if (lead < 0x80) {
        bytes.push_back(static_cast<char>(lead));
      } else if ((lead == 0xC2 || lead == 0xC3) && i + 1 < text.size() &&
                 (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80) {
        bytes.push_back(
            static_cast<char>(((lead & 0x03) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3F)));
        ++i;
      } else {
        fail_at(at, "_codecs.encode's text has a character outside latin-1");
      }
    }
    return bytes;
  }

  static double big_endian_double(std::span<const std::byte> span) {
    uint64_t bits = 0;
    for (const std::byte b : span) bits = (bits << 8) | static_cast<uint8_t>(b);
    return std::bit_cast<double>(bits);
  }

  void push_integer(int64_t value) {
    PicklePointer integer = make(PickleKind::integer);
    integer->integer = value;
    push(std::move(integer));
  }
  // LONG1 and LONG4: `count` bytes of two's complement, little-endian, at most 8.
  void push_long(uint64_t count, size_t at) {
    if (count > 8) fail_at(at, fmt::format("an integer of {} bytes (at most 8 are read)", count));
    const auto span = read_span(count);
    uint64_t value = 0;
    for (size_t i = span.size(); i > 0; --i) {
      value = (value << 8) | static_cast<uint8_t>(span[i - 1]);
    }
    if (count > 0 && count < 8 && (static_cast<uint8_t>(span.back()) & 0x80) != 0) {
      value |= ~((uint64_t{1} << (8 * count)) - 1);  // sign-extend
    }
    push_integer(static_cast<int64_t>(value));
  }
  void push_text(PickleKind kind, uint64_t count) {
    PicklePointer value = make(kind);
    value->text = read_string(count);
    push(std::move(value));
  }

  void step(uint8_t op, size_t at) {
    switch (op) {
      case 0x95:  // FRAME: the length of what follows, which is read as it comes
        read_unsigned(8);
        return;
      case '(':  // MARK
        count_value();
        marks_.push_back(stack_.size());
        return;
      case '0':  // POP
        if (!marks_.empty() && marks_.back() == stack_.size()) {
          marks_.pop_back();  // POP of a mark, as Python's unpickler allows
        } else {
          pop(at);
        }
        return;
      case '1':  // POP_MARK
        pop_mark(at);
        return;
      case '2':  // DUP
        push(top(at));
        return;
      case 'N':
        push(make(PickleKind::none));
        return;
      case 0x88:    // NEWTRUE
      case 0x89: {  // NEWFALSE
        PicklePointer value = make(PickleKind::boolean);
        value->boolean = op == 0x88;
        push(std::move(value));
        return;
      }
      case 'J':  // BININT
        push_integer(static_cast<int32_t>(static_cast<uint32_t>(read_unsigned(4))));
        return;
      case 'K':  // BININT1
        push_integer(static_cast<int64_t>(read_unsigned(1)));
        return;
      case 'M':  // BININT2
        push_integer(static_cast<int64_t>(read_unsigned(2)));
        return;
      case 0x8a:  // LONG1
        push_long(read_unsigned(1), at);
        return;
      case 0x8b:  // LONG4
        push_long(read_unsigned(4), at);
        return;
      case 'G': {  // BINFLOAT
        PicklePointer value = make(PickleKind::real);
        value->real = big_endian_double(read_span(8));
        push(std::move(value));
        return;
      }
      case 'X':  // BINUNICODE
        push_text(PickleKind::text, read_unsigned(4));
        return;
      case 0x8c:  // SHORT_BINUNICODE
        push_text(PickleKind::text, read_unsigned(1));
        return;
      case 0x8d:  // BINUNICODE8
        push_text(PickleKind::text, read_unsigned(8));
        return;
      case 'B':  // BINBYTES
        push_text(PickleKind::bytes, read_unsigned(4));
        return;
      case 'C':  // SHORT_BINBYTES
        push_text(PickleKind::bytes, read_unsigned(1));
        return;
      case 0x8e:  // BINBYTES8
      case 0x96:  // BYTEARRAY8
        push_text(PickleKind::bytes, read_unsigned(8));
        return;
      case ')':  // EMPTY_TUPLE
        push(tuple_of({}));
        return;
      case 't':  // TUPLE
        push(tuple_of(pop_mark(at)));
        return;
      case 0x85:    // TUPLE1
      case 0x86:    // TUPLE2
      case 0x87: {  // TUPLE3
        const size_t count = op - 0x84u;
        std::vector<PicklePointer> values(count);
        for (size_t i = count; i > 0; --i) values[i - 1] = pop(at);
        push(tuple_of(std::move(values)));
        return;
      }
      case ']':  // EMPTY_LIST
        push(make(PickleKind::list));
        return;
      case 'l': {  // LIST
        PicklePointer list = make(PickleKind::list);
        list->items = pop_mark(at);
        push(std::move(list));
        return;
      }
      case 'a': {  // APPEND
        PicklePointer value = pop(at);
        list_at(top(at), at).items.push_back(std::move(value));
        return;
      }
      case 'e': {  // APPENDS
        std::vector<PicklePointer> values = pop_mark(at);
        auto& items = list_at(top(at), at).items;
        items.insert(items.end(), std::make_move_iterator(values.begin()),
                     std::make_move_iterator(values.end()));
        return;
      }
      case '}':  // EMPTY_DICT
        push(make(PickleKind::dict));
        return;
      case 'd': {  // DICT
        PicklePointer dict = make(PickleKind::dict);
        set_items(*dict, pop_mark(at), at);
        push(std::move(dict));
        return;
      }
      case 's': {  // SETITEM
        PicklePointer value = pop(at);
        PicklePointer key = pop(at);
        set_items(dict_at(top(at), at), {std::move(key), std::move(value)}, at);
        return;
      }
      case 'u': {  // SETITEMS
        std::vector<PicklePointer> values = pop_mark(at);
        set_items(dict_at(top(at), at), std::move(values), at);
        return;
      }
      case 'c': {  // GLOBAL: "module\nname\n"
        std::string module = read_line();
        std::string name = read_line();
        push(global(std::move(module), std::move(name), at));
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        PicklePointer name = pop(at);
        PicklePointer module = pop(at);
        if (module->kind != PickleKind::text || name->kind != PickleKind::text) {
          fail_at(at, "STACK_GLOBAL of values that are not text");
        }
        push(global(module->text, name->text, at));
        return;
      }
      case 'R': {  // REDUCE
        PicklePointer arguments = pop(at);
        PicklePointer callable = pop(at);
        push(apply(callable, arguments, at));
        return;
      }
      case 0x81: {  // NEWOBJ
        PicklePointer arguments = pop(at);
        PicklePointer type = pop(at);
        push(apply(type, arguments, at));
        return;
      }
      case 0x92: {  // NEWOBJ_EX
        PicklePointer keywords = pop(at);
        PicklePointer arguments = pop(at);
        PicklePointer type = pop(at);
        if (keywords->kind != PickleKind::dict || !keywords->entries.empty()) {
          fail_at(at, "NEWOBJ_EX with keyword arguments");
        }
        push(apply(type, arguments, at));
        return;
      }
      case 'b': {  // BUILD
        PicklePointer state = pop(at);
        PicklePointer& target = top(at);
        if (target->kind != PickleKind::object || target->state != nullptr) {
          fail_at(at, "BUILD of a value that is not an object, or twice");
        }
        target->state = std::move(state);
        return;
      }
      case 'q':  // BINPUT
        memo_put(read_unsigned(1), at);
        return;
      case 'r':  // LONG_BINPUT
        memo_put(read_unsigned(4), at);
        return;
      case 0x94:  // MEMOIZE
        memo_put(memo_.size(), at);
        return;
      case 'h':  // BINGET
        push(memo_get(read_unsigned(1), at));
        return;
      case 'j':  // LONG_BINGET
        push(memo_get(read_unsigned(4), at));
        return;
      case 'Q': {  // BINPERSID
        PicklePointer persistent = make(PickleKind::persistent);
        persistent->items.push_back(pop(at));
        push(std::move(persistent));
        return;
      }
      default:
        break;
    }
    fail_at(at, fmt::format("opcode 0x{:02x} is not read (it is not one that builds a "
                            "checkpoint's data in protocols 2 to 5)",
                            op));
  }

  void set_items(PickleValue& dict, std::vector<PicklePointer> values, size_t at) {
    if (values.size() % 2 != 0) fail_at(at, "SETITEMS with a key and no value");
    for (size_t i = 0; i < values.size(); i += 2) {
      dict.entries.emplace_back(std::move(values[i]), std::move(values[i + 1]));
    }
  }

  // The result must be finite to walk: no value inside itself, nesting within the limit along
  // every path. One depth-first pass; a value met again once finished is not walked again, but
  // its height (the levels from it down to its deepest leaf, itself included) is kept, so a
  // value shared by a shallow and a deep path is measured on the deep one too.
  void check_tree(const PicklePointer& root) const {
    constexpr int64_t kOpen = 0;  // a finished value's height is at least 1
    std::unordered_map<const PickleValue*, int64_t> heights;
    struct Frame {
      const PickleValue* value;
      std::vector<const PickleValue*> children;
      size_t next = 0;
      int64_t height = 1;
    };
    auto children_of = [](const PickleValue& value) {
      std::vector<const PickleValue*> children;
      for (const auto& item : value.items) children.push_back(item.get());
      for (const auto& [key, item] : value.entries) {
        children.push_back(key.get());
        children.push_back(item.get());
      }
      if (value.state != nullptr) children.push_back(value.state.get());
      return children;
    };
    const auto refuse_depth = [&] {
      fail_at(offset_, fmt::format("values nested deeper than {}", limits_.max_depth));
    };
    std::vector<Frame> frames;
    frames.push_back({root.get(), children_of(*root)});
    heights[root.get()] = kOpen;
    while (!frames.empty()) {
      Frame& frame = frames.back();
      if (frame.next == frame.children.size()) {
        const Frame finished = std::move(frame);
        frames.pop_back();
        heights[finished.value] = finished.height;
        if (!frames.empty()) {
          frames.back().height = std::max(frames.back().height, finished.height + 1);
        }
        continue;
      }
      const PickleValue* child = frame.children[frame.next++];
      const int64_t depth = static_cast<int64_t>(frames.size());  // the parent's; root is 1
      const auto found = heights.find(child);
      if (found != heights.end()) {
        if (found->second == kOpen) fail_at(offset_, "a value contains itself");
        if (depth + found->second > limits_.max_depth) refuse_depth();
        frame.height = std::max(frame.height, found->second + 1);
        continue;
      }
      if (depth >= limits_.max_depth) refuse_depth();
      heights[child] = kOpen;
      frames.push_back({child, children_of(*child)});
    }
  }

  std::span<const std::byte> bytes_;
  std::string_view source_;
  PickleLimits limits_;
  size_t offset_ = 0;
  int64_t values_ = 0;
  std::vector<PicklePointer> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PicklePointer> memo_;
  std::vector<std::weak_ptr<PickleValue>> made_;  // every value, to cut cycles on refusal
};

}  // namespace

const PickleValue* PickleValue::find(std::string_view key) const {
  if (kind != PickleKind::dict) return nullptr;
  for (auto entry = entries.rbegin(); entry != entries.rend(); ++entry) {
    if (entry->first->is_text(key)) return entry->second.get();
  }
  return nullptr;
}

PicklePointer read_restricted_pickle(std::span<const std::byte> bytes, std::string_view source,
                                     const PickleLimits& limits) {
  return Unpickler(bytes, source, limits).run();
}

std::vector<std::string> allowed_pickle_globals() {
  std::vector<std::string> names;
  for (const AllowedGlobal& allowed : kAllowedGlobals) {
    names.push_back(fmt::format("{}.{}", allowed.module, allowed.name));
  }
  return names;
}

}  // namespace backend
