// libFuzzer target: Hydra command-line overrides end to end. The input is a list of
// overrides, one per line; they go through expand_sweeps (multirun's sweep syntax), then
// every override of the first jobs through parse_override and apply_override onto a small
// config, which is then resolved and written to YAML and read back. Each step must end in
// success or a common::Error (Hydra's and OmegaConf's errors); any other exception, a crash,
// a sanitizer report or a YAML round trip that changes the tree is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/node.hpp"
#include "launcher/config/overrides.hpp"
#include "launcher/config/sweep.hpp"
#include "launcher/config/yaml_io.hpp"

namespace {

const launcher::Node& base_config() {
  static const launcher::Node config = launcher::parse_yaml(
      "run:\n  name: gpt3_${.size}\n  size: 126m\n  results_dir: ${base}/${.name}\n"
      "base: /results\n"
      "trainer: {max_steps: 100, devices: 8, precision: bf16, flag: true, none: null}\n"
      "model:\n  optim: {lr: 6.0e-4, betas: [0.9, 0.95]}\n  layers: 12\n"
      "  hidden: ${multiply:${.layers},64}\n  heads: ${divide_ceil:${.hidden},64}\n"
      "list: [a, '${run.name}', [1, 2], {k: v}]\n"
      "env: {HOME: '${oc.env:HOME,/root}'}\n"
      "choice: ${hydra:runtime.choices.training}\n"
      "escaped: \\${not}\n",
      "fuzz_base.yaml");
  return config;
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

void apply_and_resolve(const std::vector<std::string>& overrides) {
  launcher::Node config = base_config();
  for (const auto& text : overrides) {
    try {
      const launcher::Override parsed = launcher::parse_override(text);
      if (!parsed.key_is_group_path() && !parsed.package) launcher::apply_override(config, parsed);
    } catch (const common::Error&) {
    }
  }
  check_round_trip(config);
  try {
    const launcher::Node resolved =
        launcher::resolve(config, launcher::ResolveContext{{{"training", "gpt3/126m"}}});
    check_round_trip(resolved);
  } catch (const common::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start <= input.size() && lines.size() < 16) {
    std::size_t end = input.find('\n', start);
    if (end == std::string_view::npos) end = input.size();
    if (end > start) lines.emplace_back(input.substr(start, end - start));
    start = end + 1;
  }
  // The overrides as a single run sees them: sweeps are refused by parse_override.
  apply_and_resolve(lines);
  // And as a multirun sees them: each job's overrides are plain.
  try {
    const auto jobs = launcher::expand_sweeps(lines);
    for (std::size_t i = 0; i < jobs.size() && i < 4; ++i) {
      for (const auto& text : jobs[i]) {
        try {
          launcher::parse_override(text);
        } catch (const common::Error& error) {
          finding("expand_sweeps produced an override that parse_override rejects: " + text + "\n" +
                  error.what());
        }
      }
      apply_and_resolve(jobs[i]);
    }
  } catch (const common::Error&) {
  }
  return 0;
}
