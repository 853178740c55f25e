// The files NeMo's exp_manager leaves in a run's log dir (nemo/utils/exp_manager.py), written
// at start-up with --log-dir DIR (our extension; the launcher passes exp_manager.explicit_log_dir):
//   DIR/cmd-args.log  the command line joined by single spaces, no trailing newline, as NeMo's
//                     `" ".join(sys.argv)`
//   DIR/hparams.yaml  the resolved training arguments as one YAML mapping, sorted, under
//                     Megatron's argument names (underscores, as in Megatron's arguments dump)
//                     rather than NeMo's `cfg:` tree, since these are the arguments that ran.
//                     Values convert from the dump's Python spelling: True/False → true/false,
//                     None → null, numbers stay numbers (floats always with a '.', so YAML 1.1
//                     readers such as PyYAML see floats too), strings are double-quoted.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "backend/train/arguments.hpp"

namespace backend {

void write_exp_manager_files(const std::filesystem::path& directory, const TrainingArguments& arguments);

// The texts, for tests.
std::string command_line_text(const std::vector<std::string>& command_line);
std::string hparams_yaml(const TrainingArguments& arguments);

// One value of Megatron's arguments dump (Python's str()) as a YAML scalar.
std::string yaml_scalar(const std::string& python_text);

}  // namespace backend
