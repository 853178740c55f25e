// Hydra 1.3 defaults-list composition; see compose.hpp. The structure follows Hydra's
// defaults_list.py so that behaviour matches case by case: each defaults list is expanded
// from its last entry to its first (so that `override` entries of later configs apply to
// earlier entries), and the results are concatenated first to last.
#include "launcher/config/compose.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"
#include "launcher/config/merge.hpp"
#include "launcher/config/overrides.hpp"
#include "backend/common/suggest.hpp"
#include "launcher/config/yaml_io.hpp"

namespace launcher {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kGlobalPackage = "_global_";

std::string dots_for_slashes(std::string text) {
  std::replace(text.begin(), text.end(), '/', '.');
  return text;
}

std::string without_leading_slash(std::string_view path) {
  return std::string(path.starts_with('/') ? path.substr(1) : path);
}

std::string join_list(const std::vector<std::string>& items, std::string_view separator) {
  std::string text;
  for (const auto& item : items) {
    if (!text.empty()) text += separator;
    text += item;
  }
  return text;
}

// ---- one entry of a defaults list (Hydra's InputDefault: ConfigDefault / GroupDefault)

struct InputDefault {
  enum class Kind { Self, Config, Group };
  Kind kind = Kind::Config;
  std::string path;                  // Config: "dir/name"; Group: the group as written
  std::optional<std::string> value;  // Group: the option; nullopt is null
  std::vector<std::string> options;  // Group with a list of options
  bool is_options_list = false;
  std::optional<std::string> package;         // from @package ("" for _here_)
  std::optional<std::string> package_header;  // absolute, from "# @package"
  bool optional = false;
  bool override_ = false;
  bool external_append = false;  // +group=option from the command line
  bool primary = false;
  bool deleted = false;
  std::string parent_base_dir;
  std::string parent_package;
  SourceLocation location;  // where the entry was written
  std::string chosen_by;    // the command-line override that set the option, if any

  bool is_self() const { return kind == Kind::Self; }
  bool is_group() const { return kind == Kind::Group; }
  bool absolute() const { return path.starts_with('/') || (is_group() && external_append); }

  void update_parent(std::string base_dir, std::string package_of_parent) {
    parent_base_dir = std::move(base_dir);
    parent_package = std::move(package_of_parent);
    // Hydra 1.0's _group_ keyword in a package still works in 1.1 compatibility mode.
    if (package && package->find("_group_") != std::string::npos) {
      std::string resolved = *package;
      resolved.replace(resolved.find("_group_"), 7, default_package());
      package = fmt::format("_global_.{}", resolved);
    }
  }

  std::string group_path() const {
    const std::string stripped = without_leading_slash(path);
    if (is_group()) {
      return parent_base_dir.empty() || absolute() ? stripped : parent_base_dir + "/" + stripped;
    }
    const auto slash = stripped.rfind('/');
    const std::string group = slash == std::string::npos ? "" : stripped.substr(0, slash);
    if (absolute() || parent_base_dir.empty()) return group;
    return group.empty() ? parent_base_dir : parent_base_dir + "/" + group;
  }

  std::optional<std::string> name() const {
    if (is_group()) return value;
    const auto slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
  }

  std::string config_path() const {
    if (is_group()) return group_path() + "/" + value.value_or("null");
    const std::string stripped = without_leading_slash(path);
    if (absolute() || parent_base_dir.empty()) return stripped;
    return parent_base_dir + "/" + stripped;
  }

  std::string relative_group_path() const {
    const std::string stripped = without_leading_slash(path);
    if (is_group()) return stripped;
    const auto slash = stripped.rfind('/');
    return slash == std::string::npos ? "" : stripped.substr(0, slash);
  }

  std::string default_package() const { return dots_for_slashes(group_path()); }

  std::string final_package(bool use_package_header = true) const {
    const std::string parent = is_group() && external_append ? "" : parent_package;
    std::string own;
    if (package) {
      own = *package;
    } else if (use_package_header && package_header) {
      own = *package_header;
    } else {
      own = dots_for_slashes(relative_group_path());
    }
    std::string result = parent.empty() ? own : (own.empty() ? parent : parent + "." + own);
    const auto global = result.rfind(kGlobalPackage);
    if (global == std::string::npos) return result;
    const std::size_t rest = global + kGlobalPackage.size() + 1;
    return rest >= result.size() ? "" : result.substr(rest);
  }

  // The key a command-line choice uses for this entry: "group" or "group@package".
  std::string override_key() const {
    std::string key = group_path();
    const std::string final = final_package(false);
    if (final != default_package())
      key += fmt::format("@{}", final.empty() ? kGlobalPackage : final);
    return key;
  }

