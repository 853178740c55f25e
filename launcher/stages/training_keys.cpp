// The accounting of training keys; see training_keys.hpp. What each NeMo key does in NeMo is
// read from NeMo 1.20's MegatronGPTModel / MegatronBaseModel, exp_manager and the
// NeMo-Megatron-Launcher 23.07/23.08 configs; the reasons below say why it has no effect here.
#include "launcher/stages/training_keys.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <set>

#include "backend/common/error.hpp"
#include "backend/common/suggest.hpp"
#include "launcher/config/scalar_text.hpp"
#include "launcher/stages/training_stage.hpp"

namespace launcher {

namespace {

using Kind = TrainingKeyKind;

const std::vector<TrainingKeyRule> kRules = {
    // Read by the launcher itself.
    {"run.name", Kind::launcher, {}, "the job's name and its results directory's"},
    {"run.results_dir", Kind::launcher, {}, "the stage's results directory"},
    {"run.time_limit", Kind::launcher, {}, "the scheduler's time limit (#SBATCH --time)"},
    {"run.dependency", Kind::launcher, {}, "the scheduler's dependency (#SBATCH --dependency)"},
    {"trainer.num_nodes", Kind::launcher, {}, "nodes of the job"},
    {"trainer.devices", Kind::launcher, {}, "tasks (GPUs) per node"},
    {"model.data.data_prefix", Kind::launcher, {}, "--data-path (with data_impl mmap)"},
    {"model.data.splits_string", Kind::launcher, {}, "--split (with data_impl mmap)"},
    {"model.data.seq_length",
     Kind::launcher,
     {},
     "must equal model.encoder_seq_length (NeMo's configs interpolate it; Megatron has one "
     "--seq-length for the model and the data)"},
    {"model.tokenizer.vocab_size",
     Kind::launcher,
     {},
     "the vocabulary the preflight's memory estimate counts (not a NeMo key)"},
    {"exp_manager.create_tensorboard_logger", Kind::launcher, {}, "false: no --tensorboard-dir"},
    {"hydra.*",
     Kind::no_effect,
     {},
     "the search path of NeMo's training script inside its container; the backend reads flags, "
     "not a Hydra config"},

    // trainer: PyTorch Lightning's, where Megatron's loop decides instead.
    {"trainer.logger",
     Kind::no_effect,
     {},
     "NeMo's exp_manager makes the loggers, not Lightning (TensorBoard: --tensorboard-dir)"},
    {"trainer.enable_checkpointing",
     Kind::no_effect,
     {},
     "NeMo's exp_manager makes the checkpoint callback, not Lightning (--save)"},
    {"trainer.replace_sampler_ddp",
     Kind::no_effect,
     {},
     "Megatron's own data samplers are always used (NeMo requires false)"},
    {"trainer.use_distributed_sampler",
     Kind::no_effect,
     {},
     "Megatron's own data samplers are always used (NeMo requires false)"},
    {"trainer.limit_test_batches",
     Kind::no_effect,
     {},
     "NeMo's pretraining script runs no test pass; the test split is evaluated with "
     "--eval-iters batches after the last iteration"},
    {"trainer.max_epochs",
     Kind::effect_in_nemo,
     {"-1"},
     "training runs by steps (max_steps); an epoch limit is not applied"},
    {"trainer.accumulate_grad_batches",
     Kind::changes_model,
     {"1"},
     "gradients accumulate over global_batch_size / (micro_batch_size × data-parallel size) "
     "micro batches, as NeMo requires accumulate_grad_batches 1"},

    // exp_manager: file names and loggers of NeMo's.
    {"exp_manager.exp_dir",
     Kind::no_effect,
     {},
     "used by NeMo only when explicit_log_dir is null; the log directory is then "
     "<run.results_dir>/results here"},
    {"exp_manager.name",
     Kind::no_effect,
     {},
     "the experiment name NeMo puts in paths when explicit_log_dir is null"},
    {"exp_manager.create_wandb_logger",
     Kind::effect_in_nemo,
     {"false"},
     "there is no Weights & Biases logger here (TensorBoard event files and Megatron's log "
     "lines only)"},
    {"exp_manager.wandb_logger_kwargs.*",
     Kind::no_effect,
     {},
     "read only with create_wandb_logger"},
    {"exp_manager.resume_ignore_no_checkpoint",
     Kind::effect_in_nemo,
     {"true"},
     "with resume_if_exists, a run with no checkpoint yet starts from scratch (NeMo fails "
     "instead when this is false)"},
    {"exp_manager.log_step_timing",
     Kind::no_effect,
     {},
     "the step time is always in Megatron's iteration line"},
    {"exp_manager.step_timing_kwargs.*",
     Kind::no_effect,
     {},
     "the step time is always in Megatron's iteration line"},
    {"exp_manager.checkpoint_callback_params.monitor",
     Kind::no_effect,
     {},
     "checkpoints are kept by iteration (Megatron's iter_NNNNNNN), none is deleted by a metric"},
    {"exp_manager.checkpoint_callback_params.mode",
     Kind::no_effect,
     {},
     "checkpoints are kept by iteration, none is deleted by a metric"},
    {"exp_manager.checkpoint_callback_params.save_top_k",
     Kind::no_effect,
     {},
     "every checkpoint is kept (Megatron's behaviour); delete old iter_* directories yourself"},
    {"exp_manager.checkpoint_callback_params.filename",
     Kind::no_effect,
     {},
     "checkpoints are named as Megatron names them (iter_NNNNNNN/mp_rank_XX)"},
    {"exp_manager.checkpoint_callback_params.model_parallel_size",
     Kind::no_effect,
     {},
     "the layout is stored in the checkpoint itself"},
    {"exp_manager.checkpoint_callback_params.always_save_nemo",
     Kind::effect_in_nemo,
     {"false"},
     "no .nemo archive is written; checkpoint_util converts checkpoints (Hugging Face export)"},
    {"exp_manager.checkpoint_callback_params.save_nemo_on_train_end",
     Kind::effect_in_nemo,
     {"false"},
     "no .nemo archive is written; checkpoint_util converts checkpoints (Hugging Face export)"},

    // model: implementation switches of NeMo's that compute the same model.
    {"model.mcore_gpt",
     Kind::no_effect,
     {},
     "chooses between NeMo's two implementations of the same GPT; there is one here"},
    {"model.transformer_engine",
     Kind::effect_in_nemo,
     {"false"},
     "NVIDIA Transformer Engine's layers; the backend's own kernels compute the same model"},
    {"model.use_emha", Kind::no_effect, {}, "an Apex attention kernel choice; same result"},
    {"model.bias_activation_fusion",
     Kind::no_effect,
     {},
     "a kernel fusion; the GELU here is the fused kernel's tanh approximation either way"},
    {"model.bias_dropout_add_fusion", Kind::no_effect, {}, "a kernel fusion; same result"},
    {"model.masked_softmax_fusion", Kind::no_effect, {}, "a kernel fusion; same result"},
    {"model.persist_layer_norm", Kind::no_effect, {}, "an Apex LayerNorm kernel; same result"},
    {"model.gradient_accumulation_fusion",
     Kind::no_effect,
     {},
     "a fused weight-gradient GEMM; same result"},
    {"model.grad_div_ar_fusion", Kind::no_effect, {}, "a fused all-reduce; same result"},
    {"model.grad_allreduce_chunk_size_mb",
     Kind::no_effect,
     {},
     "the all-reduce's chunking; same result"},
    {"model.gradient_as_bucket_view",
     Kind::no_effect,
     {},
     "PyTorch DDP's gradient buffers; same result"},
    {"model.batch_p2p_comm",
     Kind::no_effect,
     {},
     "how pipeline sends are grouped; same result (true with overlap_p2p_comm true and "
     "interleaving is refused by the preflight, as Megatron core refuses it)"},
    {"model.sync_batch_comm",
     Kind::no_effect,
     {},
     "how pipeline sends are synchronised; same result"},
    {"model.use_cpu_initialization",
     Kind::no_effect,
     {},
     "where the weights are initialised; the same values either way here (one seeded "
     "generator, on the host)"},
    {"model.megatron_amp_O2",
     Kind::no_effect,
     {},
     "mixed precision here always keeps fp32 main weights (what O2 does)"},
    {"model.apply_query_key_layer_scaling",
     Kind::no_effect,
     {},
     "scales the scores by 1/layer and the softmax input back: the same softmax, only fp16 "
     "rounding differs; scores are computed in fp32 here"},
    {"model.apex_transformer_log_level", Kind::no_effect, {}, "Apex's log level"},
    {"model.onnx_safe", Kind::no_effect, {}, "for NeMo's ONNX export"},
    {"model.gc_interval", Kind::no_effect, {}, "Python's garbage collector; there is none here"},
    {"model.resume_from_checkpoint",
     Kind::changes_model,
     {},
     "NeMo loads that Lightning checkpoint; here resume with exp_manager.resume_if_exists from "
     "<explicit_log_dir>/checkpoints, or convert it with checkpoint_util"},
    {"model.pre_process",
     Kind::changes_model,
     {"true"},
     "the embedding is always built (NeMo's false is for its own pipeline stages)"},
    {"model.post_process",
     Kind::changes_model,
     {"true"},
     "the output layer is always built (NeMo's false is for its own pipeline stages)"},
    {"model.nsys_profile.enabled",
     Kind::effect_in_nemo,
     {"false"},
     "no Nsight Systems ranges are opened; run the job under nsys yourself"},
    {"model.nsys_profile.*", Kind::no_effect, {}, "read only with nsys_profile.enabled"},

    // model: precision settings.
    {"model.fp8",
     Kind::effect_in_nemo,
     {"false"},
     "FP8 (Transformer Engine) is not built: training runs in trainer.precision (bf16/fp16)"},
    {"model.fp8_e4m3", Kind::no_effect, {}, "read only with fp8"},
    {"model.fp8_hybrid", Kind::no_effect, {}, "read only with fp8"},
    {"model.fp8_margin", Kind::no_effect, {}, "read only with fp8"},
    {"model.fp8_interval", Kind::no_effect, {}, "read only with fp8"},
    {"model.fp8_amax_history_len", Kind::no_effect, {}, "read only with fp8"},
    {"model.fp8_amax_compute_algo", Kind::no_effect, {}, "read only with fp8"},
    {"model.fp8_wgrad", Kind::no_effect, {}, "read only with fp8"},
    {"model.fp16_lm_cross_entropy",
     Kind::changes_model,
     {"false"},
     "the cross-entropy is computed in fp32 here"},
    {"model.fp32_residual_connection",
     Kind::changes_model,
     {"false"},
     "the residual stream is kept in the training precision, as Megatron's default"},

    // model: communication overlap of NeMo's that is not built here.
    {"model.ub_tp_comm_overlap",
     Kind::effect_in_nemo,
     {"false"},
     "Transformer Engine's userbuffer overlap of tensor-parallel communication; not built, the "
     "collectives run after the GEMMs"},
    {"model.ub_tp_comm_overlap_cfg", Kind::no_effect, {}, "read only with ub_tp_comm_overlap"},
    {"model.optim.contiguous_grad_buffer",
     Kind::no_effect,
     {},
     "gradients are always in one contiguous buffer here"},

    // model: architecture, where only NeMo's default is the model built here.
    {"model.kv_channels",
     Kind::changes_model,
     {},
     "the head size is hidden_size / num_attention_heads (null); another value is not built"},
    {"model.attention_type",
     Kind::changes_model,
     {"multihead"},
     "causal multi-head self-attention is the only kind"},
    {"model.transformer_block_type",
     Kind::changes_model,
     {"pre_ln"},
     "the only block is pre-LayerNorm, as in GPT-2/3 and Llama"},
    {"model.headscale", Kind::changes_model, {"false"}, "NormFormer's head scaling is not built"},
    {"model.normalize_attention_scores",
     Kind::changes_model,
     {"true"},
     "scores are always scaled by 1/sqrt(head size)"},
    {"model.openai_gelu",
     Kind::no_effect,
     {},
     "the GELU here is always the tanh approximation, the one openai_gelu selects and the one "
     "NeMo's fused bias-GELU computes by default"},
    {"model.use_scaled_init_method",
     Kind::changes_model,
     {"true"},
     "output projections are always initialised with std / sqrt(2 × num_layers), as Megatron"},
    {"model.ffn_dropout",
     Kind::changes_model,
     {"0"},
     "there is no dropout inside the MLP (Megatron has none either)"},
    {"model.do_layer_norm_weight_decay",
     Kind::changes_model,
     {"false"},
     "norm weights and biases are never weight-decayed (Megatron's rule)"},
    {"model.activations_checkpoint_layers_per_pipeline",
     Kind::effect_in_nemo,
     {"0"},
     "partial recompute per pipeline stage is not built; use "
     "activations_checkpoint_num_layers"},
    {"model.num_micro_batches_with_partial_activation_checkpoints",
     Kind::effect_in_nemo,
     {"0"},
     "partial recompute of some micro batches is not built"},

    // model.data: NeMo's data loader.
    {"model.data.dataloader_type",
     Kind::changes_model,
     {"single"},
     "Megatron's single-pass sampler is the only one (cyclic is not built)"},
    {"model.data.num_workers",
     Kind::no_effect,
     {},
     "PyTorch's loader processes; samples are read from the memory-mapped files directly"},
    {"model.data.skip_warmup",
     Kind::no_effect,
     {},
     "Megatron's old mmap warm-up read; the files are memory-mapped without it"},
    {"model.data.reset_attention_mask",
     Kind::changes_model,
     {"false"},
     "attention crosses document boundaries inside a sequence (Megatron's "
     "--reset-attention-mask is not built)"},
    {"model.data.reset_position_ids",
     Kind::changes_model,
     {"false"},
     "positions run on across documents (Megatron's --reset-position-ids is not built)"},

    // model.tokenizer
    {"model.tokenizer.delimiter",
     Kind::changes_model,
     {},
     "only NeMo's word and character tokenizers read it"},
    {"model.tokenizer.sentencepiece_legacy",
     Kind::changes_model,
     {"false"},
     "SentencePiece models are read as Megatron reads them (NeMo's legacy mode adds special "
     "tokens)"},
};

bool covers(const std::string& rule_key, const std::string& key) {
  if (rule_key.size() > 2 && rule_key.ends_with(".*")) {
    const std::string prefix = rule_key.substr(0, rule_key.size() - 1);  // keeps the dot
    return key.starts_with(prefix);
  }
  return rule_key == key;
}

// "model.optim.betas.0" → "model.optim.betas": lists are one value.
std::string without_list_index(std::string key) {
  while (true) {
    const auto dot = key.rfind('.');
    if (dot == std::string::npos) return key;
    const std::string last = key.substr(dot + 1);
    if (last.empty() || !std::all_of(last.begin(), last.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return key;
    }
    key.erase(dot);
  }
}

bool is_neutral(const Node& value, const std::vector<std::string>& neutral) {
  if (value.is_null()) return true;
  if (value.is_list() || value.is_map()) return false;
  const std::string text = scalar_text(value, "");
  for (const std::string& candidate : neutral) {
    if (text == candidate) return true;
    if (value.kind() == NodeKind::Int || value.kind() == NodeKind::Float) {
      double left = 0, right = 0;
      const auto parse = [](const std::string& s, double& out) {
        const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), out);
        return error == std::errc() && end == s.data() + s.size();
      };
      if (parse(text, left) && parse(candidate, right) && left == right) return true;
    }
  }
  return false;
}

std::string shown(const Node& value) {
  if (value.is_list() || value.is_map()) return value.is_list() ? "a list" : "a map";
  return fmt::format("'{}'", scalar_text(value, ""));
}

// Leaves of `node` with their dotted keys; lists are leaves.
void collect_leaves(const Node& node, const std::string& prefix,
                    std::vector<std::pair<std::string, const Node*>>& leaves) {
  if (node.is_map() && node.size() > 0) {
    for (const MapEntry& entry : node.entries()) {
      collect_leaves(entry.value, prefix.empty() ? entry.key : fmt::format("{}.{}", prefix, entry.key),
                     leaves);
    }
    return;
  }
  leaves.emplace_back(prefix, &node);
}

}  // namespace

