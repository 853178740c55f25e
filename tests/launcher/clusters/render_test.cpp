// Rendering job scripts: the local script and the sbatch script from their templates, checked
// by bash's own parser, with hostile values kept literal and bad #SBATCH values refused.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/clusters/golden_files.hpp"
#include "launcher/config/yaml_io.hpp"
#include "launcher/process.hpp"
#include "scheduler_directives.hpp"
#include "temporary_directory.hpp"

using namespace launcher;
namespace fs = std::filesystem;
using test_support::TemporaryDirectory;

namespace {

using test_support::kTemplates;

JobSpec sample_job(const fs::path& results_dir) {
  JobSpec job;
  job.stage = "training";
  job.run_name = "gpt3_126m";
  job.job_name = "nemo-megatron-gpt3_126m";
  job.results_dir = results_dir;
  job.command = {"/opt/bin/pretrain_gpt", "--num-layers", "2", "--vocab-file", "/data/my vocab.json"};
  job.environment = {{"NCCL_DEBUG", "INFO"}, {"HOSTILE", "$(touch INJECTED); `id`"}};
  job.nodes = 2;
  job.tasks_per_node = 8;
  job.time_limit = "1-00:00:00";
  return job;
}

// The local cluster is one machine: one node, one process unless a test asks for more.
JobSpec local_job(const fs::path& results_dir) {
  JobSpec job = sample_job(results_dir);
  job.nodes = 1;
  job.tasks_per_node = 1;
  return job;
}

bool bash_accepts(const std::string& script) {
  const fs::path path = fs::temp_directory_path() / "render_test_script.sh";
  std::ofstream(path) << script;
  const auto run = run_and_capture({"bash", "-n", path.string()});
  fs::remove(path);
  return run.exit_code == 0;
}
}  // namespace

TEST_CASE("the local script exports quoted values and runs the backend in the results dir") {
  const Node cluster = parse_yaml("job_name_prefix: ''\n", "test");
  auto job = local_job("/tmp/results/gpt3_126m");
  const std::string script = render_local_script(job, "/tmp/results/x.sh", {kTemplates, &cluster, "", {}});
  CHECK(script.find("mpirun") == std::string::npos);
  job.tasks_per_node = 8;
  const std::string eight = render_local_script(job, "/tmp/results/x.sh", {kTemplates, &cluster, "", {}});
  CHECK(eight.find("mpirun -np 8 --oversubscribe \\\n    /opt/bin/pretrain_gpt") != std::string::npos);
  CHECK(bash_accepts(eight));
  CHECK(script.starts_with("#!/usr/bin/env bash\n"));
  CHECK(script.find("export NCCL_DEBUG=INFO\n") != std::string::npos);
  CHECK(script.find("export HOSTILE='$(touch INJECTED); `id`'\n") != std::string::npos);
  CHECK(script.find("cd -- /tmp/results/gpt3_126m\n") != std::string::npos);
  CHECK(script.find("/opt/bin/pretrain_gpt \\\n    --num-layers 2 \\\n    --vocab-file '/data/my vocab.json'") !=
        std::string::npos);
  CHECK(bash_accepts(script));
}

TEST_CASE("the local script, run, sees the hostile value as text and executes nothing") {
  const fs::path results = fs::temp_directory_path() / "render_test_results";
  fs::remove_all(results);
  JobSpec job = local_job(results);
  job.command = {"bash", "-c", "printf '%s' \"$HOSTILE\" > seen.txt"};
  const Node cluster = parse_yaml("job_name_prefix: ''\n", "test");
  const fs::path script_path = fs::temp_directory_path() / "render_test_local.sh";
  write_script(script_path, render_local_script(job, script_path, {kTemplates, &cluster, "", {}}));
  const auto run = run_and_capture({"bash", script_path.string()});
  CHECK(run.exit_code == 0);
  std::ifstream seen(results / "seen.txt");
  std::string text((std::istreambuf_iterator<char>(seen)), std::istreambuf_iterator<char>());
  CHECK(text == "$(touch INJECTED); `id`");
  CHECK_FALSE(fs::exists(results / "INJECTED"));
  fs::remove_all(results);
  fs::remove(script_path);
}

