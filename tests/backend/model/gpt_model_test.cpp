// GptModel: the gradient of the whole decoder against central finite differences for every
// parameter tensor (double), float against double, Megatron's initialisation, the starting
// loss, input validation, grad_scale and accumulation, the tensor table, thread-count
// independence. Dropout: the same gradient check with the masks pinned, p = 0 and evaluation
// mode bit for bit the dropout-free model, the dropout step (advance, replay), threads.
#include "backend/model/gpt_model.hpp"

#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <numeric>
#include <string>

#include "backend/common/error.hpp"
#include "tests/backend/ops/gradient_check.hpp"

namespace {

using backend::GptConfig;
using backend::GptModel;
using namespace backend::testing;

// The model the headline gradient check runs on.
GptConfig tiny_config() {
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 16;
  config.num_attention_heads = 2;
  config.ffn_hidden_size = 64;
  config.vocab_size = 64;
  config.padded_vocab_size = backend::padded_vocab_size(64, 64, 1);
  config.max_position_embeddings = 8;
  return config;
}
constexpr int64_t kTinyBatch = 2;
constexpr int64_t kTinySeq = 8;

// Big enough to measure initialisation statistics and to make the OpenMP loops and BLAS
// calls run on several threads.
GptConfig medium_config() {
  GptConfig config;
  config.num_layers = 4;
  config.hidden_size = 128;
  config.num_attention_heads = 4;
  config.ffn_hidden_size = 512;
  config.vocab_size = 1000;
  config.padded_vocab_size = backend::padded_vocab_size(1000, 128, 1);  // 1024
  config.max_position_embeddings = 64;
  return config;
}

struct Batch {
  std::vector<int32_t> tokens, labels;
  int64_t batch_size, seq_length;
};

Batch random_batch(const GptConfig& config, int64_t batch_size, int64_t seq_length, uint64_t seed) {
  const auto count = static_cast<size_t>(batch_size * seq_length);
  const auto vocab = static_cast<int32_t>(config.vocab_size);
  return {random_ids(count, vocab, seed), random_ids(count, vocab, seed + 1), batch_size,
          seq_length};
}

template <typename Scalar>
Scalar forward(GptModel<Scalar>& model, const Batch& batch) {
  return model.forward(batch.tokens, batch.labels, batch.batch_size, batch.seq_length);
}

bool is_one_dimensional(const backend::ParameterTensor& tensor) {
  return tensor.shape.size() == 1;
}

bool is_norm_weight(const backend::ParameterTensor& tensor) {
  return tensor.name.find("layernorm.weight") != std::string::npos;
}

bool is_output_projection(const backend::ParameterTensor& tensor) {
  return tensor.name.ends_with("linear_proj.weight") || tensor.name.ends_with("linear_fc2.weight");
}

// Parameters for the gradient check: Megatron's initialisation with a large std (so that
// attention is far from uniform and every path carries a sizeable gradient), plus noise on
// the biases and norm weights, which the initialisation would otherwise leave at 0 and 1
// where some mistakes (a missing weight, a bias applied twice) stay invisible.
void init_for_gradient_check(GptModel<double>& model) {
  model.init_parameters(7);
  std::span<double> parameters = model.parameters();
  uint64_t seed = 100;
  for (const backend::ParameterTensor& tensor : model.tensors()) {
    if (!is_one_dimensional(tensor)) continue;
    const auto noise = random_values(static_cast<size_t>(tensor.numel), ++seed, 0.5);
    for (int64_t i = 0; i < tensor.numel; ++i) parameters[tensor.offset + i] += noise[i];
  }
}

}  // namespace

