// Rendering job scripts from the mustache templates in templates/ (kainjow mustache).
// The template sees only values that are already shell-quoted where they reach the shell
// (rendered with {{{triple}}} braces so mustache's HTML escaping stays out of the way).
#pragma once

#include <kainjow/mustache.hpp>

#include <filesystem>
#include <string>

namespace launcher {

using TemplateData = kainjow::mustache::data;

// Renders templates_dir/name with data. A missing file or a template syntax error is a
// common::Error naming the template.
std::string render_template(const std::filesystem::path& templates_dir, const std::string& name,
                            const TemplateData& data);

// Writes text to path through a temporary file and a rename, executable by the owner.
void write_script(const std::filesystem::path& path, const std::string& text);

}  // namespace launcher
