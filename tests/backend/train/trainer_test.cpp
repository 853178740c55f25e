// The training loop end to end on tiny models: the loss starts at ln(vocab), falls on a
// learnable pattern, gradient accumulation is consistent, and the log has Megatron's lines.
#include "backend/train/trainer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/splitmix64.hpp"
#include "backend/data/preprocess_data.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/device/cuda_inventory.hpp"
#include "backend/train/arguments.hpp"
#include "captured_log.hpp"
#include "temporary_directory.hpp"
#include "tests/backend/data/dataset_fixture.hpp"
#include "tests/backend/train/tiny_gpt_arguments.hpp"

using namespace backend;

namespace {
TrainingArguments trainer_arguments() { return test_support::tiny_gpt_arguments(3); }

// Validates (filling Megatron's derived defaults such as --lr-decay-iters) and trains.
TrainingResult train(TrainingArguments a, std::ostream& log, BatchSource source = {}) {
  validate_arguments(a);
  return pretrain(a, log, std::move(source));
}

// 25 steps of the tiny GPT, wider, at a constant 5e-3 without weight decay on batches of 8: what
// the tests that learn a token pattern train.
TrainingArguments pattern_learning_arguments() {
  auto a = trainer_arguments();
  a.run.train_iters = 25;
  a.model.hidden_size = 64;
  a.run.micro_batch_size = a.run.global_batch_size = 8;
  a.optimizer.lr = 5e-3;
  a.optimizer.lr_decay_style = backend::LearningRateDecayStyle::constant;
  a.optimizer.weight_decay = 0;
  return a;
}

int count_lines_containing(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++count;
  return count;
}
}  // namespace

TEST_CASE("on mock data the first loss is within 0.1 of ln(vocab)") {
  auto a = trainer_arguments();
  a.run.train_iters = 1;
  std::ostringstream log;
  const auto result = train(a, log);
  REQUIRE(result.iterations.size() == 1);
  CHECK(std::abs(result.iterations[0].lm_loss - std::log(256.0)) < 0.1);
}

TEST_CASE("25 steps on a repeating token pattern drive the loss below 0.5") {
  // The loss after 20 steps depends on the initialisation's luck: over 150 seeds it was above
  // 0.5 for 4 to 6 % of them (up to 0.74), falling by about a fifth per step; 25 steps leave
  // a margin for every seed tried.
  const auto a = pattern_learning_arguments();
  // Period-8 pattern: each next token is determined by the current one.
  BatchSource pattern = [](Split, int64_t first_sample, int64_t batch, std::span<int32_t> tokens,
                           std::span<int32_t> labels) {
    const int64_t T = static_cast<int64_t>(tokens.size()) / batch;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t phase = first_sample + b + t;
        tokens[b * T + t] = static_cast<int32_t>(10 + 7 * (phase % 8));
        labels[b * T + t] = static_cast<int32_t>(10 + 7 * ((phase + 1) % 8));
      }
    }
  };
  std::ostringstream log;
  const auto result = train(a, log, pattern);
  REQUIRE(result.iterations.size() == 25);
  CHECK(result.iterations.front().lm_loss > 4.0);
  CHECK(result.iterations.back().lm_loss < 0.5);
}

TEST_CASE("--eod-mask-loss leaves out the unpredictable first token of each document") {
  // Documents [a, 200, 201, EOD] with a drawn from 100 ids by splitmix64 of its place: every
  // token but a follows from the one before. Without the mask a quarter of the positions predict
  // a, at best ln 100 = 4.6 each, so the loss cannot fall below about 1.15; with it, those
  // positions (input EOD) are left out and the rest is learnable.
  auto a = pattern_learning_arguments();
  const auto eod = static_cast<int32_t>(a.tokenizer.vocab_size);  // NullTokenizer's EOD
  auto token_at = [eod](int64_t position) {
    switch (position % 4) {
      case 0:
        return static_cast<int32_t>(common::splitmix64_at(7, static_cast<uint64_t>(position)) % 100);
      case 1: return int32_t{200};
      case 2: return int32_t{201};
      default: return eod;
    }
  };
  BatchSource documents = [token_at](Split, int64_t first_sample, int64_t batch,
                                     std::span<int32_t> tokens, std::span<int32_t> labels) {
    const int64_t T = static_cast<int64_t>(tokens.size()) / batch;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t position = (first_sample + b) * (T + 1) + t;
        tokens[b * T + t] = token_at(position);
        labels[b * T + t] = token_at(position + 1);
      }
    }
  };
  std::ostringstream unmasked_log;
  const auto unmasked = train(a, unmasked_log, documents);
  a.data.eod_mask_loss = true;
  std::ostringstream masked_log;
  const auto masked = train(a, masked_log, documents);
  REQUIRE(unmasked.iterations.size() == 25);
  REQUIRE(masked.iterations.size() == 25);
  CHECK(unmasked.iterations.back().lm_loss > 1.0);
  CHECK(masked.iterations.back().lm_loss < 0.5);
}

