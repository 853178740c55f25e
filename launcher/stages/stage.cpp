// Stage dispatch and the `<stage>.run` section every stage shares; see stage.hpp.
#include "launcher/stages/stage.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/common/error.hpp"
#include "backend/common/suggest.hpp"
#include "launcher/stages/conversion_stage.hpp"
#include "launcher/stages/data_preparation_stage.hpp"
#include "launcher/stages/evaluation_stage.hpp"
#include "launcher/stages/training_stage.hpp"

namespace launcher {

const std::vector<std::string>& known_stages() {
  static const std::vector<std::string> stages = {"data_preparation", "training", "conversion",
                                                  "evaluation"};
  return stages;
}

JobSpec job_from_run_section(std::string_view stage, const StageContext& context) {
  const std::string section(stage);
  const Node* stage_node = find(context.config, section);
  if (stage_node == nullptr || !stage_node->is_map()) {
    common::fail("stage '{}' is listed in `stages` but the config has no `{}` section: choose "
                 "one with {}=<option>", stage, section, section);
  }
  JobSpec job;
  job.stage = section;
  job.run_name = at_path(context.config, section + ".run.name").as_string(section + ".run.name");
  job.job_name = context.job_name_prefix + job.run_name;
  job.results_dir =
      at_path(context.config, section + ".run.results_dir").as_string(section + ".run.results_dir");
  auto optional_text = [&](const std::string& key) -> std::string {
    const Node* value = find(context.config, key);
    if (value == nullptr || value->is_null()) return {};
    return value->as_string(key);
  };
  job.time_limit = optional_text(section + ".run.time_limit");
  job.run_dependency = optional_text(section + ".run.dependency");
  return job;
}

std::vector<JobSpec> build_stage_jobs(std::string_view stage, const StageContext& context) {
  if (stage == "data_preparation") return build_data_preparation_jobs(context);
  if (stage == "training") return {build_training_job(context)};
  for (auto [name, build] : {std::pair{"conversion", &build_conversion_job},
                             std::pair{"evaluation", &build_evaluation_job}}) {
    if (stage != name) continue;
    std::optional<JobSpec> job = build(context);
    return job ? std::vector<JobSpec>{std::move(*job)} : std::vector<JobSpec>{};
  }
  common::fail("stages: '{}' is not a stage{} (valid: {})", stage,
               common::did_you_mean(stage, known_stages()), fmt::join(known_stages(), ", "));
}

}  // namespace launcher
