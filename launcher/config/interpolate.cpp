// Interpolation resolution; see interpolate.hpp. The config copy is resolved in place, each
// string once: a node that is needed before its turn is resolved on demand, and nodes on the
// current chain of demands are tracked to report cycles.
#include "launcher/config/interpolate.hpp"

#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <limits>
#include <unordered_set>

#include "backend/common/error.hpp"
#include "launcher/config/value_grammar.hpp"

namespace launcher {

namespace {

using Path = std::vector<std::string>;

std::string dotted(const Path& path) {
  return path.empty() ? "<root>" : join_path(path, path.size());
}

const std::vector<std::string>& resolver_names() {
  static const std::vector<std::string> names = {"divide_ceil", "divide_floor", "hydra",
                                                 "multiply",    "now",          "oc.env"};
  return names;
}

// Budgets that stop interpolations whose results double at each step (a: ${b}${b},
// b: ${c}${c}, ... or lists of such) before they exhaust memory; OmegaConf has none and runs
// out of memory. Real configs stay orders of magnitude below.
constexpr std::size_t kMaxInterpolatedBytes = std::size_t{64} << 20;  // text built, in all
constexpr std::size_t kMaxCopiedNodes = 1'000'000;  // values copied by ${...}, in all
// A chain a -> b -> c -> ... is resolved recursively; a bound keeps a long chain from
// overflowing the stack (OmegaConf stops far earlier, at Python's recursion limit).
constexpr std::size_t kMaxInterpolationChain = 500;

class Resolver {
 public:
  Resolver(Node& root, const ResolveContext& context) : root_(root), context_(context) {}

  void resolve_subtree(Node& node, Path& path) {
    if (final_.contains(&node)) return;
    if (node.is_string()) {
      if (node.is_missing()) {
        common::fail(
            "'{}' ({}) is mandatory (\?\?\?) and has no value; set it, e.g. on the command "
            "line: {}=<value>",
            dotted(path), node.location().describe(), dotted(path));
      }
      if (node.has_interpolation()) resolve_string(node, path);
      return;
    }
    if (node.is_map()) {
      for (auto& entry : node.entries()) {
        path.push_back(entry.key);
        resolve_subtree(entry.value, path);
        path.pop_back();
      }
    } else if (node.is_list()) {
      for (std::size_t i = 0; i < node.size(); ++i) {
        path.push_back(std::to_string(i));
        resolve_subtree(node.items()[i], path);
        path.pop_back();
      }
    }
  }

 private:
  // Where an interpolation is being evaluated: the node holding it and that node's path.
  struct Site {
    const Node* node;
    const Path* path;
  };

  std::string describe(const Site& site) const {
    return fmt::format("'{}' ({})", dotted(*site.path), site.node->location().describe());
  }

  void enter(const Node& node, const Path& path) {
    for (std::size_t i = 0; i < in_progress_.size(); ++i) {
      if (in_progress_[i].first != &node) continue;
      std::string cycle;
      for (std::size_t j = i; j < in_progress_.size(); ++j)
        cycle += in_progress_[j].second + " -> ";
      common::fail("interpolation cycle: {}{} (at {})", cycle, dotted(path),
                   node.location().describe());
    }
    if (in_progress_.size() >= kMaxInterpolationChain) {
      common::fail("interpolation chain longer than {} values: {} -> {} -> ... -> {} (at {})",
                   kMaxInterpolationChain, in_progress_[0].second, in_progress_[1].second,
                   dotted(path), node.location().describe());
    }
    in_progress_.emplace_back(&node, dotted(path));
  }

  void resolve_string(Node& node, const Path& path) {
    if (final_.contains(&node) || !node.has_interpolation()) return;
    enter(node, path);
    const Site site{&node, &path};
    const std::string description = fmt::format("bad interpolation in {}", describe(site));
    const grammar::Text text = grammar::parse_config_string(node.as_string(), description);
    Node result = evaluate_text(text, site);
    if (!result.is_container()) result.set_location(node.location());
    in_progress_.pop_back();
    node = std::move(result);
    final_.insert(&node);
  }

