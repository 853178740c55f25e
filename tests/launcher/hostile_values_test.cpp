// Values never become code: for every cluster type (local, bcm, pbs, k8s), a hostile value is
// put at every site of the composed config (conf/config.yaml with training=gpt3/126m, the
// cluster's conf/cluster/<type>.yaml, and every stage) — each scalar, a new item at the end of
// each list, and a new key in each map — one site and one payload per launch. The sites are
// found by walking the composed tree, not listed by hand. Each launch runs `launcher main
// --dry-run` in-process (launch_main) on a conf dir holding that one config; then:
//   - a launch may refuse the value with a common::Error (counted), never fail otherwise;
//   - every job script it wrote passes `bash -n` and runs in a real bash with the schedulers'
//     and the backend's commands stubbed on PATH (srun, mpirun, mpiexec, sbatch, qsub,
//     kubectl, pretrain_gpt, ...); so does the bash line of every PyTorchJob container;
//   - nothing runs the payloads' command (`pwned`, a stub that leaves a marker file);
//   - #SBATCH lines, read as sbatch reads them, are single known options of one job
//     component; #PBS lines are single known options;
//   - each manifest, parsed by yaml-cpp, has only the keys a clean manifest can have, with
//     the same scalar types.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "clusters/scheduler_directives.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/node.hpp"
#include "launcher/config/yaml_io.hpp"
#include "launcher/launch.hpp"
#include "launcher/process.hpp"
#include "quiet_logger.hpp"
#include "sanitized_build.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using namespace launcher;
using test_support::memory_backed_temp_directory;
using test_support::pbs_directives;
using test_support::release_only;
using test_support::sbatch_directives;
using test_support::TemporaryDirectory;
namespace fs = std::filesystem;

