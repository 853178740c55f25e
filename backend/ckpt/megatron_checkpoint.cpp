// Megatron-LM's legacy checkpoints: the layout, the args and the tensors' names (the header
// says what each is, and from which of Megatron's functions).
#include "backend/ckpt/megatron_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <utility>

#include "backend/ckpt/megatron_dist_checkpoint.hpp"
#include "backend/ckpt/megatron_optimizer.hpp"
#include "backend/common/enum_names.hpp"
#include "backend/common/error.hpp"
#include "backend/model/pipeline_stage.hpp"

namespace fs = std::filesystem;

namespace backend {

namespace {

// mp_rank_TT, mp_rank_TT_PPP and mp_rank_TT_PPP_EEE (expert parallelism) as numbers; nullopt for
// another name.
struct RankDirectoryName {
  int64_t tensor_rank = 0;
  std::optional<int64_t> pipeline_rank;
  bool expert = false;
};
std::optional<RankDirectoryName> parse_rank_directory(std::string_view name) {
  constexpr std::string_view prefix = "mp_rank_";
  if (!name.starts_with(prefix)) return std::nullopt;
  name.remove_prefix(prefix.size());
  std::vector<int64_t> numbers;
  const std::vector<size_t> widths = {2, 3, 3};
  for (size_t part = 0; !name.empty(); ++part) {
    if (part > 0) {
      if (name.front() != '_') return std::nullopt;
      name.remove_prefix(1);
    }
    if (part >= widths.size() || name.size() < widths[part]) return std::nullopt;
    int64_t value = 0;
    const char* end = name.data() + widths[part];
    const auto [at, error] = std::from_chars(name.data(), end, value);
    if (error != std::errc() || at != end) return std::nullopt;
    numbers.push_back(value);
    name.remove_prefix(widths[part]);
  }
  if (numbers.empty()) return std::nullopt;
  RankDirectoryName parsed;
  parsed.tensor_rank = numbers[0];
  if (numbers.size() > 1) parsed.pipeline_rank = numbers[1];
  parsed.expert = numbers.size() > 2;
  return parsed;
}

// The legacy model's per-layer names → core's local spec. Its norms were *_layernorm until
// September 2023 and *_norm after; its attention was "attention" in the oldest files.
constexpr std::pair<std::string_view, std::string_view> kLegacyLayerNames[] = {
    {"input_layernorm.", "input_layernorm."},
    {"input_norm.", "input_layernorm."},
    {"self_attention.query_key_value.", "self_attention.linear_qkv."},
    {"attention.query_key_value.", "self_attention.linear_qkv."},
    {"self_attention.dense.", "self_attention.linear_proj."},
    {"attention.dense.", "self_attention.linear_proj."},
    {"post_attention_layernorm.", "pre_mlp_layernorm."},
    {"post_attention_norm.", "pre_mlp_layernorm."},
    {"mlp.dense_h_to_4h.", "mlp.linear_fc1."},
    {"mlp.dense_4h_to_h.", "mlp.linear_fc2."},
};
// The legacy model's names outside its layers → core's ('transformer' was the encoder's key in
// the oldest files).
constexpr std::pair<std::string_view, std::string_view> kLegacyNames[] = {
    {"language_model.embedding.", "embedding."},
    {"language_model.encoder.final_norm.", "decoder.final_layernorm."},
    {"language_model.encoder.final_layernorm.", "decoder.final_layernorm."},
    {"language_model.transformer.final_norm.", "decoder.final_layernorm."},
    {"language_model.transformer.final_layernorm.", "decoder.final_layernorm."},
    {"language_model.output_layer.", "output_layer."},
    {"word_embeddings_for_head.", "output_layer."},
};
// Transformer Engine's fused norms (core's TE spec) → the local spec's norms.
constexpr std::pair<std::string_view, std::string_view> kTransformerEngineNames[] = {
    {"self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
    {"self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"},
    {"mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"},
    {"mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias"},
};

// `name` with the first of `table`'s prefixes it starts with replaced; nullopt when none.
template <size_t Rows>
std::optional<std::string> with_prefix_renamed(
    std::string_view name, const std::pair<std::string_view, std::string_view> (&table)[Rows]) {
  for (const auto& [from, to] : table) {
    if (name.starts_with(from)) return std::string(to) + std::string(name.substr(from.size()));
  }
  return std::nullopt;
}

// "N.rest" of a layer's name as N and rest; nullopt when it does not start with a number.
std::optional<std::pair<int64_t, std::string_view>> split_layer(std::string_view name) {
  int64_t layer = 0;
  const auto [at, error] = std::from_chars(name.data(), name.data() + name.size(), layer);
  if (error != std::errc() || at == name.data() || at == name.data() + name.size() || *at != '.') {
    return std::nullopt;
  }
  return std::pair{layer, name.substr(static_cast<size_t>(at - name.data()) + 1)};
}

[[noreturn]] void unknown_tensor(std::string_view name, std::string_view source) {
  common::fail(
      "{}: the tensor '{}' is not one of a GPT's in Megatron core's naming (embedding.*, "
      "decoder.layers.N.*, decoder.final_layernorm.*, output_layer.*) or the legacy model's "
      "(language_model.embedding.*, language_model.encoder.*, word_embeddings_for_head.*)",
      source, name);
}

void flatten_into(const PickleValue& dict, const std::string& prefix,
                  std::vector<std::pair<std::string, const PickleValue*>>& out) {
  for (const auto& [key, value] : dict.entries) {
    if (key == nullptr || key->kind != PickleKind::text || value == nullptr) continue;
    const std::string name = prefix.empty() ? key->text : prefix + "." + key->text;
    if (value->kind == PickleKind::dict) {
      flatten_into(*value, name, out);
    } else if (TorchCheckpointFile::is_tensor(*value)) {
      out.emplace_back(name, value.get());
    }
  }
}

}  // namespace

fs::path MegatronCheckpointLayout::rank_file(int64_t tensor_parallel_rank,
                                             int64_t pipeline_rank) const {
  if (distributed) return iteration_directory / kMegatronCommonFile;
  return iteration_directory /
         checkpoint_rank_directory_name(tensor_parallel_rank, pipeline_rank, pipeline_parallel) /
         kMegatronCheckpointFile;
}

bool is_megatron_checkpoint(const fs::path& directory) {
  const std::optional<TrackedCheckpoint> tracked = read_checkpoint_tracker(directory);
  if (!tracked) return false;
  const fs::path iteration = tracked->file.parent_path().parent_path();
  if (is_megatron_dist_directory(iteration)) return true;
  return fs::is_regular_file(iteration / checkpoint_rank_directory_name(0) /
                             kMegatronCheckpointFile) ||
         fs::is_regular_file(iteration / checkpoint_rank_directory_name(0, 0, 2) /
                             kMegatronCheckpointFile);
}

MegatronCheckpointLayout read_megatron_layout(const fs::path& directory) {
  const TrackedCheckpoint tracked = [&] {
    const std::optional<TrackedCheckpoint> found = read_checkpoint_tracker(directory);
    if (!found) {
      common::fail("--load {} holds no checkpoint: {} is missing", directory.string(),
                   checkpoint_tracker_path(directory).string());
    }
    return *found;
  }();
  MegatronCheckpointLayout layout;
  layout.directory = directory;
  layout.iteration_directory = tracked.file.parent_path().parent_path();
  layout.iteration = tracked.iteration;
  layout.release = tracked.release;
  std::error_code error;
  if (!fs::is_directory(layout.iteration_directory, error)) {
    common::fail("--load {}: its tracker {} names {}, which is not a directory", directory.string(),
                 checkpoint_tracker_path(directory).string(), layout.iteration_directory.string());
  }
  if (is_megatron_dist_directory(layout.iteration_directory)) {
    read_megatron_dist_layout(layout);
    return layout;
  }
  bool pipelined = false, unpipelined = false;
  int64_t tensor_ranks = 0, stages = 1;
  for (const fs::directory_entry& entry : fs::directory_iterator(layout.iteration_directory)) {
    const std::string name = entry.path().filename().string();
    const std::optional<RankDirectoryName> rank = parse_rank_directory(name);
    if (!rank || !entry.is_directory()) continue;
    if (rank->expert) {
      common::fail(
          "--load {}: {} is the directory of an expert-parallel rank; mixture-of-experts "
          "checkpoints are not read (this backend trains dense GPTs)",
          directory.string(), entry.path().string());
    }
    (rank->pipeline_rank ? pipelined : unpipelined) = true;
    const int64_t stage = rank->pipeline_rank.value_or(0);
    tensor_ranks = std::max(tensor_ranks, rank->tensor_rank + 1);
    stages = std::max(stages, stage + 1);
  }
  if (tensor_ranks == 0) {
    common::fail("--load {}: {} holds no mp_rank_* directory of a Megatron checkpoint",
                 directory.string(), layout.iteration_directory.string());
  }
  if (pipelined && unpipelined) {
    common::fail(
        "--load {}: {} holds rank directories of both of Megatron's namings (mp_rank_TT, "
        "without pipeline stages, and mp_rank_TT_PPP): two checkpoints were mixed up",
        directory.string(), layout.iteration_directory.string());
  }
  if (pipelined && stages == 1) {
    common::fail(
        "--load {}: {} names its only stage mp_rank_TT_000, which Megatron does only with "
        "more than one stage: rename the directories mp_rank_TT",
        directory.string(), layout.iteration_directory.string());
  }
  layout.tensor_parallel = tensor_ranks;
  layout.pipeline_parallel = stages;
  for (int64_t stage = 0; stage < layout.pipeline_parallel; ++stage) {
    for (int64_t rank = 0; rank < layout.tensor_parallel; ++rank) {
      const fs::path file = layout.rank_file(rank, stage);
      if (!fs::is_regular_file(file, error)) {
        common::fail(
            "--load {}: {} is missing: the rank directories span {} tensor-parallel rank(s) "
            "× {} pipeline stage(s), and every one holds a {}",
            directory.string(), file.string(), layout.tensor_parallel, layout.pipeline_parallel,
            kMegatronCheckpointFile);
      }
    }
  }
  return layout;
}

// ---- args

MegatronArguments::MegatronArguments(const PickleValue& args, std::string source)
    : source_(std::move(source)) {
  if (args.kind != PickleKind::object || args.name != "argparse.Namespace" ||
      args.state == nullptr || args.state->kind != PickleKind::dict) {
    common::fail("{}: 'args' is not the argparse.Namespace Megatron saves", source_);
  }
  fields_ = args.state.get();
}

const PickleValue* MegatronArguments::find(std::string_view name) const {
  const PickleValue* value = fields_->find(name);
  return value == nullptr || value->kind == PickleKind::none ? nullptr : value;
}

bool MegatronArguments::has(std::string_view name) const {
  return find(name) != nullptr;
}

const PickleValue* MegatronArguments::require(std::string_view name, PickleKind kind,
                                              const char* what) const {
  const PickleValue* value = find(name);
  if (value == nullptr) {
    common::fail("{}: the args have no {} (or it is None), which the model needs", source_, name);
  }
  const bool integer_as_real = kind == PickleKind::real && value->kind == PickleKind::integer;
  if (value->kind != kind && !integer_as_real) {
    common::fail("{}: args.{} is not {}", source_, name, what);
  }
  return value;
}

int64_t MegatronArguments::integer(std::string_view name) const {
  return require(name, PickleKind::integer, "an integer")->integer;
}
double MegatronArguments::real(std::string_view name) const {
  const PickleValue* value = require(name, PickleKind::real, "a number");
  return value->kind == PickleKind::integer ? static_cast<double>(value->integer) : value->real;
}
bool MegatronArguments::boolean(std::string_view name) const {
  return require(name, PickleKind::boolean, "True or False")->boolean;
}
std::string MegatronArguments::text(std::string_view name) const {
  return require(name, PickleKind::text, "a string")->text;
}
int64_t MegatronArguments::integer_or(std::string_view name, int64_t fallback) const {
  return has(name) ? integer(name) : fallback;
}
double MegatronArguments::real_or(std::string_view name, double fallback) const {
  return has(name) ? real(name) : fallback;
}
bool MegatronArguments::boolean_or(std::string_view name, bool fallback) const {
  return has(name) ? boolean(name) : fallback;
}
std::string MegatronArguments::text_or(std::string_view name, std::string fallback) const {
  return has(name) ? text(name) : std::move(fallback);
}

CheckpointModelRecord megatron_model_record(const MegatronArguments& args) {
  // What the model cannot be here: refused before anything is read.
  auto refuse_when = [&](bool condition, std::string_view what) {
    if (condition) common::fail("{}: the Megatron checkpoint's {}", args.source(), what);
  };
  refuse_when(args.integer_or("num_experts", 0) > 1,
              "args.num_experts: mixture-of-experts models are not built by this backend");
  refuse_when(args.integer_or("mtp_num_layers", 0) > 0,
              "args.mtp_num_layers: multi-token prediction layers are not built by this backend");
  refuse_when(
      args.has("decoder_first_pipeline_num_layers") || args.has("decoder_last_pipeline_num_layers"),
      "args.decoder_first/last_pipeline_num_layers: uneven pipeline stages are not read; "
      "every stage holds the same number of layers here");
  refuse_when(args.boolean_or("add_qkv_bias", false) && !args.boolean_or("add_bias_linear", true),
              "args.add_qkv_bias without the other linear biases (Qwen's layout) is not built by "
              "this backend");
  refuse_when(args.boolean_or("qk_layernorm", false),
              "args.qk_layernorm: query/key norms are not built by this backend");

  CheckpointModelRecord record;
  ModelArguments& m = record.model;
  m.num_layers = args.integer("num_layers");
  m.hidden_size = args.integer("hidden_size");
  m.num_attention_heads = args.integer("num_attention_heads");
  m.ffn_hidden_size = args.integer("ffn_hidden_size");
  m.seq_length = args.integer("seq_length");
  m.max_position_embeddings = args.integer_or("max_position_embeddings", m.seq_length);
  m.make_vocab_size_divisible_by = args.integer_or("make_vocab_size_divisible_by", 128);
  m.init_method_std = args.real_or("init_method_std", m.init_method_std);
  // --norm-epsilon is args.norm_epsilon until 2026, args.layernorm_epsilon (TransformerConfig's
  // name) since.
  m.norm_epsilon = args.real_or("norm_epsilon", args.real_or("layernorm_epsilon", m.norm_epsilon));
  m.hidden_dropout = args.real_or("hidden_dropout", m.hidden_dropout);
  m.attention_dropout = args.real_or("attention_dropout", m.attention_dropout);
  m.position_embedding_type = common::enum_from_name_or_fail<PositionEmbeddingType>(
      args.text_or("position_embedding_type", "learned_absolute"),
      args.source() + ": the Megatron checkpoint's args.position_embedding_type");
  m.rotary_base = args.integer_or("rotary_base", m.rotary_base);
  m.rotary_percent = args.real_or("rotary_percent", m.rotary_percent);
  m.use_rope_scaling = args.boolean_or("use_rope_scaling", false);
  m.rope_scaling_factor = args.real_or("rope_scaling_factor", m.rope_scaling_factor);
  m.normalization = common::enum_from_name_or_fail<Normalization>(
      args.text_or("normalization", "LayerNorm"),
      args.source() + ": the Megatron checkpoint's args.normalization");
  // Megatron of 2026 keeps these two under TransformerConfig's names.
  m.apply_layernorm_1p = args.boolean_or("apply_layernorm_1p",
                                         args.boolean_or("layernorm_zero_centered_gamma", false));
  m.swiglu = args.boolean_or("swiglu", false);
  m.add_bias_linear = args.boolean_or("add_bias_linear", true);
  m.untie_embeddings_and_output_weights =
      args.boolean_or("untie_embeddings_and_output_weights", false);
  m.group_query_attention = args.boolean_or("group_query_attention", false);
  m.num_query_groups = m.group_query_attention ? args.integer("num_query_groups") : 1;
  if (args.has("kv_channels") && m.num_attention_heads > 0 &&
      args.integer("kv_channels") * m.num_attention_heads != m.hidden_size) {
    common::fail(
        "{}: the Megatron checkpoint's args.kv_channels {} is not --hidden-size {} / "
        "--num-attention-heads {}: heads of another width are not built by this backend",
        args.source(), args.integer("kv_channels"), m.hidden_size, m.num_attention_heads);
  }

  TokenizerOptions& t = record.tokenizer;
  t.tokenizer_type = args.text("tokenizer_type");
  t.vocab_size = args.integer_or("vocab_size", 0);
  t.tokenizer_model = args.text_or("tokenizer_model", "");
  t.vocab_extra_ids = args.integer_or("vocab_extra_ids", 0);

  ParallelismArguments& p = record.parallelism;
  p.tensor_model_parallel_size = args.integer_or("tensor_model_parallel_size", 1);
  p.pipeline_model_parallel_size = args.integer_or("pipeline_model_parallel_size", 1);
  p.num_layers_per_virtual_pipeline_stage =
      args.integer_or("num_layers_per_virtual_pipeline_stage", 0);
  // Newer Megatron sets the chunk count instead.
  const int64_t chunks = args.integer_or("virtual_pipeline_model_parallel_size", 1);
  if (p.num_layers_per_virtual_pipeline_stage == 0 && chunks > 1 &&
      p.pipeline_model_parallel_size > 0) {
    p.num_layers_per_virtual_pipeline_stage =
        m.num_layers / p.pipeline_model_parallel_size / chunks;
  }
  return record;
}

// ---- one rank's file

MegatronRankFile::MegatronRankFile(const fs::path& file) : path_(file), file_(file) {
  if (file_.root().kind != PickleKind::dict) {
    common::fail("{}: not a Megatron checkpoint (its object is not a dict)", path_.string());
  }
  if (file_.root().find("args") == nullptr) {
    common::fail(
        "{}: the checkpoint has no 'args'; it was not saved by Megatron-LM's "
        "save_checkpoint",
        path_.string());
  }
}

MegatronArguments MegatronRankFile::arguments() const {
  return MegatronArguments(*file_.root().find("args"), path_.string());
}

int64_t MegatronRankFile::iteration() const {
  const PickleValue* iteration = file_.root().find("iteration");
  if (iteration == nullptr) return 0;
  if (iteration->kind != PickleKind::integer) {
    common::fail("{}: 'iteration' is not an integer", path_.string());
  }
  return iteration->integer;
}

double MegatronRankFile::checkpoint_version() const {
  const PickleValue* version = file_.root().find("checkpoint_version");
  if (version == nullptr) return 0;
  if (version->kind == PickleKind::integer) return static_cast<double>(version->integer);
  if (version->kind != PickleKind::real) {
    common::fail("{}: 'checkpoint_version' is not a number", path_.string());
  }
  return version->real;
}

std::vector<const PickleValue*> MegatronRankFile::model_chunks() const {
  auto require_dict = [&](const PickleValue* model, const std::string& key) {
    if (model->kind != PickleKind::dict) {
      common::fail("{}: '{}' is not a state dict", path_.string(), key);
    }
    return model;
  };
  if (const PickleValue* model = file_.root().find("model")) return {require_dict(model, "model")};
  std::vector<const PickleValue*> chunks;
  for (int chunk = 0;; ++chunk) {
    const std::string key = fmt::format("model{}", chunk);
    const PickleValue* model = file_.root().find(key);
    if (model == nullptr) break;
    chunks.push_back(require_dict(model, key));
  }
  if (chunks.empty()) {
    common::fail(
        "{}: the checkpoint holds no model ('model', or 'model0', 'model1', ... for "
        "the interleaved schedule's chunks)",
        path_.string());
  }
  return chunks;
}

std::vector<std::pair<std::string, const PickleValue*>> flatten_state_dict(
    const PickleValue& state_dict) {
  std::vector<std::pair<std::string, const PickleValue*>> tensors;
  flatten_into(state_dict, "", tensors);
  return tensors;
}

std::optional<std::string> megatron_tensor_name(std::string_view name, int64_t layer_offset,
                                                std::string_view source) {
  if (name.ends_with("_extra_state")) return std::nullopt;
  auto layer_name = [&](std::string_view numbered, bool legacy) -> std::string {
    const auto split = split_layer(numbered);
    if (!split) unknown_tensor(name, source);
    const int64_t layer = split->first;
    const std::string_view rest = split->second;
    std::string renamed(rest);
    for (const auto& [from, to] : kTransformerEngineNames) {
      if (rest == from) renamed = to;
    }
    if (legacy) {
      const std::optional<std::string> core = with_prefix_renamed(rest, kLegacyLayerNames);
      if (!core) unknown_tensor(name, source);
      renamed = *core;
    }
    return fmt::format("decoder.layers.{}.{}", layer + layer_offset, renamed);
  };
  auto after = [&](std::string_view prefix) { return name.substr(prefix.size()); };
  // Megatron core's names.
  if (name.starts_with("embedding.") || name.starts_with("output_layer.") ||
      name.starts_with("decoder.final_layernorm.")) {
    return std::string(name);
  }
  if (name.starts_with("decoder.layers.")) return layer_name(after("decoder.layers."), false);
  // The legacy model's.
  for (std::string_view layers :
       {"language_model.encoder.layers.", "language_model.transformer.layers."}) {
    if (name.starts_with(layers)) return layer_name(after(layers), true);
  }
  if (std::optional<std::string> core = with_prefix_renamed(name, kLegacyNames)) return core;
  unknown_tensor(name, source);
}

// ---- the checkpoint as ShardFiles

namespace {

class MegatronShardFile final : public ShardFile {
 public:
  // `metadata`: what every file of the checkpoint has; the file's optimizer and scheduler state
  // is added when it holds them (optimizer_not_read() says why not otherwise).
  MegatronShardFile(std::unique_ptr<MegatronRankFile> file, std::span<const LayerRange> chunks,
                    nlohmann::json metadata)
      : file_(std::move(file)), metadata_(std::move(metadata)) {
    const std::vector<const PickleValue*> models = file_->model_chunks();
    if (models.size() != chunks.size()) {
      common::fail("{}: it holds {} model chunk(s), but its args give each stage {}",
                   file_->path().string(), models.size(), chunks.size());
    }
    std::vector<MegatronParameter> parameters;
    for (size_t chunk = 0; chunk < models.size(); ++chunk) {
      for (const auto& [megatron_name, value] : flatten_state_dict(*models[chunk])) {
        const std::optional<std::string> name =
            megatron_tensor_name(megatron_name, chunks[chunk].begin, file_->path().string());
        if (!name) continue;
        if (index_.count(*name) != 0) {
          common::fail("{}: '{}' and another tensor are both this backend's '{}'",
                       file_->path().string(), megatron_name, *name);
        }
        add(*name, file_->file().tensor(*value, megatron_name));
        parameters.push_back({.megatron_name = megatron_name,
                              .name = *name,
                              .tensor = entries_.back().tensor,
                              .chunk = chunk});
      }
    }
    read_optimizer(parameters);
  }

