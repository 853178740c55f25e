// Hydra's override grammar (parsing and typing) and the semantics of applying config
// overrides to a composed config.
#include "launcher/config/overrides.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "backend/common/error.hpp"
#include "launcher/config/yaml_io.hpp"

using launcher::Node;
using launcher::Override;

namespace {

Node I(std::int64_t value) {
  return Node::integer(value);
}
Node F(double value) {
  return Node::floating(value);
}
Node S(std::string value) {
  return Node::string(std::move(value));
}
Node B(bool value) {
  return Node::boolean(value);
}
Node Null() {
  return Node::null();
}
Node L(std::vector<Node> items) {
  Node list = Node::list();
  for (auto& item : items) list.push_back(std::move(item));
  return list;
}
Node M(std::vector<std::pair<std::string, Node>> entries) {
  Node map = Node::map();
  for (auto& [key, value] : entries) map.set(key, std::move(value));
  return map;
}

struct ValueCase {
  std::string text;  // the override as typed
  Node expected;
};

}  // namespace

TEST_CASE("override values are typed as Hydra types them") {
  const std::vector<ValueCase> cases = {
      {"a=1", I(1)},
      {"a=-20", I(-20)},
      // The 64-bit range's ends: −2^63 fits although 2^63 does not.
      {"a=-9223372036854775808", I(std::numeric_limits<int64_t>::min())},
      {"a=9223372036854775807", I(std::numeric_limits<int64_t>::max())},
      {"a=+7", I(7)},
      {"a=1_000", I(1000)},
      {"a=007", S("007")},
      {"a=0x10", S("0x10")},
      {"a=3.14", F(3.14)},
      {"a=1e-5", F(1e-5)},
      {"a=6E-4", F(6e-4)},
      {"a=.5", F(0.5)},
      {"a=5.", F(5.0)},
      {"a=1.5.3", S("1.5.3")},
      {"a=true", B(true)},
      {"a=TrUe", B(true)},
      {"a=False", B(false)},
      {"a=yes", S("yes")},
      {"a=off", S("off")},
      {"a=null", Null()},
      {"a=NULL", Null()},
      {"a=abc", S("abc")},
      {"a=gpt3/126m", S("gpt3/126m")},
      {"a=/data/path-1/x.bin", S("/data/path-1/x.bin")},
      {"a=c:\\foo\\a-b.txt", S("c:\\foo\\a-b.txt")},
      {"a=a b c", S("a b c")},
      {"a=  padded  ", S("padded")},
      {"a= 5", I(5)},
      {"a=", S("")},
      {"a='hello world'", S("hello world")},
      {"a=\"hello world\"", S("hello world")},
      {"a='1'", S("1")},
      {"a='true'", S("true")},
      {"a='x=y'", S("x=y")},
      {"a=x\\=y", S("x=y")},
      {"a=a\\,b", S("a,b")},
      {"a=\\ ab", S(" ab")},
      {"a=ab\\\\", S("ab\\")},
      {"a='it\\'s'", S("it's")},
      {"a=\"say \\\"hi\\\"\"", S("say \"hi\"")},
      {"a='back\\\\'", S("back\\")},
      {"a='c:\\temp'", S("c:\\temp")},
      {"a='[1,2]'", S("[1,2]")},
      {"a=${b.c}", S("${b.c}")},
      {"a=x_${b}_${c}", S("x_${b}_${c}")},
      {"a=${oc.env:HOME,/tmp}", S("${oc.env:HOME,/tmp}")},
      {"a=${multiply:${.x}, 2}", S("${multiply:${.x}, 2}")},
      {"a='${b}'", S("${b}")},
      {"a='\\${b}'", S("\\${b}")},
      {"a=[]", L({})},
      {"a=[1,2,3]", L({I(1), I(2), I(3)})},
      {"a=[1, 'a b', [x, null], {k: v}]",
       L({I(1), S("a b"), L({S("x"), Null()}), M({{"k", S("v")}})})},
      {"a={}", M({})},
      {"a={x:1,y:[true,2.5]}", M({{"x", I(1)}, {"y", L({B(true), F(2.5)})}})},
      {"a={x: {y: z:w}}", M({{"x", M({{"y", S("z:w")}})}})},
      {"a=%Y-%m-%d_%H-%M-%S", S("%Y-%m-%d_%H-%M-%S")},
      {"a=b:c", S("b:c")},
  };
  for (const auto& item : cases) {
    CAPTURE(item.text);
    const Override parsed = launcher::parse_override(item.text);
    CHECK(parsed.kind == Override::Kind::Assign);
    CHECK(parsed.key == "a");
    REQUIRE(parsed.value.has_value());
    CHECK(parsed.value->kind() == item.expected.kind());
    CHECK(*parsed.value == item.expected);
    CHECK(parsed.text == item.text);
  }
  const Override infinite = launcher::parse_override("a=-inf");
  CHECK(infinite.value->as_double() == -std::numeric_limits<double>::infinity());
  CHECK(std::isnan(launcher::parse_override("a=NaN").value->as_double()));
  CHECK(launcher::parse_override("a='quoted'").value->is_quoted());
}

