// Test support: how the schedulers read the directive lines of a job script, so tests can
// check that each rendered directive is exactly one option with exactly its value.
//   sbatch: Slurm 22.05 src/sbatch/opt.c, _opt_batch_script and _get_argument. Directives are
//   the lines starting "#SBATCH" before the first command line; each is split into arguments
//   at unquoted whitespace; '...' and "..." group (the quote characters removed), a backslash
//   takes the next character literally, an unquoted '#' ends the line; a line holding
//   "hetjob" or "packjob" (any case) starts a new heterogeneous component, and the word itself
//   is blanked.
//   PBS: "#PBS -X value" lines; only the shapes the launcher writes are accepted here.
// Header-only because tests/CMakeLists.txt compiles only *_test.cpp.
#pragma once

#include <algorithm>
#include <cctype>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace test_support {

inline std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

struct SbatchDirectives {
  std::vector<std::string> arguments;  // every argument of every #SBATCH line, in order
  int components = 1;                  // heterogeneous job components (hetjob separators + 1)
  bool fatal = false;  // sbatch stops: "Unmatched `'`", or "Unexpected `:`" at an argument's start
};

// The arguments sbatch reads from the script's #SBATCH lines.
inline SbatchDirectives sbatch_directives(const std::string& script) {
  SbatchDirectives result;
  std::istringstream lines(script);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("#SBATCH", 0) != 0) {
      const auto first = line.find_first_not_of(" \t\r\v\f");
      if (first != std::string::npos && line[first] != '#') break;  // the first command
      continue;
    }
    std::string rest = line.substr(7);
    const std::string lower = lowercase(rest);
    for (const std::string separator : {"hetjob", "packjob"}) {
      if (const auto at = lower.find(separator); at != std::string::npos) {
        ++result.components;
        rest.replace(at, separator.size(), std::string(separator.size(), ' '));
        break;
      }
    }
    size_t i = 0;
    while (i < rest.size()) {
      while (i < rest.size() && std::isspace(static_cast<unsigned char>(rest[i]))) ++i;
      if (i == rest.size()) break;
      if (rest[i] == ':') result.fatal = true;
      std::string argument;
      bool escaped = false;
      char quote = '\0';
      for (; i < rest.size() && (quote || !std::isspace(static_cast<unsigned char>(rest[i]))); ++i) {
        const char c = rest[i];
        if (escaped) {
          escaped = false;
        } else if (c == '\\') {
          escaped = true;
          continue;
        } else if (quote) {
          if (c == quote) {
            quote = '\0';
            continue;
          }
        } else if (c == '"' || c == '\'') {
          quote = c;
          continue;
        } else if (c == '#') {
          i = rest.size();
          break;
        }
        argument += c;
      }
      if (quote) result.fatal = true;
      // An argument of no characters (e.g. "") ends the line: sbatch reads it as the end.
      if (argument.empty()) break;
      result.arguments.push_back(argument);
    }
  }
  return result;
}

struct PbsDirective {
  std::string option;  // "-N", "-l", ...
  std::string value;   // unquoted; empty for a flag alone
};

// The #PBS lines before the first command, as the launcher writes them: "-X" or "-X value" or
// "-X \"value with spaces\"". Any other shape is returned as nullopt.
inline std::optional<std::vector<PbsDirective>> pbs_directives(const std::string& script) {
  std::vector<PbsDirective> directives;
  std::istringstream lines(script);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("#PBS ", 0) != 0) {
      if (!line.empty() && line[0] != '#') break;
      continue;
    }
    const std::string rest = line.substr(5);
    if (rest.size() < 2 || rest[0] != '-' || !std::isalpha(static_cast<unsigned char>(rest[1]))) {
      return std::nullopt;
    }
    PbsDirective directive{rest.substr(0, 2), ""};
    if (rest.size() > 2) {
      if (rest[2] != ' ' || rest.size() == 3) return std::nullopt;
      std::string value = rest.substr(3);
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
        value = value.substr(1, value.size() - 2);
      } else if (value.find(' ') != std::string::npos) {
        return std::nullopt;
      }
      if (value.find_first_of("\"'\\") != std::string::npos) return std::nullopt;
      directive.value = value;
    }
    directives.push_back(directive);
  }
  return directives;
}

}  // namespace test_support
