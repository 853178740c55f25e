// The evaluation stage: evaluate_gpt --load <checkpoint folder> --eval-iters N, the validation
// and test loss of a trained checkpoint.
#pragma once

#include <optional>

#include "launcher/stages/stage.hpp"

namespace launcher {

std::optional<JobSpec> build_evaluation_job(const StageContext& context);

}  // namespace launcher
