// GptModel: the gradient of the whole decoder against central finite differences for every
// parameter tensor (double), float against double, Megatron's initialisation, the starting
// loss, input validation, grad_scale and accumulation, the tensor table, thread-count
// independence. Dropout: the same gradient check with the masks pinned, p = 0 and evaluation
// mode bit for bit the dropout-free model, the dropout step (advance, replay), threads.
#include "backend/model/gpt_model.hpp"

#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <numeric>
#include <string>

#include "backend/common/error.hpp"
#include "backend/common/inverse_normal_cdf.hpp"
#include "backend/device/cpu_device.hpp"
#include "tests/backend/ops/gradient_check.hpp"
#include "sanitized_build.hpp"

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

// Every parameter tensor's analytic gradient against the fourth-order central difference of
// the loss, on the tiny model in double; with `ignored_labels`, the labels at those indices are
// kIgnoredLabel (--eod-mask-loss), so the loss is the mean over the others.
void check_every_tensor_gradient(GptConfig config, std::vector<size_t> ignored_labels = {}) {
  config.init_method_std = 0.3;
  GptModel<double> model(config);
  init_for_gradient_check(model);
  Batch batch = random_batch(config, kTinyBatch, kTinySeq, 1);
  for (const size_t i : ignored_labels) batch.labels.at(i) = backend::kIgnoredLabel;

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
    // loss divided by eps; the fourth-order stencil has neither problem at 5e-4. (Its
    // truncation error grows as eps⁴: on the Llama combination it is 4e-6 at eps = 1e-3 and
    // 7e-5 at 2e-3; the rounding share, ~1e-15 of loss over 12·eps, is far below 1e-6.)
    GradientCheckOptions options;
    options.eps = 5e-4;
    options.order = 4;
    // The sanitized build probes every fourth element of each tensor: each probe runs the same
    // whole forward, so the sanitizers see the same code at a quarter of the time.
    std::vector<size_t> probed;
    for (size_t i = 0; i < static_cast<size_t>(tensor.numel);
         i += test_support::kSanitizedBuild ? 4 : 1) {
      probed.push_back(i);
    }
    options.indices = probed;
    BACKEND_CHECK_GRADIENT(check_gradient(values, gradient, loss, options), 1e-6);
  }
}

// The Llama family's switches, all on: RoPE, RMSNorm, SwiGLU, no linear biases, untied output,
// grouped-query attention with two query heads per key/value head.
GptConfig llama(GptConfig config) {
  config.num_query_groups = config.num_attention_heads / 2;
  config.position_embedding_type = backend::PositionEmbeddingType::rope;
  config.normalization = backend::Normalization::rms_norm;
  config.swiglu = true;
  config.add_bias_linear = false;
  config.share_embeddings_and_output_weights = false;
  return config;
}

}  // namespace

