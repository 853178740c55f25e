// PBS and Kubernetes have no server here: their rendered script and manifest are compared with
// golden files (regenerate with UPDATE_GOLDEN=1 after an intended change and review the diff),
// the manifest is parsed back as YAML, and the conversions they rely on are checked.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "backend/common/error.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/clusters/golden_files.hpp"
#include "launcher/config/yaml_io.hpp"
#include "launcher/process.hpp"
#include "temporary_directory.hpp"

using namespace launcher;
namespace fs = std::filesystem;

namespace {

using test_support::kTemplates;
using test_support::check_golden;

JobSpec two_node_job() {
  JobSpec job;
  job.stage = "training";
  job.run_name = "gpt3_5b";
  job.job_name = "nemo-megatron-gpt3_5b";
  job.results_dir = "/lus/eagle/results/gpt3_5b";
  job.command = {"/opt/megatron-native/bin/pretrain_gpt", "--num-layers", "24", "--lr", "1.6e-4",
                 "--data-path", "/data/my corpus_text_document"};
  job.environment = {{"NCCL_DEBUG", "WARN"}, {"QUOTED", "it's \"here\""}};
  job.nodes = 2;
  job.tasks_per_node = 4;
  job.time_limit = "0-06:00:00";
  job.tool = "pretrain_gpt";
  job.after_job_id = "1234.polaris-pbs-01";
  return job;
}

}  // namespace

TEST_CASE("the PBS script matches its golden file and bash accepts it") {
  const Node cluster = parse_yaml(
      "queue: prod\naccount: LLMProject\nselect: system=polaris\nwalltime: null\n"
      "filesystems: home:eagle\nplace: scatter\njob_name_prefix: nemo-megatron-\n",
      "pbs.yaml");
  const std::string script =
      render_pbs(two_node_job(), "/lus/eagle/results/gpt3_5b/x.sh", {kTemplates, &cluster, "", {}});
  check_golden(script, "training_pbs.sh");
  CHECK(script.find("#PBS -l select=2:system=polaris\n") != std::string::npos);
  CHECK(script.find("#PBS -l walltime=6:00:00\n") != std::string::npos);
  CHECK(script.find("#PBS -W depend=afterany:1234.polaris-pbs-01\n") != std::string::npos);
  CHECK(script.find("mpiexec -n 8 --ppn 4 /opt/megatron-native/bin/pretrain_gpt") != std::string::npos);
  const fs::path file = fs::temp_directory_path() / "pbs_golden_check.sh";
  std::ofstream(file) << script;
  CHECK(run_and_capture({"bash", "-n", file.string()}).exit_code == 0);
  fs::remove(file);
}

TEST_CASE("Slurm time limits convert to PBS walltime") {
  const std::string key = "training.run.time_limit";
  CHECK(pbs_walltime("1-00:00:00", key) == "24:00:00");
  CHECK(pbs_walltime("2-03", key) == "51:00:00");
  CHECK(pbs_walltime("0:30:00", key) == "0:30:00");
  CHECK(pbs_walltime("90", key) == "1:30:00");
  CHECK(pbs_walltime("4:30", key) == "0:04:30");
  CHECK(pbs_walltime("100000-00:00:00", key) == "2400000:00:00");
  CHECK_THROWS_WITH_AS(pbs_walltime("tomorrow", key),
                       doctest::Contains("training.run.time_limit 'tomorrow' is not a Slurm time"),
                       common::Error);
  CHECK_THROWS_AS(pbs_walltime("1-2:3:4:5", key), common::Error);
}

TEST_CASE("a time limit too long for any walltime is refused, naming the key and the valid forms") {
  JobSpec job = two_node_job();
  const Node cluster = parse_yaml("queue: debug\n", "pbs.yaml");
  for (const std::string limit :
       {"999999999999999-00:00:00", "99999999999999999999-00:00:00", "106751991167300-16",
        "153722867280912931", "9223372036854775807", "0:153722867280912931:0", "-5", "5-", "1--2", ""}) {
    CAPTURE(limit);
    job.time_limit = limit;
    if (limit.empty()) {  // no limit: no walltime line
      CHECK(render_pbs(job, "/r/x.sh", {kTemplates, &cluster, "", {}}).find("walltime") == std::string::npos);
      continue;
    }
    CHECK_THROWS_WITH_AS(render_pbs(job, "/r/x.sh", {kTemplates, &cluster, "", {}}),
                         doctest::Contains("training.run.time_limit"), common::Error);
    CHECK_THROWS_WITH_AS(pbs_walltime(limit, "training.run.time_limit"), doctest::Contains("D-H:M:S"),
                         common::Error);
  }
}

