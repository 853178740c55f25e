// What a NeMo user compares, against what NeMo-Megatron-Launcher itself rendered (the "Drop-in
// for NeMo users" issue): four cases launched from NeMo's own conf trees (tests/data/nemo_23.07,
// nemo_23.08.02) with the overrides NeMo was run with, checked against NeMo's output
// (tests/data/nemo_expected/<case>/): <run>_hydra.yaml line for line, and in the sbatch script
// the #SBATCH lines, the exports and srun's options before the command. What differs by design
// is listed below, each with its reason, and checked to be exactly that.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/config/introspection.hpp"
#include "launcher/launch.hpp"
#include "quiet_logger.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using test_support::read_file;
using test_support::TemporaryDirectory;

namespace fs = std::filesystem;

namespace {

using test_support::kSourceDir;

const fs::path kData = kSourceDir / "tests/data";

struct ParityCase {
  std::string name;       // the directory under tests/data/nemo_expected
  std::string conf_tree;  // under tests/data
  std::string run;        // training.run.name
  std::vector<std::string> overrides;
};

const std::vector<ParityCase> kCases = {
    {"gpt3_126m", "nemo_23.07", "gpt3_126m", {"training=gpt3/126m"}},
    {"gpt3_5b", "nemo_23.07", "gpt3_5b", {"training=gpt3/5b"}},
    {"gpt3_126m_n2tp2", "nemo_23.07", "gpt3_126m",
     {"training=gpt3/126m", "training.trainer.num_nodes=2", "training.model.tensor_model_parallel_size=2"}},
    {"llama2_7b", "nemo_23.08.02", "llama2_7b", {"training=llama/llama2_7b"}},
};

// The differences that are by design (docs/launcher.md, "Compared with NeMo's scripts"):
// - srun's command: NeMo runs `bash -c "... python3 megatron_gpt_pretraining.py
//   --config-path=... --config-name=<run>_hydra.yaml"`; ours runs pretrain_gpt with Megatron's
//   flags. Only the options before the command are compared.
// - srun --output/--error: NeMo repeats the #SBATCH --output/--error files on srun; ours lets
//   the job step inherit the batch script's files (the same ones), since a second open by srun
//   truncates the file under Slurm's default JobFileAppend=0 and would drop what the batch
//   script wrote before srun (e.g. why the backend was not found).
const std::vector<std::string> kSrunOptionsNotRepeated = {"--output", "--error"};
// - CUDA_DEVICE_MAX_CONNECTIONS=1 (tensor parallel): NeMo puts it before python inside bash -c,
//   ours exports it in the script, before srun, which passes it to every task: the same value
//   reaches the same processes.
const std::string kExportedNotPrefixed = "CUDA_DEVICE_MAX_CONNECTIONS";
// - The ranks' meeting (docs/parallelism.md): NeMo's PyTorch Lightning derives MASTER_ADDR and
//   MASTER_PORT from Slurm's variables in Python, ours exports them in the script from the same
//   variables; and ours starts srun under PMIx where `srun --mpi=list` has it (the word below),
//   so that the tasks join MPI.
const std::vector<std::string> kRendezvousExports = {"export MASTER_ADDR", "export MASTER_PORT="};
const std::string kSrunMpiWord = R"(${srun_mpi:+"$srun_mpi"})";
// - The script's comments and its body around srun (header comment, set -euo pipefail,
//   mkdir/cd, the check that the backend exists) are ours; they are not compared.

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> lines_starting_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> selected;
  for (const auto& line : lines_of(text)) {
    if (line.starts_with(prefix)) selected.push_back(line);
  }
  return selected;
}

std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> result;
  std::istringstream in(line);
  for (std::string word; in >> word;) result.push_back(word);
  return result;
}

// srun's words up to the command it runs (`stop` is the command's first word).
std::vector<std::string> srun_options(const std::string& script, const std::string& stop) {
  const auto srun_lines = lines_starting_with(script, "srun ");
  REQUIRE(srun_lines.size() == 1);
  std::vector<std::string> options;
  const auto all = words(srun_lines[0]);
  for (size_t i = 1; i < all.size() && all[i] != stop; ++i) options.push_back(all[i]);
  return options;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

using test_support::QuietLogger;

// Launches one case with --dry-run and returns its results directory's files with the
// absolute paths replaced by NeMo's placeholders.
struct Rendered {
  std::string hydra_yaml;
  std::string whole_config;
  std::string script;
};

Rendered render_case(const ParityCase& parity, const fs::path& root) {
  const fs::path scripts = root / "launcher_scripts";
  const fs::path data = root / "data";
  const fs::path results = root / "results";
  fs::create_directories(scripts);
  QuietLogger quiet;
  launcher::MainOptions options;
  options.conf_dir = kData / parity.conf_tree / "conf";
  options.overrides = {"stages=[training]", "cluster_type=bcm",
                       "launcher_scripts_path=" + scripts.string(), "data_dir=" + data.string(),
                       "base_results_dir=" + results.string()};
  options.overrides.insert(options.overrides.end(), parity.overrides.begin(), parity.overrides.end());
  options.dry_run = true;
  options.command_line = "launcher main --dry-run";
  std::ostringstream terminal;
  REQUIRE(launcher::launch_main(options, terminal) == 0);
  auto placeholders = [&](std::string text) {
    text = replace_all(std::move(text), scripts.string(), "@LAUNCHER_SCRIPTS_PATH@");
    text = replace_all(std::move(text), data.string(), "@DATA_DIR@");
    return replace_all(std::move(text), results.string(), "@BASE_RESULTS_DIR@");
  };
  const fs::path run_dir = results / parity.run;
  return {placeholders(read_file(run_dir / (parity.run + "_hydra.yaml"))),
          placeholders(read_file(run_dir / (parity.run + "_launcher_config.yaml"))),
          placeholders(read_file(run_dir / ("nemo-megatron-" + parity.run + "_submission.sh")))};
}

struct ScopedNoTemplatesOverride {
  std::optional<std::string> previous;
  ScopedNoTemplatesOverride() {
    if (const char* value = std::getenv("LAUNCHER_TEMPLATES_DIR")) previous = value;
    unsetenv("LAUNCHER_TEMPLATES_DIR");
  }
  ~ScopedNoTemplatesOverride() {
    if (previous) setenv("LAUNCHER_TEMPLATES_DIR", previous->c_str(), 1);
  }
};

}  // namespace