  bool is_missing() const { return name() == "???"; }

  bool is_interpolation() const {
    if (is_group()) return !is_options_list && value && value->find("${") != std::string::npos;
    return kind == Kind::Config && path.find("${") != std::string::npos;
  }

  std::string describe() const {
    if (is_group()) {
      const std::string option =
          is_options_list ? fmt::format("[{}]", join_list(options, ", ")) : value.value_or("null");
      return fmt::format("{}: {}", override_key(), option);
    }
    return config_path();
  }
};

// ---- the conf directory

struct LoadedConfig {
  Node content;  // a map, without the `defaults` key
  std::vector<InputDefault> defaults;
  std::optional<std::string> package_header;
  std::string file;
};

// Hydra reads "# @key value" lines at the top of a config file; the first other non-empty line
// ends the header (config_source.py _get_header_dict).
std::optional<std::string> read_package_header(const fs::path& file) {
  std::istringstream stream(common::read_small_file(file, "the YAML file"));
  std::string line;
  while (std::getline(stream, line)) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    std::string_view text = std::string_view(line).substr(first);
    if (!text.starts_with('#')) break;
    text.remove_prefix(1);
    text.remove_prefix(std::min(text.find_first_not_of(" \t"), text.size()));
    if (!text.starts_with('@')) break;
    std::vector<std::string> words;
    std::string word;
    for (char c : text) {
      if (c == ' ' || c == '\t' || c == '\r') {
        if (!word.empty()) words.push_back(std::move(word));
        word.clear();
      } else {
        word += c;
      }
    }
    if (!word.empty()) words.push_back(std::move(word));
    if (words.size() != 2) {
      common::fail("{}: bad header line '{}': expected '# @package <package>'", file.string(),
                   line);
    }
    if (words[0] == "@package") return words[1];
  }
  return std::nullopt;
}