  // Why the file's optimizer state is not read (its metadata's "optimizer_not_read"); empty
  // when it is.
  std::string optimizer_not_read() const { return metadata_.value("optimizer_not_read", ""); }

  const std::filesystem::path& path() const override { return file_->path(); }
  const nlohmann::json& metadata() const override { return metadata_; }
  std::vector<std::string> tensor_names() const override {
    std::vector<std::string> names;
    for (const Entry& entry : entries_) names.push_back(entry.name);
    return names;
  }
  const std::vector<int64_t>* shape(const std::string& name) const override {
    const auto found = index_.find(name);
    return found == index_.end() ? nullptr : &entries_[found->second].tensor.shape;
  }
  void read(const std::string& name, std::span<float> destination) const override {
    const Entry& entry = entries_[index_.at(name)];
    const std::vector<double> values =
        (entry.in_parameter_state ? *parameter_state_ : file_->file()).tensor_values(entry.tensor);
    if (values.size() != destination.size()) {
      common::fail("{}: '{}' has {} elements, where {} are read", file_->path().string(), name,
                   values.size(), destination.size());
    }
    std::transform(values.begin(), values.end(), destination.begin(),
                   [](double value) { return static_cast<float>(value); });
  }

 private:
  void add(std::string name, TorchTensor tensor, bool in_parameter_state = false) {
    index_.emplace(name, entries_.size());
    entries_.push_back({std::move(name), std::move(tensor), in_parameter_state});
  }