TEST_CASE("NeMo's four cases render as NeMo rendered them: <run>_hydra.yaml, #SBATCH, exports, srun") {
  const ScopedNoTemplatesOverride templates_from_the_checkout;
  for (const auto& parity : kCases) {
    CAPTURE(parity.name);
    TemporaryDirectory temporary;
    const Rendered ours = render_case(parity, temporary.path);
    const fs::path expected_dir = kData / "nemo_expected" / parity.name;

    // <run>_hydra.yaml: the training section, resolved, exactly as NeMo wrote it (this used to
    // be the whole composed config). Line by line first, so a failure names the first line.
    const std::string nemo_yaml = read_file(expected_dir / (parity.run + "_hydra.yaml"));
    REQUIRE_FALSE(nemo_yaml.empty());
    const auto our_lines = lines_of(ours.hydra_yaml);
    const auto nemo_lines = lines_of(nemo_yaml);
    for (size_t i = 0; i < std::min(our_lines.size(), nemo_lines.size()); ++i) {
      if (our_lines[i] != nemo_lines[i]) {
        CAPTURE(i + 1);
        CHECK(our_lines[i] == nemo_lines[i]);
        break;
      }
    }
    CHECK(our_lines.size() == nemo_lines.size());
    CHECK(ours.hydra_yaml == nemo_yaml);
    // The whole config is kept beside it, under its own name.
    CHECK(ours.whole_config.find("\ntraining:\n  run:\n    name: " + parity.run + "\n") != std::string::npos);
    CHECK(ours.whole_config.find("cluster_type: bcm\n") != std::string::npos);

    const std::string nemo_script =
        read_file(expected_dir / ("nemo-megatron-" + parity.run + "_submission.sh"));
    REQUIRE_FALSE(nemo_script.empty());

    // #SBATCH: the same lines in the same order.
    CHECK(lines_starting_with(ours.script, "#SBATCH ") == lines_starting_with(nemo_script, "#SBATCH "));

    // Exports: NeMo's, plus CUDA_DEVICE_MAX_CONNECTIONS where NeMo sets it on its command.
    auto our_exports = lines_starting_with(ours.script, "export ");
    const std::string prefixed = kExportedNotPrefixed + "=1";
    const bool nemo_prefixes = nemo_script.find(" " + prefixed + " ") != std::string::npos;
    const auto exported = std::find(our_exports.begin(), our_exports.end(), "export " + prefixed);
    CHECK(nemo_prefixes == (exported != our_exports.end()));
    if (exported != our_exports.end()) our_exports.erase(exported);
    for (const auto& rendezvous : kRendezvousExports) {
      CHECK(std::erase_if(our_exports, [&](const std::string& line) {
              return line.starts_with(rendezvous);
            }) == 1);
    }
    CHECK(our_exports == lines_starting_with(nemo_script, "export "));

    // srun's options before the command: NeMo's, less --output/--error, which ours leaves to
    // the #SBATCH lines (checked above to name the same files).
    std::vector<std::string> nemo_srun = srun_options(nemo_script, "bash");
    for (const auto& option : kSrunOptionsNotRepeated) {
      const auto at = std::find(nemo_srun.begin(), nemo_srun.end(), option);
      REQUIRE(at != nemo_srun.end());
      const std::string file = *(at + 1);
      CHECK(ours.script.find("#SBATCH " + option + "=" + file + "\n") != std::string::npos);
      nemo_srun.erase(at, at + 2);
    }
    const auto our_command_words = words(lines_starting_with(ours.script, "srun ").at(0));
    const auto program = std::find_if(our_command_words.begin(), our_command_words.end(),
                                      [](const std::string& word) { return word.ends_with("/pretrain_gpt"); });
    REQUIRE(program != our_command_words.end());
    std::vector<std::string> our_srun = srun_options(ours.script, *program);
    REQUIRE(!our_srun.empty());
    CHECK(our_srun.front() == kSrunMpiWord);
    our_srun.erase(our_srun.begin());
    CHECK(our_srun == nemo_srun);
  }
}

TEST_CASE("--help lists NeMo's config groups as Hydra does: training/llama: llama1_13b, ...") {
  // Regression: the groups were listed as "training: llama/llama2_7b".
  const std::string groups = launcher::format_config_groups(kData / "nemo_23.08.02/conf");
  CHECK(groups.find("training/llama: llama1_13b, llama1_30b, llama1_65b, llama1_7b, llama2_13b, "
                    "llama2_70b, llama2_7b\n") != std::string::npos);
  CHECK(groups.find("cluster: bcm\n") != std::string::npos);
  CHECK(groups.find("quality_filtering/heuristic: english\n") != std::string::npos);
  CHECK(groups.find("training:") == std::string::npos);
}
