// evaluation → evaluate_gpt; see evaluation_stage.hpp.
#include "launcher/stages/evaluation_stage.hpp"

#include "launcher/config/scalar_text.hpp"

namespace launcher {

std::optional<JobSpec> build_evaluation_job(const StageContext& context) {
  JobSpec job = job_from_run_section("evaluation", context);
  job.tool = "evaluate_gpt";
  job.command = {(context.backend_bin_dir / job.tool).string(), "--load",
                 at_path(context.config, "evaluation.model.checkpoint_folder")
                     .as_string("evaluation.model.checkpoint_folder")};
  if (const Node* iters = find_set(context.config, "evaluation.model.eval_iters")) {
    job.command.push_back("--eval-iters");
    job.command.push_back(scalar_text(*iters, "evaluation.model.eval_iters"));
  }
  return job;
}

}  // namespace launcher
