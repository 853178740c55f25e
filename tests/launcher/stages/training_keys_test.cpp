// Every key of a training config accounted for (launcher/stages/training_keys.hpp): NeMo's own
// training configs (tests/data/nemo_23.07, nemo_23.08.02, as NeMo publishes them) have no key
// outside the flag table and the rules, compose, pass the preflight and render; other model
// families are refused by name; the strict and lenient reports; the new mappings.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/launch.hpp"
#include "launcher/process.hpp"
#include "launcher/stages/command_flags.hpp"
#include "launcher/stages/training_keys.hpp"
#include "launcher/stages/training_preflight.hpp"
#include "launcher/stages/training_stage.hpp"
#include "quiet_logger.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using namespace launcher;
namespace fs = std::filesystem;

namespace {

using test_support::flag_value;
using test_support::has;

const fs::path kSource = TEST_SOURCE_DIR;

struct Composed {
  Node config;
  std::optional<std::string> training_choice;
};

Composed composed(const fs::path& conf_dir, std::vector<std::string> overrides) {
  overrides.push_back("launcher_scripts_path=/opt/launcher");
  ComposedConfig result = compose({conf_dir, "config", overrides});
  const auto choice = result.choices.find("training");
  return {resolve(result.config, ResolveContext{result.choices}),
          choice == result.choices.end() ? std::nullopt : choice->second};
}

Node ours(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "training=gpt3/126m");
  return composed(kSource / "conf", std::move(overrides)).config;
}

bool any_contains(const std::vector<std::string>& messages, const std::string& needle) {
  return std::any_of(messages.begin(), messages.end(),
                     [&](const std::string& m) { return m.find(needle) != std::string::npos; });
}

// The training options of a NeMo tree under tests/data: "gpt3/126m", "t5/220m", ...
std::vector<std::string> training_options(const fs::path& conf_dir) {
  std::vector<std::string> options;
  const fs::path root = conf_dir / "training";
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".yaml") continue;
    std::string option = fs::relative(entry.path(), root).replace_extension().generic_string();
    options.push_back(option);
  }
  std::sort(options.begin(), options.end());
  return options;
}

void collect_keys(const Node& node, const std::string& prefix, std::vector<std::string>& keys) {
  if (node.is_map() && node.size() > 0) {
    for (const MapEntry& entry : node.entries()) {
      collect_keys(entry.value, prefix.empty() ? entry.key : prefix + "." + entry.key, keys);
    }
    return;
  }
  keys.push_back(prefix);
}

}  // namespace

TEST_CASE("every key of NeMo's GPT and Llama training configs is mapped or in the rules, and they render") {
  int checked = 0;
  for (const std::string tree : {"nemo_23.07", "nemo_23.08.02"}) {
    const fs::path conf_dir = kSource / "tests/data" / tree / "conf";
    for (const std::string& option : training_options(conf_dir)) {
      CAPTURE(tree);
      CAPTURE(option);
      const std::string family = option.substr(0, option.find('/'));
      if (option.find("ub-confs/") != std::string::npos) {
        CHECK_THROWS_WITH_AS(check_training_family(option),
                             doctest::Contains("not a training config"), common::Error);
        continue;
      }
      if (family != "gpt3" && family != "llama") {
        // T5, mT5, BERT: refused naming the family, before anything else is read.
        CHECK_THROWS_WITH_AS(check_training_family(option),
                             doctest::Contains(("model family '" + family + "'").c_str()), common::Error);
        continue;
      }
      const Composed config = composed(conf_dir, {"training=" + option, "stages=[training]"});
      CHECK_NOTHROW(check_training_family(config.training_choice));
      std::vector<std::string> keys;
      collect_keys(at_path(config.config, "training"), "", keys);
      for (const std::string& key : keys) {
        CAPTURE(key);
        CHECK(training_key_accounted_for(key));
      }
      // NeMo's values: no key that would change the model, and a config pretrain_gpt takes.
      const TrainingKeyReport report = account_training_keys(config.config);
      CHECK(report.errors.empty());
      const PreflightReport preflight = training_preflight(config.config, "local");
      CHECK(preflight.problems == std::vector<std::string>{});
      CHECK_NOTHROW(megatron_training_arguments(config.config));
      ++checked;
    }
  }
  CHECK(checked >= 25);  // 23.07's and 23.08.02's gpt3 and llama configs
}