TEST_CASE("a Llama model (RoPE, RMSNorm, SwiGLU, no biases, untied output, GQA) learns the pattern") {
  auto a = pattern_learning_arguments();
  a.run.train_iters = 20;
  a.model.ffn_hidden_size = 96;
  a.model.position_embedding_type = backend::PositionEmbeddingType::rope;
  a.model.normalization = backend::Normalization::rms_norm;
  a.model.swiglu = true;
  a.model.add_bias_linear = false;
  a.model.untie_embeddings_and_output_weights = true;
  a.model.group_query_attention = true;
  a.model.num_query_groups = 2;  // two of the four heads per key/value head
  // The period-8 pattern of the test above: each next token is determined by the current one.
  BatchSource pattern = [](Split, int64_t first_sample, int64_t batch, std::span<int32_t> tokens,
                           std::span<int32_t> labels) {
    const int64_t T = static_cast<int64_t>(tokens.size()) / batch;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t phase = first_sample + b + t;
        tokens[b * T + t] = static_cast<int32_t>(10 + 7 * (phase % 8));
        labels[b * T + t] = static_cast<int32_t>(10 + 7 * ((phase + 1) % 8));
      }
    }
  };
  std::ostringstream log;
  const auto result = train(a, log, pattern);
  REQUIRE(result.iterations.size() == 20);
  CHECK(result.iterations.front().lm_loss > 4.0);
  CHECK(result.iterations.back().lm_loss < 0.5);
  // Per layer: linear_qkv's rows are 4 query heads + 2 keys + 2 values of h/4 features (h² for
  // the queries, h² for keys and values, a quarter less than multi-head attention's 4h² with
  // linear_proj's h²); 3·h·ffn (SwiGLU); 2h (RMSNorm weights). Then the word embedding and
  // the output layer (256 × h each) and the final norm.
  const int64_t h = 64, ffn = 96, vocab = 256;
  const int64_t attention = h * h + h * h + h * h;
  CHECK(result.parameter_count ==
        2 * (attention + 3 * h * ffn + 2 * h) + 2 * vocab * h + h);
}

TEST_CASE("training with activation recompute logs the same iterations, bit for bit") {
  auto reference = trainer_arguments();
  reference.model.num_layers = 3;
  reference.run.train_iters = 4;
  // The masks are recomputed too.
  reference.model.hidden_dropout = reference.model.attention_dropout = 0.1;
  std::ostringstream log;
  const auto expected = train(reference, log);
  auto selective = reference;
  selective.model.recompute_granularity = backend::RecomputeGranularity::selective;
  auto uniform = reference;
  uniform.model.recompute_granularity = backend::RecomputeGranularity::full;
  uniform.model.recompute_method = backend::RecomputeMethod::uniform;
  uniform.model.recompute_num_layers = 2;
  auto block = reference;
  block.model.recompute_granularity = backend::RecomputeGranularity::full;
  block.model.recompute_method = backend::RecomputeMethod::block;
  block.model.recompute_num_layers = 1;
  for (const auto& arguments : {selective, uniform, block}) {
    const std::string_view granularity = common::enum_name(arguments.model.recompute_granularity);
    const std::string_view method = common::enum_name(*arguments.model.recompute_method);
    CAPTURE(granularity);
    CAPTURE(method);
    const auto result = train(arguments, log);
    REQUIRE(result.iterations.size() == expected.iterations.size());
    for (size_t i = 0; i < expected.iterations.size(); ++i) {
      CHECK(result.iterations[i].lm_loss == expected.iterations[i].lm_loss);
      CHECK(result.iterations[i].grad_norm == expected.iterations[i].grad_norm);
    }
  }
}