namespace {

// The decoder's loss written out from Megatron's definitions, one scalar loop at a time, in
// double, reading the parameters by name: an independent statement of what forward() must
// compute (the order of the q/k/v rows, which half of linear_fc1 is the gate, RoPE on q and k
// only, which norm has a bias, where the logits' weight comes from). Dropout off.
double reference_loss(GptModel<double>& model, const Batch& batch) {
  const GptConfig& config = model.config();
  const int64_t B = batch.batch_size, T = batch.seq_length, C = config.hidden_size;
  const int64_t NH = config.num_attention_heads, HD = C / NH, F = config.ffn_hidden_size;
  const int64_t V = config.padded_vocab_size;
  const bool rope = config.position_embedding_type == backend::PositionEmbeddingType::rope;
  const bool rms = config.normalization == backend::Normalization::rms_norm;
  auto has = [&](const std::string& name) {
    for (const auto& tensor : model.tensors()) {
      if (tensor.name == name) return true;
    }
    return false;
  };
  auto parameter = [&](const std::string& name) -> const double* {
    return has(name) ? model.parameters().data() + model.tensor(name).offset : nullptr;
  };
  using Matrix = std::vector<std::vector<double>>;  // rows × features
  const int64_t rows = B * T;
  auto linear = [&](const Matrix& x, const std::string& name, int64_t out) {
    const double* w = parameter(name + ".weight");
    const double* bias = parameter(name + ".bias");
    Matrix y(rows, std::vector<double>(out));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double sum = bias ? bias[o] : 0.0;
        for (size_t i = 0; i < x[r].size(); ++i) sum += x[r][i] * w[o * x[r].size() + i];
        y[r][o] = sum;
      }
    }
    return y;
  };
  auto norm = [&](const Matrix& x, const std::string& name) {
    const double* weight = parameter(name + ".weight");
    const double* bias = parameter(name + ".bias");
    CHECK((bias == nullptr) == rms);  // RMSNorm has no bias, LayerNorm has one
    Matrix y = x;
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0;
      if (!rms) {
        for (double v : x[r]) mean += v / C;
      }
      double variance = 0;
      for (double v : x[r]) variance += (v - mean) * (v - mean) / C;
      for (int64_t c = 0; c < C; ++c) {
        y[r][c] = (x[r][c] - mean) / std::sqrt(variance + config.layernorm_epsilon) * weight[c] +
                  (bias ? bias[c] : 0.0);
      }
    }
    return y;
  };

  Matrix x(rows, std::vector<double>(C));
  const double* word = parameter("embedding.word_embeddings.weight");
  const double* position = parameter("embedding.position_embeddings.weight");
  CHECK((position == nullptr) == rope);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      x[r][c] = word[batch.tokens[r] * C + c] + (position ? position[(r % T) * C + c] : 0.0);
    }
  }
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const std::string prefix = "decoder.layers." + std::to_string(l) + ".";
    // Megatron's grouped layout: query group g holds [its NH/NG query heads | key | value];
    // query head h belongs to group h / (NH/NG). With NG = NH, head h is [q | k | v].
    const int64_t NG = config.query_groups(), per_group = NH / NG;
    const int64_t group_width = (per_group + 2) * HD;
    Matrix qkv = linear(norm(x, prefix + "input_layernorm"), prefix + "self_attention.linear_qkv",
                        (NH + 2 * NG) * HD);
    auto q = [&](int64_t r, int64_t h) {
      return qkv[r].data() + h / per_group * group_width + h % per_group * HD;
    };
    auto k = [&](int64_t r, int64_t h) {
      return qkv[r].data() + h / per_group * group_width + per_group * HD;
    };
    auto v = [&](int64_t r, int64_t h) {
      return qkv[r].data() + h / per_group * group_width + (per_group + 1) * HD;
    };
    if (rope) {
      // Feature pairs (i, i + R/2) as complex numbers, multiplied by e^(i·t·base^(−2i/R)).
      const int64_t R = config.rotary_dim();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = 0; h < NH; ++h) {
          // Each key once: through the first query head of its group.
          std::vector<double*> heads = {q(r, h)};
          if (h % per_group == 0) heads.push_back(k(r, h));
          for (double* head : heads) {
            for (int64_t i = 0; i < R / 2; ++i) {
              const double angle = static_cast<double>(r % T) *
                                   std::pow(static_cast<double>(config.rotary_base),
                                            -2.0 * static_cast<double>(i) / static_cast<double>(R));
              const std::complex<double> z =
                  std::complex<double>(head[i], head[i + R / 2]) * std::polar(1.0, angle);
              head[i] = z.real();
              head[i + R / 2] = z.imag();
            }
          }
        }
      }
    }
    Matrix context(rows, std::vector<double>(C, 0.0));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < NH; ++h) {
        for (int64_t i = 0; i < T; ++i) {
          std::vector<double> scores(i + 1);
          double largest = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            double dot_product = 0;
            for (int64_t d = 0; d < HD; ++d) dot_product += q(b * T + i, h)[d] * k(b * T + j, h)[d];
            scores[j] = dot_product / std::sqrt(static_cast<double>(HD));
            largest = std::max(largest, scores[j]);
          }
          double total = 0;
          for (double& score : scores) total += (score = std::exp(score - largest));
          for (int64_t j = 0; j <= i; ++j) {
            for (int64_t d = 0; d < HD; ++d) {
              context[b * T + i][h * HD + d] += scores[j] / total * v(b * T + j, h)[d];
            }
          }
        }
      }
    }
    const Matrix projected = linear(context, prefix + "self_attention.linear_proj", C);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < C; ++c) x[r][c] += projected[r][c];
    }
    const Matrix fc1 = linear(norm(x, prefix + "pre_mlp_layernorm"), prefix + "mlp.linear_fc1",
                              config.swiglu ? 2 * F : F);
    Matrix activation(rows, std::vector<double>(F));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t f = 0; f < F; ++f) {
        const double a = fc1[r][f];
        activation[r][f] =
            config.swiglu
                ? a / (1 + std::exp(-a)) * fc1[r][F + f]
                : 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
      }
    }
    const Matrix mlp = linear(activation, prefix + "mlp.linear_fc2", C);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < C; ++c) x[r][c] += mlp[r][c];
    }
  }
  const Matrix final_norm = norm(x, "decoder.final_layernorm");
  const double* output =
      config.share_embeddings_and_output_weights ? word : parameter("output_layer.weight");
  CHECK(has("output_layer.weight") != config.share_embeddings_and_output_weights);
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> logits(V, 0.0);
    double largest = -INFINITY;
    for (int64_t o = 0; o < V; ++o) {
      for (int64_t c = 0; c < C; ++c) logits[o] += final_norm[r][c] * output[o * C + c];
      largest = std::max(largest, logits[o]);
    }
    double total = 0;
    for (double logit : logits) total += std::exp(logit - largest);
    loss += largest + std::log(total) - logits[batch.labels[r]];
  }
  return loss / static_cast<double>(rows);
}

}  // namespace

TEST_CASE("forward computes Megatron's definitions: a scalar reference for GPT and Llama") {
  auto check = [](const GptConfig& config) {
    GptModel<double> model(config);
    init_for_gradient_check(model);  // biases and norm weights away from 0 and 1
    const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 21);
    const double loss = forward(model, batch);
    CHECK(loss == doctest::Approx(reference_loss(model, batch)).epsilon(1e-12));
    return loss;
  };
  GptConfig config = tiny_config();
  config.init_method_std = 0.3;
  const double gpt = check(config);
  const double llama_loss = check(llama(config));
  GptConfig partial = llama(config);
  partial.rotary_percent = 0.5;
  partial.rotary_base = 50;
  const double partial_loss = check(partial);
  CHECK(llama_loss != gpt);
  CHECK(partial_loss != llama_loss);
}

TEST_CASE("model gradients match central finite differences for every parameter tensor") {
  check_every_tensor_gradient(tiny_config());
}

// release-only, as the dropout case further down: the sanitized build runs the finite
// differences above, whose code these repeat with ignored labels or dropout masks (each path
// sanitized by the training tests that use it).
TEST_CASE("with ignored labels the gradient is that of the mean over the other positions" *
          test_support::release_only()) {
  // Ignored positions in both rows, the last one of the batch among them.
  check_every_tensor_gradient(tiny_config(), {0, 3, 4, kTinySeq + 1, 2 * kTinySeq - 1});
}

