// `launcher_scripts_path: ???` → the directory holding conf/; see launcher_scripts_path.hpp.
#include "launcher/config/launcher_scripts_path.hpp"

namespace launcher {

void fill_launcher_scripts_path(Node& config, const std::filesystem::path& conf_dir) {
  const Node* scripts_path = find(config, "launcher_scripts_path");
  if (scripts_path && scripts_path->is_missing()) {
    config.set("launcher_scripts_path", Node::string(conf_dir.parent_path().string()));
  }
}

}  // namespace launcher
