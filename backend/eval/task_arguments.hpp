// evaluate_gpt's task flags as one value (Megatron-LM's tasks/main.py: --task, --valid-data,
// --overlapping-eval, --strict-lambada; --results-json is ours), the task an enum under
// Megatron's names. train/arguments.cpp registers and dumps them from its table.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/common/enum_names.hpp"

namespace backend {

// The zero-shot tasks evaluate_gpt runs (zero_shot_tasks.hpp says what each computes).
enum class ZeroShotTask { wikitext103, lambada };
constexpr common::EnumName<ZeroShotTask> kZeroShotTaskNames[] = {
    {ZeroShotTask::wikitext103, "WIKITEXT103"},
    {ZeroShotTask::lambada, "LAMBADA"},
};
constexpr std::span<const common::EnumName<ZeroShotTask>> enum_names(ZeroShotTask) {
  return kZeroShotTaskNames;
}

struct TaskArguments {
  ZeroShotTask task = ZeroShotTask::wikitext103;  // --task WIKITEXT103 | LAMBADA (required)
  std::vector<std::string> valid_data;            // --valid-data FILE ...
  int64_t overlapping_eval = 32;                  // --overlapping-eval (Megatron's default)
  bool strict_lambada = false;                    // --strict-lambada
  std::string results_json;                       // --results-json FILE (ours)
};

}  // namespace backend