  // The moments under checkpoint.hpp's names, the fp32 main weights in place of the model's
  // 16-bit ones, and the metadata's "optimizer" and "opt_param_scheduler".
  void read_optimizer(std::span<const MegatronParameter> parameters) {
    const MegatronArguments args = file_->arguments();
    MegatronOptimizerRead optimizer = read_megatron_optimizer(*file_, parameters, args);
    const std::optional<nlohmann::json> scheduler = read_megatron_scheduler(*file_, args);
    if (optimizer.state && !scheduler) {
      optimizer = {.state = std::nullopt, .not_read = "it has no 'opt_param_scheduler'"};
    }
    if (!optimizer.state) {
      metadata_["optimizer_not_read"] = std::move(optimizer.not_read);
      return;
    }
    const MegatronOptimizerState& state = *optimizer.state;
    parameter_state_ = state.parameter_state;
    const bool elsewhere = parameter_state_ != nullptr;
    const size_t count = parameters.size();
    for (size_t p = 0; p < count; ++p) {
      const std::string name = entries_[p].name;
      if (!state.main_weights.empty()) {
        entries_[p].tensor = state.main_weights[p];
        entries_[p].in_parameter_state = elsewhere;
      }
      add(kCheckpointExpAvgPrefix + name, state.exp_avg[p], elsewhere);
      add(kCheckpointExpAvgSqPrefix + name, state.exp_avg_sq[p], elsewhere);
    }
    metadata_["no_save_optim"] = false;
    metadata_["optimizer"] = state.metadata;
    metadata_["opt_param_scheduler"] = *scheduler;
  }

