// make_cluster: the back end chosen once from cluster_type gives its name and script suffix, and
// an unknown cluster_type is refused with the message `launcher main` shows for it.
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "backend/common/error.hpp"
#include "launcher/clusters/cluster.hpp"

using namespace launcher;

TEST_CASE("make_cluster gives each back end its name and script suffix") {
  struct Expected {
    std::string_view name;
    std::string_view suffix;
    bool chains_jobs;
    CandidateEnd candidate_end;
  };
  for (const Expected& expected : {Expected{"local", "_submission.sh", true, CandidateEnd::kLaunchReturns},
                                   Expected{"bcm", "_submission.sh", true, CandidateEnd::kFinalJobState},
                                   Expected{"pbs", "_submission.sh", true, CandidateEnd::kUnsupported},
                                   Expected{"k8s", "_submission.yaml", false, CandidateEnd::kUnsupported}}) {
    CAPTURE(expected.name);
    const std::unique_ptr<Cluster> cluster = make_cluster(expected.name);
    REQUIRE(cluster != nullptr);
    CHECK(cluster->name() == expected.name);
    CHECK(cluster->script_suffix() == expected.suffix);
    CHECK(cluster->chains_jobs() == expected.chains_jobs);
    CHECK(cluster->autoconfig_candidate_end() == expected.candidate_end);
  }
}

TEST_CASE("make_cluster refuses an unknown cluster_type, naming the valid ones") {
  // auto and interactive are resolved to a back end's name before one is chosen.
  for (const char* name : {"slurm", "", "auto", "interactive", "LOCAL"}) {
    CAPTURE(name);
    CHECK(find_cluster(name) == nullptr);
    CHECK_THROWS_WITH_AS(make_cluster(name),
                         ("cluster_type '" + std::string(name) +
                          "' is not valid (valid: auto, bcm, local, pbs, k8s, and NeMo's "
                          "interactive for local)").c_str(),
                         common::Error);
  }
}

TEST_CASE("a job record of an unknown cluster type has an unknown state") {
  JobRecord record;
  record.cluster = "slurm";
  record.job_id = "17";
  CHECK(query_job_state(record) == "unknown (cluster type 'slurm')");
}