TEST_CASE("micro batches accumulate to the same step as one big batch") {
  auto accumulated = trainer_arguments();
  auto single = trainer_arguments();
  single.run.micro_batch_size = 4;
  std::ostringstream log;
  const auto a = train(accumulated, log);
  const auto b = train(single, log);
  for (size_t i = 0; i < a.iterations.size(); ++i) {
    CHECK(a.iterations[i].lm_loss == doctest::Approx(b.iterations[i].lm_loss).epsilon(1e-5));
    CHECK(a.iterations[i].grad_norm == doctest::Approx(b.iterations[i].grad_norm).epsilon(1e-4));
  }
}

TEST_CASE("the log has one Megatron iteration line per log interval and the evaluation blocks") {
  auto a = trainer_arguments();
  a.run.train_iters = 4;
  a.logging.log_interval = 2;
  a.evaluation.eval_interval = 2;
  a.evaluation.eval_iters = 1;
  std::ostringstream log;
  const auto result = train(a, log);
  const std::string text = log.str();
  CHECK(count_lines_containing(text, "| consumed samples: ") == 2);
  CHECK(text.find(" iteration        4/       4 | consumed samples:           16 |") !=
        std::string::npos);
  CHECK(count_lines_containing(text, " validation loss at iteration 2 | lm loss value: ") == 1);
  CHECK(count_lines_containing(text, " validation loss at iteration 4 on validation set | ") == 1);
  CHECK(count_lines_containing(text, " validation loss at iteration 4 on test set | ") == 1);
  CHECK(result.validation_loss.has_value());
  CHECK(result.test_loss.has_value());
  CHECK(text.find("number of parameters on (tensor, pipeline) model parallel rank (0, 0): ") !=
        std::string::npos);
}

TEST_CASE("--split 98,2,0: validation runs, the empty test split has no test pass, as in Megatron") {
  test_support::TemporaryDirectory work;
  const std::string prefix = (work.path / "corpus_text_document").string();
  test_support::write_fixture_dataset(prefix, test_support::random_lengths(200, 1, 50, 8));
  auto a = trainer_arguments();
  a.data.mock_data = false;
  a.data.data_path = {prefix};
  a.data.split = "98,2,0";
  a.tokenizer.vocab_size = 65000;  // the fixture's token ids
  a.evaluation.eval_iters = 1;
  a.evaluation.eval_interval = 2;
  std::ostringstream log;
  const TrainingResult result = train(a, log);
  INFO(log.str());
  CHECK(result.validation_loss.has_value());
  CHECK_FALSE(result.test_loss.has_value());
  CHECK(log.str().find("on validation set") != std::string::npos);
  CHECK(log.str().find("on test set") == std::string::npos);
}

TEST_CASE("the learning rate follows the schedule and the logged rate is the next one") {
  auto a = trainer_arguments();
  a.run.train_iters = 4;
  a.optimizer.lr_warmup_iters = 2;
  a.optimizer.lr_decay_style = backend::LearningRateDecayStyle::linear;
  std::ostringstream log;
  const auto result = train(a, log);
  CHECK(result.iterations[0].learning_rate == doctest::Approx(0.0));
  CHECK(result.iterations[1].learning_rate == doctest::Approx(5e-4));
  CHECK(result.iterations[2].learning_rate == doctest::Approx(1e-3));
  CHECK(result.iterations[3].learning_rate == doctest::Approx(5e-4));
  CHECK(log.str().find(" iteration        1/       4 | consumed samples:            4 | "
                       "elapsed time per iteration (ms): ") != std::string::npos);
  CHECK(log.str().find("learning rate: 5.000000E-04 | global batch size:     4 |") !=
        std::string::npos);
}

