// tests/slurm/local-cluster.sh, the one way to start the local Slurm (docs/launcher.md, "Trying
// it on a local Slurm"; the suite's SlurmTestCluster runs it): `up` is idempotent and prints the
// SLURM_CONF to export, `status` tells up from down, and `down` leaves no process behind.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "sanitized_build.hpp"
#include "slurm_test_cluster.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

slurm_test::CommandResult local_cluster(const std::string& action, const fs::path& directory) {
  return slurm_test::run_command(
      {"/bin/bash", slurm_test::local_cluster_script().string(), action, "--dir", directory.string()},
      {}, 120s);
}

// Processes whose command line names `directory` (the daemons: -f <dir>/slurm.conf).
int processes_naming(const fs::path& directory) {
  int count = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (slurm_test::read_text(entry.path() / "cmdline").find(directory.string() + "/") !=
        std::string::npos) {
      ++count;
    }
  }
  return count;
}

}  // namespace

TEST_CASE("local-cluster.sh: up again finds it up, status says so, down stops every daemon" *
          test_support::release_only()) {
  if (!slurm_test::slurm_cluster_available()) return;  // skipped outside CI, with a message
  fs::path directory;
  {
    slurm_test::SlurmTestCluster cluster;  // `up --dir <its directory>`
    directory = cluster.directory();
    CHECK(processes_naming(directory) >= 4);  // munged, slurmctld, two slurmd

    const auto started = std::chrono::steady_clock::now();
    const auto again = local_cluster("up", directory);
    INFO(again.output);
    CHECK(again.exit_code == 0);
    CHECK(again.output.find("already up in " + directory.string() + " (2 nodes)") != std::string::npos);
    CHECK(again.output.find("export SLURM_CONF=" + cluster.slurm_conf().string() + "\n") !=
          std::string::npos);
    CHECK(std::chrono::steady_clock::now() - started < 10s);  // nothing was started again

    const auto status = local_cluster("status", directory);
    INFO(status.output);
    CHECK(status.exit_code == 0);
    CHECK(status.output.find("node1 debug* idle") != std::string::npos);
    CHECK(status.output.find("node2 debug* idle") != std::string::npos);

    // The daemons were reparented to this process (a child subreaper while the cluster lives),
    // which reaps them only after `down` returns: exited, they are zombies, and `down` must
    // count them gone rather than wait out its deadlines and signal them (it did: 9 s a test).
    const auto down =
        slurm_test::run_command({"/bin/bash", slurm_test::local_cluster_script().string(), "down",
                                 "--dir", directory.string(), "--keep"},
                                {}, 120s);
    INFO(down.output);
    CHECK(down.exit_code == 0);
    CHECK(down.output.find("down: " + directory.string() + " kept") != std::string::npos);
    CHECK(down.output.find("still running") == std::string::npos);
  }  // `down --dir <its directory>` again (nothing left to stop), then the guard
  CHECK(processes_naming(directory) == 0);
  const auto status = local_cluster("status", directory);
  CHECK(status.exit_code == 3);
  CHECK(status.output.find("down: no cluster answers in " + directory.string()) != std::string::npos);
}