TEST_CASE("every training config of NeMo's trees renders its sbatch script, or is refused naming its family") {
  // launcher main --dry-run from NeMo's tree as it is (cluster bcm, NeMo's container): the
  // script is written and bash parses it; T5, mT5, BERT and ub-confs stop before anything is.
  int rendered = 0;
  for (const std::string tree : {"nemo_23.07", "nemo_23.08.02"}) {
    const fs::path conf_dir = kSource / "tests/data" / tree / "conf";
    for (const std::string& option : training_options(conf_dir)) {
      CAPTURE(tree);
      CAPTURE(option);
      test_support::TemporaryDirectory temporary;
      const test_support::QuietLogger quiet;
      MainOptions options;
      options.conf_dir = conf_dir;
      options.overrides = {"stages=[training]", "cluster_type=bcm", "training=" + option,
                           "launcher_scripts_path=" + temporary.path.string(), "data_dir=/data",
                           "base_results_dir=" + (temporary.path / "results").string()};
      options.dry_run = true;
      options.command_line = "launcher main --dry-run";
      std::ostringstream terminal;
      const std::string family = option.substr(0, option.find('/'));
      if ((family != "gpt3" && family != "llama") || option.find("ub-confs/") != std::string::npos) {
        CHECK_THROWS_AS(launch_main(options, terminal), common::Error);
        CHECK_FALSE(fs::exists(temporary.path / "results"));
        continue;
      }
      REQUIRE(launch_main(options, terminal) == 0);
      std::vector<fs::path> scripts;
      for (const auto& entry : fs::recursive_directory_iterator(temporary.path / "results")) {
        if (entry.path().filename().string().ends_with("_submission.sh")) scripts.push_back(entry.path());
      }
      REQUIRE(scripts.size() == 1);
      const std::string script = test_support::read_file(scripts.front());
      CHECK(script.find("#SBATCH --nodes=") != std::string::npos);
      CHECK(script.find("/pretrain_gpt ") != std::string::npos);
      CHECK(script.find("--container-image nvcr.io/") != std::string::npos);
      const CapturedRun syntax = run_and_capture({"bash", "-n", scripts.front().string()});
      CHECK_MESSAGE(syntax.exit_code == 0, syntax.output);
      ++rendered;
    }
  }
  CHECK(rendered >= 25);
}

TEST_CASE("a key with an effect in NeMo and none here: a warning in NeMo's tree, an error under strict_keys") {
  const fs::path nemo = kSource / "tests/data/nemo_23.07/conf";
  const Composed lenient =
      composed(nemo, {"training=gpt3/126m", "training.model.transformer_engine=true"});
  const TrainingKeyReport warned = account_training_keys(lenient.config);
  CHECK(warned.errors.empty());
  REQUIRE(warned.warnings.size() == 1);
  CHECK(warned.warnings[0].find("training.model.transformer_engine is 'true'") != std::string::npos);
  CHECK(warned.warnings[0].find("Transformer Engine") != std::string::npos);
  CHECK(training_preflight(lenient.config, "local").warnings == warned.warnings);

  // Our conf sets strict_keys: true.
  const TrainingKeyReport strict = account_training_keys(ours({"training.model.transformer_engine=true"}));
  REQUIRE(strict.errors.size() == 1);
  CHECK(strict.errors[0].find("strict_keys") != std::string::npos);
  CHECK(strict.warnings.empty());
  CHECK(any_contains(
      training_preflight(ours({"training.model.transformer_engine=true"}), "local").problems,
      "training.model.transformer_engine"));

  // At NeMo's neutral value nothing is said.
  const TrainingKeyReport neutral = account_training_keys(ours({"training.model.transformer_engine=false"}));
  CHECK(neutral.errors.empty());
  CHECK(neutral.warnings.empty());
}