TEST_CASE("the sbatch script carries the cluster config and the job in #SBATCH lines") {
  const Node cluster = parse_yaml(
      "partition: batch\naccount: llm\nexclusive: true\ngpus_per_task: null\ngpus_per_node: 8\n"
      "mem: 0\njob_name_prefix: nemo-megatron-\ngres: gpu:8\nsrun_args: [--mpi=pmix]\n"
      "stderr_to_stdout: false\nqos: high\n",
      "bcm.yaml");
  const auto job = sample_job("/lustre/results/gpt3_126m");
  const std::string script = render_sbatch(job, "/lustre/x.sh", {kTemplates, &cluster, "", {}});
  for (const char* line :
       {"#SBATCH --job-name=nemo-megatron-gpt3_126m\n", "#SBATCH --nodes=2\n",
        "#SBATCH --ntasks-per-node=8\n", "#SBATCH --partition=batch\n", "#SBATCH --account=llm\n",
        "#SBATCH --gpus-per-node=8\n", "#SBATCH --gres=gpu:8\n", "#SBATCH --mem=0\n",
        "#SBATCH --exclusive\n", "#SBATCH --time=1-00:00:00\n",
        "#SBATCH --output=/lustre/results/gpt3_126m/log-nemo-megatron-gpt3_126m_%j.out\n",
        "#SBATCH --error=/lustre/results/gpt3_126m/log-nemo-megatron-gpt3_126m_%j.err\n",
        "#SBATCH --qos=high\n", "srun --mpi=pmix /opt/bin/pretrain_gpt"}) {
    CAPTURE(line);
    CHECK(script.find(line) != std::string::npos);
  }
  CHECK(script.find("--gpus-per-task") == std::string::npos);  // null: no directive
  CHECK(bash_accepts(script));
}

TEST_CASE("a later stage depends on the previous job (afterany) and on its own run.dependency") {
  const Node cluster = parse_yaml("stderr_to_stdout: true\n", "bcm.yaml");
  JobSpec job = sample_job("/r");
  job.after_job_id = "4242";
  job.run_dependency = "singleton";
  const std::string script = render_sbatch(job, "/r/x.sh", {kTemplates, &cluster, "", {}});
  CHECK(script.find("#SBATCH --dependency=afterany:4242,singleton\n") != std::string::npos);
  job.after_job_id.clear();
  CHECK(render_sbatch(job, "/r/x.sh", {kTemplates, &cluster, "", {}}).find("#SBATCH --dependency=singleton\n") !=
        std::string::npos);
}

TEST_CASE("with a container image, srun runs the job through pyxis with the mounts") {
  const Node cluster = parse_yaml("srun_args: [--mpi=pmix]\nstderr_to_stdout: true\n", "bcm.yaml");
  const std::string script = render_sbatch(
      sample_job("/r"), "/r/x.sh",
      {kTemplates, &cluster, "nvcr.io/nvidia/nemo:24.01", {"/opt/launcher", "/data:/mnt/data"}});
  // Option and value as two words, as NeMo's scripts spell them.
  CHECK(script.find("srun --container-image nvcr.io/nvidia/nemo:24.01 "
                    "--container-mounts /opt/launcher:/opt/launcher,/data:/mnt/data "
                    "--no-container-mount-home --mpi=pmix /opt/bin/pretrain_gpt") != std::string::npos);
  const std::string bare = render_sbatch(sample_job("/r"), "/r/x.sh", {kTemplates, &cluster, "", {}});
  CHECK(bare.find("--container") == std::string::npos);
}

TEST_CASE("with a container image, the sbatch script does not look for the backend on the batch node") {
  // Regression: the check `command -v -- <backend_bin_dir>/pretrain_gpt` ran in the batch
  // script, outside the container, so a backend installed only in the image (container/,
  // backend_bin_dir=/opt/megatron_native/build/bin) stopped every job with exit 127.
  const Node cluster = parse_yaml("stderr_to_stdout: true\n", "bcm.yaml");
  const std::string bare = render_sbatch(sample_job("/r"), "/r/x.sh", {kTemplates, &cluster, "", {}});
  CHECK(bare.find("if ! command -v -- /opt/bin/pretrain_gpt >/dev/null 2>&1; then") != std::string::npos);
  const std::string contained =
      render_sbatch(sample_job("/r"), "/r/x.sh", {kTemplates, &cluster, "/images/backend.sqsh", {}});
  CHECK(contained.find("command -v") == std::string::npos);
  CHECK(contained.find("srun --container-image /images/backend.sqsh --no-container-mount-home "
                       "/opt/bin/pretrain_gpt") != std::string::npos);
}

