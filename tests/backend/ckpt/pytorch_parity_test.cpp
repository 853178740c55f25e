// Parity with PyTorch: a tiny GptModel<float> is exported to Hugging Face (hf_format), its
// step-1 loss and gradients and then 10 training steps (AdamW, global-norm clipping, Megatron's
// warmup + cosine schedule, exactly as backend/train/trainer.cpp runs them) are written beside
// it, and tests/backend/ckpt/pytorch_reference.py rebuilds the model in plain torch from the
// Hugging Face names alone, replays the run in float64 with torch's AdamW and clip_grad_norm_,
// and compares (losses to 1e-5, gradients and final weights to 1e-4, relative). This checks at
// once our forward, backward, optimizer, clipping and schedule against an independent
// implementation, and the export's names and layouts against the semantics of GPT2LMHeadModel
// and of LlamaForCausalLM (RoPE, RMSNorm, SwiGLU, grouped-query attention, untied output).
//
// It needs torch in Debian's /usr/bin/python3 (python3-torch, container/install-deps.sh
// --tests); python3 on PATH may be another interpreter. Without it the test is skipped with a
// message, except when the environment variable CI is set, where that is a failure.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>

#include "backend/ckpt/hf_format.hpp"
#include "backend/ckpt/safetensors.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "tests/reference_tools.hpp"
#include "tests/temporary_directory.hpp"
#include "tests/test_files.hpp"

