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

// Scheduler directives (#SBATCH, #PBS) are read by the scheduler, not by a shell, and line by
// line: refuses a value holding a control character (a newline would end the directive, and
// the next line would be read as a command by bash or as another directive by the
// scheduler), naming the directive. Each cluster then writes the value in its scheduler's
// own syntax (slurm_cluster.cpp, pbs_cluster.cpp).
void refuse_control_characters(const std::string& directive, const std::string& value);

// Writes text to path whole or not at all (common::write_text_file_atomically: a uniquely named temporary
// file, fsync, rename), executable by the owner and group.
void write_script(const std::filesystem::path& path, const std::string& text);

}  // namespace launcher