TEST_CASE("override keys and prefixes") {
  Override parsed = launcher::parse_override("training.trainer.max_steps=5");
  CHECK(parsed.kind == Override::Kind::Assign);
  CHECK(parsed.key == "training.trainer.max_steps");
  CHECK_FALSE(parsed.package);

  parsed = launcher::parse_override("+a.b=v");
  CHECK(parsed.kind == Override::Kind::Add);
  CHECK(parsed.key == "a.b");

  parsed = launcher::parse_override("++a.b=v");
  CHECK(parsed.kind == Override::Kind::ForceAdd);

  parsed = launcher::parse_override("~a.b");
  CHECK(parsed.kind == Override::Kind::Delete);
  CHECK_FALSE(parsed.value);

  parsed = launcher::parse_override("~a.b=3");
  CHECK(parsed.kind == Override::Kind::Delete);
  CHECK(*parsed.value == I(3));

  parsed = launcher::parse_override("~a.b=");
  CHECK_FALSE(parsed.value);

  parsed = launcher::parse_override("hydra/launcher=basic");
  CHECK(parsed.key == "hydra/launcher");
  CHECK(parsed.key_is_group_path());

  parsed = launcher::parse_override("db@backup=mysql");
  CHECK(parsed.key == "db");
  CHECK(parsed.package == "backup");

  parsed = launcher::parse_override("list.0=x");
  CHECK(parsed.key == "list.0");

  parsed = launcher::parse_override("env.NCCL_IB-HCA$x=mlx5");
  CHECK(parsed.key == "env.NCCL_IB-HCA$x");
}

TEST_CASE("bad override syntax is reported with the text and a caret") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a", "missing '='"},
      {"=1", "expected a key"},
      {"a..b=1", "empty name in the key"},
      {"a b=1", "unexpected character ' ' in the key"},
      {"a=b=c", "'=' in a value must be quoted"},
      {"a=1,2", "sweep"},
      {"a=choice(1,2)", "function calls"},
      {"a=9223372036854775808", "integer '9223372036854775808' does not fit in 64 bits"},
      {"a=-9223372036854775809", "integer '-9223372036854775809' does not fit in 64 bits"},
      {"a=[1,2", "missing ']'"},
      {"a=[1,,2]", "expected a value"},
      {"a={x 1}", "expected ':' after the dictionary key"},
      {"a='open", "unterminated quoted string"},
      {"a=[1]x", "unexpected 'x'"},
      {"a=x'y'", "a quoted string must be a whole value"},
      {"a=${b", "unterminated interpolation"},
      {"a=${}", "expected a key name"},
      {"a=#x", "character '#' is not allowed"},
      {"a=~/x", "character '~' is not allowed"},
      {"+a", "missing '='"},
      {"++", "expected a key"},
      {"+", "expected a key"},
      {"~", "expected a key"},
      {"=", "expected a key"},
      {"++=1", "expected a key"},
  };
  for (const auto& [text, message] : cases) {
    const auto& override_text = text;  // clang 14 cannot capture a structured binding (CAPTURE)
    CAPTURE(override_text);
    CHECK_THROWS_WITH_AS(launcher::parse_override(text), doctest::Contains(message.c_str()),
                         common::Error);
    CHECK_THROWS_WITH_AS(launcher::parse_override(text),
                         doctest::Contains(("bad override '" + text + "'").c_str()), common::Error);
  }
  CHECK_THROWS_WITH_AS(
      launcher::parse_override("a=b=c"),
      "bad override 'a=b=c': '=' in a value must be quoted ('a=b') or escaped (a\\=b) "
      "at column 4\n  a=b=c\n     ^",
      common::Error);
}