const std::vector<TrainingKeyRule>& training_key_rules() { return kRules; }

std::vector<std::string> mapped_training_keys() {
  std::set<std::string> keys;
  for (const TrainingFlagMapping& row : training_flag_table()) {
    std::string_view rest = row.config_key;
    while (!rest.empty()) {
      const auto comma = rest.find(", ");
      keys.insert(without_list_index(std::string(rest.substr(0, comma))));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 2);
    }
  }
  return {keys.begin(), keys.end()};
}

bool training_key_accounted_for(const std::string& key) {
  const std::vector<std::string> mapped = mapped_training_keys();
  return std::binary_search(mapped.begin(), mapped.end(), key) ||
         std::any_of(kRules.begin(), kRules.end(), [&](const TrainingKeyRule& r) { return covers(r.key, key); });
}

TrainingKeyReport account_training_keys(const Node& config) {
  TrainingKeyReport report;
  const Node* training = find(config, "training");
  if (training == nullptr || !training->is_map()) return report;
  bool strict = false;
  if (const Node* setting = find(config, "strict_keys"); setting != nullptr && !setting->is_null()) {
    strict = setting->as_bool("strict_keys");
  }
  const std::vector<std::string> mapped = mapped_training_keys();
  std::vector<std::string> known = mapped;
  for (const TrainingKeyRule& rule : kRules) {
    if (!rule.key.ends_with(".*")) known.push_back(rule.key);
  }
  const std::string strict_hint =
      strict ? " (an error because strict_keys is true; strict_keys=false makes it a warning)"
             : " (strict_keys=true makes this an error)";

  std::vector<std::pair<std::string, const Node*>> leaves;
  collect_leaves(*training, "", leaves);
  for (const auto& leaf : leaves) {
    const std::string& key = leaf.first;  // named, not a structured binding: lambdas capture it
    const Node* value = leaf.second;
    const std::string where = value->location().describe();
    if (std::binary_search(mapped.begin(), mapped.end(), key)) continue;
    const auto rule = std::find_if(kRules.begin(), kRules.end(),
                                   [&](const TrainingKeyRule& r) { return covers(r.key, key); });
    if (rule == kRules.end()) {
      if (value->is_map()) continue;  // an empty section: nothing set
      std::string message = fmt::format(
          "training.{} is not a key this launcher knows: it would have no effect (set in {}){}. "
          "docs/launcher.md lists the keys that map to pretrain_gpt flags and those with no "
          "effect here.{}",
          key, where, strict_hint, common::did_you_mean(key, known));
      (strict ? report.errors : report.warnings).push_back(std::move(message));
      continue;
    }
    switch (rule->kind) {
      case Kind::launcher:
      case Kind::no_effect:
        break;
      case Kind::effect_in_nemo:
        if (!is_neutral(*value, rule->neutral)) {
          std::string message = fmt::format(
              "training.{} is {} (set in {}): it has an effect in NeMo but none here: {}{}", key,
              shown(*value), where, rule->reason, strict_hint);
          (strict ? report.errors : report.warnings).push_back(std::move(message));
        }
        break;
      case Kind::changes_model:
        if (!is_neutral(*value, rule->neutral)) {
          report.errors.push_back(fmt::format(
              "training.{} is {} (set in {}): not built here, and training without it would "
              "give a different model: {}. Valid: {}",
              key, shown(*value), where, rule->reason,
              rule->neutral.empty() ? std::string("null")
                                    : fmt::format("{} or null", fmt::join(rule->neutral, ", "))));
        }
        break;
    }
  }
  // NeMo's configs interpolate data.seq_length from encoder_seq_length; Megatron has one length.
  const Node* data_length = find_set(*training, "model.data.seq_length");
  const Node* model_length = find_set(*training, "model.encoder_seq_length");
  if (data_length != nullptr && model_length != nullptr &&
      scalar_text(*data_length, "training.model.data.seq_length") !=
          scalar_text(*model_length, "training.model.encoder_seq_length")) {
    report.errors.push_back(fmt::format(
        "training.model.data.seq_length ({}, set in {}) differs from "
        "training.model.encoder_seq_length ({}): Megatron trains with one --seq-length for the "
        "model and the data; set them equal (NeMo's configs interpolate one from the other)",
        scalar_text(*data_length, ""), data_length->location().describe(),
        scalar_text(*model_length, "")));
  }
  return report;
}

void check_training_family(const std::optional<std::string>& choice) {
  if (!choice) return;
  const std::string& option = *choice;
  if (option.find("ub-confs/") != std::string::npos) {
    common::fail("training={}: this file holds Transformer Engine userbuffer settings for "
                 "model.ub_tp_comm_overlap, not a training config (choose e.g. training=gpt3/5b)",
                 option);
  }
  const std::string family = option.substr(0, option.find('/'));
  static const std::vector<std::pair<std::string, std::string>> families = {
      {"t5", "T5, an encoder-decoder model"},
      {"mt5", "mT5, a multilingual encoder-decoder model"},
      {"bert", "BERT, an encoder-only model"},
      {"retro", "RETRO, a retrieval-augmented model"},
  };
  for (const auto& [name, what] : families) {
    if (family != name) continue;
    common::fail("training={}: the model family '{}' is {}; this backend trains GPT-style "
                 "decoder models only (NeMo's gpt3/* and llama/* configs, or your own of that "
                 "kind)",
                 option, name, what);
  }
}

}  // namespace launcher