TEST_CASE("model gradients match central finite differences for every parameter tensor") {
  GptConfig config = tiny_config();
  config.init_method_std = 0.3;
  GptModel<double> model(config);
  init_for_gradient_check(model);
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 1);

  forward(model, batch);
  model.zero_gradients();
  model.backward(1.0);
  const std::vector<double> analytic(model.gradients().begin(), model.gradients().end());

  auto loss = [&] { return forward(model, batch); };
  for (const backend::ParameterTensor& tensor : model.tensors()) {
    INFO("tensor " << tensor.name);
    std::span<double> values = model.parameters().subspan(tensor.offset, tensor.numel);
    std::span<const double> gradient =
        std::span<const double>(analytic).subspan(tensor.offset, tensor.numel);
    CHECK(max_abs(gradient) > 0);
    // The second-order difference at eps = 1e-6 is off by up to ~7e-6 here, rounding in the
    // loss divided by eps; the fourth-order stencil at 1e-3 has neither problem (≈1e-8).
    GradientCheckOptions options;
    options.eps = 1e-3;
    options.order = 4;
    BACKEND_CHECK_GRADIENT(check_gradient(values, gradient, loss, options), 1e-6);
  }
}

TEST_CASE("float model matches the double model initialised with the same seed") {
  const GptConfig config = tiny_config();
  GptModel<double> reference(config);
  GptModel<float> single(config);
  reference.init_parameters(3);
  single.init_parameters(3);
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 2);

  const double reference_loss = forward(reference, batch);
  const float single_loss = forward(single, batch);
  CHECK(std::abs(single_loss - reference_loss) / reference_loss < 1e-5);

  reference.backward(1.0);
  single.backward(1.0f);
  for (const backend::ParameterTensor& tensor : reference.tensors()) {
    INFO("tensor " << tensor.name);
    const auto reference_gradient = reference.gradients().subspan(tensor.offset, tensor.numel);
    const auto single_gradient = single.gradients().subspan(tensor.offset, tensor.numel);
    CHECK(max_abs(reference_gradient) > 0);
    CHECK(error_relative_to_max<float>(single_gradient, reference_gradient) < 1e-3);
  }
}

TEST_CASE("initialisation follows Megatron: N(0, std), scaled output projections, 0 and 1") {
  const GptConfig config = medium_config();
  GptModel<double> model(config);
  model.init_parameters(11);
  const double scaled_std =
      config.init_method_std / std::sqrt(2.0 * static_cast<double>(config.num_layers));
  int scaled_tensors = 0;
  for (const backend::ParameterTensor& tensor : model.tensors()) {
    INFO("tensor " << tensor.name);
    const auto values = model.parameters().subspan(tensor.offset, tensor.numel);
    if (is_one_dimensional(tensor)) {
      const double expected = is_norm_weight(tensor) ? 1.0 : 0.0;
      CHECK(std::all_of(values.begin(), values.end(), [&](double v) { return v == expected; }));
      continue;
    }
    const double expected_std = is_output_projection(tensor) ? scaled_std : config.init_method_std;
    scaled_tensors += is_output_projection(tensor) ? 1 : 0;
    const auto n = static_cast<double>(tensor.numel);
    const double mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
    double squares = 0;
    for (double v : values) squares += (v - mean) * (v - mean);
    const double std = std::sqrt(squares / n);
    // Five standard errors: the sample mean has std σ/√n, the sample std about σ/√(2n).
    CHECK(std::abs(mean) < 5 * expected_std / std::sqrt(n));
    CHECK(std::abs(std / expected_std - 1) < 5 / std::sqrt(2 * n));
    // Normal, not uniform: about 4.55% of the mass lies beyond 2σ (a uniform of the same σ
    // has none beyond 1.73σ).
    const double beyond_two_std = static_cast<double>(std::count_if(
        values.begin(), values.end(), [&](double v) { return std::abs(v) > 2 * expected_std; }));
    CHECK(beyond_two_std / n == doctest::Approx(0.0455).epsilon(0.25));
  }
  CHECK(scaled_tensors == 2 * config.num_layers);
}