TEST_CASE("--device cuda without a visible GPU is refused, naming the flag and the way out") {
  // CTest hides the GPUs from the CPU suites (CUDA_VISIBLE_DEVICES=, tests/CMakeLists.txt).
  if (!backend::discover_cuda_devices().devices.empty()) {
    MESSAGE("skipped: a GPU is visible (run through ctest, which hides it)");
    return;
  }
  auto b = trainer_arguments();
  b.device = DeviceChoice::cuda;
  std::ostringstream log;
  CHECK_THROWS_WITH_AS(train(b, log), doctest::Contains("--device cuda: no GPU is visible"),
                       common::Error);
  CHECK_THROWS_WITH_AS(train(b, log), doctest::Contains("use --device cpu"), common::Error);
}

TEST_CASE("training with dropout is finite, reproducible from --seed, and evaluates without it") {
  // lr 0 keeps the parameters at their initial values, so a run with dropout and one without
  // have the same model at every evaluation: their validation and test losses agree bit for
  // bit exactly when evaluation runs in evaluation mode (no dropout).
  auto a = trainer_arguments();
  a.run.train_iters = 4;
  a.optimizer.lr = 0;
  a.evaluation.eval_interval = 2;
  a.evaluation.eval_iters = 2;
  auto dropout = a;
  dropout.model.hidden_dropout = dropout.model.attention_dropout = 0.1;
  std::ostringstream log;
  const auto first = train(dropout, log);
  const auto second = train(dropout, log);
  const auto without = train(a, log);
  REQUIRE(first.iterations.size() == 4);
  for (size_t i = 0; i < first.iterations.size(); ++i) {
    CAPTURE(i);
    CHECK(std::isfinite(first.iterations[i].lm_loss));
    CHECK(std::isfinite(first.iterations[i].grad_norm));
    CHECK_FALSE(first.iterations[i].skipped);
    // Determinism: the masks follow from --seed and the iteration alone.
    CHECK(first.iterations[i].lm_loss == second.iterations[i].lm_loss);
    CHECK(first.iterations[i].grad_norm == second.iterations[i].grad_norm);
    // Dropout is applied in training...
    CHECK(first.iterations[i].lm_loss != without.iterations[i].lm_loss);
  }
  // ... but not in evaluation.
  REQUIRE(first.validation_loss.has_value());
  CHECK(*first.validation_loss == *without.validation_loss);
  CHECK(*first.test_loss == *without.test_loss);
  CHECK(*first.validation_loss == *second.validation_loss);

  // Another seed, other masks (and another initialisation).
  auto reseeded = dropout;
  reseeded.run.seed = dropout.run.seed + 1;
  CHECK(train(reseeded, log).iterations[0].lm_loss != first.iterations[0].lm_loss);
}

TEST_CASE("--train-samples with --rampup-batch-size: iterations, batch sizes and samples by the ramp") {
  // 2 → 6 by 2 over 8 samples (an increment every 4): batches 2, 2, 4 (from 4 samples), 6 (from
  // 8), then (24 − 14) // 6 = 1 more: 5 iterations, as Megatron's update_train_iters counts.
  auto a = trainer_arguments();
  a.run.train_iters = 0;
  a.run.train_samples = 24;
  a.run.global_batch_size = 6;
  a.run.rampup_batch_size = {2, 2, 8};
  std::ostringstream log;
  const auto result = train(a, log);
  REQUIRE(result.iterations.size() == 5);
  const std::vector<int64_t> batches = {2, 2, 4, 6, 6}, consumed = {2, 4, 8, 14, 20};
  for (size_t i = 0; i < batches.size(); ++i) {
    CAPTURE(i);
    CHECK(result.iterations[i].global_batch_size == batches[i]);
    CHECK(result.iterations[i].consumed_samples == consumed[i]);
  }
  const std::string text = log.str();
  CHECK(text.find("setting training iterations to 5\n") != std::string::npos);
  CHECK(text.find(" iteration        3/       5 | consumed samples:            8 |") != std::string::npos);
  CHECK(count_lines_containing(text, "| global batch size:     2 |") == 2);
  CHECK(count_lines_containing(text, "| global batch size:     4 |") == 1);
  CHECK(count_lines_containing(text, "| global batch size:     6 |") == 2);
}

