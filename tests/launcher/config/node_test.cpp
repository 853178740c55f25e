// The Node tree: typed accessors and their errors, dotted paths with suggestions, merging,
// and Python-style formatting.
#include "launcher/config/node.hpp"

#include <doctest/doctest.h>

#include <limits>

#include "backend/common/error.hpp"
#include "launcher/config/merge.hpp"
#include "launcher/config/yaml_io.hpp"

using launcher::Node;

TEST_CASE("typed accessors name the path or the location and the actual kind") {
  const Node tree = launcher::parse_yaml("a: 1\nb: text\nc: 2.5\n", "conf/t.yaml");
  CHECK(tree.at("a").as_int() == 1);
  CHECK(tree.at("a").as_double() == 1.0);
  CHECK(tree.at("c").as_double() == 2.5);
  CHECK_THROWS_WITH_AS(tree.at("b").as_int("model.b"),
                       "'model.b' (conf/t.yaml:2:4) has type string, expected type int",
                       common::Error);
  CHECK_THROWS_WITH_AS(tree.at("c").as_bool(),
                       "value at conf/t.yaml:3:4 has type float, expected type bool",
                       common::Error);
  CHECK_THROWS_WITH_AS(tree.at("x"), doctest::Contains("key 'x' does not exist"), common::Error);
  CHECK_THROWS_AS(tree.at("a").at(std::size_t{0}), common::Error);
}

TEST_CASE("map editing keeps insertion order") {
  Node map = Node::map();
  map.set("b", Node::integer(1));
  map.set("a", Node::integer(2));
  map.set("b", Node::integer(3));
  CHECK(map.keys() == std::vector<std::string>{"b", "a"});
  CHECK(map.at("b").as_int() == 3);
  CHECK(map.erase("b"));
  CHECK_FALSE(map.erase("b"));
  CHECK(map.keys() == std::vector<std::string>{"a"});
  Node list = Node::list();
  list.push_back(Node::string("x"));
  CHECK(list.size() == 1);
  CHECK_THROWS_WITH_AS(list.at(std::size_t{3}), doctest::Contains("out of range"), common::Error);
}

TEST_CASE("dotted paths: find and at_path with did-you-mean") {
  const Node tree = launcher::parse_yaml(
      "trainer:\n  max_steps: 5\n  devices: 8\nmodel:\n  layers: [{h: 1}, {h: 2}]\n", "t.yaml");
  CHECK(launcher::find(tree, "trainer.max_steps")->as_int() == 5);
  CHECK(launcher::find(tree, "model.layers.1.h")->as_int() == 2);
  CHECK(launcher::find(tree, "model.layers[0].h")->as_int() == 1);
  CHECK(launcher::find(tree, "model.layers.2.h") == nullptr);
  CHECK(launcher::find(tree, "trainer.max_step") == nullptr);
  CHECK(launcher::find(tree, "")->is_map());
  CHECK(launcher::at_path(tree, "trainer.devices").as_int() == 8);
  CHECK_THROWS_WITH_AS(launcher::at_path(tree, "trainer.max_step"),
                       "'trainer.max_step' not found: key 'max_step' does not exist in 'trainer'. "
                       "Did you mean 'max_steps'? Valid keys: max_steps, devices.",
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::at_path(tree, "trainer.max_steps.x"),
                       doctest::Contains("'trainer.max_steps' has type int, so it has no key 'x'"),
                       common::Error);
  CHECK_THROWS_WITH_AS(
      launcher::at_path(tree, "model.layers.5"),
      doctest::Contains("not a valid index into the list 'model.layers' (2 items)"), common::Error);
  CHECK(launcher::split_path("a.b[3].c") == std::vector<std::string>{"a", "b", "3", "c"});
}

TEST_CASE("merge follows OmegaConf: maps merge, the rest replaces, ??? does not overwrite") {
  Node base = launcher::parse_yaml(
      "a: {x: 1, y: {p: 1}}\nlist: [1, 2, 3]\nscalar: 1\nmapped: {k: 1}\nkeep: 5\nfresh: ???\n",
      "base");
  const Node update = launcher::parse_yaml(
      "a: {y: {q: 2}, z: 3}\nlist: [9]\nscalar: {now: map}\nmapped: plain\nkeep: ???\nfresh: "
      "1\nnew: n\n",
      "update");
  launcher::merge_into(base, update);
  const Node expected = launcher::parse_yaml(
      "a: {x: 1, y: {p: 1, q: 2}, z: 3}\nlist: [9]\nscalar: {now: map}\nmapped: plain\nkeep: 5\n"
      "fresh: 1\nnew: n\n",
      "expected");
  CHECK(base == expected);
  CHECK(base.keys() == expected.keys());
}

TEST_CASE("Python formatting of values for string interpolation") {
  CHECK(launcher::format_float(1e-5) == "1e-05");
  CHECK(launcher::format_float(6e-4) == "0.0006");
  CHECK(launcher::format_float(100.0) == "100.0");
  CHECK(launcher::format_float(0.1) == "0.1");
  CHECK(launcher::format_float(1e16) == "1e+16");
  CHECK(launcher::format_float(123456789012345.6) == "123456789012345.6");
  CHECK(launcher::format_float(-0.0) == "-0.0");
  CHECK(launcher::format_float(std::numeric_limits<double>::infinity()) == "inf");
  const Node tree = launcher::parse_yaml("v: [1, 'a', true, null, 2.5, {k: it's}]\n", "t");
  CHECK(launcher::python_str(tree.at("v")) == "[1, 'a', True, None, 2.5, {'k': \"it's\"}]");
}