TEST_CASE("the PyTorchJob manifest matches its golden file and parses as the right object") {
  const Node cluster = parse_yaml(
      "namespace: llm\nimage_pull_secret: ngc-secret\nshm_size: 512Gi\ngpus_per_node: 8\n"
      "nfs_server: 10.0.0.5\nnfs_path: /lus/eagle\njob_name_prefix: nemo-megatron-\n",
      "k8s.yaml");
  JobSpec job = two_node_job();
  job.after_job_id.clear();
  const std::string manifest = render_pytorchjob(
      job, "/lus/eagle/results/gpt3_5b/x.yaml",
      {kTemplates, &cluster, "nvcr.io/example/megatron-native:0.1", {}});
  check_golden(manifest, "training_pytorchjob.yaml");

  const Node parsed = parse_yaml(manifest, "manifest");
  CHECK(at_path(parsed, "kind").as_string() == "PyTorchJob");
  CHECK(at_path(parsed, "metadata.name").as_string() == "nemo-megatron-gpt3-5b");
  CHECK(at_path(parsed, "metadata.namespace").as_string() == "llm");
  CHECK(at_path(parsed, "spec.pytorchReplicaSpecs.Master.replicas").as_int() == 1);
  CHECK(at_path(parsed, "spec.pytorchReplicaSpecs.Worker.replicas").as_int() == 1);
  const std::string container = "spec.pytorchReplicaSpecs.Worker.template.spec.containers.0";
  CHECK(at_path(parsed, container + ".image").as_string() == "nvcr.io/example/megatron-native:0.1");
  CHECK(at_path(parsed, container + ".resources.limits").at("nvidia.com/gpu").as_int() == 8);
  // The environment value survives YAML quoting exactly.
  CHECK(at_path(parsed, container + ".env.1.value").as_string() == "it's \"here\"");
  // The command is one bash line in which the path with a space stays one word.
  const std::string script = at_path(parsed, container + ".args.0").as_string();
  CHECK(script.find("'/data/my corpus_text_document'") != std::string::npos);
  CHECK(at_path(parsed, "spec.pytorchReplicaSpecs.Master.template.spec.volumes.1.nfs.server")
            .as_string() == "10.0.0.5");
}

TEST_CASE("Kubernetes needs an image and paired NFS settings, and gets RFC 1123 names") {
  const Node cluster = parse_yaml("namespace: default\nnfs_server: 10.0.0.5\n", "k8s.yaml");
  CHECK_THROWS_WITH_AS(render_pytorchjob(two_node_job(), "/x.yaml", {kTemplates, &cluster, "", {}}),
                       doctest::Contains("cluster_type k8s needs an image"), common::Error);
  CHECK_THROWS_WITH_AS(render_pytorchjob(two_node_job(), "/x.yaml", {kTemplates, &cluster, "img", {}}),
                       doctest::Contains("cluster.nfs_server and cluster.nfs_path go together"),
                       common::Error);
  CHECK(kubernetes_name("NeMo_Megatron.GPT3 5b") == "nemo-megatron-gpt3-5b");
  CHECK(kubernetes_name("__x__") == "x");
  CHECK(kubernetes_name(std::string(100, 'a')).size() == 63);
  CHECK_THROWS_AS(kubernetes_name("___"), common::Error);
}

namespace {
// The map keys of a parsed YAML document, as dotted paths (list items as "-").
void collect_keys(const YAML::Node& node, const std::string& prefix, std::set<std::string>& keys) {
  if (node.IsMap()) {
    for (const auto& entry : node) {
      const std::string key = prefix + entry.first.as<std::string>();
      keys.insert(key);
      collect_keys(entry.second, key + ".", keys);
    }
  } else if (node.IsSequence()) {
    for (const auto& item : node) collect_keys(item, prefix + "-.", keys);
  }
}

std::set<std::string> manifest_keys(const std::string& manifest) {
  std::set<std::string> keys;
  collect_keys(YAML::Load(manifest), "", keys);
  return keys;
}

const char* const kK8sCluster =
    "namespace: llm\nimage_pull_secret: ngc-secret\nshm_size: 512Gi\ngpus_per_node: 8\n"
    "nfs_server: 10.0.0.5\nnfs_path: /lus/eagle\njob_name_prefix: nemo-megatron-\n";
}  // namespace