  Node evaluate_text(const grammar::Text& text, const Site& site) {
    if (grammar::is_single_interpolation(text))
      return evaluate_interpolation(*text[0].interpolation, site);
    std::string value;
    for (const auto& piece : text) {
      value += piece.interpolation ? python_str(evaluate_interpolation(*piece.interpolation, site))
                                   : piece.literal;
      if (interpolated_bytes_ + value.size() > kMaxInterpolatedBytes) {
        common::fail(
            "{}: string interpolation builds more than {} MiB of text (does each "
            "interpolation repeat another one several times?)",
            describe(site), kMaxInterpolatedBytes >> 20);
      }
    }
    interpolated_bytes_ += value.size();
    return Node::string(std::move(value));
  }

  // A key segment or resolver name part: literal, or an interpolation that gives a string.
  std::string evaluate_name(const grammar::Text& text, const grammar::Interpolation& owner,
                            const Site& site) {
    if (!grammar::is_single_interpolation(text)) return text.empty() ? "" : text[0].literal;
    const Node value = evaluate_interpolation(*text[0].interpolation, site);
    if (!value.is_string()) {
      common::fail("{}: in {}, {} is used as a key and must give a string, but gave the {} {}",
                   describe(site), owner.source, text[0].interpolation->source,
                   kind_name(value.kind()), python_str(value));
    }
    return value.as_string();
  }

  Node evaluate_element(const grammar::Element& element, const Site& site) {
    switch (element.kind) {
      case grammar::Element::Kind::Scalar:
        return element.scalar;
      case grammar::Element::Kind::Unquoted:
        return evaluate_text(element.text, site);
      case grammar::Element::Kind::Quoted: {
        const Node value = evaluate_text(element.text, site);
        return value.is_string() ? value : Node::string(python_str(value));
      }
      case grammar::Element::Kind::List: {
        Node list = Node::list();
        for (const auto& item : element.items) list.push_back(evaluate_element(item, site));
        return list;
      }
      case grammar::Element::Kind::Dict: {
        Node map = Node::map();
        for (const auto& entry : element.entries)
          map.set(entry.key, evaluate_element(entry.value, site));
        return map;
      }
    }
    return Node();
  }

  Node evaluate_interpolation(const grammar::Interpolation& interpolation, const Site& site) {
    if (interpolation.kind == grammar::Interpolation::Kind::Node)
      return select(interpolation, site);
    std::string name;
    for (const auto& part : interpolation.resolver_name) {
      if (!name.empty()) name += '.';
      name += evaluate_name(part, interpolation, site);
    }
    std::vector<Node> arguments;
    for (const auto& argument : interpolation.arguments)
      arguments.push_back(evaluate_element(argument, site));
    return call_resolver(name, arguments, interpolation, site);
  }

  // A node interpolation: find the target, resolve it where it lives, return a copy.
  Node select(const grammar::Interpolation& interpolation, const Site& site) {
    Path target;
    if (interpolation.leading_dots > 0) {
      // ${.x} starts at the container of the interpolating node; each further dot goes up.
      const Path& own = *site.path;
      const std::size_t up = interpolation.leading_dots - 1;
      if (own.empty() || up > own.size() - 1) {
        common::fail("{}: {} goes above the root of the config", describe(site),
                     interpolation.source);
      }
      target.assign(own.begin(), own.end() - 1 - static_cast<std::ptrdiff_t>(up));
    }
    for (const auto& segment : interpolation.key)
      target.push_back(evaluate_name(segment, interpolation, site));

    Node* current = &root_;
    bool within_final = final_.contains(current);
    Path walked;
    for (const auto& segment : target) {
      if (!within_final && current->has_interpolation()) resolve_string(*current, walked);
      within_final = within_final || final_.contains(current);
      Node* next = child_at(*current, segment);
      if (next == nullptr) {
        common::fail("{}: interpolation {} refers to '{}', which does not exist: {}",
                     describe(site), interpolation.source, dotted(target),
                     describe_missing_key(*current, join_path(walked, walked.size()), segment));
      }
      current = next;
      walked.push_back(segment);
      within_final = within_final || final_.contains(current);
    }
    if (!within_final) {
      if (current->is_missing()) {
        common::fail(
            "{}: interpolation {} refers to '{}' ({}), which is mandatory (\?\?\?) and has no "
            "value; set it, e.g. on the command line: {}=<value>",
            describe(site), interpolation.source, dotted(target), current->location().describe(),
            dotted(target));
      }
      if (current->has_interpolation()) {
        resolve_string(*current, walked);
      } else if (current->is_container()) {
        enter(*current, walked);
        resolve_subtree(*current, walked);
        in_progress_.pop_back();
        final_.insert(current);
      }
    }
    copied_nodes_ += tree_size(*current);
    if (copied_nodes_ > kMaxCopiedNodes) {
      common::fail(
          "{}: interpolations copy more than {} values in all (does each "
          "interpolation repeat another one several times?)",
          describe(site), kMaxCopiedNodes);
    }
    return *current;
  }

