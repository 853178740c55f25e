// The Llama continue-training workflow end to end on tiny sizes, every step a real binary, the
// command sequence of docs/checkpoints.md "Continuing a Hugging Face Llama":
//   a LlamaForCausalLM directory (GQA: 4 heads, 2 key/value heads; RMSNorm, SwiGLU, RoPE,
//   untied output), in two subcases: made by training a Llama-shaped model 2 steps on mock data
//   and `checkpoint_util --export-hf` (so the chain runs without PyTorch), and written by
//   tests/e2e/write_llama_hf.py as transformers' save_pretrained lays one out (vocab_size the
//   tokenizer's, no key of ours)
//   → checkpoint_util --import-hf → preprocess_data of three JSONL shards with the SentencePiece
//   model (tests/data/sentencepiece_bpe.model, Llama2Tokenizer) → preprocess_data --merge of two
//   of them → a weighted --data-file-list → pretrain_gpt --load --finetune --no-load-optim
//   --no-load-rng → checkpoint_util --export-hf.
// Checks: the first iteration's lm loss equals PyTorch's loss of the starting Hugging Face model
// on the same batch, and the exported result's PyTorch loss on the next batch equals the loss
// of the iteration that resumes from the saved checkpoint (tests/e2e/llama_loss_reference.py,
// float64, relative difference < 1e-5). The batches are read through the backend's dataset
// provider from the same flags (the samples the trainer reads, Megatron's order); a wrong batch
// gives another loss. Flags that do not fit the imported checkpoint (--num-query-groups,
// --ffn-hidden-size) get the table of differing tensors and the flags that fit.
// The PyTorch checks need torch in Debian's /usr/bin/python3 (python3-torch); without it they
// are skipped with a message, except when the environment variable CI is set, where that is a
// failure (as tests/backend/ckpt/pytorch_parity_test.cpp).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "backend/train/arguments.hpp"
#include "backend/train/dataset_provider.hpp"
#include "generation_server_process.hpp"
#include "launcher/process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"
#include "tests/reference_tools.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::kTestBin;
using test_support::kPretrainGpt;
using test_support::kCheckpointUtil;
using test_support::kPython;

const std::string kPreprocess = kTestBin + "/preprocess_data";
const std::string kSentencePieceModel = std::string(TEST_SOURCE_DIR) + "/tests/data/sentencepiece_bpe.model";
const std::string kLossReference = std::string(TEST_SOURCE_DIR) + "/tests/e2e/llama_loss_reference.py";
const std::string kHfWriter = std::string(TEST_SOURCE_DIR) + "/tests/e2e/write_llama_hf.py";
constexpr int kGlobalBatch = 4, kSequence = 32;
constexpr double kLossTolerance = 1e-5;

