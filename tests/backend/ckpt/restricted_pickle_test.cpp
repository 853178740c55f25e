// The restricted unpickler on pickles written byte by byte: each opcode family builds what
// Python's unpickler builds, and each refusal (a global outside the list, a truncated or
// malformed stream, a cycle, nesting or size beyond the limits) is one common::Error naming
// the source and the byte. Files written by PyTorch itself: torch_checkpoint_test.cpp.
#include "backend/ckpt/restricted_pickle.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/common/error.hpp"

namespace {

using namespace std::string_literals;
using backend::PickleKind;
using backend::PicklePointer;

// The pickle of `body` under protocol 2's header, ended by STOP.
std::string pickle(const std::string& body) {
  return std::string("\x80\x02", 2) + body + ".";
}

PicklePointer read(const std::string& bytes, backend::PickleLimits limits = {}) {
  return backend::read_restricted_pickle(
      {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}, "test.pkl", limits);
}

}  // namespace

TEST_CASE("restricted pickle: numbers, text, bytes and containers come back as Python has them") {
  CHECK(read(pickle("K\x05"s))->integer == 5);
  CHECK(read(pickle(std::string("J\xfe\xff\xff\xff", 5)))->integer == -2);
  CHECK(read(pickle(std::string("\x8a\x01\xff", 3)))->integer == -1);  // LONG1, sign-extended
  CHECK(read(pickle(std::string("\x8a\x06\x00\x00\x00\x00\x00\x01", 8)))->integer == int64_t{1}
                                                                                         << 40);
  CHECK(read(pickle(std::string("\x8a\x00", 2)))->integer == 0);
  CHECK(read(pickle(std::string("G\x3f\xf0\x00\x00\x00\x00\x00\x00", 9)))->real == 1.0);
  CHECK(read(pickle("\x88"s))->boolean);
  CHECK(read(pickle("N"s))->kind == PickleKind::none);
  CHECK(read(pickle(std::string("X\x02\x00\x00\x00hi", 7)))->text == "hi");
  const auto bytes = read(pickle(std::string("C\x02\x00\xff", 4)));
  CHECK(bytes->kind == PickleKind::bytes);
  CHECK(bytes->text == std::string("\x00\xff", 2));
  // [1, (2, 3)] through MARK/APPENDS and TUPLE2; {"a": 1, "a": 2} keeps both, find sees 2.
  const auto list =
      read(pickle("](K\x01K\x02K\x03\x86"
                  "e"s));
  REQUIRE(list->kind == PickleKind::list);
  REQUIRE(list->items.size() == 2);
  CHECK(list->items[1]->kind == PickleKind::tuple);
  CHECK(list->items[1]->items[1]->integer == 3);
  const auto dict =
      read(pickle("}(\x8c\x01"
                  "aK\x01\x8c\x01"
                  "aK\x02u"s));
  CHECK(dict->entries.size() == 2);
  REQUIRE(dict->find("a") != nullptr);
  CHECK(dict->find("a")->integer == 2);
  CHECK(dict->find("b") == nullptr);
  // The memo: BINPUT then BINGET gives the same value, twice in the list.
  const auto shared =
      read(pickle("](X\x01\x00\x00\x00xq\x00h\x00"
                  "e"s));
  REQUIRE(shared->items.size() == 2);
  CHECK(shared->items[0] == shared->items[1]);
}