TEST_CASE("NeMo's srun_args [--no-container-mount-home] does not put the flag on srun twice") {
  // Regression: NeMo's cluster/bcm.yaml lists it in srun_args, and the launcher adds it with
  // any container, so srun had it twice.
  const Node cluster = parse_yaml("srun_args: [--no-container-mount-home, --mpi=pmix]\n", "bcm.yaml");
  const std::string script =
      render_sbatch(sample_job("/r"), "/r/x.sh", {kTemplates, &cluster, "nvcr.io/nvidia/nemo:24.01", {"/d"}});
  CHECK(script.find("srun --container-image nvcr.io/nvidia/nemo:24.01 --container-mounts /d:/d "
                    "--no-container-mount-home --mpi=pmix /opt/bin/pretrain_gpt") != std::string::npos);
}

TEST_CASE("without a container, pyxis's options in srun_args are not passed to srun") {
  // Regression: NeMo's bcm.yaml lists --no-container-mount-home in srun_args, and with
  // container=null it reached srun, which refuses it where pyxis is not installed
  // ("srun: unrecognized option '--no-container-mount-home'"): no bare-metal job step ran.
  const Node cluster = parse_yaml(
      "srun_args: [--no-container-mount-home, --mpi=pmix, --container-writable, "
      "--no-container-entrypoint, '--container-workdir=/w', --kill-on-bad-exit=1]\n", "bcm.yaml");
  const std::string bare = render_sbatch(sample_job("/r"), "/r/x.sh", {kTemplates, &cluster, "", {}});
  CHECK(bare.find("srun --mpi=pmix --kill-on-bad-exit=1 /opt/bin/pretrain_gpt") != std::string::npos);
  CHECK(bare.find("container") == std::string::npos);
  // With a container they are pyxis's to read, and pass (the mount-home switch once).
  const std::string contained =
      render_sbatch(sample_job("/r"), "/r/x.sh", {kTemplates, &cluster, "img", {"/d"}});
  CHECK(contained.find("srun --container-image img --container-mounts /d:/d --no-container-mount-home "
                       "--mpi=pmix --container-writable --no-container-entrypoint --container-workdir=/w "
                       "--kill-on-bad-exit=1 /opt/bin/pretrain_gpt") != std::string::npos);
}

TEST_CASE("the #SBATCH lines come in NeMo's order: sorted by option name") {
  // NeMo's scripts (submitit) list the parameters sorted by name; ours used a fixed order of
  // their own, so a diff against NeMo's script showed every line moved.
  const Node cluster = parse_yaml("partition: batch\nexclusive: true\ngpus_per_node: 8\nmem: 0\n"
                                  "qos: high\n", "bcm.yaml");
  JobSpec job = sample_job("/r");
  job.run_dependency = "singleton";
  const std::string script = render_sbatch(job, "/r/x.sh", {kTemplates, &cluster, "", {}});
  std::vector<std::string> options;
  for (size_t at = script.find("#SBATCH --"); at != std::string::npos; at = script.find("#SBATCH --", at + 1)) {
    const size_t name_end = script.find_first_of("=\n", at);
    options.push_back(script.substr(at + 10, name_end - at - 10));
  }
  CHECK(options == std::vector<std::string>{"dependency", "error", "exclusive", "gpus-per-node",
                                            "job-name", "mem", "nodes", "ntasks-per-node", "output",
                                            "partition", "qos", "time"});
}

TEST_CASE("a CPU-only Slurm cluster gets no GPU request") {
  const Node cluster = parse_yaml("gres: null\ngpus_per_node: null\nstderr_to_stdout: true\n", "bcm.yaml");
  const std::string script = render_sbatch(sample_job("/r"), "/r/x.sh", {kTemplates, &cluster, "", {}});
  CHECK(script.find("gpu") == std::string::npos);
  CHECK(script.find("--error") == std::string::npos);  // stderr goes to the .out file
}

