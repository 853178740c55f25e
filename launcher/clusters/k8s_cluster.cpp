// Kubernetes with the Kubeflow training operator: a PyTorchJob manifest (Master, plus Workers
// for more than one node) written into the results directory and applied with
// `kubectl apply -f`; a job's state is its last condition (`kubectl get pytorchjob`). The
// manifest is built as a tree (nlohmann ordered_json, keys in the order written) and emitted by
// yaml-cpp, never by text templating, so no value can add a key:
// every string is a double-quoted scalar (never retyped: "8", "true" and "null" stay strings),
// escaped to ASCII (YAML 1.1 readers such as kubectl's also break lines at U+0085, U+2028 and
// U+2029), and must be valid UTF-8 (Kubernetes strings are UTF-8; yaml-cpp would replace a bad
// byte silently). Comments hold no value. The container runs one bash command line whose words
// went through shell_quote.
// Reference: Kubeflow training-operator PyTorchJob API (kubeflow.org/v1),
// NeMo-Megatron-Launcher's k8s cluster config (namespace, image pull secret, shm size, NFS).
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <stdexcept>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/config/scalar_text.hpp"
#include "backend/common/utf8.hpp"
#include "launcher/process.hpp"
#include "launcher/shell_quote.hpp"

namespace launcher {

namespace {

using Manifest = nlohmann::ordered_json;

// What the pod's container runs after its checks. The training operator starts one container
// per pod and tells it the pods' count and its index (WORLD_SIZE, RANK; MASTER_ADDR and
// MASTER_PORT name the Master pod), as torchrun's variables count processes. One task per pod:
// the command itself. Several (trainer.devices, one per GPU): the pod starts them itself, as
// torchrun --nproc_per_node would, each with its global RANK, LOCAL_RANK (its GPU) and the
// processes' WORLD_SIZE, so that pretrain_gpt's GPU ranks meet through the TCP rendezvous; the
// first task to fail ends the others and the pod with its status, so a failed rank fails the
// job at once rather than leaving the rest waiting for it until their timeout.
std::string pod_processes(const JobSpec& job) {
  if (job.tasks_per_node <= 1) return "exec -- " + shell_join(job.command);
  // The pod looks at its tasks every second (torchrun's agent monitors its workers the same
  // way): a task that is gone was reaped by bash, and `wait PID` gives its status, which bash
  // keeps. Not `wait -n`: bash 5.2's returns only a task ending while it waits, so one that
  // failed before (a bad flag, at once) would go unseen until every other task ended.
  return fmt::format(
      "pods=${{WORLD_SIZE:-1}}; pod=${{RANK:-0}}; per_pod={0}; export WORLD_SIZE=$((pods * "
      "per_pod)); pids=(); for local_rank in $(seq 0 $((per_pod - 1))); do RANK=$((pod * per_pod "
      "+ local_rank)) LOCAL_RANK=$local_rank {1} & pids+=($!); done; end_all() {{ kill -- "
      "\"${{pids[@]}}\" 2>/dev/null || true; wait || true; exit \"$1\"; }}; while [ "
      "\"${{#pids[@]}}\" -gt 0 ]; do for i in \"${{!pids[@]}}\"; do if ! kill -0 "
      "\"${{pids[$i]}}\" 2>/dev/null; then status=0; wait \"${{pids[$i]}}\" || status=$?; "
      "unset \"pids[$i]\"; [ \"$status\" -eq 0 ] || end_all \"$status\"; fi; done; [ "
      "\"${{#pids[@]}}\" -eq 0 ] || sleep 1; done",
      job.tasks_per_node, shell_join(job.command));
}

// A value bound for the manifest, checked where its name is known.
std::string manifest_text(const std::string& value, std::string_view what) {
  if (common::first_invalid_utf8(value)) {
    common::fail("{} = {:?} is not valid UTF-8, which a Kubernetes manifest needs", what, value);
  }
  return value;
}

void emit(YAML::Emitter& out, const Manifest& node) {
  switch (node.type()) {
    case Manifest::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [key, value] : node.items()) {
        out << YAML::Key << key << YAML::Value;
        emit(out, value);
      }
      out << YAML::EndMap;
      break;
    case Manifest::value_t::array:
      out << YAML::BeginSeq;
      for (const auto& item : node) emit(out, item);
      out << YAML::EndSeq;
      break;
    case Manifest::value_t::string:
      out << YAML::DoubleQuoted << node.get_ref<const std::string&>();
      break;
    case Manifest::value_t::number_integer:
    case Manifest::value_t::number_unsigned:
      out << node.get<int64_t>();
      break;
    case Manifest::value_t::boolean:
      out << node.get<bool>();
      break;
    default:  // render_pytorchjob builds no null, float or binary value
      throw std::logic_error(fmt::format("PyTorchJob manifest: unexpected {} value", node.type_name()));
  }
}

}  // namespace