TEST_CASE("--log-throughput: Megatron's field in the line, tokens/s and MFU on the next line") {
  auto a = trainer_arguments();
  a.logging.log_throughput = true;
  std::ostringstream log;
  train(a, log);
  const std::string text = log.str();
  CHECK(count_lines_containing(text, "| throughput per GPU (TFLOP/s/GPU): ") == 3);
  const std::regex extension(R"(\| number of nan iterations: +0 \|\n throughput: [0-9.]+ tokens/s \| )"
                             R"(MFU: [0-9.]+% of the measured [0-9.]+ TFLOP/s sgemm peak \|\n)");
  CHECK(std::distance(std::sregex_iterator(text.begin(), text.end(), extension),
                      std::sregex_iterator()) == 3);
}

TEST_CASE("Megatron's memory line follows the first iteration line, once, with the device's bytes") {
  auto a = trainer_arguments();
  a.run.train_iters = 4;
  a.logging.log_interval = 2;
  std::ostringstream log;
  const TrainingResult result = train(a, log);
  const std::string text = log.str();
  CHECK(count_lines_containing(text, " memory (MB) | allocated: ") == 1);
  // Each iteration's record carries the device's memory (--log-memory-to-tensorboard's values):
  // the arenas, live all along, at least the parameters, gradients and moments.
  for (const backend::IterationRecord& record : result.iterations) {
    CHECK(record.memory.allocations >= 3);
    CHECK(record.memory.allocated_bytes >= 16 * 1000);
    CHECK(record.memory.peak_bytes >= record.memory.allocated_bytes);
  }
  const std::regex memory(R"(\| number of nan iterations: +0 \|\n\[Rank 0\] \(after 2 iterations\) )"
                          R"(memory \(MB\) \| allocated: ([0-9.]+) \| max allocated: ([0-9.]+) \| )"
                          R"(reserved: \1 \| max reserved: \2\n)");
  std::smatch match;
  REQUIRE(std::regex_search(text, match, memory));
  // The parameters, gradients and moments alone are 4 · 4 bytes per parameter.
  const double allocated = std::stod(match[1].str());
  CHECK(allocated >= std::stod(match[2].str()) * 0.5);
  CHECK(allocated <= std::stod(match[2].str()));
  CHECK(allocated * 1024 * 1024 > 16.0 * 1000);
}

TEST_CASE("--weight-decay-incr-style reaches the optimizer step by step") {
  auto constant = trainer_arguments();
  constant.optimizer.weight_decay = 0.1;
  auto flat = trainer_arguments();
  flat.optimizer.weight_decay_incr_style = backend::WeightDecayIncrementStyle::linear;
  flat.optimizer.start_weight_decay = flat.optimizer.end_weight_decay = 0.1;
  auto rising = flat;
  rising.optimizer.start_weight_decay = 0.0;
  rising.optimizer.lr = 1e-1;  // large enough for the decay to show in the loss
  auto constant_large = constant;
  constant_large.optimizer.lr = 1e-1;
  std::ostringstream log;
  // linear from 0.1 to 0.1 is the constant 0.1, bit for bit ...
  CHECK(train(flat, log).iterations.back().lm_loss == train(constant, log).iterations.back().lm_loss);
  // ... while a decay rising from 0 is not.
  CHECK(train(rising, log).iterations.back().lm_loss !=
        train(constant_large, log).iterations.back().lm_loss);
}

