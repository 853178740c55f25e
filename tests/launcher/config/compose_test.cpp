// Hydra 1.3 composition on the fixture conf trees under fixtures/: defaults lists, _self_
// placement, nested groups and packages, command-line group choices, and the errors.
#include "launcher/config/compose.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <fstream>

#include "backend/common/error.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/yaml_io.hpp"
#include "temporary_directory.hpp"

using launcher::ComposedConfig;
using launcher::Node;

namespace {

const std::filesystem::path kFixtures =
    std::filesystem::path(TEST_SOURCE_DIR) / "tests/launcher/config/fixtures";

ComposedConfig compose_fixture(const std::string& tree, const std::string& config_name,
                               std::vector<std::string> overrides = {}) {
  return launcher::compose({kFixtures / tree, config_name, std::move(overrides)});
}

// "config_path@package" (+ "*" for _self_ entries) for each defaults entry, in order.
std::vector<std::string> defaults_summary(const ComposedConfig& composed) {
  std::vector<std::string> summary;
  for (const auto& entry : composed.defaults) {
    summary.push_back(entry.config_path + "@" + entry.package + (entry.is_self ? "*" : ""));
  }
  return summary;
}

void write_config_file(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

Node yaml(const char* text) {
  return launcher::parse_yaml(text, "expected");
}

}  // namespace

TEST_CASE("the NeMo-shaped primary config composes with a nested group option") {
  const auto composed = compose_fixture("nemo_like", "config",
                                        {"training=gpt3/126m", "training.trainer.max_steps=5",
                                         "launcher_scripts_path=/opt/launcher"});
  CHECK(defaults_summary(composed) == std::vector<std::string>{"config@*", "cluster/bcm@cluster",
                                                               "training/gpt3/126m@training*"});
  const auto& training_entry = composed.defaults.back();
  CHECK(training_entry.group == "training");
  CHECK(training_entry.option == "gpt3/126m");
  CHECK(training_entry.parent == "config");
  CHECK(training_entry.source_file.ends_with("nemo_like/training/gpt3/126m.yaml"));
  CHECK(composed.defaults.front().option == "config");

  const Node& config = composed.config;
  CHECK(config.keys() == std::vector<std::string>{
                             "debug", "stages", "cluster_type", "launcher_scripts_path", "data_dir",
                             "base_results_dir", "container", "cluster", "training"});
  CHECK(config.at("training").at("trainer").at("max_steps").as_int() == 5);
  CHECK(config.at("training").at("run").at("name").as_string() == "gpt3_126m");
  CHECK(config.at("training").at("model").at("optim").at("lr").as_double() == 6e-4);
  // Unresolved: interpolations are kept as written.
  CHECK(config.at("training").at("model").at("ffn_hidden_size").as_string() ==
        "${multiply:4, ${.hidden_size}}");
  // A group file's own `hydra` key stays inside its package; only the top-level one moves out.
  CHECK(config.at("training").contains("hydra"));
  CHECK_FALSE(config.contains("hydra"));
  CHECK(composed.hydra == yaml("run: {dir: .}\noutput_subdir: null\n"));
  CHECK(config.at("cluster").at("gpus_per_node").as_int() == 8);
  CHECK(config.at("cluster").at("job_name_prefix").as_string() == "nemo-megatron-");

  CHECK(composed.choices.at("training") == "gpt3/126m");
  CHECK(composed.choices.at("cluster") == "bcm");
  CHECK(composed.choices.at("hydra/job_logging") == "stdout");
  CHECK(composed.choices.at("fine_tuning") == std::nullopt);  // null placeholder

  const Node resolved = launcher::resolve(composed.config, {composed.choices});
  const Node& model = resolved.at("training").at("model");
  CHECK(model.at("ffn_hidden_size").as_int() == 3072);
  CHECK(model.at("max_position_embeddings").as_int() == 2048);
  CHECK(model.at("tokenizer").at("vocab_file").as_string() == "/opt/launcher/data/bpe/vocab.json");
  CHECK(resolved.at("training").at("run").at("results_dir").as_string() ==
        "/opt/launcher/results/gpt3_126m");
}

TEST_CASE("the default option is used without a command-line choice") {
  const auto composed = compose_fixture("nemo_like", "config");
  CHECK(composed.choices.at("training") == "gpt3/5b");
  CHECK(composed.config.at("training").at("model").at("hidden_size").as_int() == 4096);
  CHECK(composed.config.at("launcher_scripts_path").is_missing());
  CHECK_THROWS_WITH_AS(launcher::resolve(composed.config, {composed.choices}),
                       doctest::Contains("'launcher_scripts_path' ("), common::Error);
}

TEST_CASE("Hydra's own groups and the hydra section take command-line overrides") {
  const auto composed =
      compose_fixture("nemo_like", "config",
                      {"hydra/job_logging=disabled", "hydra.run.dir=/tmp/run", "hydra.job.name=x"});
  CHECK(composed.choices.at("hydra/job_logging") == "disabled");
  CHECK(composed.hydra.at("run").at("dir").as_string() == "/tmp/run");
  CHECK(composed.hydra.at("job").at("name").as_string() == "x");
  CHECK_FALSE(composed.config.contains("hydra"));
}

TEST_CASE("a null placeholder group is chosen from the command line") {
  const auto composed =
      compose_fixture("nemo_like", "config", {"fine_tuning=gpt3/squad", "cluster=local"});
  CHECK(defaults_summary(composed) ==
        std::vector<std::string>{"config@*", "cluster/local@cluster", "training/gpt3/5b@training*",
                                 "fine_tuning/gpt3/squad@fine_tuning"});
  CHECK(composed.config.at("fine_tuning").at("run").at("task_name").as_string() == "squad");
  CHECK(composed.config.at("cluster").at("gpus_per_node").as_int() == 1);
  CHECK(composed.choices.at("fine_tuning") == "gpt3/squad");
}

TEST_CASE("a nested group with a package override is chosen by its override key") {
  const auto composed =
      compose_fixture("nemo_like", "config",
                      {"training/tp_overlap@training.model.ub_tp_comm_overlap_cfg=ub_cfg_small"});
  CHECK(defaults_summary(composed).back() ==
        "training/tp_overlap/ub_cfg_small@training.model.ub_tp_comm_overlap_cfg");
  CHECK(composed.config.at("training")
            .at("model")
            .at("ub_tp_comm_overlap_cfg")
            .at("qkv_fprop")
            .at("method")
            .as_string() == "ring_exchange");
  CHECK(composed.choices.at("training/tp_overlap@training.model.ub_tp_comm_overlap_cfg") ==
        "ub_cfg_small");
}

TEST_CASE("_self_ placement decides who wins") {
  const auto first = compose_fixture("groups", "self_first");
  CHECK(defaults_summary(first) == std::vector<std::string>{"self_first@*", "db/mysql@db"});
  CHECK(first.config ==
        yaml("value: from_primary\ndb: {host: mysql_host, user: primary_user, port: 3306}\n"));

  const auto last = compose_fixture("groups", "self_last");
  CHECK(defaults_summary(last) == std::vector<std::string>{"db/mysql@db", "self_last@*"});
  CHECK(last.config ==
        yaml("db: {host: primary_host, port: 3306, user: primary_user}\nvalue: from_primary\n"));

  // Hydra 1.1+: a primary config without _self_ behaves as if it were last.
  const auto missing = compose_fixture("groups", "no_self");
  CHECK(missing.config == last.config);
}

TEST_CASE("nested defaults are relative to their group, and a later config's override wins") {
  const auto composed = compose_fixture("groups", "nested");
  CHECK(defaults_summary(composed) ==
        std::vector<std::string>{"db/postgresql@db", "server/site/default@server.site",
                                 "server/apache@server*", "experiment/fast@*", "nested@*"});
  CHECK(composed.config == yaml("db: {host: pg_host, port: 5432}\nserver: {site: {root: /var/www}, "
                                "name: fast}\ntop: 1\n"));
  CHECK(composed.choices.at("db") == "postgresql");
  CHECK(composed.choices.at("server/site") == "default");
  // The command line wins over `override` entries in defaults lists.
  const auto chosen = compose_fixture("groups", "nested", {"db=mysql"});
  CHECK(chosen.config.at("db").at("host").as_string() == "mysql_host");
}

TEST_CASE("override in the primary defaults list") {
  const auto composed = compose_fixture("groups", "override_in_primary");
  CHECK(defaults_summary(composed) ==
        std::vector<std::string>{"db/postgresql@db", "override_in_primary@*"});
  CHECK(composed.choices.at("db") == "postgresql");
  CHECK_THROWS_WITH_AS(compose_fixture("groups", "override_too_early"),
                       doctest::Contains("Overrides must be at the end of the defaults list"),
                       common::Error);
}

TEST_CASE("group choices: append with +, delete with ~, interpolation of earlier choices") {
  CHECK_THROWS_WITH_AS(
      compose_fixture("groups", "self_first", {"server=apache"}),
      "server=apache: Could not override 'server'. No match in the defaults list. To "
      "append to your defaults list use +server=apache",
      common::Error);
  const auto appended = compose_fixture("groups", "self_first", {"+server=apache"});
  CHECK(defaults_summary(appended) == std::vector<std::string>{"self_first@*", "db/mysql@db",
                                                               "server/site/default@server.site",
                                                               "server/apache@server*"});
  // An appended config's `override` applies to the primary's earlier entries.
  const auto experiment = compose_fixture("groups", "self_first", {"+experiment=fast"});
  CHECK(defaults_summary(experiment) ==
        std::vector<std::string>{"self_first@*", "db/postgresql@db", "experiment/fast@*"});
  const auto deleted = compose_fixture("groups", "self_first", {"~db"});
  CHECK(defaults_summary(deleted) == std::vector<std::string>{"self_first@*"});
  CHECK(deleted.config.at("db").at("host").as_string() == "primary_host");
  CHECK_THROWS_WITH_AS(compose_fixture("groups", "self_first", {"~db=postgresql"}),
                       doctest::Contains("could not delete 'db=postgresql'"), common::Error);

  const auto interpolated = compose_fixture("groups", "interpolated");
  CHECK(defaults_summary(interpolated) ==
        std::vector<std::string>{"db/mysql@db", "dbinfo/mysql@dbinfo", "interpolated@*"});
  const auto switched = compose_fixture("groups", "interpolated", {"db=postgresql"});
  CHECK(switched.config.at("dbinfo").at("engine").as_string() == "heap");
}

TEST_CASE("packages: group@package, _global_, # @package headers and option lists") {
  const auto composed = compose_fixture("groups", "packages");
  CHECK(defaults_summary(composed) ==
        std::vector<std::string>{"db/mysql@primary_db", "db/postgresql@replica", "db/sqlite@",
                                 "plugins/logging@plugins", "plugins/metrics@plugins",
                                 "packages@*"});
  CHECK(composed.config ==
        yaml("primary_db: {host: mysql_host, port: 3306}\nreplica: {host: pg_host, port: 5432}\n"
             "sqlite_file: /tmp/db.sqlite\nplugins: {log_level: info, interval: 10}\n"));
  CHECK(composed.choices.at("db@replica") == "postgresql");
  CHECK(composed.choices.at("db@_global_") == "sqlite");
  const auto chosen = compose_fixture("groups", "packages", {"db@replica=mysql"});
  CHECK(chosen.config.at("replica").at("host").as_string() == "mysql_host");
  // The header of db/sqlite.yaml puts its content at the root.
  const auto header = compose_fixture("groups", "self_last", {"db=sqlite"});
  CHECK(header.config.at("sqlite_file").as_string() == "/tmp/db.sqlite");
  CHECK(header.defaults.front().package.empty());
}

TEST_CASE("unknown groups, options and keys are errors with suggestions") {
  CHECK_THROWS_WITH_AS(
      compose_fixture("nemo_like", "config", {"training=gpt3/125m"}),
      doctest::Contains(
          "training=gpt3/125m: unknown option 'gpt3/125m' for config group 'training'"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      compose_fixture("nemo_like", "config", {"training=gpt3/125m"}),
      doctest::Contains("Did you mean 'gpt3/126m'? Available options: gpt3/126m, gpt3/5b, "
                        "tp_overlap/ub_cfg_small"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      compose_fixture("nemo_like", "config", {"clustr=bcm"}),
      doctest::Contains("key 'clustr' does not exist in the config root. Did you mean 'cluster'?"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      compose_fixture("groups", "self_first", {"db.hots=x"}),
      "Could not override 'db.hots': key 'hots' does not exist in 'db'. Did you mean "
      "'host'? Valid keys: host, user, port. To add it use +db.hots=x",
      common::Error);
  CHECK_THROWS_WITH_AS(compose_fixture("groups", "self_first", {"dbb@x=mysql"}),
                       doctest::Contains("config group 'dbb' does not exist. Did you mean 'db'?"),
                       common::Error);
  CHECK_THROWS_WITH_AS(
      compose_fixture("groups", "self_first", {"serv/site=default"}),
      doctest::Contains("config group 'serv/site' does not exist. Did you mean 'server/site'?"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      compose_fixture("groups", "missing_choice"),
      doctest::Contains("you must specify 'db', e.g. db=<OPTION>. Available options: "
                        "mysql, postgresql, sqlite"),
      common::Error);
  CHECK(compose_fixture("groups", "missing_choice", {"db=mysql"}).choices.at("db") == "mysql");
  CHECK_THROWS_WITH_AS(compose_fixture("groups", "nope"),
                       doctest::Contains("Cannot find primary config 'nope'"), common::Error);
  CHECK_THROWS_WITH_AS(compose_fixture("groups", "self_first", {"db=null"}),
                       doctest::Contains("to remove the group use ~db"), common::Error);
  CHECK_THROWS_WITH_AS(compose_fixture("groups", "self_first", {"++db=mysql"}),
                       doctest::Contains("force-add of config groups is not supported"),
                       common::Error);
}

TEST_CASE("broken group files are errors naming the file") {
  CHECK(compose_fixture("groups", "uses_broken").config.at("broken").at("ok").as_bool());
  CHECK_THROWS_WITH_AS(
      compose_fixture("groups", "uses_broken", {"broken=list"}),
      doctest::Contains(
          "config 'broken/list' must be a mapping at the top level, but it is a list"),
      common::Error);
  CHECK_THROWS_WITH_AS(compose_fixture("groups", "uses_broken", {"broken=syntax"}),
                       doctest::Contains("broken/syntax.yaml:"), common::Error);
  CHECK_THROWS_WITH_AS(compose_fixture("groups", "uses_broken", {"broken=duplicate"}),
                       doctest::Contains("broken/duplicate.yaml:3:1: duplicate key 'a'"),
                       common::Error);
  CHECK_THROWS_WITH_AS(compose_fixture("groups", "uses_broken", {"broken=bad_defaults"}),
                       doctest::Contains("`defaults` must be a list, got a map"), common::Error);
}

TEST_CASE("a defaults list that includes itself, directly or through others, is a cycle") {
  test_support::TemporaryDirectory conf;
  write_config_file(conf.path / "config.yaml", "defaults:\n  - cluster: local\n  - _self_\nx: 1\n");
  write_config_file(conf.path / "cluster/local.yaml", "a: 1\n");
  write_config_file(conf.path / "cluster/bcm.yaml", "defaults:\n  - /cluster: bcm\npartition: x\n");
  write_config_file(conf.path / "cluster/a.yaml", "defaults:\n  - b\n");
  write_config_file(conf.path / "cluster/b.yaml", "defaults:\n  - /cluster/a\n");
  write_config_file(conf.path / "cluster/self_plain.yaml", "defaults:\n  - self_plain\n");
  CHECK(launcher::compose({conf.path, "config", {}}).config.at("cluster").at("a").as_int() == 1);
  CHECK_THROWS_WITH_AS(
      launcher::compose({conf.path, "config", {"cluster=bcm"}}),
      doctest::Contains("defaults list cycle: config.yaml → cluster/bcm.yaml → cluster/bcm.yaml"),
      common::Error);
  CHECK_THROWS_WITH_AS(launcher::compose({conf.path, "config", {"cluster=bcm"}}),
                       doctest::Contains(((conf.path / "cluster/bcm.yaml").string() + ":2:5:").c_str()),
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::compose({conf.path, "config", {"cluster=a"}}),
                       doctest::Contains("defaults list cycle: config.yaml → cluster/a.yaml → "
                                         "cluster/b.yaml → cluster/a.yaml"),
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::compose({conf.path, "config", {"cluster=self_plain"}}),
                       doctest::Contains("cluster/self_plain.yaml → cluster/self_plain.yaml"),
                       common::Error);
  // The primary config including itself.
  write_config_file(conf.path / "loop.yaml", "defaults:\n  - loop\n");
  CHECK_THROWS_WITH_AS(launcher::compose({conf.path, "loop", {}}),
                       doctest::Contains("defaults list cycle: loop.yaml → loop.yaml"),
                       common::Error);
}

TEST_CASE("defaults lists nested deeper than the limit are refused — a diamond is no cycle") {
  test_support::TemporaryDirectory conf;
  // chain/gK/c.yaml includes chain/gK+1/c.yaml: an acyclic chain of includes.
  auto write_chain = [&conf](std::size_t length) {
    std::filesystem::remove_all(conf.path / "chain");
    for (std::size_t k = 0; k < length; ++k) {
      write_config_file(conf.path / fmt::format("chain/g{}/c.yaml", k),
                 fmt::format("defaults:\n  - /chain/g{}@_here_: c\nk{}: 1\n", k + 1, k));
    }
    write_config_file(conf.path / fmt::format("chain/g{}/c.yaml", length), "end: 1\n");
  };
  write_config_file(conf.path / "config.yaml", "defaults:\n  - chain/g0@chain: c\n");
  write_chain(launcher::kMaxDefaultsDepth - 2);  // with config.yaml and the end: at the limit
  const Node composed = launcher::compose({conf.path, "config", {}}).config;
  CHECK(composed.at("chain").at("end").as_int() == 1);
  write_chain(launcher::kMaxDefaultsDepth - 1);
  CHECK_THROWS_WITH_AS(launcher::compose({conf.path, "config", {}}),
                       doctest::Contains(fmt::format("defaults lists nested more than {} deep",
                                                     launcher::kMaxDefaultsDepth)
                                             .c_str()),
                       common::Error);
  write_chain(3000);  // far deeper than the limit
  CHECK_THROWS_WITH_AS(launcher::compose({conf.path, "config", {}}),
                       doctest::Contains("config.yaml → chain/g0/c.yaml → chain/g1/c.yaml → "),
                       common::Error);

  // Two configs including the same third one is not a cycle.
  write_config_file(conf.path / "diamond.yaml", "defaults:\n  - left\n  - right\n");
  write_config_file(conf.path / "left.yaml", "defaults:\n  - shared\nl: 1\n");
  write_config_file(conf.path / "right.yaml", "defaults:\n  - shared\nr: 1\n");
  write_config_file(conf.path / "shared.yaml", "s: 1\n");
  const Node diamond = launcher::compose({conf.path, "diamond", {}}).config;
  CHECK(diamond.at("s").as_int() == 1);
  CHECK(diamond.at("r").as_int() == 1);
}

TEST_CASE("listing groups and options") {
  CHECK(launcher::list_groups(kFixtures / "groups") ==
        std::vector<std::string>{"broken", "db", "dbinfo", "experiment", "plugins", "server"});
  CHECK(launcher::list_group_options(kFixtures / "nemo_like", "training") ==
        std::vector<std::string>{"gpt3/126m", "gpt3/5b", "tp_overlap/ub_cfg_small"});
  CHECK_THROWS_WITH_AS(launcher::list_group_options(kFixtures / "nemo_like", "trainin"),
                       doctest::Contains("Did you mean 'training'?"), common::Error);
}

TEST_CASE("composing and resolving a ~300-key config is fast") {
  // Build a NeMo-sized tree in a temporary conf directory: about 300 leaves with interpolations.
  const auto directory = std::filesystem::temp_directory_path() / "launcher_compose_speed";
  std::filesystem::create_directories(directory / "training");
  std::string training = "model:\n  hidden_size: 768\n";
  for (int section = 0; section < 15; ++section) {
    training += "section" + std::to_string(section) + ":\n";
    for (int key = 0; key < 20; ++key) {
      training +=
          "  key" + std::to_string(key) + ": " +
          (key % 3 == 0   ? "${multiply:${training.model.hidden_size}, " + std::to_string(key) + "}"
           : key % 3 == 1 ? "${..model.hidden_size}_x"
                          : std::to_string(key * 1.5)) +
          "\n";
    }
  }
  std::ofstream(directory / "training/big.yaml") << training;
  std::ofstream(directory / "config.yaml") << "defaults:\n  - _self_\n  - training: big\nname: x\n";
  const auto start = std::chrono::steady_clock::now();
  const auto composed =
      launcher::compose({directory, "config", {"training.model.hidden_size=1024"}});
  const Node resolved = launcher::resolve(composed.config, {composed.choices});
  const double milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("compose + resolve of 300 keys: " << milliseconds << " ms");
  CHECK(resolved.at("training").at("section3").at("key3").as_int() == 3072);
  CHECK(resolved.at("training").at("section3").at("key4").as_string() == "1024_x");
  CHECK(milliseconds < 50);  // the target is well under 10 ms; leave room for sanitizer builds
}

TEST_CASE("${hydra:runtime.choices.<group>} of a group left at null is null, as in Hydra") {
  // NeMo's config.yaml: `- fine_tuning: null` in the defaults list and
  // `fine_tuning_config: ${hydra:runtime.choices.fine_tuning}` below it.
  test_support::TemporaryDirectory conf;
  write_config_file(conf.path / "config.yaml",
             "defaults:\n  - _self_\n  - fine_tuning: null\n  - peft: null\n"
             "fine_tuning_config: ${hydra:runtime.choices.fine_tuning}\n"
             "peft_config: ${hydra:runtime.choices.peft}\n"
             "named: ft_${hydra:runtime.choices.fine_tuning}\n");
  write_config_file(conf.path / "fine_tuning/gpt3/squad.yaml", "task: squad\n");

  const auto unchosen = launcher::compose({conf.path, "config", {}});
  CHECK(unchosen.choices.at("fine_tuning") == std::nullopt);
  const Node resolved = launcher::resolve(unchosen.config, {unchosen.choices});
  CHECK(resolved.at("fine_tuning_config").is_null());
  CHECK(resolved.at("peft_config").is_null());  // a group with no directory at all, as 23.07's peft
  CHECK(resolved.at("named").as_string() == "ft_None");  // string interpolation: Python's str()

  const auto chosen = launcher::compose({conf.path, "config", {"fine_tuning=gpt3/squad"}});
  const Node chosen_resolved = launcher::resolve(chosen.config, {chosen.choices});
  CHECK(chosen_resolved.at("fine_tuning_config").as_string() == "gpt3/squad");
  CHECK(chosen_resolved.at("fine_tuning").at("task").as_string() == "squad");

  // A group that is not in the defaults list at all is most likely a typo: an error naming the
  // groups there and how to declare one.
  write_config_file(conf.path / "typo.yaml", "defaults:\n  - fine_tuning: null\nx: ${hydra:runtime.choices.fine_tunning}\n");
  const auto typo = launcher::compose({conf.path, "typo", {}});
  CHECK_THROWS_WITH_AS(launcher::resolve(typo.config, {typo.choices}),
                       doctest::Contains("config group 'fine_tunning' is not in the defaults list "
                                         "(groups there: fine_tuning); to leave it unchosen add "
                                         "`- fine_tunning: null`"),
                       common::Error);
}

TEST_CASE("NeMo-Megatron-Launcher 23.07's own config.yaml composes and resolves") {
  // tests/data/nemo_23.07/conf: NeMo's files, unchanged, for the options its defaults list
  // names (and fine_tuning/gpt3/squad); see tests/data/README.md.
  const auto conf = std::filesystem::path(TEST_SOURCE_DIR) / "tests/data/nemo_23.07/conf";
  const auto composed =
      launcher::compose({conf, "config", {"launcher_scripts_path=/opt/launcher_scripts"}});
  const Node resolved = launcher::resolve(composed.config, {composed.choices});
  for (const char* key : {"fine_tuning_config", "prompt_learning_config",
                          "adapter_learning_config", "ia3_learning_config"}) {
    INFO(key);
    CHECK(resolved.at(key).is_null());
  }
  CHECK(resolved.at("training_config").as_string() == "gpt3/5b");
  CHECK(resolved.at("export_config").as_string() == "gpt3/export_gpt3");
  CHECK(resolved.at("training").at("run").at("results_dir").as_string() ==
        "/opt/launcher_scripts/results/gpt3_5b");

  const auto fine_tuning = launcher::compose(
      {conf, "config", {"launcher_scripts_path=/opt/launcher_scripts", "fine_tuning=gpt3/squad"}});
  CHECK(launcher::resolve(fine_tuning.config, {fine_tuning.choices})
            .at("fine_tuning_config")
            .as_string() == "gpt3/squad");
}