TEST_CASE("an unknown key (+training.model.x) is a warning, an error under strict_keys, never nothing") {
  const TrainingKeyReport strict = account_training_keys(ours({"+training.model.hiden_size=3"}));
  REQUIRE(strict.errors.size() == 1);
  CHECK(strict.errors[0].find("training.model.hiden_size is not a key") != std::string::npos);
  CHECK(strict.errors[0].find("model.hidden_size") != std::string::npos);  // did you mean
  const TrainingKeyReport lenient =
      account_training_keys(ours({"+training.model.hiden_size=3", "strict_keys=false"}));
  CHECK(lenient.errors.empty());
  REQUIRE(lenient.warnings.size() == 1);
  CHECK(lenient.warnings[0].find("training.model.hiden_size") != std::string::npos);
  // Our own conf: nothing unknown, nothing away from neutral.
  const TrainingKeyReport clean = account_training_keys(ours({}));
  CHECK(clean.errors == std::vector<std::string>{});
  CHECK(clean.warnings == std::vector<std::string>{});
}

TEST_CASE("a key that would change the model is an error whatever strict_keys says") {
  for (const std::string setting :
       {"training.model.kv_channels=32", "training.model.headscale=true",
        "training.model.normalize_attention_scores=false",
        "training.model.data.reset_attention_mask=true", "training.model.data.reset_position_ids=true", "training.trainer.accumulate_grad_batches=2",
        "training.model.ffn_dropout=0.1", "training.model.transformer_block_type=post_ln"}) {
    CAPTURE(setting);
    const TrainingKeyReport report = account_training_keys(ours({"++" + setting, "strict_keys=false"}));
    REQUIRE(report.errors.size() == 1);
    const std::string key = setting.substr(0, setting.find('='));
    CHECK(report.errors[0].find(key + " is ") != std::string::npos);
    CHECK(report.errors[0].find("Valid:") != std::string::npos);
  }
  // Neutral values written another way (0.0 for 0) are neutral.
  CHECK(account_training_keys(ours({"++training.model.ffn_dropout=0.0"})).errors.empty());
  CHECK(account_training_keys(ours({"++training.model.data.seq_length=2048"})).errors.empty());
  const TrainingKeyReport length = account_training_keys(ours({"++training.model.data.seq_length=1024"}));
  REQUIRE(length.errors.size() == 1);
  CHECK(length.errors[0].find("differs from training.model.encoder_seq_length") != std::string::npos);
}

