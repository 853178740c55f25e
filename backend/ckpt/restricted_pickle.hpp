// A restricted unpickler: Python's pickle format (protocols 2 to 5, the binary opcodes; Python's
// Lib/pickletools.py documents each) read into a tree of plain values, with no code run and no
// class looked up, for the checkpoints PyTorch, Megatron-LM and NeMo write with torch.save.
// As PyTorch's own torch.load(weights_only=True) (torch/_weights_only_unpickler.py), it accepts
// only the opcodes that build data and the few globals a checkpoint needs, each named in one
// list (kAllowedGlobals in restricted_pickle.cpp); any other global is refused with its
// "module.name" and the file, before anything is built from it. What a global builds:
//   collections.OrderedDict          a dict (REDUCE with no arguments, then SETITEMS)
//   torch.Size                       the tuple it wraps
//   torch._utils._rebuild_parameter  its tensor (the first argument)
//   _codecs.encode                   bytes: protocol 2 pickles bytes as encode(text, "latin1")
//   builtins.getattr                 only as getattr(an allowed enum class, "MEMBER"), Python
//                                    3.11's pickle of an enum member: an object of that enum
//                                    whose one argument is the member's name
//   the rest (tensor rebuilds, storage types, dtypes, argparse.Namespace, numpy's arrays and
//   scalars, the enums Megatron stores, the dataclasses of PyTorch Distributed Checkpoint's
//   .metadata)
//                                    an object: the global, the arguments of its REDUCE or
//                                    NEWOBJ, and the state of its BUILD, for the reader that
//                                    knows the format (torch_checkpoint.hpp) to interpret
// A persistent id (BINPERSID: PyTorch's storages) becomes a value holding the id, likewise left
// to that reader.
//
// Bounded, since the file is a user's: the memo, the stack and every value are counted against
// PickleLimits, a string or byte run cannot exceed the input, integers are at most 64-bit, and
// the result is checked to be a tree (shared parts allowed, no cycle) no deeper than the limit,
// so that the readers walking it cannot recurse without end. Every refusal is a common::Error
// "<source>: <what> at byte <offset>".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace backend {

enum class PickleKind {
  none,
  boolean,
  integer,
  real,
  text,
  bytes,
  tuple,
  list,
  dict,
  global,      // a class or function named by GLOBAL or STACK_GLOBAL: module and name
  object,      // an allowed global applied: `global`, `items` its arguments, `state` BUILD's
  persistent,  // BINPERSID's value: `items` holds the persistent id
};

struct PickleValue;
using PicklePointer = std::shared_ptr<PickleValue>;

struct PickleValue {
  PickleKind kind = PickleKind::none;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;                  // text (UTF-8) or bytes; a global's module
  std::string name;                  // a global's name; an object's global as "module.name"
  std::vector<PicklePointer> items;  // tuple and list elements; an object's arguments
  // A dict's entries in insertion order; a key set twice is there twice (SETITEM does not look
  // keys up), and find() sees the later, as Python's dict would hold it.
  std::vector<std::pair<PicklePointer, PicklePointer>> entries;
  PicklePointer state;  // an object's BUILD state (nullptr without one)

  bool is_text(std::string_view value) const { return kind == PickleKind::text && text == value; }
  // The dict entry under the text key `key`, nullptr when absent or not a dict.
  const PickleValue* find(std::string_view key) const;
};

struct PickleLimits {
  int64_t max_values = int64_t{1} << 24;  // values made, memo entries and stack slots together
  int64_t max_depth = 64;                 // nesting of the result
};

// The value a pickle's STOP leaves, from `bytes` (`source` names them in messages: a file, or
// "archive.pt: archive/data.pkl").
PicklePointer read_restricted_pickle(std::span<const std::byte> bytes, std::string_view source,
                                     const PickleLimits& limits = {});

// "module.name" of every global the reader accepts, in its list's order (for docs and tests).
std::vector<std::string> allowed_pickle_globals();

}  // namespace backend