TEST_CASE("initialisation is a function of the seed alone") {
  const GptConfig config = tiny_config();
  GptModel<double> first(config);
  GptModel<double> second(config);
  first.init_parameters(5);
  // Garbage first, then the same seed: every element is overwritten.
  std::fill(second.parameters().begin(), second.parameters().end(), 123.0);
  second.init_parameters(5);
  CHECK(std::equal(first.parameters().begin(), first.parameters().end(),
                   second.parameters().begin()));

  // The same on one thread as on several.
  const auto [serial, parallel] = on_one_and_three_threads([] {
    GptModel<double> model(medium_config());
    model.init_parameters(5);
    return std::vector<double>(model.parameters().begin(), model.parameters().end());
  });
  CHECK(serial == parallel);

  // Another seed gives other values, uncorrelated with the first.
  second.init_parameters(6);
  const auto& word = first.tensor("embedding.word_embeddings.weight");
  const auto a = first.parameters().subspan(word.offset, word.numel);
  const auto b = second.parameters().subspan(word.offset, word.numel);
  double cross = 0, norm_a = 0, norm_b = 0;
  int64_t equal = 0;
  for (int64_t i = 0; i < word.numel; ++i) {
    cross += a[i] * b[i];
    norm_a += a[i] * a[i];
    norm_b += b[i] * b[i];
    equal += a[i] == b[i] ? 1 : 0;
  }
  CHECK(equal == 0);
  CHECK(std::abs(cross / std::sqrt(norm_a * norm_b)) < 0.1);

  // A float model holds the double model's values, rounded.
  GptModel<float> single(config);
  single.init_parameters(5);
  for (size_t i = 0; i < single.parameters().size(); ++i) {
    REQUIRE(single.parameters()[i] == static_cast<float>(first.parameters()[i]));
  }
}

TEST_CASE("the first loss of an initialised model is close to ln(padded vocabulary)") {
  const GptConfig config = medium_config();
  GptModel<float> model(config);
  model.init_parameters(1234);
  const Batch batch = random_batch(config, 2, 32, 9);
  const float loss = forward(model, batch);
  CHECK(std::abs(loss - std::log(static_cast<double>(config.padded_vocab_size))) < 0.1);
}

TEST_CASE("bad inputs are rejected with a message naming the problem") {
  const GptConfig config = tiny_config();
  GptModel<double> model(config);
  model.init_parameters(1);
  Batch batch = random_batch(config, kTinyBatch, kTinySeq, 3);

  SUBCASE("backward before any forward") {
    CHECK_THROWS_AS(model.backward(1.0), common::Error);
    CHECK_THROWS_WITH(model.backward(1.0), doctest::Contains("without a completed forward"));
  }
  SUBCASE("token outside the vocabulary") {
    batch.tokens[5] = 64;
    CHECK_THROWS_AS(forward(model, batch), common::Error);
    CHECK_THROWS_WITH(forward(model, batch),
                      "tokens value 64 at index 5 (batch row 0, position 5) is outside the "
                      "vocabulary [0, 64)");
    batch.tokens[5] = -1;
    CHECK_THROWS_WITH(forward(model, batch), doctest::Contains("tokens value -1 at index 5"));
  }
  SUBCASE("label outside the vocabulary") {
    batch.labels[kTinySeq + 2] = 1000;
    CHECK_THROWS_WITH_AS(
        forward(model, batch),
        doctest::Contains("labels value 1000 at index 10 (batch row 1, position 2)"),
        common::Error);
  }
  SUBCASE("token inside the padded vocabulary but outside the tokenizer's") {
    GptConfig padded = config;
    padded.vocab_size = 50;  // padded_vocab_size stays 64
    GptModel<double> padded_model(padded);
    batch.tokens[0] = 50;
    CHECK_THROWS_WITH_AS(forward(padded_model, batch), doctest::Contains("[0, 50)"), common::Error);
  }
  SUBCASE("sequence longer than the position table") {
    const Batch long_batch = random_batch(config, 1, 9, 4);
    CHECK_THROWS_WITH_AS(forward(model, long_batch),
                         doctest::Contains("sequence length 9 is outside [1, 8]"), common::Error);
    const Batch empty_batch = random_batch(config, 1, 0, 4);
    CHECK_THROWS_WITH_AS(forward(model, empty_batch),
                         doctest::Contains("sequence length 0 is outside [1, 8]"), common::Error);
  }
  SUBCASE("spans of the wrong size") {
    batch.tokens.pop_back();
    CHECK_THROWS_WITH_AS(forward(model, batch),
                         doctest::Contains("tokens has 15 entries, expected batch size 2 × "
                                           "sequence length 8 = 16"),
                         common::Error);
    batch.tokens.push_back(0);
    batch.labels.push_back(0);
    CHECK_THROWS_WITH_AS(forward(model, batch), doctest::Contains("labels has 17 entries"),
                         common::Error);
  }
  SUBCASE("a failed forward leaves nothing for backward") {
    forward(model, batch);
    batch.tokens[0] = 64;
    CHECK_THROWS_AS(forward(model, batch), common::Error);
    CHECK_THROWS_AS(model.backward(1.0), common::Error);
  }
  SUBCASE("unknown tensor name") {
    CHECK_THROWS_AS(model.tensor("decoder.layers.0.mlp.fc1.weight"), common::Error);
    CHECK_THROWS_WITH(model.tensor("decoder.layers.0.mlp.fc1.weight"),
                      doctest::Contains("unknown parameter tensor "
                                        "'decoder.layers.0.mlp.fc1.weight'"));
    CHECK_THROWS_WITH(model.tensor("x"), doctest::Contains("embedding.word_embeddings.weight"));
    CHECK_THROWS_WITH(model.tensor("decoder.layers.2.input_layernorm.weight"),
                      doctest::Contains("decoder.layers.{0..1}.mlp.linear_fc1.weight"));
  }
  SUBCASE("invalid configuration") {
    GptConfig bad = config;
    bad.num_attention_heads = 3;
    CHECK_THROWS_WITH_AS(GptModel<float>{bad}, doctest::Contains("--num-attention-heads 3"),
                         common::Error);
  }
}