TEST_CASE("--tensorboard-dir gets Megatron's scalars and --log-dir NeMo's files") {
  test_support::TemporaryDirectory temporary;
  auto a = trainer_arguments();
  a.logging.tensorboard_dir = (temporary.path / "tb").string();
  a.logging.log_dir = (temporary.path / "results").string();
  a.command_line = {"pretrain_gpt", "--num-layers", "2"};
  std::ostringstream log;
  train(a, log);
  CHECK(std::filesystem::exists(temporary.path / "results" / "cmd-args.log"));
  CHECK(std::filesystem::exists(temporary.path / "results" / "hparams.yaml"));
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(temporary.path / "tb")) {
    files.push_back(entry.path());
  }
  REQUIRE(files.size() == 1);
  std::ifstream in(files[0], std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Walk the TFRecord frames: the version record, then per iteration learning-rate,
  // batch-size, lm loss, loss-scale and grad-norm, each also "vs samples": 1 + 3 × 10.
  int records = 0;
  for (size_t at = 0; at + 12 <= bytes.size(); ++records) {
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(bytes[at + i]);
    at += 16 + length;
  }
  CHECK(records == 31);
  for (const char* tag : {"learning-rate vs samples", "batch-size", "lm loss", "loss-scale",
                          "grad-norm vs samples"}) {
    CAPTURE(tag);
    CHECK(bytes.find(tag) != std::string::npos);
  }
}

TEST_CASE("the GPT-2 vocabulary size comes from --vocab-file with real data, not with mock data") {
  TrainingArguments a;
  a.tokenizer.tokenizer_type = "GPT2BPETokenizer";
  CHECK(tokenizer_vocab_size(a) == 50257);  // no files: GPT-2's size
  a.tokenizer.vocab_file = "/no/such/vocab.json";
  a.tokenizer.merge_file = "/no/such/merges.txt";
  a.data.mock_data = true;
  CHECK(tokenizer_vocab_size(a) == 50257);  // mock data reads no files
  a.data.mock_data = false;
  a.data.data_path = {"/data/corpus_text_document"};
  CHECK_THROWS_WITH_AS(tokenizer_vocab_size(a), doctest::Contains("/no/such/vocab.json"), common::Error);
  a.tokenizer.vocab_file = std::string(TEST_SOURCE_DIR) + "/tests/data/gpt2-vocab.json";
  a.tokenizer.merge_file = std::string(TEST_SOURCE_DIR) + "/tests/data/gpt2-merges.txt";
  CHECK(tokenizer_vocab_size(a) == 50257);  // read from the file
}

TEST_CASE("pretrain_gpt --tokenizer-type Llama2Tokenizer trains on data preprocess_data made with it") {
  test_support::TemporaryDirectory work;
  const std::string model = std::string(TEST_SOURCE_DIR) + "/tests/data/sentencepiece_bpe.model";
  // One JSON document per paragraph of docs/data.md: real text, a few thousand tokens.
  const std::filesystem::path jsonl = work.path / "docs.jsonl";
  {
    std::ifstream in(std::string(TEST_SOURCE_DIR) + "/docs/data.md");
    std::ofstream out(jsonl);
    std::string line, paragraph;
    const auto flush = [&] {
      if (paragraph.empty()) return;
      std::string escaped;
      for (const char c : paragraph) {
        if (c == '"' || c == '\\') escaped += '\\';
        if (static_cast<unsigned char>(c) >= 0x20) escaped += c;
      }
      out << "{\"text\": \"" << escaped << "\"}\n";
      paragraph.clear();
    };
    while (std::getline(in, line)) {
      if (line.empty()) flush(); else paragraph += line + " ";
    }
    flush();
  }
  PreprocessOptions preprocess;
  preprocess.inputs = {jsonl.string()};
  preprocess.output_prefix = (work.path / "docs").string();
  preprocess.tokenizer = {.tokenizer_type = "Llama2Tokenizer", .vocab_file = "", .merge_file = "",
                          .vocab_size = 0, .tokenizer_model = model, .vocab_extra_ids = 0};
  preprocess.append_eod = true;
  std::ostringstream preprocess_log;
  const PreprocessSummary summary = preprocess_data(preprocess, preprocess_log, preprocess_log);
  REQUIRE(summary.bad_lines == 0);
  REQUIRE(summary.outputs.at(0).tokens > 2000);

  const std::string data_path = (work.path / "docs_text_document").string();
  std::vector<std::string> words = {
      "pretrain_gpt", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
      "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", "3", "--lr", "1e-3", "--eval-iters", "0", "--log-interval", "1",
      "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", model,
      "--data-path", data_path, "--split", "1,0,0",
      "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
      "--disable-bias-linear", "--untie-embeddings-and-output-weights",
      "--hidden-dropout", "0", "--attention-dropout", "0"};
  std::vector<const char*> argv;
  for (const auto& word : words) argv.push_back(word.c_str());
  const auto arguments = parse_arguments(static_cast<int>(argv.size()), argv.data());
  REQUIRE(arguments);
  CHECK(tokenizer_vocab_size(*arguments) == 500);  // the model's pieces
  std::ostringstream log;
  const TrainingResult result = pretrain(*arguments, log);
  INFO(log.str());
  // Megatron's padding: 500 → 512 (--make-vocab-size-divisible-by 128).
  CHECK(log.str().find(" > padded vocab (size: 500) with 12 dummy tokens (new size: 512)") !=
        std::string::npos);
  REQUIRE(result.iterations.size() == 3);
  for (const auto& iteration : result.iterations) {
    CHECK(std::isfinite(iteration.lm_loss));
    CHECK(std::abs(iteration.lm_loss - std::log(512.0)) < 0.5);
  }

  // Without the model file the run stops before training, naming the flag and the file.
  const auto flag = std::find(words.begin(), words.end(), "--tokenizer-model");
  REQUIRE(flag + 1 < words.end());
  *(flag + 1) = (work.path / "absent.model").string();
  argv.clear();
  for (const auto& word : words) argv.push_back(word.c_str());
  const auto missing = parse_arguments(static_cast<int>(argv.size()), argv.data());
  REQUIRE(missing);
  std::ostringstream ignored;
  const std::string message = "cannot read --tokenizer-model " + *(flag + 1);
  CHECK_THROWS_WITH_AS(pretrain(*missing, ignored), doctest::Contains(message.c_str()),
                       common::Error);
}