TEST_CASE("#SBATCH values that could break out of their line are refused") {
  const Node cluster = parse_yaml("partition: \"batch\\n#SBATCH --uid=0\"\n", "bcm.yaml");
  CHECK_THROWS_WITH_AS(render_sbatch(sample_job("/r"), "/r/x.sh", {kTemplates, &cluster, "", {}}),
                       doctest::Contains("#SBATCH --partition"), common::Error);
}

TEST_CASE("a missing template is named") {
  const Node cluster = parse_yaml("job_name_prefix: ''\n", "test");
  CHECK_THROWS_WITH_AS(render_local_script(local_job("/r"), "/r/x.sh", {"/no/such/dir", &cluster, "", {}}),
                       doctest::Contains("/no/such/dir/local.sh.mustache not found"), common::Error);
}

TEST_CASE("a run name holding newlines stays in the header comment of every job script") {
  TemporaryDirectory directory;
  const fs::path canary = directory.path / "pwned";
  // Stand-ins for the schedulers' task launchers.
  const fs::path bin = directory.path / "bin";
  fs::create_directories(bin);
  for (const char* launcher_name : {"srun", "mpiexec"}) {
    std::ofstream(bin / launcher_name) << "#!/bin/sh\nexit 0\n";
    fs::permissions(bin / launcher_name, fs::perms::owner_all);
  }
  JobSpec job = local_job(directory.path / "results");
  job.run_name = "x\ntouch " + canary.string() + "\n#SBATCH --uid=0\n";
  job.command = {"true"};
  const Node local = parse_yaml("job_name_prefix: ''\n", "local.yaml");
  const Node bcm = parse_yaml("stderr_to_stdout: true\n", "bcm.yaml");
  const Node pbs = parse_yaml("queue: debug\n", "pbs.yaml");
  const std::string path = fmt::format("PATH={}:{}", bin.string(), std::getenv("PATH"));
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"local", render_local_script(job, directory.path / "l.sh", {kTemplates, &local, "", {}})},
           {"bcm", render_sbatch(job, directory.path / "b.sh", {kTemplates, &bcm, "", {}})},
           {"pbs", render_pbs(job, directory.path / "p.sh", {kTemplates, &pbs, "", {}})}}) {
    // A copy: clang 14 (the asan preset) cannot refer to a structured binding in CAPTURE's lambda.
    const auto& captured_name = name;
    CAPTURE(captured_name);
    const auto& captured_text = text;
    CAPTURE(captured_text);
    fs::remove(canary);
    const fs::path script = directory.path / (name + ".sh");
    write_script(script, text);
    const auto ran = run_and_capture({"env", path, "bash", script.string()});
    CHECK(ran.exit_code == 0);
    CHECK_FALSE(fs::exists(canary));
    // The scheduler reads directives from comment lines: the run name makes none.
    CHECK(text.find("\n#SBATCH --uid") == std::string::npos);
  }
}

TEST_CASE("keys of bcm.yaml that become #SBATCH options must be [A-Za-z0-9][A-Za-z0-9_-]*") {
  const auto job = sample_job("/r");
  for (const std::string key : {"x\\ntouch pwned\\n#", "qos extra", "a=b", "mail type", "x'y", "", "--",
                          "\\u00e9t\\u00e9"}) {
    CAPTURE(key);
    const Node cluster = parse_yaml(fmt::format("stderr_to_stdout: true\n\"{}\": high\n", key), "bcm.yaml");
    CHECK_THROWS_WITH_AS(render_sbatch(job, "/r/x.sh", {kTemplates, &cluster, "", {}}),
                         doctest::Contains("[A-Za-z0-9][A-Za-z0-9_-]*"), common::Error);
  }
  const Node cluster = parse_yaml("stderr_to_stdout: true\nmail_type: END\nQoS-2: high\n", "bcm.yaml");
  const std::string script = render_sbatch(job, "/r/x.sh", {kTemplates, &cluster, "", {}});
  CHECK(script.find("#SBATCH --mail-type=END\n") != std::string::npos);
  CHECK(script.find("#SBATCH --QoS-2=high\n") != std::string::npos);
}

