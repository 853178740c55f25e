// Megatron-LM's legacy checkpoints (--ckpt-format torch; megatron/training/checkpointing.py:
// get_checkpoint_name, read_metadata, generate_state_dict), read without running any of their
// code (torch_checkpoint.hpp, restricted_pickle.hpp):
//   DIR/latest_checkpointed_iteration.txt                   the tracker: "500" or "release"
//   DIR/iter_0000500/mp_rank_TT/model_optim_rng.pt          one torch.save'd dict per tensor-
//   DIR/iter_0000500/mp_rank_TT_PPP/model_optim_rng.pt      parallel rank TT (and pipeline stage
//                                                           PPP, with more than one stage)
// Each dict holds 'args' (the run's argparse.Namespace), 'checkpoint_version', 'iteration',
// 'model' (or 'model0', 'model1', ...: one per chunk of the interleaved schedule), and, unless
// saved without them, 'optimizer', 'opt_param_scheduler' and 'rng_state'.
//
// The model's tensors are named as one of Megatron's two model classes names them, each mapped
// to this backend's names (Megatron core's local spec; model/parameter_layout.cpp):
//   core, local spec    embedding.*, decoder.layers.N.input_layernorm.weight, ... (the same)
//   core, TE spec       decoder.layers.N.self_attention.linear_qkv.layer_norm_weight/_bias and
//                       mlp.linear_fc1.layer_norm_weight/_bias, Transformer Engine's fused
//                       norms: input_layernorm and pre_mlp_layernorm; *._extra_state (its FP8
//                       metadata) is not a weight and is passed over
//   legacy              nested dicts {'language_model': {'embedding': {'word_embeddings':
//                       {'weight': ...}}, 'encoder': {'layers.N.self_attention.
//                       query_key_value.weight': ...}}}, flattened with dots: language_model.
//                       embedding.* → embedding.*, encoder.layers.N.{input_norm,
//                       self_attention.query_key_value, self_attention.dense,
//                       post_attention_norm, mlp.dense_h_to_4h, mlp.dense_4h_to_h} →
//                       decoder.layers.N.{input_layernorm, self_attention.linear_qkv,
//                       self_attention.linear_proj, pre_mlp_layernorm, mlp.linear_fc1,
//                       mlp.linear_fc2}, encoder.final_norm → decoder.final_layernorm,
//                       language_model.output_layer → output_layer, and the last stage's tied
//                       copy word_embeddings_for_head → output_layer; the norms' names before
//                       September 2023 (*_layernorm), 'transformer' for 'encoder' and
//                       'attention' for 'self_attention' in the oldest files, read alike
// N counts the layers of one stage's chunk from 0; the global index adds the layers before it
// (megatron core's get_transformer_layer_offset for equal stages). Both classes keep the fused
// QKV weight as this backend does: per query group, that group's query heads, then its key and
// its value head (checkpoint_version 2 and later; older files are refused), and SwiGLU's fc1 as
// the gate's rows, then the up projection's, within each tensor-parallel shard.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/ckpt/checkpoint_record.hpp"
#include "backend/ckpt/shard_file.hpp"
#include "backend/ckpt/torch_checkpoint.hpp"

namespace backend {

inline constexpr const char* kMegatronCheckpointFile = "model_optim_rng.pt";
// Beside it, the distributed optimizer's parameters and moments (megatron_optimizer.hpp).
inline constexpr const char* kMegatronDistributedOptimizerFile = "distrib_optim.pt";

// Where a Megatron checkpoint's files are: the iteration its tracker names, and the sizes its
// rank directories show.
struct MegatronCheckpointLayout {
  std::filesystem::path directory;            // DIR, as given
  std::filesystem::path iteration_directory;  // DIR/iter_0000500 or DIR/release
  int64_t iteration = 0;
  bool release = false;
  int64_t tensor_parallel = 1;
  int64_t pipeline_parallel = 1;
  // A torch_dist checkpoint (megatron_dist_checkpoint.hpp): the iteration directory is one
  // distributed checkpoint, the sizes those it was saved with.
  bool distributed = false;

  // DIR/iter_XXXXXXX/mp_rank_TT[_PPP]/model_optim_rng.pt; a torch_dist checkpoint's common.pt
  // (which holds the args) for every rank.
  std::filesystem::path rank_file(int64_t tensor_parallel_rank, int64_t pipeline_rank) const;
};

// Whether DIR's tracker names a Megatron-LM checkpoint: an iteration directory holding
// mp_rank_00/model_optim_rng.pt or mp_rank_00_000/model_optim_rng.pt, or a torch_dist
// checkpoint's metadata.json. False without a tracker; a tracker this backend cannot read is a
// common::Error (read_checkpoint_tracker's).
bool is_megatron_checkpoint(const std::filesystem::path& directory);

// The layout of the Megatron checkpoint DIR's tracker names (a torch_dist checkpoint's:
// read_megatron_dist_layout). Refused, naming the file or
// directory: no tracker, an iteration directory that does not exist, rank directories of both
// naming schemes or of expert parallelism, a (rank, stage) directory or file missing from the
// grid the others span.
MegatronCheckpointLayout read_megatron_layout(const std::filesystem::path& directory);

// The run's args as Megatron saved them (an argparse.Namespace), read by name. `source` names
// the file in messages.
class MegatronArguments {
 public:
  MegatronArguments(const PickleValue& args, std::string source);