TEST_CASE("backward scales by grad_scale and accumulates into the gradients") {
  const GptConfig config = tiny_config();
  GptModel<double> model(config);
  model.init_parameters(8);
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 5);
  forward(model, batch);

  model.backward(1.0);
  const std::vector<double> once(model.gradients().begin(), model.gradients().end());
  CHECK(max_abs(once) > 0);

  // A second backward of the same forward adds the same gradient again.
  model.backward(1.0);
  const std::vector<double> twice(model.gradients().begin(), model.gradients().end());
  double worst = 0;
  for (size_t i = 0; i < once.size(); ++i) {
    worst = std::max(worst, std::abs(twice[i] - 2 * once[i]) / (std::abs(once[i]) + 1e-300));
  }
  CHECK(worst < 1e-12);

  // A power-of-two scale is exact in every operation.
  model.zero_gradients();
  CHECK(max_abs(model.gradients()) == 0);
  model.backward(0.25);
  for (size_t i = 0; i < once.size(); ++i) REQUIRE(model.gradients()[i] == 0.25 * once[i]);

  // Gradient accumulation: two half-weighted micro batches give the gradient of the mean of
  // their losses, which is the gradient of the loss over both when they are one batch.
  const Batch first = random_batch(config, 1, kTinySeq, 6);
  const Batch second = random_batch(config, 1, kTinySeq, 8);
  Batch both = first;
  both.batch_size = 2;
  both.tokens.insert(both.tokens.end(), second.tokens.begin(), second.tokens.end());
  both.labels.insert(both.labels.end(), second.labels.begin(), second.labels.end());
  model.zero_gradients();
  const double loss_first = forward(model, first);
  model.backward(0.5);
  const double loss_second = forward(model, second);
  model.backward(0.5);
  const std::vector<double> accumulated(model.gradients().begin(), model.gradients().end());
  model.zero_gradients();
  CHECK(forward(model, both) == doctest::Approx((loss_first + loss_second) / 2).epsilon(1e-14));
  model.backward(1.0);
  CHECK(error_relative_to_max(accumulated, std::vector<double>(model.gradients().begin(),
                                                               model.gradients().end())) < 1e-13);
}

