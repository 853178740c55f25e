// autoconfig in process, dry run: candidates are pruned by NeMo's rules and by the preflight's
// memory estimate (the same number training_preflight gives for the candidate's config), the
// table files are written, and ranking orders by measured tokens/s.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/autoconfig/autoconfig.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/stages/training_preflight.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using namespace launcher;
namespace fs = std::filesystem;

namespace {

const fs::path kConfDir = fs::path(TEST_SOURCE_DIR) / "conf";

// What the preflight estimates for gpt3/126m on 2 GPUs with this tp and mbs.
double estimate(int64_t tp, int64_t mbs) {
  const std::vector<std::string> overrides = {
      "training=gpt3/126m", "launcher_scripts_path=/opt/launcher", "training.trainer.devices=2",
      "training.model.tensor_model_parallel_size=" + std::to_string(tp),
      "training.model.micro_batch_size=" + std::to_string(mbs),
      "training.model.optim.name=fused_adam",
      "training.model.activations_checkpoint_granularity=null"};
  const ComposedConfig config = compose({kConfDir, "config", overrides});
  return training_preflight(resolve(config.config, ResolveContext{config.choices}), "local")
      .memory.total_bytes();
}

}  // namespace

TEST_CASE("autoconfig --dry-run prunes by NeMo's rules and by the preflight memory estimate") {
  test_support::TemporaryDirectory temporary;
  // A budget between the candidates' estimates, so that some fit and some do not.
  std::vector<double> estimates;
  for (int64_t tp : {1, 2}) {
    for (int64_t mbs : {1, 2, 4}) estimates.push_back(estimate(tp, mbs));
  }
  std::vector<double> sorted = estimates;
  std::sort(sorted.begin(), sorted.end());
  const double budget_gb = (sorted[2] + sorted[3]) / 2 / 1e9;

  AutoconfigOptions options;
  options.conf_dir = kConfDir;
  options.dry_run = true;
  options.arguments = {"model=gpt3/126m", "cluster.gpus_per_node=2",
                       "cluster.gpu_memory_gb=" + std::to_string(budget_gb),
                       "tensor_parallel_sizes=[1,2,4]", "pipeline_parallel_sizes=[1]",
                       "micro_batch_sizes=[1,2,4]", "recompute=[none]",
                       "distributed_optimizer=[false]", "cluster_type=local",
                       "launcher_scripts_path=/opt/launcher",
                       "base_results_dir=" + temporary.path.string()};
  std::ostringstream terminal;
  REQUIRE(run_autoconfig(options, terminal) == 0);
  const fs::path run_dir = temporary.path / "autoconfig_gpt3_126m";
  const nlohmann::json table =
      nlohmann::json::parse(test_support::read_file(run_dir / "candidates.json"));
  const auto& candidates = table.at("candidates");
  REQUIRE(candidates.size() == 9);
  int fits = 0, does_not_fit = 0, pruned = 0;
  for (const auto& candidate : candidates) {
    const std::string name = candidate.at("name").get<std::string>();
    CAPTURE(name);
    const int64_t tp = candidate.at("tensor_parallel").get<int64_t>();
    const int64_t mbs = candidate.at("micro_batch_size").get<int64_t>();
    const std::string status = candidate.at("status").get<std::string>();
    if (tp == 4) {  // 4 does not divide the 2 GPUs
      CHECK(status == "pruned");
      CHECK(candidate.at("detail").get<std::string>().starts_with("gpus: tp 4 × pp 1 = 4"));
      ++pruned;
      continue;
    }
    const double expected = estimate(tp, mbs);
    CHECK(candidate.at("estimated_memory_bytes").get<double>() == doctest::Approx(expected));
    if (expected > budget_gb * 1e9) {
      CHECK(status == "does_not_fit");
      ++does_not_fit;
    } else {
      CHECK(status == "planned");
      ++fits;
    }
  }
  CHECK(fits == 3);
  CHECK(does_not_fit == 3);
  CHECK(pruned == 3);
  // The same table as CSV (a header and one line per candidate) and on the terminal; a dry run
  // writes no best config and starts no run.
  const std::string csv = test_support::read_file(run_dir / "candidates.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 10);
  CHECK(csv.starts_with("rank,name,tp,pp,vp,dp,mbs,"));
  CHECK(terminal.str().find("| tp4_pp1_vp1_mbs1_recompute-none_distopt-off |") != std::string::npos);
  CHECK_FALSE(fs::exists(run_dir / "best"));
  CHECK_FALSE(fs::exists(run_dir / "candidates"));

  // A second search gets its own directory.
  REQUIRE(run_autoconfig(options, terminal) == 0);
  CHECK(fs::is_regular_file(temporary.path / "autoconfig_gpt3_126m-1" / "candidates.json"));
}

TEST_CASE("autoconfig refuses a bad model name or cluster before creating anything") {
  test_support::TemporaryDirectory temporary;
  AutoconfigOptions options;
  options.conf_dir = kConfDir;
  options.dry_run = true;
  const std::vector<std::string> common_arguments = {"launcher_scripts_path=/opt/launcher",
                                                     "base_results_dir=" + temporary.path.string()};
  options.arguments = common_arguments;
  options.arguments.push_back("model=gpt3/126");
  std::ostringstream terminal;
  CHECK_THROWS_WITH_AS(run_autoconfig(options, terminal), doctest::Contains("126"), common::Error);
  options.arguments = common_arguments;
  options.arguments.insert(options.arguments.end(), {"model=gpt3/126m", "cluster_type=k8s"});
  CHECK_THROWS_WITH_AS(run_autoconfig(options, terminal),
                       doctest::Contains("cluster_type=local or bcm"), common::Error);
  options.arguments = common_arguments;
  options.arguments.insert(options.arguments.end(), {"model=../126m"});
  CHECK_THROWS_WITH_AS(run_autoconfig(options, terminal),
                       doctest::Contains("expected a config name"), common::Error);
  CHECK(fs::is_empty(temporary.path));
}

TEST_CASE("ranking follows measured tokens/s, then timeouts, failures and pruned candidates") {
  auto candidate = [](int64_t mbs, const std::string& status, double tokens) {
    CandidateResult result;
    result.layout.micro_batch_size = mbs;
    result.status = status;
    result.tokens_per_second = tokens;
    return result;
  };
  std::vector<CandidateResult> candidates = {
      candidate(1, "pruned", 0),    candidate(2, "ran", 100), candidate(3, "failed", 0),
      candidate(4, "ran", 300),     candidate(5, "timed_out", 0), candidate(6, "ran", 200),
      candidate(7, "does_not_fit", 0)};
  rank_candidates(candidates);
  std::vector<int64_t> order;
  for (const auto& result : candidates) order.push_back(result.layout.micro_batch_size);
  CHECK(order == std::vector<int64_t>{4, 6, 2, 5, 3, 7, 1});
  CHECK(candidates[0].rank == 1);
  CHECK(candidates[2].rank == 3);
  CHECK(candidates[3].rank == 0);
}

TEST_CASE("autoconfig --save-as refuses a name that would overwrite a shipped training config") {
  test_support::TemporaryDirectory temporary;
  AutoconfigOptions options;
  options.conf_dir = kConfDir;
  options.save_as = "gpt3/126m";
  options.arguments = {"model=gpt3/126m", "launcher_scripts_path=/opt/launcher",
                       "base_results_dir=" + temporary.path.string()};
  std::ostringstream terminal;
  CHECK_THROWS_WITH_AS(run_autoconfig(options, terminal),
                       doctest::Contains("--save-as gpt3/126m: "), common::Error);
  CHECK(fs::is_empty(temporary.path));  // refused before the search
}
