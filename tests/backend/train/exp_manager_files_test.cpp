// NeMo exp_manager's cmd-args.log and hparams.yaml in --log-dir.
#include <doctest/doctest.h>

#include "temporary_directory.hpp"

#include <fstream>
#include <sstream>

#include "backend/train/exp_manager_files.hpp"
#include "test_files.hpp"

using namespace backend;

namespace {
}  // namespace

TEST_CASE("the arguments dump's Python spellings become YAML scalars of the same type") {
  CHECK(yaml_scalar("True") == "true");
  CHECK(yaml_scalar("False") == "false");
  CHECK(yaml_scalar("None") == "null");
  CHECK(yaml_scalar("42") == "42");
  CHECK(yaml_scalar("-3") == "-3");
  CHECK(yaml_scalar("0.001") == "0.001");
  CHECK(yaml_scalar("1e-05") == "1.0e-05");  // PyYAML (YAML 1.1) needs the dot to see a float
  CHECK(yaml_scalar("6.5e+20") == "6.5e+20");
  CHECK(yaml_scalar("inf") == ".inf");
  CHECK(yaml_scalar("cosine") == "\"cosine\"");
  CHECK(yaml_scalar("a \"b\"\\c") == "\"a \\\"b\\\"\\\\c\"");
  CHECK(yaml_scalar("['16', '16', '1000']") == "['16', '16', '1000']");
}

TEST_CASE("--log-dir gets NeMo's cmd-args.log and a sorted hparams.yaml") {
  test_support::TemporaryDirectory temporary;
  TrainingArguments a;
  a.command_line = {"/opt/bin/pretrain_gpt", "--num-layers", "2", "--lr", "1e-4"};
  a.model.num_layers = 2;
  a.optimizer.lr = 1e-4;
  a.optimizer.lr_decay_style = backend::LearningRateDecayStyle::cosine;
  write_exp_manager_files(temporary.path / "results", a);
  // NeMo: " ".join(sys.argv), no newline
  CHECK(test_support::read_file(temporary.path / "results" / "cmd-args.log") ==
        "/opt/bin/pretrain_gpt --num-layers 2 --lr 1e-4");
  const std::string yaml = test_support::read_file(temporary.path / "results" / "hparams.yaml");
  CHECK(yaml.find("num_layers: 2\n") != std::string::npos);
  CHECK(yaml.find("lr: 0.0001\n") != std::string::npos);
  CHECK(yaml.find("lr_decay_style: \"cosine\"\n") != std::string::npos);
  CHECK(yaml.find("bf16: false\n") != std::string::npos);
  CHECK(yaml.find("tensorboard_dir: null\n") != std::string::npos);
  CHECK(yaml.find("adam_beta1:") < yaml.find("num_layers:"));  // sorted by name
}
