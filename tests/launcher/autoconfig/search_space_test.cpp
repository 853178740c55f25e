// autoconfig's search space: settings are typed and checked, lists enumerate in order, and each
// of NeMo's pruning rules refuses exactly the layouts it should.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/autoconfig/search_space.hpp"

using namespace launcher;

namespace {

const std::vector<std::string> kConfigKeys = {"training", "cluster", "cluster_type",
                                              "base_results_dir"};

SearchSettings settings_of(std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), "model=gpt3/126m");
  return parse_search_settings(arguments, kConfigKeys);
}

std::string rule_of(const Layout& layout, const SearchSettings& settings, const ModelFacts& model) {
  const auto broken = check_nemo_rules(layout, settings, model);
  return broken ? broken->rule : "";
}

}  // namespace

TEST_CASE("autoconfig settings: typed values, auto lists and launcher overrides") {
  const SearchSettings settings = settings_of(
      {"cluster.nodes=2", "cluster.gpus_per_node=8", "cluster.gpu_memory_gb=80",
       "tensor_parallel_sizes=[1,2,2]", "micro_batch_sizes=auto", "recompute=[none,full]",
       "distributed_optimizer=[true]", "max_minutes_per_run=0.5", "limit_search_runs=3",
       "training.model.num_layers=4", "cluster_type=local"});
  CHECK(settings.model == "gpt3/126m");
  CHECK(settings.gpus() == 16);
  CHECK(settings.gpu_memory_gb == doctest::Approx(80));
  CHECK(settings.tensor_parallel_sizes == std::vector<int64_t>{1, 2});  // repeats dropped
  CHECK(settings.micro_batch_sizes.empty());                          // auto
  CHECK(settings.recompute == std::vector<RecomputeChoice>{RecomputeChoice::none, RecomputeChoice::full});
  CHECK(settings.distributed_optimizer == std::vector<bool>{true});
  CHECK(settings.max_minutes_per_run == doctest::Approx(0.5));
  CHECK(settings.limit_search_runs == 3);
  CHECK(settings.launcher_overrides ==
        std::vector<std::string>{"training.model.num_layers=4", "cluster_type=local"});
}

TEST_CASE("autoconfig settings: bad input is a clear error naming the key") {
  auto refused = [](std::vector<std::string> arguments, const std::string& expected) {
    CAPTURE(expected);
    CHECK_THROWS_WITH_AS(settings_of(arguments), doctest::Contains(expected.c_str()), common::Error);
  };
  refused({"tensor_parallel_size=[1,2]"}, "Did you mean 'tensor_parallel_sizes'?");
  refused({"tensor_parallel_sizes=[]"}, "tensor_parallel_sizes=[]: an empty list");
  refused({"micro_batch_sizes=[1,two]"}, "micro_batch_sizes[1]: expected an integer");
  refused({"pipeline_parallel_sizes=4"}, "expected auto or a list");
  refused({"recompute=[none,everything]"}, "'everything' is not a recompute choice (valid: none, selective, full)");
  refused({"distributed_optimizer=[yes]"}, "distributed_optimizer[0]: expected true or false");
  refused({"cluster.nodes=0"}, "cluster.nodes: expected an integer from 1");
  refused({"cluster.gpu_memory_gb=lots"}, "cluster.gpu_memory_gb: expected a number of GB");
  refused({"max_minutes_per_run=-1"}, "max_minutes_per_run: expected minutes > 0");
  // NaN compares false with everything: it once switched the fit check off and timed out
  // every candidate.
  refused({"cluster.gpu_memory_gb=nan"}, "cluster.gpu_memory_gb: expected a number of GB > 0, got 'nan'");
  refused({"cluster.gpu_memory_gb=inf"}, "cluster.gpu_memory_gb: expected a number of GB > 0, got 'inf'");
  refused({"max_minutes_per_run=nan"}, "max_minutes_per_run: expected minutes > 0");
  refused({"limit_search_runs=1", "limit_search_runs=2"}, "limit_search_runs: given twice");
  refused({"min_model_parallel_size=4", "max_model_parallel_size=2"}, "below min_model_parallel_size");
  refused({"training.model.micro_batch_size=2"}, "use micro_batch_sizes instead");
  refused({"training.trainer.num_nodes=2"}, "use cluster.nodes instead");
  refused({"training=gpt3/5b"}, "use model instead");
  CHECK_THROWS_WITH_AS(parse_search_settings({"cluster.nodes=1"}, kConfigKeys),
                       doctest::Contains("model=<training config> is required"), common::Error);
  CHECK_THROWS_WITH_AS(parse_search_settings({"model=gpt3/126m", "=1"}, kConfigKeys),
                       doctest::Contains("bad override"), common::Error);
}