  [[noreturn]] void fail_resolver(const Site& site, const grammar::Interpolation& interpolation,
                                  const std::string& message) const {
    common::fail("{}: {}: {}", describe(site), interpolation.source, message);
  }

  void expect_arguments(const std::string& name, const std::vector<Node>& arguments,
                        std::size_t minimum, std::size_t maximum,
                        const grammar::Interpolation& interpolation, const Site& site) const {
    if (arguments.size() >= minimum && arguments.size() <= maximum) return;
    const std::string expected =
        minimum == maximum ? std::to_string(minimum) : fmt::format("{} or {}", minimum, maximum);
    fail_resolver(site, interpolation,
                  fmt::format("{} takes {} arguments, got {}", name, expected, arguments.size()));
  }

  void expect_numbers(const std::string& name, const std::vector<Node>& arguments,
                      const grammar::Interpolation& interpolation, const Site& site) const {
    for (const Node& argument : arguments) {
      if (!argument.is_number()) {
        fail_resolver(site, interpolation,
                      fmt::format("{} needs numbers, got the {} {}", name,
                                  kind_name(argument.kind()), python_str(argument)));
      }
    }
  }

  Node call_resolver(const std::string& name, const std::vector<Node>& arguments,
                     const grammar::Interpolation& interpolation, const Site& site) {
    if (name == "multiply") {
      expect_arguments(name, arguments, 2, 2, interpolation, site);
      expect_numbers(name, arguments, interpolation, site);
      if (arguments[0].is_int() && arguments[1].is_int()) {
        std::int64_t product = 0;
        if (__builtin_mul_overflow(arguments[0].as_int(), arguments[1].as_int(), &product)) {
          fail_resolver(site, interpolation, "the product does not fit in a 64-bit integer");
        }
        return Node::integer(product);
      }
      return Node::floating(arguments[0].as_double() * arguments[1].as_double());
    }
    if (name == "divide_ceil" || name == "divide_floor") {
      // NeMo: int(math.ceil(x / y)) and int(math.floor(x / y)).
      expect_arguments(name, arguments, 2, 2, interpolation, site);
      expect_numbers(name, arguments, interpolation, site);
      if (arguments[1].as_double() == 0) fail_resolver(site, interpolation, "division by zero");
      if (arguments[0].is_int() && arguments[1].is_int()) {
        const std::int64_t dividend = arguments[0].as_int();
        const std::int64_t divisor = arguments[1].as_int();
        // The one quotient of two int64s that is not an int64 (2^63); x86 traps on it (SIGFPE).
        if (dividend == std::numeric_limits<std::int64_t>::min() && divisor == -1) {
          fail_resolver(site, interpolation, "the quotient does not fit in a 64-bit integer");
        }
        std::int64_t quotient = dividend / divisor;
        const bool inexact = dividend % divisor != 0;
        const bool negative = (dividend < 0) != (divisor < 0);
        if (inexact && name == "divide_ceil" && !negative) ++quotient;
        if (inexact && name == "divide_floor" && negative) --quotient;
        return Node::integer(quotient);
      }
      const double ratio = arguments[0].as_double() / arguments[1].as_double();
      const double rounded = name == "divide_ceil" ? std::ceil(ratio) : std::floor(ratio);
      if (!std::isfinite(rounded) || std::fabs(rounded) > 9.2e18) {
        fail_resolver(site, interpolation,
                      fmt::format("{} is not a valid integer", format_float(rounded)));
      }
      return Node::integer(static_cast<std::int64_t>(rounded));
    }
    if (name == "oc.env") {
      expect_arguments(name, arguments, 1, 2, interpolation, site);
      const std::string variable = python_str(arguments[0]);
      if (const char* value = std::getenv(variable.c_str())) return Node::string(value);
      if (arguments.size() == 2) {
        // OmegaConf: a default is returned as str(default), except that null stays null.
        return arguments[1].is_null() ? Node::null() : Node::string(python_str(arguments[1]));
      }
      fail_resolver(site, interpolation,
                    fmt::format("environment variable '{}' is not set (give a default with "
                                "${{oc.env:{},<default>}})",
                                variable, variable));
    }
    if (name == "now") {
      expect_arguments(name, arguments, 1, 1, interpolation, site);
      const std::string pattern = python_str(arguments[0]);
      auto cached = now_cache_.find(pattern);
      if (cached == now_cache_.end())
        cached = now_cache_.emplace(pattern, format_now(pattern)).first;
      return Node::string(cached->second);
    }
    if (name == "hydra") {
      expect_arguments(name, arguments, 1, 1, interpolation, site);
      const std::string key = python_str(arguments[0]);
      constexpr std::string_view kChoices = "runtime.choices.";
      if (key.starts_with(kChoices)) {
        const std::string group = key.substr(kChoices.size());
        const auto found = context_.choices.find(group);
        if (found != context_.choices.end()) {
          // A group left at null (`fine_tuning: null`, as NeMo's config.yaml has it) is null,
          // as Hydra records it; NeMo reads `fine_tuning_config: null` as "stage not used".
          return found->second ? Node::string(*found->second) : Node::null();
        }
        // Hydra would give null here too (OmegaConf.select of a missing key), but a group that
        // is not in the defaults list at all is far more often a typo than a choice.
        std::vector<std::string> groups;
        for (const auto& [known, option] : context_.choices) groups.push_back(known);
        fail_resolver(site, interpolation,
                      fmt::format("config group '{}' is not in the defaults list (groups there: "
                                  "{}); to leave it unchosen add `- {}: null` to the defaults list",
                                  group, groups.empty() ? "none" : join_names(groups), group));
      }
      if (key == "runtime.cwd") return Node::string(std::filesystem::current_path().string());
      fail_resolver(site, interpolation,
                    fmt::format("unsupported hydra key '{}' (supported: runtime.choices.<group>, "
                                "runtime.cwd)",
                                key));
    }
    std::string known;
    for (const auto& resolver : resolver_names()) known += (known.empty() ? "" : ", ") + resolver;
    fail_resolver(site, interpolation,
                  fmt::format("unknown resolver '{}' (known resolvers: {})", name, known));
  }