TEST_CASE("each #SBATCH value reaches sbatch as exactly one argument holding exactly the value") {
  const auto job = sample_job("/r");
  for (const std::string value : {"plain", "a b", "it's", "say \"hi\"", "back\\slash", "end\\", "x#y",
                                  "a #b", "'", "\"", "--uid=0", "a --uid=0", "$(touch x)", "`id`",
                                  "{privileged: true}", "*alias", "&anchor", "!!tag", "-lead", "%p", ":x",
                                  "caf\xc3\xa9", ""}) {
    CAPTURE(value);
    Node cluster = parse_yaml("stderr_to_stdout: true\n", "bcm.yaml");
    cluster.set("comment", Node::string(value));
    const std::string script = render_sbatch(job, "/r/x.sh", {kTemplates, &cluster, "", {}});
    const auto directives = test_support::sbatch_directives(script);
    CHECK_FALSE(directives.fatal);
    CHECK(directives.components == 1);
    CHECK(std::count(directives.arguments.begin(), directives.arguments.end(), "--comment=" + value) == 1);
    for (const auto& argument : directives.arguments) {
      CHECK(argument.starts_with("--"));
    }
    CHECK(bash_accepts(script));
  }
  // Slurm splits a job at "hetjob"/"packjob" on any #SBATCH line, quoted or not: refused.
  for (const std::string value : {"myhetjob", "x PackJob y"}) {
    CAPTURE(value);
    Node cluster = parse_yaml("stderr_to_stdout: true\n", "bcm.yaml");
    cluster.set("comment", Node::string(value));
    CHECK_THROWS_WITH_AS(render_sbatch(job, "/r/x.sh", {kTemplates, &cluster, "", {}}),
                         doctest::Contains("#SBATCH --comment"), common::Error);
  }
}

TEST_CASE("#PBS values are one value each, and characters PBS would re-read are refused") {
  const auto job = sample_job("/r");
  for (const std::string value : {"plain", "a b", "caf\xc3\xa9", "x:y=z"}) {
    CAPTURE(value);
    Node cluster = parse_yaml("queue: debug\n", "pbs.yaml");
    cluster.set("account", Node::string(value));
    const std::string script = render_pbs(job, "/r/x.sh", {kTemplates, &cluster, "", {}});
    const auto directives = test_support::pbs_directives(script);
    REQUIRE(directives.has_value());
    CHECK(std::count_if(directives->begin(), directives->end(), [&](const auto& directive) {
            return directive.option == "-A" && directive.value == value;
          }) == 1);
  }
  for (const std::string value : {"it's", "say \"hi\"", "back\\slash", "a\nb", "tab\there"}) {
    CAPTURE(value);
    Node cluster = parse_yaml("queue: debug\n", "pbs.yaml");
    cluster.set("account", Node::string(value));
    CHECK_THROWS_WITH_AS(render_pbs(job, "/r/x.sh", {kTemplates, &cluster, "", {}}),
                         doctest::Contains("#PBS -A"), common::Error);
  }
}

TEST_CASE("a container mount holding a comma is refused: pyxis would read two mounts") {
  const Node cluster = parse_yaml("stderr_to_stdout: true\n", "bcm.yaml");
  for (const std::string mount : {"/data/a,b", "/data:/mnt/a,b", "/x,/etc:/etc"}) {
    CAPTURE(mount);
    CHECK_THROWS_WITH_AS(
        render_sbatch(sample_job("/r"), "/r/x.sh", {kTemplates, &cluster, "nvcr.io/nvidia/nemo:24.01", {"/opt/l", mount}}),
        doctest::Contains("comma"), common::Error);
  }
  // Without a container there are no mounts to pass, so nothing to refuse.
  CHECK_NOTHROW(render_sbatch(sample_job("/r"), "/r/x.sh", {kTemplates, &cluster, "", {"/data/a,b"}}));
}

TEST_CASE("bcm.yaml switches are true, false or null: other text is refused, not read as false") {
  for (const char* key : {"exclusive", "stderr_to_stdout"}) {
    CAPTURE(key);
    Node cluster = parse_yaml("gres: null\n", "bcm.yaml");
    cluster.set(key, Node::string("$(touch x)"));
    const std::string named = std::string("cluster.") + key;
    CHECK_THROWS_WITH_AS(render_sbatch(sample_job("/r"), "/r/x.sh", {kTemplates, &cluster, "", {}}),
                         doctest::Contains(named.c_str()), common::Error);
  }
}

