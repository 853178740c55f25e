// Megatron's pretrain() loop on one process; see trainer.hpp.
#include "backend/train/trainer.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/common/checked_math.hpp"
#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/file_lock.hpp"
#include "backend/common/memory_estimate.hpp"
#include "backend/data/gpt2_bpe_tokenizer.hpp"
#include "backend/data/tokenizer.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/device/cuda_device.hpp"
#include "backend/device/cuda_inventory.hpp"
#include "backend/device/cudnn_library.hpp"
#include "backend/dist/captured_collectives.hpp"
#include "backend/dist/device_collectives.hpp"
#include "backend/dist/process_environment.hpp"
#include "backend/model/bf16_gradient_reduction.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/ops/reduction.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/dataset_provider.hpp"
#include "backend/train/evaluation.hpp"
#include "backend/train/exit_signal_handler.hpp"
#include "backend/train/exp_manager_files.hpp"
#include "backend/train/log/benchmark_report.hpp"
#include "backend/train/log/training_log.hpp"
#include "backend/train/pipeline_schedule.hpp"
#include "backend/train/spike_detector.hpp"
#include "backend/train/train_step.hpp"
#include "backend/train/training_cadence.hpp"
#include "backend/train/training_schedule.hpp"

namespace backend {

namespace {

using Clock = std::chrono::steady_clock;

// --inject-loss-spike-at-iteration multiplies every parameter by this before that iteration's
// step: real damage (the logits grow by orders of magnitude, so the loss is far beyond any
// --spike-threshold a run would use, and finite), which only restoring the weights undoes.
constexpr double kInjectedWeightFactor = 100.0;

// What a refusal for memory suggests.
constexpr const char* kWaysOut =
    "Lower --micro-batch-size or --seq-length, recompute activations (--recompute-granularity "
    "full --recompute-method uniform --recompute-num-layers 1), or train a smaller model.";

}  // namespace

GptConfig model_config(const TrainingArguments& a) {
  return gpt_config(a.model, tokenizer_vocab_size(a), a.parallelism.tensor_model_parallel_size);
}

TrainStepOptions train_step_options(const TrainingArguments& a) {
  return {.micro_batch_size = a.run.micro_batch_size,
          .seq_length = a.model.seq_length,
          .calculate_per_token_loss = a.data.calculate_per_token_loss,
          .clip_grad = a.optimizer.clip_grad,
          .overlap_grad_reduce = a.parallelism.overlap_grad_reduce,
          .overlap_param_gather = a.parallelism.overlap_param_gather,
          .overlap_p2p_communication = a.parallelism.overlap_p2p_communication(),
          .ddp_bucket_size = a.parallelism.ddp_bucket_size.value_or(0),
          .log_params_norm = a.logging.log_params_norm,
          .log_num_zeros_in_grad = a.logging.log_num_zeros_in_grad};
}

EvaluationOptions evaluation_options(const TrainingArguments& a) {
  return {.micro_batch_size = a.run.micro_batch_size,
          .global_batch_size = a.run.global_batch_size,
          .seq_length = a.model.seq_length,
          .eval_iters = a.evaluation.eval_iters,
          .calculate_per_token_loss = a.data.calculate_per_token_loss};
}

LoggedRun logged_run(const TrainingArguments& a, int64_t padded_vocab_size) {
  return {.model = a.model,
          .padded_vocab_size = padded_vocab_size,
          .micro_batch_size = a.run.micro_batch_size,
          .global_batch_size = a.run.global_batch_size,
          .train_iters = a.run.train_iters,
          .parallelism = a.parallelism};
}

AttentionBackend gpu_attention_backend(const ModelArguments& model) {
  AttentionBackend backend = model.attention_backend;
  if (model.use_flash_attn && backend == AttentionBackend::automatic) {
    backend = AttentionBackend::flash;
  }
  const std::string_view name = common::enum_name(backend);
  if (uses_cudnn(backend)) {
    try {
      const LoadedCudnn cudnn = load_cudnn();
      spdlog::info("attention: cuDNN {}.{}.{} ({}) where it runs the call{}", cudnn.version / 10000,
                   cudnn.version / 100 % 100, cudnn.version % 100, cudnn.file,
                   backend == AttentionBackend::fused ? "" : ", else our kernels");
    } catch (const common::Error& error) {
      if (backend == AttentionBackend::fused) throw;
      const std::string reason = error.what();
      spdlog::warn(
          "--attention-backend auto: cuDNN is not available ({}); attention runs on "
          "our kernels (as --attention-backend flash)",
          reason.substr(0, reason.find('\n')));
      return AttentionBackend::flash;
    }
  } else if (backend == AttentionBackend::flash) {
    spdlog::info(
        "--attention-backend {}: bf16 and fp16 attention with head dimension 64 or "
        "128 runs on our tensor-core kernels (flash_attention_forward/backward); other "
        "shapes and fp32 on the CUDA-core kernels",
        model.use_flash_attn ? "flash (--use-flash-attn)" : name);
  } else {
    spdlog::info("--attention-backend {}: attention runs on our CUDA-core kernels", name);
  }
  return backend;
}

SelectedDevice select_device(const TrainingArguments& arguments,
                             const ProcessEnvironment& process) {
  if (arguments.device == DeviceChoice::cpu) return {std::make_unique<CpuDevice>(), std::nullopt};
  const auto inventory = discover_cuda_devices();
  if (inventory.devices.empty()) {
    if (arguments.device == DeviceChoice::cuda) {
      common::fail("--device cuda: no GPU is visible to this process ({}); use --device cpu, "
                   "or --device auto to train on a GPU where there is one",
                   inventory.unavailable_reason);
    }
    spdlog::info("device: CPU (no GPU: {})", inventory.unavailable_reason);
    return {std::make_unique<CpuDevice>(), std::nullopt};
  }
  const int64_t visible = std::ssize(inventory.devices);
  const CudaDeviceProperties& gpu =
      inventory.devices[static_cast<size_t>(gpu_for_local_rank(process.local_rank, visible))];
  SelectedDevice selected{
      make_cuda_device(gpu.index, {.attention_backend = gpu_attention_backend(arguments.model),
                                   .gemm_autotune = arguments.gemm_autotune}),
      gpu};
  if (process.world_size > 1) {
    // Every rank's line (the only per-rank setup line), so a wrong placement shows in the log.
    spdlog::info("device: {} for rank {} of {} (local rank {} on {}, {} visible GPU{})",
                 selected.device->name(), process.rank, process.world_size, process.local_rank,
                 process.node, visible, visible == 1 ? "" : "s");
  } else {
    spdlog::info("device: {}", selected.device->name());
  }
  return selected;
}

namespace {

// The model's mixed precision (GptConfig::mixed_precision): --bf16 or --fp16 on the CUDA
// device, in every layout.
MixedPrecision mixed_precision_of(const TrainingArguments& a, const Device& device) {
  if (device.memory_kind() != MemoryKind::cuda) return MixedPrecision::none;
  if (a.precision.bf16) return MixedPrecision::bf16;
  if (a.precision.fp16) return MixedPrecision::fp16;
  return MixedPrecision::none;
}

// The precision the flags ask for, as far as this device computes it (`precision`: the model's
// GptConfig::mixed_precision, from mixed_precision_of): --bf16 or --fp16 on the CUDA device is
// mixed precision; the CPU path computes in fp32 (--fp16's loss scaling applies on every device).
// Every rank derives the same from the same flags, so the first rank alone says it.
void note_precision(const TrainingArguments& a, MixedPrecision precision, bool first_rank) {
  if (!a.precision.bf16 && !a.precision.fp16) return;
  const char* flag = a.precision.bf16 ? "--bf16" : "--fp16";
  if (precision != MixedPrecision::none) {
    const char* type = a.precision.bf16 ? "bf16" : "fp16";
    spdlog::info(
        "{}: {} weights and activations; fp32 master weights, gradients and AdamW "
        "moments{}",
        flag, type, a.precision.fp16 ? "; loss scaling guards fp16's range" : "");
    return;
  }
  if (!first_rank) return;
  spdlog::warn("{}: the CPU path computes in fp32{}; mixed precision applies to the CUDA path",
               flag, a.precision.fp16 ? " (its dynamic loss scaling runs, as Megatron's)" : "");
}

// The parameters of a model's layout (a ZeRO-3 model's buffers hold its range of them only).
int64_t whole_count_of(const GptModel<float>& model) {
  return model.tensors().back().offset + model.tensors().back().numel;
}

// The parameter groups' parts inside `range`, as offsets from its start: the distributed
// optimizer's view of the weight-decay groups.
std::vector<ParameterGroup> groups_in_range(const std::vector<ParameterGroup>& groups,
                                            const ShardRange& range) {
  std::vector<ParameterGroup> inside;
  for (const auto& group : groups) {
    const int64_t begin = std::max(group.offset, range.offset);
    const int64_t end = std::min(group.offset + group.numel, range.offset + range.numel);
    if (begin < end) inside.push_back({begin - range.offset, end - begin, group.weight_decay});
  }
  return inside;
}

// Benchmark mode's summary (--benchmark-output): the JSON file and its line.
void report_benchmark(const TrainingArguments& a, int64_t padded_vocab_size,
                      int64_t parameter_count, const std::vector<IterationRecord>& iterations,
                      double peak_flops, std::string_view peak_name, std::ostream& out) {
  std::vector<double> step_ms;
  for (const auto& record : iterations) step_ms.push_back(record.elapsed_ms);
  const LoggedRun run = logged_run(a, padded_vocab_size);
  const BenchmarkSummary summary = summarize_benchmark(run, step_ms, peak_flops);
  write_benchmark_json(a.logging.benchmark_output, run, parameter_count, summary);
  out << fmt::format(
      " benchmark: median {:.1f} ms/iteration | {:.1f} tokens/s | {:.3f} TFLOP/s | "
      "MFU {:.1f}% of the measured {:.3f} TFLOP/s {} | written to {}\n",
      summary.median_step_ms, summary.tokens_per_second, summary.tflops_per_device,
      100.0 * summary.mfu, summary.peak_flops / 1e12, peak_name, a.logging.benchmark_output);
  out.flush();
}

}  // namespace

TokenizerFacts tokenizer_facts(const TrainingArguments& arguments) {
  return tokenizer_facts(arguments.tokenizer, arguments.data.mock_data);
}

int64_t tokenizer_vocab_size(const TrainingArguments& arguments) {
  return tokenizer_facts(arguments).vocab_size;
}

TrainingResult pretrain(const TrainingArguments& a, std::ostream& out, BatchSource source) {
  ProcessGroups one_process = single_process_groups();
  return pretrain(a, out, std::move(source), one_process);
}

TrainingResult pretrain(const TrainingArguments& a, std::ostream& out, BatchSource source,
                        ProcessGroups& groups) {
  // GPU ranks started without MPI (parse_arguments validated them for the launcher's world):
  // the device first, then the NCCL world through the rendezvous, then the groups.
  const ProcessEnvironment process = read_process_environment();
  if (groups.world->size() == 1 && process.world_size > 1 && !started_through_mpi(process) &&
      a.parallelism.world_size == process.world_size) {
    SelectedDevice selected = select_device(a, process);
    if (!selected.gpu) {
      common::fail("{} (on the CPU, Open MPI carries the collectives)",
                   not_started_through_mpi(process, process.world_size));
    }
    groups = make_groups_without_mpi(*selected.device, process, parallel_layout(a.parallelism),
                                     a.parallelism);
    Trainer trainer(a, out, std::move(source), groups, std::move(selected));
    return trainer.run();
  }
  Trainer trainer(a, out, std::move(source), groups);
  return trainer.run();
}

// ---- setup: Megatron's initialize_megatron and setup_model_and_optimizer, less the load

Trainer::Trainer(const TrainingArguments& arguments, std::ostream& printed, BatchSource source,
                 ProcessGroups& groups, std::optional<SelectedDevice> selected)
    : a_(arguments),
      setup_start_(Clock::now()),
      printed_(printed),
      // Megatron's print_rank_0 and print_rank_last: the setup, checkpoint and exit lines come
      // from rank 0, the iteration and evaluation lines from the last rank.
      out_(groups.is_first_rank() ? printed : discarded_),
      out_last_(groups.is_last_rank() ? printed : discarded_),
      groups_(groups),
      coordinates_(groups.coordinates()),
      source_(std::move(source)),
      spike_rollback_(arguments.spike, rollback_load_options(arguments)) {
  // The model's shape is checked, and its memory estimated once the device is known (bf16 on a
  // GPU), before anything of the model is written or allocated.
  // The tokenizer is read once, for its size and its end-of-document id.
  tokenizer_ = tokenizer_facts(a_);
  config_ = gpt_config(a_.model, tokenizer_.vocab_size, a_.parallelism.tensor_model_parallel_size);
  // Every training forward is given its backward's scale (train_step.cpp): no dlogits scratch.
  config_.classifier_gradient_in_forward = true;
  check_launch();
  selected_ = selected ? std::move(*selected) : select_device(a_, read_process_environment());
  route_collectives(groups_, *selected_.device, a_.parallelism);
  config_.mixed_precision = mixed_precision_of(a_, *selected_.device);
  check_memory_fits();
  if (!a_.logging.log_dir.empty() && groups_.is_first_rank()) {
    write_exp_manager_files(a_.logging.log_dir, a_);
  }
  note_precision(a_, config_.mixed_precision, groups_.is_first_rank());
  carve_model_and_optimizer();
  // --fp16's dynamic loss scaling (or --loss-scale): the optimizer holds the scaler, as
  // Megatron's mixed-precision optimizer does, so checkpoints carry its state.
  optimizer_->set_loss_scaler(make_loss_scaler(a_.precision));
  result_.parameter_count = whole_count_of(*model_);
  scheduler_.emplace(learning_rate_schedule(a_));
  batch_sizes_.emplace(batch_size_schedule(a_, groups_.layout.data_parallel));
  if (!source_ && a_.data.mock_data) {
    source_ = [dataset = MockDataset(a_.run.seed, config_.vocab_size, a_.model.seq_length)](
                  Split split, int64_t first, int64_t batch, std::span<int32_t> tokens,
                  std::span<int32_t> labels) {
      dataset.fill_batch(split, first, batch, tokens, labels);
    };
  }
  print_startup_lines();
  // --log-throughput's MFU (our extension) is against this machine's measured GEMM peak: the
  // CPU's sgemm, or the GPU's GEMM in the model's precision, measured once here (a fraction of
  // a second); benchmark mode reuses it.
  const bool on_gpu = selected_.device->memory_kind() == MemoryKind::cuda;
  peak_name_ = on_gpu ? fmt::format("{} GEMM peak", element_name(gemm_type())) : "sgemm peak";
  if (a_.logging.log_throughput) {
    peak_flops_ = measure_peak();
    spdlog::info("measured {}: {:.3f} TFLOP/s (the MFU reference)", peak_name_, *peak_flops_ / 1e12);
  }
  // TensorBoard and the iteration lines are the last rank's (Megatron's get_tensorboard_writer).
  log_.emplace(a_.logging, logged_run(a_, config_.padded_vocab_size), peak_flops_, out_last_,
               peak_name_, groups_.is_last_rank());
  // Data-parallel rank 0 writes the model's files, one per (tensor-parallel rank, stage), and
  // with the distributed optimizer every rank its moments' file; rank 0 makes the directories
  // and moves the tracker, so it holds the lock (checkpoint.hpp) until training ends.
  if (!a_.checkpointing.save.empty() && groups_.is_first_rank()) {
    save_lock_.emplace(lock_save_directory(a_.checkpointing.save));
  }
}

// What is wrong with the launch, before anything is built.
void Trainer::check_launch() {
  // The report is written after training; a --benchmark-output that can never take it (a
  // device, a FIFO, a directory) is refused now, not after the run.
  if (!a_.logging.benchmark_output.empty() && groups_.is_last_rank()) {
    common::output_target(a_.logging.benchmark_output, "--benchmark-output");
  }
  const ProcessEnvironment process = read_process_environment();
  if (process.world_size != world().size()) {
    common::fail("{}", not_started_through_mpi(process, process.world_size));
  }
  if (a_.parallelism.world_size != world().size()) {
    common::fail("the arguments were validated for {} processes, but {} run",
                 a_.parallelism.world_size, world().size());
  }
  // Megatron's --exit-on-missing-checkpoint, checked before anything is built: a mistyped
  // --load stops the job at once instead of training from scratch (Megatron exits there with
  // status 0; an error here, since the job did nothing it was asked to).
  if (a_.checkpointing.exit_on_missing_checkpoint && !a_.checkpointing.load.empty()) {
    require_checkpoint(a_.checkpointing.load, "--load",
                       "--exit-on-missing-checkpoint is given: correct the path, or leave the flag "
                       "out to start from scratch when there is nothing to load");
  }
  // Megatron installs its signal handler at initialisation: a notice during the setup stops
  // the run after its first iteration.
  if (a_.run.exit_signal_handler) {
    const std::optional<int> number = exit_signal_number(a_.run.exit_signal);
    if (!number) {
      common::fail("--exit-signal {}: not a signal the handler takes", a_.run.exit_signal);
    }
    exit_signal_.emplace(*number);
  }
}

// One rank's share of the model under this layout (the launcher's preflight computes the same),
// against the GPU's memory or, for CPU ranks, the memory this node's ranks share: a model this
// machine cannot hold is refused with the estimate.
void Trainer::check_memory_fits() {
  const ParallelLayout& layout = groups_.layout;
  estimate_ =
      training_memory_estimate(config_, a_.run.micro_batch_size, a_.model.seq_length,
                               {.tensor_parallel = layout.tensor_parallel,
                                .data_parallel = layout.data_parallel,
                                .pipeline_parallel = layout.pipeline_parallel,
                                .sequence_parallel = a_.parallelism.sequence_parallel,
                                .distributed_optimizer = a_.parallelism.use_distributed_optimizer,
                                .zero_stage = a_.parallelism.zero_stage,
                                .offload_optimizer = a_.parallelism.offload_optimizer,
                                .offload_parameters = a_.parallelism.offload_parameters,
                                .virtual_pipeline_chunks = a_.virtual_pipeline_chunks()});
  const std::optional<CudaDeviceProperties>& gpu = selected_.gpu;
  if (gpu) {
    common::require_memory_fits(
        estimate_,
        {static_cast<double>(gpu->total_memory_bytes),
         fmt::format("the memory of GPU {} ({})", gpu->index, gpu->name)},
        "pretrain_gpt: the model", kWaysOut);
    return;
  }
  // The world split by host name (every rank takes part) gives this node's ranks.
  const int64_t node_ranks =
      world().size() == 1
          ? 1
          : world()
                .split(static_cast<int64_t>(std::hash<std::string>{}(common::local_host_name()) &
                                            0x3fffffff),
                       world().rank(), "node")
                ->size();
  common::MemoryEstimate node_estimate = estimate_;
  // Offloaded state is in host memory, which on CPU ranks is the same memory.
  node_estimate.optimizer_bytes += node_estimate.host_bytes;
  node_estimate.host_bytes = 0;
  const auto ranks = static_cast<double>(node_ranks);
  node_estimate.weights_bytes *= ranks;
  node_estimate.gradients_bytes *= ranks;
  node_estimate.optimizer_bytes *= ranks;
  node_estimate.activations_bytes *= ranks;
  common::require_memory_fits(
      node_estimate, common::available_memory(),
      node_ranks == 1 ? std::string("pretrain_gpt: the model")
                      : fmt::format("pretrain_gpt: the model's {} ranks on this machine", node_ranks),
      kWaysOut);
}

// Everything the run keeps on the device is carved here, once: parameters and gradients, the
// activations of the one micro-batch shape every step and evaluation uses, and the optimizer's
// moments. Running out of GPU memory names the region being carved and this layout's estimate.
void Trainer::carve_model_and_optimizer() {
  Device& device = *selected_.device;
  if (a_.parallelism.grad_reduce_in_bf16) {
    if (config_.mixed_precision != MixedPrecision::bf16) {
      // Alike on every rank: the first says it.
      if (groups_.is_first_rank())
        spdlog::warn(
            "--grad-reduce-in-bf16 without bf16 mixed precision ({}): the gradients are "
            "summed in fp32",
            a_.precision.bf16 ? "the CPU path computes in fp32" : "no --bf16");
    } else if (data_parallel().size() > 1) {
      bf16_gradient_reduction_ = make_bf16_gradient_reduction(data_parallel(), device);
    }
  }
  const bool zero3 = a_.parallelism.zero_stage == 3;
  if (a_.cuda_graph_impl != CudaGraphImpl::none) {
    if (groups_.tensor_parallel->size() > 1) {
      captured_tensor_parallel_ = make_captured_collectives(*groups_.tensor_parallel, device);
    }
    if (groups_.pipeline_parallel->size() > 1) {
      captured_pipeline_parallel_ = make_captured_collectives(*groups_.pipeline_parallel, device);
      captured_embedding_ = make_captured_collectives(*groups_.embedding, device);
    }
    if (zero3) {
      captured_sharded_data_parallel_ = make_captured_collectives(gradient_group(), device);
    }
  }
  // The captured group where there is one, else the group itself.
  const auto held = [](const std::unique_ptr<Communicator>& captured,
                       const std::unique_ptr<Communicator>& group) {
    return captured ? captured.get() : group.get();
  };
  Communicator* sharded_data_parallel = nullptr;
  if (zero3) {
    sharded_data_parallel =
        captured_sharded_data_parallel_ ? captured_sharded_data_parallel_.get() : &gradient_group();
  }
  try {
    const PipelineStage stage{.pipeline_parallel = groups_.layout.pipeline_parallel,
                              .rank = coordinates_.pipeline,
                              .virtual_chunks = a_.virtual_pipeline_chunks()};
    GptModel<float>& model = model_.emplace(
        config_, device,
        ModelParallelism{
            .tensor_parallel = held(captured_tensor_parallel_, groups_.tensor_parallel),
            .sequence_parallel = a_.parallelism.sequence_parallel,
            .pipeline = stage,
            .pipeline_parallel = held(captured_pipeline_parallel_, groups_.pipeline_parallel),
            .embedding = held(captured_embedding_, groups_.embedding),
            .sharded_data_parallel = sharded_data_parallel});
    // The dropout masks come from --seed too; dropout_key() mixes the seed into a stream of
    // its own, unrelated to the initialisation's. Step 0 is the first micro batch's forward.
    model.init_parameters(a_.run.seed);
    model.set_dropout_seed(a_.run.seed);
    // A pipeline stage holds the micro batches its schedule keeps in flight, for the largest
    // global batch (the last of a ramp-up).
    int64_t slots = 1;
    if (!stage.whole_model()) {
      const int64_t micro_batches =
          a_.run.global_batch_size / (a_.run.micro_batch_size * groups_.layout.data_parallel);
      slots = pipeline_slots(pipeline_schedule(stage.pipeline_parallel, stage.rank,
                                               stage.virtual_chunks, micro_batches,
                                               a_.parallelism.overlap_p2p_communication()));
    }
    model.reserve(a_.run.micro_batch_size, a_.model.seq_length, slots);
    std::vector<ParameterGroup> groups;
    for (const auto& tensor : model.tensors()) {
      groups.push_back({tensor.offset, tensor.numel, tensor.weight_decay});
    }
    const AdamWConfig adam = adamw_config(a_.optimizer);
    const int64_t parameter_count = model.parameter_buffer().numel;
    if (model.sharded_over_data_parallel()) {
      // ZeRO-3: the moments of the model's own range, as the distributed optimizer's.
      const ShardRange range = model.parameter_shard_range();
      optimizer_.emplace(adam, groups_in_range(groups, range), range.numel, device);
    } else if (a_.parallelism.use_distributed_optimizer) {
      // The moments of this rank's range alone, and the buffer its gradients land in.
      const ShardRange range =
          shard_range(parameter_count, data_parallel().size(), data_parallel().rank());
      ArenaLayout layout;
      const int64_t region = layout.add("the distributed optimizer's gradient shard",
                                        ElementType::f32, range.numel);
      shard_arena_ = Arena(device, std::move(layout), "gradient shard");
      shard_ = GradientShard{range, shard_arena_.view(region)};
      optimizer_.emplace(adam, groups_in_range(groups, range), range.numel, device);
    } else {
      optimizer_.emplace(adam, groups, parameter_count, device);
    }
    if (a_.cuda_graph_impl != CudaGraphImpl::none) {
      StepGraphs& graphs = graphs_.emplace();
      graphs.warmup_steps = a_.cuda_graph_warmup_steps;
    }
  } catch (const common::Error& error) {
    // CudaDevice::allocate_zeroed's words; other errors (and the CPU's own out-of-memory
    // message, after the host check) pass through as they are.
    if (!selected_.gpu ||
        std::string_view(error.what()).find("out of GPU memory") == std::string_view::npos) {
      throw;
    }
    std::string table;
    for (const auto& line : common::format_memory_estimate(estimate_)) table += "\n" + line;
    common::fail("{}\nThe estimate for this layout (the launcher's preflight table):{}\n{}",
                 error.what(), table, kWaysOut);
  }
}

// Megatron's start-up lines (build_num_microbatches_calculator, _initialize_distributed,
// initialize_model_parallel, the vocabulary's padding, the parameter count), in its order.
void Trainer::print_startup_lines() {
  if (a_.run.rampup_batch_size.empty()) {
    out_ << fmt::format("setting number of micro-batches to constant {}\n",
                        batch_sizes_->num_micro_batches(0));
  }
  out_ << "> initializing torch distributed ...\n";
  out_ << fmt::format("> initialized tensor model parallel with size {}\n",
                      groups_.layout.tensor_parallel);
  out_ << fmt::format("> initialized pipeline model parallel with size {}\n",
                      groups_.layout.pipeline_parallel);
  out_ << fmt::format(" > padded vocab (size: {}) with {} dummy tokens (new size: {})\n",
                      config_.vocab_size, config_.padded_vocab_size - config_.vocab_size,
                      config_.padded_vocab_size);
  // Megatron prints this line from every model-parallel rank of data-parallel rank 0, each with
  // its own shard's count (one write per line, so ranks' lines do not interleave).
  if (coordinates_.data == 0) {
    printed_ << fmt::format(
        " > number of parameters on (tensor, pipeline) model parallel rank ({}, {}): {}\n",
        coordinates_.tensor, coordinates_.pipeline, result_.parameter_count);
    printed_.flush();
  }
  if (a_.run.train_samples > 0) {
    out_ << fmt::format("setting training iterations to {}\n", a_.run.train_iters);
  }
  out_ << fmt::format("time to initialize megatron (seconds): {:.3f}\n",
                      std::chrono::duration<double>(Clock::now() - setup_start_).count());
}

double Trainer::measure_peak() const {
  Device& device = *selected_.device;
  return device.memory_kind() == MemoryKind::cuda
             ? measure_device_gemm_peak(device, gemm_type())
             : measure_cpu_sgemm_peak();
}

// ---- the run

TrainingResult Trainer::run() {
  load();
  build_datasets();
  out_ << fmt::format("[before the start of training step] datetime: {}\n",
                      format_timestamp(std::time(nullptr)));
  out_.flush();
  if (train()) finish();
  return std::move(result_);
}

// Where training resumes (Megatron's load_checkpoint in setup_model_and_optimizer): --load, or
// with nothing to resume there, --pretrained-checkpoint's weights with a fresh optimizer,
// scheduler and RNG (Megatron's tasks/finetune_utils.py).
void Trainer::load() {
  std::optional<TrainingProgress> loaded;
  if (!a_.checkpointing.load.empty()) {
    loaded = load_from(checkpoint_load_options(a_));
    std::error_code ignored;
    if (loaded && !a_.checkpointing.save.empty() && !a_.checkpointing.finetune &&
        std::filesystem::equivalent(a_.checkpointing.load, a_.checkpointing.save, ignored)) {
      last_saved_iteration_ = loaded->iteration;
    }
  }
  if (!loaded && !a_.checkpointing.pretrained_checkpoint.empty()) {
    CheckpointLoadOptions pretrained = checkpoint_load_options(a_);
    pretrained.directory = a_.checkpointing.pretrained_checkpoint;
    pretrained.finetune = true;
    pretrained.no_load_optim = true;
    pretrained.no_load_rng = true;
    require_checkpoint(a_.checkpointing.pretrained_checkpoint, "--pretrained-checkpoint",
                       "point it at the --save directory of pretrain_gpt or checkpoint_util "
                       "(--import-hf --save)");
    loaded = load_from(pretrained);
    if (!loaded) {  // its tracker went away between the check and the load
      common::fail("--pretrained-checkpoint {}: {} disappeared while the checkpoint was loaded",
                   a_.checkpointing.pretrained_checkpoint,
                   checkpoint_tracker_path(a_.checkpointing.pretrained_checkpoint).string());
    }
  }
  if (loaded) resumed_ = *loaded;
  consumed_train_ = resumed_.consumed_train_samples;
  consumed_valid_ = resumed_.consumed_valid_samples;
}

// The checkpoint `options` name into the model, optimizer and scheduler; nothing when it holds
// none. The distributed optimizer and ZeRO-3 read the moments of their range alone; ZeRO-3
// loads the whole model's weights into one process's model and keeps its range of them.
std::optional<TrainingProgress> Trainer::load_from(const CheckpointLoadOptions& options) {
  GptModel<float>& model = *model_;
  const bool sharded = model.sharded_over_data_parallel();
  std::optional<GptModel<float>> whole_model;
  if (sharded) {
    whole_model.emplace(config_, *selected_.device);
    whole_model->set_dropout_seed(model.dropout_seed());
  }
  std::optional<ShardRange> optimizer_range;
  if (shard_) optimizer_range = shard_->range;
  if (sharded) optimizer_range = model.parameter_shard_range();
  const auto loaded = load_checkpoint(options, whole_model ? *whole_model : model, *optimizer_,
                                      *scheduler_, out_,
                                      optimizer_range ? &*optimizer_range : nullptr);
  if (whole_model && loaded) {
    const ShardRange range = model.parameter_shard_range();
    model.copy_parameters_from_host(whole_model->parameters().subspan(
        static_cast<size_t>(range.offset), static_cast<size_t>(range.numel)));
    model.set_dropout_seed(whole_model->dropout_seed());
    model.set_dropout_step(whole_model->dropout_step());
  }
  return loaded;
}

// Megatron builds the datasets after the model, the optimizer and the checkpoint: rank 0 first,
// as Megatron builds the index caches on rank 0 and the others read them.
void Trainer::build_datasets() {
  if (!source_) {
    if (groups_.is_first_rank()) {
      source_ = build_dataset_batch_source(a_, config_.vocab_size, out_, &test_split_skipped_);
    }
    world().barrier();
    if (!groups_.is_first_rank()) {
      source_ = build_dataset_batch_source(a_, config_.vocab_size, out_, &test_split_skipped_);
    }
    out_ << fmt::format("[after dataloaders are built] datetime: {}\n",
                        format_timestamp(std::time(nullptr)));
  }
  // Training and validation both leave the EOD positions out, as Megatron's loss mask does.
  if (a_.data.eod_mask_loss) {
    source_ = mask_end_of_document_losses(std::move(source_), tokenizer_.end_of_document);
  }
}

// Megatron's train(): the iterations from where the run resumed. Each iteration queues its
// update and, where may_queue_ahead allows, the next iteration's forward and backward before it
// waits for its own scalars, so a GPU goes on with the next step while the host reads, logs
// and decides (docs/step_on_device.md, item 3). The order of the device's work, and so every
// bit, is that of one step after another.
bool Trainer::train() {
  std::optional<QueuedIteration> ahead;
  for (int64_t iteration = resumed_.iteration + 1; iteration <= a_.run.train_iters; ++iteration) {
    const auto start = Clock::now();
    QueuedIteration current =
        ahead ? std::move(*ahead) : queue_iteration(iteration, consumed_train_, false);
    ahead.reset();
    queue_update(current.step, *model_, *optimizer_, *scheduler_, train_step_options(a_),
                 gradient_group(), shard_ ? &*shard_ : nullptr,
                 spike_rollback_.learning_rate_factor(), graphs_ ? &*graphs_ : nullptr);
    report_step_execution(iteration, current.step);
    // What follows this iteration depends on its number and the host's exit conditions, not on
    // its results: known before they are read.
    const ExitConditions conditions = exit_conditions();
    const IterationActions actions = actions_after_iteration(a_, iteration, conditions);
    if (may_queue_ahead(iteration, actions)) {
      ahead = queue_iteration(iteration + 1, consumed_train_ + current.step.batch.global_batch_size,
                              true);
    }
    // The host time of queueing an iteration counts as that iteration's.
    const double credited_seconds =
        (current.queued_ahead ? current.queue_seconds : 0.0) - (ahead ? ahead->queue_seconds : 0.0);
    const TrainStepResult step = finish_iteration(iteration, current, start, credited_seconds);
    // A spike is judged before this iteration's evaluation and save: its weights are not kept.
    // Every rank sees the same loss (averaged over data parallelism, broadcast from the last
    // stage), so all decide alike. (Nothing is queued ahead while the spikes are watched.)
    if (const std::optional<Spike> spike = spike_rollback_.observe(step.lm_loss, step.nan)) {
      iteration = roll_back(iteration, *spike);  // the loop goes on at the checkpoint's + 1
      continue;
    }
    if (actions.evaluate) {
      evaluate_and_log(Split::validation, consumed_valid_, fmt::format("iteration {}", iteration),
                       iteration);
    }
    if (actions.save) save(iteration);
    if (actions.exit) {
      print_exit_line(iteration, conditions);
      return false;
    }
  }
  return true;
}

// Whether iteration + 1's forward and backward may be queued before this iteration's scalars are
// read: when nothing between the two needs them or changes what the next one computes. Not
// before an evaluation, a save or an exit (which see the model after this iteration alone), nor
// under --rollback-on-spike (whose judgement may reload the model) or the fp16 loss scaler (the
// next backward takes the scale this iteration's result decides).
bool Trainer::may_queue_ahead(int64_t iteration, const IterationActions& actions) const {
  return iteration < a_.run.train_iters && !actions.evaluate && !actions.save && !actions.exit &&
         !spike_rollback_.watching() && !optimizer_->loss_scaler().enabled();
}

// An iteration's forward and backward, queued (train_step.hpp's queue_gradients) on the samples
// from `first_sample`.
Trainer::QueuedIteration Trainer::queue_iteration(int64_t iteration, int64_t first_sample,
                                                  bool ahead) {
  GptModel<float>& model = *model_;
  const auto start = Clock::now();
  const GlobalBatch batch{.first_sample = first_sample,
                          .global_batch_size = batch_sizes_->global_batch_size(first_sample),
                          .num_micro_batches = batch_sizes_->num_micro_batches(first_sample)};
  if (iteration == a_.spike.inject_loss_spike_at_iteration && !spike_injected_) {
    // The testing aid: the weights are damaged before this step, so its forward spikes and the
    // run goes on from damaged weights unless a rollback restores them.
    spike_injected_ = true;
    ops::scale(model.device(), model.parameter_buffer(), kInjectedWeightFactor);
    model.parameters_updated();
    // A replayed step does not remake a 16-bit working copy (the update writes it): the next
    // steps run eagerly until captured again.
    if (graphs_) graphs_->reset();
  }
  QueuedIteration queued;
  queued.step =
      queue_gradients(model, *optimizer_, source_, batch, train_step_options(a_), gradient_group(),
                      shard_ ? &*shard_ : nullptr, graphs_ ? &*graphs_ : nullptr);
  queued.queued_ahead = ahead;
  queued.queue_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return queued;
}

void Trainer::report_step_execution(int64_t iteration, const QueuedStep& step) {
  if (!graphs_ || step.execution == StepExecution::replayed) return;
  if (step.execution == StepExecution::captured) {
    spdlog::info("step: graphs captured at iteration {} on {} ({}), replayed from the next",
                 iteration, model_->device().name(), step.execution_note);
    last_eager_reason_.clear();
    return;
  }
  if (step.execution_note != last_eager_reason_) {
    spdlog::info("step: eager at iteration {} ({})", iteration, step.execution_note);
    last_eager_reason_ = step.execution_note;
  }
}

// An iteration's scalars read (finish_step), its record and its lines.
TrainStepResult Trainer::finish_iteration(int64_t iteration, QueuedIteration& queued,
                                          Clock::time_point start, double credited_seconds) {
  const TrainStepResult step = finish_step(queued.step, *model_, *optimizer_, *scheduler_);
  const GlobalBatch& batch = queued.step.batch;
  if (!buckets_reported_ && step.gradient_buckets > 0) {
    // Megatron's DistributedDataParallel says it at setup; the buckets are known here after
    // the first backward.
    buckets_reported_ = true;
    out_ << fmt::format("Number of buckets for gradient all-reduce / reduce-scatter: {}\n",
                        step.gradient_buckets);
  }
  consumed_train_ += batch.global_batch_size;
  const double step_seconds =
      std::chrono::duration<double>(Clock::now() - start).count() + credited_seconds;
  Device& device = *selected_.device;
  result_.iterations.push_back({.iteration = iteration,
                                .lm_loss = step.lm_loss,
                                .grad_norm = step.grad_norm,
                                .learning_rate = step.learning_rate,
                                .skipped = step.skipped,
                                .elapsed_ms = 1000.0 * step_seconds,
                                .global_batch_size = batch.global_batch_size,
                                .consumed_samples = consumed_train_,
                                .loss_scale = step.loss_scale,
                                .nan = step.nan,
                                .memory = device.memory_usage(),
                                .params_norm = step.params_norm,
                                .num_zeros_in_grad = step.num_zeros_in_grad});
  log_->add_iteration(result_.iterations.back(),
                      scheduler_->learning_rate() * spike_rollback_.learning_rate_factor());
  // Megatron's report_memory, once, after the first logged interval with a learning rate (the
  // optimizer's state exists by then), from every rank of data-parallel rank 0.
  if (!memory_reported_ && iteration % a_.logging.log_interval == 0 && step.learning_rate > 0) {
    memory_reported_ = true;
    if (coordinates_.data == 0) {
      printed_ << format_memory_line(world().rank(), iteration, device.memory_usage()) << '\n';
      printed_.flush();
    }
  }
  return step;
}

// --rollback-on-spike (docs/checkpoints.md "Loss spikes"): reloads the last checkpoint this run
// saved in --save (weights, optimizer, scheduler, dropout RNG) but keeps the data position: the
// samples since that checkpoint are skipped. Returns the checkpoint's iteration, where the
// iteration numbering continues from.
int64_t Trainer::roll_back(int64_t iteration, const Spike& spike) {
  const std::optional<TrainingProgress> reloaded = load_from(
      spike_rollback_.reload(iteration, spike, consumed_train_, last_saved_iteration_));
  if (!reloaded) spike_rollback_.fail_checkpoint_missing(iteration, spike, last_saved_iteration_);
  // The reloaded master weights are not the ones whose 16-bit working copy the last replayed
  // update wrote, and a replay remakes no working copy: the steps after a rollback run eagerly
  // until captured again, as after an injected spike.
  if (graphs_) graphs_->reset();
  const std::string line = spike_rollback_.rolled_back(iteration, spike, *reloaded, consumed_train_);
  log_->add_rollback(line, iteration, spike_rollback_.rollbacks());
  return reloaded->iteration;
}

// Megatron's --exit-duration-in-mins and --exit-signal-handler, decided by every rank together
// in one max all-reduce: the longest elapsed time, and whether any rank got the signal
// (Megatron all-gathers each rank's flag), so that all of them save and exit after the same
// iteration.
ExitConditions Trainer::exit_conditions() {
  ExitConditions conditions;
  if (a_.run.exit_duration_in_mins <= 0 && !exit_signal_) return conditions;
  std::array<float, 2> exits = {
      static_cast<float>(std::chrono::duration<double>(Clock::now() - setup_start_).count() / 60.0),
      exit_signal_ && exit_signal_->received() ? 1.0F : 0.0F};
  world().all_reduce(host_view(std::span<float>(exits)), ReduceOperation::max);
  conditions.duration_exceeded =
      a_.run.exit_duration_in_mins > 0 && exits[0] > a_.run.exit_duration_in_mins;
  conditions.exit_signal_received = exits[1] > 0;
  return conditions;
}

// Megatron's print_datetime lines of its three exits.
void Trainer::print_exit_line(int64_t iteration, const ExitConditions& conditions) {
  const std::string why =
      conditions.exit_signal_received
          ? fmt::format("exiting program after receiving {}.", a_.run.exit_signal)
      : conditions.duration_exceeded
          ? fmt::format("exiting program after {} minutes",
                        std::chrono::duration<double>(Clock::now() - setup_start_).count() / 60.0)
          : fmt::format("exiting program at iteration {}", iteration);
  out_ << fmt::format("[{}] datetime: {}\n", why, format_timestamp(std::time(nullptr)));
  out_.flush();
}

// Megatron's save_checkpoint. The distributed optimizer and ZeRO-3: each data-parallel rank
// writes its range of the moments to its own file (checkpoint.hpp's OptimizerShard); nothing is
// gathered. ZeRO-3's parameters are gathered into one process's model, which data-parallel
// rank 0 saves (DeepSpeed's consolidated weights), so that any layout loads the checkpoint.
void Trainer::save(int64_t iteration) {
  GptModel<float>& model = *model_;
  // Parameters a captured step's update left owed (--overlap-param-gather) are gathered here,
  // by every rank: the writers alone would wait for the others in the collective.
  model.finish_parameter_gathers();
  const bool sharded = model.sharded_over_data_parallel();
  const int64_t whole_count = whole_count_of(model);
  std::optional<OptimizerShard> optimizer_shard;
  if (shard_ || sharded) {
    optimizer_shard =
        OptimizerShard{.data_parallel = &data_parallel(),
                       .parameter_count = whole_count,
                       .range = sharded ? model.parameter_shard_range() : shard_->range};
  }
  std::optional<GptModel<float>> whole_model;
  if (sharded) {
    std::vector<float> values(static_cast<size_t>(whole_count));
    const ShardRange range = model.parameter_shard_range();
    const auto own = std::span(values).subspan(static_cast<size_t>(range.offset),
                                               static_cast<size_t>(range.numel));
    model.copy_parameters_to_host(own);
    data_parallel().all_gather(host_view(std::span(values)), host_view(own));
    if (coordinates_.data == 0) {
      whole_model.emplace(config_, *selected_.device);
      whole_model->copy_parameters_from_host(values);
      whole_model->set_dropout_seed(model.dropout_seed());
      whole_model->set_dropout_step(model.dropout_step());
    }
  }
  if (coordinates_.data == 0 || optimizer_shard) {
    save_checkpoint(a_, {iteration, consumed_train_, consumed_valid_},
                    whole_model ? *whole_model : model, *optimizer_, *scheduler_, out_,
                    optimizer_shard ? &*optimizer_shard : nullptr);
  }
  world().barrier();  // the checkpoint is whole before any rank goes on (or exits)
  last_saved_iteration_ = iteration;
}

// Megatron's evaluate_and_print_results; returns the loss.
double Trainer::evaluate_and_log(Split split, int64_t& consumed_samples, const std::string& prefix,
                                 int64_t iteration) {
  const EvaluationResult evaluation =
      evaluate(*model_, source_, split, consumed_samples, evaluation_options(a_), data_parallel());
  consumed_samples += evaluation.samples;
  log_->add_evaluation(prefix, iteration, consumed_train_, evaluation.lm_loss);
  return evaluation.lm_loss;
}

// After the last iteration: the save at the end, the benchmark report, and the last validation
// and test passes.
void Trainer::finish() {
  if (const auto iteration = iteration_to_save_at_end(a_, resumed_.iteration, last_saved_iteration_)) {
    save(*iteration);
  }
  if (!a_.logging.benchmark_output.empty() && groups_.is_last_rank()) {
    report_benchmark(a_, config_.padded_vocab_size, result_.parameter_count, result_.iterations,
                     peak_flops_ ? *peak_flops_ : measure_peak(), peak_name_, out_last_);
  }
  if (a_.evaluation.eval_iters > 0) {
    result_.validation_loss = evaluate_and_log(
        Split::validation, consumed_valid_,
        fmt::format("iteration {} on validation set", a_.run.train_iters), a_.run.train_iters);
    if (!test_split_skipped_) {
      int64_t consumed_test = 0;
      result_.test_loss = evaluate_and_log(
          Split::test, consumed_test, fmt::format("iteration {} on test set", a_.run.train_iters),
          a_.run.train_iters);
    }
  }
  log_->close();
}

}  // namespace backend
