// The evaluation stage (launcher/stages/evaluation_stage.hpp): our conf and NeMo's own
// evaluation configs become evaluate_gpt's command line with Megatron's task flags, the
// checkpoint's arguments and the task's file; NeMo's lm-evaluation-harness tasks and settings
// that cannot run here are refused naming the key.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/stages/stage.hpp"

using namespace launcher;

namespace {

std::vector<std::string> evaluation_command(const std::string& conf_dir, std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), {"stages=[evaluation]", "launcher_scripts_path=/opt/launcher",
                                       "data_dir=/data", "base_results_dir=/results"});
  const ComposedConfig composed = compose({conf_dir, "config", overrides});
  const Node config = resolve(composed.config, ResolveContext{composed.choices});
  const std::vector<JobSpec> jobs = build_stage_jobs("evaluation", {config, "/opt/bin", "nemo-"});
  REQUIRE(jobs.size() == 1);
  return jobs.front().command;
}

const std::string kOurs = std::string(TEST_SOURCE_DIR) + "/conf";
const std::string kNemo2307 = std::string(TEST_SOURCE_DIR) + "/tests/data/nemo_23.07/conf";

}  // namespace

TEST_CASE("our evaluation config runs LAMBADA on the training run's checkpoint with its own arguments") {
  CHECK(evaluation_command(kOurs, {}) ==
        std::vector<std::string>{"/opt/bin/evaluate_gpt", "--task", "LAMBADA", "--valid-data",
                                 "/data/lambada/lambada_test.jsonl", "--load",
                                 "/results/gpt3_126m/results/checkpoints", "--use-checkpoint-args",
                                 "--micro-batch-size", "4", "--vocab-file", "/data/bpe/vocab.json",
                                 "--merge-file", "/data/bpe/merges.txt", "--results-json", "/results/gpt3_126m/eval_lambada/lambada_results.json"});
  const auto strict = evaluation_command(
      kOurs, {"evaluation.data.strict_lambada=true", "evaluation.data.overlapping_eval=7", "evaluation.data.lambada=/x/lambada.jsonl",
              "++evaluation.model.tokenizer_model=/t/tokenizer.model"});
  CHECK(std::find(strict.begin(), strict.end(), "--strict-lambada") != strict.end());
  CHECK(std::find(strict.begin(), strict.end(), "/x/lambada.jsonl") != strict.end());
  CHECK(std::find(strict.begin(), strict.end(), "/t/tokenizer.model") != strict.end());
  CHECK(std::find(strict.begin(), strict.end(), "--overlapping-eval") == strict.end());  // WikiText's
  for (const auto& task_and_file : {std::pair{"wikitext103", "/data/wikitext-103/wiki.test.tokens"},
                                    std::pair{"wikitext2", "/data/wikitext-2/wiki.test.tokens"}}) {
    const std::string tasks = task_and_file.first;
    const std::string file = task_and_file.second;
    CAPTURE(tasks);
    const auto command = evaluation_command(kOurs, {std::string("evaluation.run.tasks=") + tasks});
    CHECK(command[1] == "--task");
    CHECK(command[2] == "WIKITEXT103");
    CHECK(command[4] == file);
    // WikiText's window stride, not LAMBADA's switch.
    CHECK(std::find(command.begin(), command.end(), "--overlapping-eval") != command.end());
    CHECK(std::find(command.begin(), command.end(), "--strict-lambada") == command.end());
    CHECK(command.back() == std::string("/results/gpt3_126m/eval_lambada/") + tasks + "_results.json");
  }
}

TEST_CASE("NeMo 23.07's own evaluate_lambada composes into the same task, its data under data_dir") {
  const auto command = evaluation_command(kNemo2307, {"evaluation=gpt3/evaluate_lambada"});
  CHECK(command == std::vector<std::string>{
                       "/opt/bin/evaluate_gpt", "--task", "LAMBADA", "--valid-data",
                       "/data/lambada/lambada_test.jsonl", "--load", "/results/gpt3_5b/results/checkpoints",
                       "--use-checkpoint-args", "--micro-batch-size", "4", "--vocab-file",
                       "/data/bpe/vocab.json", "--merge-file", "/data/bpe/merges.txt", "--results-json",
                       "/results/gpt3_5b/eval_lambada/lambada_results.json"});
}

TEST_CASE("what cannot run here is refused naming the key: harness tasks, model parallel, .nemo, checkpoint names") {
  struct Case {
    std::vector<std::string> overrides;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"evaluation.run.tasks=boolq"}, "evaluation.run.tasks: 'boolq' is one of NeMo's lm-evaluation-harness tasks"},
      {{"evaluation.run.tasks=all_tasks"}, "'all_tasks' is one of NeMo's lm-evaluation-harness tasks"},
      {{"evaluation.run.tasks=lambda"}, "evaluation.run.tasks: 'lambda' is not a task (valid: lambada, wikitext103, wikitext2)"},
      {{"evaluation.model.tensor_model_parallel_size=2"}, "evaluation.model.tensor_model_parallel_size: 2: evaluate_gpt runs the whole model"},
      {{"evaluation.model.pipeline_model_parallel_size=4"}, "evaluation.model.pipeline_model_parallel_size: 4"},
      {{"++evaluation.model.nemo_model=/m/model.nemo"}, "evaluation.model.nemo_model: .nemo files are NeMo's"},
      {{"evaluation.model.checkpoint_name=megatron_gpt-*last.ckpt"}, "evaluation.model.checkpoint_name: 'megatron_gpt-*last.ckpt'"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.message);
    std::string message;
    try {
      evaluation_command(kOurs, c.overrides);
    } catch (const common::Error& error) {
      message = error.what();
    }
    CHECK(message.find(c.message) != std::string::npos);
  }
}