TEST_CASE("ignored labels: the loss is the mean of the other positions' losses, each unchanged") {
  const GptConfig config = tiny_config();
  GptModel<double> model(config);
  model.init_parameters(21);
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 23);
  forward(model, batch);
  const std::vector<double> losses = model.last_position_losses();
  Batch masked = batch;
  const std::vector<size_t> ignored = {1, 2, kTinySeq, kTinySeq + 5};
  double scored_sum = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    if (std::find(ignored.begin(), ignored.end(), i) != ignored.end()) {
      masked.labels[i] = backend::kIgnoredLabel;
    } else {
      scored_sum += losses[i];
    }
  }
  const double mean = forward(model, masked);
  CHECK(mean == doctest::Approx(scored_sum / static_cast<double>(losses.size() - ignored.size()))
                    .epsilon(1e-14));
  const std::vector<double> masked_losses = model.last_position_losses();
  for (size_t i = 0; i < losses.size(); ++i) {
    CAPTURE(i);
    const bool is_ignored = std::find(ignored.begin(), ignored.end(), i) != ignored.end();
    CHECK(masked_losses[i] == (is_ignored ? 0.0 : losses[i]));
  }

  // Every position ignored: loss 0 and no gradient (Megatron would divide 0 by 0).
  Batch none = batch;
  std::fill(none.labels.begin(), none.labels.end(), backend::kIgnoredLabel);
  CHECK(forward(model, none) == 0.0);
  model.zero_gradients();
  model.backward(1.0);
  CHECK(max_abs(model.gradients()) == 0);

  // Another negative label is still an error, naming the one that is allowed.
  Batch wrong = batch;
  wrong.labels[3] = -1;
  CHECK_THROWS_WITH_AS(forward(model, wrong),
                       doctest::Contains("labels value -1 at index 3 (batch row 0, position 3) is "
                                         "outside the vocabulary [0, 64) and is not -100 (ignored)"),
                       common::Error);
  // Tokens may not be ignored.
  Batch ignored_token = batch;
  ignored_token.tokens[0] = backend::kIgnoredLabel;
  CHECK_THROWS_WITH_AS(forward(model, ignored_token), doctest::Contains("tokens value -100"),
                       common::Error);
}

// release-only: the fp64 finite differences of every tensor take ~90 s under the sanitizers, and
// the ops they run are sanitized by the test above and the Llama forward tests.
TEST_CASE("each Llama switch alone and all together keep the gradient exact" *
          test_support::release_only()) {
  SUBCASE("rope") {
    GptConfig config = tiny_config();
    config.position_embedding_type = backend::PositionEmbeddingType::rope;
    check_every_tensor_gradient(config);
  }
  SUBCASE("rope on half of each head") {
    GptConfig config = tiny_config();
    config.position_embedding_type = backend::PositionEmbeddingType::rope;
    config.rotary_percent = 0.5;
    config.rotary_base = 100;
    check_every_tensor_gradient(config);
  }
  SUBCASE("RMSNorm") {
    GptConfig config = tiny_config();
    config.normalization = backend::Normalization::rms_norm;
    check_every_tensor_gradient(config);
  }
  SUBCASE("SwiGLU") {
    GptConfig config = tiny_config();
    config.swiglu = true;
    check_every_tensor_gradient(config);
  }
  SUBCASE("no linear biases") {
    GptConfig config = tiny_config();
    config.add_bias_linear = false;
    check_every_tensor_gradient(config);
  }
  SUBCASE("grouped-query attention, one group (multi-query)") {
    GptConfig config = tiny_config();
    config.num_query_groups = 1;
    check_every_tensor_gradient(config);
  }
  SUBCASE("grouped-query attention with RoPE, two groups of two heads") {
    GptConfig config = tiny_config();
    config.num_attention_heads = 4;
    config.num_query_groups = 2;
    config.position_embedding_type = backend::PositionEmbeddingType::rope;
    check_every_tensor_gradient(config);
  }
  SUBCASE("untied output layer") {
    GptConfig config = tiny_config();
    config.share_embeddings_and_output_weights = false;
    check_every_tensor_gradient(config);
  }
  SUBCASE("the Llama combination") {
    check_every_tensor_gradient(llama(tiny_config()));
  }
}