launcher::CapturedRun run(const std::vector<std::string>& argv) {
  auto result = launcher::run_and_capture(argv);
  std::string command;
  for (const auto& word : argv) command += word + " ";
  INFO(command << "\n" << result.output);
  REQUIRE(result.exit_code == 0);
  return result;
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The lm loss of iteration `iteration`'s line, or NaN.
double iteration_loss(const std::string& output, int iteration) {
  std::smatch match;
  const std::regex line(fmt::format(R"(iteration +{}/ +\d+ \|.*lm loss: ([0-9.E+-]+))", iteration));
  if (!std::regex_search(output, match, line)) return std::nan("");
  return std::stod(match[1].str());
}

using test_support::torch_available;

// Samples [first, first + kGlobalBatch) of the training split the flags describe, read as the
// trainer reads them, written as llama_loss_reference.py's batch.json.
void write_batch(const std::vector<std::string>& training_argv, int64_t padded_vocabulary,
                 int64_t first, const fs::path& path) {
  std::vector<const char*> argv;
  for (const auto& word : training_argv) argv.push_back(word.c_str());
  const auto arguments = backend::parse_arguments(static_cast<int>(argv.size()), argv.data());
  REQUIRE(arguments.has_value());
  std::ostringstream ignored;
  const auto source = backend::build_dataset_batch_source(*arguments, padded_vocabulary, ignored);
  std::vector<int32_t> tokens(kGlobalBatch * kSequence), labels(kGlobalBatch * kSequence);
  source(backend::Split::train, first, kGlobalBatch, tokens, labels);
  nlohmann::json batch = {{"tokens", nlohmann::json::array()}, {"labels", nlohmann::json::array()}};
  for (int row = 0; row < kGlobalBatch; ++row) {
    batch["tokens"].push_back(std::vector<int32_t>(tokens.begin() + row * kSequence,
                                                   tokens.begin() + (row + 1) * kSequence));
    batch["labels"].push_back(std::vector<int32_t>(labels.begin() + row * kSequence,
                                                   labels.begin() + (row + 1) * kSequence));
  }
  std::ofstream(path) << batch.dump();
}

double torch_loss(const fs::path& hf, const fs::path& batch) {
  const auto result = launcher::run_and_capture({kPython, kLossReference, hf.string(), batch.string()});
  INFO("llama_loss_reference.py output:\n" << result.output);
  REQUIRE(result.exit_code == 0);
  std::smatch match;
  REQUIRE(std::regex_search(result.output, match, std::regex(R"(loss ([0-9.eE+-]+))")));
  return std::stod(match[1].str());
}

// Three small JSONL shards of plain sentences (a document per line).
void write_shards(const fs::path& directory) {
  const std::vector<std::string> words = {
      "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven",
      "small", "llamas", "graze", "on", "the", "green", "hill", "and", "sing", "about", "data"};
  for (int shard = 0; shard < 3; ++shard) {
    std::ofstream out(directory / fmt::format("shard{}.jsonl", shard));
    for (int line = 0; line < 40; ++line) {
      std::string text;
      const int count = 8 + (line * 7 + shard * 3) % 20;
      for (int word = 0; word < count; ++word) {
        if (word > 0) text += ' ';
        text += words[(line * 3 + word * 5 + shard) % words.size()];
      }
      out << nlohmann::json({{"text", text}}).dump() << '\n';
    }
  }
}

}  // namespace