  const std::string& source() const { return source_; }
  bool has(std::string_view name) const;  // present and not None
  // The value of `name`; absent, None or of another type is a common::Error naming the file
  // and the argument. An integer reads as a real; a bool is not an integer.
  int64_t integer(std::string_view name) const;
  double real(std::string_view name) const;
  bool boolean(std::string_view name) const;
  std::string text(std::string_view name) const;
  // The same, or `fallback` when absent or None.
  int64_t integer_or(std::string_view name, int64_t fallback) const;
  double real_or(std::string_view name, double fallback) const;
  bool boolean_or(std::string_view name, bool fallback) const;
  std::string text_or(std::string_view name, std::string fallback) const;

 private:
  const PickleValue* find(std::string_view name) const;  // nullptr: absent or None
  const PickleValue* require(std::string_view name, PickleKind kind, const char* what) const;

  const PickleValue* fields_ = nullptr;  // the Namespace's state: a dict of its attributes
  std::string source_;
};

// The model a Megatron run's args describe, in this backend's record: the shape, norm,
// activation, positions, biases, tying and grouped-query attention, the tokenizer and the
// tensor- and pipeline-parallel sizes (and the interleaved schedule's chunk size). What this
// backend cannot build (an MoE, multi-token prediction, uneven pipeline stages, a norm or
// position embedding it does not have) is a common::Error naming the file and the argument.
CheckpointModelRecord megatron_model_record(const MegatronArguments& args);

// One rank's file of a Megatron checkpoint, open.
class MegatronRankFile {
 public:
  explicit MegatronRankFile(const std::filesystem::path& file);

  const std::filesystem::path& path() const { return path_; }
  const TorchCheckpointFile& file() const { return file_; }
  MegatronArguments arguments() const;
  int64_t iteration() const;          // 'iteration'; 0 when absent (a release)
  double checkpoint_version() const;  // 'checkpoint_version'; 0 when absent
  // The model's state dicts: 'model' alone, or 'model0', 'model1', ... in order.
  std::vector<const PickleValue*> model_chunks() const;

 private:
  std::filesystem::path path_;
  TorchCheckpointFile file_;
};

// What the args of a checkpoint's file say of the whole checkpoint, checked against the
// layout: the model's record, the padded vocabulary, and the metadata every rank's ShardFile
// starts from (iteration, consumed samples, the record, the precision).
struct MegatronCommon {
  CheckpointModelRecord record;
  int64_t padded_vocab_size = 0;
  nlohmann::json metadata;
};
MegatronCommon read_megatron_common(const MegatronCheckpointLayout& layout,
                                    const MegatronRankFile& file);

// This backend's own --ckpt-format torch and torch_dist saves keep its dropout position beside
// Megatron's keys ('native_dropout_state': {'seed', 'step'}, megatron_checkpoint_writer.hpp):
// when `file` has it, `metadata` gets it as "rng_state" (and "no_save_rng" false).
void read_native_dropout_state(const MegatronRankFile& file, nlohmann::json& metadata);

// A model state dict's tensors by their dotted names: nested dicts (the legacy model's)
// flattened, in the file's order. A value that is neither a dict nor a tensor (None, an
// _extra_state's bytes) is left out.
std::vector<std::pair<std::string, const PickleValue*>> flatten_state_dict(
    const PickleValue& state_dict);

// This backend's name of the Megatron tensor `name` of a chunk whose first layer is the
// model's layer `layer_offset`; nullopt for what is not a weight (*._extra_state). A name
// neither model class has is a common::Error naming it and `source`.
std::optional<std::string> megatron_tensor_name(std::string_view name, int64_t layer_offset,
                                                std::string_view source);

// The checkpoint DIR's tracker names, as this backend's tools read a checkpoint whole: the
// layout, the model its args describe, and one ShardFile per (rank, stage), stage by stage,
// whose tensors carry this backend's names (the layers' global indices) and whose metadata is
// what this backend's save writes for the state the file holds: the iteration, the consumed
// samples, the model's record and the padded vocabulary, and the optimizer's state where the
// files hold it (megatron_optimizer.hpp): AdamW's moments as optimizer.exp_avg.NAME and
// optimizer.exp_avg_sq.NAME, the fp32 main weights of a bf16 or fp16 run in place of the
// model's 16-bit ones, the "optimizer" (step, betas, loss scaler) and "opt_param_scheduler"
// sections. No RNG state: Megatron's generators' states do not map to this backend's dropout
// key (seed and step). Refused, naming the file: what read_megatron_layout,
// megatron_model_record and read_megatron_optimizer refuse, args whose parallel sizes are not
// the directories', a file of another iteration, a checkpoint_version below 2 (the older QKV
// ordering), a tensor neither naming has, one named twice, files of which some hold optimizer
// state and others not.
struct MegatronShards {
  MegatronCheckpointLayout layout;
  CheckpointModelRecord record;
  int64_t padded_vocab_size = 0;  // args.padded_vocab_size
  std::vector<std::unique_ptr<ShardFile>> files;
  // Empty when the optimizer's state was read; else why not (a sentence about the checkpoint).
  std::string optimizer_not_read;
};
MegatronShards open_megatron_shards(const std::filesystem::path& directory);

// The ShardFile of one (tensor-parallel rank, pipeline stage) of the checkpoint `layout`
// describes, as open_megatron_shards makes it, opening that file alone: for a run that loads
// its own shard (checkpoint.hpp's load_checkpoint at the checkpoint's own layout). Its metadata
// says why the optimizer's state is not there, when it is not ("optimizer_not_read"), and why
// the RNG state never is ("rng_not_read").
std::unique_ptr<ShardFile> open_megatron_shard_file(const MegatronCheckpointLayout& layout,
                                                    int64_t tensor_parallel_rank,
                                                    int64_t pipeline_rank);

}  // namespace backend