TEST_CASE("float model matches the double model initialised with the same seed") {
  GptConfig config = tiny_config();
  SUBCASE("GPT") {}
  SUBCASE("Llama") {
    config = llama(config);
  }
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
  // The Llama model adds output_layer.weight, N(0, std) like every other weight.
  GptConfig config = medium_config();
  SUBCASE("GPT") {}
  SUBCASE("Llama") {
    config = llama(config);
  }
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

TEST_CASE("each initial weight is std · Φ⁻¹ of the uniform at its flat index") {
  // The documented definition, element by element: the vectorised fill (central function for
  // a whole block, tails one by one) gives exactly the scalar function's values.
  const GptConfig config = medium_config();
  GptModel<double> model(config);
  model.init_parameters(17);
  const uint64_t key = common::splitmix64_mix(17);
  const double scaled_std =
      config.init_method_std / std::sqrt(2.0 * static_cast<double>(config.num_layers));
  int64_t tails = 0;
  for (const backend::ParameterTensor& tensor : model.tensors()) {
    if (is_one_dimensional(tensor)) continue;
    INFO("tensor " << tensor.name);
    const double std = is_output_projection(tensor) ? scaled_std : config.init_method_std;
    for (int64_t i = 0; i < tensor.numel; ++i) {
      const auto index = static_cast<uint64_t>(tensor.offset + i);
      const double deviate = common::standard_normal_at(key, index);
      tails += std::abs(common::normal_uniform_at(key, index) - 0.5) > common::kCentralHalfWidth;
      REQUIRE(model.parameters()[static_cast<size_t>(tensor.offset + i)] == std * deviate);
    }
  }
  CHECK(tails > 0);
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

TEST_CASE("bf16 and fp16 activations are refused where they are not built, naming the way out") {
  GptConfig config = tiny_config();
  // (clang 14 captures no structured binding: plain variables.)
  for (const auto& choice : {std::pair{backend::MixedPrecision::bf16, "bf16"},
                             std::pair{backend::MixedPrecision::fp16, "fp16"}}) {
    config.mixed_precision = choice.first;
    const std::string type = choice.second;
    CAPTURE(type);
    CHECK_THROWS_WITH_AS(GptModel<float>{config},
                         doctest::Contains((type + " activations need a device with " + type +
                                            " ops (--device cuda); cpu computes in fp32 or fp64")
                                               .c_str()),
                         common::Error);
    CHECK_THROWS_WITH_AS(GptModel<double>{config},
                         doctest::Contains((type + " mixed precision keeps fp32 master weights; "
                                            "a model of fp64 parameters cannot use it")
                                               .c_str()),
                         common::Error);
  }
}

TEST_CASE("an inference-only model carves no gradients, forwards alike and refuses backward") {
  GptConfig config = tiny_config();
  backend::CpuDevice training_device, inference_device;
  GptModel<float> training(config, training_device);
  config.inference_only = true;
  GptModel<float> inference(config, inference_device);
  training.init_parameters(5);
  inference.init_parameters(5);
  Batch batch = random_batch(config, kTinyBatch, kTinySeq, 7);
  CHECK(forward(inference, batch) == forward(training, batch));
  CHECK(inference.gradient_buffer().numel == 0);
  // Neither the gradients nor the backward's scratch, of which dlogits is the largest.
  const int64_t parameter_bytes = 4 * training.parameter_buffer().numel;
  const int64_t dlogits_bytes = 4 * kTinyBatch * kTinySeq * config.padded_vocab_size;
  CHECK(training_device.memory_usage().allocated_bytes -
            inference_device.memory_usage().allocated_bytes >=
        parameter_bytes + dlogits_bytes);
  CHECK_THROWS_WITH_AS(inference.backward(1.0f), doctest::Contains("made for inference only"),
                       common::Error);
}

TEST_CASE(
    "a forward given the backward's scale gives the separate backward's gradients, bit for bit") {
  // The fused classifier: the head's gradient written over the logits by the forward. Float (the
  // training path's vector loops) and an ignored label; GPT-2 and Llama style.
  for (const bool llama_style : {false, true}) {
    CAPTURE(llama_style);
    const GptConfig config = llama_style ? llama(tiny_config()) : tiny_config();
    Batch batch = random_batch(config, kTinyBatch, kTinySeq, 21);
    batch.labels[3] = backend::kIgnoredLabel;
    GptModel<float> separate(config), fused(config);
    separate.init_parameters(9);
    fused.init_parameters(9);
    const float scale = 0.375f;
    const float separate_loss = forward(separate, batch);
    separate.backward(scale);
    const float fused_loss =
        fused.forward(batch.tokens, batch.labels, batch.batch_size, batch.seq_length, scale);
    CHECK(fused_loss == separate_loss);
    // The position losses survive; the logits are the gradient now, and say so.
    CHECK(fused.last_position_losses() == separate.last_position_losses());
    CHECK_THROWS_WITH_AS(fused.last_position_argmax(),
                         doctest::Contains("overwritten by their gradient"), common::Error);
    CHECK_THROWS_WITH_AS(fused.last_position_logits(0, 0),
                         doctest::Contains("overwritten by their gradient"), common::Error);
    // Another scale than the forward's is refused, and nothing is added.
    CHECK_THROWS_WITH_AS(fused.backward(1.0f), doctest::Contains("backward scale of 0.375"),
                         common::Error);
    CHECK(std::ranges::all_of(fused.gradients(), [](float g) { return g == 0.0f; }));
    fused.backward(scale);
    const std::vector<float> expected(separate.gradients().begin(), separate.gradients().end());
    const std::vector<float> actual(fused.gradients().begin(), fused.gradients().end());
    CHECK(actual == expected);
    // Repeated, as the separate backward can be: the same gradient added again.
    separate.backward(scale);
    fused.backward(scale);
    CHECK(std::vector<float>(fused.gradients().begin(), fused.gradients().end()) ==
          std::vector<float>(separate.gradients().begin(), separate.gradients().end()));
    // A forward without the scale reads the logits again.
    forward(fused, batch);
    CHECK(fused.last_position_argmax() == separate.last_position_argmax());
  }
}

TEST_CASE("an fp32 model has no working copy for an optimizer to write, and says so") {
  GptModel<float> model(tiny_config());
  CHECK(model.working_copy_buffer().empty());
  CHECK_THROWS_WITH_AS(model.parameters_updated(true),
                       doctest::Contains("this model has none (fp32, or ZeRO-3)"), common::Error);
  model.parameters_updated();
}

TEST_CASE("a model that computes the classifier's gradient in the forward carves no dlogits") {
  GptConfig config = tiny_config();
  config.classifier_gradient_in_forward = true;
  backend::CpuDevice fused_device, separate_device;
  GptModel<float> fused(config, fused_device);
  config.classifier_gradient_in_forward = false;
  GptModel<float> separate(config, separate_device);
  fused.init_parameters(4);
  separate.init_parameters(4);
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 13);
  fused.reserve(kTinyBatch, kTinySeq);
  separate.reserve(kTinyBatch, kTinySeq);
  const int64_t dlogits_bytes = 4 * kTinyBatch * kTinySeq * config.padded_vocab_size;
  CHECK(separate_device.memory_usage().allocated_bytes -
            fused_device.memory_usage().allocated_bytes >=
        dlogits_bytes);
  // Its backward needs the forward's gradient: a forward without the scale cannot be followed
  // by one, and says why.
  forward(fused, batch);
  CHECK_THROWS_WITH_AS(fused.backward(1.0f), doctest::Contains("not given the backward's scale"),
                       common::Error);
  fused.forward(batch.tokens, batch.labels, batch.batch_size, batch.seq_length, 1.0f);
  fused.backward(1.0f);
  forward(separate, batch);
  separate.backward(1.0f);
  CHECK(std::vector<float>(fused.gradients().begin(), fused.gradients().end()) ==
        std::vector<float>(separate.gradients().begin(), separate.gradients().end()));
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

TEST_CASE("the Llama tensor table: no position table, norm or linear biases — output_layer") {
  GptConfig config = llama(tiny_config());
  config.ffn_hidden_size = 24;  // not a multiple of C, so F and C cannot be confused
  GptModel<float> model(config);
  const auto& tensors = model.tensors();
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t V = config.padded_vocab_size;
  // One query group for the two heads: q of both heads, then one key and one value.
  REQUIRE(config.num_query_groups == 1);
  const int64_t QKV = (2 + 2 * 1) * config.head_dim();
  const std::vector<std::string> layer_names = {"input_layernorm.weight",
                                                "self_attention.linear_qkv.weight",
                                                "self_attention.linear_proj.weight",
                                                "pre_mlp_layernorm.weight",
                                                "mlp.linear_fc1.weight",
                                                "mlp.linear_fc2.weight"};
  // SwiGLU: linear_fc1 gives 2F features (gate and linear half), linear_fc2 takes F.
  const std::vector<std::vector<int64_t>> layer_shapes = {{C}, {QKV, C},   {C, C},
                                                          {C}, {2 * F, C}, {C, F}};
  REQUIRE(tensors.size() == static_cast<size_t>(3 + 6 * config.num_layers));
  CHECK(tensors[0].name == "embedding.word_embeddings.weight");
  for (int64_t l = 0; l < config.num_layers; ++l) {
    for (size_t j = 0; j < layer_names.size(); ++j) {
      const auto& tensor = tensors[1 + 6 * l + j];
      CHECK(tensor.name == "decoder.layers." + std::to_string(l) + "." + layer_names[j]);
      CHECK(tensor.shape == layer_shapes[j]);
    }
  }
  CHECK(tensors[tensors.size() - 2].name == "decoder.final_layernorm.weight");
  CHECK(tensors.back().name == "output_layer.weight");
  CHECK(tensors.back().shape == std::vector<int64_t>{V, C});
  int64_t offset = 0;
  for (const auto& tensor : tensors) {
    INFO("tensor " << tensor.name);
    CHECK(tensor.offset == offset);
    // No decay on the norm weights (the only 1-D tensors left); decay on output_layer.
    CHECK(tensor.weight_decay == (tensor.shape.size() == 2));
    offset += tensor.numel;
  }
  CHECK(offset == 2 * V * C + config.num_layers * (QKV * C + C * C + 3 * C * F + 2 * C) + C);
  for (const char* absent :
       {"embedding.position_embeddings.weight", "decoder.layers.0.input_layernorm.bias",
        "decoder.layers.0.self_attention.linear_qkv.bias", "decoder.layers.1.mlp.linear_fc2.bias",
        "decoder.final_layernorm.bias"}) {
    CHECK_THROWS_AS(model.tensor(absent), common::Error);
  }
  // Each switch alone removes or adds exactly its tensors.
  auto count_with = [](auto change) {
    GptConfig alone = tiny_config();
    change(alone);
    return GptModel<float>(alone).tensors().size();
  };
  const size_t gpt = 4 + 12 * 2;
  using backend::Normalization;
  using backend::PositionEmbeddingType;
  CHECK(count_with([](GptConfig& c) { c.position_embedding_type = PositionEmbeddingType::rope; }) ==
        gpt - 1);
  CHECK(count_with([](GptConfig& c) { c.normalization = Normalization::rms_norm; }) == gpt - 5);
  CHECK(count_with([](GptConfig& c) { c.add_bias_linear = false; }) == gpt - 8);
  CHECK(count_with([](GptConfig& c) { c.share_embeddings_and_output_weights = false; }) == gpt + 1);
  CHECK(count_with([](GptConfig& c) { c.swiglu = true; }) == gpt);
}

TEST_CASE("RoPE settings that rotate an odd number of features, or none, are refused") {
  GptConfig config = llama(tiny_config());  // head dim 8
  config.rotary_percent = 0.375;            // 3 features
  CHECK_THROWS_WITH_AS(GptModel<float>{config},
                       "--rotary-percent 0.375 rotates 3 of the 8 features of a head "
                       "(--hidden-size 16 / --num-attention-heads 2); RoPE needs an even "
                       "number, at least 2",
                       common::Error);
  config.rotary_percent = 0.1;  // int(0.8) = 0
  CHECK_THROWS_WITH_AS(GptModel<float>{config}, doctest::Contains("rotates 0 of the 8"),
                       common::Error);
  config.rotary_percent = 0;
  CHECK_THROWS_WITH_AS(GptModel<float>{config}, "--rotary-percent must lie in (0, 1], got 0",
                       common::Error);
  config.rotary_percent = 1;
  config.rotary_base = 0;
  CHECK_THROWS_WITH_AS(GptModel<float>{config}, "--rotary-base must be positive, got 0",
                       common::Error);
  config.rotary_base = 10000;
  config.rotary_percent = 0.25;  // 2 features: the smallest rotation
  CHECK_NOTHROW(GptModel<float>{config});
}

TEST_CASE("forward and backward give the same bits on one thread as on several") {
  GptConfig config = medium_config();
  SUBCASE("GPT") {}
  SUBCASE("Llama") {
    config = llama(config);
  }
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

TEST_CASE("with dropout on, model gradients match central finite differences (masks pinned)" *
          test_support::release_only()) {
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

TEST_CASE("staged micro batches are eager ones: their masks, scored counts and scales") {
  const GptConfig config = with_dropout(tiny_config(), 0.2, 0.2);
  const Batch first = random_batch(config, kTinyBatch, kTinySeq, 17);
  Batch second = random_batch(config, kTinyBatch, kTinySeq, 19);
  second.labels[3] = second.labels[5] = backend::kIgnoredLabel;  // 2 of the positions left out
  constexpr float kScale = 0.5f;  // the fused classifier: the backward's scale given forward
  auto fresh_model = [&] {
    GptModel<float> model(config);
    model.init_parameters(4);
    model.set_dropout_seed(8);
    model.set_dropout_step(2);
    return model;
  };
  GptModel<float> eager = fresh_model();
  std::vector<float> expected;
  for (const Batch* batch : {&first, static_cast<const Batch*>(&second)}) {
    expected.push_back(eager.forward(batch->tokens, batch->labels, kTinyBatch, kTinySeq, kScale));
    eager.backward(kScale);
  }
  const std::vector<float> expected_gradients = gradients_of(eager);

  // Both staged before either forward, as a captured step stages them: micro batch 1's masks
  // are those of the forward after micro batch 0's, its count and scale its own.
  GptModel<float> staged = fresh_model();
  CHECK(staged.stage_micro_batch(0, first.tokens, first.labels, kTinyBatch, kTinySeq, kScale) ==
        kTinyBatch * kTinySeq);
  CHECK(staged.stage_micro_batch(1, second.tokens, second.labels, kTinyBatch, kTinySeq, kScale) ==
        kTinyBatch * kTinySeq - 2);
  std::vector<float> actual;
  for (const int64_t index : {0, 1}) {
    actual.push_back(staged.forward_staged(index, kScale));
    staged.backward(kScale);
  }
  CHECK(actual == expected);
  CHECK(gradients_of(staged) == expected_gradients);
  CHECK(staged.dropout_step() == eager.dropout_step());

  // A set staged for another forward is refused, naming both: its masks or its gradient would
  // not be this forward's.
  CHECK_THROWS_WITH_AS(staged.forward_staged(1, kScale),
                       doctest::Contains("staged for the forward at dropout step 3 (training, "
                                         "seed 8), not for this one at step 4 (training, seed 8)"),
                       common::Error);
  staged.set_dropout_step(3);
  CHECK_THROWS_WITH_AS(staged.forward_staged(1, 0.25f),
                       doctest::Contains("staged for a backward of scale 0.5, this forward is "
                                         "given a backward of scale 0.25"),
                       common::Error);
  CHECK_THROWS_WITH_AS(staged.forward_staged(1),
                       doctest::Contains("this forward is given no backward"), common::Error);
  CHECK(staged.forward_staged(1, kScale) == expected[1]);
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

namespace {

using backend::RecomputeGranularity;
using backend::RecomputeMethod;

GptConfig with_recompute(GptConfig config, RecomputeGranularity granularity,
                         RecomputeMethod method = RecomputeMethod::uniform, int64_t layers = 1) {
  config.recompute_granularity = granularity;
  config.recompute_method = method;
  config.recompute_num_layers = layers;
  return config;
}

// Loss, gradients after two backwards of one forward, then the loss and gradients of a second
// micro batch of another shape: everything the trainer could observe.
template <typename Scalar>
std::vector<Scalar> observable_run(const GptConfig& config) {
  GptModel<Scalar> model(config);
  model.init_parameters(31);
  model.set_dropout_seed(7);
  const Batch first = random_batch(config, kTinyBatch, kTinySeq, 32);
  const Batch second = random_batch(config, 3, 5, 33);
  std::vector<Scalar> result = {forward(model, first)};
  model.backward(Scalar{1});
  model.backward(Scalar{0.5});
  result.insert(result.end(), model.gradients().begin(), model.gradients().end());
  result.push_back(forward(model, second));
  model.backward(Scalar{1});
  result.insert(result.end(), model.gradients().begin(), model.gradients().end());
  return result;
}

}  // namespace

TEST_CASE("activation recompute gives the same loss and gradients, bit for bit") {
  GptConfig config = with_dropout(tiny_config(), 0.2, 0.3);  // recomputed masks must match
  config.num_layers = 4;
  SUBCASE("GPT") {}
  SUBCASE("Llama") {
    config = llama(config);
  }
  const auto reference_double = observable_run<double>(config);
  const auto reference_float = observable_run<float>(config);
  const std::vector<GptConfig> recomputing = {
      with_recompute(config, RecomputeGranularity::selective),
      with_recompute(config, RecomputeGranularity::full, RecomputeMethod::uniform, 1),
      with_recompute(config, RecomputeGranularity::full, RecomputeMethod::uniform, 2),
      with_recompute(config, RecomputeGranularity::full, RecomputeMethod::uniform, 3),  // 3 + 1
      with_recompute(config, RecomputeGranularity::full, RecomputeMethod::uniform, 4),
      with_recompute(config, RecomputeGranularity::full, RecomputeMethod::block, 0),
      with_recompute(config, RecomputeGranularity::full, RecomputeMethod::block, 1),
      with_recompute(config, RecomputeGranularity::full, RecomputeMethod::block, 3),
      with_recompute(config, RecomputeGranularity::full, RecomputeMethod::block, 6),  // > layers
  };
  for (const GptConfig& recompute : recomputing) {
    CAPTURE(static_cast<int>(recompute.recompute_granularity));
    CAPTURE(static_cast<int>(recompute.recompute_method));
    CAPTURE(recompute.recompute_num_layers);
    CHECK(observable_run<double>(recompute) == reference_double);
    CHECK(observable_run<float>(recompute) == reference_float);
  }
}

TEST_CASE("activation recompute stores less: the byte count of each mode") {
  GptConfig config = tiny_config();
  config.num_layers = 4;
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 34);
  auto bytes = [&](const GptConfig& model_config) {
    GptModel<float> model(model_config);
    model.init_parameters(1);
    CHECK(model.activation_bytes() == 0);
    forward(model, batch);
    return model.activation_bytes();
  };
  const int64_t B = kTinyBatch, T = kTinySeq, rows = B * T, L = config.num_layers;
  const int64_t C = config.hidden_size, F = config.ffn_hidden_size;
  const int64_t NH = config.num_attention_heads;
  const int64_t V = config.padded_vocab_size;
  const int64_t per_float = sizeof(float);
  // What a GPT layer keeps: input_norm, qkv, context, attention_residual, mlp_norm, fc1,
  // gelu, output (rows × C, 3C, C, C, C, F, F, C), the two norms' mean and rstd (rows each),
  // the attention's row log-sum-exp (B·NH·T).
  const int64_t logsumexp = B * NH * T * per_float;
  const int64_t output = rows * C * per_float;
  const int64_t internals = rows * (7 * C + 2 * F + 4) * per_float + logsumexp;
  // Outside the layers: embedding output, final norm with mean and rstd, logits, losses and
  // their logsumexp.
  const int64_t outside = (rows * C + rows * C + 2 * rows + rows * V + 2 * rows) * per_float;
  const int64_t none = bytes(config);
  CHECK(none == outside + L * (internals + output));
  // Selective: one layer's log-sum-exp, recomputed in turn, instead of one per layer.
  CHECK(bytes(with_recompute(config, RecomputeGranularity::selective)) ==
        none - (L - 1) * logsumexp);
  // Full, uniform chunks of 1: every layer's output (the next one's input) and one layer's
  // working space.
  CHECK(bytes(with_recompute(config, RecomputeGranularity::full, RecomputeMethod::uniform, 1)) ==
        outside + L * output + internals);
  // Chunks of 2: the chunk boundaries' outputs (layers 1 and 3), two layers' working space,
  // the first with an output of its own.
  CHECK(bytes(with_recompute(config, RecomputeGranularity::full, RecomputeMethod::uniform, 2)) ==
        outside + 2 * output + 2 * internals + output);
  // Block of 3: layers 0..2 keep their output only, layer 3 everything, one working space.
  CHECK(bytes(with_recompute(config, RecomputeGranularity::full, RecomputeMethod::block, 3)) ==
        outside + 3 * output + (internals + output) + internals);
  CHECK(bytes(with_recompute(config, RecomputeGranularity::full, RecomputeMethod::block, 0)) ==
        none);
}

TEST_CASE("recompute settings Megatron refuses are refused, naming the flag") {
  CHECK_THROWS_WITH_AS(
      GptModel<float>{
          with_recompute(tiny_config(), RecomputeGranularity::full, RecomputeMethod::uniform, 0)},
      "--recompute-num-layers must be at least 1 with --recompute-method uniform, got 0",
      common::Error);
  CHECK_THROWS_WITH_AS(
      GptModel<float>{
          with_recompute(tiny_config(), RecomputeGranularity::full, RecomputeMethod::block, -1)},
      "--recompute-num-layers must be at least 0 with --recompute-method block, got -1",
      common::Error);
}

TEST_CASE("a shape whose sizes overflow is refused before anything is allocated") {
  struct Case {
    void (*change)(GptConfig&);
    const char* message;
  };
  const Case cases[] = {
      {[](GptConfig& c) { c.ffn_hidden_size = INT64_MAX; }, "--ffn-hidden-size"},
      {[](GptConfig& c) { c.hidden_size = int64_t{1} << 61; c.num_attention_heads = 1; },
       "--hidden-size"},
      {[](GptConfig& c) { c.padded_vocab_size = c.vocab_size = int64_t{1} << 60; },
       "the word embedding"},
      {[](GptConfig& c) { c.max_position_embeddings = int64_t{1} << 60; }, "the position table"},
      {[](GptConfig& c) { c.num_layers = int64_t{1} << 55; }, "--num-layers"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    GptConfig config = tiny_config();
    c.change(config);
    CHECK_THROWS_WITH_AS(GptModel<float>{config}, doctest::Contains(c.message), common::Error);
    CHECK_THROWS_WITH_AS(backend::validate(config), doctest::Contains("exceeds 9223372036854775807"),
                         common::Error);
  }
  CHECK_THROWS_WITH_AS(backend::padded_vocab_size(101, INT64_MAX, 1),
                       doctest::Contains("padded vocabulary"), common::Error);
  CHECK_THROWS_WITH_AS(backend::padded_vocab_size(INT64_MAX, 128, 1),
                       doctest::Contains("padded vocabulary"), common::Error);
  // A tensor-parallel size of 0 divided by zero (arguments saved in a damaged checkpoint reach
  // this without the command line's checks; found by tests/fuzz/checkpoint_file_fuzzer.cpp).
  for (const int64_t tensor_parallel : {int64_t{0}, int64_t{-2}}) {
    CHECK_THROWS_WITH_AS(backend::padded_vocab_size(50, 16, tensor_parallel),
                         doctest::Contains("--tensor-model-parallel-size must be positive"),
                         common::Error);
  }
}

TEST_CASE("the parameter count and the memory estimate agree with the model's layout") {
  for (auto change : {+[](GptConfig&) {},
                      +[](GptConfig& c) {
                        c.position_embedding_type = backend::PositionEmbeddingType::rope;
                        c.normalization = backend::Normalization::rms_norm;
                        c.swiglu = true;
                        c.add_bias_linear = false;
                        c.share_embeddings_and_output_weights = false;
                        c.num_attention_heads = 4;
                        c.num_query_groups = 2;
                      }}) {
    GptConfig config = tiny_config();
    change(config);
    const GptModel<float> model(config);
    CHECK(backend::parameter_count(config) == static_cast<int64_t>(model.parameters().size()));
    const auto estimate = backend::training_memory_estimate(config, 2, 8);
    CHECK(estimate.parameters == doctest::Approx(static_cast<double>(model.parameters().size())));
    // fp32 on the CPU: 4 B weights, 4 B gradients, 8 B for Adam's two moments.
    CHECK(estimate.weights_bytes == doctest::Approx(4.0 * estimate.parameters));
    CHECK(estimate.gradients_bytes == doctest::Approx(4.0 * estimate.parameters));
    CHECK(estimate.optimizer_bytes == doctest::Approx(8.0 * estimate.parameters));
    CHECK(estimate.activations_bytes > 0);
  }
}

TEST_CASE("the parameter and gradient copies move the flat buffers whole, and check their size") {
  const GptConfig config = tiny_config();
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 71);
  GptModel<float> source(config);
  source.init_parameters(5);
  forward(source, batch);
  source.backward(1.0f);

  std::vector<float> parameters(source.parameters().size());
  source.copy_parameters_to_host(parameters);
  CHECK(std::equal(parameters.begin(), parameters.end(), source.parameters().begin()));
  std::vector<float> gradients(source.gradients().size());
  source.copy_gradients_to_host(gradients);
  CHECK(std::equal(gradients.begin(), gradients.end(), source.gradients().begin()));

  // A second model given the first's parameters computes the same loss and gradients.
  GptModel<float> copy(config);
  copy.copy_parameters_from_host(parameters);
  CHECK(forward(copy, batch) == forward(source, batch));

  std::vector<float> short_buffer(parameters.size() - 1);
  CHECK_THROWS_WITH_AS(copy.copy_parameters_to_host(short_buffer),
                       doctest::Contains("the host buffer has"), common::Error);
  CHECK_THROWS_AS(copy.copy_parameters_from_host(short_buffer), common::Error);
}

TEST_CASE("last_position_logits gives each position's logits, consistent with the loss and argmax") {
  const GptConfig config = tiny_config();
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 79);
  GptModel<float> model(config);
  model.init_parameters(11);
  CHECK_THROWS_WITH_AS(model.last_position_logits(0, 0),
                       doctest::Contains("no finished forward()"), common::Error);
  model.set_training(false);
  forward(model, batch);
  const std::vector<float> losses = model.last_position_losses();
  const std::vector<int32_t> argmax = model.last_position_argmax();
  for (int64_t row = 0; row < kTinyBatch; ++row) {
    for (int64_t position = 0; position < kTinySeq; ++position) {
      CAPTURE(row);
      CAPTURE(position);
      const size_t index = static_cast<size_t>(row * kTinySeq + position);
      const std::vector<float> logits = model.last_position_logits(row, position);
      REQUIRE(logits.size() == static_cast<size_t>(config.padded_vocab_size));
      CHECK(std::max_element(logits.begin(), logits.end()) - logits.begin() == argmax[index]);
      // log_softmax(logits)[label] = logit[label] − logsumexp(logits) = −cross-entropy.
      const double largest = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (const float logit : logits) sum += std::exp(static_cast<double>(logit) - largest);
      const double log_probability =
          static_cast<double>(logits[static_cast<size_t>(batch.labels[index])]) - largest -
          std::log(sum);
      CHECK(log_probability == doctest::Approx(-static_cast<double>(losses[index])).epsilon(1e-5));
    }
  }
  CHECK_THROWS_WITH_AS(model.last_position_logits(kTinyBatch, 0),
                       doctest::Contains("outside the last forward"), common::Error);
  CHECK_THROWS_AS(model.last_position_logits(0, kTinySeq), common::Error);
  CHECK_THROWS_AS(model.last_position_logits(-1, 0), common::Error);
}

TEST_CASE("last_position_losses and last_position_argmax read the last forward per position") {
  const GptConfig config = tiny_config();
  const Batch batch = random_batch(config, kTinyBatch, kTinySeq, 73);
  GptModel<float> model(config);
  model.init_parameters(9);
  CHECK_THROWS_WITH_AS(model.last_position_losses(), doctest::Contains("no finished forward()"),
                       common::Error);
  CHECK_THROWS_WITH_AS(model.last_position_argmax(), doctest::Contains("no finished forward()"),
                       common::Error);
  model.set_training(false);
  const float mean = forward(model, batch);
  const std::vector<float> losses = model.last_position_losses();
  REQUIRE(losses.size() == static_cast<size_t>(kTinyBatch * kTinySeq));
  // forward() returns the mean of exactly these values.
  const double sum = std::accumulate(losses.begin(), losses.end(), 0.0);
  CHECK(sum / static_cast<double>(losses.size()) == doctest::Approx(mean).epsilon(1e-6));
  const std::vector<int32_t> argmax = model.last_position_argmax();
  REQUIRE(argmax.size() == losses.size());

  // Cross-entropy is logsumexp − logit[label]: with the argmax as labels every position's loss
  // is the smallest any label gives, so no other label (here: each other id) gives less.
  Batch best = batch;
  best.labels = argmax;
  forward(model, best);
  const std::vector<float> best_losses = model.last_position_losses();
  for (int32_t shift = 1; shift < config.padded_vocab_size; ++shift) {
    Batch other = batch;
    for (size_t i = 0; i < other.labels.size(); ++i) {
      other.labels[i] = static_cast<int32_t>((argmax[i] + shift) % config.padded_vocab_size);
    }
    forward(model, other);
    const std::vector<float> other_losses = model.last_position_losses();
    for (size_t i = 0; i < other_losses.size(); ++i) {
      CAPTURE(i);
      CAPTURE(shift);
      CHECK(best_losses[i] <= other_losses[i]);
    }
  }
  // A failed forward leaves nothing to read.
  Batch bad = batch;
  bad.tokens[0] = static_cast<int32_t>(config.padded_vocab_size);
  CHECK_THROWS_AS(forward(model, bad), common::Error);
  CHECK_THROWS_AS(model.last_position_losses(), common::Error);
}
