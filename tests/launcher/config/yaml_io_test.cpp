// YAML reading and writing: OmegaConf 2.2's scalar typing, locations, errors, and the
// emitter's round trip.
#include "launcher/config/yaml_io.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "backend/common/error.hpp"

using launcher::Node;
using launcher::NodeKind;

namespace {

struct TypingCase {
  const char* text;
  NodeKind kind;
  double number;  // for Int/Float; 1/0 for Bool
};

// What OmegaConf.create(yaml) gives for `v: <text>` (PyYAML 1.1 resolvers + OmegaConf's floats).
const TypingCase kPlainScalars[] = {
    {"", NodeKind::Null, 0},
    {"~", NodeKind::Null, 0},
    {"null", NodeKind::Null, 0},
    {"Null", NodeKind::Null, 0},
    {"NULL", NodeKind::Null, 0},
    {"nUll", NodeKind::String, 0},
    {"true", NodeKind::Bool, 1},
    {"True", NodeKind::Bool, 1},
    {"TRUE", NodeKind::Bool, 1},
    {"tRue", NodeKind::String, 0},
    {"yes", NodeKind::Bool, 1},
    {"Yes", NodeKind::Bool, 1},
    {"on", NodeKind::Bool, 1},
    {"OFF", NodeKind::Bool, 0},
    {"no", NodeKind::Bool, 0},
    {"false", NodeKind::Bool, 0},
    {"y", NodeKind::String, 0},
    {"n", NodeKind::String, 0},
    {"0", NodeKind::Int, 0},
    {"42", NodeKind::Int, 42},
    {"-42", NodeKind::Int, -42},
    {"+7", NodeKind::Int, 7},
    {"1_000", NodeKind::Int, 1000},
    {"0x1F", NodeKind::Int, 31},
    {"0b101", NodeKind::Int, 5},
    {"017", NodeKind::Int, 15},
    {"0o17", NodeKind::String, 0},
    {"1:30", NodeKind::Int, 90},
    {"08", NodeKind::String, 0},
    {"1.5", NodeKind::Float, 1.5},
    {"1e-5", NodeKind::Float, 1e-5},
    {"6e-4", NodeKind::Float, 6e-4},
    {"6E4", NodeKind::Float, 6e4},
    {"1.0e+3", NodeKind::Float, 1000},
    {".5", NodeKind::Float, 0.5},
    {"1.", NodeKind::Float, 1},
    {"-.5", NodeKind::String, 0},
    {"1_0.5", NodeKind::Float, 10.5},
    {"1:30.5", NodeKind::Float, 90.5},
    {"1.5.3", NodeKind::String, 0},
    {"2023-01-01", NodeKind::String, 0},
    {"abc", NodeKind::String, 0},
    {"gpt3/126m", NodeKind::String, 0},
    {"???", NodeKind::String, 0},
    {"${a.b}", NodeKind::String, 0},
    {"1-00:00:00", NodeKind::String, 0},
};

double number_of(const Node& node) {
  if (node.is_bool()) return node.as_bool() ? 1 : 0;
  if (node.is_number()) return node.as_double();
  return 0;
}

std::filesystem::path temp_file(const std::string& name, const std::string& contents) {
  const auto directory = std::filesystem::temp_directory_path() / "launcher_yaml_io_test";
  std::filesystem::create_directories(directory);
  const auto file = directory / name;
  std::ofstream(file) << contents;
  return file;
}

}  // namespace

TEST_CASE("plain scalars are typed as OmegaConf 2.2's YAML loader types them") {
  for (const auto& item : kPlainScalars) {
    CAPTURE(item.text);
    const Node document = launcher::parse_yaml(std::string("v: ") + item.text + "\n", "t.yaml");
    const Node& value = document.at("v");
    CHECK(value.kind() == item.kind);
    if (item.kind == NodeKind::String) CHECK(value.as_string() == item.text);
    if (item.kind != NodeKind::String && item.kind != NodeKind::Null)
      CHECK(number_of(value) == item.number);
    CHECK(launcher::type_plain_scalar(item.text).kind() == item.kind);
  }
}

TEST_CASE("infinities and NaN") {
  const Node document =
      launcher::parse_yaml("a: .inf\nb: -.Inf\nc: .NaN\nd: .nan\ne: inf\n", "t.yaml");
  CHECK(document.at("a").as_double() == std::numeric_limits<double>::infinity());
  CHECK(document.at("b").as_double() == -std::numeric_limits<double>::infinity());
  CHECK(std::isnan(document.at("c").as_double()));
  CHECK(std::isnan(document.at("d").as_double()));
  CHECK(document.at("e").is_string());
}