namespace {

using test_support::kSourceDir;
using test_support::read_file;
using test_support::write_file;

// Each runs `pwned` (a stub that leaves a marker) if any part of it ever becomes code.
std::vector<std::string> hostile_payloads() {
  return {
      "$(pwned)",
      "`pwned`",
      ";pwned;",
      "x\npwned\n",
      "x\r\npwned\r\n#",
      "'; pwned; '",
      "\"; pwned; \"",
      "\\'; pwned #\\",
      "a\" \"$(pwned)\" \\\"",
      "x\nevil: true\n#",
      "8\n  securityContext: {privileged: true}",
      "{privileged: true, evil: [pwned]}",
      "*alias",
      "&anchor pwned",
      "!!python/object/apply:os.system [pwned]",
      "-pwned",
      "--export=ALL,pwned",
      "%j %x %% 100%",
      "a,b:c",
      "x hetjob --uid=0",
      "\xe2\x80\xa8" "evil: true",
      "\xff\xfe not UTF-8",
  };
}

// Where a hostile value goes: a scalar replaced, an item appended to a list, or a key added
// to a map (with a plain value).
struct Site {
  enum class Kind { scalar, list_item, map_key } kind;
  std::vector<std::string> path;  // keys and list indices from the root
  std::string describe() const {
    std::string text;
    for (const auto& part : path) text += (text.empty() ? "" : ".") + part;
    const char* what = kind == Kind::scalar ? "value" : kind == Kind::list_item ? "new item of" : "new key in";
    return fmt::format("{} {}", what, text.empty() ? "<root>" : text);
  }
};

void collect_sites(const Node& node, std::vector<std::string>& path, std::vector<Site>& sites) {
  if (node.is_map()) {
    sites.push_back({Site::Kind::map_key, path});
    for (const auto& key : node.keys()) {
      path.push_back(key);
      collect_sites(node.at(key), path, sites);
      path.pop_back();
    }
  } else if (node.is_list()) {
    sites.push_back({Site::Kind::list_item, path});
    for (size_t i = 0; i < node.size(); ++i) {
      path.push_back(std::to_string(i));
      collect_sites(node.at(i), path, sites);
      path.pop_back();
    }
  } else {
    sites.push_back({Site::Kind::scalar, path});
  }
}

Node& node_at(Node& root, const std::vector<std::string>& path) {
  Node* node = &root;
  for (const auto& part : path) {
    node = node->is_list() ? &node->at(std::stoul(part)) : &node->at(part);
  }
  return *node;
}

Node with_payload(const Node& config, const Site& site, const std::string& payload) {
  Node mutated = config;
  Node& target = node_at(mutated, site.path);
  switch (site.kind) {
    case Site::Kind::scalar: target = Node::string(payload); break;
    case Site::Kind::list_item: target.push_back(Node::string(payload)); break;
    case Site::Kind::map_key: target.set(payload, Node::string("v")); break;
  }
  return mutated;
}

void make_stub(const fs::path& path, const std::string& body) {
  write_file(path, "#!/bin/sh\n" + body);
  fs::permissions(path, fs::perms::owner_all);
}

// Manifest shape: each map key as a dotted path (list items as "-") with its scalar's tag
// ("!" for a quoted string, "?" for a plain scalar), or "" for a collection.
void manifest_shape(const YAML::Node& node, const std::string& prefix, std::map<std::string, std::string>& shape) {
  if (node.IsMap()) {
    for (const auto& entry : node) {
      const std::string key = prefix + entry.first.as<std::string>();
      shape[key] = entry.second.IsScalar() ? entry.second.Tag() : "";
      manifest_shape(entry.second, key + ".", shape);
    }
  } else if (node.IsSequence()) {
    for (const auto& item : node) manifest_shape(item, prefix + "-.", shape);
  }
}

// The bash line each container of a manifest runs.
std::vector<std::string> container_scripts(const YAML::Node& manifest) {
  std::vector<std::string> scripts;
  for (const auto& role : manifest["spec"]["pytorchReplicaSpecs"]) {
    for (const auto& container : role.second["template"]["spec"]["containers"]) {
      scripts.push_back(container["args"][0].as<std::string>());
    }
  }
  return scripts;
}

// The run directory of one launch: conf/config.yaml (the whole config, no defaults list),
// templates (the source tree's), and work/ (the current directory, where relative paths land).
struct Sandbox {
  // Thousands of launches: on tmpfs where there is one (memory_backed_temp_directory).
  TemporaryDirectory root{"hostile_values", memory_backed_temp_directory()};
  fs::path bin = root.path / "bin";
  fs::path marker = root.path / "marker" / "pwned";
  fs::path run = root.path / "run";
  fs::path conf = run / "conf";
  fs::path work = run / "work";
  fs::path previous_directory = fs::current_path();

  Sandbox() {
    fs::create_directories(bin);
    fs::create_directories(marker.parent_path());
    fs::create_directories(conf);
    fs::create_directory_symlink(kSourceDir / "templates", run / "templates");
    make_stub(bin / "pwned", fmt::format("echo \"$LAUNCHED_SCRIPT\" >> '{}'\n", marker.string()));
    for (const char* program : {"srun", "sbatch", "mpirun", "mpiexec", "qsub", "kubectl", "pretrain_gpt",
                                "preprocess_data", "checkpoint_util", "evaluate_gpt", "download",
                                "decompress"}) {
      make_stub(bin / program, "exit 0\n");
    }
    fs::create_directories(work);
    fs::current_path(work);
  }
  ~Sandbox() { fs::current_path(previous_directory); }

  void clear_outputs() {
    for (const auto& entry : fs::directory_iterator(run)) {
      if (entry.path() != conf && entry.path() != run / "templates" && entry.path() != work) {
        fs::remove_all(entry.path());
      }
    }
    for (const auto& entry : fs::directory_iterator(work)) fs::remove_all(entry.path());
  }