TEST_CASE("paths starting with '-' are never read as options by the script's commands") {
  TemporaryDirectory directory;
  const fs::path bin = directory.path / "bin";
  fs::create_directories(bin);
  for (const char* launcher_name : {"srun", "mpiexec"}) {
    std::ofstream(bin / launcher_name) << "#!/bin/sh\nexit 0\n";
    fs::permissions(bin / launcher_name, fs::perms::owner_all);
  }
  // A relative results directory named like an option: mkdir and cd must take it as a path.
  JobSpec job = local_job("-results");
  job.command = {"true"};
  const Node local = parse_yaml("job_name_prefix: ''\n", "local.yaml");
  const Node bcm = parse_yaml("stderr_to_stdout: true\n", "bcm.yaml");
  const Node pbs = parse_yaml("queue: debug\n", "pbs.yaml");
  const std::string path = fmt::format("PATH={}:{}", bin.string(), std::getenv("PATH"));
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"local", render_local_script(job, "l.sh", {kTemplates, &local, "", {}})},
           {"bcm", render_sbatch(job, "b.sh", {kTemplates, &bcm, "", {}})},
           {"pbs", render_pbs(job, "p.sh", {kTemplates, &pbs, "", {}})}}) {
    const auto& captured_name = name;
    CAPTURE(captured_name);
    fs::remove_all(directory.path / "-results");
    const fs::path script = directory.path / (name + ".sh");
    write_script(script, text);
    const auto ran = run_and_capture({"env", path, "bash", "-c", "cd \"$0\" && bash \"$1\"",
                                      directory.path.string(), script.string()});
    CHECK_MESSAGE(ran.exit_code == 0, ran.output);
    CHECK(fs::is_directory(directory.path / "-results"));
  }
  // A program named like an option would be one to srun, mpirun or mpiexec: refused.
  job.command = {"-x/pretrain_gpt", "--num-layers", "2"};
  CHECK_THROWS_WITH_AS(render_sbatch(job, "b.sh", {kTemplates, &bcm, "", {}}),
                       doctest::Contains("backend_bin_dir"), common::Error);
  CHECK_THROWS_WITH_AS(render_local_script(job, "l.sh", {kTemplates, &local, "", {}}),
                       doctest::Contains("backend_bin_dir"), common::Error);
}

TEST_CASE("an environment name that is not an identifier never reaches an export line") {
  const Node cluster = parse_yaml("job_name_prefix: ''\n", "local.yaml");
  JobSpec job = local_job("/r");
  job.environment = {{"X=1; touch pwned; Y", "v"}};
  CHECK_THROWS_WITH_AS(render_local_script(job, "/r/x.sh", {kTemplates, &cluster, "", {}}),
                       doctest::Contains("env_vars."), common::Error);
}

namespace {

// A GPU training job's sbatch script as NeMo's bcm.yaml renders it, with NCCL's variables in
// env_vars.
std::string gpu_training_sbatch(std::vector<std::string> srun_args = {},
                                std::vector<std::pair<std::string, std::string>> extra = {}) {
  std::string yaml =
      "partition: null\naccount: null\nexclusive: true\ngpus_per_task: null\ngpus_per_node: 8\n"
      "mem: 0\njob_name_prefix: nemo-megatron-\ngres: null\nstderr_to_stdout: true\nsrun_args: [";
  for (size_t i = 0; i < srun_args.size(); ++i) yaml += (i ? ", " : "") + srun_args[i];
  const Node cluster = parse_yaml(yaml + "]\n", "bcm.yaml");
  JobSpec job = sample_job("/lustre/results/gpt3_126m");
  job.environment = {{"NCCL_DEBUG", "WARN"}, {"NCCL_IB_HCA", "mlx5_0,mlx5_1"}};
  job.environment.insert(job.environment.end(), extra.begin(), extra.end());
  job.ranks_meet = true;
  job.tool = "pretrain_gpt";
  return render_sbatch(job, "/lustre/x.sh", {kTemplates, &cluster, "", {}});
}

// The script's lines from its first export to the srun line, run by bash with Slurm's variables
// and `scontrol` and `srun` on PATH answering as a cluster would; prints what srun would get.
std::string run_script_setup(const std::string& script, const std::string& mpi_list) {
  TemporaryDirectory directory;
  const fs::path bin = directory.path / "bin";
  fs::create_directories(bin);
  std::ofstream(bin / "scontrol") << "#!/bin/sh\n[ \"$1 $2 $3\" = 'show hostnames gpu[017-018]' ] "
                                     "&& printf 'gpu017\\ngpu018\\n'\n";
  std::ofstream(bin / "srun") << "#!/bin/sh\n[ \"$1\" = --mpi=list ] && printf '%s\\n' " +
                                     mpi_list + " >&2\n";
  fs::permissions(bin / "scontrol", fs::perms::owner_all);
  fs::permissions(bin / "srun", fs::perms::owner_all);
  const size_t begin = script.find("\nexport ");
  const size_t end = script.find("\nif ! command -v");
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  std::string setup_lines;
  std::istringstream lines(script.substr(begin, end - begin));
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("mkdir ") || line.starts_with("cd ")) continue;  // the results directory
    setup_lines += line + "\n";
  }
  const fs::path setup = directory.path / "setup.sh";
  std::ofstream(setup) << "set -euo pipefail\nPATH=" << bin.string() << ":$PATH\n"
                       << "SLURM_JOB_NODELIST='gpu[017-018]' SLURM_JOB_ID=7723456\n"
                       << setup_lines
                       << "printf '%s %s <%s>\\n' \"$MASTER_ADDR\" \"$MASTER_PORT\" "
                          "\"${srun_mpi:-}\"\n";
  const auto run = run_and_capture({"bash", setup.string()});
  INFO(run.output);
  CHECK(run.exit_code == 0);
  return run.output;
}

}  // namespace

