// OmegaConf 2.2 interpolation: absolute, relative, string and typed interpolation, the
// resolvers, and the errors (???, missing keys, cycles, unknown resolvers).
#include "launcher/config/interpolate.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <ctime>
#include <limits>

#include "backend/common/error.hpp"
#include "launcher/config/yaml_io.hpp"

using launcher::Node;

namespace {

Node resolve_yaml(const char* text, launcher::ResolveContext context = {}) {
  return launcher::resolve(launcher::parse_yaml(text, "conf/t.yaml"), context);
}

}  // namespace

TEST_CASE("absolute, relative and list interpolations") {
  const Node resolved = resolve_yaml(
      "model:\n"
      "  hidden_size: 768\n"
      "  seq: 2048\n"
      "  max_position: ${.seq}\n"
      "  tokenizer:\n"
      "    dim: ${..hidden_size}\n"
      "    root_name: ${...name}\n"
      "    abs: ${model.hidden_size}\n"
      "name: gpt\n"
      "items: [10, {x: 20}]\n"
      "first: ${items.0}\n"
      "second: ${items[1].x}\n"
      "in_list:\n  - ${name}\n  - ${first}\n");
  const Node& model = resolved.at("model");
  CHECK(model.at("max_position").as_int() == 2048);
  CHECK(model.at("tokenizer").at("dim").as_int() == 768);
  CHECK(model.at("tokenizer").at("root_name").as_string() == "gpt");
  CHECK(model.at("tokenizer").at("abs").as_int() == 768);
  CHECK(resolved.at("first").as_int() == 10);
  CHECK(resolved.at("second").as_int() == 20);
  CHECK(resolved.at("in_list").at(std::size_t{0}).as_string() == "gpt");
}

TEST_CASE("whole-value interpolation keeps the type — string interpolation formats like Python") {
  const Node resolved = resolve_yaml(
      "i: 5\nf: 1e-5\nb: true\nn: null\ns: text\nm:\n  k: ${i}\n  r: ${.k}\nl: [1, a]\n"
      "ti: ${i}\ntf: ${f}\ntb: ${b}\ntn: ${n}\ntm: ${m}\ntl: ${l}\n"
      "str: \"${s}_${i}_${f}_${b}_${n}\"\nlist_str: 'x${l}'\nmap_str: 'x${m}'\n"
      "spaced: \" ${i}\"\n");
  CHECK(resolved.at("ti").as_int() == 5);
  CHECK(resolved.at("tf").as_double() == 1e-5);
  CHECK(resolved.at("tb").as_bool());
  CHECK(resolved.at("tn").is_null());
  CHECK(resolved.at("tm") == launcher::parse_yaml("{k: 5, r: 5}", "e"));
  CHECK(resolved.at("tl") == launcher::parse_yaml("[1, a]", "e"));
  CHECK(resolved.at("str").as_string() == "text_5_1e-05_True_None");
  CHECK(resolved.at("list_str").as_string() == "x[1, 'a']");
  CHECK(resolved.at("map_str").as_string() == "x{'k': 5, 'r': 5}");
  CHECK(resolved.at("spaced").as_string() == " 5");
}

TEST_CASE("a copied map is resolved where it lives") {
  const Node resolved = resolve_yaml(
      "base:\n  size: 1\n  double: ${multiply:${.size}, 2}\ncopy: ${base}\nnested:\n  size: 7\n"
      "  inner: ${base}\n");
  CHECK(resolved.at("copy").at("double").as_int() == 2);
  CHECK(resolved.at("nested").at("inner").at("double").as_int() == 2);
}

TEST_CASE("interpolation chains, through interpolated maps, and nested keys") {
  const Node resolved = resolve_yaml(
      "a: ${b}\nb: ${c}\nc: 3\nalias: ${target}\ntarget: {deep: {v: 9}}\nthrough: ${alias.deep.v}\n"
      "which: deep\nkeyed: ${target.${which}.v}\n");
  CHECK(resolved.at("a").as_int() == 3);
  CHECK(resolved.at("through").as_int() == 9);
  CHECK(resolved.at("keyed").as_int() == 9);
}

TEST_CASE("escaped interpolations stay literal") {
  const Node resolved = resolve_yaml(
      "a: 1\nliteral: \\${a}\nmixed: \\${a} is ${a}\nbackslash: \\\\${a}\nno_interp: c:\\\\path\n"
      "copy_of_literal: ${literal}\n");
  CHECK(resolved.at("literal").as_string() == "${a}");
  CHECK(resolved.at("mixed").as_string() == "${a} is 1");
  CHECK(resolved.at("backslash").as_string() == "\\1");
  CHECK(resolved.at("no_interp").as_string() == "c:\\\\path");
  CHECK(resolved.at("copy_of_literal").as_string() == "${a}");
}

