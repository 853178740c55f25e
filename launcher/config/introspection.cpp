// --cfg, --info defaults and --help output, as Hydra prints them; see introspection.hpp.
#include "launcher/config/introspection.hpp"

#include <algorithm>
#include <array>
#include <map>

#include "backend/common/error.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/launcher_scripts_path.hpp"
#include "launcher/config/yaml_io.hpp"

namespace launcher {

namespace {

// The config Hydra's get_sanitized_cfg leaves for --cfg: the job config, the `hydra` section
// alone, or both with `hydra` first (Hydra composes its own config before the primary one).
Node config_section(const ComposedConfig& composed, ConfigSection section) {
  if (section == ConfigSection::Job) return composed.config;
  Node root = Node::map(composed.config.location());
  root.set("hydra", composed.hydra);
  if (section == ConfigSection::All) {
    for (const auto& entry : composed.config.entries()) root.set(entry.key, entry.value);
  }
  return root;
}

std::string pad(const std::string& text, std::size_t width) {
  return text + std::string(width - std::min(width, text.size()), ' ');
}

}  // namespace

ConfigSection parse_config_section(std::string_view name) {
  if (name == "job") return ConfigSection::Job;
  if (name == "hydra") return ConfigSection::Hydra;
  if (name == "all") return ConfigSection::All;
  common::fail("--cfg {}: expected job (the config without hydra), hydra or all", name);
}

std::string format_config(const ComposedConfig& composed, ConfigSection section, bool resolve_first,
                          std::string_view package) {
  Node config = config_section(composed, section);
  if (resolve_first) config = resolve(config, ResolveContext{composed.choices});
  if (package.empty() || package == "_global_") return to_yaml(config);
  const Node& selected = at_path(config, package);
  if (!selected.is_container()) return python_str(selected) + "\n";
  return fmt::format("# @package {}\n{}", package, to_yaml(selected));
}

std::string format_defaults_list(const std::vector<DefaultsEntry>& defaults) {
  using Row = std::array<std::string, 4>;
  std::vector<Row> rows = {{"Config path", "Package", "_self_", "Parent"}};
  for (const auto& entry : defaults) {
    rows.push_back({entry.config_path, entry.package, entry.is_self ? "True" : "False",
                    entry.parent.empty() ? "<root>" : entry.parent});
  }
  std::array<std::size_t, 4> widths{};
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  auto format_row = [&widths](const Row& row) {
    return fmt::format("| {} | {} | {} | {} |", pad(row[0], widths[0]), pad(row[1], widths[1]),
                       pad(row[2], widths[2]), pad(row[3], widths[3]));
  };
  // Hydra's header line ends in "| " and the rules are as long as it.
  const std::string header = format_row(rows[0]) + " ";
  const std::string rule(header.size(), '-');
  std::string out = "\nDefaults List\n*************\n" + header + "\n" + rule + "\n";
  for (std::size_t i = 1; i < rows.size(); ++i) out += format_row(rows[i]) + "\n";
  return out + rule + "\n";
}

std::string format_config_groups(const std::filesystem::path& conf_dir) {
  // Hydra lists every group directory that holds configs itself, by its full path, with the
  // configs directly in it: conf/training/gpt3/126m.yaml is "training/gpt3: 126m", not
  // "training: gpt3/126m" (hydra/_internal/hydra.py, list_all_config_groups). std::map orders
  // the groups as Python's sorted() does (byte order).
  std::map<std::string, std::vector<std::string>> groups;
  for (const auto& group : list_groups(conf_dir)) {
    if (group == "hydra" || group.starts_with("hydra/")) continue;
    for (const auto& option : list_group_options(conf_dir, group)) {
      const std::size_t slash = option.rfind('/');
      if (slash == std::string::npos) {
        groups[group].push_back(option);
      } else {
        groups[group + "/" + option.substr(0, slash)].push_back(option.substr(slash + 1));
      }
    }
  }
  std::string out;
  for (auto& [group, options] : groups) {
    std::sort(options.begin(), options.end());
    std::string line;
    for (const auto& option : options) line += line.empty() ? option : ", " + option;
    out += fmt::format("{}: {}\n", group, line);
  }
  return out;
}

std::string format_app_help(const std::filesystem::path& conf_dir,
                            const std::vector<std::string>& overrides, bool show_config,
                            bool resolve) {
  std::string out =
      "== Configuration groups ==\nCompose your configuration from those groups "
      "(group=option)\n\n";
  try {
    const std::string groups = format_config_groups(conf_dir);
    out += groups.empty() ? fmt::format("(no config groups in {})\n", conf_dir.string()) : groups;
  } catch (const common::Error& error) {
    out += fmt::format("(config groups not listed: {})\n", error.what());
  }
  if (!show_config) return out;
  out += "\n== Config ==\nOverride anything in the config (foo.bar=value)\n\n";
  try {
    ComposedConfig composed = compose(ComposeOptions{conf_dir, "config", overrides});
    fill_launcher_scripts_path(composed.config, conf_dir);
    out += format_config(composed, ConfigSection::Job, resolve, "");
  } catch (const common::Error& error) {
    out += fmt::format("(config not shown: {})\n", error.what());
  }
  return out;
}

}  // namespace launcher