TEST_CASE("restricted pickle: allowed globals build what a checkpoint needs") {
  // collections.OrderedDict() then SETITEMS: a dict.
  const auto ordered = read(pickle("ccollections\nOrderedDict\n)R(\x8c\x01kK\x07u"s));
  REQUIRE(ordered->kind == PickleKind::dict);
  CHECK(ordered->find("k")->integer == 7);
  // argparse.Namespace() with BUILD's state: an object holding both.
  const auto args = read(pickle("cargparse\nNamespace\n)\x81}(\x8c\x01nK\x02ub"s));
  REQUIRE(args->kind == PickleKind::object);
  CHECK(args->name == "argparse.Namespace");
  REQUIRE(args->state != nullptr);
  CHECK(args->state->find("n")->integer == 2);
  // _codecs.encode("\u00ff\u0001", "latin1"): protocol 2's bytes.
  const auto encoded =
      read(pickle("c_codecs\nencode\nX\x03\x00\x00\x00\xc3\xbf\x01X\x06\x00\x00"
                  "\x00latin1\x86R"s));
  CHECK(encoded->kind == PickleKind::bytes);
  CHECK(encoded->text == std::string("\xff\x01", 2));
  // Python 3.11's pickle of an enum member: getattr(its class, "NAME").
  const auto member =
      read(pickle("cbuiltins\ngetattr\ncmegatron.core.enums\nModelType\nX\x12\x00\x00\x00"
                  "encoder_or_decoder\x86R"s));
  REQUIRE(member->kind == PickleKind::object);
  CHECK(member->name == "megatron.core.enums.ModelType");
  REQUIRE(member->items.size() == 1);
  CHECK(member->items[0]->is_text("encoder_or_decoder"));
  const auto globals = backend::allowed_pickle_globals();
  CHECK(std::find(globals.begin(), globals.end(), "torch._utils._rebuild_tensor_v2") !=
        globals.end());
  CHECK(std::find(globals.begin(), globals.end(),
                  "torch.distributed.checkpoint.metadata.TensorStorageMetadata") != globals.end());
}

TEST_CASE("restricted pickle: what is not data is refused, naming the source and the byte") {
  auto refused = [](const std::string& bytes, const std::string& message,
                    backend::PickleLimits limits = {}) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(read(bytes, limits), doctest::Contains(message.c_str()), common::Error);
  };
  refused(pickle("cos\nsystem\nX\x02\x00\x00\x00idR"s),
          "test.pkl: the pickle names os.system, which a checkpoint has no use for and is not "
          "loaded");
  refused(pickle("\x8c\x05posix\x8c\x06system\x93"s), "names posix.system");
  refused(pickle("cbuiltins\neval\n"s), "names builtins.eval");
  // getattr on anything but an allowed enum class: torch.Size.mro, a DCP dataclass's attribute.
  refused(pickle("cbuiltins\ngetattr\nctorch\nSize\nX\x03\x00\x00\x00mro\x86R"s),
          "builtins.getattr is called with other than (an allowed enum, a name)");
  refused(pickle("cbuiltins\ngetattr\nctorch.distributed.checkpoint.metadata\nMetadata\n"
                 "X\x08\x00\x00\x00__init__\x86R"s),
          "builtins.getattr is called with other than (an allowed enum, a name)");
  // A storage type is named, never called.
  refused(pickle("ctorch\nFloatStorage\n)R"s), "torch.FloatStorage is named by checkpoints");
  refused("K\x05.", "not a pickle of protocol 2 or later");
  refused(std::string("\x80\x01K\x05.", 5), "pickle protocol 1 at byte 1");
  refused(std::string("\x80\x02X\xff\x00\x00\x00"
                      "ab",
                      9),
          "runs past the end");
  refused(std::string("\x80\x02K\x05", 4), "the pickle ends without STOP");
  refused(pickle("h\x05"s), "memo entry 5 is read before it is set");
  refused(pickle(std::string("\x8a\x09", 2) + std::string(9, '\x01')), "an integer of 9 bytes");
  refused(pickle("\xff"s), "opcode 0xff is not read");
  refused(pickle("K\x01K\x02"s), "STOP leaves 2 values");
  refused(pickle("a"s), "empty stack");
  refused(pickle("K\x01K\x02"
                 "a"s),
          "APPEND to a value that is not a list");
  refused(pickle("t"s), "needs a MARK");
  // A list inside itself, and lists nested beyond the limit.
  refused(pickle("]q\x00h\x00"
                 "a"s),
          "a value contains itself");
  std::string deep;
  for (int i = 0; i < 70; ++i) deep += "]";
  for (int i = 0; i < 69; ++i) deep += "a";
  refused(pickle(deep), "values nested deeper than 64");
  // A value shared by a shallow path and a deep one, met first on the shallow one: outer holds
  // x = [[]] and [[x]], so x's inner list is 5 deep on the second path (found by the fuzzer,
  // which walks every path, when only the first was measured).
  const std::string shared = pickle(
      "]]]aq\x00"
      "a]]h\x00"
      "aaa"s);
  refused(shared, "values nested deeper than 4", {.max_depth = 4});
  CHECK(read(shared, {.max_depth = 5})->items.size() == 2);
  refused(pickle("](K\x01K\x02K\x03"
                 "e"s),
          "more than 6 values", {.max_values = 6});
}
