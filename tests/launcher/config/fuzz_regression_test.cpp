// Regression tests for what tests/fuzz/ found in the config engine: one test case per finding,
// each the smallest input that showed it. "compose fuzzer:" / "override fuzzer:" findings came
// from libFuzzer runs; "crafted for the ... fuzzer:" ones from hostile inputs written by hand
// and run through that fuzz target.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "backend/common/error.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/overrides.hpp"
#include "launcher/config/yaml_io.hpp"

using launcher::Node;

namespace {

Node round_trip(const Node& tree) {
  return launcher::parse_yaml(launcher::to_yaml(tree), "round_trip.yaml");
}

}  // namespace

// compose fuzzer: an explicit key ("? key") of more than 1024 characters was written back as
// an implicit key, which YAML readers refuse ("illegal map value").
TEST_CASE("fuzz: keys of 128 characters or more are written as explicit keys") {
  const std::string long_key(1100, 'a');
  const Node tree = launcher::parse_yaml("? " + long_key + "\n: 1\n", "long_key.yaml");
  REQUIRE(tree.at(long_key).as_int() == 1);
  CHECK(launcher::to_yaml(tree) == "? " + long_key + "\n: 1\n");
  CHECK(round_trip(tree) == tree);
  // Nested, with collections as values.
  Node nested = Node::map();
  Node inner = Node::map();
  Node list = Node::list();
  list.push_back(Node::integer(1));
  Node item = Node::map();
  item.set(std::string(200, 'q'), Node::list());
  list.push_back(item);
  inner.set(long_key + "x", list);
  inner.set(std::string(130, 'm'), item);
  nested.set("short", inner);
  const std::string yaml = launcher::to_yaml(nested);
  CHECK(yaml.starts_with("short:\n  ? " + long_key + "x\n  :\n    - 1\n    - ? " +
                         std::string(200, 'q') + "\n      : []\n  ? "));
  CHECK(round_trip(nested) == nested);
  CHECK(round_trip(tree) == tree);
  // Below PyYAML's limit keys stay simple.
  CHECK(launcher::to_yaml(launcher::parse_yaml(std::string(127, 'k') + ": 1\n", "t.yaml")) ==
        std::string(127, 'k') + ": 1\n");
}

// crafted for the compose fuzzer: 511 bytes of aliases of aliases ten deep (the "billion laughs")
// expanded to 10^9 values and exhausted memory.
TEST_CASE("fuzz: aliases that expand exponentially are refused") {
  std::string laughs = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int level = 1; level < 9; ++level) {
    laughs += fmt::format("a{}: &a{} [", level, level);
    for (int i = 0; i < 10; ++i) laughs += fmt::format("{}*a{}", i ? ", " : "", level - 1);
    laughs += "]\n";
  }
  CHECK_THROWS_WITH_AS(launcher::parse_yaml(laughs, "laughs.yaml"),
                       doctest::Contains("laughs.yaml:6:"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml(laughs, "laughs.yaml"),
                       doctest::Contains("expand to more than 1000000 values"), common::Error);
  // Ordinary use of anchors is untouched.
  const Node tree = launcher::parse_yaml("a: &x {k: [1, 2]}\nb: *x\nc: *x\n", "t.yaml");
  CHECK(tree.at("c") == tree.at("a"));
}

// crafted for the compose fuzzer: s1: ${.s0}${.s0}, s2: ${.s1}${.s1}, ... doubled a string 40 times
// (OOM), and the same with lists copied whole.
TEST_CASE("fuzz: interpolations that grow exponentially are refused") {
  std::string strings = "s0: xxxxxxxxxxxxxxxx\n";
  std::string lists = "l0: [1, 2]\n";
  for (int i = 1; i < 40; ++i) {
    strings += fmt::format("s{}: ${{.s{}}}${{.s{}}}\n", i, i - 1, i - 1);
    lists += fmt::format("l{}: ['${{..l{}}}', '${{..l{}}}']\n", i, i - 1, i - 1);
  }
  CHECK_THROWS_WITH_AS(launcher::resolve(launcher::parse_yaml(strings, "s.yaml"), {}),
                       doctest::Contains("string interpolation builds more than 64 MiB of text"),
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::resolve(launcher::parse_yaml(lists, "l.yaml"), {}),
                       doctest::Contains("interpolations copy more than 1000000 values"),
                       common::Error);
  // A few levels are fine.
  const Node resolved = launcher::resolve(
      launcher::parse_yaml(
          "a: x\nb: ${a}${a}\nc: ${b}${b}\nl: ['${c}', '${c}']\nm: ['${l}', '${l}']\n", "ok.yaml"),
      {});
  CHECK(resolved.at("c").as_string() == "xxxx");
  CHECK(resolved.at("m").at(1).at(0).as_string() == "xxxx");
}

