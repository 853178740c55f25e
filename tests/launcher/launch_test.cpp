// `launcher main` end to end in-process (launch_main, --dry-run): what NeMo users meet first
// when they bring their habits or their conf tree (the "Drop-in for NeMo users" issue): env_vars
// of every type, unique_output_dir within one second, templates found without a templates/
// beside the conf tree, and NeMo's stage names.
#include "launcher/launch.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/results_dir.hpp"
#include "launcher/stages/stage.hpp"
#include "quiet_logger.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::kSourceDir;

const fs::path kNemo2307Conf = kSourceDir / "tests/data/nemo_23.07/conf";

using test_support::QuietLogger;

// Sets an environment variable for one test, restoring what was there.
struct ScopedEnvironment {
  std::string name;
  std::optional<std::string> previous;
  ScopedEnvironment(std::string variable, const std::optional<std::string>& value)
      : name(std::move(variable)) {
    if (const char* old = std::getenv(name.c_str())) previous = old;
    if (value) {
      setenv(name.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
  ~ScopedEnvironment() {
    if (previous) {
      setenv(name.c_str(), previous->c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
};

// A --dry-run launch of `conf` (the checkout's conf/ unless given) with the overrides.
void launch_dry(std::vector<std::string> overrides, std::optional<fs::path> conf = std::nullopt) {
  QuietLogger quiet;
  launcher::MainOptions options;
  options.overrides = std::move(overrides);
  options.conf_dir = conf ? *conf : kSourceDir / "conf";
  options.dry_run = true;
  options.command_line = "launcher main --dry-run";
  std::ostringstream terminal;
  CHECK(launcher::launch_main(options, terminal) == 0);
}

// The small training run every launch here uses, into `results`.
std::vector<std::string> small_training(const fs::path& results, const std::string& cluster_type) {
  return {"training=gpt3/126m", "base_results_dir=" + results.string(),
          "cluster_type=" + cluster_type, "training.trainer.max_steps=1"};
}

std::string read_text(const fs::path& path) { return test_support::read_file(path); }

}  // namespace

TEST_CASE("env_vars that are not strings are exported as their plain text, on one line") {
  // Before: to_yaml of the value, which ends in a newline: export OMP_NUM_THREADS='4⏎'.
  for (const std::string cluster_type : {"local", "bcm", "pbs"}) {
    INFO(cluster_type);
    test_support::TemporaryDirectory results;
    auto overrides = small_training(results.path, cluster_type);
    overrides.insert(overrides.end(), {"env_vars.OMP_NUM_THREADS=4", "++env_vars.RATIO=0.5",
                                       "++env_vars.SMALL=1e-5", "++env_vars.ENABLED=true",
                                       "++env_vars.TEXT=two words"});
    launch_dry(overrides);
    const fs::path run = results.path / "gpt3_126m";
    const std::string prefix = cluster_type == "bcm" ? "nemo-megatron-" : "";
    const std::string script = read_text(run / (prefix + "gpt3_126m_submission.sh"));
    CHECK(script.find("export OMP_NUM_THREADS=4\n") != std::string::npos);
    CHECK(script.find("export RATIO=0.5\n") != std::string::npos);
    CHECK(script.find("export SMALL=1e-05\n") != std::string::npos);
    CHECK(script.find("export ENABLED=true\n") != std::string::npos);
    CHECK(script.find("export TEXT='two words'\n") != std::string::npos);
  }
}

TEST_CASE("unique_output_dir: launches within one second get a directory each") {
  // Before: results-<timestamp to the second>, so these three launches shared one directory.
  test_support::TemporaryDirectory results;
  auto overrides = small_training(results.path, "local");
  overrides.push_back("unique_output_dir=true");
  for (int launch = 0; launch < 3; ++launch) launch_dry(overrides);
  std::set<std::string> directories;
  for (const auto& entry : fs::directory_iterator(results.path)) {
    INFO(entry.path().string());
    CHECK(entry.path().filename().string().starts_with("results-"));
    CHECK(fs::is_regular_file(entry.path() / "gpt3_126m/gpt3_126m_submission.sh"));
    directories.insert(entry.path().filename().string());
  }
  // One timestamp per launcher process (a multirun's jobs share it), so here the same name
  // three times over: the first as it is, the others with the next free suffix.
  REQUIRE(directories.size() == 3);
  const std::string first = *directories.begin();
  CHECK(directories == std::set<std::string>{first, first + "-1", first + "-2"});

  // A refused launch leaves no reserved directory behind.
  auto refused = overrides;
  refused.push_back("training.model.num_layers=7");  // refused by the preflight: 7 layers,
  refused.push_back("training.model.pipeline_model_parallel_size=2");  // 2 pipeline stages
  {
    QuietLogger quiet;
    launcher::MainOptions options;
    options.overrides = refused;
    options.conf_dir = kSourceDir / "conf";
    options.dry_run = true;
    std::ostringstream terminal;
    CHECK_THROWS_AS(launcher::launch_main(options, terminal), common::Error);
  }
  CHECK(std::distance(fs::directory_iterator(results.path), fs::directory_iterator()) == 3);
}

TEST_CASE("create_unique_directory: racing launchers never share a directory") {
  test_support::TemporaryDirectory root;
  const fs::path wanted = root.path / "base/results-2026-11-26_23-50-00";
  constexpr int kLaunchers = 8;
  std::vector<fs::path> created(kLaunchers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kLaunchers; ++i) {
    threads.emplace_back([&, i] { created[i] = launcher::create_unique_directory(wanted, "key"); });
  }
  for (auto& thread : threads) thread.join();
  const std::set<fs::path> distinct(created.begin(), created.end());
  CHECK(distinct.size() == kLaunchers);
  CHECK(distinct.contains(wanted));
  CHECK(distinct.contains(wanted.string() + "-7"));
}

TEST_CASE("templates come with the launcher: a NeMo conf tree without templates/ renders") {
  // NeMo's own tree (tests/data/nemo_23.07/conf; launcher_scripts_path ??? is its parent, which
  // has no templates/). Before: "launcher_scripts_path=...: no templates/ directory there".
  const ScopedEnvironment no_override("LAUNCHER_TEMPLATES_DIR", std::nullopt);
  test_support::TemporaryDirectory results;
  launch_dry({"stages=[training]", "base_results_dir=" + results.path.string()}, kNemo2307Conf);
  const std::string script =
      read_text(results.path / "gpt3_5b/nemo-megatron-gpt3_5b_submission.sh");
  CHECK(script.find("#SBATCH --nodes=16") != std::string::npos);
  CHECK(launcher::find_templates_dir(kSourceDir / "tests/data/nemo_23.07") ==
        fs::weakly_canonical(kSourceDir / "templates"));
  // launcher_scripts_path with a templates/ of its own (a checkout) keeps using it.
  CHECK(launcher::find_templates_dir(kSourceDir) == kSourceDir / "templates");
}

TEST_CASE("LAUNCHER_TEMPLATES_DIR chooses the templates explicitly, and must hold them") {
  test_support::TemporaryDirectory templates;
  for (const char* name : {"local.sh.mustache", "bcm.sbatch.mustache", "pbs.pbs.mustache"}) {
    std::ofstream(templates.path / name)
        << read_text(kSourceDir / "templates" / name) << "# from LAUNCHER_TEMPLATES_DIR\n";
  }
  {
    const ScopedEnvironment chosen("LAUNCHER_TEMPLATES_DIR", templates.path.string());
    test_support::TemporaryDirectory results;
    launch_dry(small_training(results.path, "local"));
    CHECK(read_text(results.path / "gpt3_126m/gpt3_126m_submission.sh")
              .ends_with("# from LAUNCHER_TEMPLATES_DIR\n"));
  }
  test_support::TemporaryDirectory empty;
  const ScopedEnvironment wrong("LAUNCHER_TEMPLATES_DIR", empty.path.string());
  CHECK_THROWS_WITH_AS(launcher::find_templates_dir(kSourceDir),
                       doctest::Contains(("LAUNCHER_TEMPLATES_DIR=" + empty.path.string() +
                                          ": the launcher's templates").c_str()),
                       common::Error);
}

TEST_CASE("NeMo's stage names are known, and those not run here are refused saying why") {
  // NeMo 23.07's own default stages: training, conversion, evaluation, export. Before: "'export'
  // is not a stage" with no reason.
  test_support::TemporaryDirectory results;
  QuietLogger quiet;
  launcher::MainOptions options;
  options.conf_dir = kNemo2307Conf;
  options.overrides = {"base_results_dir=" + results.path.string()};
  options.dry_run = true;
  std::ostringstream terminal;
  CHECK_THROWS_WITH_AS(
      launcher::launch_main(options, terminal),
      doctest::Contains("stages: 'export' is a NeMo-Megatron-Launcher stage that this launcher "
                        "does not run: in NeMo it exports a .nemo model for Triton Inference "
                        "Server"),
      common::Error);
  CHECK(fs::is_empty(results.path));  // refused before anything was written
  options.overrides.push_back("stages=[training,fine_tuning]");
  CHECK_THROWS_WITH_AS(launcher::launch_main(options, terminal),
                       doctest::Contains("Instead: pretrain_gpt --load <checkpoint dir> --finetune "
                                         "--data-path"),
                       common::Error);
  options.overrides.back() = "stages=[trainig]";
  CHECK_THROWS_WITH_AS(launcher::launch_main(options, terminal),
                       doctest::Contains("'trainig' is not a stage (valid: data_preparation, training, "
                                         "conversion, evaluation; NeMo's other stages"),
                       common::Error);

  // Every stage of NeMo 23.07's and 23.08.02's config.yaml and conf trees, and of its later
  // main.py, is in the table; each not run here says what to use instead.
  for (const char* name : {"data_preparation", "training", "conversion", "evaluation", "export",
                           "fine_tuning", "peft", "prompt_learning", "adapter_learning",
                           "ia3_learning", "rlhf_rm", "rlhf_ppo", "quality_filtering",
                           "fw_inference", "conversion_hf2nemo", "external_conversion",
                           "data_curation", "steerlm_reg"}) {
    INFO(name);
    const auto& table = launcher::nemo_stages();
    const auto found = std::find_if(table.begin(), table.end(),
                                    [&](const auto& entry) { return entry.name == name; });
    REQUIRE(found != table.end());
    const bool runs = std::find(launcher::known_stages().begin(), launcher::known_stages().end(),
                                name) != launcher::known_stages().end();
    CHECK(found->runs_here == runs);
    if (!runs) {
      CHECK_THROWS_WITH_AS(launcher::check_stage_names({"training", name}),
                           doctest::Contains((std::string("without '") + name +
                                              "': stages=[training]").c_str()),
                           common::Error);
    }
  }
}

TEST_CASE("docs/launcher.md's table of NeMo's stages is the code's") {
  // Backticks (code spans in the docs) aside, each row holds the code's text.
  std::string docs = read_text(kSourceDir / "docs/launcher.md");
  std::erase(docs, '`');
  for (const auto& stage : launcher::nemo_stages()) {
    INFO(stage.name);
    const std::string row = fmt::format("| {} | {} | {} |", stage.name, stage.in_nemo, stage.here);
    CHECK(docs.find(row) != std::string::npos);
  }
}

TEST_CASE("our own conf/cluster/bcm.yaml asks for GPUs once, with --gpus-per-node as NeMo's") {
  // Regression: conf/cluster/bcm.yaml had gres: gpu:8 beside gpus_per_node: 8, so the script
  // had --gres=gpu:8 as well; NeMo's bcm.yaml has no gres, and NeMo writes --gres only when set.
  const ScopedEnvironment no_override("LAUNCHER_TEMPLATES_DIR", std::nullopt);
  test_support::TemporaryDirectory results;
  launch_dry({"training=gpt3/126m", "cluster_type=bcm", "container=nvcr.io/nvidia/nemo:24.01",
              "base_results_dir=" + results.path.string()});
  const std::string script = read_text(results.path / "gpt3_126m/nemo-megatron-gpt3_126m_submission.sh");
  CHECK(script.find("#SBATCH --gpus-per-node=8\n") != std::string::npos);
  CHECK(script.find("--gres") == std::string::npos);
  CHECK(script.find(" --no-container-mount-home ") != std::string::npos);
}