namespace {

using test_support::CommandResult;
using test_support::kPython;
using test_support::run_command;
using test_support::torch_available;

using backend::GptConfig;
using backend::GptModel;

constexpr int64_t kBatchSize = 2;
constexpr int64_t kSeqLength = 16;
constexpr int kSteps = 10;

// Trains `config` for kSteps on random batches as trainer.cpp does, leaving in `directory`
// what pytorch_reference.py reads, then runs it. Returns its exit status and output. With
// `end_of_document`, every position whose token is that id has the label kIgnoredLabel, as
// --eod-mask-loss makes it: torch's cross_entropy ignores -100 (its ignore_index) alike.
// clip_grad is the median gradient norm of the same run without clipping, so clipping applies
// on some steps and not on others whatever the initial weights.
CommandResult train_and_compare(const GptConfig& config, const std::filesystem::path& directory,
                                std::optional<int32_t> end_of_document = std::nullopt) {
  GptModel<float> model(config);
  model.init_parameters(1234);
  backend::export_hf(directory / "initial", model);

  const backend::AdamWConfig adam{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const int64_t global_batch_size = kBatchSize;
  const backend::LearningRateSchedule schedule{
      .max_lr = 3e-3,
      .min_lr = 3e-4,
      .init_lr = 1e-4,
      .warmup_steps = 2 * global_batch_size,
      .decay_steps = 8 * global_batch_size,
      .decay_style = backend::LearningRateDecayStyle::cosine};
  std::vector<backend::ParameterGroup> groups;
  for (const auto& tensor : model.tensors()) {
    groups.push_back({tensor.offset, tensor.numel, tensor.weight_decay});
  }
  backend::AdamW optimizer(adam, std::move(groups), static_cast<int64_t>(model.parameters().size()));
  backend::LearningRateScheduler scheduler(schedule);

  std::mt19937 generator(42);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
  std::vector<std::vector<int32_t>> step_tokens(kSteps), step_labels(kSteps);
  for (int step = 0; step < kSteps; ++step) {
    step_tokens[step].resize(kBatchSize * kSeqLength);
    step_labels[step].resize(kBatchSize * kSeqLength);
    for (auto& id : step_tokens[step]) id = token(generator);
    for (auto& id : step_labels[step]) id = token(generator);
    if (end_of_document) {
      for (size_t i = 0; i < step_tokens[step].size(); ++i) {
        if (step_tokens[step][i] == *end_of_document) step_labels[step][i] = backend::kIgnoredLabel;
      }
    }
  }
  const double clip_grad = [&] {
    GptModel<float> probe(config);
    probe.init_parameters(1234);
    std::vector<backend::ParameterGroup> probe_groups;
    for (const auto& tensor : probe.tensors()) {
      probe_groups.push_back({tensor.offset, tensor.numel, tensor.weight_decay});
    }
    backend::AdamW probe_optimizer(adam, std::move(probe_groups),
                                   static_cast<int64_t>(probe.parameters().size()));
    backend::LearningRateScheduler probe_scheduler(schedule);
    std::vector<double> norms;
    for (int step = 0; step < kSteps; ++step) {
      probe.zero_gradients();
      probe.forward(step_tokens[step], step_labels[step], kBatchSize, kSeqLength);
      probe.backward(1.0f);
      norms.push_back(backend::global_gradient_norm(probe.gradients()));
      probe_optimizer.step(probe.parameters(), probe.gradients(), probe_scheduler.learning_rate());
      probe_scheduler.step(global_batch_size);
    }
    std::sort(norms.begin(), norms.end());
    return 0.5 * (norms[kSteps / 2 - 1] + norms[kSteps / 2]);
  }();
  nlohmann::json run;
  run["batch_size"] = kBatchSize;
  run["seq_length"] = kSeqLength;
  run["global_batch_size"] = global_batch_size;
  run["clip_grad"] = clip_grad;
  run["optimizer"] = {{"beta1", adam.beta1}, {"beta2", adam.beta2}, {"eps", adam.eps},
                      {"weight_decay", adam.weight_decay}};
  run["schedule"] = {{"max_lr", schedule.max_lr},
                     {"min_lr", schedule.min_lr},
                     {"init_lr", schedule.init_lr},
                     {"warmup_steps", schedule.warmup_steps},
                     {"decay_steps", schedule.decay_steps},
                     {"decay_style", common::enum_name(schedule.decay_style)}};
  int clipped_steps = 0;
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<int32_t>& tokens = step_tokens[step - 1];
    const std::vector<int32_t>& labels = step_labels[step - 1];
    // trainer.cpp's iteration with one micro batch.
    model.zero_gradients();
    const double loss = model.forward(tokens, labels, kBatchSize, kSeqLength);
    model.backward(1.0f);
    if (step == 1) {
      backend::write_safetensors(directory / "gradients.safetensors",
                                 backend::to_hf_tensors(config, model.tensors(), model.gradients(),
                                                        backend::HfValues::gradients));
    }
    const double grad_norm = backend::global_gradient_norm(model.gradients());
    const double learning_rate = scheduler.learning_rate();
    clipped_steps += grad_norm > clip_grad;
    backend::clip_gradients(model.gradients(), grad_norm, clip_grad);
    optimizer.step(model.parameters(), model.gradients(), learning_rate);
    scheduler.step(global_batch_size);
    run["steps"].push_back({{"tokens", tokens}, {"labels", labels}, {"loss", loss},
                            {"grad_norm", grad_norm}, {"learning_rate", learning_rate}});
  }
  // The run should exercise clipping on some steps and not on others.
  CHECK(clipped_steps > 0);
  CHECK(clipped_steps < kSteps);
  backend::export_hf(directory / "final", model);
  std::ofstream(directory / "run.json") << run.dump();

  return run_command(std::string(kPython) + " " + TEST_SOURCE_DIR +
                     "/tests/backend/ckpt/pytorch_reference.py " + directory.string());
}

void check_parity(const CommandResult& result) {
  INFO("pytorch_reference.py output:\n" << result.output);
  CHECK(result.exit_status == 0);
  CHECK(result.output.find("parity: all within tolerance") != std::string::npos);
  for (const char* line : {"loss: worst relative error", "step-1 gradients: worst relative error",
                           "final weights: worst relative error"}) {
    CHECK(result.output.find(line) != std::string::npos);
  }
  MESSAGE(result.output);
}

GptConfig gpt2_parity_config() {
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 32;
  config.num_attention_heads = 4;
  config.ffn_hidden_size = 128;
  config.max_position_embeddings = 32;  // longer than the sequence: rows past it get no gradient
  config.vocab_size = 100;
  config.padded_vocab_size = backend::padded_vocab_size(100, 64, 1);  // 128
  return config;
}

}  // namespace

TEST_CASE("pytorch parity: GPT-2 (learned positions, LayerNorm, GELU, tied output)") {
  if (!torch_available()) return;
  const GptConfig config = gpt2_parity_config();
  test_support::TemporaryDirectory directory;
  // The gradient norms of this run fall from about 2.2 to 1.3.
  check_parity(train_and_compare(config, directory.path));
}

