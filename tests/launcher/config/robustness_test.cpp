// Bad input of any shape must end in a common::Error, never in a crash or another exception
// type: generated strings made of the grammar's special characters go through the YAML
// reader, the override parser and the interpolation resolver.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <string_view>

#include "backend/common/error.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/overrides.hpp"
#include "launcher/config/yaml_io.hpp"

using launcher::Node;

namespace {

std::string random_text(std::mt19937& generator, std::string_view alphabet,
                        std::size_t max_length) {
  std::uniform_int_distribution<std::size_t> length(0, max_length);
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
  std::string text;
  for (std::size_t i = length(generator); i > 0; --i) text += alphabet[pick(generator)];
  return text;
}

// Runs `action`; a common::Error is fine, anything else fails the test with the input.
template <typename Action>
void expect_only_common_errors(const std::string& input, Action action) {
  try {
    action();
  } catch (const common::Error&) {
  } catch (const std::exception& error) {
    FAIL("input " << input << " threw a non-common::Error: " << error.what());
  }
}

}  // namespace

TEST_CASE("generated overrides and interpolations only ever fail with common::Error") {
  std::mt19937 generator(20240611);
  const std::string_view override_alphabet = "ab1.=+~@/${}[](),:'\"\\ #-_e";
  const std::string_view value_alphabet = "ab01.${}[]:,'\"\\ -_.";
  int accepted = 0;
  for (int i = 0; i < 4000; ++i) {
    // Mostly well-formed keys, so that the values get exercised too.
    static constexpr const char* kPrefixes[] = {"", "", "+", "++", "~"};
    const std::string text = kPrefixes[static_cast<std::size_t>(i) % 5] +
                             random_text(generator, i % 7 == 0 ? override_alphabet : "ab1._", 5) +
                             "=" + random_text(generator, override_alphabet, 10);
    expect_only_common_errors(text, [&text, &accepted] {
      (void)launcher::parse_override(text);
      ++accepted;
    });
    const std::string value = "${" + random_text(generator, value_alphabet, 12);
    expect_only_common_errors(value, [&value] {
      Node config = Node::map();
      config.set("a", Node::integer(1));
      config.set("b", Node::string("x"));
      config.set("list", launcher::parse_yaml("[1, 2]", "t"));
      config.set("v", Node::string(value));
      (void)launcher::resolve(config, {});
    });
  }
  CHECK(accepted > 200);  // the generator does reach valid overrides too
}

TEST_CASE("generated YAML only ever fails with common::Error, and what parses round-trips") {
  std::mt19937 generator(7);
  const std::string_view alphabet = "ab1:- \n[]{},'\"&*!|>#?~.%@`\t\\<";
  int parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string text = random_text(generator, alphabet, 24);
    Node node;
    try {
      node = launcher::parse_yaml(text, "fuzz.yaml");
    } catch (const common::Error&) {
      continue;
    } catch (const std::exception& error) {
      FAIL("YAML " << text << " threw a non-common::Error: " << error.what());
    }
    ++parsed;
    const std::string written = launcher::to_yaml(node);
    CAPTURE(text);
    CAPTURE(written);
    Node reparsed;
    REQUIRE_NOTHROW(reparsed = launcher::parse_yaml(written, "written.yaml"));
    CHECK(reparsed == node);
  }
  CHECK(parsed > 100);
}

TEST_CASE("input nested 100000 deep is refused at the documented limits, not by the stack") {
  constexpr std::size_t kDepth = 100'000;
  const std::string lists = std::string(kDepth, '[') + std::string(kDepth, ']');
  CHECK_THROWS_WITH_AS(launcher::parse_yaml("x: " + lists + "\n", "deep.yaml"),
                       doctest::Contains("more than 400 levels of nested lists and mappings"),
                       common::Error);
  std::string block;  // block style: each level one more indentation
  for (std::size_t level = 0; level < 1000; ++level) block += std::string(level, ' ') + "a:\n";
  CHECK_THROWS_WITH_AS(launcher::parse_yaml(block, "deep.yaml"),
                       doctest::Contains("more than 400 levels"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_override("x=" + lists),
                       doctest::Contains("more than 100 levels of nested"), common::Error);
  // Built front and back in linear time: wrapping the string level by level copies it each
  // time, 5e9 bytes in all, which ran past CTest's timeout under the sanitizers.
  auto nested = [&](std::string_view open, std::string_view inner, std::string_view close) {
    std::string text;
    text.reserve(kDepth * (open.size() + close.size()) + inner.size());
    for (std::size_t level = 0; level < kDepth; ++level) text += open;
    text += inner;
    for (std::size_t level = 0; level < kDepth; ++level) text += close;
    return text;
  };
  const std::string interpolation = nested("${", "x", "}");
  Node config = Node::map();
  config.set("v", Node::string(interpolation));
  CHECK_THROWS_WITH_AS(launcher::resolve(config, {}), doctest::Contains("more than 100 levels"),
                       common::Error);
  config.set("v", Node::string(nested("${multiply:", "1", ",1}")));
  CHECK_THROWS_WITH_AS(launcher::resolve(config, {}), doctest::Contains("more than 100 levels"),
                       common::Error);
}