  std::vector<fs::path> job_files() const {
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(run); it != fs::recursive_directory_iterator(); ++it) {
      if (it->is_symlink() && it->path() == run / "templates") {
        it.disable_recursion_pending();
        continue;
      }
      const std::string name = it->path().filename().string();
      if (it->is_regular_file() && (name.ends_with("_submission.sh") || name.ends_with("_submission.yaml"))) {
        files.push_back(it->path());
      }
    }
    return files;
  }
};

using test_support::QuietLogger;

struct Outcome {
  std::string error;                // the common::Error's message when refused
  std::string crash;                // any other exception: what `launcher` reports as exit 3
  std::vector<fs::path> job_files;  // else the scripts and manifests written
};

Outcome launch(Sandbox& sandbox, QuietLogger& logger, const Node& config) {
  sandbox.clear_outputs();
  write_file(sandbox.conf / "config.yaml", to_yaml(config));
  MainOptions options;
  options.conf_dir = sandbox.conf;
  options.dry_run = true;
  options.command_line = "launcher main --dry-run";
  std::ostringstream terminal;
  Outcome outcome;
  try {
    launch_main(options, terminal);
  } catch (const common::Error& error) {
    outcome.error = error.what();
  } catch (const std::exception& error) {
    outcome.crash = error.what();
  }
  logger.drop_added_sinks();
  if (outcome.error.empty() && outcome.crash.empty()) outcome.job_files = sandbox.job_files();
  return outcome;
}

// Option names of the #SBATCH / #PBS lines of a script ("--time", "-l walltime", ...).
std::vector<std::string> directive_names(const std::string& type, const std::string& script, std::string& problem) {
  std::vector<std::string> names;
  if (type == "bcm") {
    const auto directives = sbatch_directives(script);
    if (directives.fatal) problem = "an #SBATCH line sbatch cannot read";
    if (directives.components != 1) problem = "#SBATCH lines splitting the job (hetjob)";
    for (const auto& argument : directives.arguments) {
      if (!argument.starts_with("--")) problem = "an #SBATCH argument that is not an option: " + argument;
      names.push_back(argument.substr(0, argument.find('=')));
    }
  } else if (type == "pbs") {
    const auto directives = pbs_directives(script);
    if (!directives) {
      problem = "a #PBS line of an unexpected shape";
      return names;
    }
    for (const auto& directive : *directives) {
      names.push_back(directive.option == "-l" ? "-l " + directive.value.substr(0, directive.value.find('='))
                                               : directive.option);
    }
  }
  return names;
}

// Scripts waiting for one bash to run them, each with what it came from.
struct PendingScripts {
  fs::path directory;
  std::vector<std::string> origins;

  void add(const std::string& text, const std::string& origin) {
    write_file(directory / fmt::format("{}.sh", origins.size()), text);
    origins.push_back(origin);
  }

  // One bash runs them all: each is syntax-checked (bash -n), then run in a real bash with the
  // stubs first on PATH. Returns how many ran.
  size_t run(const Sandbox& sandbox) {
    if (origins.empty()) return 0;
    std::vector<std::string> argv = {
        "env", "-i", fmt::format("PATH={}:/usr/bin:/bin", sandbox.bin.string()),
        "HOME=" + sandbox.root.path.string(), "bash", "-c",
        "for s; do bash -n \"$s\" 2>/dev/null || echo \"syntax error: $s\"; "
        "LAUNCHED_SCRIPT=\"$s\" bash \"$s\" >/dev/null 2>&1 </dev/null; done",
        "driver"};
    for (size_t i = 0; i < origins.size(); ++i) argv.push_back((directory / fmt::format("{}.sh", i)).string());
    const CapturedRun ran = run_and_capture(argv);
    auto origin_of = [&](const std::string& line) {
      const std::string name = fs::path(line).stem().string();
      return origins.at(std::stoul(name));
    };
    std::istringstream syntax_errors(ran.output);
    for (std::string line; std::getline(syntax_errors, line);) {
      if (line.starts_with("syntax error: ")) {
        FAIL_CHECK("bash cannot parse the script of " << origin_of(line.substr(14)));
      }
    }
    if (fs::exists(sandbox.marker)) {
      std::istringstream ran_code(read_file(sandbox.marker));
      for (std::string line; std::getline(ran_code, line);) {
        FAIL_CHECK("a hostile value ran as code: " << origin_of(line));
      }
      fs::remove(sandbox.marker);
    }
    const size_t count = origins.size();
    origins.clear();
    for (const auto& entry : fs::directory_iterator(directory)) fs::remove(entry.path());
    return count;
  }
};

