// Checkpoints as Megatron-LM lays them out and resumes from them
// (megatron/training/checkpointing.py: save_checkpoint, load_checkpoint, read_metadata):
//   DIR/latest_checkpointed_iteration.txt              the tracker: "500" (or "release")
//   DIR/iter_0000500/mp_rank_00/model_optim_rng.bin    one file per (tp, pp) rank; ours is
//                                                      the format of checkpoint_file.hpp, where
//                                                      Megatron has a torch.save'd .pt
// A checkpoint holds the parameters by their Megatron names (all of GptModel::tensors()), the
// AdamW moments and step count, the scheduler's sample count, the dropout RNG state (seed and
// step), the iteration, the consumed train/validation samples and the arguments. Loading it
// gives back exactly that state, so a resumed run computes the same losses and weights, bit
// for bit, as one that was never interrupted.
//
// One live process per save directory: a run holds DIR/save.lock (lock_save_directory) for as
// long as it may save there, so a second run saving into DIR, or an import into it, is
// refused instead of interleaving its iterations with the first's.
//
// Saving is crash-safe (docs/checkpoints.md): the iteration's directory is written under a
// temporary name, fsynced, renamed into place and the tracker is replaced atomically last, so
// a kill at any moment leaves the previously tracked checkpoint complete and loadable.
// Temporary directories left by a killed save are removed by the next save.
//
// Messages are Megatron's (" loading checkpoint from DIR at iteration 500", "  successfully
// saved checkpoint from iteration     500 to DIR [ t 1/1, p 1/1 ]", ...), on `out`.
//
// Saves and loads take plain values (CheckpointSaveOptions, CheckpointLoadOptions), and the
// record of the arguments a checkpoint keeps is JSON its caller made: the model's part from
// checkpoint_record.hpp, the rest from train/checkpoint_arguments.hpp, which maps pretrain_gpt's
// TrainingArguments to these and back.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/ckpt/checkpointing_arguments.hpp"
#include "backend/common/file_lock.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"