TEST_CASE("a model that cannot fit this machine's memory is refused, with the estimate, before it is built") {
  auto a = trainer_arguments();
  // 2^40 parameters per layer: terabytes of weights, and far more with the optimizer.
  a.model.hidden_size = int64_t{1} << 20;
  a.model.num_attention_heads = 1024;
  test_support::TemporaryDirectory temporary;
  a.logging.log_dir = (temporary.path / "logs").string();
  std::ostringstream log;
  try {
    train(a, log);
    FAIL("expected a refusal");
  } catch (const common::Error& error) {
    const std::string message = error.what();
    CHECK(message.find("does not fit in this machine's memory") != std::string::npos);
    for (const char* row : {"weights", "gradients", "optimizer states", "activations", "total"}) {
      CAPTURE(row);
      CHECK(message.find(row) != std::string::npos);
    }
  }
  // Refused before anything was written either.
  CHECK_FALSE(std::filesystem::exists(temporary.path / "logs"));
}

TEST_CASE("--exit-duration-in-mins saves and exits after the first iteration past the limit") {
  test_support::TemporaryDirectory directory;
  auto a = trainer_arguments();
  a.run.train_iters = 5;
  a.checkpointing.save = (directory.path / "checkpoints").string();
  a.run.exit_duration_in_mins = 1e-9;  // already passed when the first iteration ends
  std::ostringstream log;
  const auto result = train(a, log);
  CHECK(result.iterations.size() == 1);
  CHECK(count_lines_containing(log.str(), "[exiting program after ") == 1);
  std::ifstream tracker(directory.path / "checkpoints" / "latest_checkpointed_iteration.txt");
  std::string saved;
  tracker >> saved;
  CHECK(saved == "1");

  // A limit the run does not reach changes nothing.
  auto unlimited = trainer_arguments();
  unlimited.run.exit_duration_in_mins = 600;
  std::ostringstream whole;
  CHECK(train(unlimited, whole).iterations.size() == 3);
  CHECK(count_lines_containing(whole.str(), "exiting program") == 0);
}