// Every site × every payload for one cluster type (every `site_stride`-th site: the sanitized
// build's time); returns the counts for the report.
std::string check_no_value_becomes_code(const std::string& cluster_type, size_t site_stride = 1) {
  Sandbox sandbox;
  QuietLogger logger;
  PendingScripts pending{sandbox.root.path / "pending", {}};
  fs::create_directories(pending.directory);
  const std::vector<std::string> payloads = hostile_payloads();
  // Every stage, so that every section's values reach a script; the backend is the stubs.
  const std::vector<std::string> overrides = {
      "cluster=" + cluster_type, "cluster_type=" + cluster_type, "training=gpt3/126m",
      "backend_bin_dir=" + sandbox.bin.string(), "container=nvcr.io/example/image:1",
      "stages=[data_preparation,training,conversion,evaluation]", "data_preparation.input=[/data/a.jsonl]"};
  const Node config = compose({kSourceDir / "conf", "config", overrides}).config;
  const bool is_k8s = cluster_type == "k8s";

  // The scripts (and container lines) a launch wrote, by where they were written.
  auto scripts_of = [&](const Outcome& outcome) {
    std::map<std::string, std::string> scripts;
    for (const auto& file : outcome.job_files) {
      const std::string where = file.lexically_relative(sandbox.run).string();
      const std::string text = read_file(file);
      if (!is_k8s) {
        scripts[where] = text;
        continue;
      }
      size_t index = 0;
      for (const auto& line : container_scripts(YAML::Load(text))) scripts[fmt::format("{}#{}", where, index++)] = line;
    }
    return scripts;
  };

  // A clean launch first, run like the others; then what every hostile launch may write and
  // nothing else: its directives and manifest keys, and those of a launch with every null
  // cluster setting given a value and every boolean one flipped.
  const Outcome clean = launch(sandbox, logger, config);
  REQUIRE_MESSAGE((clean.error.empty() && clean.crash.empty()), clean.error << clean.crash);
  REQUIRE(!clean.job_files.empty());
  const std::map<std::string, std::string> clean_scripts = scripts_of(clean);
  for (const auto& [where, text] : clean_scripts) pending.add(text, "the clean launch: " + where);
  pending.run(sandbox);
  std::set<std::string> known_directives;
  std::map<std::string, std::string> known_shape;
  Node full = config;
  for (const auto& key : full.at("cluster").keys()) {
    Node& value = full.at("cluster").at(key);
    if (value.is_null()) value = Node::string("x");
    if (value.is_bool()) value = Node::boolean(!value.as_bool());
  }
  for (const Node* variant : std::vector<const Node*>{&config, &full}) {
    const Outcome outcome = launch(sandbox, logger, *variant);
    REQUIRE_MESSAGE(outcome.crash.empty(), outcome.crash);
    if (variant == &full && !outcome.error.empty()) continue;  // e.g. local's detach=true
    for (const auto& file : outcome.job_files) {
      const std::string text = read_file(file);
      if (is_k8s) {
        manifest_shape(YAML::Load(text), "", known_shape);
      } else {
        std::string problem;
        for (const auto& name : directive_names(cluster_type, text, problem)) known_directives.insert(name);
        REQUIRE_MESSAGE(problem.empty(), problem);
      }
    }
  }

  std::vector<Site> sites;
  std::vector<std::string> path;
  collect_sites(config, path, sites);
  size_t launches = 0, refused = 0, crashed = 0, files_checked = 0, scripts_run = 0;
  const auto started = std::chrono::steady_clock::now();
  size_t sites_swept = 0;
  for (size_t site_index = 0; site_index < sites.size(); site_index += site_stride) {
    const Site& site = sites[site_index];
    ++sites_swept;
    for (const std::string& payload : payloads) {
      const std::string origin = fmt::format("{} = {:?} ({})", site.describe(), payload, cluster_type);
      CAPTURE(origin);
      ++launches;
      const Outcome outcome = launch(sandbox, logger, with_payload(config, site, payload));
      if (!outcome.crash.empty()) {
        ++crashed;
        FAIL_CHECK("not a common::Error (launcher would exit 3): " << outcome.crash);
        continue;
      }
      if (!outcome.error.empty()) {
        ++refused;
        continue;
      }
      for (const auto& file : outcome.job_files) {
        ++files_checked;
        const std::string text = read_file(file);
        CAPTURE(text);
        if (is_k8s) {
          YAML::Node manifest;
          REQUIRE_NOTHROW(manifest = YAML::Load(text));
          std::map<std::string, std::string> shape;
          manifest_shape(manifest, "", shape);
          for (const auto& [key, tag] : shape) {
            // A copy: clang 14 (the asan preset) cannot refer to a structured binding in CAPTURE's lambda.
            const auto& captured_key = key;
            CAPTURE(captured_key);
            REQUIRE(known_shape.contains(key));
            CHECK(known_shape.at(key) == tag);
          }
        } else {
          std::string problem;
          const auto names = directive_names(cluster_type, text, problem);
          CHECK_MESSAGE(problem.empty(), problem);
          std::set<std::string> seen;
          for (const auto& name : names) {
            CAPTURE(name);
            CHECK(known_directives.contains(name));
            CHECK(seen.insert(name).second);
          }
        }
      }
      // Only what differs from the clean launch needs a bash: the rest ran already.
      for (const auto& [where, text] : scripts_of(outcome)) {
        const auto same = clean_scripts.find(where);
        if (same == clean_scripts.end() || same->second != text) pending.add(text, origin + ": " + where);
      }
    }
    scripts_run += pending.run(sandbox);
  }
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return fmt::format("{}: {} of {} sites × {} payloads = {} launches in {:.0f} s: {} refused with a common::Error, "
                     "{} other exceptions, {} rendered ({} job files checked, {} changed scripts run in bash)",
                     cluster_type, sites_swept, sites.size(), payloads.size(), launches, seconds, refused, crashed,
                     launches - refused - crashed, files_checked, scripts_run);
}

}  // namespace

// One test case per cluster type, so that CTest can run them side by side. The sanitized build
// runs the Slurm one (the richest renderer: sbatch directives, srun lines, pyxis options) over
// every fourth site, the same code with every payload, in a quarter of its three minutes there
// (the sites are walked in the tree's order, so each part of the config keeps sites), and leaves
// the other three to the release build (release_only(): not registered in a sanitized build):
// the renderers they add are plain string building over the same quoting function.
TEST_CASE("no hostile value in any field or key of the config becomes code: local cluster" *
          release_only()) {
  MESSAGE(check_no_value_becomes_code("local"));
}

TEST_CASE("no hostile value in any field or key of the config becomes code: bcm (Slurm) cluster") {
  MESSAGE(check_no_value_becomes_code("bcm", test_support::kSanitizedBuild ? 4 : 1));
}

TEST_CASE("no hostile value in any field or key of the config becomes code: pbs cluster" *
          release_only()) {
  MESSAGE(check_no_value_becomes_code("pbs"));
}

TEST_CASE("no hostile value in any field or key of the config becomes code: k8s cluster" *
          release_only()) {
  MESSAGE(check_no_value_becomes_code("k8s"));
}
