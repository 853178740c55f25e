// Hugging Face export/import: the GPT-2 layouts element by element against the formulas of
// GPT2Attention (c_attn's output split into [q | k | v] of width C, each split into heads)
// and Conv1D (y = x · W + b with W stored (in, out)); config.json; export → import bit for bit
// with the same loss; Hub-style checkpoints (no "transformer." prefix, mask buffers, sharded
// index); and one refusal per way a directory can be wrong. Llama: q/k/v split per query
// group (MHA and GQA), gate/up split, lm_head, round trips of the tied, biased, GQA and MQA
// variants, and the refusals (settings, and models no architecture computes).
#include "backend/ckpt/hf_format.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <set>

#include "backend/common/error.hpp"
#include "tests/temporary_directory.hpp"

namespace {

using backend::GptConfig;
using backend::GptModel;
using backend::NamedTensor;
using test_support::TemporaryDirectory;

GptConfig tiny_gpt_config() {
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 16;
  config.num_attention_heads = 4;
  config.ffn_hidden_size = 24;  // not 4 × hidden, so a swapped F and C would show
  config.max_position_embeddings = 12;
  config.vocab_size = 50;
  config.padded_vocab_size = 64;
  config.layernorm_epsilon = 1e-5;
  return config;
}

GptModel<float> initialised_model(const GptConfig& config, uint64_t seed = 7) {
  GptModel<float> model(config);
  model.init_parameters(seed);
  // Distinct values in the zero/one-initialised tensors too, so a swapped bias or norm shows.
  auto parameters = model.parameters();
  for (const auto& tensor : model.tensors()) {
    if (tensor.shape.size() == 1) {
      for (int64_t i = 0; i < tensor.numel; ++i) {
        parameters[static_cast<size_t>(tensor.offset + i)] += 0.001f * static_cast<float>(i + 1);
      }
    }
  }
  return model;
}

std::map<std::string, NamedTensor> by_name(std::vector<NamedTensor> tensors) {
  std::map<std::string, NamedTensor> result;
  for (auto& tensor : tensors) result.emplace(tensor.name, std::move(tensor));
  return result;
}

float megatron_value(const GptModel<float>& model, const std::string& name, int64_t index) {
  const auto& tensor = model.tensor(name);
  return model.parameters()[static_cast<size_t>(tensor.offset + index)];
}

std::vector<int32_t> ids(int64_t count, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> result;
  for (int64_t i = 0; i < count; ++i) {
    result.push_back(static_cast<int32_t>((seed * 2654435761u + static_cast<uint64_t>(i) * 40503u) % vocab));
  }
  return result;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

}  // namespace

TEST_CASE("hf_format: --apply-layernorm-1p stores γ − 1 (0 at init) and exports γ — gradients as they are") {
  GptConfig config = tiny_gpt_config();
  config.apply_layernorm_1p = true;
  GptModel<float> model(config);
  model.init_parameters(7);
  for (const char* name : {"decoder.layers.0.input_layernorm.weight",
                           "decoder.layers.1.pre_mlp_layernorm.weight",
                           "decoder.final_layernorm.weight"}) {
    CAPTURE(name);
    CHECK(megatron_value(model, name, 0) == 0.0f);
    CHECK(megatron_value(model, name, config.hidden_size - 1) == 0.0f);
  }
  const auto hf = by_name(backend::to_hf_tensors(config, model.tensors(), model.parameters()));
  for (const char* name : {"transformer.h.0.ln_1.weight", "transformer.h.1.ln_2.weight",
                           "transformer.ln_f.weight"}) {
    CAPTURE(name);
    for (float value : hf.at(name).values) CHECK(value == 1.0f);
  }
  // The biases are not shifted, and a round trip gives back the stored γ − 1.
  for (float value : hf.at("transformer.ln_f.bias").values) CHECK(value == 0.0f);
  std::vector<float> back(model.parameters().size());
  backend::from_hf_tensors(config, model.tensors(),
                           backend::to_hf_tensors(config, model.tensors(), model.parameters()),
                           back, "round trip");
  CHECK(std::equal(back.begin(), back.end(), model.parameters().begin()));
  // Gradients are not values of γ: nothing added.
  std::vector<float> gradients(model.parameters().size(), 0.25f);
  const auto hf_gradients = by_name(backend::to_hf_tensors(config, model.tensors(), gradients,
                                                           backend::HfValues::gradients));
  for (float value : hf_gradients.at("transformer.ln_f.weight").values) CHECK(value == 0.25f);
  // With RMSNorm it is refused, naming the flags.
  GptConfig rms = config;
  rms.normalization = backend::Normalization::rms_norm;
  CHECK_THROWS_WITH_AS(GptModel<float>{rms}.tensors(), doctest::Contains("--apply-layernorm-1p"),
                       ::common::Error);
}

TEST_CASE("hf_format: GPT-2 names, shapes and layouts") {
  const GptConfig config = tiny_gpt_config();
  const auto model = initialised_model(config);
  const int64_t C = config.hidden_size, F = config.ffn_hidden_size, HD = config.head_dim();
  const auto hf = by_name(backend::to_hf_tensors(config, model.tensors(), model.parameters()));

  std::set<std::string> expected = {"transformer.wte.weight", "transformer.wpe.weight",
                                    "transformer.ln_f.weight", "transformer.ln_f.bias"};
  for (int layer = 0; layer < 2; ++layer) {
    for (const char* suffix : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                               "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                               "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
                               "mlp.c_proj.bias"}) {
      expected.insert(fmt::format("transformer.h.{}.{}", layer, suffix));
    }
  }
  std::set<std::string> names;
  for (const auto& [name, tensor] : hf) names.insert(name);
  CHECK(names == expected);  // no lm_head.weight: tied, as save_pretrained leaves it out