// Splits "optional override group@package" (the key of a defaults entry).
void parse_group_key(std::string_view key, InputDefault& entry) {
  std::vector<std::string> words;
  std::string word;
  for (char c : key) {
    if (c == ' ') {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  if (words.empty())
    common::fail("{}: missing group name in a defaults entry", entry.location.describe());
  for (std::size_t i = 0; i + 1 < words.size(); ++i) {
    if (words[i] == "optional") {
      entry.optional = true;
    } else if (words[i] == "override") {
      entry.override_ = true;
    } else {
      common::fail("{}: unknown keyword '{}' in defaults entry '{}' (valid: optional, override)",
                   entry.location.describe(), words[i], key);
    }
  }
  const std::string& group = words.back();
  const auto at = group.find('@');
  entry.path = group.substr(0, at);
  if (at != std::string::npos) {
    std::string package = group.substr(at + 1);
    if (package.find(':') != std::string::npos) {
      common::fail("{}: package renames (group@old:new) were removed in Hydra 1.1: '{}'",
                   entry.location.describe(), key);
    }
    entry.package = package == "_here_" ? "" : package;
  }
  if (entry.path.empty())
    common::fail("{}: missing group name in '{}'", entry.location.describe(), key);
}

std::vector<InputDefault> parse_defaults_list(const Node& list, const std::string& file) {
  if (!list.is_list()) {
    common::fail("{}: invalid defaults list in '{}': `defaults` must be a list, got a {}",
                 list.location().describe(), file, kind_name(list.kind()));
  }
  std::vector<InputDefault> entries;
  for (const Node& item : list.items()) {
    InputDefault entry;
    entry.location = item.location();
    if (item.is_string()) {
      const std::string& text = item.as_string();
      if (text == "_self_") {
        entry.kind = InputDefault::Kind::Self;
      } else {
        entry.kind = InputDefault::Kind::Config;
        const auto at = text.find('@');
        entry.path = text.substr(0, at);
        if (at != std::string::npos) {
          const std::string package = text.substr(at + 1);
          entry.package = package == "_here_" ? "" : package;
        }
      }
    } else if (item.is_map()) {
      if (item.size() != 1) {
        common::fail("{}: a defaults entry must have exactly one key (group: option), found {}",
                     item.location().describe(), item.size());
      }
      const MapEntry& only = item.entries().front();
      entry.kind = InputDefault::Kind::Group;
      parse_group_key(only.key, entry);
      const Node& value = only.value;
      if (value.is_string()) {
        entry.value = value.as_string();
      } else if (value.is_list()) {
        entry.is_options_list = true;
        for (const Node& option : value.items()) {
          if (!option.is_string()) {
            common::fail("{}: the options of '{}' must be strings, found a {}",
                         option.location().describe(), only.key, kind_name(option.kind()));
          }
          entry.options.push_back(option.as_string());
        }
      } else if (!value.is_null()) {
        common::fail(
            "{}: unsupported value for '{}' in the defaults list: a {} (expected an option "
            "name, null, or a list of option names)",
            value.location().describe(), only.key, kind_name(value.kind()));
      }
    } else {
      common::fail(
          "{}: unsupported defaults entry: a {} (expected _self_, a config path or "
          "group: option)",
          item.location().describe(), kind_name(item.kind()));
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

void collect_options(const fs::path& directory, const fs::path& root,
                     std::vector<std::string>& out) {
  std::error_code error;
  for (fs::recursive_directory_iterator it(directory, error), end; it != end && !error;
       it.increment(error)) {
    if (it->is_regular_file(error) && it->path().extension() == ".yaml") {
      fs::path relative = fs::relative(it->path(), root, error);
      relative.replace_extension();
      out.push_back(relative.generic_string());
    }
  }
  std::sort(out.begin(), out.end());
}

class ConfigRepository {
 public:
  explicit ConfigRepository(fs::path conf_dir) : conf_dir_(std::move(conf_dir)) {}

  const fs::path& conf_dir() const { return conf_dir_; }

  bool group_exists(std::string_view group) const {
    if (group.empty()) return false;
    std::error_code error;
    return fs::is_directory(conf_dir_ / std::string(group), error);
  }

  // Hydra accepts option names with or without the .yaml extension.
  fs::path file_for(std::string_view config_path) const {
    std::string name(config_path);
    if (!name.ends_with(".yaml")) name += ".yaml";
    return conf_dir_ / name;
  }

  bool config_exists(std::string_view config_path) const {
    std::error_code error;
    return fs::is_regular_file(file_for(config_path), error);
  }

  std::vector<std::string> group_options(std::string_view group) const {
    std::vector<std::string> options;
    if (group_exists(group))
      collect_options(conf_dir_ / std::string(group), conf_dir_ / std::string(group), options);
    return options;
  }

  // The top-level groups and their nested groups ("training", "training/tp_overlap").
  std::vector<std::string> all_groups() const {
    std::vector<std::string> groups;
    std::error_code error;
    for (fs::recursive_directory_iterator it(conf_dir_, error), end; it != end && !error;
         it.increment(error)) {
      if (it->is_directory(error))
        groups.push_back(fs::relative(it->path(), conf_dir_, error).generic_string());
    }
    std::sort(groups.begin(), groups.end());
    return groups;
  }

  // nullptr when the file does not exist; parse errors are thrown.
  const LoadedConfig* load(const std::string& config_path) {
    if (auto cached = cache_.find(config_path); cached != cache_.end()) return cached->second.get();
    if (!config_exists(config_path)) return nullptr;
    const fs::path file = file_for(config_path);
    auto loaded = std::make_unique<LoadedConfig>();
    loaded->file = file.string();
    Node content = load_yaml_file(file);
    if (content.is_null()) content = Node::map(SourceLocation{loaded->file, 0, 0});
    if (!content.is_map()) {
      common::fail("{}: config '{}' must be a mapping at the top level, but it is a {}",
                   content.location().describe(), config_path, kind_name(content.kind()));
    }
    if (const Node* defaults = content.child("defaults")) {
      loaded->defaults = parse_defaults_list(*defaults, loaded->file);
      content.erase("defaults");
    }
    loaded->content = std::move(content);
    loaded->package_header = read_package_header(file);
    return cache_.emplace(config_path, std::move(loaded)).first->second.get();
  }

 private:
  fs::path conf_dir_;
  std::map<std::string, std::unique_ptr<LoadedConfig>> cache_;
};

// Hydra's own groups (hydra/launcher, hydra/job_logging, ...) configure Hydra itself, which
// has no counterpart here: their choices are recorded and nothing is loaded for them, whether
// or not the conf directory adds options to them (Hydra treats every hydra/ entry of a
// defaults list as an override of its own hydra/config defaults).
bool is_hydra_builtin_group(std::string_view group) {
  return group.starts_with("hydra/");
}

// ---- command-line group choices and the overrides found in defaults lists (Hydra's Overrides)

struct GroupChoice {
  std::optional<std::string> value;
  std::vector<std::string> options;
  bool is_options_list = false;
  bool external = false;          // from the command line
  std::string containing_config;  // for `override` entries in a defaults list
  SourceLocation location;
  std::string text;  // the command-line override
  bool used = false;
};

struct GroupDeletion {
  std::optional<std::string> name;
  std::string text;
  bool used = false;
};

class GroupOverrides {
 public:
  GroupOverrides(const ConfigRepository& repository, const std::vector<Override>& overrides) {
    for (const Override& override : overrides) {
      const bool is_group =
          repository.group_exists(override.key) || is_hydra_builtin_group(override.key);
      const bool value_is_dict = override.value && override.value->is_map();
      if (value_is_dict || !is_group) {
        config_overrides.push_back(override);
        continue;
      }
      const std::string key =
          override.package ? override.key + "@" + *override.package : override.key;
      switch (override.kind) {
        case Override::Kind::ForceAdd:
          common::fail("force-add of config groups is not supported: '{}'", override.text);
        case Override::Kind::Delete: {
          if (override.value && !override.value->is_string()) {
            common::fail("'{}': the option to delete must be a string", override.text);
          }
          deletions_[key] =
              GroupDeletion{override.value ? std::optional<std::string>(override.value->as_string())
                                           : std::nullopt,
                            override.text, false};
          continue;
        }
        case Override::Kind::Add:
        case Override::Kind::Assign:
          break;
      }
      const Node& value = *override.value;
      if (!value.is_string() && !value.is_list()) {
        common::fail(
            "'{}': a config group option must be a string or a list of strings, not a {}{}",
            override.text, kind_name(value.kind()),
            value.is_null() ? fmt::format(" (to remove the group use ~{})", override.key)
                            : fmt::format(" (quote it: {}='{}')", override.key, python_str(value)));
      }
      if (override.kind == Override::Kind::Add) {
        InputDefault entry;
        entry.kind = InputDefault::Kind::Group;
        entry.path = override.key;
        entry.package = override.package;
        entry.external_append = true;
        entry.chosen_by = override.text;
        set_value(entry, value, override.text);
        append_group_defaults.push_back(std::move(entry));
      } else {
        GroupChoice choice;
        choice.external = true;
        choice.text = override.text;
        if (value.is_string()) {
          choice.value = value.as_string();
        } else {
          choice.is_options_list = true;
          for (const Node& item : value.items()) choice.options.push_back(python_str(item));
        }
        choices_[key] = std::move(choice);
      }
    }
  }

  std::vector<Override> config_overrides;
  std::vector<InputDefault> append_group_defaults;
  std::map<std::string, std::optional<std::string>> known_choices;

  void add_override(const std::string& containing_config, const InputDefault& entry) {
    const std::string key = entry.override_key();
    if (choices_.contains(key)) return;  // the command line wins over defaults lists
    GroupChoice choice;
    choice.value = entry.value;
    choice.options = entry.options;
    choice.is_options_list = entry.is_options_list;
    choice.containing_config = containing_config;
    choice.location = entry.location;
    choices_[key] = std::move(choice);
  }

  bool is_overridden(const InputDefault& entry) const {
    return entry.is_group() && choices_.contains(entry.override_key());
  }

  void apply_choice(InputDefault& entry) {
    GroupChoice& choice = choices_.at(entry.override_key());
    entry.value = choice.value;
    entry.options = choice.options;
    entry.is_options_list = choice.is_options_list;
    if (choice.external) entry.chosen_by = choice.text;
    choice.used = true;
  }

  void set_known_choice(const InputDefault& entry) {
    if (!entry.is_group()) return;
    const std::string key = entry.override_key();
    const auto name = entry.name();
    const auto [existing, inserted] = known_choices.emplace(key, name);
    if (!inserted && existing->second != name) {
      common::fail(
          "{}: multiple values for {}: '{}' and '{}'. To override a value use 'override {}: {}'",
          entry.location.describe(), key, existing->second.value_or("null"), name.value_or("null"),
          key, existing->second.value_or("null"));
    }
    known_choices_per_group_[entry.group_path()].insert(key);
  }

  bool is_deleted(const InputDefault& entry) const {
    if (!entry.is_group()) return false;
    const auto found = deletions_.find(entry.override_key());
    if (found == deletions_.end()) return false;
    return !found->second.name || found->second.name == entry.name();
  }

  void delete_entry(InputDefault& entry) {
    entry.deleted = true;
    deletions_.at(entry.override_key()).used = true;
  }

  void ensure_all_used() {
    for (auto& [key, choice] : choices_) {
      if (choice.used) continue;
      const std::string group = key.substr(0, key.find('@'));
      if (is_hydra_builtin_group(group)) {
        known_choices[key] = choice.value;
        continue;
      }
      std::string message = fmt::format("Could not override '{}'.", key);
      const auto per_group = known_choices_per_group_.find(group);
      if (per_group != known_choices_per_group_.end() && !per_group->second.empty()) {
        message +=
            fmt::format(" Did you mean to override {}?",
                        join_list({per_group->second.begin(), per_group->second.end()}, " or "));
      } else {
        message += " No match in the defaults list.";
      }
      if (choice.external) {
        message = fmt::format("{}: {} To append to your defaults list use +{}", choice.text,
                              message, choice.text);
      } else {
        message = fmt::format("{}: in '{}': {}", choice.location.describe(),
                              choice.containing_config, message);
      }
      throw common::Error(message);
    }
    for (const auto& [key, deletion] : deletions_) {
      if (!deletion.used) {
        common::fail("{}: could not delete '{}': no match in the defaults list", deletion.text,
                     deletion.name ? key + "=" + *deletion.name : key);
      }
    }
  }

 private:
  static void set_value(InputDefault& entry, const Node& value, const std::string& text) {
    if (value.is_string()) {
      entry.value = value.as_string();
      return;
    }
    entry.is_options_list = true;
    for (const Node& item : value.items()) {
      if (!item.is_string()) common::fail("'{}': list options must be strings", text);
      entry.options.push_back(item.as_string());
    }
  }

  std::map<std::string, GroupChoice> choices_;
  std::map<std::string, GroupDeletion> deletions_;
  std::map<std::string, std::set<std::string>> known_choices_per_group_;
};

// ---- building the final defaults list

struct ResultDefault {
  std::string config_path;
  std::string parent;
  std::string package;
  std::string group;
  std::string option;
  std::string override_key;  // group entries only
  bool is_self = false;
};

class DefaultsListBuilder {
 public:
  DefaultsListBuilder(ConfigRepository& repository, GroupOverrides& overrides)
      : repository_(repository), overrides_(overrides) {}

  std::vector<ResultDefault> build(const std::string& config_name) {
    InputDefault primary;
    primary.kind = InputDefault::Kind::Config;
    primary.path = config_name;
    primary.primary = true;
    auto result = expand(primary, nullptr, true, false);
    std::set<std::string> seen;
    for (const auto& entry : result) {
      if (entry.is_self || entry.override_key.empty()) continue;
      if (!seen.insert(entry.override_key).second) {
        common::fail("{} appears more than once in the final defaults list", entry.override_key);
      }
    }
    return result;
  }

 private:
  static ResultDefault result_for(const InputDefault& node, const InputDefault* parent,
                                  bool is_self) {
    ResultDefault result;
    result.config_path = node.config_path();
    result.parent = parent ? parent->config_path() : "";
    result.package = node.final_package();
    result.is_self = is_self;
    if (node.is_group()) {
      result.group = node.group_path();
      result.option = node.value.value_or("");
      if (!is_self) result.override_key = node.override_key();
    } else {
      result.group = node.group_path();
      result.option = node.name().value_or("");
    }
    return result;
  }

  std::string options_list_message(const std::string& group) const {
    const auto options = repository_.group_options(group);
    return options.empty() ? "" : fmt::format(" Available options: {}", join_list(options, ", "));
  }

  [[noreturn]] void fail_not_found(const InputDefault& node, const InputDefault* parent) const {
    if (node.primary) {
      common::fail("Cannot find primary config '{}': {} does not exist", node.config_path(),
                   repository_.file_for(node.config_path()).string());
    }
    std::string where;
    if (!node.chosen_by.empty()) {
      where = node.chosen_by;
    } else {
      where = node.location.describe();
      if (parent) where += fmt::format(": in '{}'", parent->config_path());
    }
    if (node.is_group()) {
      const std::string group = node.group_path();
      if (!repository_.group_exists(group)) {
        std::string suggestion = common::did_you_mean(group, repository_.all_groups());
        common::fail("{}: config group '{}' does not exist (no directory {}).{}", where, group,
                     (repository_.conf_dir() / group).string(), suggestion);
      }
      const auto options = repository_.group_options(group);
      common::fail("{}: unknown option '{}' for config group '{}' (no file {}).{}{}", where,
                   node.value.value_or(""), group,
                   repository_.file_for(node.config_path()).string(),
                   common::did_you_mean(node.value.value_or(""), options), options_list_message(group));
    }
    common::fail("{}: could not load config '{}' (no file {})", where, node.config_path(),
                 repository_.file_for(node.config_path()).string());
  }

  // Hydra's _validate_self: a defaults list without _self_ gets it appended last.
  static void add_self_if_missing(const InputDefault& node, std::vector<InputDefault>& defaults) {
    bool has_self = false;
    bool has_non_override = false;
    for (const auto& entry : defaults) {
      if (!entry.override_) has_non_override = true;
      if (entry.is_self()) {
        if (has_self)
          common::fail("{}: duplicate _self_ in '{}'", entry.location.describe(),
                       node.config_path());
        has_self = true;
      }
    }
    if ((!has_self && has_non_override) || defaults.empty()) {
      InputDefault self;
      self.kind = InputDefault::Kind::Self;
      defaults.push_back(std::move(self));
    }
  }

  // Hydra's _update_overrides: registers `override` entries; they must come last.
  void register_overrides(std::vector<InputDefault>& defaults, const InputDefault& parent,
                          bool interpolated_subtree) {
    const InputDefault* last_override = nullptr;
    bool seen_override = false;
    for (auto& entry : defaults) {
      if (entry.is_self()) continue;
      entry.update_parent(parent.group_path(), parent.final_package());
      // Hydra 1.0 configs override hydra/ groups without the keyword; 1.1 still accepts it.
      const bool legacy_hydra_override =
          entry.is_group() && !entry.override_ && entry.path.starts_with("hydra/");
      if (seen_override && !(entry.override_ || entry.external_append || legacy_hydra_override)) {
        common::fail(
            "{}: in '{}': override '{}' is defined before '{}'. Overrides must be at the end "
            "of the defaults list",
            entry.location.describe(), parent.config_path(), last_override->describe(),
            entry.describe());
      }
      if (!entry.is_group()) continue;
      if (legacy_hydra_override) entry.override_ = true;
      if (!entry.override_) continue;
      if (!legacy_hydra_override) seen_override = true;
      last_override = &entry;
      if (interpolated_subtree) {
        common::fail(
            "{}: in '{}': defaults list overrides are not allowed in the subtree of an "
            "interpolated config group (override {})",
            entry.location.describe(), parent.config_path(), entry.describe());
      }
      overrides_.add_override(parent.config_path(), entry);
    }
  }

  // "${group}" in an option or config path: the choices made so far (Hydra's
  // _resolve_interpolation_impl).
  void resolve_defaults_interpolation(InputDefault& entry) const {
    std::string& text = entry.is_group() ? *entry.value : entry.path;
    std::string resolved;
    std::size_t position = 0;
    while (position < text.size()) {
      const auto open = text.find("${", position);
      if (open == std::string::npos) break;
      const auto close = text.find('}', open);
      if (close == std::string::npos) break;
      std::string key = text.substr(open + 2, close - open - 2);
      key.erase(0, key.find_first_not_of(" \t"));
      key.erase(key.find_last_not_of(" \t") + 1);
      resolved += text.substr(position, open - position);
      const auto found = overrides_.known_choices.find(key);
      if (found != overrides_.known_choices.end() && found->second) {
        resolved += *found->second;
      } else {
        std::vector<std::string> keys;
        for (const auto& [known, value] : overrides_.known_choices) keys.push_back(known);
        common::fail("{}: error resolving interpolation '{}' in the defaults list{}",
                     entry.location.describe(), text,
                     keys.empty()
                         ? std::string()
                         : fmt::format(", possible interpolation keys: {}", join_list(keys, ", ")));
      }
      position = close + 1;
    }
    resolved += text.substr(position);
    text = resolved;
  }

  std::vector<ResultDefault> expand(InputDefault& node, const InputDefault* parent,
                                    bool is_root_config, bool interpolated_subtree) {
    if (is_root_config) {
      node.update_parent("", "");
      if (!repository_.config_exists(node.config_path())) fail_not_found(node, parent);
    }
    const bool builtin = node.is_group() && is_hydra_builtin_group(node.group_path());
    if (node.name() && !node.is_missing() && !builtin) {
      if (const LoadedConfig* header_source = repository_.load(node.config_path())) {
        if (header_source->package_header && *header_source->package_header != "_group_") {
          const std::string& header = *header_source->package_header;
          node.package_header =
              header == "" || header == kGlobalPackage ? std::string(kGlobalPackage)
              : header.starts_with("_global_.")        ? header
                                                       : fmt::format("_global_.{}", header);
        }
      }
    }
    if (overrides_.is_deleted(node)) {
      overrides_.delete_entry(node);
      return {};
    }
    overrides_.set_known_choice(node);
    if (!node.name()) return {};
    if (node.is_missing()) {
      const std::string key = node.override_key();
      common::fail("{}: you must specify '{}', e.g. {}=<OPTION>.{}", node.location.describe(), key,
                   key, options_list_message(node.group_path()));
    }
    if (builtin) return {};

    const LoadedConfig* loaded = repository_.load(node.config_path());
    if (loaded == nullptr) {
      if (node.optional) {
        node.deleted = true;
        return {};
      }
      fail_not_found(node, parent);
    }

    // Each config on the chain of includes is expanded one level deeper in the stack: a config
    // that is already on it would recurse forever, a very long chain would exhaust the stack.
    const IncludeChainEntry chain_entry(include_chain_, node, parent);

    std::vector<InputDefault> defaults = loaded->defaults;
    if (!defaults.empty() || (is_root_config && !overrides_.append_group_defaults.empty())) {
      add_self_if_missing(node, defaults);
    }
    if (is_root_config) {
      defaults.insert(defaults.end(), overrides_.append_group_defaults.begin(),
                      overrides_.append_group_defaults.end());
    }
    register_overrides(defaults, node, interpolated_subtree);

    // Expanded last to first; children[i] holds the results of one entry (possibly none).
    std::vector<std::vector<ResultDefault>> children;
    std::vector<std::pair<std::size_t, InputDefault*>> deferred;
    for (auto entry = defaults.rbegin(); entry != defaults.rend(); ++entry) {
      if (entry->is_self()) {
        children.push_back({result_for(node, parent, true)});
        continue;
      }
      if (entry->override_) continue;
      entry->update_parent(node.group_path(), node.final_package());
      if (overrides_.is_overridden(*entry)) overrides_.apply_choice(*entry);
      if (entry->is_group() && entry->is_options_list) {
        for (auto option = entry->options.rbegin(); option != entry->options.rend(); ++option) {
          if (option->find("${") != std::string::npos) {
            common::fail("{}: in '{}': interpolation is not supported in options list items",
                         entry->location.describe(), node.config_path());
          }
          InputDefault item;
          item.kind = InputDefault::Kind::Config;
          item.path = entry->path + "/" + *option;
          item.package = entry->package;
          item.optional = entry->optional;
          item.location = entry->location;
          item.update_parent(node.group_path(), node.final_package());
          children.push_back(expand(item, &node, false, interpolated_subtree));
        }
      } else if (entry->is_interpolation()) {
        deferred.emplace_back(children.size(), &*entry);
        children.emplace_back();
      } else {
        children.push_back(expand(*entry, &node, false, interpolated_subtree));
      }
    }
    // Interpolated entries see every choice made by their siblings.
    for (auto& [index, entry] : deferred) {
      resolve_defaults_interpolation(*entry);
      entry->update_parent(node.group_path(), node.final_package());
      children[index] = expand(*entry, &node, false, true);
    }

    if (children.empty()) return {result_for(node, parent, false)};
    std::vector<ResultDefault> results;
    for (auto child = children.rbegin(); child != children.rend(); ++child) {
      results.insert(results.end(), child->begin(), child->end());
    }
    return results;
  }

  // The configs being expanded, outermost first ("config", "cluster/bcm", ...).
  class IncludeChainEntry {
   public:
    IncludeChainEntry(std::vector<std::string>& chain, const InputDefault& node,
                      const InputDefault* parent)
        : chain_(chain) {
      const std::string config_path = node.config_path();
      if (std::find(chain.begin(), chain.end(), config_path) != chain.end()) {
        common::fail(
            "{}: defaults list cycle: {} (a config may not include itself, directly or through "
            "others)",
            where(node, parent), describe_chain(chain, config_path));
      }
      if (chain.size() >= kMaxDefaultsDepth) {
        common::fail("{}: defaults lists nested more than {} deep: {} (each config includes the "
                     "next; real conf trees are a few levels deep)",
                     where(node, parent), kMaxDefaultsDepth, describe_chain(chain, config_path));
      }
      chain.push_back(config_path);
    }
    ~IncludeChainEntry() { chain_.pop_back(); }
    IncludeChainEntry(const IncludeChainEntry&) = delete;
    IncludeChainEntry& operator=(const IncludeChainEntry&) = delete;

   private:
    static std::string where(const InputDefault& node, const InputDefault* parent) {
      if (!node.chosen_by.empty()) return node.chosen_by;
      return parent ? node.location.describe() : node.config_path();
    }

    // "config.yaml → cluster/bcm.yaml → cluster/bcm.yaml"; a long chain keeps its ends.
    static std::string describe_chain(const std::vector<std::string>& chain,
                                      const std::string& next) {
      std::vector<std::string> files;
      for (const auto& config_path : chain) files.push_back(file_name(config_path));
      files.push_back(file_name(next));
      constexpr std::size_t kShownAtEachEnd = 3;
      if (files.size() > 2 * kShownAtEachEnd + 1) {
        files.erase(files.begin() + kShownAtEachEnd, files.end() - kShownAtEachEnd);
        files.insert(files.begin() + kShownAtEachEnd, "...");
      }
      return join_list(files, " → ");
    }

    static std::string file_name(const std::string& config_path) {
      return config_path.ends_with(".yaml") ? config_path : config_path + ".yaml";
    }

    std::vector<std::string>& chain_;
  };

  ConfigRepository& repository_;
  GroupOverrides& overrides_;
  std::vector<std::string> include_chain_;
};

// Places `content` at the dotted package path (OmegaConf.update(cfg, package, content,
// merge=False) on an empty config).
Node embed_at_package(const Node& content, const std::string& package) {
  if (package.empty()) return content;
  Node root = Node::map();
  Node* current = &root;
  const auto segments = split_path(package);
  for (std::size_t i = 0; i + 1 < segments.size(); ++i) {
    current->set(segments[i], Node::map());
    current = current->child(segments[i]);
  }
  current->set(segments.back(), content);
  return root;
}

}  // namespace

ComposedConfig compose(const ComposeOptions& options) {
  ConfigRepository repository(options.conf_dir);
  std::error_code error;
  if (!fs::is_directory(options.conf_dir, error)) {
    common::fail("config directory {} does not exist", options.conf_dir.string());
  }
  std::string config_name = options.config_name;
  if (config_name.ends_with(".yaml")) config_name.resize(config_name.size() - 5);

  std::vector<Override> parsed;
  parsed.reserve(options.overrides.size());
  for (const auto& text : options.overrides) parsed.push_back(parse_override(text));

  GroupOverrides group_overrides(repository, parsed);
  DefaultsListBuilder builder(repository, group_overrides);
  const auto results = builder.build(config_name);
  group_overrides.ensure_all_used();

  ComposedConfig composed;
  Node config = Node::map(SourceLocation{repository.file_for(config_name).string(), 0, 0});
  for (const auto& result : results) {
    const LoadedConfig* loaded = repository.load(result.config_path);
    // Each package part is a level of the config; YAML cannot hold much more (kMaxYamlNesting).
    if (std::count(result.package.begin(), result.package.end(), '.') >= 100) {
      common::fail("{}: its package '{}' has more than 100 parts", loaded->file,
                   result.package.substr(0, 60) + "...");
    }
    merge_into(config, embed_at_package(loaded->content, result.package));
    composed.defaults.push_back(DefaultsEntry{result.group, result.option, result.package,
                                              result.is_self, loaded->file, result.config_path,
                                              result.parent});
  }

  const auto groups = repository.all_groups();
  for (const Override& override : group_overrides.config_overrides) {
    if (override.package) {
      common::fail(
          "{}: looks like a config group override, but config group '{}' does not exist.{}",
          override.text, override.key, common::did_you_mean(override.key, groups));
    }
    if (override.key_is_group_path()) {
      common::fail("{}: config group '{}' does not exist.{}", override.text, override.key,
                   common::did_you_mean(override.key, groups));
    }
    // Hydra's own `hydra` section has a full schema; ours holds only what the primary config
    // set, so hydra.* overrides add keys as needed.
    if (override.kind == Override::Kind::Assign && override.key.starts_with("hydra.")) {
      Override lenient = override;
      lenient.kind = Override::Kind::ForceAdd;
      apply_override(config, lenient);
    } else {
      apply_override(config, override);
    }
  }

  if (const Node* hydra = config.child("hydra")) {
    composed.hydra = *hydra;
    config.erase("hydra");
  } else {
    composed.hydra = Node::map();
  }
  composed.config = std::move(config);
  composed.choices = group_overrides.known_choices;
  return composed;
}

std::vector<std::string> list_groups(const fs::path& conf_dir) {
  std::vector<std::string> groups;
  std::error_code error;
  for (fs::directory_iterator it(conf_dir, error), end; it != end && !error; it.increment(error)) {
    if (!it->is_directory(error)) continue;
    std::vector<std::string> options;
    collect_options(it->path(), it->path(), options);
    if (!options.empty()) groups.push_back(it->path().filename().string());
  }
  std::sort(groups.begin(), groups.end());
  return groups;
}

std::vector<std::string> list_group_options(const fs::path& conf_dir, std::string_view group) {
  ConfigRepository repository(conf_dir);
  if (!repository.group_exists(group)) {
    common::fail("config group '{}' does not exist in {}.{}", group, conf_dir.string(),
                 common::did_you_mean(group, repository.all_groups()));
  }
  return repository.group_options(group);
}

}  // namespace launcher
