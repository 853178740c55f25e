// What `launcher main --cfg/--info/--help` print, compared with Hydra's output for the same
// conf tree, and the shared launcher_scripts_path rule.
#include "launcher/config/introspection.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>

#include "backend/common/error.hpp"
#include "launcher/config/launcher_scripts_path.hpp"
#include "launcher/config/yaml_io.hpp"

namespace fs = std::filesystem;
using launcher::ConfigSection;

namespace {

// A small conf tree in a fresh temporary directory, removed at the end of the test.
struct ConfTree {
  fs::path root;
  fs::path conf;
  ConfTree() {
    std::string pattern = (fs::temp_directory_path() / "introspection_XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    root = pattern;
    conf = root / "conf";
    write("config.yaml",
          "defaults:\n  - _self_\n  - db: mysql\n  - server: apache\n"
          "hydra:\n  run:\n    dir: out\n"
          "name: app\nflag: true\nrate: 1.0e-05\nwhere: ${launcher_scripts_path}/x\n"
          "launcher_scripts_path: ???\n");
    write("db/mysql.yaml", "driver: mysql\nport: 3306\nurl: ${.driver}://localhost:${.port}\n");
    write("db/postgresql.yaml", "driver: postgresql\nport: 5432\nurl: x\n");
    write("server/apache.yaml", "defaults:\n  - site: default\n  - _self_\nname: apache\n");
    write("server/site/default.yaml", "domain: example.com\n");
    write("hydra/launcher/fancy.yaml", "x: 1\n");
    fs::create_directories(conf / "empty_dir");
  }
  ~ConfTree() { fs::remove_all(root); }
  void write(const std::string& relative, const std::string& text) const {
    fs::create_directories((conf / relative).parent_path());
    std::ofstream(conf / relative) << text;
  }
  launcher::ComposedConfig compose(std::vector<std::string> overrides = {}) const {
    auto composed = launcher::compose({conf, "config", std::move(overrides)});
    launcher::fill_launcher_scripts_path(composed.config, conf);
    return composed;
  }
};

}  // namespace

TEST_CASE("--cfg job|hydra|all prints the composed config as Hydra's show_cfg does") {
  ConfTree tree;
  const auto composed = tree.compose({"db.port=1"});
  const std::string job = launcher::format_config(composed, ConfigSection::Job, false, "");
  CHECK(job ==
        "name: app\nflag: true\nrate: 1.0e-05\nwhere: ${launcher_scripts_path}/x\n"
        "launcher_scripts_path: " +
            tree.root.string() +
            "\n"
            "db:\n  driver: mysql\n  port: 1\n  url: ${.driver}://localhost:${.port}\n"
            "server:\n  site:\n    domain: example.com\n  name: apache\n");
  CHECK(launcher::format_config(composed, ConfigSection::Hydra, false, "") ==
        "hydra:\n  run:\n    dir: out\n");
  const std::string all = launcher::format_config(composed, ConfigSection::All, false, "");
  CHECK(all == "hydra:\n  run:\n    dir: out\n" + job);
  CHECK(launcher::format_config(composed, ConfigSection::Job, false, "_global_") == job);

  // --resolve resolves across the section before --package selects.
  const std::string resolved = launcher::format_config(composed, ConfigSection::Job, true, "");
  CHECK(resolved.find("where: " + tree.root.string() + "/x\n") != std::string::npos);
  CHECK(resolved.find("url: mysql://localhost:1\n") != std::string::npos);
  CHECK(resolved.find("${") == std::string::npos);
  CHECK(launcher::format_config(composed, ConfigSection::Job, true, "db") ==
        "# @package db\ndriver: mysql\nport: 1\nurl: mysql://localhost:1\n");
  CHECK(launcher::format_config(composed, ConfigSection::Job, false, "server.site") ==
        "# @package server.site\ndomain: example.com\n");
  CHECK(launcher::format_config(composed, ConfigSection::All, false, "hydra.run") ==
        "# @package hydra.run\ndir: out\n");
  // A scalar is printed alone, as Python's print() shows it.
  CHECK(launcher::format_config(composed, ConfigSection::Job, false, "flag") == "True\n");
  CHECK(launcher::format_config(composed, ConfigSection::Job, false, "rate") == "1e-05\n");
  CHECK(launcher::format_config(composed, ConfigSection::Job, false, "db.port") == "1\n");

  CHECK_THROWS_WITH_AS(launcher::format_config(composed, ConfigSection::Job, false, "db.prot"),
                       doctest::Contains("'db.prot' not found: key 'prot' does not exist in "
                                         "'db'. Did you mean 'port'?"),
                       common::Error);
  // `hydra` is not part of the job config.
  CHECK_THROWS_AS(launcher::format_config(composed, ConfigSection::Job, false, "hydra"),
                  common::Error);
}

TEST_CASE("--cfg job --resolve reports what cannot be resolved") {
  ConfTree tree;
  auto composed = launcher::compose({tree.conf, "config", {"db.url=${nowhere}"}});
  CHECK_THROWS_AS(launcher::format_config(composed, ConfigSection::Job, true, ""), common::Error);
  // Without --resolve the same config prints as written.
  CHECK(launcher::format_config(composed, ConfigSection::Job, false, "db.url") == "${nowhere}\n");
}

TEST_CASE("--cfg takes job, hydra or all") {
  CHECK(launcher::parse_config_section("job") == ConfigSection::Job);
  CHECK(launcher::parse_config_section("hydra") == ConfigSection::Hydra);
  CHECK(launcher::parse_config_section("all") == ConfigSection::All);
  CHECK_THROWS_WITH_AS(launcher::parse_config_section("jobs"),
                       "--cfg jobs: expected job (the config without hydra), hydra or all",
                       common::Error);
}

TEST_CASE("--info defaults prints Hydra's defaults list table") {
  ConfTree tree;
  const auto composed = tree.compose({"db=postgresql"});
  CHECK(launcher::format_defaults_list(composed.defaults) ==
        "\n"
        "Defaults List\n"
        "*************\n"
        "| Config path         | Package     | _self_ | Parent        | \n"
        "---------------------------------------------------------------\n"
        "| config              |             | True   | <root>        |\n"
        "| db/postgresql       | db          | False  | config        |\n"
        "| server/site/default | server.site | False  | server/apache |\n"
        "| server/apache       | server      | True   | config        |\n"
        "---------------------------------------------------------------\n");
}

TEST_CASE("config groups are listed as Hydra's help lists them, without Hydra's own") {
  ConfTree tree;
  // Nested groups by their full path, as Hydra's "Configuration groups" has them (this used to
  // be "server: apache, site/default").
  CHECK(launcher::format_config_groups(tree.conf) ==
        "db: mysql, postgresql\nserver: apache\nserver/site: default\n");
  CHECK(launcher::format_config_groups(tree.root / "nowhere").empty());
}

TEST_CASE("the --help text lists groups and the config, and says why when it cannot") {
  ConfTree tree;
  const std::string help = launcher::format_app_help(tree.conf, {"db.port=7"}, true, false);
  CHECK(
      help.starts_with("== Configuration groups ==\nCompose your configuration from those "
                       "groups (group=option)\n\ndb: mysql, postgresql\nserver: apache\n"
                       "server/site: default\n\n== Config ==\nOverride anything in the config "
                       "(foo.bar=value)\n\nname: app\n"));
  CHECK(help.find("  port: 7\n") != std::string::npos);
  CHECK(help.find("launcher_scripts_path: " + tree.root.string() + "\n") != std::string::npos);
  CHECK(help.find("hydra") == std::string::npos);

  const std::string resolved = launcher::format_app_help(tree.conf, {}, true, true);
  CHECK(resolved.find("url: mysql://localhost:3306\n") != std::string::npos);

  const std::string groups_only = launcher::format_app_help(tree.conf, {}, false, false);
  CHECK(groups_only.find("== Config ==") == std::string::npos);
  CHECK(groups_only.ends_with("server: apache\nserver/site: default\n"));

  const std::string broken = launcher::format_app_help(tree.conf, {"db=oracle"}, true, false);
  CHECK(broken.find("db: mysql, postgresql\n") != std::string::npos);
  CHECK(broken.find("(config not shown: db=oracle: unknown option 'oracle'") != std::string::npos);

  const std::string missing = launcher::format_app_help(tree.root / "nowhere", {}, true, false);
  CHECK(missing.find("(no config groups in " + (tree.root / "nowhere").string() + ")\n") !=
        std::string::npos);
  CHECK(missing.find("(config not shown: ") != std::string::npos);
}

TEST_CASE("launcher_scripts_path: ??? becomes the directory holding conf/") {
  launcher::Node config = launcher::parse_yaml("launcher_scripts_path: ???\nx: 1\n", "t.yaml");
  launcher::fill_launcher_scripts_path(config, "/opt/launcher/conf");
  CHECK(config.at("launcher_scripts_path").as_string() == "/opt/launcher");
  CHECK(config.keys() == std::vector<std::string>{"launcher_scripts_path", "x"});

  launcher::Node set = launcher::parse_yaml("launcher_scripts_path: /mine\n", "t.yaml");
  launcher::fill_launcher_scripts_path(set, "/opt/launcher/conf");
  CHECK(set.at("launcher_scripts_path").as_string() == "/mine");

  launcher::Node absent = launcher::parse_yaml("x: '\?\?\?'\n", "t.yaml");
  launcher::fill_launcher_scripts_path(absent, "/opt/launcher/conf");
  CHECK(absent.keys() == std::vector<std::string>{"x"});
}
