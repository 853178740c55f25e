// Stage dispatch and the `<stage>.run` section every stage shares; see stage.hpp.
#include "launcher/stages/stage.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "backend/common/error.hpp"
#include "backend/common/suggest.hpp"
#include "launcher/stages/conversion_stage.hpp"
#include "launcher/stages/data_preparation_stage.hpp"
#include "launcher/stages/evaluation_stage.hpp"
#include "launcher/stages/training_stage.hpp"

namespace launcher {

const std::vector<std::string>& known_stages() {
  static const std::vector<std::string> stages = {"data_preparation", "training", "conversion",
                                                  "evaluation"};
  return stages;
}

const std::vector<NemoStage>& nemo_stages() {
  static const std::vector<NemoStage> stages = {
      {"data_preparation", "downloads and tokenizes a corpus (the Pile, mC4, custom JSONL) into .bin/.idx",
       "download, decompress, preprocess_data", true},
      {"training", "pretrains a model (megatron_gpt_pretraining.py)", "pretrain_gpt", true},
      {"conversion", "converts a training checkpoint into a .nemo file",
       "checkpoint_util --export-nemo (NeMo 1.x's legacy GPT) and --export-hf", true},
      {"evaluation", "evaluates a checkpoint on benchmark tasks (lm-evaluation-harness, or NeMo's own)",
       "evaluate_gpt (Megatron's zero-shot LAMBADA and WikiText perplexity)", true},
      {"export", "exports a .nemo model for Triton Inference Server (FasterTransformer / TensorRT-LLM)",
       "the conversion stage (checkpoint_util --export-hf) writes a Hugging Face "
       "model that inference servers load", false},
      {"fine_tuning", "fine-tunes a trained model on a task dataset (SQuAD, custom), supervised",
       "pretrain_gpt --load <checkpoint dir> --finetune --data-path <the task data, "
       "prepared by data_preparation>", false},
      {"peft", "fine-tunes a trained model parameter-efficiently (LoRA, P-tuning, adapters, IA3)",
       "full fine-tuning, pretrain_gpt --load <checkpoint dir> --finetune (no "
       "parameter-efficient methods here)", false},
      {"prompt_learning", "trains virtual prompt tokens (P-tuning, prompt tuning) with the model frozen",
       "full fine-tuning, pretrain_gpt --load <checkpoint dir> --finetune (no "
       "parameter-efficient methods here)", false},
      {"adapter_learning", "trains adapter layers inserted into a frozen model",
       "full fine-tuning, pretrain_gpt --load <checkpoint dir> --finetune (no "
       "parameter-efficient methods here)", false},
      {"ia3_learning", "trains IA3 rescaling vectors of a frozen model's activations",
       "full fine-tuning, pretrain_gpt --load <checkpoint dir> --finetune (no "
       "parameter-efficient methods here)", false},
      {"rlhf_rm", "trains a reward model for RLHF (NeMo-Aligner)", "nothing yet, there is no RLHF here", false},
      {"rlhf_ppo", "trains a model with PPO against a reward model (RLHF, NeMo-Aligner)",
       "nothing yet, there is no RLHF here", false},
      {"steerlm_reg", "fine-tunes a model conditioned on attribute values (SteerLM)",
       "nothing yet, there is no SteerLM here", false},
      {"quality_filtering", "filters documents by heuristic quality rules (NeMo Data Curator)",
       "filter the JSONL yourself before data_preparation", false},
      {"data_curation", "runs NeMo Data Curator: downloads, cleans, deduplicates and filters a corpus",
       "curate the JSONL yourself, then data_preparation", false},
      {"conversion_hf2nemo", "converts a Hugging Face checkpoint into a .nemo file",
       "checkpoint_util --import-hf <dir> --save <checkpoint dir> makes a "
       "checkpoint that pretrain_gpt loads", false},
      {"external_conversion", "converts a checkpoint of another framework into a .nemo file",
       "checkpoint_util --import-hf reads Hugging Face checkpoints", false},
      {"fw_inference", "generates text with the trained model (NeMo framework inference)",
       "text_generation_server --load <checkpoint dir> serves the model over Megatron's "
       "PUT /api, and text_generation_cli asks it (docs/serving.md); not run as a stage", false},
  };
  return stages;
}

void check_stage_names(const std::vector<std::string>& stages) {
  const auto& runnable = known_stages();
  for (const std::string& stage : stages) {
    if (std::find(runnable.begin(), runnable.end(), stage) != runnable.end()) continue;
    const auto& nemo = nemo_stages();
    const auto found = std::find_if(nemo.begin(), nemo.end(),
                                    [&](const NemoStage& entry) { return entry.name == stage; });
    if (found == nemo.end()) {
      common::fail("stages: '{}' is not a stage (valid: {}; NeMo's other stages are refused "
                   "with what to use instead, docs/launcher.md).{}",
                   stage, fmt::join(runnable, ", "), common::did_you_mean(stage, runnable));
    }
    std::vector<std::string> rest;
    for (const std::string& other : stages) {
      if (std::find(runnable.begin(), runnable.end(), other) != runnable.end()) rest.push_back(other);
    }
    common::fail("stages: '{}' is a NeMo-Megatron-Launcher stage that this launcher does not "
                 "run: in NeMo it {}. Instead: {}. The stages it runs: {}; without '{}': "
                 "stages=[{}]",
                 stage, found->in_nemo, found->here, fmt::join(runnable, ", "), stage,
                 rest.empty() ? std::string("training") : fmt::format("{}", fmt::join(rest, ",")));
  }
}

JobSpec job_from_run_section(std::string_view stage, const StageContext& context) {
  const std::string section(stage);
  const Node* stage_node = find(context.config, section);
  if (stage_node == nullptr || !stage_node->is_map()) {
    common::fail("stage '{}' is listed in `stages` but the config has no `{}` section: choose "
                 "one with {}=<option>", stage, section, section);
  }
  JobSpec job;
  job.stage = section;
  job.run_name = at_path(context.config, section + ".run.name").as_string(section + ".run.name");
  job.job_name = context.job_name_prefix + job.run_name;
  job.results_dir =
      at_path(context.config, section + ".run.results_dir").as_string(section + ".run.results_dir");
  auto optional_text = [&](const std::string& key) -> std::string {
    const Node* value = find(context.config, key);
    if (value == nullptr || value->is_null()) return {};
    return value->as_string(key);
  };
  job.time_limit = optional_text(section + ".run.time_limit");
  job.run_dependency = optional_text(section + ".run.dependency");
  return job;
}

std::vector<JobSpec> build_stage_jobs(std::string_view stage, const StageContext& context) {
  if (stage == "data_preparation") return build_data_preparation_jobs(context);
  if (stage == "training") return {build_training_job(context)};
  for (auto [name, build] : {std::pair{"conversion", &build_conversion_job},
                             std::pair{"evaluation", &build_evaluation_job}}) {
    if (stage != name) continue;
    std::optional<JobSpec> job = build(context);
    return job ? std::vector<JobSpec>{std::move(*job)} : std::vector<JobSpec>{};
  }
  check_stage_names({std::string(stage)});  // fails, saying why
  common::fail("stages: '{}' is not a stage (valid: {})", stage, fmt::join(known_stages(), ", "));
}

}  // namespace launcher