namespace backend {

// Where training stands, besides the tensors: what a resumed run continues from.
struct TrainingProgress {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
};

// The names of AdamW's moments of parameter P in a checkpoint file: optimizer.exp_avg.P and
// optimizer.exp_avg_sq.P, each of P's (shard) shape.
inline constexpr const char* kCheckpointExpAvgPrefix = "optimizer.exp_avg.";
inline constexpr const char* kCheckpointExpAvgSqPrefix = "optimizer.exp_avg_sq.";

std::filesystem::path checkpoint_tracker_path(const std::filesystem::path& directory);
// DIR/iter_0000500 (Megatron's 'iter_{:07d}').
std::filesystem::path checkpoint_iteration_directory(const std::filesystem::path& directory,
                                                     int64_t iteration);
// mp_rank_00 (Megatron's 'mp_rank_{:02d}' for a tensor-parallel rank, without pipeline stages),
// or mp_rank_00_001 ('mp_rank_{:02d}_{:03d}', tensor-parallel rank and pipeline stage) when the
// pipeline has more than one stage.
std::string checkpoint_rank_directory_name(int64_t tensor_parallel_rank,
                                           int64_t pipeline_rank = 0,
                                           int64_t pipeline_parallel = 1);
// DIR/iter_0000500/mp_rank_00/model_optim_rng.bin
std::filesystem::path checkpoint_file_path(const std::filesystem::path& directory, int64_t iteration,
                                           int64_t tensor_parallel_rank = 0,
                                           int64_t pipeline_rank = 0,
                                           int64_t pipeline_parallel = 1);

// What the tracker file names. `release` checkpoints (tracker text "release", directory
// DIR/release) are weights to start from, as Megatron's.
struct TrackedCheckpoint {
  int64_t iteration = 0;
  bool release = false;
  // The model_optim_rng.bin of mp_rank_00 it points to (of mp_rank_00_000 when only that
  // exists: a pipelined checkpoint).
  std::filesystem::path file;
};
// The file of (tensor-parallel rank, pipeline stage) beside tracked.file.
std::filesystem::path checkpoint_rank_file(const TrackedCheckpoint& tracked,
                                           int64_t tensor_parallel_rank, int64_t pipeline_rank = 0,
                                           int64_t pipeline_parallel = 1);
// nullopt when DIR has no tracker; a tracker that is neither an integer nor "release" is a
// common::Error naming the file.
std::optional<TrackedCheckpoint> read_checkpoint_tracker(const std::filesystem::path& directory);
// What the tracker of DIR names, for a tool that cannot go on without it: a common::Error when
// DIR holds no tracker, or the tracker names a file that does not exist, which begins with
// `option` (what gave DIR: "--load") and DIR, names the tracker and ends with `remedy`.
TrackedCheckpoint require_checkpoint(
    const std::filesystem::path& directory, std::string_view option,
    std::string_view remedy = "is it the --save directory of a training run?");

// DIR/save.lock, held by the process saving into DIR.
std::filesystem::path save_lock_path(const std::filesystem::path& directory);

// Takes DIR/save.lock (creating DIR), for the life of the returned lock; while another live
// process holds it, a common::Error naming DIR, the holder's pid and host, and what to do.
// A killed holder's lock is free (flock, file_lock.hpp).
common::ExclusiveFileLock lock_save_directory(const std::filesystem::path& directory);

// Before a release checkpoint is saved into DIR (checkpoint_util --import-hf): a tracker naming
// a training iteration is refused, since the release would become what --load DIR starts from,
// unless `replace_training_tracker`. No tracker, or "release", is fine. Megatron has no such
// check.
void check_release_destination(const std::filesystem::path& directory, bool replace_training_tracker);

// What a save needs besides the state: where, what to leave out, and what the metadata
// records of the run that made it.
struct CheckpointSaveOptions {
  std::filesystem::path directory{};  // --save
  bool no_save_optim = false;         // leave out the optimizer and scheduler state
  bool no_save_rng = false;           // leave out the dropout RNG state
  // The metadata's "arguments" (the typed record: what defines the shapes, the optimizer, the
  // schedule and the data stream, which tools rebuild the model from) and "args" (every
  // argument by Megatron's name as Megatron's dump prints it), stored as given.
  nlohmann::json arguments = nlohmann::json::object();
  nlohmann::json args = nlohmann::json::object();
  std::vector<std::string> command_line{};  // stored as the metadata's "command_line"
  // --ckpt-format torch: Megatron-LM's model_optim_rng.pt in place of this backend's files
  // (megatron_checkpoint_writer.hpp), its tensors named for `megatron_spec` (--transformer-impl)
  // and its args `megatron_args` (every argument by Megatron's name with Python's types).
  // Only the native and torch formats are written. The file's optimizer form (fp32 or
  // Float16Optimizer's) is that of the --bf16 / --fp16 `args` records
  // (recorded_mixed_precision): the Megatron run that loads it has that optimizer, whatever
  // precision this device computed in.
  CheckpointFormat format = CheckpointFormat::native;
  MegatronModuleSpec megatron_spec = MegatronModuleSpec::transformer_engine;
  nlohmann::json megatron_args = nlohmann::json::object();
};

// --bf16 or --fp16 as a checkpoint's metadata records them in its "args" (the arguments dump,
// as text: "True"); none when neither is, or the metadata has no "args".
MixedPrecision recorded_mixed_precision(const nlohmann::json& metadata);

// What a load needs besides the state it fills: where, which parts to skip, which schedule
// wins, and the current run's arguments for the message when the checkpoint does not fit.
struct CheckpointLoadOptions {
  std::filesystem::path directory{};  // --load
  bool finetune = false;              // weights only; iteration and samples start at 0
  bool no_load_optim = false;
  bool no_load_rng = false;
  bool use_checkpoint_opt_param_scheduler = false;  // schedule from the checkpoint
  bool override_opt_param_scheduler = false;        // schedule from the flags
  // The current arguments in the form of CheckpointSaveOptions::arguments, and the command
  // line: a shape mismatch names the shape flags whose values differ from the checkpoint's.
  nlohmann::json arguments = nlohmann::json::object();
  std::vector<std::string> command_line{};
  // --name-config-keys: the launcher rendered the flags, so that mismatch names the config
  // keys to set (common/nemo_config_keys.hpp) rather than flags to pass.
  bool name_config_keys = false;
};

// The distributed optimizer's (and ZeRO-3's) part in a save: the optimizer holds the AdamW
// moments of `range` of the model's flat parameter buffer, the range shard_range gives member
// data_parallel->rank() of the group. Every member then writes its range to its own file beside
// the model's, mp_rank_XX[_YYY]/distrib_optim_ZZZ.bin (ZZZ its data-parallel rank, as
// Megatron's distributed optimizer writes each rank's state, though Megatron's file is one per
// model-parallel rank since 23.05): nothing is gathered, so a save costs no memory beyond the
// rank's own state. The model's file (data-parallel rank 0's) then holds no moments; its
// "optimizer" section says how many ranges there are ("distributed"). In Megatron's format
// (--ckpt-format torch) the ranges are gathered on data-parallel rank 0 instead, which writes
// Megatron's one distrib_optim.pt (megatron_checkpoint_writer.hpp).
struct OptimizerShard {
  Communicator* data_parallel = nullptr;
  int64_t parameter_count = 0;  // of the flat buffer the ranges cut (the whole model's)
  ShardRange range{};
};

// distrib_optim_003.bin: data-parallel rank 3's moments.
std::string distributed_optimizer_file_name(int64_t data_parallel_rank);

// Saves to options.directory: parameters, and unless no_save_optim / no_save_rng the
// optimizer and scheduler state / the dropout RNG state. A collective over the model's
// tensor- and pipeline-parallel groups (one process: groups of one): each rank writes its
// shards of its stage's tensors to mp_rank_<tp rank>[_<stage>], and the tracker moves once all
// have written and synced; the metadata records the groups' sizes ("tensor_parallel",
// "pipeline_parallel"), which a load must match. Without `shard` the optimizer's moments
// are the whole buffer's and data-parallel rank 0 alone calls this; with it (the optimizer's
// moments are shard->range), every member of shard->data_parallel calls it, and the members
// other than 0 write their moments' file only (`model` gives them its groups and shapes).
void save_checkpoint(const CheckpointSaveOptions& options, const TrainingProgress& progress,
                     const GptModel<float>& model, const AdamW& optimizer,
                     const LearningRateScheduler& scheduler, std::ostream& out,
                     const OptimizerShard* shard = nullptr);

// Saves the weights alone (no optimizer, scheduler or RNG state) as a release checkpoint,
// DIR/release with the tracker text "release", crash-safe as save_checkpoint: weights to start
// from, which load_checkpoint reads as weights only, from iteration 0 (Megatron's release
// checkpoints). checkpoint_util --import-hf writes these.
void save_release_checkpoint(const CheckpointSaveOptions& options, const GptModel<float>& model,
                             std::ostream& out);

// One (tensor-parallel rank, pipeline stage)'s file as write_checkpoint_files writes it: the
// metadata as given (a copy of what save_checkpoint writes, with this file's "tensor_parallel"
// and "pipeline_parallel") and the tensors.
struct CheckpointRankFile {
  nlohmann::json metadata = nlohmann::json::object();
  std::vector<CheckpointTensor> tensors{};
};

// Writes one checkpoint made of `tensor_parallel` × `pipeline_parallel` rank files, all from
// this process, crash-safe as save_checkpoint (the same temporary directory, fsyncs, rename and
// tracker last, and the same messages): the file of tensor-parallel rank r and stage s is
// checkpoint_rank_directory_name(r, s, pipeline_parallel) (mp_rank_0r without stages,
// mp_rank_0r_00s with), made by make_rank_file(r, s) when its turn comes (stage by stage, the
// ranks of a stage in order; so that a caller can hold one file's tensors at a time: their spans
// need to live until the next call). An iteration goes to DIR/iter_XXXXXXX and the tracker
// names it; with `release`, to DIR/release and the tracker says "release". For tools that write
// every file of a checkpoint themselves (checkpoint_util's resharding); the caller holds DIR's
// save lock (lock_save_directory).
// With `megatron`, the files are Megatron-LM's model_optim_rng.pt (megatron_checkpoint_writer.hpp)
// made from the same metadata and tensors: each file's args are megatron->args(its metadata), its
// layer chunks come from the metadata's record of the arguments, its optimizer's form (fp32 or
// Float16Optimizer's) from recorded_mixed_precision, and its tensors are named for
// megatron->spec.
struct MegatronFileFormat {
  std::function<nlohmann::json(const nlohmann::json& metadata)> args;
  MegatronModuleSpec spec = MegatronModuleSpec::transformer_engine;
};
void write_checkpoint_files(
    const std::filesystem::path& directory, int64_t iteration, bool release,
    int64_t tensor_parallel, int64_t pipeline_parallel,
    const std::function<CheckpointRankFile(int64_t tensor_parallel_rank, int64_t pipeline_rank)>&
        make_rank_file,
    std::ostream& out, const MegatronFileFormat* megatron = nullptr);

// Typed access to a checkpoint's metadata (CheckpointFileReader::metadata()): a missing or
// mistyped field is a common::Error naming `file`, as a corrupt (or foreign) file. Holds a
// reference to `root`.
class CheckpointMetadata {
 public:
  CheckpointMetadata(const nlohmann::json& root, std::filesystem::path file);
  // The object under `key` of the root: missing is an error, and so is another type.
  const nlohmann::json& section(const char* key) const;
  // The object under `key` of `object` (a section's section): missing is an error, and so is
  // another type.
  const nlohmann::json& section(const nlohmann::json& object, const char* key) const {
    if (!object.contains(key)) missing(key);
    if (!object[key].is_object()) wrong_type(object, key);
    return object[key];
  }
  // Whether the root has the (optional) section `key`; present but not an object is an error.
  bool has(const char* key) const;
  template <typename T>
  T get(const nlohmann::json& object, const char* key) const {
    if (!object.contains(key)) missing(key);
    const nlohmann::json& value = object[key];
    // nlohmann/json converts any number to an integer type with a cast: a fraction would be
    // cut, and a value beyond T's range is undefined or wraps. Integers are taken exactly.
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (value.is_number_unsigned()) {
        const auto number = value.template get<uint64_t>();
        if (std::in_range<T>(number)) return static_cast<T>(number);
      } else if (value.is_number_integer()) {
        const auto number = value.template get<int64_t>();
        if (std::in_range<T>(number)) return static_cast<T>(number);
      }
      not_an_integer(object, key, std::to_string(std::numeric_limits<T>::min()),
                     std::to_string(std::numeric_limits<T>::max()));
    } else {
      try {
        return value.template get<T>();
      } catch (const nlohmann::json::exception&) {
        wrong_type(object, key);
      }
    }
  }
  template <typename T>
  T get(const char* key) const { return get<T>(root_, key); }