TEST_CASE("forward follows changes of batch size and sequence length") {
  const GptConfig config = tiny_config();
  GptModel<double> model(config);
  GptModel<double> fresh(config);
  model.init_parameters(4);
  fresh.init_parameters(4);
  const Batch large = random_batch(config, 2, 8, 10);
  const Batch small = random_batch(config, 3, 3, 11);
  forward(model, large);
  model.backward(1.0);
  model.zero_gradients();
  const double loss = forward(model, small);
  model.backward(1.0);
  CHECK(loss == forward(fresh, small));
  fresh.backward(1.0);
  CHECK(std::equal(model.gradients().begin(), model.gradients().end(), fresh.gradients().begin()));
}

TEST_CASE("the tensor table follows Megatron's names, shapes and order in one flat buffer") {
  const GptConfig config = tiny_config();
  GptModel<float> model(config);
  const auto& tensors = model.tensors();
  REQUIRE(tensors.size() == static_cast<size_t>(4 + 12 * config.num_layers));
  const std::vector<std::string> layer_names = {"input_layernorm.weight",
                                                "input_layernorm.bias",
                                                "self_attention.linear_qkv.weight",
                                                "self_attention.linear_qkv.bias",
                                                "self_attention.linear_proj.weight",
                                                "self_attention.linear_proj.bias",
                                                "pre_mlp_layernorm.weight",
                                                "pre_mlp_layernorm.bias",
                                                "mlp.linear_fc1.weight",
                                                "mlp.linear_fc1.bias",
                                                "mlp.linear_fc2.weight",
                                                "mlp.linear_fc2.bias"};
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const std::vector<std::vector<int64_t>> layer_shapes = {
      {C}, {C}, {3 * C, C}, {3 * C}, {C, C}, {C}, {C}, {C}, {F, C}, {F}, {C, F}, {C}};
  CHECK(tensors[0].name == "embedding.word_embeddings.weight");
  CHECK(tensors[0].shape == std::vector<int64_t>{config.padded_vocab_size, C});
  CHECK(tensors[1].name == "embedding.position_embeddings.weight");
  CHECK(tensors[1].shape == std::vector<int64_t>{config.max_position_embeddings, C});
  for (int64_t l = 0; l < config.num_layers; ++l) {
    for (size_t j = 0; j < layer_names.size(); ++j) {
      const auto& tensor = tensors[2 + 12 * l + j];
      CHECK(tensor.name == "decoder.layers." + std::to_string(l) + "." + layer_names[j]);
      CHECK(tensor.shape == layer_shapes[j]);
    }
  }
  CHECK(tensors[tensors.size() - 2].name == "decoder.final_layernorm.weight");
  CHECK(tensors.back().name == "decoder.final_layernorm.bias");

  int64_t offset = 0;
  for (const auto& tensor : tensors) {
    INFO("tensor " << tensor.name);
    CHECK(tensor.offset == offset);
    CHECK(tensor.numel == std::accumulate(tensor.shape.begin(), tensor.shape.end(), int64_t{1},
                                          std::multiplies<>()));
    CHECK(tensor.weight_decay == (tensor.shape.size() == 2));
    CHECK(&model.tensor(tensor.name) == &tensor);
    offset += tensor.numel;
  }
  CHECK(model.parameters().size() == static_cast<size_t>(offset));
  CHECK(model.gradients().size() == static_cast<size_t>(offset));
  // The constructor zeroes parameters and gradients.
  CHECK(max_abs(std::vector<double>(model.parameters().begin(), model.parameters().end())) == 0);
  CHECK(max_abs(std::vector<double>(model.gradients().begin(), model.gradients().end())) == 0);
  // The per-layer count of GPT-2: 12C² + 13C with F = 4C.
  CHECK(offset == (config.padded_vocab_size + config.max_position_embeddings) * C +
                      config.num_layers * (4 * C * C + 2 * C * F + 9 * C + F) + 2 * C);
}

