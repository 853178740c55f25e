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
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <optional>

#include <nlohmann/json.hpp>

#include "backend/common/file_lock.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/arguments.hpp"

namespace backend {

// Where training stands, besides the tensors: what a resumed run continues from.
struct TrainingProgress {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
};

std::filesystem::path checkpoint_tracker_path(const std::filesystem::path& directory);
// DIR/iter_0000500 (Megatron's 'iter_{:07d}').
std::filesystem::path checkpoint_iteration_directory(const std::filesystem::path& directory,
                                                     int64_t iteration);
// DIR/iter_0000500/mp_rank_00/model_optim_rng.bin
std::filesystem::path checkpoint_file_path(const std::filesystem::path& directory, int64_t iteration);

// What the tracker file names. `release` checkpoints (tracker text "release", directory
// DIR/release) are weights to start from, as Megatron's.
struct TrackedCheckpoint {
  int64_t iteration = 0;
  bool release = false;
  std::filesystem::path file;  // the model_optim_rng.bin it points to
};
// nullopt when DIR has no tracker; a tracker that is neither an integer nor "release" is a
// common::Error naming the file.
std::optional<TrackedCheckpoint> read_checkpoint_tracker(const std::filesystem::path& directory);

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

// Saves to arguments.save: parameters, and unless --no-save-optim / --no-save-rng the
// optimizer and scheduler state / the dropout RNG state.
void save_checkpoint(const TrainingArguments& arguments, const TrainingProgress& progress,
                     const GptModel<float>& model, const AdamW& optimizer,
                     const LearningRateScheduler& scheduler, std::ostream& out);

// Saves the weights alone (no optimizer, scheduler or RNG state) as a release checkpoint,
// DIR/release with the tracker text "release", crash-safe as save_checkpoint: weights to start
// from, which load_checkpoint reads as weights only, from iteration 0 (Megatron's release
// checkpoints). checkpoint_util --import-hf writes these.
void save_release_checkpoint(const TrainingArguments& arguments, const GptModel<float>& model,
                             std::ostream& out);

// The arguments a checkpoint was saved with, from its metadata's typed record ("arguments"),
// the inverse of what save_checkpoint records: tools that rebuild the model without its
// command line (checkpoint_util, as Megatron's loader_megatron.py reads the checkpoint's args)
// start from these. Fields the record does not hold keep their defaults; a missing or
// mistyped field is a common::Error naming `file`.
TrainingArguments arguments_from_checkpoint(const nlohmann::json& metadata,
                                            const std::filesystem::path& file);

// Loads the checkpoint arguments.load's tracker names into model, optimizer and scheduler,
// as --finetune, --no-load-optim, --no-load-rng and the scheduler flags say, and returns
// where training stands (all zero with --finetune or a release checkpoint). With no tracker
// it prints Megatron's warning and returns nullopt: training starts from scratch. Everything
// is validated before training starts; a checkpoint that does not fit the current flags is
// one error with a table of the tensors that differ and the flags that would fit.
std::optional<TrainingProgress> load_checkpoint(const TrainingArguments& arguments,
                                                GptModel<float>& model, AdamW& optimizer,
                                                LearningRateScheduler& scheduler, std::ostream& out);

}  // namespace backend
