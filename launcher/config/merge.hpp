// OmegaConf 2.2's merge for untyped configs (OmegaConf.merge / DictConfig.merge_with,
// omegaconf/basecontainer.py _map_merge), which Hydra uses to compose the defaults list:
//  - map onto map merges key by key, recursively; new keys are appended in source order;
//  - anything else replaces: lists are never merged element-wise, and a map replaces a
//    scalar (or a scalar a map);
//  - a source value of "???" (mandatory missing) does not overwrite an existing value.
#pragma once

#include "launcher/config/node.hpp"

namespace launcher {

void merge_into(Node& destination, const Node& source);

}  // namespace launcher