TEST_CASE("invalid UTF-8 in an override is refused, naming the column and the byte") {
  CHECK_THROWS_WITH_AS(launcher::parse_override("+x=caf\xe9"),
                       "bad override '+x=caf\\xe9': invalid UTF-8 at column 7 (byte 0xe9); "
                       "overrides must be UTF-8 text",
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_override("a='\xff\xfe'"),
                       doctest::Contains("invalid UTF-8 at column 4 (byte 0xff)"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_override("a=[x,\xc3]"),
                       doctest::Contains("invalid UTF-8 at column 6 (byte 0xc3)"), common::Error);
  CHECK(launcher::parse_override("a=caf\xc3\xa9").value->as_string() == "caf\xc3\xa9");
}

TEST_CASE("applying config overrides: assign, add, force-add, delete") {
  const Node base = launcher::parse_yaml(
      "trainer:\n  max_steps: 100\n  devices: 8\nmodel:\n  optim: {lr: 0.1, betas: [0.9, 0.95]}\n"
      "empty: null\nlist: [a, b, c]\n",
      "t.yaml");
  auto apply = [&base](std::initializer_list<const char*> overrides) {
    Node config = base;
    for (const char* text : overrides)
      launcher::apply_override(config, launcher::parse_override(text));
    return config;
  };

  Node config = apply({"trainer.max_steps=5"});
  CHECK(config.at("trainer").at("max_steps").as_int() == 5);
  CHECK(config.at("trainer").at("max_steps").location().file.empty());

  config = apply({"model.optim={lr: 0.5}"});
  CHECK(config.at("model").at("optim").at("lr").as_double() == 0.5);
  CHECK(config.at("model").at("optim").at("betas").size() == 2);

  config = apply({"list.1=B", "model.optim.betas=[1, 2, 3]"});
  CHECK(config.at("list").at(std::size_t{1}).as_string() == "B");
  CHECK(config.at("model").at("optim").at("betas").size() == 3);

  config = apply({"+trainer.new_key=1", "+fresh.deep.key=x", "+empty=3"});
  CHECK(config.at("trainer").at("new_key").as_int() == 1);
  CHECK(config.at("fresh").at("deep").at("key").as_string() == "x");
  CHECK(config.at("empty").as_int() == 3);

  config = apply({"++trainer.max_steps=7", "++other=1", "+model.optim={eps: 1e-8}"});
  CHECK(config.at("trainer").at("max_steps").as_int() == 7);
  CHECK(config.at("other").as_int() == 1);
  CHECK(config.at("model").at("optim").at("eps").as_double() == 1e-8);
  CHECK(config.at("model").at("optim").at("lr").as_double() == 0.1);

  config = apply({"~trainer.devices", "~list.0", "~model.optim.lr=0.1"});
  CHECK_FALSE(config.at("trainer").contains("devices"));
  CHECK(config.at("list").size() == 2);
  CHECK_FALSE(config.at("model").at("optim").contains("lr"));
}

TEST_CASE("config override errors name the key, the parent, suggestions and the fix") {
  Node config =
      launcher::parse_yaml("trainer:\n  max_steps: 100\n  devices: 8\nname: x\n", "t.yaml");
  auto apply = [&config](const char* text) {
    launcher::apply_override(config, launcher::parse_override(text));
  };
  CHECK_THROWS_WITH_AS(
      apply("trainer.max_step=5"),
      "Could not override 'trainer.max_step': key 'max_step' does not exist in "
      "'trainer'. Did you mean 'max_steps'? Valid keys: max_steps, devices. To add it "
      "use +trainer.max_step=5",
      common::Error);
  CHECK_THROWS_WITH_AS(
      apply("trainr.max_steps=5"),
      doctest::Contains("key 'trainr' does not exist in the config root. Did you mean "
                        "'trainer'?"),
      common::Error);
  CHECK_THROWS_WITH_AS(apply("trainer={max_stepz: 1}"),
                       doctest::Contains("Did you mean 'max_steps'?"), common::Error);
  CHECK_THROWS_WITH_AS(
      apply("+trainer.max_steps=5"),
      doctest::Contains("an item is already at 'trainer.max_steps'. Either remove the + "
                        "prefix: 'trainer.max_steps=5', or add a second +"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      apply("~trainer.nothing"),
      doctest::Contains("Could not delete 'trainer.nothing': key 'nothing' does not exist"),
      common::Error);
  CHECK_THROWS_WITH_AS(apply("~trainer.devices=4"),
                       "Could not delete 'trainer.devices': its value is 8, not 4", common::Error);
  CHECK_THROWS_WITH_AS(apply("+name.sub=1"), doctest::Contains("'name' has type string, not map"),
                       common::Error);
}
