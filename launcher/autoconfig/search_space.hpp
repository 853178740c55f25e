// `launcher autoconfig`'s search space: its settings (NeMo auto-configurator's train_settings,
// named as the launcher's issue names them), the candidate layouts they span, and NeMo's
// pruning rules. Pure functions of the settings and the model's shape, so that each rule is
// tested on its own; the memory rule is the preflight's (training_preflight.hpp), applied by
// autoconfig.cpp on the composed config of each candidate.
//
// Rules, after NeMo-Framework-Launcher's auto_configurator/autoconfig/training_config.py
// (_calculate_tp_pp_mbs_grid) and Megatron's own asserts, checked in this order, the first
// that a candidate breaks being the one reported:
//   gpus          tp × pp divides the GPUs (nodes × gpus_per_node); NeMo: tp·pp·cp ≤ GPUs
//   model_parallel_range  min_model_parallel_size ≤ tp × pp ≤ max_model_parallel_size
//   heads         num_attention_heads % tp == 0 (Megatron)
//   layers        num_layers % pp == 0
//   virtual_pipeline  V > 1: pp > 2 (Megatron's interleaved schedule) and num_layers % (pp·V) == 0
//   global_batch  global_batch_size % (mbs × dp) == 0
//   interleaved_batches  V > 1: (global_batch_size / (mbs × dp)) % pp == 0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launcher/config/node.hpp"

namespace launcher {

// Activation recompute as NeMo's model.activations_checkpoint_granularity names it (none: null).
enum class RecomputeChoice { none, selective, full };
std::string recompute_name(RecomputeChoice choice);

struct SearchSettings {
  std::string model;  // a training config name, e.g. gpt3/126m
  int64_t nodes = 1;
  int64_t gpus_per_node = 1;
  std::optional<double> gpu_memory_gb;  // unset: the cluster config's, if any
  // Empty lists mean `auto` until resolve_auto_lists fills them in.
  std::vector<int64_t> tensor_parallel_sizes;
  std::vector<int64_t> pipeline_parallel_sizes;
  std::vector<int64_t> virtual_pipeline_sizes;
  std::vector<int64_t> micro_batch_sizes;
  std::vector<RecomputeChoice> recompute;
  std::vector<bool> distributed_optimizer;
  int64_t min_model_parallel_size = 1;
  int64_t max_model_parallel_size = 0;  // 0: no limit beyond the GPUs
  int64_t max_steps_per_run = 50;
  double max_minutes_per_run = 20;
  int64_t limit_search_runs = 100;
  // The remaining arguments: launcher overrides given to every candidate (training.*, cluster_type,
  // base_results_dir, ...).
  std::vector<std::string> launcher_overrides;

  int64_t gpus() const { return nodes * gpus_per_node; }
};

// The autoconfig keys, for the error on an unknown one.
const std::vector<std::string>& search_setting_keys();

// Reads `key=value` arguments. Autoconfig's own keys are typed and checked here (common::Error
// naming the key, what it got and what is valid; an unknown key gets a "did you mean"). Other
// arguments are launcher overrides when their key is a config key (a dotted key, a `+`/`~`
// override, or one of `config_keys`, the composed config's top-level keys and groups) and an
// error otherwise. Overrides of what the search sets (the layout, micro batch, recompute,
// optimizer, steps, nodes and devices) are refused, naming the search key to use instead.
SearchSettings parse_search_settings(const std::vector<std::string>& arguments,
                                     const std::vector<std::string>& config_keys);

// The model's numbers the rules need, read from the composed training section.
struct ModelFacts {
  int64_t num_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t global_batch_size = 0;
};

// `auto` lists: tp powers of two up to min(gpus_per_node, 8); pp 1 and powers of two up to
// min(GPUs, num_layers); V 1 (no interleaving); mbs 1, 2, 4, 8; recompute none, selective,
// full; distributed optimizer off and on. The rules then prune what does not divide.
void resolve_auto_lists(SearchSettings& settings, const ModelFacts& model);

struct Layout {
  int64_t tensor_parallel = 1;
  int64_t pipeline_parallel = 1;
  int64_t virtual_pipeline = 1;
  int64_t micro_batch_size = 1;
  RecomputeChoice recompute = RecomputeChoice::none;
  bool distributed_optimizer = false;

  // tp2_pp1_vp1_mbs4_recompute-none_distopt-off: a directory name.
  std::string name() const;
  // The training overrides that give a config this layout.
  std::vector<std::string> overrides() const;
};

// The most combinations one search enumerates. Each candidate keeps its overrides and a
// table row (about 8 KB), and those that pass NeMo's rules are composed one by one; NeMo's
// own grids are a few hundred. A larger grid is refused before anything is enumerated.
inline constexpr int64_t kMaxSearchCandidates = 20'000;

// Refuses lists whose combinations exceed kMaxSearchCandidates, naming each list's length.
void check_search_size(const SearchSettings& settings);

// Every combination of the lists, tp varying slowest, then pp, V, mbs, recompute, optimizer
// (check_search_size first).
std::vector<Layout> enumerate_layouts(const SearchSettings& settings);

struct RuleBreak {
  std::string rule;    // gpus, heads, layers, ... (the names above)
  std::string detail;  // the numbers that break it
};

// The first NeMo rule the layout breaks, if any.
std::optional<RuleBreak> check_nemo_rules(const Layout& layout, const SearchSettings& settings,
                                          const ModelFacts& model);

}  // namespace launcher
