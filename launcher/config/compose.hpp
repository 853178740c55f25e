// Config composition as Hydra 1.3 does it: the primary config's defaults list (and the
// defaults lists of the configs it pulls in) decides which files are merged, in which order
// and at which package; command-line group choices change that list while it is built; the
// remaining command-line overrides are applied to the composed config afterwards, in order.
//
// References: https://hydra.cc/docs/1.3/advanced/defaults_list/ ,
// https://hydra.cc/docs/1.3/advanced/overriding_packages/ , and Hydra's
// hydra/_internal/defaults_list.py, hydra/core/default_element.py, config_loader_impl.py.
// Implemented: `_self_` placement (missing _self_ means last), `group: option` with nested
// option paths (training: gpt3/126m -> conf/training/gpt3/126m.yaml at package `training`),
// `group: null` placeholders, `optional`, `override`, `group@package`, `_global_`/`_here_`,
// `# @package` headers, option lists (`group: [a, b]`), plain config entries (`- dir/file`),
// absolute `/group` paths, nested defaults relative to the containing group, `${group}`
// interpolations of earlier choices, `group=option`, `+group=option`, `~group[=option]` on
// the command line, the `hydra/...` groups of Hydra itself (recorded as choices, nothing
// loaded), and Hydra's errors for unknown groups, options and keys, with suggestions.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/config/node.hpp"

namespace launcher {

struct DefaultsEntry {
  std::string group;        // the config group path, e.g. "training"; "" for the primary config
  std::string option;       // the chosen option, e.g. "gpt3/126m"; the file name for others
  std::string package;      // where the content lands, e.g. "training"; "" is the root
  bool is_self = false;     // the content of a config that has its own defaults list (_self_)
  std::string source_file;  // the YAML file that was merged
  std::string config_path;  // e.g. "training/gpt3/126m"
  std::string parent;       // config path of the config whose defaults list named this one
};

struct ComposeOptions {
  std::filesystem::path conf_dir;
  std::string config_name = "config";
  std::vector<std::string> overrides;
};

struct ComposedConfig {
  Node config;                                 // the job config, unresolved, without `hydra`
  Node hydra;                                  // the composed `hydra` section (empty map if none)
  std::vector<DefaultsEntry> defaults;         // the final defaults list, in merge order
  // hydra:runtime.choices: every group of the defaults list, with null for a group left at
  // null (NeMo's `fine_tuning: null`), which ${hydra:runtime.choices.<group>} yields as Hydra does.
  std::map<std::string, std::optional<std::string>> choices;
};

// The most configs on one chain of includes (the primary config, a group option it names, one
// that option names, ...). Real conf trees are three or four deep; Hydra's own limit is
// Python's recursion limit. A deeper chain is refused, naming it, before it can exhaust the
// stack; a chain that comes back to a config already on it is a cycle, named the same way.
inline constexpr std::size_t kMaxDefaultsDepth = 100;

ComposedConfig compose(const ComposeOptions& options);

// Top-level config groups: directories of conf_dir holding YAML files, sorted.
std::vector<std::string> list_groups(const std::filesystem::path& conf_dir);

// The options of a group: its YAML files, recursively, without ".yaml", '/'-separated and
// sorted (gpt3/126m, gpt3/5b, ...). An unknown group is a common::Error with suggestions.
std::vector<std::string> list_group_options(const std::filesystem::path& conf_dir,
                                            std::string_view group);

}  // namespace launcher