TEST_CASE("pytorch parity: with --eod-mask-loss's ignored labels the loss is torch's with ignore_index") {
  if (!torch_available()) return;
  GptConfig config = gpt2_parity_config();
  config.vocab_size = 8;  // so that the EOD id, 7, is about one token in eight
  config.padded_vocab_size = backend::padded_vocab_size(8, 64, 1);
  test_support::TemporaryDirectory directory;
  const CommandResult result = train_and_compare(config, directory.path, 7);
  // The batches hold ignored labels (a mask that left nothing out would prove nothing).
  const nlohmann::json run = nlohmann::json::parse(std::ifstream(directory.path / "run.json"));
  int ignored = 0;
  for (const auto& step : run["steps"]) {
    for (const auto& label : step["labels"]) ignored += label.get<int>() == backend::kIgnoredLabel;
  }
  CHECK(ignored > kSteps * kBatchSize * kSeqLength / 16);
  check_parity(result);
}

TEST_CASE("pytorch parity: GPT-2 with --apply-layernorm-1p (NeMo's layernorm1p) is torch's LayerNorm of weight + 1") {
  if (!torch_available()) return;
  GptConfig config = gpt2_parity_config();
  config.apply_layernorm_1p = true;  // stored γ − 1; the export (and torch) hold γ
  test_support::TemporaryDirectory directory;
  check_parity(train_and_compare(config, directory.path));
}

TEST_CASE("pytorch parity: Llama 3's RoPE scaling is transformers' rope_type llama3") {
  if (!torch_available()) return;
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 64;
  config.num_attention_heads = 2;  // head size 32: 16 frequencies
  config.num_query_groups = 1;
  config.ffn_hidden_size = 64;
  config.max_position_embeddings = 32;
  config.vocab_size = 100;
  config.padded_vocab_size = backend::padded_vocab_size(100, 64, 1);
  config.position_embedding_type = backend::PositionEmbeddingType::rope;
  config.normalization = backend::Normalization::rms_norm;
  config.swiglu = true;
  config.add_bias_linear = false;
  config.share_embeddings_and_output_weights = false;
  // An original length of 64 instead of Llama 3's 8192, so that 16 positions see all three
  // bands: wavelengths 2π·10000^(i/16) below 16 kept (i = 0, 1), 16 to 64 interpolated (2 to
  // 4), beyond 64 divided by the factor (5 to 15).
  config.rope_scaling = {.factor = 8,
                         .low_frequency_factor = 1,
                         .high_frequency_factor = 4,
                         .original_max_position_embeddings = 64};
  test_support::TemporaryDirectory directory;
  check_parity(train_and_compare(config, directory.path));
  // The reference applies the scaling only because config.json says so: without it the same
  // run is not torch's, so the comparison above does see the scaling.
  const auto config_path = directory.path / "initial" / "config.json";
  nlohmann::json hf_config = nlohmann::json::parse(std::ifstream(config_path));
  CHECK(hf_config["rope_scaling"]["rope_type"] == "llama3");
  hf_config["rope_scaling"] = nullptr;
  std::ofstream(config_path) << hf_config.dump();
  const CommandResult unscaled = run_command(std::string(kPython) + " " + TEST_SOURCE_DIR +
                                             "/tests/backend/ckpt/pytorch_reference.py " +
                                             directory.path.string());
  INFO(unscaled.output);
  CHECK(unscaled.exit_status == 1);
}

TEST_CASE("pytorch parity: Llama (RoPE, RMSNorm, SwiGLU, GQA, no biases, untied output)") {
  if (!torch_available()) return;
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 32;
  config.num_attention_heads = 4;
  config.ffn_hidden_size = 64;
  config.max_position_embeddings = 32;
  config.vocab_size = 100;
  config.padded_vocab_size = backend::padded_vocab_size(100, 64, 1);  // 128
  config.layernorm_epsilon = 1e-6;
  config.position_embedding_type = backend::PositionEmbeddingType::rope;
  config.rotary_base = 10000;
  config.normalization = backend::Normalization::rms_norm;
  config.swiglu = true;
  config.add_bias_linear = false;
  config.share_embeddings_and_output_weights = false;
  config.num_query_groups = 2;  // two query heads per key/value head
  test_support::TemporaryDirectory directory;
  // The gradient norms of this run stay between about 1.43 and 1.52.
  check_parity(train_and_compare(config, directory.path));
}
