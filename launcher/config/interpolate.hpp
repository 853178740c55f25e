// Resolution of OmegaConf 2.2 interpolations: a composed config in, a fully resolved copy out.
//
// Reference: https://omegaconf.readthedocs.io/en/2.2_branch/usage.html#variable-interpolation
// and https://omegaconf.readthedocs.io/en/2.2_branch/custom_resolvers.html. Semantics:
//  - ${a.b.c} is absolute; ${.x} is relative to the node holding the interpolation, ${..x} to
//    its parent, and so on; list items are ${a.0} or ${a[0]}; a key segment may itself be an
//    interpolation (${a.${b}}), which must give a string;
//  - a value that is exactly one interpolation takes the referenced value with its type (an
//    int stays an int, a map is copied, resolved where it lives so its own relative
//    interpolations keep their meaning); anything else is string interpolation, where values
//    are formatted as Python's str() does (True, None, 1e-05, ...);
//  - "\${" is a literal "${";
//  - resolvers: multiply, divide_ceil, divide_floor (NeMo-Megatron-Launcher's), oc.env
//    (with an optional default; the value is a string, a null default stays null), now
//    (strftime pattern, local time, one time per resolve() call, like Hydra's cached
//    resolver) and hydra (runtime.choices.<group>, runtime.cwd). Resolver arguments are
//    grammar values (typed like override values), may be interpolations themselves, and
//    whitespace around them is ignored;
//  - a "???" value reached by resolve() or by an interpolation, an interpolation to a missing
//    key, a cycle (printed as a -> b -> a) and an unknown resolver are common::Errors naming
//    the key and its source location.
//  - results that grow exponentially (each interpolation repeating another several times) are
//    a common::Error once they pass 64 MiB of built text or a million copied values, instead
//    of exhausting memory as OmegaConf does.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/config/node.hpp"

namespace launcher {

struct ResolveContext {
  // hydra:runtime.choices, e.g. training -> gpt3/126m, fine_tuning -> null (a group the
  // defaults list leaves at null). Environment lookups use getenv.
  std::map<std::string, std::optional<std::string>> choices;
};

Node resolve(const Node& config, const ResolveContext& context);

// The resolver names resolve() understands, sorted.
std::vector<std::string> known_resolvers();

}  // namespace launcher
