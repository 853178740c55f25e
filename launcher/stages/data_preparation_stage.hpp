// The data_preparation stage: preprocess_data over the configured JSONL files, with Megatron's
// tools/preprocess_data.py flags. No input files: nothing to submit.
#pragma once

#include <optional>

#include "launcher/stages/stage.hpp"

namespace launcher {

std::optional<JobSpec> build_data_preparation_job(const StageContext& context);

}  // namespace launcher
