// Every key of a training config accounted for (NeMo-Megatron-Launcher's schema, the keys of
// its conf/training/{gpt3,llama}/*.yaml in 23.07 and 23.08): a key either
//   - reaches a pretrain_gpt flag (training_flag_table) or is read by the launcher itself,
//   - is NeMo's and has no meaning for this backend (any value; the reason is in the table),
//   - has an effect in NeMo that this backend does not reproduce: silent at NeMo's neutral
//     value (e.g. transformer_engine: false), a warning at any other value, an error when the
//     config sets strict_keys: true (our conf/config.yaml does; NeMo's config.yaml has no such
//     key, so a NeMo tree gets warnings, not failures),
//   - would change the model trained (kv_channels, openai_gelu, ...): an error unless at its
//     neutral value, whatever strict_keys says,
// and a key in none of these (a typo, `+training.model.x=...`) is a warning, an error under
// strict_keys. The table is listed in docs/launcher.md ("Keys with no effect here");
// tests/launcher/stages/training_keys_test.cpp fails when a key of NeMo's files is in neither.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/config/node.hpp"

namespace launcher {

enum class TrainingKeyKind {
  launcher,        // read by the launcher (nodes, run names, data paths), not a flag
  no_effect,       // NeMo's; no meaning here, any value
  effect_in_nemo,  // NeMo does something this backend does not: warning unless neutral
  changes_model,   // the model trained would differ: error unless neutral
};

struct TrainingKeyRule {
  std::string key;  // relative to `training.`; "a.b.*" covers everything below a.b
  TrainingKeyKind kind;
  std::vector<std::string> neutral;  // values that behave as here ("null" included implicitly)
  std::string reason;
};

// The keys not in training_flag_table: launcher, no-effect, effect-in-NeMo and model-changing.
const std::vector<TrainingKeyRule>& training_key_rules();

// Every key training_flag_table names (derived rows split on ", "; list indices dropped).
std::vector<std::string> mapped_training_keys();

// Whether `key` (relative to `training.`, list indices dropped) maps to a flag or is covered
// by a rule: what account_training_keys does not call unknown.
bool training_key_accounted_for(const std::string& key);

struct TrainingKeyReport {
  std::vector<std::string> warnings;
  std::vector<std::string> errors;
};

// Walks `training` of a resolved config; strict_keys (top level, default false) turns
// warnings into errors. Each message names the key, its value and where it was set.
TrainingKeyReport account_training_keys(const Node& config);

// NeMo's encoder-decoder and encoder-only families (t5, mt5, bert, ...) are not GPT models:
// `training=t5/220m` is refused naming the family. `choice` is hydra:runtime.choices.training.
void check_training_family(const std::optional<std::string>& choice);

}  // namespace launcher