TEST_CASE("a run name holding YAML adds no key to the PyTorchJob manifest") {
  const Node cluster = parse_yaml(kK8sCluster, "k8s.yaml");
  JobSpec job = two_node_job();
  job.after_job_id.clear();
  const RenderContext context{kTemplates, &cluster, "nvcr.io/example/megatron-native:0.1", {}};
  const std::set<std::string> expected = manifest_keys(render_pytorchjob(job, "/r/x.yaml", context));
  for (const std::string& run_name : {std::string("r\nevil: true\n#"), std::string("r\r\nevil: true"),
                                      std::string("r\xe2\x80\xa8" "evil: true"),
                                      std::string("r\"\nevil: true\n\"")}) {
    CAPTURE(run_name);
    job.run_name = run_name;
    job.results_dir = "/r/" + run_name;
    const std::string manifest = render_pytorchjob(job, "/r/" + run_name + "/x.yaml", context);
    CAPTURE(manifest);
    CHECK(manifest_keys(manifest) == expected);
    const YAML::Node parsed = YAML::Load(manifest);
    CHECK_FALSE(parsed["evil"]);
    const YAML::Node env = parsed["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"];
    CHECK(env[env.size() - 1]["value"].as<std::string>() == run_name);
  }
}

TEST_CASE("cluster.gpus_per_node must be a whole number: text there cannot reach the pod spec") {
  JobSpec job = two_node_job();
  job.after_job_id.clear();
  const Node hostile = parse_yaml(
      "namespace: llm\ngpus_per_node: \"8\\n  securityContext: {privileged: true}\"\n", "k8s.yaml");
  CHECK_THROWS_WITH_AS(render_pytorchjob(job, "/r/x.yaml", {kTemplates, &hostile, "img", {}}),
                       doctest::Contains("cluster.gpus_per_node"), common::Error);
  const Node negative = parse_yaml("namespace: llm\ngpus_per_node: -1\n", "k8s.yaml");
  CHECK_THROWS_WITH_AS(render_pytorchjob(job, "/r/x.yaml", {kTemplates, &negative, "img", {}}),
                       doctest::Contains("cluster.gpus_per_node"), common::Error);
  // Unset: one GPU per task.
  const Node unset = parse_yaml("namespace: llm\ngpus_per_node: null\n", "k8s.yaml");
  const YAML::Node parsed = YAML::Load(render_pytorchjob(job, "/r/x.yaml", {kTemplates, &unset, "img", {}}));
  const YAML::Node limits =
      parsed["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]["limits"];
  CHECK(limits["nvidia.com/gpu"].as<int>() == job.tasks_per_node);
  CHECK(limits.size() == 1);
}

TEST_CASE("every string reaches the manifest exactly, as ASCII, whatever its bytes") {
  const Node cluster = parse_yaml(kK8sCluster, "k8s.yaml");
  JobSpec job = two_node_job();
  job.after_job_id.clear();
  std::string every_byte;
  for (int byte = 1; byte < 0x80; ++byte) every_byte += static_cast<char>(byte);
  job.environment = {{"ASCII", every_byte},
                     {"BREAKS", "a\xc2\x85" "b\xe2\x80\xa8" "c\xe2\x80\xa9" "d\xef\xbb\xbf" "e"},
                     {"WORDS", "true"}, {"NUMBER", "8"}, {"EMPTY", ""}, {"NULL", "null"},
                     {"YAML", "*alias &anchor !!tag {a: b} [c] - d % e @ f | g > h"}};
  const std::string manifest =
      render_pytorchjob(job, "/r/x.yaml", {kTemplates, &cluster, "nvcr.io/example/megatron-native:0.1", {}});
  for (char c : manifest) {
    const auto byte = static_cast<unsigned char>(c);
    REQUIRE_MESSAGE(((byte >= 0x20 && byte < 0x7f) || byte == '\n'), "byte " << int(byte) << " in the manifest");
  }
  const YAML::Node env = YAML::Load(manifest)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
                                             ["containers"][0]["env"];
  REQUIRE(env.size() == job.environment.size() + 1);
  for (size_t i = 0; i < job.environment.size(); ++i) {
    CAPTURE(job.environment[i].first);
    CHECK(env[i]["name"].as<std::string>() == job.environment[i].first);
    CHECK(env[i]["value"].Tag() == "!");  // quoted: a string, never retyped
    CHECK(env[i]["value"].as<std::string>() == job.environment[i].second);
  }
  job.environment = {{"BAD", "\xff\xfe"}};
  CHECK_THROWS_WITH_AS(
      render_pytorchjob(job, "/r/x.yaml", {kTemplates, &cluster, "img", {}}),
      doctest::Contains("UTF-8"), common::Error);
}

TEST_CASE(
    "a pod of several tasks starts one process per GPU with torchrun's variables, and fails with "
    "the first") {
  // The operator's variables count pods (WORLD_SIZE 2, this pod RANK 1); the pod's four tasks
  // must be global ranks 4-7 of 8, local ranks 0-3, with the command's words intact.
  test_support::TemporaryDirectory directory;
  const fs::path program = directory.path / "fake pretrain_gpt";
  std::ofstream(program) << "#!/bin/bash\n"
                            "[ \"$LOCAL_RANK\" = \"$FAIL_AT\" ] && exit 3\n"
                            "[ -n \"$FAIL_AT\" ] && exec sleep 30\n"
                            "printf '%s %s %s %s|%s\\n' \"$RANK\" \"$LOCAL_RANK\" \"$WORLD_SIZE\" "
                            "\"$MASTER_ADDR\" \"$2\" > \"rank_$RANK\"\n";
  fs::permissions(program, fs::perms::owner_all);
  const Node cluster = parse_yaml("namespace: llm\n", "k8s.yaml");
  JobSpec job = two_node_job();
  job.after_job_id.clear();
  job.results_dir = directory.path / "results";
  job.command = {program.string(), "--data-path", "my corpus; rm -rf /"};
  job.environment.clear();
  // The line the worker pods' container runs, as rendered for `job`.
  const auto pod_script = [&](const std::string& file_name) {
    const std::string manifest =
        render_pytorchjob(job, (directory.path / file_name).string(),
                          {kTemplates, &cluster, "nvcr.io/example/megatron-native:0.1", {}});
    return at_path(parse_yaml(manifest, "manifest"),
                   "spec.pytorchReplicaSpecs.Worker.template.spec.containers.0.args.0")
        .as_string();
  };
  const std::string script = pod_script("x.yaml");
  const auto ran = run_and_capture(
      {"/usr/bin/env", "WORLD_SIZE=2", "RANK=1", "MASTER_ADDR=master-0", "bash", "-c", script});
  INFO(ran.output);
  REQUIRE(ran.exit_code == 0);
  for (int local = 0; local < 4; ++local) {
    std::ifstream line_file(job.results_dir / ("rank_" + std::to_string(4 + local)));
    std::string line;
    std::getline(line_file, line);
    CHECK(line == fmt::format("{} {} 8 master-0|my corpus; rm -rf /", 4 + local, local));
  }
  CHECK_FALSE(fs::exists(job.results_dir / "rank_3"));
  CHECK_FALSE(fs::exists(job.results_dir / "rank_8"));

  // Task 2 fails while the others would wait 30 s: the pod ends at once with its status.
  const auto start = std::chrono::steady_clock::now();
  const auto failed = run_and_capture(
      {"/usr/bin/env", "WORLD_SIZE=2", "RANK=0", "FAIL_AT=2", "bash", "-c", script});
  CHECK(failed.exit_code == 3);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));

  // A task that fails before the pod has started the others (here the first of 32, at once):
  // bash's `wait -n` missed it and the pod waited 30 s for the rest (this test under load, and
  // always at 32 tasks); the pod watches its tasks by pid instead.
  job.tasks_per_node = 32;
  const std::string wide = pod_script("w.yaml");
  const auto early_start = std::chrono::steady_clock::now();
  const auto early =
      run_and_capture({"/usr/bin/env", "WORLD_SIZE=1", "RANK=0", "FAIL_AT=0", "bash", "-c", wide});
  CHECK(early.exit_code == 3);
  CHECK(std::chrono::steady_clock::now() - early_start < std::chrono::seconds(20));

  // One task per pod: the command itself, exec'd.
  job.tasks_per_node = 1;
  const std::string single =
      render_pytorchjob(job, (directory.path / "y.yaml").string(),
                        {kTemplates, &cluster, "nvcr.io/example/megatron-native:0.1", {}});
  CHECK(single.find("; exec -- ") != std::string::npos);
  CHECK(single.find("LOCAL_RANK") == std::string::npos);
}
