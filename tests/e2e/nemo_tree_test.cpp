// The "Drop-in for NeMo users" issue's end-to-end check: `launcher main --config-dir <NeMo's own
// launcher_scripts/conf>` (tests/data/nemo_23.07 and nemo_23.08.02, as NeMo publishes them)
// trains gpt3/126m and llama/llama2_7b on this machine with size overrides: NeMo's own keys
// reach pretrain_gpt (max_time, the SentencePiece library, the tokenizer files under data_dir),
// and the keys with an effect in NeMo but none here are named in warnings, not dropped.
// Mock data stands in for the Pile shards NeMo's data_prefix names (data_preparation makes
// those; tests/e2e/data_preparation_test.cpp runs that stage on NeMo's tree).
#include <doctest/doctest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "launcher/process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using test_support::read_file;
using test_support::TemporaryDirectory;

namespace fs = std::filesystem;

namespace {

using test_support::kSourceDir;

// A NeMo tree launched as its users do: their conf dir, their paths, stages=[training].
launcher::CapturedRun launch_nemo_tree(const fs::path& root, const std::string& tree,
                                       const std::string& training,
                                       std::vector<std::string> sizes) {
  std::vector<std::string> argv = {
      std::string(TEST_BIN_DIR) + "/launcher", "main", "--config-dir",
      (kSourceDir / "tests/data" / tree / "conf").string(), "stages=[training]",
      "cluster_type=interactive", "training=" + training,
      "launcher_scripts_path=" + (root / "launcher_scripts").string(),
      "data_dir=" + (root / "data").string(), "base_results_dir=" + (root / "results").string(),
      // Size overrides: one CPU process, a model and run small enough for a test.
      "training.trainer.num_nodes=1", "training.trainer.devices=1", "training.trainer.max_steps=3",
      "training.trainer.val_check_interval=3", "training.trainer.limit_val_batches=1",
      "training.trainer.log_every_n_steps=1",
      "training.model.micro_batch_size=2", "training.model.global_batch_size=4",
      "training.model.tensor_model_parallel_size=1", "training.model.pipeline_model_parallel_size=1",
      "training.model.num_layers=2", "training.model.hidden_size=64",
      "training.model.num_attention_heads=4", "training.model.encoder_seq_length=32",
      "training.model.max_position_embeddings=32", "training.model.data.seq_length=32",
      "training.model.data.data_impl=mock"};
  argv.insert(argv.end(), sizes.begin(), sizes.end());
  fs::create_directories(root / "launcher_scripts");
  return launcher::run_and_capture(argv);
}

int iteration_lines(const std::string& text) {
  static const std::regex line(R"( iteration +\d+/ +3 \| consumed samples: +\d+ \|)");
  return static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), line),
                                        std::sregex_iterator()));
}

}  // namespace

TEST_CASE("NeMo 23.07's own conf tree trains gpt3/126m with size overrides") {
  TemporaryDirectory temporary;
  // NeMo's 126m reads GPT-2's files from ${data_dir}/bpe, where its data preparation puts them.
  fs::create_directories(temporary.path / "data" / "bpe");
  fs::copy_file(kSourceDir / "tests/data/gpt2-vocab.json", temporary.path / "data/bpe/vocab.json");
  fs::copy_file(kSourceDir / "tests/data/gpt2-merges.txt", temporary.path / "data/bpe/merges.txt");
  const auto run = launch_nemo_tree(temporary.path, "nemo_23.07", "gpt3/126m", {});
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(iteration_lines(run.output) == 3);
  // NeMo 23.07's 126m sets transformer_engine: True; no other key is away from what it does here.
  CHECK(run.output.find("training.model.transformer_engine is 'true'") != std::string::npos);
  CHECK(run.output.find("is not a key this launcher knows") == std::string::npos);
  const fs::path results = temporary.path / "results" / "gpt3_126m";
  const std::string script = read_file(results / "nemo-megatron-gpt3_126m_submission.sh");
  for (const std::string& flag : std::vector<std::string>{
           "--tokenizer-type GPT2BPETokenizer",
           "--vocab-file " + (temporary.path / "data/bpe/vocab.json").string(),
           "--exit-duration-in-mins 1410",  // trainer.max_time 00:23:30:00
           "--recompute-granularity selective", "--bf16", "--num-layers 2"}) {
    CAPTURE(flag);
    CHECK(script.find(flag) != std::string::npos);
  }
  CHECK(script.find("--recompute-method") == std::string::npos);  // NeMo ignores it under selective
}

TEST_CASE("NeMo 23.08.02's own conf tree trains llama/llama2_7b with its SentencePiece settings") {
  TemporaryDirectory temporary;
  // NeMo's llama2_7b reads ${data_dir}/llama/llama_tokenizer.model: the test's small model.
  fs::create_directories(temporary.path / "data" / "llama");
  fs::copy_file(kSourceDir / "tests/data/sentencepiece_bpe.model",
                temporary.path / "data/llama/llama_tokenizer.model");
  const auto run = launch_nemo_tree(temporary.path, "nemo_23.08.02", "llama/llama2_7b",
                                    {"training.model.ffn_hidden_size=128"});
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(iteration_lines(run.output) == 3);
  // Set by NeMo's llama2_7b with an effect in NeMo only: each named, none dropped silently.
  for (const char* key : {"training.model.transformer_engine", "training.exp_manager.create_wandb_logger"}) {
    CAPTURE(key);
    CHECK(run.output.find(std::string(key) + " is 'true'") != std::string::npos);
  }
  CHECK(run.output.find("is not a key this launcher knows") == std::string::npos);
  const fs::path results = temporary.path / "results" / "llama2_7b";
  const std::string script = read_file(results / "nemo-megatron-llama2_7b_submission.sh");
  for (const std::string& flag : std::vector<std::string>{
       std::string("--tokenizer-type GPTSentencePieceTokenizer"),
        "--tokenizer-model " + (temporary.path / "data/llama/llama_tokenizer.model").string(),
        std::string("--exit-duration-in-mins 8610"),  // 05:23:30:00
        std::string("--normalization RMSNorm"), std::string("--swiglu"),
        std::string("--position-embedding-type rope"), std::string("--untie-embeddings-and-output-weights"),
        std::string("--use-distributed-optimizer"), std::string("--overlap-grad-reduce")}) {
    CAPTURE(flag);
    CHECK(script.find(flag) != std::string::npos);
  }
}
