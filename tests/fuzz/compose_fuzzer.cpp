// libFuzzer target: a config group file of arbitrary text in a small conf tree. The input is
// written as conf/group/fuzz.yaml, which the primary config chooses; compose() reads it
// (yaml_io, its defaults list, its # @package header), merges it, applies two command-line
// overrides, then the result is resolved and both the composed and the resolved trees are
// written with to_yaml and read back with parse_yaml, which must give the same tree. Each
// step must end in success or a common::Error; any other exception, a crash, a sanitizer
// report or a round trip that changes the tree is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "backend/common/error.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/node.hpp"
#include "launcher/config/yaml_io.hpp"

namespace fs = std::filesystem;

namespace {

void write(const fs::path& file, std::string_view text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
}

// conf/config.yaml chooses group: fuzz; other files give the fuzzed defaults list something
// to refer to (group options, nested groups, a plain config).
fs::path make_conf_tree() {
  std::string pattern = (fs::temp_directory_path() / "compose_fuzzer_XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) std::abort();
  const fs::path conf = fs::path(pattern) / "conf";
  write(conf / "config.yaml",
        "defaults:\n  - _self_\n  - group: fuzz\n  - optional other: a\n"
        "hydra:\n  run:\n    dir: .\n"
        "name: ${group.name}\nbase: /results\nkeep: 1\nlauncher_scripts_path: /scripts\n");
  write(conf / "group/a.yaml", "name: a\nvalue: 1\nnested: {x: ${..value}}\n");
  write(conf / "group/b.yaml", "# @package _global_\nb_was_here: true\n");
  write(conf / "group/sub/c.yaml", "c: [1, 2, 3]\n");
  write(conf / "other/a.yaml", "defaults:\n  - _self_\nother: ${name}\n");
  write(conf / "other/b.yaml", "x: 2\n");
  write(conf / "plain.yaml", "plain: yes\n");
  return conf;
}

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "FINDING: %s\n", what.c_str());
  std::abort();
}

void check_round_trip(const launcher::Node& tree) {
  std::string text;
  try {
    text = launcher::to_yaml(tree);
  } catch (const common::Error&) {
    return;  // a tree YAML cannot hold (nested too deep) is refused with a message: fine
  }
  launcher::Node read_back;
  try {
    read_back = launcher::parse_yaml(text, "round_trip.yaml");
  } catch (const common::Error& error) {
    finding("to_yaml wrote YAML that parse_yaml rejects: " + std::string(error.what()) +
            "\n--- yaml ---\n" + text);
  }
  if (!(read_back == tree)) finding("to_yaml/parse_yaml round trip changed the tree:\n" + text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const fs::path conf = make_conf_tree();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  write(conf / "group/fuzz.yaml", text);

  // parse_yaml alone, as every config file is read.
  try {
    check_round_trip(launcher::parse_yaml(text, "fuzz.yaml"));
  } catch (const common::Error&) {
  }
  for (const auto& overrides :
       {std::vector<std::string>{}, std::vector<std::string>{"++keep=2", "~name"}}) {
    try {
      const launcher::ComposedConfig composed = launcher::compose({conf, "config", overrides});
      check_round_trip(composed.config);
      const launcher::Node resolved =
          launcher::resolve(composed.config, launcher::ResolveContext{composed.choices});
      check_round_trip(resolved);
    } catch (const common::Error&) {
    }
  }
  return 0;
}
