// Megatron's evaluate on a tiny model: the samples it reads, the mean it returns, and that it
// leaves dropout and training mode as it found them.
#include <doctest/doctest.h>

#include <vector>

#include "backend/train/evaluation.hpp"
#include "backend/train/trainer.hpp"
#include "tests/backend/train/tiny_gpt_arguments.hpp"

using namespace backend;

namespace {

TrainingArguments evaluation_arguments() {
  TrainingArguments a = test_support::tiny_gpt_arguments(4);
  a.model.hidden_dropout = a.model.attention_dropout = 0.1;  // what evaluation must switch off
  a.evaluation.eval_iters = 2;
  validate_arguments(a);
  return a;
}

GptModel<float> initialised_model(const TrainingArguments& a) {
  GptModel<float> model(model_config(a));
  model.init_parameters(a.run.seed);
  return model;
}

struct EvaluationRead {
  Split split;
  int64_t first_sample, batch_size;
  bool operator==(const EvaluationRead&) const = default;
};

}  // namespace

TEST_CASE("evaluation reads --eval-iters global batches of its split from the given sample") {
  const auto a = evaluation_arguments();
  auto model = initialised_model(a);
  const MockDataset dataset(a.run.seed, model.config().vocab_size, a.model.seq_length);
  std::vector<EvaluationRead> reads;
  const BatchSource recording = [&](Split split, int64_t first, int64_t batch,
                                    std::span<int32_t> tokens, std::span<int32_t> labels) {
    reads.push_back({split, first, batch});
    dataset.fill_batch(split, first, batch, tokens, labels);
  };
  const EvaluationResult result =
      evaluate(model, recording, Split::test, 10, evaluation_options(a));
  CHECK(result.samples == 8);
  CHECK(reads == std::vector<EvaluationRead>{{Split::test, 10, 2}, {Split::test, 12, 2},
                                   {Split::test, 14, 2}, {Split::test, 16, 2}});
}

TEST_CASE("evaluation: the mean dropout-free loss — dropout step and training mode as before") {
  auto a = evaluation_arguments();
  a.model.hidden_dropout = a.model.attention_dropout = 0.3;
  auto model = initialised_model(a);
  auto reference = initialised_model(a);
  const MockDataset dataset(a.run.seed, model.config().vocab_size, a.model.seq_length);
  const BatchSource source = [&](Split split, int64_t first, int64_t batch,
                                 std::span<int32_t> tokens, std::span<int32_t> labels) {
    dataset.fill_batch(split, first, batch, tokens, labels);
  };
  reference.set_training(false);
  std::vector<int32_t> tokens(2 * 16), labels(2 * 16);
  double total = 0;
  for (int64_t first = 0; first < 8; first += 2) {
    source(Split::validation, first, 2, tokens, labels);
    total += reference.forward(tokens, labels, 2, 16);
  }
  model.set_dropout_step(5);
  CHECK(evaluate(model, source, Split::validation, 0, evaluation_options(a)).lm_loss == total / 4);
  CHECK(model.dropout_step() == 5);
  model.forward(tokens, labels, 2, 16);  // only a training-mode forward advances the step
  CHECK(model.dropout_step() == 6);
}

TEST_CASE("evaluation with --calculate-per-token-loss: the token losses' sum over their count") {
  auto a = evaluation_arguments();
  auto model = initialised_model(a);
  const MockDataset dataset(a.run.seed, model.config().vocab_size, a.model.seq_length);
  // Ignored labels at a rate that differs between samples: micro batches of unequal counts.
  const BatchSource masked = [&](Split split, int64_t first, int64_t batch,
                                 std::span<int32_t> tokens, std::span<int32_t> labels) {
    dataset.fill_batch(split, first, batch, tokens, labels);
    const int64_t per_sample = static_cast<int64_t>(tokens.size()) / batch;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] % (2 + (first + static_cast<int64_t>(i) / per_sample) % 3) == 0) {
        labels[i] = kIgnoredLabel;
      }
    }
  };
  // The reference: every position's loss, from the same batches, summed over the scored ones.
  double sum = 0;
  int64_t count = 0;
  std::vector<int32_t> tokens(a.run.micro_batch_size * a.model.seq_length), labels(tokens.size());
  model.set_training(false);
  for (int64_t first = 0; first < a.evaluation.eval_iters * a.run.global_batch_size;
       first += a.run.micro_batch_size) {
    masked(Split::validation, first, a.run.micro_batch_size, tokens, labels);
    model.forward(tokens, labels, a.run.micro_batch_size, a.model.seq_length);
    const auto losses = model.last_position_losses();
    for (size_t i = 0; i < labels.size(); ++i) {
      if (labels[i] == kIgnoredLabel) continue;
      sum += losses[i];
      ++count;
    }
  }
  model.set_training(true);
  a.data.calculate_per_token_loss = true;
  const EvaluationResult per_token =
      evaluate(model, masked, Split::validation, 0, evaluation_options(a));
  CHECK(per_token.lm_loss == doctest::Approx(sum / static_cast<double>(count)).epsilon(1e-6));
  a.data.calculate_per_token_loss = false;
  const EvaluationResult mean_of_means =
      evaluate(model, masked, Split::validation, 0, evaluation_options(a));
  CHECK(std::abs(mean_of_means.lm_loss - per_token.lm_loss) > 1e-5);
}