TEST_CASE("NeMo's max_time, accelerator, tokenizer library and zero-centred gamma reach their flags") {
  auto arguments = megatron_training_arguments(ours({"training.trainer.max_time=01:02:03:30"}));
  CHECK(flag_value(arguments, "--exit-duration-in-mins") == "1563.5");  // 1 day 2 h 3.5 min
  for (const std::string bad : {"1:02:03", "00:24:00:00", "a", "00:00:00:00", "00:00:-1:00"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(megatron_training_arguments(ours({"training.trainer.max_time='" + bad + "'"})),
                         doctest::Contains("training.trainer.max_time"), common::Error);
  }
  CHECK_FALSE(has(megatron_training_arguments(ours({"training.trainer.max_time=null"})),
                  "--exit-duration-in-mins"));

  CHECK(flag_value(megatron_training_arguments(ours({"training.trainer.accelerator=cpu"})), "--device") == "cpu");
  CHECK_FALSE(has(megatron_training_arguments(ours({"training.trainer.accelerator=gpu"})), "--device"));
  CHECK_THROWS_WITH_AS(megatron_training_arguments(ours({"training.trainer.accelerator=tpu"})),
                       doctest::Contains("training.trainer.accelerator 'tpu'"), common::Error);

  // NeMo's llama configs: library sentencepiece, type null.
  arguments = megatron_training_arguments(
      ours({"++training.model.tokenizer.library=sentencepiece", "training.model.tokenizer.type=null",
            "training.model.tokenizer.vocab_file=null", "training.model.tokenizer.merge_file=null",
            "++training.model.tokenizer.model=/data/tokenizer.model"}));
  CHECK(flag_value(arguments, "--tokenizer-type") == "GPTSentencePieceTokenizer");
  CHECK(flag_value(arguments, "--tokenizer-model") == "/data/tokenizer.model");
  arguments = megatron_training_arguments(
      ours({"++training.model.tokenizer.library=huggingface", "training.model.tokenizer.type=/data/llama3",
            "training.model.tokenizer.vocab_file=null", "training.model.tokenizer.merge_file=null"}));
  CHECK(flag_value(arguments, "--tokenizer-type") == "HuggingFaceTokenizer");
  CHECK(flag_value(arguments, "--tokenizer-model") == "/data/llama3");
  CHECK_THROWS_WITH_AS(megatron_training_arguments(ours({"++training.model.tokenizer.library=yttm"})),
                       doctest::Contains("training.model.tokenizer.library 'yttm'"), common::Error);

  CHECK(has(megatron_training_arguments(ours({"++training.model.layernorm_zero_centered_gamma=true"})),
            "--apply-layernorm-1p"));
  arguments = megatron_training_arguments(ours({"++training.model.normalization=LayerNorm"}));
  CHECK_FALSE(has(arguments, "--apply-layernorm-1p"));
  CHECK_FALSE(has(arguments, "--normalization"));
  CHECK(flag_value(megatron_training_arguments(ours({"++training.model.normalization=RMSNorm"})),
                   "--normalization") == "RMSNorm");

  arguments = megatron_training_arguments(ours({"training.model.optim.name=distributed_fused_adam",
                                                "++training.model.optim.overlap_grad_sync=true",
                                                "++training.model.optim.overlap_param_sync=true"}));
  CHECK(has(arguments, "--overlap-grad-reduce"));
  CHECK(has(arguments, "--overlap-param-gather"));
  CHECK_FALSE(has(arguments, "--grad-reduce-in-bf16"));
  // gpt3/126m's bucket_cap_mb 200 without a sync type: Apex's default, the optimizer's fp32.
  CHECK(flag_value(arguments, "--ddp-bucket-size") == "52428800");
  // Apex's buckets: bucket_cap_mb MiB of gradients in the sync type.
  arguments = megatron_training_arguments(ours({"training.model.optim.name=distributed_fused_adam",
                                                "++training.model.optim.grad_sync_dtype=bf16",
                                                "++training.model.optim.bucket_cap_mb=200"}));
  CHECK(has(arguments, "--grad-reduce-in-bf16"));
  CHECK(flag_value(arguments, "--ddp-bucket-size") == "104857600");
  arguments = megatron_training_arguments(ours({"training.model.optim.name=distributed_fused_adam",
                                                "++training.model.optim.grad_sync_dtype=fp32",
                                                "++training.model.optim.bucket_cap_mb=12.5"}));
  CHECK_FALSE(has(arguments, "--grad-reduce-in-bf16"));
  CHECK(flag_value(arguments, "--ddp-bucket-size") == "3276800");
  // Only with the distributed optimizer, as NeMo reads them.
  arguments = megatron_training_arguments(ours(
      {"training.model.optim.name=fused_adam", "++training.model.optim.grad_sync_dtype=bf16"}));
  CHECK_FALSE(has(arguments, "--grad-reduce-in-bf16"));
  CHECK_FALSE(has(arguments, "--ddp-bucket-size"));
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(ours({"training.model.optim.name=distributed_fused_adam",
                                        "++training.model.optim.grad_sync_dtype=fp16"})),
      doctest::Contains("training.model.optim.grad_sync_dtype 'fp16': reducing the gradients in "
                        "fp16 is not built"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(ours({"training.model.optim.name=distributed_fused_adam",
                                        "++training.model.optim.grad_sync_dtype=int8"})),
      doctest::Contains("grad_sync_dtype 'int8' is not valid (valid: bf16, fp32, or null)"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(ours({"training.model.optim.name=distributed_fused_adam",
                                        "++training.model.optim.bucket_cap_mb=0"})),
      doctest::Contains("training.model.optim.bucket_cap_mb 0 is not valid"), common::Error);
}

TEST_CASE("docs/launcher.md lists every key rule with its reason") {
  std::ifstream file(kSource / "docs/launcher.md");
  REQUIRE(file);
  std::stringstream text;
  text << file.rdbuf();
  for (const TrainingKeyRule& rule : training_key_rules()) {
    CAPTURE(rule.key);
    if (rule.kind == TrainingKeyKind::launcher) {
      CHECK(text.str().find("`" + rule.key + "`") != std::string::npos);
    } else {
      CHECK(text.str().find("| `" + rule.key + "` |") != std::string::npos);
    }
  }
}
