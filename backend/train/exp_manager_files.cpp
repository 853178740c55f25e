// NeMo exp_manager's cmd-args.log and hparams.yaml; see exp_manager_files.hpp.
#include "backend/train/exp_manager_files.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <regex>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"

namespace backend {

namespace {

void write_file(const std::filesystem::path& file, const std::string& text) {
  common::write_text_file_atomically(file, text, common::FileMode::regular, "--log-dir file");
}

std::string double_quoted(const std::string& text) {
  std::string quoted = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': quoted += "\\\""; break;
      case '\\': quoted += "\\\\"; break;
      case '\n': quoted += "\\n"; break;
      case '\t': quoted += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          quoted += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        } else {
          quoted += c;
        }
    }
  }
  return quoted + "\"";
}

}  // namespace

std::string yaml_scalar(const std::string& text) {
  if (text == "True") return "true";
  if (text == "False") return "false";
  if (text == "None") return "null";
  if (text == "inf") return ".inf";
  if (text == "-inf") return "-.inf";
  if (text == "nan") return ".nan";
  static const std::regex integer(R"(-?[0-9]+)");
  static const std::regex floating(R"((-?)([0-9]+)(\.[0-9]*)?([eE][-+]?[0-9]+)?)");
  if (std::regex_match(text, integer)) return text;
  std::smatch parts;
  if (std::regex_match(text, parts, floating)) {
    // fmt writes 1e-05 where YAML 1.1 wants 1.0e-05.
    const std::string fraction = parts[3].matched ? parts[3].str() : ".0";
    return parts[1].str() + parts[2].str() + (fraction == "." ? ".0" : fraction) + parts[4].str();
  }
  // Megatron keeps --rampup-batch-size as a list of strings; ['16', '16', '1000'] is a YAML
  // flow sequence as it stands.
  static const std::regex string_list(R"(\[('[^'\n]*'(, '[^'\n]*')*)?\])");
  if (std::regex_match(text, string_list)) return text;
  return double_quoted(text);
}

std::string command_line_text(const std::vector<std::string>& command_line) {
  return fmt::format("{}", fmt::join(command_line, " "));
}

std::string hparams_yaml(const TrainingArguments& arguments) {
  std::string yaml;
  for (const auto& [name, value] : argument_values(arguments)) {
    yaml += fmt::format("{}: {}\n", name, yaml_scalar(value));
  }
  return yaml;
}

void write_exp_manager_files(const std::filesystem::path& directory,
                             const TrainingArguments& arguments) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) common::fail("--log-dir {}: {}", directory.string(), error.message());
  write_file(directory / "cmd-args.log", command_line_text(arguments.command_line));
  write_file(directory / "hparams.yaml", hparams_yaml(arguments));
}

}  // namespace backend