TEST_CASE("llama continue training: HF Llama → import → tokenize → merge → blend → finetune → export") {
  test_support::TemporaryDirectory temporary;
  const fs::path root = temporary.path;
  const bool torch = torch_available();
  const std::vector<std::string> tokenizer = {"--tokenizer-type", "Llama2Tokenizer",
                                              "--tokenizer-model", kSentencePieceModel};

  // 0. The starting LlamaForCausalLM directory: exported by checkpoint_util from a Llama-shaped
  // model trained 2 steps on mock data, or written by PyTorch as transformers lays one out
  // (vocab_size the tokenizer's 500, no key of ours, so the import pads by 4, not 128).
  const fs::path hf_start = root / "hf_start";
  int64_t padded_vocabulary = 0;
  const std::vector<std::string> llama = {
      "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
      "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
      "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
      "--disable-bias-linear", "--untie-embeddings-and-output-weights",
      "--max-position-embeddings", "64", "--make-vocab-size-divisible-by", "128"};
  const std::vector<std::string> schedule = {
      "--seq-length", std::to_string(kSequence), "--micro-batch-size", "2",
      "--global-batch-size", std::to_string(kGlobalBatch), "--lr", "1e-3",
      "--lr-decay-style", "constant", "--attention-dropout", "0", "--hidden-dropout", "0",
      "--eval-iters", "0", "--log-interval", "1"};
  SUBCASE("starting from a directory checkpoint_util --export-hf wrote") {
    run(concat(concat(concat({kPretrainGpt, "--train-iters", "2", "--mock-data", "--seed", "7",
                              "--save", (root / "base").string()}, llama), tokenizer), schedule));
    run({kCheckpointUtil, "--load", (root / "base").string(), "--export-hf", hf_start.string()});
    padded_vocabulary = 512;
  }
  SUBCASE("starting from a directory PyTorch wrote as transformers does") {
    if (!torch) return;
    run({kPython, kHfWriter, hf_start.string(), "500", "3"});
    padded_vocabulary = 500;
  }
  REQUIRE(padded_vocabulary > 0);
  const auto config = nlohmann::json::parse(std::ifstream(hf_start / "config.json"));
  CHECK(config["architectures"][0] == "LlamaForCausalLM");
  CHECK(config["num_key_value_heads"] == 2);
  CHECK(config["tie_word_embeddings"] == false);

  // 1. checkpoint_util --import-hf: a release checkpoint, and the model's flags printed.
  const fs::path imported = root / "imported";
  const auto import = run({kCheckpointUtil, "--import-hf", hf_start.string(), "--save", imported.string()});
  std::smatch printed;
  REQUIRE(std::regex_search(import.output, printed, std::regex(R"(pretrain_gpt (.*) --load)")));
  const std::string model_flags = printed[1].str();
  CHECK(model_flags.find("--group-query-attention --num-query-groups 2") != std::string::npos);
  CHECK(model_flags.find("--ffn-hidden-size 128") != std::string::npos);
  CHECK(model_flags.find("--swiglu") != std::string::npos);
  // The printed flags, with the SentencePiece tokenizer in place of the NullTokenizer the
  // import names (a Hugging Face directory's weights do not say which tokenizer made them).
  std::vector<std::string> model;
  {
    std::istringstream words(model_flags);
    std::vector<std::string> all;
    for (std::string word; words >> word;) all.push_back(word);
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i] == "--tokenizer-type" || all[i] == "--vocab-size") {
        ++i;
        continue;
      }
      model.push_back(all[i]);
    }
    model = concat(model, tokenizer);
  }

  // 2. Tokenize three shards; merge two; a weighted list of the merged dataset and the third.
  write_shards(root);
  fs::create_directories(root / "shards");
  for (int shard = 0; shard < 2; ++shard) {
    run(concat({kPreprocess, "--input", (root / fmt::format("shard{}.jsonl", shard)).string(),
                "--output-prefix", (root / fmt::format("shards/part{}", shard)).string(),
                "--append-eod", "--workers", "1"}, tokenizer));
  }
  run(concat({kPreprocess, "--input", (root / "shard2.jsonl").string(), "--output-prefix",
              (root / "other").string(), "--append-eod", "--workers", "1"}, tokenizer));
  const auto merged = run({kPreprocess, "--merge", "--input", (root / "shards").string(),
                           "--output-prefix", (root / "merged").string()});
  CHECK(merged.output.find("Merged 2 datasets: 80 documents") != std::string::npos);
  const fs::path data_files = root / "data_files.txt";
  std::ofstream(data_files) << "# weight prefix\n0.7 " << (root / "merged").string() << "\n0.3 "
                            << (root / "other_text_document").string() << "\n";

  // 3. Continue training from the imported weights.
  const std::vector<std::string> data = {"--data-file-list", data_files.string(), "--split",
                                         "100,0,0", "--data-cache-path", (root / "cache").string(),
                                         "--seed", "11"};
  const std::vector<std::string> continued_flags = concat(concat(model, schedule), data);
  const fs::path continued = root / "continued";
  const auto finetune = run(concat(concat({kPretrainGpt, "--train-iters", "3"}, continued_flags),
                                   {"--load", imported.string(), "--finetune", "--no-load-optim",
                                    "--no-load-rng", "--save", continued.string()}));
  const double first_loss = iteration_loss(finetune.output, 1);
  REQUIRE(std::isfinite(first_loss));
  CHECK(std::isfinite(iteration_loss(finetune.output, 3)));

  // 3b. The same continuation through the launcher (conf/training/llama/llama2_7b with the
  // tiny sizes and ++training.model.restore_from_path): run on the local cluster, its first
  // iteration equal to the direct run's; rendered for Slurm and PBS with the same command.
  {
    const fs::path results = root / "results";
    const std::vector<std::string> launch = {
        kTestBin + "/launcher", "main", "stages=[training]", "training=llama/llama2_7b",
        "base_results_dir=" + results.string(), "data_dir=" + (root / "data").string(),
        "backend_bin_dir=" + kTestBin, "training.run.name=continued",
        "training.trainer.num_nodes=1", "training.trainer.devices=1",
        "training.trainer.precision=32", "training.trainer.max_steps=3",
        "training.trainer.val_check_interval=3", "training.trainer.limit_val_batches=0",
        "training.trainer.log_every_n_steps=1", "training.model.micro_batch_size=2",
        "training.model.global_batch_size=4", "training.model.num_layers=2",
        "training.model.hidden_size=64", "training.model.ffn_hidden_size=128",
        "training.model.num_attention_heads=4", "training.model.num_query_groups=2",
        "training.model.encoder_seq_length=" + std::to_string(kSequence),
        "training.model.max_position_embeddings=64", "training.model.seed=11",
        // The padding the imported checkpoint has (the import prints it with its flags).
        fmt::format("training.model.make_vocab_size_divisible_by={}",
                    padded_vocabulary == 500 ? 4 : 128),
        "training.model.optim.lr=1e-3", "training.model.optim.sched.name=Constant",
        "training.model.tokenizer.model=" + kSentencePieceModel,
        "training.model.data.data_impl=mmap", "training.model.data.splits_string='100,0,0'",
        "training.model.data.index_mapping_dir=" + (root / "cache").string(),
        "training.model.data.data_prefix=[0.7," + (root / "merged").string() + ",0.3," +
            (root / "other_text_document").string() + "]",
        "++training.model.restore_from_path=" + imported.string()};
    const auto local = run(concat(launch, {"cluster_type=local"}));
    const fs::path script_path = results / "continued" / "continued_submission.sh";
    REQUIRE(fs::is_regular_file(script_path));
    const std::string script = test_support::read_file(script_path);
    CHECK(script.find("--pretrained-checkpoint " + imported.string()) != std::string::npos);
    const std::string log = local.output;
    CHECK(log.find(" loading release checkpoint from " + imported.string()) != std::string::npos);
    const double launched_first = iteration_loss(log, 1);
    MESSAGE(fmt::format("first iteration: direct {:.9g}, launcher {:.9g}", first_loss, launched_first));
    CHECK(std::abs(launched_first - first_loss) <= 1e-6 * std::abs(first_loss));
    for (const char* cluster : {"bcm", "pbs"}) {
      CAPTURE(cluster);
      const fs::path rendered = root / (std::string("rendered_") + cluster);
      run(concat(launch, {"--dry-run", std::string("cluster_type=") + cluster,
                          std::string("cluster=") + cluster,
                          "base_results_dir=" + rendered.string()}));
      std::string text;
      for (const auto& entry : fs::recursive_directory_iterator(rendered)) {
        if (entry.path().extension() == ".sh") text += test_support::read_file(entry.path());
      }
      CHECK(text.find("--pretrained-checkpoint " + imported.string()) != std::string::npos);
      CHECK(text.find("--data-path 0.7 " + (root / "merged").string()) != std::string::npos);
    }
  }

  // 4. Export the result; resume one more iteration from the saved checkpoint.
  const fs::path hf_out = root / "hf_out";
  run({kCheckpointUtil, "--load", continued.string(), "--export-hf", hf_out.string()});
  CHECK(fs::is_regular_file(hf_out / "model.safetensors"));
  // 4b. Served: the export, imported back as a checkpoint_util user does, answers a greedy
  // request with the same text as the trained checkpoint itself (and with the Llama
  // tokenizer's pieces).
  {
    const fs::path served = root / "served";
    run({kCheckpointUtil, "--import-hf", hf_out.string(), "--save", served.string()});
    const std::string request =
        R"({"prompts": ["the quick brown fox"], "tokens_to_generate": 6, "top_k": 1})";
    std::vector<std::string> texts;
    for (const fs::path& load : {served, continued}) {
      test_support::GenerationServerProcess server(
          concat(concat({kTestBin + "/text_generation_server"}, model),
                 {"--load", load.string(), "--seq-length", std::to_string(kSequence),
                  "--device", "cpu"}),
          root / ("server_" + load.filename().string() + ".log"));
      const auto response = server.put(request);
      REQUIRE(response);
      INFO(response->body);
      REQUIRE(response->status == 200);
      const auto body = nlohmann::json::parse(response->body);
      REQUIRE(body["segments"][0].size() > 6);  // the prompt's pieces and six more
      texts.push_back(body["text"][0].get<std::string>());
      double seconds = 0;
      CHECK(server.terminate(seconds) == 0);
    }
    CHECK(texts[0].starts_with("the quick brown fox"));
    CHECK(texts[0] == texts[1]);
  }

  const auto resumed = run(concat(concat({kPretrainGpt, "--train-iters", "4"}, continued_flags),
                                  {"--load", continued.string(),
                                   "--use-checkpoint-opt_param-scheduler"}));
  const double resumed_loss = iteration_loss(resumed.output, 4);
  REQUIRE(std::isfinite(resumed_loss));

  // 5. PyTorch: the starting model on the first batch, the exported one on the fourth.
  if (torch) {
    // Each batch from the flags of the run that trained on it (the train-iters decide the
    // samples each dataset of the blend is built for).
    write_batch(concat({"pretrain_gpt", "--train-iters", "3"}, continued_flags), padded_vocabulary,
                0, root / "batch1.json");
    write_batch(concat({"pretrain_gpt", "--train-iters", "4"}, continued_flags), padded_vocabulary,
                3 * kGlobalBatch, root / "batch4.json");
    const double torch_first = torch_loss(hf_start, root / "batch1.json");
    MESSAGE(fmt::format("first iteration: ours {:.9g}, torch {:.9g}", first_loss, torch_first));
    CHECK(std::abs(first_loss - torch_first) <= kLossTolerance * std::abs(torch_first));
    const double torch_exported = torch_loss(hf_out, root / "batch4.json");
    MESSAGE(fmt::format("iteration 4: ours {:.9g}, torch {:.9g}", resumed_loss, torch_exported));
    CHECK(std::abs(resumed_loss - torch_exported) <= kLossTolerance * std::abs(torch_exported));
    // Not the same number by accident: the batches differ, and the weights moved.
    CHECK(std::abs(torch_loss(hf_start, root / "batch4.json") - torch_exported) > 1e-4);
  }

  // 6. Flags that do not fit the imported checkpoint: the table and the flags that fit.
  struct Mismatch {
    std::string flag, wrong, tensor, fitting;
  };
  // Named members, not a structured binding: clang 14 (the asan build) cannot capture one in
  // doctest's INFO.
  for (const Mismatch& mismatch : std::vector<Mismatch>{
           {"--num-query-groups", "4", "self_attention.linear_qkv.weight", "--num-query-groups 2"},
           {"--ffn-hidden-size", "96", "mlp.linear_fc1.weight", "--ffn-hidden-size 128"}}) {
    const std::string& flag = mismatch.flag;
    const std::string& wrong = mismatch.wrong;
    const std::string& tensor = mismatch.tensor;
    const std::string& fitting = mismatch.fitting;
    std::vector<std::string> flags = continued_flags;
    for (size_t i = 0; i + 1 < flags.size(); ++i) {
      if (flags[i] == flag) flags[i + 1] = wrong;
    }
    const auto refused = launcher::run_and_capture(
        concat(concat({kPretrainGpt, "--train-iters", "1"}, flags),
               {"--load", imported.string(), "--finetune", "--no-load-optim", "--no-load-rng"}));
    INFO(flag << " " << wrong << ":\n" << refused.output);
    CHECK(refused.exit_code == 2);
    CHECK(refused.output.find("does not fit the model the current flags describe") != std::string::npos);
    CHECK(refused.output.find(tensor) != std::string::npos);
    CHECK(refused.output.find(fitting) != std::string::npos);
    // The embedding fits, so the tokenizer the import saved (NullTokenizer) is not suggested.
    CHECK(refused.output.find("NullTokenizer") == std::string::npos);
  }
}
