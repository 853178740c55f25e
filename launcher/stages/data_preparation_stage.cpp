// data_preparation → preprocess_data; see data_preparation_stage.hpp. Flags follow Megatron-LM
// tools/preprocess_data.py: --input, --output-prefix, --json-keys, --tokenizer-type,
// --vocab-file, --merge-file, --append-eod, --workers, --log-interval.
#include "launcher/stages/data_preparation_stage.hpp"

#include <spdlog/spdlog.h>

#include "launcher/config/scalar_text.hpp"

namespace launcher {

std::optional<JobSpec> build_data_preparation_job(const StageContext& context) {
  const Node& stage = at_path(context.config, "data_preparation");
  const Node* input = find_set(stage, "input");
  if (input == nullptr || (input->is_list() && input->size() == 0)) {
    spdlog::info("data_preparation: data_preparation.input lists no files, nothing to submit");
    return std::nullopt;
  }
  JobSpec job = job_from_run_section("data_preparation", context);
  job.tool = "preprocess_data";
  job.command.push_back((context.backend_bin_dir / job.tool).string());
  auto add_values = [&](const char* flag, const char* key) {
    const Node* value = find_set(stage, key);
    if (value == nullptr) return;
    const std::string full_key = std::string("data_preparation.") + key;
    job.command.push_back(flag);
    if (value->is_list()) {
      for (size_t i = 0; i < value->size(); ++i) {
        job.command.push_back(scalar_text(value->at(i), full_key + "." + std::to_string(i)));
      }
    } else {
      job.command.push_back(scalar_text(*value, full_key));
    }
  };
  add_values("--input", "input");
  add_values("--output-prefix", "output_prefix");
  add_values("--json-keys", "json_keys");
  add_values("--tokenizer-type", "tokenizer.type");
  add_values("--vocab-file", "tokenizer.vocab_file");
  add_values("--merge-file", "tokenizer.merge_file");
  add_values("--workers", "workers");
  add_values("--log-interval", "log_interval");
  if (const Node* eod = find_set(stage, "append_eod"); eod && eod->as_bool("data_preparation.append_eod")) {
    job.command.push_back("--append-eod");
  }
  return job;
}

}  // namespace launcher
