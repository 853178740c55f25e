// The pretraining of Megatron-LM's pretrain() and train() (megatron/training/training.py), on
// one process or one rank of a parallel layout, as a Trainer: its constructor is Megatron's
// initialisation and setup_model_and_optimizer (the launch, memory and device checks, the model,
// the optimizer and the schedule carved once, the start-up lines), and run() is the rest:
//   load                 --load, or --pretrained-checkpoint's weights (ckpt/)
//   build_datasets       the batch source the data flags name (dataset_provider.hpp)
//   train                for each iteration
//     train_step (train_step.hpp)             the global batch's update, in three parts: the
//                                             next iteration's forward and backward are queued
//                                             before this one's scalars are read where nothing
//                                             in between needs them (may_queue_ahead)
//     TrainingLog (log/training_log.hpp)      TensorBoard scalars, the iteration line
//     SpikeRollback (spike_rollback.hpp)      --rollback-on-spike
//     actions_after_iteration (training_cadence.hpp)
//                                             evaluate (evaluation.hpp), save, exit
//   finish               save, the benchmark report, and validate and test once more when
//                        --eval-iters > 0, as Megatron does.
// Output lines go to `out` in Megatron's formats.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/common/file_lock.hpp"
#include "backend/common/memory_estimate.hpp"
#include "backend/device/arena.hpp"
#include "backend/device/cuda_inventory.hpp"
#include "backend/device/device.hpp"
#include "backend/dist/process_environment.hpp"
#include "backend/dist/process_groups.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/batch_source.hpp"
#include "backend/train/evaluation.hpp"
#include "backend/train/exit_signal_handler.hpp"
#include "backend/train/log/training_log.hpp"
#include "backend/train/spike_rollback.hpp"
#include "backend/train/train_step.hpp"
#include "backend/train/training_cadence.hpp"
#include "backend/train/training_schedule.hpp"

namespace backend {

struct TrainingResult {
  std::vector<IterationRecord> iterations;
  std::optional<double> validation_loss;  // the final validation pass, if any
  std::optional<double> test_loss;
  int64_t parameter_count = 0;
};

// What the trainer needs of the tokenizer the flags name (data/tokenizer.hpp's tokenizer_facts
// of --mock-data's and the tokenizer's flags).
TokenizerFacts tokenizer_facts(const TrainingArguments& arguments);
int64_t tokenizer_vocab_size(const TrainingArguments& arguments);

// The model the arguments describe (validated): what pretrain builds, and what
// checkpoint_util rebuilds from a checkpoint's saved arguments.
GptConfig model_config(const TrainingArguments& arguments);

// What a training step, an evaluation pass and the log read of the (validated) arguments.
TrainStepOptions train_step_options(const TrainingArguments& arguments);
EvaluationOptions evaluation_options(const TrainingArguments& arguments);
LoggedRun logged_run(const TrainingArguments& arguments, int64_t padded_vocab_size);

// The device the arguments ask for (--device): cpu; cuda, the first GPU the runtime sees
// (after CUDA_VISIBLE_DEVICES: one process per GPU, as Megatron's launchers start them); auto,
// CUDA when a GPU is visible, else the CPU. `gpu` describes the GPU chosen. --device cuda
// without a visible GPU is a common::Error.
struct SelectedDevice {
  std::unique_ptr<Device> device;
  std::optional<CudaDeviceProperties> gpu;
};
// The attention backend a GPU device is made with (--attention-backend, --use-flash-attn, as
// device/cuda_context.hpp describes them), logged: --use-flash-attn makes auto flash; auto and
// fused load cuDNN first, and auto becomes flash, with a warning naming why, where cuDNN cannot
// be loaded (fused fails there with the loader's error).
AttentionBackend gpu_attention_backend(const ModelArguments& model);

// On a GPU, the one this process's local rank takes (gpu_for_local_rank), logged with the rank.
SelectedDevice select_device(const TrainingArguments& arguments,
                             const ProcessEnvironment& process = ProcessEnvironment{});

class Trainer {
 public:
  // One process, or one rank of `groups` (process_groups.hpp): every rank makes its Trainer.
  // Rank 0 prints the setup and checkpoint lines and writes the checkpoints, the last rank the
  // iteration and evaluation lines (Megatron's print_rank_0 / print_rank_last); the others
  // print nothing. `source` empty: the mock dataset with --mock-data, else the datasets the
  // data flags name. `arguments`, `out` and `groups` must outlive the Trainer.
  // `selected`: the device, where pretrain() had to choose it before the groups could be made
  // (GPU ranks meeting without MPI); else the Trainer chooses it (select_device).
  Trainer(const TrainingArguments& arguments, std::ostream& out, BatchSource source,
          ProcessGroups& groups, std::optional<SelectedDevice> selected = std::nullopt);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Loads, trains to --train-iters (or an exit condition), saves and evaluates; once.
  TrainingResult run();

 private:
  using Clock = std::chrono::steady_clock;