TEST_CASE("resolvers: multiply, divide_ceil, divide_floor with nested arguments") {
  const Node resolved = resolve_yaml(
      "h: 768\nheads: 12\nf: 0.5\n"
      "ffn: ${multiply:4, ${h}}\n"
      "scaled: ${multiply:${f},${h}}\n"
      "per_head: ${divide_floor:${h},${heads}}\n"
      "ceil: ${divide_ceil:7, 2}\n"
      "floor: ${divide_floor:7, 2}\n"
      "neg_ceil: ${divide_ceil:-7, 2}\n"
      "float_ceil: ${divide_ceil:7.5, 2}\n"
      "nested: ${multiply:${divide_ceil:${h}, 100}, 2}\n"
      "in_text: \"n${multiply:2,3}\"\n");
  CHECK(resolved.at("ffn").as_int() == 3072);
  CHECK(resolved.at("scaled").as_double() == 384.0);
  CHECK(resolved.at("scaled").is_float());
  CHECK(resolved.at("per_head").as_int() == 64);
  CHECK(resolved.at("ceil").as_int() == 4);
  CHECK(resolved.at("floor").as_int() == 3);
  CHECK(resolved.at("neg_ceil").as_int() == -3);
  CHECK(resolved.at("float_ceil").as_int() == 4);
  CHECK(resolved.at("nested").as_int() == 16);
  CHECK(resolved.at("in_text").as_string() == "n6");
}

TEST_CASE("integer resolvers refuse results beyond 64 bits and division by zero, never trap") {
  // -2^63 / -1 is 2^63, one past the largest int64: x86 traps on it (SIGFPE) rather than wrap.
  for (const char* resolver : {"divide_floor", "divide_ceil"}) {
    CAPTURE(resolver);
    const std::string text = fmt::format(
        "x: ${{multiply:-4611686018427387904,2}}\ny: ${{{}:${{x}},-1}}\n", resolver);
    CHECK_THROWS_WITH_AS(resolve_yaml(text.c_str()),
                         doctest::Contains("does not fit in a 64-bit integer"), common::Error);
    const std::string by_zero = fmt::format("y: ${{{}:5,0}}\n", resolver);
    CHECK_THROWS_WITH_AS(resolve_yaml(by_zero.c_str()), doctest::Contains("division by zero"),
                         common::Error);
    const std::string by_float_zero = fmt::format("y: ${{{}:5,-0.0}}\n", resolver);
    CHECK_THROWS_WITH_AS(resolve_yaml(by_float_zero.c_str()),
                         doctest::Contains("division by zero"), common::Error);
    const std::string huge = fmt::format("y: ${{{}:1e300,1e-300}}\n", resolver);
    CHECK_THROWS_WITH_AS(resolve_yaml(huge.c_str()), doctest::Contains("not a valid integer"),
                         common::Error);
    const std::string not_a_number = fmt::format("y: ${{{}:nan,2}}\n", resolver);
    CHECK_THROWS_WITH_AS(resolve_yaml(not_a_number.c_str()),
                         doctest::Contains("not a valid integer"), common::Error);
  }
  // The extremes that do fit still divide exactly.
  const Node resolved = resolve_yaml(
      "min: ${multiply:-4611686018427387904,2}\n"
      "floor: ${divide_floor:${min},1}\nceil: ${divide_ceil:${min},2}\n"
      "max_floor: ${divide_floor:9223372036854775807,-1}\n"
      "neg_floor: ${divide_floor:${min},3}\nneg_ceil: ${divide_ceil:${min},3}\n");
  CHECK(resolved.at("floor").as_int() == std::numeric_limits<std::int64_t>::min());
  CHECK(resolved.at("ceil").as_int() == std::numeric_limits<std::int64_t>::min() / 2);
  CHECK(resolved.at("max_floor").as_int() == -std::numeric_limits<std::int64_t>::max());
  CHECK(resolved.at("neg_floor").as_int() == -3074457345618258603);
  CHECK(resolved.at("neg_ceil").as_int() == -3074457345618258602);
  CHECK_THROWS_WITH_AS(resolve_yaml("a: ${multiply:9223372036854775807,2}\n"),
                       doctest::Contains("does not fit in a 64-bit integer"), common::Error);
}

