// launcher: NeMo-Megatron-Launcher's `python main.py ...`, native, with Hydra 1.3's command
// line around it:
//   launcher main training=gpt3/126m training.trainer.max_steps=10 [--dry-run]
//   launcher main -m training.model.micro_batch_size=1,2,4     one job per value (multirun)
//   launcher main --cfg job|hydra|all [--resolve] [--package P] print the composed config
//   launcher main --info defaults                               print the final defaults list
//   launcher main --help                                        flags, config groups, config
//   launcher status [run ...]      the jobs launched into results dirs and their scheduler state
//   launcher logs <run> [-f]       the newest job log of a run (followed with -f)
//   launcher report <run> ...      benchmark-mode results of runs as one table
//   launcher report <run> ... --html out.html   plots of the runs' training as one HTML page
//   launcher autoconfig model=gpt3/5b cluster.nodes=16 ...   NeMo's auto-configurator: search
//                                  layouts, benchmark the survivors, write the fastest config
// Every user error ends in one clear message and exit status 2, never a stack dump.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <string_view>

#include "backend/common/error.hpp"
#include "backend/common/logging.hpp"
#include "launcher/autoconfig/autoconfig.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/introspection.hpp"
#include "launcher/config/launcher_scripts_path.hpp"
#include "launcher/config/overrides.hpp"
#include "launcher/config/sweep.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/scalar_text.hpp"
#include "launcher/html_report.hpp"
#include "launcher/launch.hpp"
#include "launcher/run_report.hpp"
#include "launcher/run_status.hpp"
#include "launcher/shell_quote.hpp"

namespace {

struct ShowOptions {
  std::string cfg;       // --cfg job|hydra|all
  bool resolve = false;  // --resolve
  std::string package;   // --package
  std::string info;      // --info defaults
  bool multirun = false;
};

// The text after CLI11's usage in --help: config groups (and, for `main`, the config), as
// Hydra's app help shows them. The conf dir is looked up the way `launcher main` does.
std::string help_footer(const std::string& config_dir, const std::vector<std::string>& overrides,
                        bool show_config, bool resolve) {
  std::filesystem::path conf_dir;
  try {
    conf_dir = launcher::find_conf_dir(
        config_dir.empty() ? std::nullopt : std::optional<std::filesystem::path>(config_dir));
  } catch (const common::Error& error) {
    return fmt::format("== Configuration groups ==\n(config groups not listed: {})", error.what());
  }
  std::string text = launcher::format_app_help(conf_dir, overrides, show_config, resolve);
  if (text.ends_with('\n')) text.pop_back();  // CLI11 ends the footer with a newline
  return text;
}

// --cfg and --info: compose, print, launch nothing.
int show(const launcher::MainOptions& options, const ShowOptions& show_options) {
  // The same composition `launcher main` launches, cluster group choice included.
  const launcher::LaunchComposition launch = launcher::compose_for_launch(options);
  const launcher::ComposedConfig& composed = launch.composed;
  if (!show_options.info.empty()) {
    std::cout << launcher::format_defaults_list(composed.defaults);
    return 0;
  }
  std::cout << launcher::format_config(composed, launcher::parse_config_section(show_options.cfg),
                                       show_options.resolve, show_options.package);
  return 0;
}

// -m: one launch_main per combination of the sweeps, job k writing into <results_dir>/<k>.
int multirun(const launcher::MainOptions& options) {
  const auto jobs = launcher::expand_sweeps(options.overrides);
  auto launch_job = [&options](const std::vector<std::string>& overrides, std::size_t number) {
    launcher::MainOptions job = options;
    job.overrides = overrides;
    job.job_number = number;
    // launch_main adds the job's launcher.log to the logger; the next job must not write there.
    struct RestoreSinks {
      std::vector<spdlog::sink_ptr> saved = spdlog::default_logger()->sinks();
      ~RestoreSinks() { spdlog::default_logger()->sinks() = saved; }
    } restore_sinks;
    return launcher::launch_main(job, std::cout);
  };
  return launcher::run_sweep(jobs, launch_job, std::cout);
}

// base_results_dir of the default config: where `status`, `logs` and `report` look up run names.
std::filesystem::path default_base_results_dir(const std::string& config_dir) {
  const std::filesystem::path conf_dir = launcher::find_conf_dir(
      config_dir.empty() ? std::nullopt : std::optional<std::filesystem::path>(config_dir));
  launcher::ComposedConfig composed = launcher::compose({conf_dir, "config", {}});
  launcher::fill_launcher_scripts_path(composed.config, conf_dir);
  const launcher::Node config =
      launcher::resolve(composed.config, launcher::ResolveContext{composed.choices});
  return launcher::scalar_text(launcher::at_path(config, "base_results_dir"), "base_results_dir");
}

void check_flag_combinations(const ShowOptions& show_options) {
  const int commands = static_cast<int>(!show_options.cfg.empty()) +
                       static_cast<int>(!show_options.info.empty()) +
                       static_cast<int>(show_options.multirun);
  if (commands > 1) common::fail("only one of --multirun, --cfg and --info can be given");
  if (!show_options.cfg.empty()) launcher::parse_config_section(show_options.cfg);
  if (show_options.resolve && show_options.cfg.empty()) {
    common::fail("--resolve is used with --cfg (or --help) only");
  }
  if (!show_options.package.empty() && show_options.cfg.empty()) {
    common::fail("--package is used with --cfg only");
  }
  if (!show_options.info.empty() && show_options.info != "defaults") {
    common::fail(
        "--info {}: only 'defaults' is available (Hydra's all, config, defaults-tree, "
        "plugins and searchpath are not)",
        show_options.info);
  }
}

}  // namespace