 private:
  [[noreturn]] void missing(const char* key) const;
  [[noreturn]] void wrong_type(const nlohmann::json& object, const char* key) const;
  [[noreturn]] void not_an_integer(const nlohmann::json& object, const char* key,
                                   const std::string& lowest, const std::string& highest) const;
  const nlohmann::json& root_;
  std::filesystem::path file_;
};

// The distributed optimizer's moments of a checkpoint's rank file (metadata of `file`, whose
// "optimizer" section has "distributed"): elements [wanted.offset, wanted.offset +
// wanted.numel) of that rank's flat buffer of buffer_numel parameters, read from the
// distrib_optim files beside `file` whatever data-parallel size wrote them, into exp_avg and
// exp_avg_sq (wanted.numel each); only the files holding part of the range are opened. A
// missing file, one whose range is not the one expected, or state saved for another count of
// parameters is a common::Error naming it.
bool has_distributed_moments(const CheckpointMetadata& metadata);
void read_distributed_moments(const std::filesystem::path& file, const CheckpointMetadata& metadata,
                              int64_t buffer_numel, ShardRange wanted, std::span<float> exp_avg,
                              std::span<float> exp_avg_sq);

// Loads the checkpoint options.directory's tracker names into model, optimizer and scheduler,
// as finetune, no_load_optim, no_load_rng and the scheduler options say, and returns where
// training stands (all zero with finetune or a release checkpoint). With no tracker it prints
// Megatron's warning and returns nullopt: training starts from scratch. Everything is
// validated before training starts; a checkpoint that does not fit the model is one error
// with a table of the tensors that differ and the flags that would fit. With
// `optimizer_range` the optimizer holds the moments of that range of the model's flat buffer
// (the distributed optimizer's, ZeRO-3's), and only those are read, from either form of file.
// A Megatron-LM checkpoint (megatron_checkpoint.hpp) is read the same way at the tensor- and
// pipeline-parallel sizes it was saved with, each rank its own model_optim_rng.pt; at other
// sizes it is refused with the checkpoint_util command that converts it.
std::optional<TrainingProgress> load_checkpoint(const CheckpointLoadOptions& options,
                                                GptModel<float>& model, AdamW& optimizer,
                                                LearningRateScheduler& scheduler, std::ostream& out,
                                                const ShardRange* optimizer_range = nullptr);

}  // namespace backend
