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
  a.hidden_dropout = a.attention_dropout = 0.1;  // what evaluation must switch off
  a.eval_iters = 2;
  validate_arguments(a);
  return a;
}

GptModel<float> initialised_model(const TrainingArguments& a) {
  GptModel<float> model(model_config(a));
  model.init_parameters(a.seed);
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
  const MockDataset dataset(a.seed, model.config().vocab_size, a.seq_length);
  std::vector<EvaluationRead> reads;
  const BatchSource recording = [&](Split split, int64_t first, int64_t batch,
                                    std::span<int32_t> tokens, std::span<int32_t> labels) {
    reads.push_back({split, first, batch});
    dataset.fill_batch(split, first, batch, tokens, labels);
  };
  const EvaluationResult result = evaluate(model, recording, Split::test, 10, a);
  CHECK(result.samples == 8);
  CHECK(reads == std::vector<EvaluationRead>{{Split::test, 10, 2}, {Split::test, 12, 2},
                                   {Split::test, 14, 2}, {Split::test, 16, 2}});
}

TEST_CASE("evaluation: the mean dropout-free loss — dropout step and training mode as before") {
  auto a = evaluation_arguments();
  a.hidden_dropout = a.attention_dropout = 0.3;
  auto model = initialised_model(a);
  auto reference = initialised_model(a);
  const MockDataset dataset(a.seed, model.config().vocab_size, a.seq_length);
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
  CHECK(evaluate(model, source, Split::validation, 0, a).lm_loss == total / 4);
  CHECK(model.dropout_step() == 5);
  model.forward(tokens, labels, 2, 16);  // only a training-mode forward advances the step
  CHECK(model.dropout_step() == 6);
}