  static std::string join_names(const std::vector<std::string>& items) {
    std::string text;
    for (const auto& item : items) text += (text.empty() ? "" : ", ") + item;
    return text;
  }

  static std::string format_now(const std::string& pattern) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    if (pattern.empty()) return "";
    for (std::size_t size = 64; size <= 65536; size *= 4) {
      std::string buffer(size, '\0');
      const std::size_t written =
          std::strftime(buffer.data(), buffer.size(), pattern.c_str(), &local);
      if (written > 0) return buffer.substr(0, written);
    }
    return "";
  }

  Node& root_;
  const ResolveContext& context_;
  std::vector<std::pair<const Node*, std::string>> in_progress_;
  std::unordered_set<const Node*> final_;  // resolved values; nothing below them is re-read
  std::map<std::string, std::string> now_cache_;
  std::size_t interpolated_bytes_ = 0;  // against kMaxInterpolatedBytes
  std::size_t copied_nodes_ = 0;        // against kMaxCopiedNodes
};

}  // namespace

Node resolve(const Node& config, const ResolveContext& context) {
  Node resolved = config;
  Resolver resolver(resolved, context);
  Path path;
  resolver.resolve_subtree(resolved, path);
  return resolved;
}

std::vector<std::string> known_resolvers() {
  return resolver_names();
}

}  // namespace launcher