  struct Entry {
    std::string name;
    TorchTensor tensor;
    bool in_parameter_state = false;  // distrib_optim.pt's, not the rank file's
  };
  std::unique_ptr<MegatronRankFile> file_;
  std::shared_ptr<const TorchCheckpointFile> parameter_state_;  // the distributed optimizer's
  nlohmann::json metadata_;
  std::vector<Entry> entries_;  // the parameters first, in the state dict's order
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace

MegatronCommon read_megatron_common(const MegatronCheckpointLayout& layout,
                                    const MegatronRankFile& file) {
  const MegatronArguments args = file.arguments();
  MegatronCommon shared;
  shared.record = megatron_model_record(args);
  shared.padded_vocab_size = args.integer("padded_vocab_size");
  const ParallelismArguments& parallelism = shared.record.parallelism;
  if (parallelism.tensor_model_parallel_size != layout.tensor_parallel ||
      parallelism.pipeline_model_parallel_size != layout.pipeline_parallel) {
    common::fail(
        "{}: its args say tensor-parallel size {} and pipeline-parallel size {}, but the "
        "checkpoint's rank directories span {} × {}: files are missing or mixed up",
        file.path().string(), parallelism.tensor_model_parallel_size,
        parallelism.pipeline_model_parallel_size, layout.tensor_parallel, layout.pipeline_parallel);
  }
  nlohmann::json record;
  record_model(shared.record, record);
  shared.metadata = {
      {"format", "megatron-lm torch checkpoint"},
      {"iteration", layout.iteration},
      {"consumed_train_samples", args.integer_or("consumed_train_samples", 0)},
      {"consumed_valid_samples", args.integer_or("consumed_valid_samples", 0)},
      {"padded_vocab_size", shared.padded_vocab_size},
      {"no_save_optim", true},
      {"no_save_rng", true},
      {"arguments", record},
      // The part of Megatron's args this backend's "args" (the dump, as text) is read for: the
      // optimizer's form when the checkpoint is written again in Megatron's format.
      {"args",
       {{"bf16", args.boolean_or("bf16", false) ? "True" : "False"},
        {"fp16", args.boolean_or("fp16", false) ? "True" : "False"}}},
  };
  return shared;
}

void read_native_dropout_state(const MegatronRankFile& file, nlohmann::json& metadata) {
  const PickleValue* dropout = file.file().root().find("native_dropout_state");
  if (dropout == nullptr || dropout->kind != PickleKind::dict) return;
  const PickleValue* seed = dropout->find("seed");
  const PickleValue* step = dropout->find("step");
  if (seed == nullptr || step == nullptr || seed->kind != PickleKind::integer ||
      step->kind != PickleKind::integer || seed->integer < 0 || step->integer < 0) {
    common::fail("{}: 'native_dropout_state' has no integer 'seed' and 'step'",
                 file.path().string());
  }
  metadata["no_save_rng"] = false;
  metadata["rng_state"] = {{"dropout_seed", seed->integer}, {"dropout_step", step->integer}};
}

namespace {

// The ShardFile of (rank, stage), whose file is open in `file`.
std::unique_ptr<MegatronShardFile> open_rank_shard(const MegatronCheckpointLayout& layout,
                                                   const MegatronCommon& shared,
                                                   std::unique_ptr<MegatronRankFile> file,
                                                   int64_t rank, int64_t stage) {
  const int64_t num_layers = shared.record.model.num_layers;
  const PipelineStage place{
      .pipeline_parallel = layout.pipeline_parallel,
      .rank = stage,
      .virtual_chunks = shared.record.parallelism.virtual_pipeline_chunks(num_layers)};
  check_pipeline_stage(num_layers, place);
  if (file->checkpoint_version() < 2.0) {
    common::fail(
        "{}: checkpoint_version {} is older than 2.0, whose query/key/value rows are "
        "ordered otherwise; convert it with a Megatron-LM of that time first",
        file->path().string(), file->checkpoint_version());
  }
  if (!layout.release && file->iteration() != layout.iteration) {
    common::fail("{} holds iteration {}, but the tracker {} says {}", file->path().string(),
                 file->iteration(), checkpoint_tracker_path(layout.directory).string(),
                 layout.iteration);
  }
  nlohmann::json metadata = shared.metadata;
  metadata["tensor_parallel"] = {{"size", layout.tensor_parallel}, {"rank", rank}};
  metadata["pipeline_parallel"] = {{"size", layout.pipeline_parallel}, {"rank", stage}};
  read_native_dropout_state(*file, metadata);
  metadata["rng_not_read"] =
      file->file().root().find("rng_state") == nullptr
          ? "it was saved without RNG state (--no-save-rng)"
          : "Megatron's RNG states (Python's, NumPy's, torch's and the CUDA tracker's generators) "
            "do not map to this backend's dropout masks, which come from --seed and the step";
  return std::make_unique<MegatronShardFile>(std::move(file), stage_layer_chunks(num_layers, place),
                                             std::move(metadata));
}

}  // namespace

std::unique_ptr<ShardFile> open_megatron_shard_file(const MegatronCheckpointLayout& layout,
                                                    int64_t tensor_parallel_rank,
                                                    int64_t pipeline_rank) {
  if (layout.distributed) {
    return open_megatron_dist_saved_shard_file(layout, tensor_parallel_rank, pipeline_rank);
  }
  auto file =
      std::make_unique<MegatronRankFile>(layout.rank_file(tensor_parallel_rank, pipeline_rank));
  const MegatronCommon shared = read_megatron_common(layout, *file);
  return open_rank_shard(layout, shared, std::move(file), tensor_parallel_rank, pipeline_rank);
}

MegatronShards open_megatron_shards(const fs::path& directory) {
  MegatronShards shards;
  shards.layout = read_megatron_layout(directory);
  const MegatronCheckpointLayout& layout = shards.layout;
  if (layout.distributed) return open_megatron_dist_shards(layout);
  auto first = std::make_unique<MegatronRankFile>(layout.rank_file(0, 0));
  const MegatronCommon shared = read_megatron_common(layout, *first);
  shards.record = shared.record;
  shards.padded_vocab_size = shared.padded_vocab_size;
  for (int64_t stage = 0; stage < layout.pipeline_parallel; ++stage) {
    for (int64_t rank = 0; rank < layout.tensor_parallel; ++rank) {
      auto file = stage == 0 && rank == 0
                      ? std::move(first)
                      : std::make_unique<MegatronRankFile>(layout.rank_file(rank, stage));
      auto shard = open_rank_shard(layout, shared, std::move(file), rank, stage);
      // Every file has the optimizer's state, or none does (then the first's reason is said).
      if (stage == 0 && rank == 0) {
        shards.optimizer_not_read = shard->optimizer_not_read();
      } else if (shard->optimizer_not_read().empty() != shards.optimizer_not_read.empty()) {
        common::fail("{} {} optimizer state, but {} {}", shard->path().string(),
                     shard->optimizer_not_read().empty() ? "holds" : "holds no",
                     layout.rank_file(0, 0).string(),
                     shards.optimizer_not_read.empty() ? "does" : "does not");
      }
      shards.files.push_back(std::move(shard));
    }
  }
  return shards;
}

}  // namespace backend
