// launcher: NeMo-Megatron-Launcher's `python main.py ...`, native.
//   launcher main training=gpt3/126m training.trainer.max_steps=10 [--dry-run]
// Every user error ends in one clear message and exit status 2, never a stack dump.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <iostream>

#include "backend/common/error.hpp"
#include "backend/common/logging.hpp"
#include "launcher/launch.hpp"
#include "launcher/shell_quote.hpp"

int main(int argc, char** argv) {
  common::setup_logging("launcher");
  CLI::App app{"Compose configs, render job scripts and submit GPT pretraining jobs", "launcher"};
  app.set_version_flag("--version", PROJECT_VERSION_STRING);
  app.require_subcommand(1);

  launcher::MainOptions options;
  std::string config_dir;
  auto* main_command = app.add_subcommand("main", "Compose the config and launch its stages");
  main_command->add_option("overrides", options.overrides,
                           "Hydra-style overrides: group=option, a.b=value");
  main_command->add_flag("--dry-run", options.dry_run, "Write scripts and configs, submit nothing");
  main_command->add_option("--config-dir", config_dir, "Directory holding config.yaml");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  try {
    std::vector<std::string> words(argv, argv + argc);
    options.command_line = launcher::shell_join(words);
    if (!config_dir.empty()) options.conf_dir = config_dir;
    if (const char* debug = std::getenv("LAUNCHER_DEBUG"); debug && std::string(debug) == "1") {
      options.dry_run = true;
    }
    return launcher::launch_main(options, std::cout);
  } catch (const common::Error& error) {
    spdlog::error("{}", error.what());
    return 2;
  } catch (const std::exception& error) {
    spdlog::critical("internal error (please report): {}", error.what());
    return 3;
  }
}
