// NeMo .nemo import and export (the header gives the archive's members, the names and the
// config keys, after NeMo 1.x's save_restore_connector.py, megatron_gpt_model.py and the legacy
// modules of nemo/collections/nlp/modules/common/megatron).
#include "backend/ckpt/nemo_archive.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "backend/ckpt/checkpoint_reshard.hpp"
#include "backend/ckpt/megatron_checkpoint.hpp"
#include "backend/ckpt/tar_archive.hpp"
#include "backend/ckpt/torch_checkpoint.hpp"
#include "backend/ckpt/torch_checkpoint_writer.hpp"
#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/md5.hpp"
#include "backend/common/user_file.hpp"
#include "backend/data/tokenizer.hpp"

namespace backend {

namespace fs = std::filesystem;

namespace {

constexpr const char* kConfigMember = "model_config.yaml";
constexpr const char* kWeightsMember = "model_weights.ckpt";
constexpr const char* kNemoClass =
    "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel";
constexpr const char* kArtifactPrefix = "nemo:";

// ---- the config

// model_config.yaml's values by key ("tokenizer.type" one level down), typed, each refusal
// naming the archive and the key.
class NemoConfig {
 public:
  NemoConfig(YAML::Node root, std::string source)
      : root_(std::move(root)), source_(std::move(source)) {
    if (!root_.IsMap()) common::fail("{}: {} is not a mapping", source_, kConfigMember);
  }

  // The node under `key`, nullopt when absent or null.
  std::optional<YAML::Node> find(std::string_view key) const {
    // Read-only walk: a const node's operator[] adds no key, and reset() rebinds the handle
    // without assigning into the config (yaml-cpp's operator= would), so nothing is copied.
    YAML::Node node;
    node.reset(root_);
    size_t start = 0;
    while (true) {
      const size_t dot = key.find('.', start);
      const std::string part(key.substr(start, dot - start));
      if (!node.IsMap()) return std::nullopt;
      const YAML::Node child = std::as_const(node)[part];
      if (!child.IsDefined() || child.IsNull()) return std::nullopt;
      node.reset(child);
      if (dot == std::string_view::npos) return node;
      start = dot + 1;
    }
  }

  template <typename T>
  T get(std::string_view key, std::string_view what) const {
    const std::optional<YAML::Node> node = find(key);
    if (!node) common::fail("{}: {} has no {}", source_, kConfigMember, key);
    return as<T>(*node, key, what);
  }
  template <typename T>
  T get_or(std::string_view key, T fallback, std::string_view what) const {
    const std::optional<YAML::Node> node = find(key);
    return node ? as<T>(*node, key, what) : fallback;
  }
  [[noreturn]] void invalid(std::string_view key, std::string_view value,
                            std::string_view valid) const {
    common::fail("{}: {}'s {} '{}' is not one this backend builds (valid: {})", source_,
                 kConfigMember, key, value, valid);
  }

 private:
  template <typename T>
  T as(const YAML::Node& node, std::string_view key, std::string_view what) const {
    try {
      if (!node.IsScalar()) throw YAML::Exception(node.Mark(), "not a scalar");
      return node.as<T>();
    } catch (const YAML::Exception&) {
      common::fail("{}: {}'s {} is not {}", source_, kConfigMember, key, what);
    }
  }