std::string kubernetes_name(const std::string& job_name) {
  std::string name;
  for (char c : job_name) {
    const unsigned char u = static_cast<unsigned char>(c);
    name += std::isalnum(u) ? static_cast<char>(std::tolower(u)) : '-';
  }
  if (name.size() > 63) name.resize(63);
  while (!name.empty() && name.front() == '-') name.erase(name.begin());
  while (!name.empty() && name.back() == '-') name.pop_back();
  if (name.empty()) common::fail("job name {:?} has no letters or digits for a Kubernetes name", job_name);
  return name;
}

// The manifest's path is not written into it: its comments hold no value.
std::string render_pytorchjob(const JobSpec& job, const std::filesystem::path& /*manifest_path*/,
                              const RenderContext& context) {
  if (job.is_array()) {
    common::fail("{}: job arrays ({} tasks) are not rendered for {}; use cluster_type=bcm or local",
                 job.job_name, job.array_tasks.size(), "Kubernetes");
  }
  if (context.container_image.empty()) {
    common::fail("cluster_type k8s needs an image with the backend: set `container` in "
                 "config.yaml or pass container=<image>");
  }
  const Node& cluster = *context.cluster;
  auto cluster_value = [&](const char* key, const char* fallback) {
    return manifest_text(text_or(cluster, "cluster", key, fallback), fmt::format("cluster.{}", key));
  };
  check_program(job);
  const std::string tool = job.tool.empty() ? job.command.front() : job.tool;
  for (const auto& word : job.command) manifest_text(word, fmt::format("the {} command's argument", job.stage));
  const std::string script = fmt::format(
      "set -euo pipefail; mkdir -p -- {0}; cd -- {0}; if ! command -v -- {1} >/dev/null 2>&1; then "
      "echo {2} "
      ">&2; exit 127; fi; {3}",
      shell_quote(
          manifest_text(job.results_dir.string(), fmt::format("{}.run.results_dir", job.stage))),
      shell_quote(job.command.front()),
      shell_quote(fmt::format("launcher: the {} stage needs {}, which is not at {} in the image",
                              job.stage, tool, job.command.front())),
      pod_processes(job));

  const int64_t gpus_per_node = integer_or(cluster, "cluster", "gpus_per_node", job.tasks_per_node);
  if (gpus_per_node < 0) {
    common::fail("cluster.gpus_per_node is {}: expected a whole number of GPUs ≥ 0, or null for one "
                 "per task (trainer.devices)", gpus_per_node);
  }
  const std::string nfs_server = cluster_value("nfs_server", ""), nfs_path = cluster_value("nfs_path", "");
  if (nfs_server.empty() != nfs_path.empty()) {
    common::fail("cluster.nfs_server and cluster.nfs_path go together: set both or neither");
  }

  Manifest environment = Manifest::array();
  for (const auto& [name, value] : job.environment) {
    const std::string key = fmt::format("env_vars.{}", name);
    environment.push_back({{"name", manifest_text(name, key)}, {"value", manifest_text(value, key)}});
  }
  environment.push_back({{"name", "LAUNCHER_RUN_NAME"},
                         {"value", manifest_text(job.run_name, fmt::format("{}.run.name", job.stage))}});
  Manifest container = {
      {"name", "pytorch"},
      {"image", manifest_text(context.container_image, "container")},
      {"command", Manifest::array({"bash", "-c"})},
      {"args", Manifest::array({script})},
      {"env", environment},
      {"resources", {{"limits", {{"nvidia.com/gpu", gpus_per_node}}}}},
      {"volumeMounts", Manifest::array({{{"name", "dshm"}, {"mountPath", "/dev/shm"}}})},
  };
  Manifest volumes = Manifest::array(
      {{{"name", "dshm"},
        {"emptyDir", {{"medium", "Memory"}, {"sizeLimit", cluster_value("shm_size", "64Gi")}}}}});
  if (!nfs_server.empty()) {
    container["volumeMounts"].push_back({{"name", "workspace"}, {"mountPath", nfs_path}});
    volumes.push_back({{"name", "workspace"}, {"nfs", {{"server", nfs_server}, {"path", nfs_path}}}});
  }
  Manifest pod_spec = Manifest::object();
  if (const std::string secret = cluster_value("image_pull_secret", ""); !secret.empty()) {
    pod_spec["imagePullSecrets"] = Manifest::array({{{"name", secret}}});
  }
  pod_spec["containers"] = Manifest::array({container});
  pod_spec["volumes"] = volumes;

  Manifest replica_specs = Manifest::object();
  for (const auto& [role, count] : std::vector<std::pair<std::string, int>>{
           {"Master", 1}, {"Worker", job.nodes - 1}}) {
    if (count < 1) continue;
    replica_specs[role] = {{"replicas", count}, {"restartPolicy", "Never"}, {"template", {{"spec", pod_spec}}}};
  }
  const Manifest manifest = {
      {"apiVersion", "kubeflow.org/v1"},
      {"kind", "PyTorchJob"},
      {"metadata",
       {{"name", kubernetes_name(job.job_name)},
        {"namespace", cluster_value("namespace", "default")},
        {"labels", {{"app.kubernetes.io/managed-by", "megatron-native-launcher"}, {"stage", job.stage}}}}},
      {"spec", {{"pytorchReplicaSpecs", replica_specs}}},
  };

  YAML::Emitter out;
  out.SetOutputCharset(YAML::EscapeNonAscii);
  emit(out, manifest);
  if (!out.good()) throw std::logic_error("yaml-cpp could not emit the PyTorchJob manifest: " + out.GetLastError());
  return fmt::format("# Generated by launcher {}: a Kubeflow PyTorchJob (the stage, run and command are in "
                     "its fields).\n# Apply with: kubectl apply -f <this file>\n{}\n",
                     PROJECT_VERSION_STRING, out.c_str());
}

