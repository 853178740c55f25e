// The autoconfig search space and NeMo's pruning rules; see search_space.hpp.
#include "launcher/autoconfig/search_space.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "backend/common/error.hpp"
#include "backend/common/suggest.hpp"
#include "launcher/config/overrides.hpp"

namespace launcher {

namespace {

// Overrides of what the search itself sets, and the search key that sets it.
const std::map<std::string, std::string>& searched_keys() {
  static const std::map<std::string, std::string> keys = {
      {"training.model.tensor_model_parallel_size", "tensor_parallel_sizes"},
      {"training.model.pipeline_model_parallel_size", "pipeline_parallel_sizes"},
      {"training.model.virtual_pipeline_model_parallel_size", "virtual_pipeline_sizes"},
      {"training.model.micro_batch_size", "micro_batch_sizes"},
      {"training.model.activations_checkpoint_granularity", "recompute"},
      {"training.model.activations_checkpoint_method", "recompute"},
      {"training.model.activations_checkpoint_num_layers", "recompute"},
      {"training.model.optim.name", "distributed_optimizer"},
      {"training.trainer.num_nodes", "cluster.nodes"},
      {"training.trainer.devices", "cluster.gpus_per_node"},
      {"training.trainer.max_steps", "max_steps_per_run"},
      {"training.run.time_limit", "max_minutes_per_run"},
      {"training.run.results_dir", "base_results_dir (candidates run under <base_results_dir>/autoconfig_<model>)"},
      {"training.exp_manager.explicit_log_dir", "base_results_dir (candidates run under <base_results_dir>/autoconfig_<model>)"},
      {"training.model.data.data_impl", "nothing: benchmark runs use mock data"},
      {"training.trainer.limit_val_batches", "nothing: benchmark runs skip validation"},
      {"training", "model"},
      {"stages", "nothing: autoconfig runs the training stage only"},
  };
  return keys;
}

int64_t positive_integer(const Node& value, const std::string& key) {
  // The bound keeps products of sizes (tp × pp, mbs × dp) far from overflowing.
  if (!value.is_int() || value.as_int() < 1 || value.as_int() > 1'000'000) {
    common::fail("autoconfig {}: expected an integer from 1 to 1000000, got '{}'", key,
                 python_str(value));
  }
  return value.as_int();
}

bool is_auto(const Node& value) { return value.is_string() && value.as_string() == "auto"; }

// `auto` (an empty list) or a non-empty list of integers ≥ 1, repeats dropped.
std::vector<int64_t> integer_list(const Node& value, const std::string& key) {
  if (is_auto(value)) return {};
  if (!value.is_list()) {
    common::fail("autoconfig {}: expected auto or a list of integers ≥ 1 such as [1,2,4], got '{}'",
                 key, python_str(value));
  }
  if (value.size() == 0) {
    common::fail("autoconfig {}=[]: an empty list leaves nothing to search; give values such as "
                 "[1,2] or auto", key);
  }
  std::vector<int64_t> values;
  for (size_t i = 0; i < value.size(); ++i) {
    const int64_t item = positive_integer(value.at(i), fmt::format("{}[{}]", key, i));
    if (std::find(values.begin(), values.end(), item) == values.end()) values.push_back(item);
  }
  return values;
}

RecomputeChoice recompute_choice(const Node& value, const std::string& key) {
  if (value.is_null()) return RecomputeChoice::none;
  if (value.is_string()) {
    for (RecomputeChoice choice :
         {RecomputeChoice::none, RecomputeChoice::selective, RecomputeChoice::full}) {
      if (value.as_string() == recompute_name(choice)) return choice;
    }
  }
  common::fail("autoconfig {}: '{}' is not a recompute choice (valid: none, selective, full)", key,
               python_str(value));
}

template <typename T, typename Read>
std::vector<T> choice_list(const Node& value, const std::string& key, Read read, const char* example) {
  if (is_auto(value)) return {};
  if (!value.is_list()) {
    common::fail("autoconfig {}: expected auto or a list such as {}, got '{}'", key, example,
                 python_str(value));
  }
  if (value.size() == 0) {
    common::fail("autoconfig {}=[]: an empty list leaves nothing to search; give values such as {} "
                 "or auto", key, example);
  }
  std::vector<T> values;
  for (size_t i = 0; i < value.size(); ++i) {
    const T item = read(value.at(i), fmt::format("{}[{}]", key, i));
    if (std::find(values.begin(), values.end(), item) == values.end()) values.push_back(item);
  }
  return values;
}

std::vector<int64_t> powers_of_two_up_to(int64_t limit) {
  std::vector<int64_t> values;
  for (int64_t value = 1; value <= limit; value *= 2) values.push_back(value);
  return values;
}

}  // namespace

std::string recompute_name(RecomputeChoice choice) {
  switch (choice) {
    case RecomputeChoice::selective: return "selective";
    case RecomputeChoice::full: return "full";
    case RecomputeChoice::none: break;
  }
  return "none";
}

const std::vector<std::string>& search_setting_keys() {
  static const std::vector<std::string> keys = {
      "model", "cluster.nodes", "cluster.gpus_per_node", "cluster.gpu_memory_gb",
      "tensor_parallel_sizes", "pipeline_parallel_sizes", "virtual_pipeline_sizes",
      "micro_batch_sizes", "recompute", "distributed_optimizer", "min_model_parallel_size",
      "max_model_parallel_size", "max_steps_per_run", "max_minutes_per_run", "limit_search_runs"};
  return keys;
}

SearchSettings parse_search_settings(const std::vector<std::string>& arguments,
                                     const std::vector<std::string>& config_keys) {
  SearchSettings settings;
  const auto& own_keys = search_setting_keys();
  std::vector<std::string> seen;
  for (const std::string& argument : arguments) {
    const Override parsed = parse_override(argument);
    const bool own = parsed.kind == Override::Kind::Assign && !parsed.package &&
                     std::find(own_keys.begin(), own_keys.end(), parsed.key) != own_keys.end();
    if (!own) {
      const bool config_key =
          parsed.kind != Override::Kind::Assign || parsed.key.find_first_of("./") != std::string::npos ||
          std::find(config_keys.begin(), config_keys.end(), parsed.key) != config_keys.end();
      if (!config_key) {
        std::vector<std::string> known = own_keys;
        known.insert(known.end(), config_keys.begin(), config_keys.end());
        common::fail("autoconfig: unknown key '{}' in '{}': neither an autoconfig key ({}) nor a "
                     "config key.{}", parsed.key, argument, fmt::join(own_keys, ", "),
                     common::did_you_mean(parsed.key, known));
      }
      const auto searched = searched_keys().find(parsed.key);
      if (searched != searched_keys().end()) {
        common::fail("autoconfig: '{}' sets what the search sets for each candidate; use {} instead",
                     argument, searched->second);
      }
      settings.launcher_overrides.push_back(argument);
      continue;
    }
    if (std::find(seen.begin(), seen.end(), parsed.key) != seen.end()) {
      common::fail("autoconfig {}: given twice", parsed.key);
    }
    seen.push_back(parsed.key);
    const Node& value = *parsed.value;
    const std::string& key = parsed.key;
    if (key == "model") {
      if (!value.is_string() || value.as_string().empty()) {
        common::fail("autoconfig model: expected a training config name such as gpt3/126m, got '{}'",
                     python_str(value));
      }
      settings.model = value.as_string();
    } else if (key == "cluster.nodes") {
      settings.nodes = positive_integer(value, key);
    } else if (key == "cluster.gpus_per_node") {
      settings.gpus_per_node = positive_integer(value, key);
    } else if (key == "cluster.gpu_memory_gb") {
      // NaN would compare false with every estimate and switch the fit check off.
      if (!value.is_number() || !std::isfinite(value.as_double()) || value.as_double() <= 0) {
        common::fail("autoconfig cluster.gpu_memory_gb: expected a number of GB > 0, got '{}'",
                     python_str(value));
      }
      settings.gpu_memory_gb = value.as_double();
    } else if (key == "tensor_parallel_sizes") {
      settings.tensor_parallel_sizes = integer_list(value, key);
    } else if (key == "pipeline_parallel_sizes") {
      settings.pipeline_parallel_sizes = integer_list(value, key);
    } else if (key == "virtual_pipeline_sizes") {
      settings.virtual_pipeline_sizes = integer_list(value, key);
    } else if (key == "micro_batch_sizes") {
      settings.micro_batch_sizes = integer_list(value, key);
    } else if (key == "recompute") {
      settings.recompute =
          choice_list<RecomputeChoice>(value, key, recompute_choice, "[none,selective,full]");
    } else if (key == "distributed_optimizer") {
      settings.distributed_optimizer = choice_list<bool>(
          value, key,
          [](const Node& item, const std::string& item_key) {
            if (!item.is_bool()) {
              common::fail("autoconfig {}: expected true or false, got '{}'", item_key,
                           python_str(item));
            }
            return item.as_bool();
          },
          "[false,true]");
    } else if (key == "min_model_parallel_size") {
      settings.min_model_parallel_size = positive_integer(value, key);
    } else if (key == "max_model_parallel_size") {
      settings.max_model_parallel_size = positive_integer(value, key);
    } else if (key == "max_steps_per_run") {
      settings.max_steps_per_run = positive_integer(value, key);
    } else if (key == "max_minutes_per_run") {
      // NaN would stop every candidate at once (its time limit reads as zero).
      if (!value.is_number() || !std::isfinite(value.as_double()) || value.as_double() <= 0 ||
          value.as_double() > 525600) {
        common::fail("autoconfig max_minutes_per_run: expected minutes > 0 (at most a year), got '{}'",
                     python_str(value));
      }
      settings.max_minutes_per_run = value.as_double();
    } else if (key == "limit_search_runs") {
      settings.limit_search_runs = positive_integer(value, key);
    }
  }
  if (settings.model.empty()) {
    common::fail("autoconfig: model=<training config> is required, e.g. model=gpt3/126m");
  }
  if (settings.nodes > 100000 || settings.gpus_per_node > 1024) {
    common::fail("autoconfig: cluster.nodes {} × cluster.gpus_per_node {} is too large to search",
                 settings.nodes, settings.gpus_per_node);
  }
  if (settings.max_model_parallel_size != 0 &&
      settings.max_model_parallel_size < settings.min_model_parallel_size) {
    common::fail("autoconfig: max_model_parallel_size {} is below min_model_parallel_size {}",
                 settings.max_model_parallel_size, settings.min_model_parallel_size);
  }
  return settings;
}

void resolve_auto_lists(SearchSettings& settings, const ModelFacts& model) {
  if (settings.tensor_parallel_sizes.empty()) {
    settings.tensor_parallel_sizes = powers_of_two_up_to(std::min<int64_t>(settings.gpus_per_node, 8));
  }
  if (settings.pipeline_parallel_sizes.empty()) {
    settings.pipeline_parallel_sizes =
        powers_of_two_up_to(std::max<int64_t>(1, std::min(settings.gpus(), model.num_layers)));
  }
  if (settings.virtual_pipeline_sizes.empty()) settings.virtual_pipeline_sizes = {1};
  if (settings.micro_batch_sizes.empty()) settings.micro_batch_sizes = {1, 2, 4, 8};
  if (settings.recompute.empty()) {
    settings.recompute = {RecomputeChoice::none, RecomputeChoice::selective, RecomputeChoice::full};
  }
  if (settings.distributed_optimizer.empty()) settings.distributed_optimizer = {false, true};
}

std::string Layout::name() const {
  return fmt::format("tp{}_pp{}_vp{}_mbs{}_recompute-{}_distopt-{}", tensor_parallel,
                     pipeline_parallel, virtual_pipeline, micro_batch_size, recompute_name(recompute),
                     distributed_optimizer ? "on" : "off");
}

std::vector<std::string> Layout::overrides() const {
  std::vector<std::string> overrides = {
      fmt::format("training.model.tensor_model_parallel_size={}", tensor_parallel),
      fmt::format("training.model.pipeline_model_parallel_size={}", pipeline_parallel),
      virtual_pipeline > 1
          ? fmt::format("training.model.virtual_pipeline_model_parallel_size={}", virtual_pipeline)
          : "training.model.virtual_pipeline_model_parallel_size=null",
      fmt::format("training.model.micro_batch_size={}", micro_batch_size),
      recompute == RecomputeChoice::none
          ? "training.model.activations_checkpoint_granularity=null"
          : "training.model.activations_checkpoint_granularity=" + recompute_name(recompute),
      // Full recompute needs a method (NeMo's uniform: every layer, one at a time); the others none.
      recompute == RecomputeChoice::full ? "training.model.activations_checkpoint_method=uniform"
                                         : "training.model.activations_checkpoint_method=null",
      recompute == RecomputeChoice::full ? "training.model.activations_checkpoint_num_layers=1"
                                         : "training.model.activations_checkpoint_num_layers=null",
      distributed_optimizer ? "training.model.optim.name=distributed_fused_adam"
                            : "training.model.optim.name=fused_adam"};
  return overrides;
}

void check_search_size(const SearchSettings& settings) {
  // Multiplied as doubles: each list holds at most a million values, so six of them can pass
  // int64; a double is exact far past the bound it is compared with.
  const double combinations = static_cast<double>(settings.tensor_parallel_sizes.size()) *
                              static_cast<double>(settings.pipeline_parallel_sizes.size()) *
                              static_cast<double>(settings.virtual_pipeline_sizes.size()) *
                              static_cast<double>(settings.micro_batch_sizes.size()) *
                              static_cast<double>(settings.recompute.size()) *
                              static_cast<double>(settings.distributed_optimizer.size());
  if (combinations > static_cast<double>(kMaxSearchCandidates)) {
    common::fail(
        "autoconfig: the search lists span {:.0f} candidates (tensor_parallel_sizes {} × "
        "pipeline_parallel_sizes {} × virtual_pipeline_sizes {} × micro_batch_sizes {} × "
        "recompute {} × distributed_optimizer {}), more than the {} one search considers; "
        "shorten the lists (auto picks the powers of two that can divide the GPUs)",
        combinations, settings.tensor_parallel_sizes.size(),
        settings.pipeline_parallel_sizes.size(), settings.virtual_pipeline_sizes.size(),
        settings.micro_batch_sizes.size(), settings.recompute.size(),
        settings.distributed_optimizer.size(), kMaxSearchCandidates);
  }
}

std::vector<Layout> enumerate_layouts(const SearchSettings& settings) {
  check_search_size(settings);
  std::vector<Layout> layouts;
  for (int64_t tp : settings.tensor_parallel_sizes) {
    for (int64_t pp : settings.pipeline_parallel_sizes) {
      for (int64_t vp : settings.virtual_pipeline_sizes) {
        for (int64_t mbs : settings.micro_batch_sizes) {
          for (RecomputeChoice recompute : settings.recompute) {
            for (bool distributed : settings.distributed_optimizer) {
              layouts.push_back({tp, pp, vp, mbs, recompute, distributed});
            }
          }
        }
      }
    }
  }
  return layouts;
}

std::optional<RuleBreak> check_nemo_rules(const Layout& layout, const SearchSettings& settings,
                                          const ModelFacts& model) {
  const int64_t tp = layout.tensor_parallel, pp = layout.pipeline_parallel;
  const int64_t vp = layout.virtual_pipeline, mbs = layout.micro_batch_size;
  const int64_t gpus = settings.gpus();
  const int64_t model_parallel = tp * pp;  // both ≤ what parse_search_settings lets through
  if (model_parallel > gpus || gpus % model_parallel != 0) {
    return RuleBreak{"gpus", fmt::format("tp {} × pp {} = {} does not divide the {} GPUs", tp, pp,
                                         model_parallel, gpus)};
  }
  const int64_t max_model_parallel =
      settings.max_model_parallel_size == 0 ? gpus : settings.max_model_parallel_size;
  if (model_parallel < settings.min_model_parallel_size || model_parallel > max_model_parallel) {
    return RuleBreak{"model_parallel_range",
                     fmt::format("tp × pp = {} outside min_model_parallel_size {} .. "
                                 "max_model_parallel_size {}",
                                 model_parallel, settings.min_model_parallel_size, max_model_parallel)};
  }
  if (model.num_attention_heads % tp != 0) {
    return RuleBreak{"heads", fmt::format("num_attention_heads {} is not divisible by tp {}",
                                          model.num_attention_heads, tp)};
  }
  if (model.num_layers % pp != 0) {
    return RuleBreak{"layers",
                     fmt::format("num_layers {} is not divisible by pp {}", model.num_layers, pp)};
  }
  if (vp > 1 && (pp <= 2 || model.num_layers % (pp * vp) != 0)) {
    return RuleBreak{"virtual_pipeline",
                     pp <= 2 ? fmt::format("virtual pipeline {} needs pp > 2, got pp {}", vp, pp)
                             : fmt::format("num_layers {} is not divisible by pp {} × virtual "
                                           "pipeline {}", model.num_layers, pp, vp)};
  }
  const int64_t dp = gpus / model_parallel;
  if (model.global_batch_size % (mbs * dp) != 0) {
    return RuleBreak{"global_batch",
                     fmt::format("global_batch_size {} is not divisible by mbs {} × dp {}",
                                 model.global_batch_size, mbs, dp)};
  }
  if (vp > 1 && (model.global_batch_size / (mbs * dp)) % pp != 0) {
    return RuleBreak{"interleaved_batches",
                     fmt::format("{} micro batches per step are not divisible by pp {}, as the "
                                 "interleaved schedule needs",
                                 model.global_batch_size / (mbs * dp), pp)};
  }
  return std::nullopt;
}

}  // namespace launcher