TEST_CASE("autoconfig enumerates every combination, tp slowest, and fills auto lists") {
  SearchSettings settings = settings_of({"cluster.gpus_per_node=4", "tensor_parallel_sizes=[1,2]",
                                         "micro_batch_sizes=[1,4]", "pipeline_parallel_sizes=[1]",
                                         "recompute=[none]", "distributed_optimizer=[false,true]"});
  resolve_auto_lists(settings, {12, 12, 256});
  const std::vector<Layout> layouts = enumerate_layouts(settings);
  REQUIRE(layouts.size() == 8);
  CHECK(layouts.front().name() == "tp1_pp1_vp1_mbs1_recompute-none_distopt-off");
  CHECK(layouts[1].name() == "tp1_pp1_vp1_mbs1_recompute-none_distopt-on");
  CHECK(layouts[2].name() == "tp1_pp1_vp1_mbs4_recompute-none_distopt-off");
  CHECK(layouts.back().name() == "tp2_pp1_vp1_mbs4_recompute-none_distopt-on");

  SearchSettings automatic = settings_of({"cluster.nodes=2", "cluster.gpus_per_node=16"});
  resolve_auto_lists(automatic, {6, 12, 256});
  CHECK(automatic.tensor_parallel_sizes == std::vector<int64_t>{1, 2, 4, 8});  // ≤ min(16, 8)
  CHECK(automatic.pipeline_parallel_sizes == std::vector<int64_t>{1, 2, 4});   // ≤ 6 layers
  CHECK(automatic.virtual_pipeline_sizes == std::vector<int64_t>{1});
  CHECK(automatic.micro_batch_sizes == std::vector<int64_t>{1, 2, 4, 8});
  CHECK(automatic.recompute.size() == 3);
  CHECK(automatic.distributed_optimizer == std::vector<bool>{false, true});
  CHECK(enumerate_layouts(automatic).size() == 4 * 3 * 1 * 4 * 3 * 2);
}

TEST_CASE("each NeMo rule refuses what it should and lets the rest through") {
  const SearchSettings settings = settings_of({"cluster.nodes=1", "cluster.gpus_per_node=8"});
  const ModelFacts model{.num_layers = 12, .num_attention_heads = 12, .global_batch_size = 32};
  auto layout = [](int64_t tp, int64_t pp, int64_t vp, int64_t mbs) {
    return Layout{tp, pp, vp, mbs, RecomputeChoice::none, false};
  };
  CHECK(rule_of(layout(1, 1, 1, 1), settings, model).empty());
  CHECK(rule_of(layout(2, 4, 1, 4), settings, model).empty());  // dp 1: 32 % 4 == 0
  CHECK(rule_of(layout(16, 1, 1, 1), settings, model) == "gpus");   // tp·pp > GPUs
  CHECK(rule_of(layout(1, 3, 1, 1), settings, model) == "gpus");    // 3 does not divide 8
  CHECK(rule_of(layout(8, 1, 1, 1), settings, model) == "heads");   // 12 heads % 8
  CHECK(rule_of(layout(1, 8, 1, 1), settings, model) == "layers");  // 12 layers % 8
  CHECK(rule_of(layout(1, 2, 2, 1), settings, model) == "virtual_pipeline");  // pp ≤ 2
  CHECK(rule_of(layout(1, 4, 2, 1), settings, model) == "virtual_pipeline");  // 12 % (4·2)
  CHECK(rule_of(layout(1, 4, 3, 1), settings, model).empty());                // 12 % 12 == 0
  CHECK(rule_of(layout(1, 1, 1, 8), settings, model) == "global_batch");      // 32 % (8·8)
  CHECK(rule_of(layout(2, 1, 1, 2), settings, model).empty());                // 32 % (2·4) == 0
  // Interleaved: 32 / (mbs 4 × dp 2) = 4 micro batches, not divisible by pp 4? 4 % 4 == 0;
  // with mbs 8: 32 / 16 = 2, which pp 4 does not divide.
  const ModelFacts wide{.num_layers = 12, .num_attention_heads = 12, .global_batch_size = 32};
  CHECK(rule_of(layout(1, 4, 3, 4), settings, wide).empty());
  CHECK(rule_of(layout(1, 4, 3, 8), settings, wide) == "interleaved_batches");

  const SearchSettings ranged = settings_of({"cluster.gpus_per_node=8", "min_model_parallel_size=2",
                                             "max_model_parallel_size=4"});
  CHECK(rule_of(layout(1, 1, 1, 1), ranged, model) == "model_parallel_range");
  CHECK(rule_of(layout(2, 1, 1, 1), ranged, model).empty());
  CHECK(rule_of(layout(4, 1, 1, 1), ranged, model).empty());
  CHECK(rule_of(layout(2, 4, 1, 1), ranged, model) == "model_parallel_range");
  const auto broken = check_nemo_rules(layout(8, 1, 1, 1), settings, model);
  REQUIRE(broken);
  CHECK(broken->detail == "num_attention_heads 12 is not divisible by tp 8");
}