namespace {

// kubectl apply -f manifest when kubectl is on PATH; otherwise says how to apply it and
// returns an empty job id.
Submission apply_pytorchjob(const JobSpec& job, const std::filesystem::path& manifest_path) {
  Submission submission;
  if (!find_on_path("kubectl")) {
    spdlog::info("kubectl is not on PATH: the manifest is written; apply it with "
                 "kubectl apply -f {}", shell_quote(manifest_path.string()));
    return submission;
  }
  const CapturedRun run = run_and_capture({"kubectl", "apply", "-f", manifest_path.string()});
  if (run.exit_code != 0) {
    common::fail("kubectl apply -f {} failed (exit {}): {}", manifest_path.string(), run.exit_code,
                 run.output);
  }
  submission.job_id = kubernetes_name(job.job_name);
  return submission;
}

class KubernetesCluster final : public Cluster {
 public:
  std::string_view name() const override { return "k8s"; }
  std::string_view script_suffix() const override { return "_submission.yaml"; }

  void check_launch(const std::vector<JobSpec>& jobs, const Node& /*config*/,
                    const Node& /*cluster*/, bool /*dry_run*/) const override {
    refuse_job_arrays(jobs, name());
  }

  std::string render(const JobSpec& job, const std::filesystem::path& manifest_path,
                     const RenderContext& context) const override {
    return render_pytorchjob(job, manifest_path, context);
  }

  // PyTorchJobs have no scheduler dependencies: stages after the first are applied at once.
  Submission submit(const JobSpec& job, const std::filesystem::path& manifest_path,
                    const SubmitContext& /*context*/) const override {
    Submission submission = apply_pytorchjob(job, manifest_path);
    if (!submission.job_id.empty()) spdlog::info("Applied PyTorchJob {}", submission.job_id);
    return submission;
  }

  bool chains_jobs() const override { return false; }

  std::string job_state(const JobRecord& record) const override {
    const auto run = run_if_on_path({"kubectl", "get", "pytorchjob", record.job_id, "-o",
                                     "jsonpath={.status.conditions[-1:].type}"});
    if (!run) return "unknown (no kubectl on PATH)";
    const std::string state = first_output_line(run->output);
    return run->exit_code == 0 && !state.empty() ? state : "unknown (" + state + ")";
  }

  CandidateEnd autoconfig_candidate_end() const override { return CandidateEnd::kUnsupported; }
};

}  // namespace

std::unique_ptr<Cluster> make_kubernetes_cluster() { return std::make_unique<KubernetesCluster>(); }

}  // namespace launcher