  YAML::Node root_;
  std::string source_;
};

// NeMo's normalization names in lower case (its configs write LayerNorm and layernorm).
std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// An artifact the config names ("nemo:<32 hex>_<file>"), extracted into `directory`; its path.
fs::path extract_artifact(const TarArchive& archive, const std::string& reference,
                          const fs::path& directory, std::string_view key) {
  if (!reference.starts_with(kArtifactPrefix)) {
    common::fail(
        "{}: {}'s {} '{}' is not one of the archive's files (nemo:NAME); a path outside "
        "the archive is not read",
        archive.source(), kConfigMember, key, reference);
  }
  const std::string member = reference.substr(std::string_view(kArtifactPrefix).size());
  if (!archive.has(member)) {
    common::fail("{}: {}'s {} names '{}', which the archive does not hold", archive.source(),
                 kConfigMember, key, member);
  }
  // NeMo's artifact names are <uuid hex>_<the file's own name>: the file keeps its own.
  const size_t underscore = member.find('_');
  const std::string name = underscore == 32 ? member.substr(33) : member;
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    common::fail("{}: artifact '{}' has no file name to extract it under", archive.source(),
                 member);
  }
  fs::create_directories(directory);
  const fs::path path = fs::absolute(directory / name);
  const std::span<const std::byte> bytes = archive.member(member);
  common::write_text_file_atomically(
      path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  return path;
}

// A tokenizer file the config names: its key, the archive's reference to it, and the flag that
// takes it (empty: --tokenizer-model, which the record holds).
struct TokenizerArtifact {
  std::string key, reference, flag;
};

// The record of the model and tokenizer the config describes (tensor-parallel size 1), and the
// tokenizer files to extract.
CheckpointModelRecord record_from_config(const NemoConfig& config, const TarArchive& archive,
                                         std::vector<TokenizerArtifact>& artifacts) {
  if (config.get_or<bool>("mcore_gpt", false, "true or false")) {
    common::fail(
        "{}: it holds a Megatron core model (mcore_gpt: true), whose weights NeMo saves "
        "as a distributed checkpoint (model_weights/), which is not read yet",
        archive.source());
  }
  CheckpointModelRecord record;
  ModelArguments& model = record.model;
  const char* integer = "an integer";
  const char* number = "a number";
  const char* boolean = "true or false";
  const char* text = "a string";
  model.num_layers = config.get<int64_t>("num_layers", integer);
  model.hidden_size = config.get<int64_t>("hidden_size", integer);
  model.num_attention_heads = config.get<int64_t>("num_attention_heads", integer);
  model.ffn_hidden_size = config.get_or<int64_t>("ffn_hidden_size", 4 * model.hidden_size, integer);
  model.seq_length = config.get<int64_t>("encoder_seq_length", integer);
  model.max_position_embeddings =
      config.get_or<int64_t>("max_position_embeddings", model.seq_length, integer);
  model.make_vocab_size_divisible_by =
      config.get_or<int64_t>("make_vocab_size_divisible_by", 128, integer);
  model.init_method_std = config.get_or<double>("init_method_std", 0.02, number);
  model.hidden_dropout = config.get_or<double>("hidden_dropout", 0.1, number);
  model.attention_dropout = config.get_or<double>("attention_dropout", 0.1, number);
  model.norm_epsilon = config.get_or<double>("layernorm_epsilon", 1e-5, number);
  if (model.num_attention_heads > 0 &&
      config.get_or<int64_t>("kv_channels", model.hidden_size / model.num_attention_heads,
                             integer) != model.hidden_size / model.num_attention_heads) {
    config.invalid("kv_channels", config.get<std::string>("kv_channels", text),
                   "null, or hidden_size / num_attention_heads");
  }
  const int64_t groups =
      config.get_or<int64_t>("num_query_groups", model.num_attention_heads, integer);
  if (groups != model.num_attention_heads) {
    model.group_query_attention = true;
    model.num_query_groups = groups;
  }
  const std::string normalization =
      lower(config.get_or<std::string>("normalization", "layernorm", text));
  if (normalization == "rmsnorm") {
    model.normalization = Normalization::rms_norm;
  } else if (normalization == "layernorm1p") {
    model.apply_layernorm_1p = true;
  } else if (normalization != "layernorm") {
    config.invalid("normalization", normalization, "layernorm, layernorm1p, rmsnorm");
  }
  if (config.get_or<bool>("layernorm_zero_centered_gamma", false, boolean)) {
    model.apply_layernorm_1p = true;
  }
  const std::string activation = config.get_or<std::string>("activation", "gelu", text);
  if (activation == "swiglu" || activation == "fast-swiglu") {
    model.swiglu = true;
  } else if (activation != "gelu") {
    config.invalid("activation", activation, "gelu, swiglu, fast-swiglu");
  }
  model.add_bias_linear = config.get_or<bool>("bias", true, boolean);
  const std::string position =
      config.get_or<std::string>("position_embedding_type", "learned_absolute", text);
  if (position == "rope") {
    model.position_embedding_type = PositionEmbeddingType::rope;
    model.rotary_base = config.get_or<int64_t>("rotary_base", 10000, integer);
    model.rotary_percent = config.get_or<double>("rotary_percentage", 1.0, number);
  } else if (position != "learned_absolute") {
    config.invalid("position_embedding_type", position, "learned_absolute, rope");
  }
  model.untie_embeddings_and_output_weights =
      !config.get_or<bool>("share_embeddings_and_output_weights", true, boolean);
  record.parallelism.tensor_model_parallel_size = 1;
  record.parallelism.pipeline_model_parallel_size = 1;

  // The tokenizer: NeMo's library and type to Megatron's type (the launcher's rule).
  TokenizerOptions& tokenizer = record.tokenizer;
  const std::string library = config.get_or<std::string>("tokenizer.library", "megatron", text);
  const std::optional<std::string> type =
      config.find("tokenizer.type") ? std::optional(config.get<std::string>("tokenizer.type", text))
                                    : std::nullopt;
  if (library == "megatron") {
    if (!type) common::fail("{}: {} has no tokenizer.type", archive.source(), kConfigMember);
    tokenizer.tokenizer_type = *type;
    if (*type == "NullTokenizer") {
      tokenizer.vocab_size = config.get<int64_t>("tokenizer.vocab_size", integer);
    }
    for (const auto& [key, flag] : {std::pair{"tokenizer.vocab_file", "--vocab-file"},
                                    std::pair{"tokenizer.merge_file", "--merge-file"}}) {
      if (config.find(key)) artifacts.push_back({key, config.get<std::string>(key, text), flag});
    }
  } else if (library == "sentencepiece") {
    tokenizer.tokenizer_type = type ? *type : "GPTSentencePieceTokenizer";
    artifacts.push_back({"tokenizer.model", config.get<std::string>("tokenizer.model", text), ""});
  } else if (library == "huggingface") {
    if (!type) common::fail("{}: {} has no tokenizer.type", archive.source(), kConfigMember);
    tokenizer.tokenizer_type = "HuggingFaceTokenizer";
    tokenizer.tokenizer_model = *type;
  } else {
    config.invalid("tokenizer.library", library, "megatron, sentencepiece, huggingface");
  }
  return record;
}

// ---- the weights

// This backend's name of a NeMo state-dict key, and whether it is SwiGLU's up projection
// (dense_h_to_4h_2, the second half of linear_fc1); nullopt for what is not a weight.
struct WeightName {
  std::string name;
  bool up_projection = false;
};

std::optional<WeightName> weight_name(std::string_view key, const std::string& source) {
  for (std::string_view prefix : {"model.module.", "model."}) {
    if (key.starts_with(prefix)) {
      key.remove_prefix(prefix.size());
      break;
    }
  }
  if (key.ends_with("._extra_state") || key == "language_model.rotary_pos_emb.inv_freq") {
    return std::nullopt;
  }
  constexpr std::string_view kUp = ".mlp.dense_h_to_4h_2.";
  if (const size_t at = key.find(kUp); at != std::string_view::npos) {
    std::string gate(key);
    gate.replace(at, kUp.size(), ".mlp.dense_h_to_4h.");
    const std::optional<std::string> name = megatron_tensor_name(gate, 0, source);
    if (!name) return std::nullopt;
    return WeightName{*name, true};
  }
  const std::optional<std::string> name = megatron_tensor_name(key, 0, source);
  if (!name) return std::nullopt;
  return WeightName{*name, false};
}

}  // namespace

NemoImport import_nemo(const fs::path& path, const fs::path& artifact_directory) {
  const TarArchive archive(path);
  if (!archive.has(kConfigMember)) {
    common::fail("{}: it has no {}: not a .nemo archive", archive.source(), kConfigMember);
  }
  const std::span<const std::byte> config_bytes = archive.member(kConfigMember);
  YAML::Node root;
  try {
    root = YAML::Load(
        std::string(reinterpret_cast<const char*>(config_bytes.data()), config_bytes.size()));
  } catch (const YAML::Exception& error) {
    common::fail("{}: {} is not YAML: {}", archive.source(), kConfigMember, error.what());
  }
  const NemoConfig config(root, archive.source());
  std::vector<TokenizerArtifact> artifacts;
  CheckpointModelRecord record = record_from_config(config, archive, artifacts);
  if (!archive.has(kWeightsMember)) {
    for (const std::string& name : archive.names()) {
      if (name.ends_with("/" + std::string(kWeightsMember))) {
        common::fail(
            "{}: its weights are one file per model-parallel rank ({}), which is not "
            "read yet: NeMo's megatron_change_num_partitions.py writes a .nemo at "
            "tensor- and pipeline-parallel size 1",
            archive.source(), name);
      }
    }
    common::fail("{}: it has no {}", archive.source(), kWeightsMember);
  }
  // The tokenizer's files, which model_config reads (a SentencePiece model's vocabulary).
  std::vector<std::string> tokenizer_flags;
  for (const TokenizerArtifact& artifact : artifacts) {
    const fs::path path =
        extract_artifact(archive, artifact.reference, artifact_directory, artifact.key);
    if (artifact.flag.empty()) {
      record.tokenizer.tokenizer_model = path.string();
    } else {
      tokenizer_flags.insert(tokenizer_flags.end(), {artifact.flag, path.string()});
    }
  }
  const std::string weights_source = fmt::format("{}: {}", archive.source(), kWeightsMember);
  const TorchCheckpointFile weights(archive.member(kWeightsMember), weights_source);
  const PickleValue& state = weights.root();
  if (state.kind != PickleKind::dict) common::fail("{}: it is not a state dict", weights_source);
  // Each tensor by this backend's name; SwiGLU's halves apart.
  std::map<std::string, std::pair<const PickleValue*, const PickleValue*>, std::less<>> found;
  for (const auto& [key, value] : state.entries) {
    if (key->kind != PickleKind::text) {
      common::fail("{}: it has a key that is not a string", weights_source);
    }
    const std::optional<WeightName> name = weight_name(key->text, weights_source);
    if (!name) continue;
    if (!TorchCheckpointFile::is_tensor(*value)) {
      common::fail("{}: '{}' is not a tensor", weights_source, key->text);
    }
    auto& slot = found[name->name];
    (name->up_projection ? slot.second : slot.first) = value.get();
  }

  // The padded vocabulary is the file's: the rows NeMo padded at the training's size.
  GptConfig gpt = model_config(record);
  if (const auto embedding = found.find("embedding.word_embeddings.weight");
      embedding != found.end() && embedding->second.first != nullptr) {
    const TorchTensor tensor = weights.tensor(*embedding->second.first, "the word embedding");
    if (!tensor.shape.empty() && tensor.shape[0] != gpt.padded_vocab_size) {
      const int64_t divisor = divisor_keeping_padding(
          gpt.vocab_size, tensor.shape[0], record.model.make_vocab_size_divisible_by, 1, 1);
      if (divisor == 0) {
        common::fail(
            "{}: the word embedding has {} rows, which no padding of the tokenizer's {} "
            "entries gives",
            weights_source, tensor.shape[0], gpt.vocab_size);
      }
      record.model.make_vocab_size_divisible_by = divisor;
      gpt = model_config(record);
    }
  }
  GptModel<float> model(gpt);
  std::vector<float> values(static_cast<size_t>(model.parameter_buffer().numel));
  for (const ParameterTensor& tensor : model.tensors()) {
    const auto slot = found.find(tensor.name);
    const bool split = model.config().swiglu && (tensor.name.ends_with("mlp.linear_fc1.weight") ||
                                                 tensor.name.ends_with("mlp.linear_fc1.bias"));
    if (slot == found.end() || slot->second.first == nullptr) {
      common::fail(
          "{}: it has no tensor for this backend's '{}' (its config describes a model "
          "that has one)",
          weights_source, tensor.name);
    }
    // Under SwiGLU, dense_h_to_4h (the gate) and dense_h_to_4h_2 (the up projection); NeMo's
    // fast-swiglu keeps both in dense_h_to_4h already.
    std::vector<const PickleValue*> parts = {slot->second.first};
    if (split && slot->second.second != nullptr) parts.push_back(slot->second.second);
    std::vector<double> joined;
    int64_t rows = 0;
    for (const PickleValue* part : parts) {
      const TorchTensor read = weights.tensor(*part, tensor.name);
      const std::vector<double> part_values = weights.tensor_values(read);
      joined.insert(joined.end(), part_values.begin(), part_values.end());
      rows += read.shape.empty() ? 1 : read.shape[0];
      std::vector<int64_t> expected = tensor.shape;
      if (read.shape.size() != expected.size() ||
          !std::equal(read.shape.begin() + 1, read.shape.end(), expected.begin() + 1)) {
        common::fail("{}: '{}' has the shape [{}], where this backend's '{}' is [{}]",
                     weights_source, tensor.name, fmt::join(read.shape, ", "), tensor.name,
                     fmt::join(expected, ", "));
      }
    }
    if (static_cast<int64_t>(joined.size()) != tensor.numel || rows != tensor.shape[0]) {
      common::fail(
          "{}: the tensor(s) for '{}' hold {} elements in {} rows, where its shape is "
          "[{}]{}",
          weights_source, tensor.name, joined.size(), rows, fmt::join(tensor.shape, ", "),
          split && parts.size() == 1 ? " (no dense_h_to_4h_2 for SwiGLU's up projection)" : "");
    }
    std::transform(joined.begin(), joined.end(), values.begin() + tensor.offset,
                   [](double value) { return static_cast<float>(value); });
    found.erase(slot);
  }
  if (!found.empty()) {
    common::fail("{}: its '{}' is not a tensor of the model its config describes", weights_source,
                 found.begin()->first);
  }
  model.copy_parameters_from_host(values);
  return {.record = std::move(record),
          .model = std::move(model),
          .tokenizer_flags = std::move(tokenizer_flags)};
}

// ---- export

namespace {

// A 32-hex-digit artifact prefix, as NeMo's uuid4().hex, made from the file's content so that
// an export is reproducible.
std::string artifact_name(std::span<const std::byte> bytes, const std::string& file_name) {
  return common::md5_hex(
             std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())) +
         "_" + file_name;
}

YAML::Node config_of(const CheckpointModelRecord& record, const GptConfig& gpt,
                     const NemoTokenizerFiles& files,
                     std::vector<std::pair<std::string, fs::path>>& artifacts) {
  const ModelArguments& model = record.model;
  YAML::Node config;
  config["mcore_gpt"] = false;
  config["tensor_model_parallel_size"] = 1;
  config["pipeline_model_parallel_size"] = 1;
  config["encoder_seq_length"] = model.seq_length;
  config["max_position_embeddings"] =
      model.max_position_embeddings > 0 ? model.max_position_embeddings : model.seq_length;
  config["num_layers"] = model.num_layers;
  config["hidden_size"] = model.hidden_size;
  config["ffn_hidden_size"] = gpt.ffn_hidden_size;
  config["num_attention_heads"] = model.num_attention_heads;
  // Keys of later NeMo versions only where they say something (23.x has neither).
  if (model.group_query_attention) config["num_query_groups"] = model.num_query_groups;
  config["init_method_std"] = model.init_method_std;
  config["hidden_dropout"] = model.hidden_dropout;
  config["attention_dropout"] = model.attention_dropout;
  config["kv_channels"] = YAML::Node(YAML::NodeType::Null);
  config["apply_query_key_layer_scaling"] = false;
  config["normalization"] = model.normalization == Normalization::rms_norm ? "rmsnorm"
                            : model.apply_layernorm_1p                     ? "layernorm1p"
                                                                           : "layernorm";
  config["layernorm_epsilon"] = model.norm_epsilon;
  config["make_vocab_size_divisible_by"] = model.make_vocab_size_divisible_by;
  config["pre_process"] = true;
  config["post_process"] = true;
  config["bias"] = model.add_bias_linear;
  config["activation"] = model.swiglu ? "swiglu" : "gelu";
  config["position_embedding_type"] =
      model.position_embedding_type == PositionEmbeddingType::rope ? "rope" : "learned_absolute";
  config["rotary_percentage"] = model.rotary_percent;
  if (model.rotary_base != 10000) config["rotary_base"] = model.rotary_base;
  config["share_embeddings_and_output_weights"] = !model.untie_embeddings_and_output_weights;
  YAML::Node tokenizer;
  const TokenizerOptions& options = record.tokenizer;
  const YAML::Node null(YAML::NodeType::Null);
  // A file packed in as NeMo packs its artifacts, and the config's reference to it.
  auto pack = [&](const fs::path& file) {
    const common::MappedFile mapped(file, "tokenizer file");
    const std::string name = artifact_name(mapped.bytes(), file.filename().string());
    artifacts.emplace_back(name, file);
    return YAML::Node(kArtifactPrefix + name);
  };
  if (is_sentencepiece_type(options.tokenizer_type)) {
    tokenizer["library"] = "sentencepiece";
    tokenizer["type"] = options.tokenizer_type == "GPTSentencePieceTokenizer"
                            ? null
                            : YAML::Node(options.tokenizer_type);
    tokenizer["model"] = pack(options.tokenizer_model);
  } else if (options.tokenizer_type == "HuggingFaceTokenizer") {
    tokenizer["library"] = "huggingface";
    tokenizer["type"] = options.tokenizer_model;
    tokenizer["model"] = null;
  } else {
    tokenizer["library"] = "megatron";
    tokenizer["type"] = options.tokenizer_type;
    tokenizer["model"] = null;
    if (options.tokenizer_type == "NullTokenizer") tokenizer["vocab_size"] = options.vocab_size;
  }
  tokenizer["vocab_file"] = files.vocab_file.empty() ? null : pack(files.vocab_file);
  tokenizer["merge_file"] = files.merge_file.empty() ? null : pack(files.merge_file);
  tokenizer["delimiter"] = null;
  tokenizer["sentencepiece_legacy"] = false;
  config["tokenizer"] = tokenizer;
  config["precision"] = 32;
  config["megatron_amp_O2"] = false;
  config["target"] = kNemoClass;
  config["nemo_version"] = "1.20.0";
  return config;
}

// The legacy model's name of this backend's tensor `name` (without "model.").
std::string legacy_name(const std::string& name) {
  constexpr std::pair<std::string_view, std::string_view> kLayer[] = {
      {"input_layernorm.", "input_layernorm."},
      {"self_attention.linear_qkv.", "self_attention.query_key_value."},
      {"self_attention.linear_proj.", "self_attention.dense."},
      {"pre_mlp_layernorm.", "post_attention_layernorm."},
      {"mlp.linear_fc1.", "mlp.dense_h_to_4h."},
      {"mlp.linear_fc2.", "mlp.dense_4h_to_h."}};
  if (name.starts_with("embedding.")) return "language_model." + name;
  if (name.starts_with("decoder.final_layernorm.")) {
    return "language_model.encoder.final_layernorm." +
           name.substr(std::string_view("decoder.final_layernorm.").size());
  }
  if (name == "output_layer.weight") return "language_model.output_layer.weight";
  constexpr std::string_view kLayers = "decoder.layers.";
  if (name.starts_with(kLayers)) {
    const size_t dot = name.find('.', kLayers.size());
    const std::string index = name.substr(kLayers.size(), dot - kLayers.size());
    const std::string rest = name.substr(dot + 1);
    for (const auto& [ours, theirs] : kLayer) {
      if (rest.starts_with(ours)) {
        return fmt::format("language_model.encoder.layers.{}.{}{}", index, theirs,
                           rest.substr(ours.size()));
      }
    }
  }
  common::fail("internal error: no NeMo name for '{}'", name);
}

}  // namespace