TEST_CASE("a GPU training job's sbatch script: NCCL's env_vars, the rendezvous, srun under PMIx") {
  const std::string script = gpu_training_sbatch();
  test_support::check_golden(script, "training_gpu_sbatch.sh");
  CHECK(bash_accepts(script));
  CHECK(script.find("#SBATCH --ntasks-per-node=8\n#SBATCH --output=") != std::string::npos);
  CHECK(script.find("export NCCL_IB_HCA=mlx5_0,mlx5_1\n") != std::string::npos);
  CHECK(script.find("srun ${srun_mpi:+\"$srun_mpi\"} /opt/bin/pretrain_gpt") != std::string::npos);
  // The first node of the allocation, a port from the job id (Lightning's 15000 + its last
  // four digits), and --mpi=pmix exactly where this Slurm lists PMIx.
  CHECK(run_script_setup(script,
                         "'MPI plugin types are...' none pmi2 pmix "
                         "'specific pmix plugin versions available: pmix_v4'") ==
        "gpu017 18456 <--mpi=pmix>\n");
  CHECK(run_script_setup(script, "'MPI plugin types are...' none cray_shasta pmi2") ==
        "gpu017 18456 <>\n");
}

TEST_CASE(
    "srun_args choosing an --mpi plugin, env_vars setting MASTER_ADDR, one task: left as given") {
  const std::string chosen = gpu_training_sbatch({"--mpi=pmi2"});
  CHECK(chosen.find("srun_mpi") == std::string::npos);
  CHECK(chosen.find("srun --mpi=pmi2 /opt/bin/pretrain_gpt") != std::string::npos);
  CHECK(chosen.find("export MASTER_PORT=$((15000") != std::string::npos);
  const std::string given =
      gpu_training_sbatch({}, {{"MASTER_ADDR", "head.example"}, {"MASTER_PORT", "29500"}});
  CHECK(given.find("export MASTER_ADDR=head.example\nexport MASTER_PORT=29500\n") !=
        std::string::npos);
  CHECK(given.find("scontrol show hostnames") == std::string::npos);
  // One task meets nobody; a data-preparation job is not a training job's ranks.
  const Node cluster = parse_yaml("gpus_per_node: 8\n", "bcm.yaml");
  JobSpec alone = sample_job("/lustre/results/gpt3_126m");
  alone.nodes = 1;
  alone.tasks_per_node = 1;
  alone.ranks_meet = true;
  const std::string one = render_sbatch(alone, "/lustre/x.sh", {kTemplates, &cluster, "", {}});
  CHECK(one.find("MASTER_ADDR") == std::string::npos);
  CHECK(one.find("srun_mpi") == std::string::npos);
  const std::string other = render_sbatch(sample_job("/lustre/results/gpt3_126m"), "/lustre/x.sh",
                                          {kTemplates, &cluster, "", {}});
  CHECK(other.find("MASTER_ADDR") == std::string::npos);
}
