// Mustache rendering and script writing; see script_template.hpp.
#include "launcher/clusters/script_template.hpp"

#include <fstream>
#include <sstream>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"

namespace launcher {

std::string render_template(const std::filesystem::path& templates_dir, const std::string& name,
                            const TemplateData& data) {
  const auto path = templates_dir / name;
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    common::fail("template {} not found (templates are read from launcher_scripts_path/templates)",
                 path.string());
  }
  kainjow::mustache::mustache script(common::read_small_file(path, "the script template"));
  if (!script.is_valid()) common::fail("template {}: {}", path.string(), script.error_message());
  std::string rendered = script.render(data);
  if (!script.is_valid()) common::fail("template {}: {}", path.string(), script.error_message());
  return rendered;
}

void refuse_control_characters(const std::string& directive, const std::string& value) {
  for (char c : value) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      common::fail("{}: the value {:?} holds a control character (a newline would end the "
                   "directive line): scheduler directives take one line of text", directive, value);
    }
  }
}

void write_script(const std::filesystem::path& path, const std::string& text) {
  // Two launches of one run used to share "<script>.tmp" and could rename each other's script
  // into place; the temporary name is unique per writer now.
  common::write_text_file_atomically(path, text, common::FileMode::executable);
}

}  // namespace launcher