// crafted for the override fuzzer: 8000 nested brackets in an override value, and 2000 nested ${ in
// one, overflowed the stack of the recursive-descent parser.
TEST_CASE("fuzz: values nested more than 100 levels deep are refused") {
  const auto nested = [](const std::string& open, const std::string& close, int depth) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += open;
    text += "a";
    for (int i = 0; i < depth; ++i) text += close;
    return text;
  };
  CHECK_THROWS_WITH_AS(launcher::parse_override("x=" + nested("[", "]", 8000)),
                       doctest::Contains("more than 100 levels of nested [ ], { } or ${ }"),
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_override("x=" + nested("{k:", "}", 500)),
                       doctest::Contains("more than 100 levels"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_override("x=" + nested("${", "}", 2000)),
                       doctest::Contains("more than 100 levels"), common::Error);
  CHECK_THROWS_WITH_AS(
      launcher::resolve(launcher::parse_yaml("x: '" + nested("${", "}", 2000) + "'\n", "t.yaml"),
                        {}),
      doctest::Contains("more than 100 levels"), common::Error);
  CHECK(launcher::parse_override("x=" + nested("[", "]", 99)).value->is_list());
}

// crafted for the compose fuzzer: k0: ${.k1}, k1: ${.k2}, ... 3000 long overflowed
// the stack of the recursive resolver.
TEST_CASE("fuzz: interpolation chains longer than 500 are refused") {
  auto chain = [](int length) {
    std::string yaml;
    for (int i = 0; i < length; ++i) yaml += fmt::format("k{}: ${{.k{}}}\n", i, i + 1);
    return yaml + fmt::format("k{}: end\n", length);
  };
  CHECK_THROWS_WITH_AS(launcher::resolve(launcher::parse_yaml(chain(3000), "chain.yaml"), {}),
                       doctest::Contains("interpolation chain longer than 500 values: k0 -> k1 "
                                         "-> ... -> k500 (at chain.yaml:501:"),
                       common::Error);
  CHECK(
      launcher::resolve(launcher::parse_yaml(chain(400), "chain.yaml"), {}).at("k0").as_string() ==
      "end");
}

// crafted for the override fuzzer: ++a.a.a...(3000 parts).b=1 built a config 3000 levels deep,
// which to_yaml wrote and yaml-cpp then refused to read ("bad file"); deeper still, it overflowed
// the stack. One nesting limit now holds on both sides, and keys and packages are bounded.
TEST_CASE("fuzz: nesting is limited the same way when reading and writing YAML") {
  auto nested_lists = [](std::size_t depth) {
    std::string text = "a: ";
    for (std::size_t i = 0; i < depth; ++i) text += "[";
    for (std::size_t i = 0; i < depth; ++i) text += "]";
    return text + "\n";
  };
  // The root mapping is one level, the lists the others.
  const Node deepest = launcher::parse_yaml(nested_lists(launcher::kMaxYamlNesting - 1), "ok.yaml");
  CHECK(round_trip(deepest) == deepest);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml(nested_lists(launcher::kMaxYamlNesting), "deep.yaml"),
                       doctest::Contains("deep.yaml:1:"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml(nested_lists(450), "deep.yaml"),
                       doctest::Contains("more than 400 levels of nested lists and mappings"),
                       common::Error);
  Node too_deep = deepest;
  too_deep.at("a").push_back(Node::list());  // an empty list one level deeper is still a level
  Node* innermost = &too_deep.at("a");
  while (innermost->size() > 0 && innermost->at(0).is_list()) innermost = &innermost->at(0);
  innermost->push_back(Node::list());
  CHECK_THROWS_WITH_AS(launcher::to_yaml(too_deep),
                       doctest::Contains("nests more than 400 lists and mappings"), common::Error);

  std::string key = "++";
  for (int i = 0; i < 3000; ++i) key += "a.";
  CHECK_THROWS_WITH_AS(launcher::parse_override(key + "b=1"),
                       doctest::Contains("the key has more than 100 parts"), common::Error);
  std::string fine = "++";
  for (int i = 0; i < 99; ++i) fine += "a.";
  CHECK(launcher::parse_override(fine + "b=1").key.size() == 199);
}

