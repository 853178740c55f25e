// The one shell-quoting function. Every value that reaches a rendered job script goes
// through shell_quote, so a run name or override holding ', ", $(...), `...`, ; or a
// newline ends up as literal text in the script and is never executed.
// POSIX single-quoting: wrap in '...', and write each ' as '\'' (close, escaped quote,
// reopen). Inside single quotes the shell expands nothing, newlines included.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace launcher {

// A word that needs no quoting ([A-Za-z0-9_@%+=:,./-], not empty) is returned as is, so
// scripts stay readable; anything else is single-quoted.
std::string shell_quote(std::string_view word);

// Quotes each word and joins them with single spaces.
std::string shell_join(const std::vector<std::string>& words);

}  // namespace launcher
