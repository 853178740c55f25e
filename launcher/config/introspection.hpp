// What `launcher main` shows instead of launching: Hydra 1.3's --cfg, --info defaults and the
// application --help text, computed from the conf dir and the composed config.
//
// Reference: hydra/_internal/hydra.py (show_cfg, _print_defaults_list, app_help,
// format_config_groups) and hydra/conf/hydra/help/default.yaml.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/config/compose.hpp"

namespace launcher {

// --cfg job|hydra|all: the config without `hydra`, only `hydra`, or both (`hydra` first).
enum class ConfigSection { Job, Hydra, All };

// "job", "hydra", "all"; anything else is a common::Error listing those.
ConfigSection parse_config_section(std::string_view name);

// Hydra's --cfg output. `resolve_first` resolves interpolations (--resolve) across the whole
// section before selecting; `package` (--package, a dotted path; "" or "_global_" for the
// root) selects a subtree, printed after a "# @package <package>" line, or a scalar, printed
// alone as Python's str() prints it. A missing package is a common::Error naming the nearest
// existing parent and its keys.
std::string format_config(const ComposedConfig& composed, ConfigSection section, bool resolve_first,
                          std::string_view package);

// Hydra's --info defaults table: a blank line, "Defaults List", then one row per entry of the
// final defaults list, in merge order: | Config path | Package | _self_ | Parent |, columns
// padded to their widest cell; the primary config's parent is <root>.
std::string format_defaults_list(const std::vector<DefaultsEntry>& defaults);

// Hydra's $APP_CONFIG_GROUPS: "group: option1, option2, ..." per config group directory of
// conf_dir that holds configs itself, by its full path ("training/gpt3: 126m, 5b"), groups and
// options sorted; Hydra's own groups (hydra, hydra/...) are left out. "" when there are none.
std::string format_config_groups(const std::filesystem::path& conf_dir);

// Hydra's application help after the flags: "== Configuration groups ==" with
// format_config_groups, then, when `show_config`, "== Config ==" with the job config composed
// from `overrides` (launcher_scripts_path filled, resolved when `resolve`). An error on the
// way (no groups, a config that does not compose) becomes one line saying why, so help
// always prints.
std::string format_app_help(const std::filesystem::path& conf_dir,
                            const std::vector<std::string>& overrides, bool show_config,
                            bool resolve);

}  // namespace launcher
