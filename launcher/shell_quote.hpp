// The one shell-quoting function. Every value that reaches a rendered job script goes
// through shell_quote, so a run name or override holding ', ", $(...), `...`, ; or a
// newline ends up as literal text in the script and is never executed.
//   - words of [A-Za-z0-9_@%+=:,./-] stay as they are (scripts stay readable);
//   - words without control characters are POSIX single-quoted: '...', each ' written as
//     '\'' (close, escaped quote, reopen); inside single quotes the shell expands nothing;
//   - words holding a control character (0x01-0x1f, 0x7f) use bash's ANSI-C quoting
//     $'...' (bash(1), QUOTING), with \n, \t, \r, \\, \' and \xHH escapes.
// So the quoted form never holds a raw control character: it is always one line, and safe
// in a `#` comment too (a raw newline would end the comment and start a command). The job
// scripts are bash scripts (local, sbatch, PBS, and the PyTorchJob's `bash -c`).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace launcher {

// A word holding a NUL byte, which no shell word can hold, is a common::Error.
std::string shell_quote(std::string_view word);

// Quotes each word and joins them with single spaces.
std::string shell_join(const std::vector<std::string>& words);

// A name a script may use as code, e.g. in `export NAME=...`: [A-Za-z_][A-Za-z0-9_]*.
bool is_shell_identifier(std::string_view name);

}  // namespace launcher
