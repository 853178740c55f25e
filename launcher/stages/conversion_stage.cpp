// conversion → checkpoint_util; see conversion_stage.hpp.
#include "launcher/stages/conversion_stage.hpp"

namespace launcher {

namespace {

// The string at `path`, nullopt when absent or null.
std::optional<std::string> set_text(const Node& config, std::string_view path) {
  const Node* node = find(config, path);
  if (node == nullptr || node->is_null()) return std::nullopt;
  return node->as_string(path);
}

}  // namespace

std::optional<JobSpec> build_conversion_job(const StageContext& context) {
  JobSpec job = job_from_run_section("conversion", context);
  job.tool = "checkpoint_util";
  const std::string checkpoint_folder =
      at_path(context.config, "conversion.model.checkpoint_folder")
          .as_string("conversion.model.checkpoint_folder");
  // NeMo's converter writes <results>/<nemo_file_name> with the tokenizer's files packed in;
  // the Hugging Face directory is this backend's addition.
  const std::string nemo_file_name =
      set_text(context.config, "conversion.run.nemo_file_name").value_or("megatron_gpt.nemo");
  job.command = {(context.backend_bin_dir / job.tool).string(), "--load", checkpoint_folder,
                 "--export-hf", (job.results_dir / "hf").string(), "--export-nemo",
                 (job.results_dir / nemo_file_name).string()};
  for (const auto& [key, flag] : {std::pair{"conversion.model.vocab_file", "--vocab-file"},
                                  std::pair{"conversion.model.merge_file", "--merge-file"}}) {
    if (const std::optional<std::string> file = set_text(context.config, key)) {
      job.command.insert(job.command.end(), {flag, *file});
    }
  }
  return job;
}

}  // namespace launcher