void export_nemo(const fs::path& archive, const GptModel<float>& model,
                 const CheckpointModelRecord& record, const NemoTokenizerFiles& files) {
  const GptConfig& gpt = model.config();
  std::vector<std::pair<std::string, fs::path>> artifacts;
  const YAML::Node config = config_of(record, gpt, files, artifacts);
  YAML::Emitter emitter;
  emitter << config;
  const std::string config_text = std::string(emitter.c_str()) + "\n";

  std::vector<float> values(static_cast<size_t>(model.parameter_buffer().numel));
  model.copy_parameters_to_host(values);
  const std::span<const float> all(values);
  TorchValue state = TorchValue::ordered_dict();
  auto add = [&](const std::string& name, std::vector<int64_t> shape, std::span<const float> data) {
    state.set("model." + name,
              TorchValue::tensor(TorchDtype::float32, std::move(shape), std::as_bytes(data)));
  };
  const std::vector<ParameterTensor>& tensors = model.tensors();
  for (const ParameterTensor& tensor : tensors) {
    const std::span<const float> data =
        all.subspan(static_cast<size_t>(tensor.offset), static_cast<size_t>(tensor.numel));
    const std::string name = legacy_name(tensor.name);
    if (gpt.swiglu && (tensor.name.ends_with("mlp.linear_fc1.weight") ||
                       tensor.name.ends_with("mlp.linear_fc1.bias"))) {
      // NeMo's legacy MLP: the gate in dense_h_to_4h, the up projection in dense_h_to_4h_2.
      std::vector<int64_t> half = tensor.shape;
      half[0] /= 2;
      const size_t half_numel = data.size() / 2;
      add(name, half, data.first(half_numel));
      std::string up = name;
      up.replace(up.find("dense_h_to_4h"), std::string_view("dense_h_to_4h").size(),
                 "dense_h_to_4h_2");
      add(up, half, data.subspan(half_numel));
    } else {
      add(name, tensor.shape, data);
    }
    // RoPE's inverse frequencies, NeMo's persistent buffer, after the embedding (the
    // language model registers rotary_pos_emb before the encoder).
    if (tensor.name == "embedding.word_embeddings.weight" &&
        gpt.position_embedding_type == PositionEmbeddingType::rope) {
      // NeMo's language model: kv_channels, times rotary_percentage when below 1.
      const int64_t head = gpt.hidden_size / gpt.num_attention_heads;
      const auto dim =
          static_cast<int64_t>(record.model.rotary_percent < 1.0
                                   ? static_cast<double>(head) * record.model.rotary_percent
                                   : static_cast<double>(head));
      std::vector<float> inverse;
      for (int64_t i = 0; i < dim; i += 2) {
        const float exponent = static_cast<float>(i) / static_cast<float>(dim);
        inverse.push_back(1.0f / std::pow(static_cast<float>(record.model.rotary_base), exponent));
      }
      state.set("model.language_model.rotary_pos_emb.inv_freq",
                TorchValue::tensor_from_floats(TorchDtype::float32,
                                               {static_cast<int64_t>(inverse.size())}, inverse));
    }
  }

  // The weights file is written beside the archive, packed, and removed.
  const fs::path scratch = fs::absolute(archive).parent_path() /
                           fmt::format(".{}.tmp-{}", archive.filename().string(), ::getpid());
  fs::create_directories(scratch);
  try {
    const fs::path weights_file = scratch / kWeightsMember;
    write_torch_checkpoint(weights_file, state);
    const common::MappedFile weights(weights_file, "weights");
    std::vector<common::MappedFile> artifact_files;
    for (const auto& [name, file] : artifacts) artifact_files.emplace_back(file, "tokenizer file");
    std::vector<TarMember> members = {
        {kConfigMember, std::as_bytes(std::span(config_text.data(), config_text.size()))},
        {kWeightsMember, weights.bytes()}};
    for (size_t i = 0; i < artifacts.size(); ++i) {
      members.push_back({artifacts[i].first, artifact_files[i].bytes()});
    }
    write_tar_archive(archive, members);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(scratch, ignored);
    throw;
  }
  fs::remove_all(scratch);
}

}  // namespace backend