// crafted for the compose fuzzer: a `# @package a.a.a...(3000 parts).b` header did the same through
// a package.
TEST_CASE("fuzz: packages of more than 100 parts are refused") {
  namespace fs = std::filesystem;
  std::string pattern = (fs::temp_directory_path() / "deep_package_XXXXXX").string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  const fs::path conf = fs::path(pattern) / "conf";
  fs::create_directories(conf / "other");
  std::string package;
  for (int i = 0; i < 3000; ++i) package += "a.";
  std::ofstream(conf / "config.yaml") << "defaults:\n  - /other: b\n";
  std::ofstream(conf / "other/b.yaml") << "# @package " << package << "b\nx: 1\n";
  CHECK_THROWS_WITH_AS(launcher::compose({conf, "config", {}}),
                       doctest::Contains("b.yaml: its package 'a.a.a."), common::Error);
  CHECK_THROWS_WITH_AS(launcher::compose({conf, "config", {}}),
                       doctest::Contains("has more than 100 parts"), common::Error);
  std::ofstream(conf / "other/b.yaml", std::ios::trunc) << "# @package p.q\nx: 1\n";
  CHECK(launcher::compose({conf, "config", {}}).config.at("p").at("q").at("x").as_int() == 1);
  fs::remove_all(pattern);
}

// override fuzzer: model.layers=._ set the string "._", which PyYAML's float pattern matches
// but no float can be made of; to_yaml asked the reader's typing whether it could be written
// plain, and that threw. Such strings are quoted now.
TEST_CASE("fuzz: to_yaml quotes strings that a YAML reader would misread or refuse") {
  for (const char* text : {"._", "1_", "99999999999999999999", "0b", "._e1", "1:60"}) {
    CAPTURE(text);
    Node tree = Node::map();
    tree.set("value", Node::string(text));
    std::string yaml;
    REQUIRE_NOTHROW(yaml = launcher::to_yaml(tree));
    CHECK(round_trip(tree) == tree);
  }
  CHECK(launcher::to_yaml(launcher::parse_override("a=._").value.value()) == "'._'\n");
}

// compose fuzzer: a document whose only content was the plain scalar "\xff\xfe\xff..." (after
// tabs) was written back starting with those bytes, which yaml-cpp takes for a UTF-16 byte
// order mark. Strings starting like a byte-order mark are quoted now; and since configs must be
// UTF-8 (as Hydra reads them), the invalid bytes themselves are refused when read.
TEST_CASE("fuzz: strings that start like a byte-order mark round-trip") {
  const std::vector<std::string> texts = {"\xef\xbb\xbf"
                                          "a",
                                          "a\xc2\x85"
                                          "b",
                                          "a\xe2\x80\xa8"
                                          "b",
                                          "x\xef\xbb\xbf"};
  for (const std::string& text : texts) {
    CAPTURE(text);
    CHECK(round_trip(Node::string(text)) == Node::string(text));
    Node keyed = Node::map();
    keyed.set(text, Node::string(text));
    CHECK(round_trip(keyed) == keyed);
  }
  for (const std::string text : {"\xff\xfe\xff\xff", "\xfe\xff", "\xff"}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(round_trip(Node::string(text)), doctest::Contains("invalid UTF-8"),
                         common::Error);
  }
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("\t\t\xff\xfe\xff\xff # c\n", "bom.yaml"),
                       doctest::Contains("bom.yaml:1:3: invalid UTF-8 (byte 0xff)"),
                       common::Error);
}

// compose fuzzer: yaml-cpp decodes the double-quoted escapes \_ and \N to the Latin-1 bytes
// 0xA0 and 0x85, so the value was not UTF-8 and to_yaml wrote a file parse_yaml refuses.
TEST_CASE("fuzz: the escapes \\_ and \\N are the characters U+00A0 and U+0085, as UTF-8") {
  const Node tree = launcher::parse_yaml("a: \"x\\_y\\Nz\"\n\"k\\_\": 1\n", "escapes.yaml");
  CHECK(tree.at("a").as_string() == "x\u00A0y\u0085z");
  CHECK(tree.at("k\u00A0").as_int() == 1);
  CHECK(round_trip(tree) == tree);
}
