// The conversion stage: checkpoint_util --load <checkpoint folder> --export-hf <results>/hf.
#pragma once

#include <optional>

#include "launcher/stages/stage.hpp"

namespace launcher {

std::optional<JobSpec> build_conversion_job(const StageContext& context);

}  // namespace launcher
