// Job arrays and afterok chains as the data_preparation stage renders them: the sbatch script
// (golden file, bash's parser, and run with a stand-in srun for a given SLURM_ARRAY_TASK_ID),
// the local script (every task runs, one after the other, and a failure shows in the exit
// status), CPU jobs without the cluster's GPU requests, and the clusters that refuse arrays.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "backend/common/error.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/clusters/golden_files.hpp"
#include "launcher/config/yaml_io.hpp"
#include "launcher/process.hpp"
#include "temporary_directory.hpp"

using namespace launcher;
namespace fs = std::filesystem;
using test_support::TemporaryDirectory;

namespace {

using test_support::read_file;
using test_support::kTemplates;
using test_support::check_golden;

// A download step after an earlier job, as the data_preparation stage builds it.
JobSpec download_array(const fs::path& results_dir) {
  JobSpec job;
  job.stage = "data_preparation";
  job.step = "download";
  job.run_name = "prepare_gpt3";
  job.job_name = "nemo-megatron-prepare_gpt3_download";
  job.results_dir = results_dir;
  job.tool = "download";
  job.array_tasks = {
      {"/opt/bin/download", "https://host/a b.jsonl.xz", "--output", "/data/downloads/a b.jsonl.xz", "--retries", "5"},
      {"/opt/bin/download", "file:///corpus/b.jsonl.xz", "--output", "/data/downloads/b.jsonl.xz", "--sha256",
       std::string(64, 'c'), "--retries", "5"},
      {"/opt/bin/download", "https://host/vocab.json", "--output", "/data/bpe/vocab.json", "--retries", "5"}};
  job.max_parallel_tasks = 2;
  job.uses_gpus = false;
  job.cpus_per_task = 1;
  job.time_limit = "4:00:00";
  job.after_job_id = "77";
  job.after_condition = "afterok";
  job.run_dependency = "singleton";
  job.successors_need_success = true;
  return job;
}

// A GPU cluster's bcm.yaml: the CPU job must not inherit its GPU, memory and exclusive requests.
const char* kGpuCluster =
    "partition: batch\naccount: llm\nexclusive: true\ngpus_per_task: null\ngpus_per_node: 8\n"
    "mem: 0\njob_name_prefix: nemo-megatron-\ngres: gpu:8\nsrun_args: [--mpi=pmix]\nstderr_to_stdout: true\n";

}  // namespace

TEST_CASE("a job array renders as --array with a case on SLURM_ARRAY_TASK_ID, after its dependency (afterok)") {
  const Node cluster = parse_yaml(kGpuCluster, "bcm.yaml");
  const std::string script =
      render_sbatch(download_array("/lustre/results/prepare_gpt3"), "/lustre/results/prepare_gpt3/x.sh",
                    {kTemplates, &cluster, "", {}});
  check_golden(script, "data_preparation_download_sbatch.sh");
  for (const char* line :
       {"#SBATCH --array=0-2%2\n", "#SBATCH --cpus-per-task=1\n",
        "#SBATCH --dependency=afterok:77,singleton\n", "#SBATCH --kill-on-invalid-dep=yes\n",
        "#SBATCH --output=/lustre/results/prepare_gpt3/log-nemo-megatron-prepare_gpt3_download_%A_%a.out\n",
        "#SBATCH --partition=batch\n", "case \"${SLURM_ARRAY_TASK_ID:-}\" in\n",
        "    srun --mpi=pmix /opt/bin/download 'https://host/a b.jsonl.xz' \\\n"}) {
    CAPTURE(line);
    CHECK(script.find(line) != std::string::npos);
  }
  for (const char* gpu_only : {"--gres", "--gpus", "--mem", "--exclusive"}) {
    CAPTURE(gpu_only);
    CHECK(script.find(gpu_only) == std::string::npos);
  }
  const fs::path file = fs::temp_directory_path() / "job_array_sbatch_check.sh";
  std::ofstream(file) << script;
  CHECK(run_and_capture({"bash", "-n", file.string()}).exit_code == 0);
  fs::remove(file);
}