TEST_CASE("oc.env with and without default, hydra choices, now") {
  setenv("LAUNCHER_TEST_VARIABLE", "from_env", 1);
  unsetenv("LAUNCHER_TEST_UNSET");
  launcher::ResolveContext context;
  context.choices["training"] = "gpt3/126m";
  context.choices["hydra/job_logging"] = "stdout";
  const Node resolved = resolve_yaml(
      "set: ${oc.env:LAUNCHER_TEST_VARIABLE}\n"
      "with_default: ${oc.env:LAUNCHER_TEST_UNSET,fallback}\n"
      "number_default: ${oc.env:LAUNCHER_TEST_UNSET, 5}\n"
      "null_default: ${oc.env:LAUNCHER_TEST_UNSET,null}\n"
      "quoted_default: ${oc.env:LAUNCHER_TEST_UNSET,'a, b'}\n"
      "choice: ${hydra:runtime.choices.training}\n"
      "hydra_group: ${hydra:runtime.choices.hydra/job_logging}\n"
      "stamp: ${now:%Y}\n"
      "stamp_again: ${now:%Y}\n",
      context);
  CHECK(resolved.at("set").as_string() == "from_env");
  CHECK(resolved.at("with_default").as_string() == "fallback");
  CHECK(resolved.at("number_default").as_string() == "5");
  CHECK(resolved.at("null_default").is_null());
  CHECK(resolved.at("quoted_default").as_string() == "a, b");
  CHECK(resolved.at("choice").as_string() == "gpt3/126m");
  CHECK(resolved.at("hydra_group").as_string() == "stdout");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  CHECK(resolved.at("stamp").as_string() == std::to_string(1900 + local.tm_year));
  CHECK(resolved.at("stamp_again").as_string() == resolved.at("stamp").as_string());
  CHECK_THROWS_WITH_AS(resolve_yaml("x: ${oc.env:LAUNCHER_TEST_UNSET}\n"),
                       doctest::Contains("environment variable 'LAUNCHER_TEST_UNSET' is not set"),
                       common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("x: ${hydra:runtime.choices.cluster}\n", context),
                       doctest::Contains("config group 'cluster' is not in the defaults list"),
                       common::Error);
}

TEST_CASE("interpolation errors name the referring key, its location and what is wrong") {
  CHECK_THROWS_WITH_AS(
      resolve_yaml("a: ???\n"),
      "'a' (conf/t.yaml:1:4) is mandatory (\?\?\?) and has no value; set it, e.g. on "
      "the command line: a=<value>",
      common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("a: ???\nb: ${a}\n", {}),
                       doctest::Contains("'a' (conf/t.yaml:1:4)"), common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("b: x${a}\na: ???\n"),
                       doctest::Contains("'b' (conf/t.yaml:1:4): interpolation ${a} refers to 'a' "
                                         "(conf/t.yaml:2:4), which is mandatory"),
                       common::Error);
  CHECK_THROWS_WITH_AS(
      resolve_yaml("model:\n  hidden: 1\n  ffn: ${model.hiden}\n"),
      "'model.ffn' (conf/t.yaml:3:8): interpolation ${model.hiden} refers to "
      "'model.hiden', which does not exist: key 'hiden' does not exist in 'model'. "
      "Did you mean 'hidden'? Valid keys: hidden, ffn.",
      common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("a: ${b}\nb: ${a}\n"),
                       doctest::Contains("interpolation cycle: a -> b -> a"), common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("x:\n  y: ${x}\n"),
                       doctest::Contains("interpolation cycle: x.y -> x -> x.y"), common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("a: ${a}\n"), doctest::Contains("interpolation cycle: a -> a"),
                       common::Error);
  CHECK_THROWS_WITH_AS(
      resolve_yaml("a: ${add:1,2}\n"),
      doctest::Contains("unknown resolver 'add' (known resolvers: divide_ceil, divide_floor, "
                        "hydra, multiply, now, oc.env)"),
      common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("a: ${multiply:1}\n"),
                       doctest::Contains("multiply takes 2 arguments, got 1"), common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("a: ${multiply:x,2}\n"),
                       doctest::Contains("multiply needs numbers, got the string x"),
                       common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("a: ${divide_ceil:1,0}\n"),
                       doctest::Contains("division by zero"), common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("a: ${b\n"),
                       doctest::Contains("bad interpolation in 'a' (conf/t.yaml:1:4): unterminated "
                                         "interpolation"),
                       common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("a: 1\nb: ${..a}\n"), doctest::Contains("goes above the root"),
                       common::Error);
  CHECK_THROWS_WITH_AS(resolve_yaml("k: 1\na: ${b.${k}}\nb: {x: 1}\n"),
                       doctest::Contains("must give a string"), common::Error);
}

TEST_CASE("resolve leaves the input untouched and resolves everything") {
  const Node config = launcher::parse_yaml("a: 1\nb: ${a}\n", "t.yaml");
  const Node resolved = launcher::resolve(config, {});
  CHECK(config.at("b").as_string() == "${a}");
  CHECK(resolved.at("b").as_int() == 1);
  CHECK(resolved.at("b").location().describe() == "t.yaml:2:4");
}