int main(int argc, char** argv) {
  common::setup_logging("launcher");
  CLI::App app{"Compose configs, render job scripts and submit GPT pretraining jobs", "launcher"};
  app.set_version_flag("--version", PROJECT_VERSION_STRING);
  app.require_subcommand(1);

  launcher::MainOptions options;
  ShowOptions show_options;
  std::string config_dir;
  auto* main_command = app.add_subcommand("main", "Compose the config and launch its stages");
  main_command->add_option("overrides", options.overrides,
                           "Hydra-style overrides: group=option, a.b=value; with -m, a=1,2 or "
                           "a=range(1,4) sweeps");
  main_command->add_flag("--dry-run", options.dry_run, "Write scripts and configs, submit nothing");
  main_command->add_option("--config-dir", config_dir, "Directory holding config.yaml");
  main_command->add_flag("-m,--multirun", show_options.multirun,
                         "Launch one job per combination of the sweep overrides");
  main_command->add_option("-c,--cfg", show_options.cfg,
                           "Print the composed config (job, hydra or all) and exit");
  main_command->add_flag("--resolve", show_options.resolve,
                         "With --cfg or --help: resolve interpolations first");
  main_command->add_option("-p,--package", show_options.package,
                           "With --cfg: print only this subtree (a dotted path)");
  main_command->add_option("-i,--info", show_options.info,
                           "Print information and exit: defaults (the final defaults list)");
  std::vector<std::string> runs;
  bool follow = false;
  std::string html_output;
  auto* status_command = app.add_subcommand(
      "status", "List the jobs launched into results directories and their scheduler state");
  status_command->add_option("runs", runs,
                             "Run names under base_results_dir, or results directories (none: all)");
  status_command->add_option("--config-dir", config_dir, "Directory holding config.yaml");
  auto* logs_command = app.add_subcommand("logs", "Print the newest job log of a run");
  logs_command->add_option("run", runs, "Run name under base_results_dir, or results directory")
      ->required()->expected(1);
  logs_command->add_flag("-f,--follow", follow, "Keep printing as the log grows");
  logs_command->add_option("--config-dir", config_dir, "Directory holding config.yaml");
  auto* report_command = app.add_subcommand(
      "report",
      "Benchmark-mode results (results/benchmark.json) of runs as one table, or with --html "
      "one page of plots of their training");
  report_command->add_option("runs", runs, "Run names under base_results_dir, or directories")
      ->required();
  report_command->add_option("--config-dir", config_dir, "Directory holding config.yaml");
  auto* html_option = report_command->add_option("--html", html_output,
                             "Write one self-contained HTML page with plots of the runs' "
                             "TensorBoard scalars (or job log lines), layout, config diff and "
                             "job states");
  launcher::AutoconfigOptions autoconfig_options;
  auto* autoconfig_command = app.add_subcommand(
      "autoconfig",
      "Search tensor/pipeline/micro-batch/recompute layouts, benchmark those that fit and write "
      "the fastest as a training config (NeMo's auto-configurator)");
  autoconfig_command->add_option(
      "settings", autoconfig_options.arguments,
      "model=<training config>, cluster.nodes, cluster.gpus_per_node, cluster.gpu_memory_gb, "
      "tensor_parallel_sizes, pipeline_parallel_sizes, virtual_pipeline_sizes, micro_batch_sizes, "
      "recompute, distributed_optimizer (auto or [lists]), min_/max_model_parallel_size, "
      "max_steps_per_run, max_minutes_per_run, limit_search_runs; other key=value are config "
      "overrides given to every candidate (docs/launcher.md)");
  autoconfig_command->add_flag("--dry-run", autoconfig_options.dry_run,
                               "Only enumerate and prune: write the candidate table, run nothing");
  autoconfig_command->add_option("--save-as", autoconfig_options.save_as,
                                 "Also write the best config as conf/training/NAME.yaml");
  autoconfig_command->add_option("--config-dir", config_dir, "Directory holding config.yaml");
  app.footer([&config_dir] { return help_footer(config_dir, {}, false, false); });
  main_command->footer([&config_dir, &options, &show_options] {
    return help_footer(config_dir, options.overrides, true, show_options.resolve);
  });

  try {
    // CLI11 takes a bare "++" for the end of a subcommand's arguments and drops it (or refuses
    // what follows it); in Hydra's grammar it is an override without a key, an error.
    for (int i = 1; i < argc; ++i) {
      if (std::string_view(argv[i]) == "++") (void)launcher::parse_override(argv[i]);
    }
  } catch (const common::Error& error) {
    spdlog::error("{}", error.what());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // CLI11 prints its message (or the help, or the version: status 0); a usage error is a
    // user error like any other, status 2, not CLI11's own codes (106, 109, ...).
    return app.exit(error) == 0 ? 0 : 2;
  }
  try {
    std::vector<std::string> words(argv, argv + argc);
    options.command_line = launcher::shell_join(words);
    if (!config_dir.empty()) options.conf_dir = config_dir;
    if (const char* debug = std::getenv("LAUNCHER_DEBUG"); debug && std::string(debug) == "1") {
      options.dry_run = true;
    }
    if (html_option->count() > 0 && html_output.empty()) {
      common::fail("--html: the output file name is empty (give one, e.g. --html report.html)");
    }
    if (status_command->parsed() || logs_command->parsed() || report_command->parsed()) {
      const std::filesystem::path base = default_base_results_dir(config_dir);
      std::vector<std::filesystem::path> run_dirs;
      // The HTML report needs only event files or job logs, no job records.
      if (html_output.empty()) {
        for (const auto& run : runs) run_dirs.push_back(launcher::resolve_run_dir(run, base));
      }
      if (status_command->parsed()) {
        if (run_dirs.empty()) run_dirs = launcher::find_run_dirs(base);
        if (run_dirs.empty()) common::fail("no runs with job records under {}", base.string());
        launcher::print_status(run_dirs, std::cout);
        return 0;
      }
      if (logs_command->parsed()) return launcher::print_logs(run_dirs.front(), follow, std::cout);
      if (!html_output.empty()) {
        std::vector<std::filesystem::path> directories;
        for (const auto& run : runs) {
          const std::filesystem::path direct(run);
          std::error_code error;
          directories.push_back(std::filesystem::exists(direct, error) ? direct : base / run);
        }
        launcher::write_html_report(directories, html_output);
        spdlog::info("wrote {}", html_output);
        return 0;
      }
      std::vector<std::filesystem::path> files;
      for (const auto& run : runs) {
        const std::filesystem::path direct(run);
        std::error_code error;
        files.push_back(launcher::find_benchmark_file(
            std::filesystem::exists(direct, error) ? direct : base / run));
      }
      launcher::print_report(files, std::cout);
      return 0;
    }
    if (autoconfig_command->parsed()) {
      autoconfig_options.command_line = options.command_line;
      if (!config_dir.empty()) autoconfig_options.conf_dir = config_dir;
      return launcher::run_autoconfig(autoconfig_options, std::cout);
    }
    check_flag_combinations(show_options);
    if (!show_options.cfg.empty() || !show_options.info.empty()) return show(options, show_options);
    if (show_options.multirun) return multirun(options);
    return launcher::launch_main(options, std::cout);
  } catch (const common::Error& error) {
    spdlog::error("{}", error.what());
    return 2;
  } catch (const std::exception& error) {
    spdlog::critical("internal error (please report): {}", error.what());
    return 3;
  }
}
