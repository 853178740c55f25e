// Choosing a cluster back end by its cluster_type, and the pieces the back ends share: the
// job-array refusal of the clusters without arrays, the reading of scheduler query output and
// the log lines of a queued job.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cctype>

#include "backend/common/error.hpp"
#include "launcher/clusters/cluster.hpp"

namespace launcher {

std::unique_ptr<Cluster> find_cluster(std::string_view cluster_type) {
  // Each back end says its own name, so the names are written in one place each.
  for (auto* make : {make_local_cluster, make_slurm_cluster, make_pbs_cluster, make_kubernetes_cluster}) {
    std::unique_ptr<Cluster> cluster = make();
    if (cluster->name() == cluster_type) return cluster;
  }
  return nullptr;
}

std::unique_ptr<Cluster> make_cluster(std::string_view cluster_type) {
  std::unique_ptr<Cluster> cluster = find_cluster(cluster_type);
  if (cluster == nullptr) {
    common::fail("cluster_type '{}' is not valid (valid: auto, bcm, local, pbs, k8s, and NeMo's "
                 "interactive for local)", cluster_type);
  }
  return cluster;
}

void refuse_job_arrays(const std::vector<JobSpec>& jobs, std::string_view cluster_type) {
  for (const JobSpec& job : jobs) {
    if (!job.is_array()) continue;
    common::fail("{}: the {} step is a job array of {} tasks, which the {} cluster does not "
                 "render (Kubernetes has no job arrays or dependencies, PBS arrays are not built "
                 "yet): run this stage with cluster_type=bcm or local", job.stage, job.step,
                 job.array_tasks.size(), cluster_type);
  }
}

std::string scheduler_field(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  if (at == std::string::npos) return {};
  size_t begin = at + key.size();
  while (begin < text.size() && (text[begin] == ' ' || text[begin] == '=')) ++begin;
  size_t end = begin;
  while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
  return text.substr(begin, end - begin);
}

std::string first_output_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

std::optional<CapturedRun> run_if_on_path(const std::vector<std::string>& argv) {
  if (!find_on_path(argv.front())) return std::nullopt;
  return run_and_capture(argv);
}

Submission announce_queued(Submission submission, const SubmitContext& context) {
  spdlog::info("Submitted batch job {}", submission.job_id);
  spdlog::info("{}: job output in {}", context.label, submission.log_file.string());
  return submission;
}

}  // namespace launcher
