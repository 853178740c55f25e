// conversion → checkpoint_util; see conversion_stage.hpp.
#include "launcher/stages/conversion_stage.hpp"

namespace launcher {

std::optional<JobSpec> build_conversion_job(const StageContext& context) {
  JobSpec job = job_from_run_section("conversion", context);
  job.tool = "checkpoint_util";
  const std::string checkpoint_folder =
      at_path(context.config, "conversion.model.checkpoint_folder")
          .as_string("conversion.model.checkpoint_folder");
  job.command = {(context.backend_bin_dir / job.tool).string(), "--load", checkpoint_folder,
                 "--export-hf", (job.results_dir / "hf").string()};
  return job;
}

}  // namespace launcher