TEST_CASE("quoted and block scalars are always strings") {
  const Node document = launcher::parse_yaml(
      "a: '1'\nb: \"true\"\nc: 'null'\nd: \"\"\ne: |\n  text\nf: !!str 5\ng: !!float 5\nh: !!int "
      "'7'\n",
      "t.yaml");
  CHECK(document.at("a").as_string() == "1");
  CHECK(document.at("a").is_quoted());
  CHECK(document.at("b").as_string() == "true");
  CHECK(document.at("c").as_string() == "null");
  CHECK(document.at("d").as_string().empty());
  CHECK(document.at("e").as_string() == "text\n");
  CHECK(document.at("f").as_string() == "5");
  CHECK(document.at("g").is_float());
  CHECK(document.at("h").as_int() == 7);
}

TEST_CASE("keys keep their order and values keep their source locations") {
  const Node document =
      launcher::parse_yaml("zeta: 1\nalpha:\n  inner: [1, 2]\nmid: x\n", "conf/x.yaml");
  CHECK(document.keys() == std::vector<std::string>{"zeta", "alpha", "mid"});
  const auto& location = document.at("alpha").at("inner").at(std::size_t{1}).location();
  CHECK(location.file == "conf/x.yaml");
  CHECK(location.line == 3);
  CHECK(location.column == 14);
  CHECK(document.at("mid").location().describe() == "conf/x.yaml:4:6");
}

TEST_CASE("anchors, aliases and << merge keys behave as in PyYAML") {
  const Node document = launcher::parse_yaml(
      "base: &b {x: 1, y: 2}\n"
      "copy: *b\n"
      "derived:\n"
      "  z: 0\n"
      "  <<: *b\n"
      "  x: 5\n",
      "t.yaml");
  CHECK(document.at("copy") == document.at("base"));
  const Node& derived = document.at("derived");
  CHECK(derived.keys() == std::vector<std::string>{"x", "y", "z"});
  CHECK(derived.at("x").as_int() == 5);
  CHECK(derived.at("y").as_int() == 2);
}

