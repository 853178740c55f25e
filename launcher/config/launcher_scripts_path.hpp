// NeMo-Megatron-Launcher's `launcher_scripts_path: ???` rule, shared by every command that
// shows or uses the composed config (launch, --cfg, --help): in NeMo the value is required
// (OmegaConf's ??? marker); here ??? means "the directory holding the conf/ in use", so that
// templates/, data_dir and base_results_dir default to the checkout.
#pragma once

#include <filesystem>

#include "launcher/config/node.hpp"

namespace launcher {

// When config.launcher_scripts_path is "???", sets it to conf_dir's parent directory (as a
// string without a source location); any other value, or no such key, is left alone.
void fill_launcher_scripts_path(Node& config, const std::filesystem::path& conf_dir);

}  // namespace launcher