TEST_CASE("the sbatch array script runs exactly the task Slurm names, and refuses an unknown one") {
  TemporaryDirectory directory;
  // A stand-in for srun that runs its command, and a job whose tasks leave a file each.
  const fs::path bin = directory.path / "bin";
  fs::create_directories(bin);
  std::ofstream(bin / "srun") << "#!/bin/bash\nexec \"$@\"\n";
  fs::permissions(bin / "srun", fs::perms::owner_all);
  JobSpec job = download_array(directory.path / "results");
  for (size_t i = 0; i < job.array_tasks.size(); ++i) {
    job.array_tasks[i] = {"touch", (directory.path / fmt::format("task{}", i)).string()};
  }
  const Node cluster = parse_yaml("stderr_to_stdout: true\n", "bcm.yaml");
  const fs::path script = directory.path / "array.sh";
  write_script(script, render_sbatch(job, script, {kTemplates, &cluster, "", {}}));
  const std::string path = fmt::format("PATH={}:{}", bin.string(), std::getenv("PATH"));
  const auto ran = run_and_capture({"env", path, "SLURM_ARRAY_TASK_ID=1", "bash", script.string()});
  INFO(ran.output);
  CHECK(ran.exit_code == 0);
  CHECK_FALSE(fs::exists(directory.path / "task0"));
  CHECK(fs::exists(directory.path / "task1"));
  CHECK_FALSE(fs::exists(directory.path / "task2"));
  const auto unknown = run_and_capture({"env", path, "SLURM_ARRAY_TASK_ID=7", "bash", script.string()});
  CHECK(unknown.exit_code == 2);
  CHECK(unknown.output.find("launcher: no task '7' in this job array (0-2)") != std::string::npos);
}

TEST_CASE("the local array script runs every task in order, and reports a failed one in its exit status") {
  TemporaryDirectory directory;
  JobSpec job = download_array(directory.path / "results");
  const fs::path order = directory.path / "order.txt";
  job.array_tasks = {{"bash", "-c", "echo zero >> \"$0\"", order.string()},
                     {"bash", "-c", "echo one >> \"$0\"; exit 3", order.string()},
                     {"bash", "-c", "echo two >> \"$0\"", order.string()}};
  const Node cluster = parse_yaml("job_name_prefix: ''\n", "local.yaml");
  const fs::path script = directory.path / "local_array.sh";
  write_script(script, render_local_script(job, script, {kTemplates, &cluster, "", {}}));
  const auto ran = run_and_capture({"bash", script.string()});
  INFO(ran.output);
  CHECK(ran.exit_code == 3);
  CHECK(read_file(order) == "zero\none\ntwo\n");
  CHECK(ran.output.find("launcher: task 2 of job array 0-2") != std::string::npos);
}

TEST_CASE("the PBS script waits with the job's own condition — PBS and Kubernetes refuse job arrays") {
  const Node pbs = parse_yaml("queue: q\njob_name_prefix: ''\n", "pbs.yaml");
  JobSpec single = download_array("/r");
  single.command = single.array_tasks.front();
  single.array_tasks.clear();
  CHECK(render_pbs(single, "/r/x.sh", {kTemplates, &pbs, "", {}}).find("#PBS -W depend=afterok:77\n") !=
        std::string::npos);
  CHECK_THROWS_WITH_AS(render_pbs(download_array("/r"), "/r/x.sh", {kTemplates, &pbs, "", {}}),
                       doctest::Contains("job arrays (3 tasks) are not rendered for PBS"), common::Error);
  const Node k8s = parse_yaml("namespace: default\njob_name_prefix: ''\n", "k8s.yaml");
  CHECK_THROWS_WITH_AS(render_pytorchjob(download_array("/r"), "/r/x.yaml", {kTemplates, &k8s, "image", {}}),
                       doctest::Contains("are not rendered for Kubernetes"), common::Error);
}