TEST_CASE("bad YAML is a common::Error with file:line:column") {
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: [1, 2\nb: 3\n", "conf/bad.yaml"),
                       doctest::Contains("conf/bad.yaml:"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: b: c\n", "conf/bad.yaml"),
                       doctest::Contains("conf/bad.yaml:1:"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: 1\nb: 2\na: 3\n", "conf/dup.yaml"),
                       doctest::Contains("conf/dup.yaml:3:1: duplicate key 'a'"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a:\n  x: 1\n  x: 2\n", "d.yaml"),
                       doctest::Contains("first defined at line 2"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: 1\n---\nb: 2\n", "m.yaml"),
                       doctest::Contains("single document"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: !custom x\n", "t.yaml"),
                       doctest::Contains("unsupported tag '!custom'"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: *nowhere\n", "t.yaml"),
                       doctest::Contains("t.yaml:1:"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: 99999999999999999999\n", "t.yaml"),
                       doctest::Contains("64-bit"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("? [a]\n: 1\n", "t.yaml"),
                       doctest::Contains("complex mapping keys"), common::Error);
}

TEST_CASE("base-60 integers that do not fit in 64 bits are refused, not wrapped") {
  // 1:00:00:... is 60^k; eleven groups are 60^11 > 2^63.
  CHECK(launcher::parse_yaml("a: 1:00:00:00:00:00:00:00:00:00:00\n", "t.yaml").at("a").as_int() ==
        604661760000000000);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: 1:00:00:00:00:00:00:00:00:00:00:00\n", "t.yaml"),
                       doctest::Contains("t.yaml:1:4: '1:00:00:00:00:00:00:00:00:00:00:00' does "
                                         "not fit in a 64-bit integer"),
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: 9223372036854775807:1\n", "t.yaml"),
                       doctest::Contains("does not fit in a 64-bit integer"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: 153722867280912930:8\n", "t.yaml"),
                       doctest::Contains("does not fit in a 64-bit integer"), common::Error);
  CHECK(launcher::parse_yaml("a: -153722867280912930:7\n", "t.yaml").at("a").as_int() ==
        -9223372036854775807);
}

TEST_CASE("the 64-bit range's ends are read: -2^63 fits although 2^63 does not") {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  CHECK(launcher::parse_yaml("a: -9223372036854775808\n", "t.yaml").at("a").as_int() == kMin);
  CHECK(launcher::parse_yaml("a: -0x8000000000000000\n", "t.yaml").at("a").as_int() == kMin);
  CHECK(launcher::parse_yaml("a: -153722867280912930:8\n", "t.yaml").at("a").as_int() == kMin);
  CHECK(launcher::parse_yaml("a: 9223372036854775807\n", "t.yaml").at("a").as_int() ==
        std::numeric_limits<int64_t>::max());
  for (const char* beyond : {"a: 9223372036854775808\n", "a: -9223372036854775809\n",
                             "a: 0x8000000000000000\n", "a: 18446744073709551616\n"}) {
    CAPTURE(beyond);
    CHECK_THROWS_WITH_AS(launcher::parse_yaml(beyond, "t.yaml"),
                         doctest::Contains("does not fit in a 64-bit integer"), common::Error);
  }
}

TEST_CASE("an unclosed quoted string is an error naming the file and the line it starts on") {
  // yaml-cpp 0.7 reads an unclosed quote to the end of the file when a line break follows it,
  // so the check is ours; without a line break yaml-cpp reports it itself.
  const std::vector<std::string> unclosed = {
      "partition: \"unclosed\n",       "partition: \"unclosed\naccount: x\n",
      "partition: 'unclosed\n",         "a: 1\npartition: \"x\\\"\n",
      "partition: 'it''s\n",            "a: &anchor !!str \"unclosed\n\n",
      "a:\n  - \"unclosed\n",          "\"unclosed key: 1\n",
      "\xEF\xBB\xBF" "a: 1\nb: \"unclosed\n"};
  for (const std::string& text : unclosed) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(launcher::parse_yaml(text, "conf/cluster/bcm.yaml"),
                         doctest::Contains("conf/cluster/bcm.yaml:"), common::Error);
    CHECK_THROWS_WITH_AS(launcher::parse_yaml(text, "conf/cluster/bcm.yaml"),
                         doctest::Contains("not closed"), common::Error);
  }
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: 1\npartition: \"unclosed\naccount: x\n", "b.yaml"),
                       doctest::Contains("b.yaml:2:12: the quoted string that starts here is not "
                                         "closed"),
                       common::Error);
  // Closed ones, also over several lines and with escaped quotes, are read as before.
  const Node closed = launcher::parse_yaml(
      "a: \"x\\\"y\"\nb: 'it''s'\nc: \"two\n  lines\"\nd: [\"e\", 'f']\n\"g\": &h !!str 'i'\n"
      "j: \"\\\\\"\n",
      "t.yaml");
  CHECK(closed.at("a").as_string() == "x\"y");
  CHECK(closed.at("b").as_string() == "it's");
  CHECK(closed.at("c").as_string() == "two lines");
  CHECK(closed.at("d").at(1).as_string() == "f");
  CHECK(closed.at("g").as_string() == "i");
  CHECK(closed.at("j").as_string() == "\\");
}

TEST_CASE("invalid UTF-8 is an error naming the file, line and column") {
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: 1\npartition: \xff\xfe bad\n", "conf/c.yaml"),
                       doctest::Contains("conf/c.yaml:2:12: invalid UTF-8 (byte 0xff)"),
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("p: \"\xc3\x28\"\n", "conf/c.yaml"),
                       doctest::Contains("conf/c.yaml:1:5: invalid UTF-8 (byte 0xc3)"),
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("p: x\xed\xa0\x80\n", "c.yaml"),  // a surrogate
                       doctest::Contains("c.yaml:1:5: invalid UTF-8"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::load_yaml_file(temp_file("latin1.yaml", "name: caf\xe9\n")),
                       doctest::Contains("latin1.yaml:1:10: invalid UTF-8 (byte 0xe9)"),
                       common::Error);
  // Control characters other than tab and line breaks are refused as PyYAML refuses them (a
  // NUL near the start made yaml-cpp read the file as UTF-16).
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("a: 1\nb: x\x01y\n", "c.yaml"),
                       doctest::Contains("c.yaml:2:5: control character 0x01 is not allowed"),
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_yaml(std::string("a\0: 1\n", 6), "c.yaml"),
                       doctest::Contains("c.yaml:1:2: control character 0x00"), common::Error);
  CHECK(launcher::parse_yaml("a: \"x\\x01y\"\r\nb:\t1\n", "t.yaml").at("a").as_string() ==
        "x\x01y");
  // UTF-8 proper, byte-order mark included, is read as it is.
  CHECK(launcher::parse_yaml("\xEF\xBB\xBFname: caf\xc3\xa9 \xf0\x9f\x9a\x80\n", "t.yaml")
            .at("name")
            .as_string() == "caf\xc3\xa9 \xf0\x9f\x9a\x80");
}

TEST_CASE("load_yaml_file reads files and names missing ones") {
  const auto file = temp_file("ok.yaml", "a: 1\n");
  CHECK(launcher::load_yaml_file(file).at("a").as_int() == 1);
  CHECK(launcher::load_yaml_file(temp_file("empty.yaml", "")).is_null());
  const auto missing = file.parent_path() / "missing.yaml";
  CHECK_THROWS_WITH_AS(launcher::load_yaml_file(missing),
                       doctest::Contains((missing.string() + ": no such file").c_str()),
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::load_yaml_file(temp_file("bad.yaml", "x: [\n")),
                       doctest::Contains("bad.yaml:2:1:"), common::Error);
}

TEST_CASE("to_yaml round-trips a tree of tricky strings") {
  Node tree = Node::map();
  const std::vector<std::string> tricky = {
      "1",         "true",        "yes",       "off",   "null", "~",      "",         " leading",
      "trailing ", "a: b",        "a #b",      "#c",    "-",    "- x",    "? q",      ":",
      "ends:",     "[list]",      "{map}",     "x{y}z", "a,b",  "${a.b}", "\\${esc}", "it's",
      "\"dq\"",    "multi\nline", "tab\there", "1e-5",  "0x1F", "017",    "1:30",     ".inf",
      "???",       "*star",       "&amp",      "!bang", "%pct", "@at",    "`tick`",   "|pipe",
      ">gt",       "---",         "...",       "=",     "<<",   "héllo",  "1_000",    "2023-01-01",
      "Null",      "NO"};
  Node strings = Node::list();
  for (const auto& text : tricky) strings.push_back(Node::string(text));
  tree.set("strings", strings);
  Node keys = Node::map();
  for (const auto& text : tricky)
    keys.set(text, Node::integer(static_cast<std::int64_t>(keys.size())));
  tree.set("keys", keys);
  Node numbers = Node::map();
  numbers.set("int", Node::integer(-12));
  numbers.set("float", Node::floating(6e-4));
  numbers.set("small", Node::floating(1e-5));
  numbers.set("big", Node::floating(1e20));
  numbers.set("whole", Node::floating(100.0));
  numbers.set("inf", Node::floating(-std::numeric_limits<double>::infinity()));
  numbers.set("nan", Node::floating(std::numeric_limits<double>::quiet_NaN()));
  numbers.set("bool", Node::boolean(false));
  numbers.set("null", Node::null());
  tree.set("numbers", numbers);
  Node nested = Node::list();
  Node item = Node::map();
  item.set("a", Node::integer(1));
  Node inner = Node::list();
  inner.push_back(Node::string("x"));
  inner.push_back(Node::list());
  item.set("b", inner);
  nested.push_back(item);
  Node list_of_lists = Node::list();
  list_of_lists.push_back(Node::integer(1));
  list_of_lists.push_back(Node::string("two"));
  nested.push_back(list_of_lists);
  nested.push_back(Node::map());
  tree.set("nested", nested);
  tree.set("empty_map", Node::map());
  tree.set("empty_list", Node::list());

  const std::string text = launcher::to_yaml(tree);
  CAPTURE(text);
  const Node reparsed = launcher::parse_yaml(text, "roundtrip.yaml");
  CHECK(reparsed == tree);
  CHECK(reparsed.keys() == tree.keys());
  CHECK(text.find("small: 1.0e-05\n") != std::string::npos);
  CHECK(text.find("- '1'\n") != std::string::npos);
  CHECK(text.find("- ${a.b}\n") != std::string::npos);
}

TEST_CASE("to_yaml writes block style like PyYAML") {
  const Node tree =
      launcher::parse_yaml("a:\n  b: 1\n  c: [x, y]\nd: []\ne:\n- f: 1\n  g: 2\n", "t.yaml");
  CHECK(launcher::to_yaml(tree) == "a:\n  b: 1\n  c:\n  - x\n  - y\nd: []\ne:\n- f: 1\n  g: 2\n");
  CHECK(launcher::to_yaml(Node::string("true")) == "'true'\n");
  CHECK(launcher::to_yaml(Node::map()) == "{}\n");
}
