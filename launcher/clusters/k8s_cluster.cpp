// Kubernetes with the Kubeflow training operator: a PyTorchJob manifest (Master, plus Workers
// for more than one node) written into the results directory and applied with
// `kubectl apply -f`. Values reach YAML as JSON strings (valid YAML double-quoted scalars);
// the container runs one bash command line whose words went through shell_quote.
// Reference: Kubeflow training-operator PyTorchJob API (kubeflow.org/v1),
// NeMo-Megatron-Launcher's k8s cluster config (namespace, image pull secret, shm size, NFS).
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cctype>

#include "backend/common/error.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/config/scalar_text.hpp"
#include "launcher/process.hpp"
#include "launcher/shell_quote.hpp"

namespace launcher {

namespace {

std::string yaml_string(const std::string& value) { return nlohmann::json(value).dump(); }

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
  if (name.empty()) common::fail("job name '{}' has no letters or digits for a Kubernetes name", job_name);
  return name;
}

std::string render_pytorchjob(const JobSpec& job, const std::filesystem::path& manifest_path,
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
  auto value_of = [&](const char* key) { return text_or(cluster, "cluster", key, ""); };
  const std::string tool = job.tool.empty() ? job.command.front() : job.tool;
  const std::string script = fmt::format(
      "set -euo pipefail; mkdir -p {0}; cd {0}; if ! command -v {1} >/dev/null 2>&1; then echo {2} "
      ">&2; exit 127; fi; exec {3}",
      shell_quote(job.results_dir.string()), shell_quote(job.command.front()),
      shell_quote(fmt::format("launcher: the {} stage needs {}, which is not at {} in the image",
                              job.stage, tool, job.command.front())),
      shell_join(job.command));

  TemplateData data;
  data.set("version", PROJECT_VERSION_STRING);
  data.set("stage", job.stage);
  data.set("run_name", job.run_name);
  data.set("manifest_path", manifest_path.string());
  data.set("name", kubernetes_name(job.job_name));
  data.set("namespace", yaml_string(text_or(cluster, "cluster", "namespace", "default")));
  data.set("stage_label", yaml_string(job.stage));
  TemplateData replicas{TemplateData::type::list};
  for (const auto& [role, count] : std::vector<std::pair<std::string, int>>{
           {"Master", 1}, {"Worker", job.nodes - 1}}) {
    if (count < 1) continue;
    TemplateData spec;
    spec.set("role", role);
    spec.set("replicas", std::to_string(count));
    replicas.push_back(spec);
  }
  data.set("replica_specs", replicas);
  data.set("image", yaml_string(context.container_image));
  if (const auto secret = value_of("image_pull_secret"); !secret.empty()) {
    data.set("image_pull_secret", yaml_string(secret));
  }
  data.set("script", yaml_string(script));
  TemplateData environment{TemplateData::type::list};
  for (const auto& [name, value] : job.environment) {
    TemplateData entry;
    entry.set("name", name);
    entry.set("value", yaml_string(value));
    environment.push_back(entry);
  }
  data.set("environment", environment);
  data.set("run_name_value", yaml_string(job.run_name));
  const std::string gpus = value_of("gpus_per_node");
  data.set("gpus_per_node", gpus.empty() ? std::to_string(job.tasks_per_node) : gpus);
  data.set("shm_size", yaml_string(text_or(cluster, "cluster", "shm_size", "64Gi")));
  const std::string nfs_server = value_of("nfs_server"), nfs_path = value_of("nfs_path");
  if (nfs_server.empty() != nfs_path.empty()) {
    common::fail("cluster.nfs_server and cluster.nfs_path go together: set both or neither");
  }
  if (!nfs_server.empty()) {
    TemplateData nfs;
    nfs.set("server", yaml_string(nfs_server));
    nfs.set("path", yaml_string(nfs_path));
    data.set("nfs", nfs);
  }
  return render_template(context.templates_dir, "k8s.yaml.mustache", data);
}

Submission apply_pytorchjob(const JobSpec& job, const std::filesystem::path& manifest_path) {
  Submission submission;
  if (!find_on_path("kubectl")) {
    spdlog::info("kubectl is not on PATH: the manifest is written; apply it with "
                 "kubectl apply -f {}", manifest_path.string());
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

}  // namespace launcher