  void check_launch();
  void check_memory_fits();
  void carve_model_and_optimizer();
  void print_startup_lines();
  void load();
  std::optional<TrainingProgress> load_from(const CheckpointLoadOptions& options);
  void build_datasets();
  bool train();  // false: an exit condition ended it (its line printed)
  // An iteration's step between its queue_gradients and its finish_step (train_step.hpp), and
  // the host time its queueing took (credited to its own iteration's elapsed time when it was
  // queued during the iteration before).
  struct QueuedIteration {
    QueuedStep step;
    double queue_seconds = 0;
    bool queued_ahead = false;
  };
  QueuedIteration queue_iteration(int64_t iteration, int64_t first_sample, bool ahead);
  bool may_queue_ahead(int64_t iteration, const IterationActions& actions) const;
  // --cuda-graph-impl: one log line when a step is captured and when the reason a step ran
  // eagerly changes.
  void report_step_execution(int64_t iteration, const QueuedStep& step);
  // `start`: when the iteration's body began; `credited_seconds`: host time of queueing that
  // belongs to this iteration but was spent in another's body (plus) or the reverse (minus).
  TrainStepResult finish_iteration(int64_t iteration, QueuedIteration& queued,
                                   Clock::time_point start, double credited_seconds);
  int64_t roll_back(int64_t iteration, const Spike& spike);
  ExitConditions exit_conditions();
  void print_exit_line(int64_t iteration, const ExitConditions& conditions);
  void save(int64_t iteration);
  double evaluate_and_log(Split split, int64_t& consumed_samples, const std::string& prefix,
                          int64_t iteration);
  double measure_peak() const;
  // The GEMMs' element type on a GPU, the MFU reference's: the model's working type.
  ElementType gemm_type() const { return working_type(config_.mixed_precision, ElementType::f32); }
  void finish();

  const TrainingArguments& a_;
  const Clock::time_point setup_start_;
  std::ostream& printed_;
  std::ostream discarded_{nullptr};
  std::ostream& out_;       // rank 0's lines
  std::ostream& out_last_;  // the last rank's lines
  // The groups' communicators are replaced once the device is known (route_collectives):
  // they are reached through groups_, never held.
  ProcessGroups& groups_;
  Communicator& world() const { return *groups_.world; }
  Communicator& data_parallel() const { return *groups_.data_parallel; }
  // The data-parallel group as the gradients are summed over it: itself, or through bf16
  // (--grad-reduce-in-bf16 under bf16 mixed precision, more than one data-parallel rank).
  Communicator& gradient_group() const {
    return bf16_gradient_reduction_ ? *bf16_gradient_reduction_ : data_parallel();
  }
  const RankCoordinates coordinates_;
  BatchSource source_;

  TokenizerFacts tokenizer_;
  GptConfig config_;
  std::optional<ExitSignalHandler> exit_signal_;
  SelectedDevice selected_;
  common::MemoryEstimate estimate_;
  // --grad-reduce-in-bf16's view of the data-parallel group (gradient_group()): made with the
  // device, before the model that may shard over it.
  std::unique_ptr<Communicator> bf16_gradient_reduction_;
  // --cuda-graph-impl with tensor or pipeline parallelism or ZeRO-3: the model's
  // tensor-parallel, pipeline, embedding and sharded groups through make_captured_collectives,
  // so that a captured step holds their collectives in their places (made before the model,
  // which holds them).
  std::unique_ptr<Communicator> captured_tensor_parallel_;
  std::unique_ptr<Communicator> captured_pipeline_parallel_;
  std::unique_ptr<Communicator> captured_embedding_;
  std::unique_ptr<Communicator> captured_sharded_data_parallel_;
  // Everything the run keeps on the device, carved once; no step allocates.
  std::optional<GptModel<float>> model_;
  std::optional<AdamW> optimizer_;
  // --use-distributed-optimizer: this rank's range of the flat buffers and the buffer its
  // reduce-scattered gradients land in.
  std::optional<GradientShard> shard_;
  Arena shard_arena_;
  // --cuda-graph-impl local: the captured steps (train_step.hpp), dropped before the model, the
  // optimizer and the device whose memory and stream they hold.
  std::optional<StepGraphs> graphs_;
  std::string last_eager_reason_;
  std::optional<LearningRateScheduler> scheduler_;
  std::optional<GlobalBatchSizeSchedule> batch_sizes_;
  std::string peak_name_;
  std::optional<double> peak_flops_;  // --log-throughput's measured GEMM peak
  std::optional<TrainingLog> log_;
  std::optional<common::ExclusiveFileLock> save_lock_;  // one live run per --save directory

  TrainingProgress resumed_;
  int64_t last_saved_iteration_ = -1;  // a checkpoint of this iteration exists in --save
  int64_t consumed_train_ = 0;
  int64_t consumed_valid_ = 0;
  bool test_split_skipped_ = false;  // an empty test split: no test pass, as in Megatron
  SpikeRollback spike_rollback_;
  bool spike_injected_ = false;      // --inject-loss-spike-at-iteration fires once
  bool memory_reported_ = false;     // Megatron's report_memory line, once
  bool buckets_reported_ = false;    // --overlap-grad-reduce's bucket count, once
  TrainingResult result_;
};

// The whole training in one call: Trainer(arguments, out, source, groups).run().
TrainingResult pretrain(const TrainingArguments& arguments, std::ostream& out,
                        BatchSource source = {});
TrainingResult pretrain(const TrainingArguments& arguments, std::ostream& out, BatchSource source,
                        ProcessGroups& groups);

}  // namespace backend