TEST_CASE("forward and backward give the same bits on one thread as on several") {
  const GptConfig config = medium_config();
  const Batch batch = random_batch(config, 2, 64, 12);
  auto run = [&] {
    GptModel<float> model(config);
    model.init_parameters(2);
    std::vector<float> result = {forward(model, batch)};
    model.backward(1.0f);
    result.insert(result.end(), model.gradients().begin(), model.gradients().end());
    return result;
  };
  const auto [serial, parallel] = on_one_and_three_threads(run);
  CHECK(serial[0] == parallel[0]);
  CHECK(serial == parallel);
}

TEST_CASE("a moved-from model's state lives on in the moved-to model") {
  const GptConfig config = tiny_config();
  GptModel<double> model(config);
  model.init_parameters(3);
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 13);
  const double loss = forward(model, batch);
  GptModel<double> moved(std::move(model));
  moved.backward(1.0);
  CHECK(max_abs(moved.gradients()) > 0);
  GptModel<double> assigned(tiny_config());
  assigned = std::move(moved);
  CHECK(forward(assigned, batch) == loss);
}

namespace {

GptConfig with_dropout(GptConfig config, double hidden, double attention) {
  config.hidden_dropout = hidden;
  config.attention_dropout = attention;
  return config;
}

template <typename Scalar>
std::vector<Scalar> gradients_of(const GptModel<Scalar>& model) {
  return {model.gradients().begin(), model.gradients().end()};
}

}  // namespace

TEST_CASE("with dropout on, model gradients match central finite differences (masks pinned)") {
  GptConfig config = with_dropout(tiny_config(), 0.3, 0.3);
  config.init_method_std = 0.3;
  GptModel<double> model(config);
  init_for_gradient_check(model);
  model.set_dropout_seed(99);
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 1);
  // Every forward of the check runs at the same dropout step, hence with the same masks, so
  // the loss is a smooth function of the parameters.
  constexpr uint64_t kStep = 17;
  auto loss = [&] {
    model.set_dropout_step(kStep);
    return forward(model, batch);
  };

  const double dropped_loss = loss();
  model.zero_gradients();
  model.backward(1.0);
  const std::vector<double> analytic = gradients_of(model);
  // The masks are in use: evaluation mode (no dropout) gives another loss and gradient.
  model.set_training(false);
  CHECK(forward(model, batch) != dropped_loss);
  model.zero_gradients();
  model.backward(1.0);
  CHECK(gradients_of(model) != analytic);
  model.set_training(true);

  for (const backend::ParameterTensor& tensor : model.tensors()) {
    INFO("tensor " << tensor.name);
    std::span<double> values = model.parameters().subspan(tensor.offset, tensor.numel);
    std::span<const double> gradient =
        std::span<const double>(analytic).subspan(tensor.offset, tensor.numel);
    CHECK(max_abs(gradient) > 0);
    GradientCheckOptions options;  // as in the check without dropout
    options.eps = 1e-3;
    options.order = 4;
    BACKEND_CHECK_GRADIENT(check_gradient(values, gradient, loss, options), 1e-6);
  }
}

TEST_CASE("dropout of 0, or evaluation mode, is the dropout-free model bit for bit") {
  const GptConfig config = tiny_config();
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 14);
  auto run = [&](const GptConfig& model_config, bool training) {
    GptModel<float> model(model_config);
    model.init_parameters(2);
    model.set_dropout_seed(3);
    model.set_training(training);
    std::vector<float> result = {forward(model, batch)};
    model.backward(1.0f);
    result.insert(result.end(), model.gradients().begin(), model.gradients().end());
    // A second training-mode forward (the next dropout step) changes nothing at p = 0.
    result.push_back(forward(model, batch));
    return result;
  };
  const auto without_fields = run(config, true);
  CHECK(run(with_dropout(config, 0.0, 0.0), true) == without_fields);
  CHECK(run(with_dropout(config, 0.3, 0.2), false) == without_fields);
  // ... while in training mode those probabilities change the loss and every gradient.
  const auto dropped = run(with_dropout(config, 0.3, 0.2), true);
  CHECK(dropped[0] != without_fields[0]);
  CHECK(dropped != without_fields);
  // Each site alone makes a difference.
  CHECK(run(with_dropout(config, 0.0, 0.2), true)[0] != without_fields[0]);
  CHECK(run(with_dropout(config, 0.3, 0.0), true)[0] != without_fields[0]);
}