  CHECK(hf.at("transformer.wte.weight").shape == std::vector<int64_t>{64, C});
  CHECK(hf.at("transformer.wpe.weight").shape == std::vector<int64_t>{12, C});
  CHECK(hf.at("transformer.h.1.attn.c_attn.weight").shape == std::vector<int64_t>{C, 3 * C});
  CHECK(hf.at("transformer.h.1.mlp.c_fc.weight").shape == std::vector<int64_t>{C, F});
  CHECK(hf.at("transformer.h.1.mlp.c_proj.weight").shape == std::vector<int64_t>{F, C});

  // c_attn: column s·C + h·HD + d of GPT-2 is Megatron's row h·3HD + s·HD + d.
  const auto& c_attn = hf.at("transformer.h.1.attn.c_attn.weight").values;
  const auto& c_attn_bias = hf.at("transformer.h.1.attn.c_attn.bias").values;
  int mismatches = 0;
  for (int64_t h = 0; h < config.num_attention_heads; ++h) {
    for (int64_t s = 0; s < 3; ++s) {
      for (int64_t d = 0; d < HD; ++d) {
        const int64_t megatron_row = h * 3 * HD + s * HD + d;
        const int64_t hf_column = s * C + h * HD + d;
        for (int64_t in = 0; in < C; ++in) {
          mismatches += c_attn[static_cast<size_t>(in * 3 * C + hf_column)] !=
                        megatron_value(model, "decoder.layers.1.self_attention.linear_qkv.weight",
                                       megatron_row * C + in);
        }
        mismatches += c_attn_bias[static_cast<size_t>(hf_column)] !=
                      megatron_value(model, "decoder.layers.1.self_attention.linear_qkv.bias",
                                     megatron_row);
      }
    }
  }
  // Conv1D weights are (in, out): element [in][out] is Megatron's [out][in].
  const auto& c_fc = hf.at("transformer.h.0.mlp.c_fc.weight").values;
  const auto& mlp_proj = hf.at("transformer.h.0.mlp.c_proj.weight").values;
  const auto& attn_proj = hf.at("transformer.h.0.attn.c_proj.weight").values;
  for (int64_t out = 0; out < F; ++out) {
    for (int64_t in = 0; in < C; ++in) {
      mismatches += c_fc[static_cast<size_t>(in * F + out)] !=
                    megatron_value(model, "decoder.layers.0.mlp.linear_fc1.weight", out * C + in);
      mismatches += mlp_proj[static_cast<size_t>(out * C + in)] !=
                    megatron_value(model, "decoder.layers.0.mlp.linear_fc2.weight", in * F + out);
    }
  }
  for (int64_t out = 0; out < C; ++out) {
    for (int64_t in = 0; in < C; ++in) {
      mismatches += attn_proj[static_cast<size_t>(in * C + out)] !=
                    megatron_value(model, "decoder.layers.0.self_attention.linear_proj.weight",
                                   out * C + in);
    }
  }
  // Everything else is the same values under a new name.
  for (const auto& [megatron, hf_name] :
       std::vector<std::pair<std::string, std::string>>{
           {"embedding.word_embeddings.weight", "transformer.wte.weight"},
           {"embedding.position_embeddings.weight", "transformer.wpe.weight"},
           {"decoder.layers.1.input_layernorm.bias", "transformer.h.1.ln_1.bias"},
           {"decoder.layers.1.pre_mlp_layernorm.weight", "transformer.h.1.ln_2.weight"},
           {"decoder.layers.1.mlp.linear_fc1.bias", "transformer.h.1.mlp.c_fc.bias"},
           {"decoder.layers.1.mlp.linear_fc2.bias", "transformer.h.1.mlp.c_proj.bias"},
           {"decoder.layers.1.self_attention.linear_proj.bias", "transformer.h.1.attn.c_proj.bias"},
           {"decoder.final_layernorm.weight", "transformer.ln_f.weight"}}) {
    const auto& values = hf.at(hf_name).values;
    for (size_t i = 0; i < values.size(); ++i) {
      mismatches += values[i] != megatron_value(model, megatron, static_cast<int64_t>(i));
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("hf_format: config.json for GPT-2") {
  GptConfig config = tiny_gpt_config();
  config.hidden_dropout = 0.05;
  const auto json = backend::hf_config_json(config);
  CHECK(json["model_type"] == "gpt2");
  CHECK(json["architectures"] == nlohmann::ordered_json::array({"GPT2LMHeadModel"}));
  CHECK(json["n_embd"] == 16);
  CHECK(json["n_head"] == 4);
  CHECK(json["n_layer"] == 2);
  CHECK(json["n_positions"] == 12);
  CHECK(json["n_inner"] == 24);
  CHECK(json["vocab_size"] == 64);  // the padded vocabulary
  CHECK(json["tokenizer_vocab_size"] == 50);
  CHECK(json["layer_norm_epsilon"] == 1e-5);
  CHECK(json["activation_function"] == "gelu_new");
  CHECK(json["tie_word_embeddings"] == true);
  CHECK(json["torch_dtype"] == "float32");
  CHECK(json["resid_pdrop"] == 0.05);

  const GptConfig back = backend::gpt_config_from_hf(json, "config.json");
  CHECK(back.num_layers == config.num_layers);
  CHECK(back.hidden_size == config.hidden_size);
  CHECK(back.num_attention_heads == config.num_attention_heads);
  CHECK(back.ffn_hidden_size == config.ffn_hidden_size);
  CHECK(back.max_position_embeddings == config.max_position_embeddings);
  CHECK(back.vocab_size == config.vocab_size);
  CHECK(back.padded_vocab_size == config.padded_vocab_size);
  CHECK(back.layernorm_epsilon == config.layernorm_epsilon);
  CHECK(back.init_method_std == config.init_method_std);
  CHECK(back.hidden_dropout == config.hidden_dropout);
  CHECK(back.attention_dropout == config.attention_dropout);
}

TEST_CASE("hf_format: export then import is bit for bit, with the same loss") {
  TemporaryDirectory directory;
  const GptConfig config = tiny_gpt_config();
  auto model = initialised_model(config);
  backend::export_hf(directory.path / "hf", model);
  CHECK(std::filesystem::exists(directory.path / "hf" / "config.json"));
  const auto file = backend::read_safetensors(directory.path / "hf" / "model.safetensors");
  CHECK(file.metadata.at("format") == "pt");
  CHECK(file.metadata.at("tokenizer_vocab_size") == "50");

  auto imported = backend::import_hf(directory.path / "hf");
  CHECK(imported.config().vocab_size == 50);
  CHECK(imported.config().padded_vocab_size == 64);
  REQUIRE(imported.parameters().size() == model.parameters().size());
  CHECK(std::equal(model.parameters().begin(), model.parameters().end(),
                   imported.parameters().begin()));
  const auto tokens = ids(2 * 8, 50, 1), labels = ids(2 * 8, 50, 2);
  CHECK(model.forward(tokens, labels, 2, 8) == imported.forward(tokens, labels, 2, 8));

  // Gradients convert like parameters (same layout): the round trip through from_hf_tensors.
  model.zero_gradients();
  model.forward(tokens, labels, 2, 8);
  model.backward(1.0f);
  const auto hf_gradients = backend::to_hf_tensors(config, model.tensors(), model.gradients(),
                                                   backend::HfValues::gradients);
  std::vector<float> back(model.gradients().size(), -1.0f);
  backend::from_hf_tensors(config, model.tensors(), hf_gradients, back, "gradients",
                           backend::HfValues::gradients);
  CHECK(std::equal(back.begin(), back.end(), model.gradients().begin()));
}

TEST_CASE("hf_format: Hub-style GPT-2 checkpoints load") {
  TemporaryDirectory directory;
  const GptConfig config = tiny_gpt_config();
  const auto model = initialised_model(config);
  auto tensors = backend::to_hf_tensors(config, model.tensors(), model.parameters());
  const auto dir = directory.path / "hub";
  std::filesystem::create_directories(dir);
  // The original "gpt2" repository: no "transformer." prefix, the causal-mask buffers saved,
  // lm_head.weight written out (equal to wte), and no tokenizer_vocab_size anywhere.
  std::vector<NamedTensor> hub;
  for (auto tensor : tensors) {
    if (tensor.name == "transformer.wte.weight") hub.push_back({"lm_head.weight", tensor.shape, tensor.values});
    tensor.name = tensor.name.substr(std::string("transformer.").size());
    hub.push_back(tensor);
  }
  hub.push_back({"h.0.attn.bias", {1, 1, 12, 12}, std::vector<float>(144, 1.0f)});
  hub.push_back({"h.1.attn.masked_bias", {}, {-1e4f}});
  auto json = backend::hf_config_json(config);
  json.erase("tokenizer_vocab_size");
  json.erase("n_inner");  // null/absent means 4 × n_embd in GPT2Config
  json["n_inner"] = nullptr;
  write_text(dir / "config.json", json.dump());

  SUBCASE("one file") {
    // n_inner null → 4 × 16 = 64, which these tensors do not have: the shape check says so.
    backend::write_safetensors(dir / "model.safetensors", hub);
    CHECK_THROWS_WITH_AS(backend::import_hf(dir),
                         doctest::Contains("tensor transformer.h.0.mlp.c_fc.weight has shape (16, 24), "
                                           "expected (16, 64)"),
                         common::Error);
    json["n_inner"] = 24;
    write_text(dir / "config.json", json.dump());
    const auto imported = backend::import_hf(dir);
    CHECK(imported.config().vocab_size == 64);  // without a tokenizer size, all rows are tokens
    CHECK(std::equal(model.parameters().begin(), model.parameters().end(),
                     imported.parameters().begin()));
  }
  SUBCASE("sharded, with an index") {
    json["n_inner"] = 24;
    write_text(dir / "config.json", json.dump());
    const std::vector<NamedTensor> first(hub.begin(), hub.begin() + 10);
    const std::vector<NamedTensor> second(hub.begin() + 10, hub.end());
    backend::write_safetensors(dir / "model-00001-of-00002.safetensors", first);
    backend::write_safetensors(dir / "model-00002-of-00002.safetensors", second);
    nlohmann::json index;
    for (const auto& t : first) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
    for (const auto& t : second) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
    write_text(dir / "model.safetensors.index.json", index.dump());
    const auto imported = backend::import_hf(dir);
    CHECK(std::equal(model.parameters().begin(), model.parameters().end(),
                     imported.parameters().begin()));
  }
}

TEST_CASE("hf_format: import refuses what it cannot load, naming the tensor or key") {
  TemporaryDirectory directory;
  const GptConfig config = tiny_gpt_config();
  const auto model = initialised_model(config);
  const auto dir = directory.path / "hf";
  backend::export_hf(dir, model);
  const auto good = backend::to_hf_tensors(config, model.tensors(), model.parameters());
  const auto config_text = backend::hf_config_json(config);

  auto refused_with_tensors = [&](std::vector<NamedTensor> tensors, const char* why) {
    backend::write_safetensors(dir / "model.safetensors", tensors);
    CHECK_THROWS_WITH_AS(backend::import_hf(dir), doctest::Contains(why), common::Error);
  };
  auto refused_with_config = [&](const nlohmann::ordered_json& json, const char* why) {
    write_text(dir / "config.json", json.dump());
    CHECK_THROWS_WITH_AS(backend::import_hf(dir), doctest::Contains(why), common::Error);
  };

  SUBCASE("missing tensor") {
    auto tensors = good;
    tensors.erase(tensors.begin() + 5);  // transformer.h.0.attn.c_attn.bias
    refused_with_tensors(tensors, "tensor transformer.h.0.attn.c_attn.bias (48,) is missing");
  }
  SUBCASE("unexpected tensor") {
    auto tensors = good;
    tensors.push_back({"transformer.h.2.ln_1.weight", {16}, std::vector<float>(16)});
    refused_with_tensors(tensors, "unexpected tensor transformer.h.2.ln_1.weight (16,)");
  }
  SUBCASE("mis-shaped tensor") {
    auto tensors = good;
    tensors[0].shape = {32, 32};  // wte holds 64 × 16 values, claimed as 32 × 32
    refused_with_tensors(tensors, "tensor transformer.wte.weight has shape (32, 32), expected (64, 16)");
  }
  SUBCASE("untied lm_head") {
    auto tensors = good;
    tensors.push_back({"lm_head.weight", tensors[0].shape, std::vector<float>(tensors[0].values.size())});
    refused_with_tensors(tensors, "lm_head.weight differs from transformer.wte.weight");
  }
  SUBCASE("unsupported architecture or settings") {
    auto json = config_text;
    json["model_type"] = "bert";
    refused_with_config(json, "model_type 'bert' is not supported (valid: gpt2");
    json = config_text;
    json.erase("n_head");
    refused_with_config(json, "config.json: missing key 'n_head'");
    json = config_text;
    json["n_layer"] = "two";
    refused_with_config(json,
                        "'n_layer' must be an integer from -9223372036854775808 to "
                        "9223372036854775807, got \"two\"");
    // Beyond int64 it wrapped to a negative layer count, refused under --num-layers' name.
    json["n_layer"] = uint64_t{1} << 63;
    refused_with_config(json,
                        "'n_layer' must be an integer from -9223372036854775808 to "
                        "9223372036854775807, got 9223372036854775808");
    json = config_text;
    json["activation_function"] = "relu";
    refused_with_config(json, "activation_function 'relu' is not supported");
    json = config_text;
    json["tie_word_embeddings"] = false;
    refused_with_config(json, "tie_word_embeddings false is not supported for gpt2");
    json = config_text;
    json["n_head"] = 5;
    refused_with_config(json, "n_head 5 must be positive and divide n_embd 16");
    json = config_text;
    json["tokenizer_vocab_size"] = 65;
    refused_with_config(json, "tokenizer_vocab_size 65 exceeds vocab_size 64");
  }
  SUBCASE("not a model directory") {
    CHECK_THROWS_WITH_AS(backend::import_hf(directory.path / "absent"),
                         doctest::Contains("no config.json"), common::Error);
    std::filesystem::remove(dir / "model.safetensors");
    write_text(dir / "pytorch_model.bin", "pickle");
    CHECK_THROWS_WITH_AS(backend::import_hf(dir), doctest::Contains("pickled checkpoints are not read"),
                         common::Error);
    std::filesystem::remove(dir / "pytorch_model.bin");
    CHECK_THROWS_WITH_AS(backend::import_hf(dir),
                         doctest::Contains("neither model.safetensors nor model.safetensors.index.json"),
                         common::Error);
    write_text(dir / "config.json", "{not json");
    CHECK_THROWS_WITH_AS(backend::import_hf(dir), doctest::Contains("config.json is not valid JSON"),
                         common::Error);
  }
}

namespace {

GptConfig tiny_llama_config() {
  GptConfig config = tiny_gpt_config();
  config.position_embedding_type = backend::PositionEmbeddingType::rope;
  config.normalization = backend::Normalization::rms_norm;
  config.swiglu = true;
  config.add_bias_linear = false;
  config.share_embeddings_and_output_weights = false;
  config.rotary_base = 500000;
  config.layernorm_epsilon = 1e-6;
  return config;
}

}  // namespace

TEST_CASE("hf_format: Llama names, shapes and layouts") {
  GptConfig config = tiny_llama_config();
  SUBCASE("multi-head attention") {}
  SUBCASE("grouped-query attention") { config.num_query_groups = 2; }
  const auto model = initialised_model(config);
  const int64_t C = config.hidden_size, F = config.ffn_hidden_size, HD = config.head_dim();
  const int64_t NH = config.num_attention_heads, NG = config.query_groups();
  const auto hf = by_name(backend::to_hf_tensors(config, model.tensors(), model.parameters()));

  std::set<std::string> expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
  for (int layer = 0; layer < 2; ++layer) {
    for (const char* suffix : {"input_layernorm.weight", "self_attn.q_proj.weight",
                               "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                               "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                               "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
      expected.insert(fmt::format("model.layers.{}.{}", layer, suffix));
    }
  }
  std::set<std::string> names;
  for (const auto& [name, tensor] : hf) names.insert(name);
  CHECK(names == expected);
  CHECK(hf.at("model.layers.0.self_attn.q_proj.weight").shape == std::vector<int64_t>{NH * HD, C});
  CHECK(hf.at("model.layers.0.self_attn.k_proj.weight").shape == std::vector<int64_t>{NG * HD, C});
  CHECK(hf.at("model.layers.0.self_attn.v_proj.weight").shape == std::vector<int64_t>{NG * HD, C});
  CHECK(hf.at("model.layers.0.mlp.gate_proj.weight").shape == std::vector<int64_t>{F, C});
  CHECK(hf.at("model.layers.0.mlp.down_proj.weight").shape == std::vector<int64_t>{C, F});

  // Megatron's qkv rows, per query group g: [its NH/NG query heads | key | value], HD rows
  // each (Megatron core's get_query_key_value_tensors); query head j of group g is q_proj
  // rows (g·NH/NG + j)·HD.., the group's key and value k_proj / v_proj rows g·HD...
  // linear_fc1 rows are [gate | up].
  int mismatches = 0;
  const int64_t per_group = NH / NG;
  const auto& q = hf.at("model.layers.1.self_attn.q_proj.weight").values;
  const auto& k = hf.at("model.layers.1.self_attn.k_proj.weight").values;
  const auto& v = hf.at("model.layers.1.self_attn.v_proj.weight").values;
  auto qkv = [&](int64_t row, int64_t in) {
    return megatron_value(model, "decoder.layers.1.self_attention.linear_qkv.weight", row * C + in);
  };
  for (int64_t g = 0; g < NG; ++g) {
    const int64_t base = g * (per_group + 2) * HD;
    for (int64_t d = 0; d < HD; ++d) {
      for (int64_t in = 0; in < C; ++in) {
        for (int64_t j = 0; j < per_group; ++j) {
          mismatches += q[static_cast<size_t>(((g * per_group + j) * HD + d) * C + in)] !=
                        qkv(base + j * HD + d, in);
        }
        mismatches += k[static_cast<size_t>((g * HD + d) * C + in)] != qkv(base + per_group * HD + d, in);
        mismatches += v[static_cast<size_t>((g * HD + d) * C + in)] !=
                      qkv(base + (per_group + 1) * HD + d, in);
      }
    }
  }
  const auto& gate = hf.at("model.layers.0.mlp.gate_proj.weight").values;
  const auto& up = hf.at("model.layers.0.mlp.up_proj.weight").values;
  for (int64_t i = 0; i < F * C; ++i) {
    mismatches += gate[static_cast<size_t>(i)] != megatron_value(model, "decoder.layers.0.mlp.linear_fc1.weight", i);
    mismatches += up[static_cast<size_t>(i)] !=
                  megatron_value(model, "decoder.layers.0.mlp.linear_fc1.weight", F * C + i);
  }
  for (const auto& [megatron, hf_name] : std::vector<std::pair<std::string, std::string>>{
           {"embedding.word_embeddings.weight", "model.embed_tokens.weight"},
           {"output_layer.weight", "lm_head.weight"},
           {"decoder.layers.1.input_layernorm.weight", "model.layers.1.input_layernorm.weight"},
           {"decoder.layers.1.pre_mlp_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"},
           {"decoder.layers.1.self_attention.linear_proj.weight", "model.layers.1.self_attn.o_proj.weight"},
           {"decoder.layers.1.mlp.linear_fc2.weight", "model.layers.1.mlp.down_proj.weight"},
           {"decoder.final_layernorm.weight", "model.norm.weight"}}) {
    const auto& values = hf.at(hf_name).values;
    for (size_t i = 0; i < values.size(); ++i) {
      mismatches += values[i] != megatron_value(model, megatron, static_cast<int64_t>(i));
    }
  }
  CHECK(mismatches == 0);

  const auto json = backend::hf_config_json(config);
  CHECK(json["model_type"] == "llama");
  CHECK(json["architectures"] == nlohmann::ordered_json::array({"LlamaForCausalLM"}));
  CHECK(json["hidden_size"] == C);
  CHECK(json["intermediate_size"] == F);
  CHECK(json["num_attention_heads"] == NH);
  CHECK(json["num_key_value_heads"] == NG);
  CHECK(json["num_hidden_layers"] == 2);
  CHECK(json["rms_norm_eps"] == 1e-6);
  CHECK(json["rope_theta"] == 500000.0);
  CHECK(json["max_position_embeddings"] == 12);
  CHECK(json["vocab_size"] == 64);
  CHECK(json["tokenizer_vocab_size"] == 50);
  CHECK(json["tie_word_embeddings"] == false);
  CHECK(json["hidden_act"] == "silu");
  CHECK(json["attention_bias"] == false);
}

TEST_CASE("hf_format: Llama variants round trip bit for bit") {
  TemporaryDirectory directory;
  GptConfig config = tiny_llama_config();
  SUBCASE("untied, no biases") {}
  SUBCASE("tied") { config.share_embeddings_and_output_weights = true; }
  SUBCASE("with biases") { config.add_bias_linear = true; }
  SUBCASE("grouped-query attention, with biases") {
    config.num_query_groups = 2;
    config.add_bias_linear = true;
  }
  SUBCASE("multi-query attention") { config.num_query_groups = 1; }
  SUBCASE("Llama 3's RoPE scaling") {
    config.rope_scaling = {.factor = 8, .original_max_position_embeddings = 16};
  }
  auto model = initialised_model(config);
  backend::export_hf(directory.path / "hf", model);
  const auto file = backend::read_safetensors(directory.path / "hf" / "model.safetensors");
  std::set<std::string> names;
  for (const auto& tensor : file.tensors) names.insert(tensor.name);
  CHECK(names.contains("lm_head.weight") == !config.share_embeddings_and_output_weights);
  CHECK(names.contains("model.layers.0.self_attn.k_proj.bias") == config.add_bias_linear);
  CHECK(names.contains("model.layers.0.mlp.up_proj.bias") == config.add_bias_linear);

  auto imported = backend::import_hf(directory.path / "hf");
  const GptConfig& back = imported.config();
  CHECK(back.position_embedding_type == config.position_embedding_type);
  CHECK(back.normalization == config.normalization);
  CHECK(back.swiglu == config.swiglu);
  CHECK(back.add_bias_linear == config.add_bias_linear);
  CHECK(back.share_embeddings_and_output_weights == config.share_embeddings_and_output_weights);
  CHECK(back.rotary_base == config.rotary_base);
  CHECK(back.rope_scaling == config.rope_scaling);
  CHECK(back.layernorm_epsilon == config.layernorm_epsilon);
  CHECK(back.ffn_hidden_size == config.ffn_hidden_size);
  CHECK(back.vocab_size == config.vocab_size);
  CHECK(back.query_groups() == config.query_groups());
  REQUIRE(imported.parameters().size() == model.parameters().size());
  CHECK(std::equal(model.parameters().begin(), model.parameters().end(),
                   imported.parameters().begin()));
  const auto tokens = ids(2 * 8, 50, 3), labels = ids(2 * 8, 50, 4);
  CHECK(model.forward(tokens, labels, 2, 8) == imported.forward(tokens, labels, 2, 8));
}

TEST_CASE("hf_format: Llama 3.1's rope_scaling is read, and written as transformers writes it") {
  TemporaryDirectory directory;
  GptConfig config = tiny_llama_config();
  const auto dir = directory.path / "hf";
  backend::export_hf(dir, initialised_model(config));
  auto json = backend::hf_config_json(config);
  CHECK(json["rope_scaling"].is_null());
  // Meta-Llama-3.1-8B's config.json.
  json["rope_scaling"] = {{"factor", 8.0},
                          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192},
                          {"rope_type", "llama3"}};
  write_text(dir / "config.json", json.dump());
  const GptConfig read = backend::import_hf(dir).config();
  CHECK(read.rope_scaling == backend::RopeScaling{.factor = 8});
  const auto written = backend::hf_config_json(read);
  CHECK(written["rope_scaling"]["rope_type"] == "llama3");
  CHECK(written["rope_scaling"]["factor"] == 8.0);
  CHECK(written["rope_scaling"]["original_max_position_embeddings"].is_number_integer());
  CHECK(written["rope_scaling"]["original_max_position_embeddings"] == 8192);
  // Older transformers wrote "type"; "default" is plain RoPE.
  json["rope_scaling"].erase("rope_type");
  json["rope_scaling"]["type"] = "llama3";
  write_text(dir / "config.json", json.dump());
  CHECK(backend::import_hf(dir).config().rope_scaling.factor == 8);
  json["rope_scaling"] = {{"rope_type", "default"}};
  write_text(dir / "config.json", json.dump());
  CHECK_FALSE(backend::import_hf(dir).config().rope_scaling.active());
}

TEST_CASE("hf_format: Llama settings that cannot load, and models with no HF architecture") {
  TemporaryDirectory directory;
  const GptConfig config = tiny_llama_config();
  const auto model = initialised_model(config);
  const auto dir = directory.path / "hf";
  backend::export_hf(dir, model);
  const auto good = backend::hf_config_json(config);
  auto refused = [&](const char* key, const nlohmann::json& value, const char* why) {
    auto json = good;
    json[key] = value;
    write_text(dir / "config.json", json.dump());
    CHECK_THROWS_WITH_AS(backend::import_hf(dir), doctest::Contains(why), common::Error);
  };
  refused("num_key_value_heads", 3, "num_key_value_heads 3 must be positive and divide num_attention_heads 4");
  refused("hidden_act", "gelu", "hidden_act 'gelu' is not supported");
  refused("rope_scaling", {{"type", "linear"}, {"factor", 2.0}},
          "rope_scaling: rope_type 'linear' is not supported (valid: llama3");
  refused("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}, "rope_type 'yarn'");
  refused("rope_scaling", 8, "rope_scaling must be an object or null, got 8");
  refused("rope_scaling",
          {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
           {"high_freq_factor", 4.0}},
          "rope_scaling: missing key 'original_max_position_embeddings'");
  refused("rope_scaling",
          {{"rope_type", "llama3"}, {"factor", "8"}, {"low_freq_factor", 1.0},
           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}},
          "'factor' must be a number, got \"8\"");
  // 0 is refused like 0.5 and -8 (it used to read as "no scaling": plain RoPE, silently).
  for (const double factor : {0.5, 0.0, -8.0}) {
    CAPTURE(factor);
    refused("rope_scaling",
            {{"rope_type", "llama3"}, {"factor", factor}, {"low_freq_factor", 1.0},
             {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}},
            fmt::format("config.json: rope_scaling: factor {} must be a finite number ≥ 1",
                        factor).c_str());
  }
  refused("rope_scaling",
          {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0},
           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}},
          "0 < low_freq_factor < high_freq_factor");
  refused("attention_bias", true, "attention_bias true and mlp_bias false differ");
  refused("head_dim", 8, "head_dim 8 is not hidden_size / num_attention_heads = 4");
  refused("rope_theta", 10000.5, "rope_theta 10000.5 must be a whole number");

  // A saved but tied lm_head must equal embed_tokens.
  auto tied = good;
  tied["tie_word_embeddings"] = true;
  write_text(dir / "config.json", tied.dump());
  CHECK_THROWS_WITH_AS(backend::import_hf(dir),
                       doctest::Contains("lm_head.weight differs from model.embed_tokens.weight"),
                       common::Error);

  GptConfig hybrid = config;
  hybrid.normalization = backend::Normalization::layer_norm;  // RoPE with LayerNorm
  GptModel<float> hybrid_model(hybrid);
  CHECK_THROWS_WITH_AS(backend::export_hf(directory.path / "hybrid", hybrid_model),
                       doctest::Contains("no Hugging Face architecture computes this model"),
                       common::Error);
  GptConfig grouped_gpt = tiny_gpt_config();
  grouped_gpt.num_query_groups = 2;
  GptModel<float> grouped_gpt_model(grouped_gpt);
  CHECK_THROWS_WITH_AS(backend::export_hf(directory.path / "grouped", grouped_gpt_model),
                       doctest::Contains("2 query groups for 4 heads"), common::Error);
  GptConfig partial = config;
  partial.rotary_percent = 0.5;
  GptModel<float> partial_model(partial);
  CHECK_THROWS_WITH_AS(backend::export_hf(directory.path / "partial", partial_model),
                       doctest::Contains("--rotary-percent 1.0"), common::Error);
}

TEST_CASE("hf_format: a config.json whose model cannot be built is refused before the tensors are read") {
  TemporaryDirectory directory;
  const auto dir = directory.path / "hf";
  backend::export_hf(dir, initialised_model(tiny_gpt_config()));
  const auto config_text = backend::hf_config_json(tiny_gpt_config());
  auto refused_with = [&](const char* key, int64_t value, const char* why) {
    auto json = config_text;
    json[key] = value;
    write_text(dir / "config.json", json.dump());
    CHECK_THROWS_WITH_AS(backend::import_hf(dir), doctest::Contains(why), common::Error);
  };
  // A trillion layers, a quadrillion rows: sizes that fit int64 but no machine's memory.
  refused_with("n_layer", 1'000'000'000'000, "does not fit in this machine's memory");
  refused_with("vocab_size", 1'000'000'000'000'000, "does not fit in this machine's memory");
  // Sizes whose products do not fit int64 at all.
  refused_with("n_embd", int64_t{1} << 62, "exceeds 9223372036854775807");
  refused_with("n_inner", INT64_MAX, "exceeds 9223372036854775807");
  refused_with("n_layer", 0, "--num-layers");
}

// Inputs tests/fuzz/hf_config_fuzzer.cpp found, reduced by hand: each ended in an internal
// error (an exception other than common::Error) or undefined behaviour (UBSan).
TEST_CASE("hf_format: fuzz findings: config.json numbers beyond double and int64 ranges") {
  TemporaryDirectory directory;
  auto refused = [&](const GptConfig& config, const std::string& from, const std::string& to,
                     const char* why) {
    const auto dir = directory.path / "hf";
    backend::export_hf(dir, initialised_model(config));
    std::string text = backend::hf_config_json(config).dump();
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    write_text(dir / "config.json", text);
    CHECK_THROWS_WITH_AS(backend::import_hf(dir), doctest::Contains(why), common::Error);
  };
  // nlohmann refuses 1e999 with out_of_range, which is not a parse_error.
  refused(tiny_llama_config(), R"("rope_theta":500000.0)", R"("rope_theta":1e999)",
          "config.json is not valid JSON");
  // Cast to int64 before the whole-number check: undefined for a value beyond int64's range.
  refused(tiny_llama_config(), R"("rope_theta":500000.0)",
          R"("rope_theta":100922337203685477580800.0)", "must be a whole number below 2^63");
  // Without n_inner, transformers' default 4 × n_embd overflowed int64.
  refused(tiny_gpt_config(), R"("n_embd":16,)", R"("n_embd":4611686018427387904,)",
          "exceeds 9223372036854775807");
}