TEST_CASE("--grad-reduce-in-bf16 on the CPU path says that the gradients are summed in fp32") {
  // The CPU computes --bf16 in fp32, so nothing is reduced in bf16 and the losses are those
  // without the flag; the warning names why.
  auto a = trainer_arguments();
  a.run.train_iters = 2;
  a.precision.bf16 = true;
  std::ostringstream plain_log;
  const auto plain = train(a, plain_log);
  a.parallelism.grad_reduce_in_bf16 = true;
  test_support::CapturedLog captured;
  std::ostringstream log;
  const auto flagged = train(a, log);
  CHECK(captured.text.str().find("--grad-reduce-in-bf16 without bf16 mixed precision (the CPU "
                                 "path computes in fp32): the gradients are summed in fp32") !=
        std::string::npos);
  REQUIRE(flagged.iterations.size() == 2);
  CHECK(flagged.iterations[1].lm_loss == plain.iterations[1].lm_loss);
}

namespace {

// The CPU device, writing down for each read of a step's scalars (a wait for the mark made
// right after a queued copy to the host) how many ops were queued between that mark and the
// wait: the next iteration's forward and backward when the trainer queued them ahead.
class QueueingRecordingDevice final : public CpuDevice, public OpObserver {
 public:
  QueueingRecordingDevice() { set_observer(this); }
  std::vector<int64_t> ops_before_reads;

  void op_started(std::string_view /*op*/) override {}
  void op_queued(std::string_view /*op*/, double /*flops*/) override { ++ops_; }
  void queue_copy_to_host(void* destination, View source) override {
    CpuDevice::queue_copy_to_host(destination, source);
    copy_queued_ = true;
  }
  DeviceMark mark() override {
    const DeviceMark made = CpuDevice::mark();
    if (copy_queued_) ops_at_scalar_marks_[made.sequence] = ops_;
    copy_queued_ = false;
    return made;
  }
  void wait_for(DeviceMark mark) override {
    if (const auto at = ops_at_scalar_marks_.find(mark.sequence);
        at != ops_at_scalar_marks_.end()) {
      ops_before_reads.push_back(ops_ - at->second);
    }
  }

 private:
  int64_t ops_ = 0;
  bool copy_queued_ = false;
  std::map<uint64_t, int64_t> ops_at_scalar_marks_;
};

std::vector<int64_t> ops_queued_before_reads(const TrainingArguments& arguments,
                                             std::vector<double>& losses) {
  std::ostringstream log;
  ProcessGroups groups = single_process_groups();
  auto device = std::make_unique<QueueingRecordingDevice>();
  QueueingRecordingDevice& recording = *device;
  Trainer trainer(arguments, log, {}, groups,
                  SelectedDevice{.device = std::move(device), .gpu = std::nullopt});
  const TrainingResult result = trainer.run();
  for (const auto& record : result.iterations) losses.push_back(record.lm_loss);
  return recording.ops_before_reads;
}

}  // namespace

TEST_CASE("the next iteration is queued before this one's scalars are read, except before a save") {
  test_support::TemporaryDirectory directory;
  auto a = trainer_arguments();
  a.run.train_iters = 5;
  validate_arguments(a);
  std::vector<double> ahead_losses;
  const std::vector<int64_t> ahead = ops_queued_before_reads(a, ahead_losses);
  REQUIRE(ahead.size() == 5);
  for (size_t k = 0; k < 4; ++k) {
    CAPTURE(k);
    CHECK(ahead[k] > 0);  // the next forward and backward
  }
  CHECK(ahead[4] == 0);  // the last iteration has no next

  // A save after iterations 2 and 4 sees the model of that iteration alone: nothing is queued
  // ahead of those reads; the losses are the same bits.
  a.checkpointing.save = (directory.path / "checkpoints").string();
  a.checkpointing.save_interval = 2;
  std::vector<double> saving_losses;
  const std::vector<int64_t> saving = ops_queued_before_reads(a, saving_losses);
  REQUIRE(saving.size() == 5);
  CHECK(saving[0] > 0);
  CHECK(saving[1] == 0);
  CHECK(saving[2] > 0);
  CHECK(saving[3] == 0);
  CHECK(saving[4] == 0);
  CHECK(saving_losses == ahead_losses);

  // --rollback-on-spike judges each loss before the next step: nothing queued ahead.
  a.spike.rollback_on_spike = true;
  std::vector<double> watched_losses;
  CHECK(ops_queued_before_reads(a, watched_losses) == std::vector<int64_t>(5, 0));
  CHECK(watched_losses == ahead_losses);
}