TEST_CASE("evaluation mode is repeatable, training mode advances the masks, a step replays") {
  const GptConfig config = with_dropout(tiny_config(), 0.2, 0.2);
  GptModel<double> model(config);
  model.init_parameters(3);
  model.set_dropout_seed(5);
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 15);
  CHECK(model.dropout_step() == 0);

  // Training mode (the default): one step per forward, each with other masks.
  std::vector<double> losses;
  std::vector<double> step_one_gradient;
  for (int step = 0; step < 3; ++step) {
    losses.push_back(forward(model, batch));
    if (step == 1) {
      model.zero_gradients();
      model.backward(1.0);
      step_one_gradient = gradients_of(model);
    }
  }
  CHECK(model.dropout_step() == 3);
  CHECK(losses[0] != losses[1]);
  CHECK(losses[1] != losses[2]);

  // Evaluation mode: no dropout, the same loss every time, and the step stays.
  model.set_training(false);
  const double evaluation = forward(model, batch);
  CHECK(forward(model, batch) == evaluation);
  CHECK(model.dropout_step() == 3);
  CHECK(evaluation != losses[0]);

  // Back in training mode, set_dropout_step(1) replays step 1 exactly, gradient included.
  model.set_training(true);
  model.set_dropout_step(1);
  CHECK(forward(model, batch) == losses[1]);
  CHECK(model.dropout_step() == 2);
  model.zero_gradients();
  model.backward(1.0);
  CHECK(gradients_of(model) == step_one_gradient);

  // backward() uses the last forward's masks, whatever the mode and step are by then.
  model.set_training(false);
  model.set_dropout_step(50);
  model.set_dropout_seed(51);
  model.zero_gradients();
  model.backward(1.0);
  CHECK(gradients_of(model) == step_one_gradient);

  // Another seed, other masks at the same step.
  model.set_training(true);
  model.set_dropout_seed(5);
  model.set_dropout_step(1);
  CHECK(forward(model, batch) == losses[1]);
  model.set_dropout_seed(6);
  model.set_dropout_step(1);
  CHECK(forward(model, batch) != losses[1]);
}

TEST_CASE("with dropout, forward and backward give the same bits on one thread as on several") {
  const GptConfig config = with_dropout(medium_config(), 0.1, 0.1);
  const Batch batch = random_batch(config, 2, 64, 16);
  auto run = [&] {
    GptModel<float> model(config);
    model.init_parameters(2);
    model.set_dropout_seed(1);
    model.set_dropout_step(4);
    std::vector<float> result = {forward(model, batch)};
    model.backward(1.0f);
    result.insert(result.end(), model.gradients().begin(), model.gradients().end());
    return result;
  };
  const auto [serial, parallel] = on_one_and_three_threads(run);
  CHECK(serial[0] == parallel[0]);
  CHECK(serial == parallel);
}

TEST_CASE("dropout probabilities outside 0 ≤ p < 1 are refused, naming the flag") {
  CHECK_THROWS_WITH_AS(GptModel<float>{with_dropout(tiny_config(), 1.0, 0.0)},
                       "--hidden-dropout must lie in [0, 1), got 1", common::Error);
  CHECK_THROWS_WITH_AS(GptModel<float>{with_dropout(tiny_config(), 0.0, -0.1)},
                       "--attention-dropout must lie in [0, 1), got -0.1", common::Error);
  CHECK_THROWS_WITH_AS(GptModel<float>{with_dropout(tiny_config(), std::nan(""), 0.0)},
                       doctest::Contains("--hidden-dropout must lie in [0, 1)"), common::Error);
  CHECK_NOTHROW(GptModel<float>{with_dropout(tiny_config(), 0.0, 0.999)});
}
