// evaluation → evaluate_gpt; see evaluation_stage.hpp.
#include "launcher/stages/evaluation_stage.hpp"

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "backend/common/error.hpp"
#include "launcher/config/scalar_text.hpp"

namespace launcher {

namespace {

struct EvaluationTask {
  const char* nemo_name;      // run.tasks
  const char* megatron_task;  // evaluate_gpt --task
  const char* default_file;   // under data_dir, when evaluation.data.<nemo_name> is not set
};

constexpr EvaluationTask kTasks[] = {
    {"lambada", "LAMBADA", "lambada/lambada_test.jsonl"},
    {"wikitext103", "WIKITEXT103", "wikitext-103/wiki.test.tokens"},
    // Megatron's WIKITEXT103 task scores any text in WikiText's format: WikiText-2's test set too.
    {"wikitext2", "WIKITEXT103", "wikitext-2/wiki.test.tokens"},
};

// NeMo's lm-evaluation-harness tasks this backend has no evaluation for.
constexpr const char* kNemoHarnessTasks[] = {"boolq", "race", "piqa", "hellaswag", "winogrande",
                                             "all_tasks"};

}  // namespace

std::optional<JobSpec> build_evaluation_job(const StageContext& context) {
  const Node& config = context.config;
  JobSpec job = job_from_run_section("evaluation", context);
  job.tool = "evaluate_gpt";
  auto set = [&](const std::string& key) { return find_set(config, key); };
  auto text = [&](const std::string& key) { return scalar_text(at_path(config, key), key); };

  const std::string tasks = set("evaluation.run.tasks") ? text("evaluation.run.tasks") : "lambada";
  const EvaluationTask* task = nullptr;
  for (const EvaluationTask& candidate : kTasks) {
    if (tasks == candidate.nemo_name) task = &candidate;
  }
  if (task == nullptr) {
    for (const char* harness : kNemoHarnessTasks) {
      if (tasks == harness) {
        common::fail("evaluation.run.tasks: '{}' is one of NeMo's lm-evaluation-harness tasks, which "
                     "this launcher does not run; evaluate_gpt runs Megatron's zero-shot tasks: "
                     "lambada, wikitext103, wikitext2 (one per evaluation run)", tasks);
      }
    }
    common::fail("evaluation.run.tasks: '{}' is not a task (valid: lambada, wikitext103, "
                 "wikitext2)", tasks);
  }
  if (set("evaluation.model.nemo_model")) {
    common::fail("evaluation.model.nemo_model: .nemo files are NeMo's; evaluate_gpt reads the "
                 "checkpoint in evaluation.model.checkpoint_folder (set nemo_model=null)");
  }
  if (set("evaluation.model.checkpoint_name") && text("evaluation.model.checkpoint_name") != "latest") {
    common::fail("evaluation.model.checkpoint_name: '{}': evaluate_gpt reads the checkpoint the "
                 "folder's latest_checkpointed_iteration.txt names (valid: latest)",
                 text("evaluation.model.checkpoint_name"));
  }
  for (const char* key : {"evaluation.model.tensor_model_parallel_size",
                          "evaluation.model.pipeline_model_parallel_size"}) {
    if (set(key) && text(key) != "1") {
      common::fail("{}: {}: evaluate_gpt runs the whole model in one process; reshard the "
                   "checkpoint to 1 first (checkpoint_util --load DIR --save NEWDIR "
                   "--target-tensor-parallel-size 1 --target-pipeline-parallel-size 1) and point "
                   "evaluation.model.checkpoint_folder at it",
                   key, text(key));
    }
  }

  const std::string data_key = fmt::format("evaluation.data.{}", task->nemo_name);
  const std::string valid_data =
      set(data_key) ? text(data_key) : fmt::format("{}/{}", text("data_dir"), task->default_file);
  job.command = {(context.backend_bin_dir / job.tool).string(),
                 "--task", task->megatron_task,
                 "--valid-data", valid_data,
                 "--load", text("evaluation.model.checkpoint_folder"),
                 // The model's shape from the checkpoint, as NeMo's evaluation reads the training
                 // run's hparams_file.
                 "--use-checkpoint-args"};
  auto flag = [&](const std::string& key, const char* megatron_flag) {
    if (set(key)) {
      job.command.push_back(megatron_flag);
      job.command.push_back(text(key));
    }
  };
  flag("evaluation.model.eval_batch_size", "--micro-batch-size");
  flag("evaluation.model.vocab_file", "--vocab-file");
  flag("evaluation.model.merge_file", "--merge-file");
  flag("evaluation.model.tokenizer_model", "--tokenizer-model");
  const bool lambada = std::string_view(task->megatron_task) == "LAMBADA";
  if (!lambada) flag("evaluation.data.overlapping_eval", "--overlapping-eval");
  if (lambada && set("evaluation.data.strict_lambada") &&
      at_path(config, "evaluation.data.strict_lambada").as_bool("evaluation.data.strict_lambada")) {
    job.command.push_back("--strict-lambada");
  }
  job.command.push_back("--results-json");
  job.command.push_back((job.results_dir / fmt::format("{}_results.json", task->nemo_name)).string());
  return job;
}

}  // namespace launcher