TEST_CASE("a layout's overrides set what it names") {
  const Layout full{2, 4, 3, 8, RecomputeChoice::full, true};
  const std::vector<std::string> overrides = full.overrides();
  for (const char* expected :
       {"training.model.tensor_model_parallel_size=2", "training.model.pipeline_model_parallel_size=4",
        "training.model.virtual_pipeline_model_parallel_size=3", "training.model.micro_batch_size=8",
        "training.model.activations_checkpoint_granularity=full",
        "training.model.activations_checkpoint_method=uniform",
        "training.model.optim.name=distributed_fused_adam"}) {
    CAPTURE(expected);
    CHECK(std::find(overrides.begin(), overrides.end(), expected) != overrides.end());
  }
  const Layout plain{1, 1, 1, 1, RecomputeChoice::none, false};
  const std::vector<std::string> plain_overrides = plain.overrides();
  CHECK(std::find(plain_overrides.begin(), plain_overrides.end(),
                  "training.model.virtual_pipeline_model_parallel_size=null") != plain_overrides.end());
  CHECK(std::find(plain_overrides.begin(), plain_overrides.end(),
                  "training.model.optim.name=fused_adam") != plain_overrides.end());
}

TEST_CASE("autoconfig refuses a grid too large to search before enumerating it") {
  // 100 × 100 × 100 × 3 × 2 combinations once grew to 3.9 GB and ended in std::bad_alloc.
  auto range = [](int count) {
    std::string list = "[";
    for (int i = 1; i <= count; ++i) list += (i > 1 ? "," : "") + std::to_string(i);
    return list + "]";
  };
  SearchSettings settings = settings_of({"cluster.nodes=1000", "cluster.gpus_per_node=8",
                                         "tensor_parallel_sizes=" + range(100),
                                         "pipeline_parallel_sizes=" + range(100),
                                         "micro_batch_sizes=" + range(100)});
  resolve_auto_lists(settings, ModelFacts{.num_layers = 96, .num_attention_heads = 96,
                                          .global_batch_size = 1536});
  const std::string expected =
      "the search lists span 6000000 candidates (tensor_parallel_sizes 100 × "
      "pipeline_parallel_sizes 100 × virtual_pipeline_sizes 1 × micro_batch_sizes 100 × "
      "recompute 3 × distributed_optimizer 2), more than the 20000";
  CHECK_THROWS_WITH_AS(check_search_size(settings), doctest::Contains(expected.c_str()),
                       common::Error);
  CHECK_THROWS_WITH_AS(enumerate_layouts(settings), doctest::Contains(expected.c_str()),
                       common::Error);
  // At the bound it enumerates.
  settings.pipeline_parallel_sizes.resize(1);
  settings.micro_batch_sizes.resize(33);
  CHECK(enumerate_layouts(settings).size() == 100 * 33 * 3 * 2);
}
