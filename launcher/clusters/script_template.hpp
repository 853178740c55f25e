// Rendering job scripts from the mustache templates in templates/ (kainjow mustache).
// The template sees only values that are already shell-quoted (shell_quote), comments
// included, or checked scheduler directives, or numbers the launcher computed; they are
// rendered with {{{triple}}} braces so mustache's HTML escaping stays out of the way.
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

// Scheduler directives (#SBATCH, #PBS) are read by the scheduler, not by a shell: refuses a
// value holding a control character (a newline would start a new directive) or a double
// quote (it would end a quoted value), naming the directive. Returns the value, double-quoted
// when it holds a space.
std::string checked_directive_value(const std::string& directive, const std::string& value);

// Writes text to path through a temporary file and a rename, executable by the owner.
void write_script(const std::filesystem::path& path, const std::string& text);

}  // namespace launcher
