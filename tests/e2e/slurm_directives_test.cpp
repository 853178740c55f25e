// #SBATCH values as a real sbatch reads them (tests/e2e/slurm_test_cluster.hpp: slurmctld + two
// slurmd on this machine). A run name and a pass-through cluster key holding quotes, '#',
// backslashes and shell syntax are submitted by `launcher main`; Slurm's own record of the
// job (`scontrol show job`) must hold exactly those values: one argument each, nothing cut at
// '#', no quote left open, no extra option. The job waits (--begin) and is cancelled, so the
// backend never runs. The unit tests check the same encoding against a model of sbatch's
// parser (tests/launcher/clusters/scheduler_directives.hpp); this checks the model.
#include <doctest/doctest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "slurm_test_cluster.hpp"
#include "temporary_directory.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST_CASE("hostile #SBATCH values reach a real sbatch as exactly one value each") {
  if (!slurm_test::slurm_cluster_available()) return;  // skipped outside CI, with a message
  slurm_test::SlurmTestCluster cluster;
  struct Values {
    std::string run_name, comment;                    // as Slurm must record them
    std::string run_name_override, comment_override;  // in the override grammar: '...', \' for '
  };
  const std::vector<Values> cases = {
      // A value with spaces (double-quoted in the directive) and one without (written as is
      // before, where sbatch read ' as an open quote and # as the end of the line).
      {"run 'a' #b d\\e $(touch x)", "it's#1\\x;`id`", "'run \\'a\\' #b d\\e $(touch x)'", "'it\\'s#1\\x;`id`'"},
      {"say \"hi\" #c", "a \"b\" #c \\d", "'say \"hi\" #c'", "'a \"b\" #c \\d'"},
  };
  for (const Values& values : cases) {
    CAPTURE(values.run_name);
    test_support::TemporaryDirectory temporary;
    std::vector<std::string> argv = {"env"};
    for (const auto& variable : cluster.environment()) argv.push_back(variable);
    const std::vector<std::string> launcher_arguments = {
        std::string(TEST_BIN_DIR) + "/launcher", "main", "training=gpt3/126m", "cluster_type=bcm",
        "cluster.gres=null", "cluster.gpus_per_node=null", "cluster.partition=debug",
        "cluster.exclusive=false", "cluster.mem=null", "base_results_dir=" + temporary.path.string(),
        "training.run.name=" + values.run_name_override, "++cluster.comment=" + values.comment_override,
        "++cluster.begin=now+1hour"};
    argv.insert(argv.end(), launcher_arguments.begin(), launcher_arguments.end());
    const auto launched = slurm_test::run_command(argv, {}, 120s);
    INFO("launcher output:\n" << launched.output);
    REQUIRE(launched.exit_code == 0);

    std::smatch match;
    REQUIRE(std::regex_search(launched.output, match, std::regex(R"(Submitted batch job (\d+))")));
    const std::string job_id = match[1].str();
    const auto shown = cluster.client("scontrol", {"show", "job", "-o", job_id});
    INFO("scontrol show job: " << shown.output);
    cluster.client("scancel", {job_id});
    CHECK(shown.output.find(" JobName=nemo-megatron-" + values.run_name + " UserId=") != std::string::npos);
    CHECK(shown.output.find(" Comment=" + values.comment + " ") != std::string::npos);
    CHECK(shown.output.find(" StdOut=" + (temporary.path / values.run_name).string() + "/log-nemo-megatron-" +
                            values.run_name + "_" + job_id + ".out") != std::string::npos);
    CHECK(shown.output.find("JobState=PENDING") != std::string::npos);
    CHECK_FALSE(fs::exists(temporary.path / values.run_name / "x"));
  }
}
