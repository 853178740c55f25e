// The evaluation stage: NeMo's `evaluation` config group (evaluate_lambada.yaml's keys) run as
// evaluate_gpt, Megatron's zero-shot tasks (docs/evaluation.md), on the checkpoint a training
// run saved:
//   evaluate_gpt --task <LAMBADA|WIKITEXT103> --valid-data <file> --load <checkpoint_folder>
//       --use-checkpoint-args --micro-batch-size <eval_batch_size> [tokenizer files]
//       [--strict-lambada] [--overlapping-eval N] --results-json <results_dir>/<task>_results.json
// run.tasks: NeMo's lambada, wikitext103 and wikitext2 map to Megatron's tasks; NeMo's other
// lm-evaluation-harness tasks (boolq, race, piqa, hellaswag, winogrande, all_tasks) are refused,
// naming them. The task's file is evaluation.data.<task> (ours: NeMo's harness downloads its
// data), by default under data_dir. docs/launcher.md, "Evaluation", lists each key.
#pragma once

#include <optional>

#include "launcher/stages/stage.hpp"

namespace launcher {

std::optional<JobSpec> build_evaluation_job(const StageContext& context);

}  // namespace launcher
