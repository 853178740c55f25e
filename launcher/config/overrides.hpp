// Hydra's command-line overrides: parsing (the override grammar) and applying a config
// override to a composed config.
//
// Reference: https://hydra.cc/docs/1.3/advanced/override_grammar/basic/ and
// hydra/_internal/config_loader_impl.py (_apply_overrides_to_config). Forms:
//   a.b=v      assign to an existing key (the composed config is in struct mode)
//   +a.b=v     add a new key; an existing non-null key is an error unless v is a list/dict
//   ++a.b=v    add or override
//   ~a.b, ~a.b=v   delete (the value, when given, must match)
//   group=option, +group=option, ~group   choose / append / remove a config group option
//   group@package=option                   the same for a group placed at another package
// Values follow the shared value grammar (value_grammar.hpp): null, true/false (any case),
// ints, floats, unquoted strings, '...'/"..." strings, [lists], {dicts}, nested, with
// ${...} interpolations kept as text until resolve(). Sweeps (a,b) and functions (choice(),
// range(), int(), ...) are recognised and refused here, with a message that says to add -m:
// multirun expands them first (expand_sweeps in sweep.hpp), so each job's overrides are plain.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/config/node.hpp"

namespace launcher {

struct Override {
  enum class Kind {
    Assign /* a.b=v */,
    Add /* +a.b=v */,
    ForceAdd /* ++a.b=v */,
    Delete /* ~a.b[=v] */
  };
  Kind kind = Kind::Assign;
  std::string key;                     // "a.b.c", "training", "hydra/launcher" (without @package)
  std::optional<std::string> package;  // "pkg" of group@pkg; "" for group@ (the global package)
  std::optional<Node> value;           // absent only for a delete without a value; "" for "key="
  std::string text;                    // as typed

  // Group paths use '/', config keys use '.'; "training" may be either (compose decides by
  // whether conf/training/ exists).
  bool key_is_group_path() const { return key.find('/') != std::string::npos; }
};

// common::Error "bad override '<text>': <what> at column N" with the text and a caret.
Override parse_override(std::string_view text);

// Applies a config override (not a group choice) to `config`, as Hydra does after
// composition. Errors name the key, the nearest existing parent, "did you mean", the valid
// keys when there are at most 20, and the form that would work (+key=..., ++key=...).
void apply_override(Node& config, const Override& override);

}  // namespace launcher
