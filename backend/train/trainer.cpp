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
#include "backend/dist/process_environment.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/log/benchmark_report.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/dataset_provider.hpp"
#include "backend/train/evaluation.hpp"
#include "backend/train/exit_signal_handler.hpp"
#include "backend/train/exp_manager_files.hpp"
#include "backend/train/loss_scaling.hpp"
#include "backend/train/pipeline_schedule.hpp"
#include "backend/train/spike_detector.hpp"
#include "backend/train/train_step.hpp"
#include "backend/train/training_cadence.hpp"
#include "backend/train/log/training_log.hpp"
#include "backend/train/training_schedule.hpp"

namespace backend {

namespace {

using Clock = std::chrono::steady_clock;

// --inject-loss-spike-at-iteration multiplies every parameter by this before that iteration's
// step: real damage (the logits grow by orders of magnitude, so the loss is far beyond any
// --spike-threshold a run would use, and finite), which only restoring the weights undoes.
constexpr double kInjectedWeightFactor = 100.0;

// model_config with the tokenizer's vocabulary size already known: pretrain reads the tokenizer
// once, for its size and its end-of-document id.
GptConfig model_config_with_vocabulary(const TrainingArguments& a, int64_t vocab_size) {
  GptConfig config;
  config.num_layers = a.num_layers;
  config.hidden_size = a.hidden_size;
  config.num_attention_heads = a.num_attention_heads;
  config.ffn_hidden_size = a.ffn_hidden_size;
  config.max_position_embeddings = a.max_position_embeddings;
  config.vocab_size = vocab_size;
  config.padded_vocab_size = padded_vocab_size(config.vocab_size, a.make_vocab_size_divisible_by,
                                               a.tensor_model_parallel_size);
  config.layernorm_epsilon = a.norm_epsilon;
  config.init_method_std = a.init_method_std;
  config.hidden_dropout = a.hidden_dropout;
  config.attention_dropout = a.attention_dropout;
  config.position_embedding_type = a.position_embedding_type == "rope"
                                       ? PositionEmbeddingType::rope
                                       : PositionEmbeddingType::learned_absolute;
  config.rotary_base = a.rotary_base;
  if (a.use_rope_scaling) config.rope_scaling = RopeScaling{.factor = a.rope_scaling_factor};
  config.rotary_percent = a.rotary_percent;
  config.normalization =
      a.normalization == "RMSNorm" ? Normalization::rms_norm : Normalization::layer_norm;
  config.apply_layernorm_1p = a.apply_layernorm_1p;
  config.swiglu = a.swiglu;
  config.add_bias_linear = a.add_bias_linear;
  config.share_embeddings_and_output_weights = !a.untie_embeddings_and_output_weights;
  config.num_query_groups = a.group_query_attention ? a.num_query_groups : 0;
  if (a.recompute_granularity == "selective") {
    config.recompute_granularity = RecomputeGranularity::selective;
  } else if (a.recompute_granularity == "full") {
    config.recompute_granularity = RecomputeGranularity::full;
    config.recompute_method =
        a.recompute_method == "block" ? RecomputeMethod::block : RecomputeMethod::uniform;
    config.recompute_num_layers = a.recompute_num_layers.value_or(1);
  }
  validate(config);
  return config;
}

}  // namespace

GptConfig model_config(const TrainingArguments& a) {
  return model_config_with_vocabulary(a, tokenizer_vocab_size(a));
}

SelectedDevice select_device(const TrainingArguments& arguments) {
  if (arguments.device == "cpu") return {std::make_unique<CpuDevice>(), std::nullopt};
  const auto inventory = discover_cuda_devices();
  if (inventory.devices.empty()) {
    if (arguments.device == "cuda") {
      common::fail("--device cuda: no GPU is visible to this process ({}); use --device cpu, "
                   "or --device auto to train on a GPU where there is one",
                   inventory.unavailable_reason);
    }
    spdlog::info("device: CPU (no GPU: {})", inventory.unavailable_reason);
    return {std::make_unique<CpuDevice>(), std::nullopt};
  }
  const CudaDeviceProperties& gpu = inventory.devices.front();
  SelectedDevice selected{
      make_cuda_device(gpu.index, {.flash_attention = arguments.use_flash_attn}), gpu};
  spdlog::info("device: {}", selected.device->name());
  if (arguments.use_flash_attn) {
    spdlog::info("--use-flash-attn: bf16 and fp16 attention with head dimension 64 or 128 runs "
                 "on tensor cores (flash_attention_forward/backward); other shapes and fp32 keep "
                 "the CUDA-core kernel");
  }
  return selected;
}

namespace {

// The model's mixed precision (GptConfig::mixed_precision): --bf16 or --fp16 on the CUDA
// device, except under ZeRO-3, whose sharded working copies are not built in 16 bits yet.
MixedPrecision mixed_precision_of(const TrainingArguments& a, const Device& device) {
  if (device.memory_kind() != MemoryKind::cuda || a.zero_stage == 3) return MixedPrecision::none;
  if (a.bf16) return MixedPrecision::bf16;
  if (a.fp16) return MixedPrecision::fp16;
  return MixedPrecision::none;
}

// The precision the flags ask for, as far as this device computes it (`precision`: the model's
// GptConfig::mixed_precision, from mixed_precision_of): --bf16 or --fp16 on the CUDA device is
// mixed precision; the CPU path computes in fp32 (--fp16's loss scaling applies on every device).
void note_precision(const TrainingArguments& a, const Device& device, MixedPrecision precision) {
  if (!a.bf16 && !a.fp16) return;
  const char* flag = a.bf16 ? "--bf16" : "--fp16";
  const char* scaling = a.fp16 ? " (its dynamic loss scaling runs, as Megatron's)" : "";
  if (precision != MixedPrecision::none) {
    const char* type = a.bf16 ? "bf16" : "fp16";
    spdlog::info("{}: {} weights and activations; fp32 master weights, gradients and AdamW "
                 "moments{}",
                 flag, type, a.fp16 ? "; loss scaling guards fp16's range" : "");
    return;
  }
  if (device.memory_kind() == MemoryKind::host) {
    spdlog::warn("{}: the CPU path computes in fp32{}; mixed precision applies to the CUDA path",
                 flag, scaling);
  } else {
    spdlog::warn("{} with --zero-stage 3: the CUDA path computes in fp32{} (ZeRO-3's sharded "
                 "16-bit working copies are not built yet; docs/device.md)",
                 flag, scaling);
  }
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
  const BenchmarkSummary summary = summarize_benchmark(a, padded_vocab_size, step_ms, peak_flops);
  write_benchmark_json(a.benchmark_output, a, padded_vocab_size, parameter_count, summary);
  out << fmt::format(" benchmark: median {:.1f} ms/iteration | {:.1f} tokens/s | {:.3f} TFLOP/s | "
                     "MFU {:.1f}% of the measured {:.3f} TFLOP/s {} | written to {}\n",
                     summary.median_step_ms, summary.tokens_per_second, summary.tflops_per_device,
                     100.0 * summary.mfu, summary.peak_flops / 1e12, peak_name,
                     a.benchmark_output);
  out.flush();
}

}  // namespace

TokenizerFacts tokenizer_facts(const TrainingArguments& arguments) {
  // The tokenizer read from its files, with only the files its type takes.
  auto read = [&](std::string vocab_file, std::string merge_file, std::string tokenizer_model) {
    TokenizerOptions options = tokenizer_options(arguments);
    options.vocab_file = std::move(vocab_file);
    options.merge_file = std::move(merge_file);
    options.vocab_size = 0;
    options.tokenizer_model = std::move(tokenizer_model);
    const auto tokenizer = build_tokenizer(options);
    return TokenizerFacts{.vocab_size = tokenizer->vocab_size(),
                          .end_of_document = tokenizer->eod()};
  };
  if (arguments.tokenizer_type == "GPT2BPETokenizer") {
    // With real data the vocabulary file decides. Mock data does not read the files (the
    // launcher's configs name NeMo's default paths, which need not exist), nor do the
    // checkpoint tools: GPT-2's size is a known fact.
    if (arguments.mock_data || (arguments.vocab_file.empty() && arguments.merge_file.empty())) {
      return {.vocab_size = kGpt2VocabSize, .end_of_document = kGpt2EndOfDocument};
    }
    return read(arguments.vocab_file, arguments.merge_file, "");
  }
  if (arguments.tokenizer_type == "NullTokenizer") {
    // Megatron's _NullTokenizer: ids 0 .. --vocab-size − 1, then the EOD (--vocab-size's rule
    // keeps it below 2^31 − 1).
    return {.vocab_size =
                common::checked_add(arguments.vocab_size, 1, "--vocab-size + NullTokenizer's EOD"),
            .end_of_document = static_cast<int32_t>(arguments.vocab_size)};
  }
  if (reads_tokenizer_model(arguments.tokenizer_type)) {
    // No size is known without the model (Llama 2's 32000 is one model's), so the file is
    // read even for mock data, as Megatron's build_tokenizer reads it.
    return read("", "", arguments.tokenizer_model);
  }
  common::fail("--tokenizer-type '{}' is not valid (valid: GPT2BPETokenizer, NullTokenizer, "
               "SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, "
               "HuggingFaceTokenizer)",
               arguments.tokenizer_type);
}

int64_t tokenizer_vocab_size(const TrainingArguments& arguments) {
  return tokenizer_facts(arguments).vocab_size;
}

TrainingResult pretrain(const TrainingArguments& a, std::ostream& out, BatchSource source) {
  ProcessGroups one_process = single_process_groups();
  return pretrain(a, out, std::move(source), one_process);
}

TrainingResult pretrain(const TrainingArguments& a, std::ostream& printed, BatchSource source,
                        ProcessGroups& process_groups) {
  const auto setup_start = Clock::now();
  // Megatron's print_rank_0 and print_rank_last: the setup, checkpoint and exit lines come from
  // rank 0, the iteration and evaluation lines from the last rank; other ranks print nothing.
  std::ostream discarded(nullptr);
  std::ostream& out = process_groups.is_first_rank() ? printed : discarded;
  std::ostream& out_last = process_groups.is_last_rank() ? printed : discarded;
  Communicator& world = *process_groups.world;
  Communicator& data_parallel = *process_groups.data_parallel;
  // The model's shape is checked, and its memory estimated once the device is known (bf16 on a
  // GPU), before anything of the model is written or allocated: a model this machine cannot
  // hold is refused with the estimate.
  const TokenizerFacts tokenizer = tokenizer_facts(a);
  GptConfig config = model_config_with_vocabulary(a, tokenizer.vocab_size);
  // The report is written after training; a --benchmark-output that can never take it (a
  // device, a FIFO, a directory) is refused now, not after the run.
  if (!a.benchmark_output.empty() && process_groups.is_last_rank()) {
    common::output_target(a.benchmark_output, "--benchmark-output");
  }
  const char* const kWaysOut =
      "Lower --micro-batch-size or --seq-length, recompute activations (--recompute-granularity "
      "full --recompute-method uniform --recompute-num-layers 1), or train a smaller model.";
  const ProcessEnvironment process = read_process_environment();
  if (process.world_size != world.size()) {
    common::fail("{}", not_started_through_mpi(process, process.world_size));
  }
  if (a.world_size != world.size()) {
    common::fail("the arguments were validated for {} processes, but {} run", a.world_size,
                 world.size());
  }
  // Megatron's --exit-on-missing-checkpoint, checked before anything is built: a mistyped
  // --load stops the job at once instead of training from scratch (Megatron exits there with
  // status 0; an error here, since the job did nothing it was asked to).
  if (a.exit_on_missing_checkpoint && !a.load.empty()) {
    require_checkpoint(a.load, "--load",
                       "--exit-on-missing-checkpoint is given: correct the path, or leave the flag "
                       "out to start from scratch when there is nothing to load");
  }
  // Megatron installs its signal handler at initialisation: a notice during the setup stops
  // the run after its first iteration.
  std::optional<ExitSignalHandler> exit_signal;
  if (a.exit_signal_handler) {
    const std::optional<int> number = exit_signal_number(a.exit_signal);
    if (!number) common::fail("--exit-signal {}: not a signal the handler takes", a.exit_signal);
    exit_signal.emplace(*number);
  }
  const SelectedDevice selected = select_device(a);
  Device& device = *selected.device;
  config.mixed_precision = mixed_precision_of(a, device);
  // One rank's share of the model under this layout (the launcher's preflight computes the same).
  const common::MemoryEstimate estimate = training_memory_estimate(
      config, a.micro_batch_size, a.seq_length,
      {.tensor_parallel = process_groups.layout.tensor_parallel,
       .data_parallel = process_groups.layout.data_parallel,
       .pipeline_parallel = process_groups.layout.pipeline_parallel,
       .sequence_parallel = a.sequence_parallel,
       .distributed_optimizer = a.use_distributed_optimizer,
       .zero_stage = a.zero_stage,
       .offload_optimizer = a.offload_optimizer,
       .offload_parameters = a.offload_parameters,
       .virtual_pipeline_chunks = a.virtual_pipeline_chunks()});
  if (selected.gpu && world.size() > 1) {
    common::fail("--device {}: {} ranks on GPUs need the NCCL communicator, which is not built "
                 "yet; data parallelism runs on CPU ranks (--device cpu)",
                 a.device, world.size());
  }
  if (selected.gpu) {
    common::require_memory_fits(
        estimate,
        {static_cast<double>(selected.gpu->total_memory_bytes),
         fmt::format("the memory of GPU {} ({})", selected.gpu->index, selected.gpu->name)},
        "pretrain_gpt: the model", kWaysOut);
  } else {
    // CPU ranks on one machine share its memory: the check is for all of this node's ranks
    // (the world split by host name; every rank takes part).
    const int64_t node_ranks =
        world.size() == 1
            ? 1
            : world.split(static_cast<int64_t>(std::hash<std::string>{}(common::local_host_name()) & 0x3fffffff),
                          world.rank(), "node")
                  ->size();
    common::MemoryEstimate node_estimate = estimate;
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
                        : fmt::format("pretrain_gpt: the model's {} ranks on this machine",
                                      node_ranks),
        kWaysOut);
  }
  if (!a.log_dir.empty() && process_groups.is_first_rank()) write_exp_manager_files(a.log_dir, a);
  note_precision(a, device, config.mixed_precision);

  // Everything the run keeps on the device is carved here, once: parameters and gradients,
  // the activations of the one micro-batch shape every step and evaluation uses, and the
  // optimizer's moments. No step allocates. Running out names the region being carved and
  // this layout's estimate (the launcher's preflight computes the same table).
  TrainingResult result;
  std::vector<ParameterGroup> groups;
  std::optional<GptModel<float>> carved_model;
  std::optional<AdamW> carved_optimizer;
  // --use-distributed-optimizer: this rank's range of the flat buffers, the optimizer's
  // moments for it alone, and the buffer its reduce-scattered gradients land in.
  std::optional<GradientShard> shard;
  Arena shard_arena;
  try {
    const PipelineStage stage{.pipeline_parallel = process_groups.layout.pipeline_parallel,
                              .rank = process_groups.coordinates().pipeline,
                              .virtual_chunks = a.virtual_pipeline_chunks()};
    carved_model.emplace(config, device,
                         ModelParallelism{.tensor_parallel = process_groups.tensor_parallel.get(),
                                          .sequence_parallel = a.sequence_parallel,
                                          .pipeline = stage,
                                          .pipeline_parallel = process_groups.pipeline_parallel.get(),
                                          .embedding = process_groups.embedding.get(),
                                          .sharded_data_parallel =
                                              a.zero_stage == 3 ? &data_parallel : nullptr});
    // The dropout masks come from --seed too; dropout_key() mixes the seed into a stream of
    // its own, unrelated to the initialisation's. Step 0 is the first micro batch's forward.
    carved_model->init_parameters(a.seed);
    carved_model->set_dropout_seed(a.seed);
    // A pipeline stage holds the micro batches its schedule keeps in flight, for the largest
    // global batch (the last of a ramp-up).
    int64_t slots = 1;
    if (!stage.whole_model()) {
      const int64_t micro_batches = a.global_batch_size / (a.micro_batch_size *
                                                           process_groups.layout.data_parallel);
      slots = pipeline_slots(pipeline_schedule(stage.pipeline_parallel, stage.rank,
                                               stage.virtual_chunks, micro_batches));
    }
    carved_model->reserve(a.micro_batch_size, a.seq_length, slots);
    for (const auto& tensor : carved_model->tensors()) {
      groups.push_back({tensor.offset, tensor.numel, tensor.weight_decay});
    }
    const AdamWConfig adam{a.adam_beta1, a.adam_beta2, a.adam_eps, a.weight_decay};
    const int64_t parameter_count = carved_model->parameter_buffer().numel;
    if (carved_model->sharded_over_data_parallel()) {
      // ZeRO-3: the moments of the model's own range, as the distributed optimizer's.
      const ShardRange range = carved_model->parameter_shard_range();
      carved_optimizer.emplace(adam, groups_in_range(groups, range), range.numel, device);
    } else if (a.use_distributed_optimizer) {
      const ShardRange range =
          shard_range(parameter_count, data_parallel.size(), data_parallel.rank());
      ArenaLayout layout;
      const int64_t region = layout.add("the distributed optimizer's gradient shard",
                                        ElementType::f32, range.numel);
      shard_arena = Arena(device, std::move(layout), "gradient shard");
      shard = GradientShard{range, shard_arena.view(region)};
      carved_optimizer.emplace(adam, groups_in_range(groups, range), range.numel, device);
    } else {
      carved_optimizer.emplace(adam, groups, parameter_count, device);
    }
  } catch (const common::Error& error) {
    // CudaDevice::allocate_zeroed's words; other errors (and the CPU's own out-of-memory
    // message, after the host check above) pass through as they are.
    if (!selected.gpu || std::string_view(error.what()).find("out of GPU memory") ==
                             std::string_view::npos) {
      throw;
    }
    std::string table;
    for (const auto& line : common::format_memory_estimate(estimate)) table += "\n" + line;
    common::fail("{}\nThe estimate for this layout (the launcher's preflight table):{}\n{}",
                 error.what(), table, kWaysOut);
  }
  GptModel<float>& model = *carved_model;
  AdamW& optimizer = *carved_optimizer;
  // --fp16's dynamic loss scaling (or --loss-scale): the optimizer holds the scaler, as
  // Megatron's mixed-precision optimizer does, so checkpoints carry its state.
  optimizer.set_loss_scaler(make_loss_scaler(a));
  result.parameter_count = whole_count_of(model);
  LearningRateScheduler scheduler(learning_rate_schedule(a));
  const GlobalBatchSizeSchedule batch_sizes =
      batch_size_schedule(a, process_groups.layout.data_parallel);

  // Megatron's start-up lines (build_num_microbatches_calculator, _initialize_distributed,
  // initialize_model_parallel), in its order.
  if (a.rampup_batch_size.empty()) {
    out << fmt::format("setting number of micro-batches to constant {}\n",
                       batch_sizes.num_micro_batches(0));
  }
  out << "> initializing torch distributed ...\n";
  out << fmt::format("> initialized tensor model parallel with size {}\n",
                     process_groups.layout.tensor_parallel);
  out << fmt::format("> initialized pipeline model parallel with size {}\n",
                     process_groups.layout.pipeline_parallel);

  if (!source && a.mock_data) {
    source = [dataset = MockDataset(a.seed, config.vocab_size, a.seq_length)](
                 Split split, int64_t first, int64_t batch, std::span<int32_t> tokens,
                 std::span<int32_t> labels) { dataset.fill_batch(split, first, batch, tokens, labels); };
  }

  out << fmt::format(" > padded vocab (size: {}) with {} dummy tokens (new size: {})\n",
                     config.vocab_size, config.padded_vocab_size - config.vocab_size,
                     config.padded_vocab_size);
  // Megatron prints this line from every model-parallel rank of data-parallel rank 0, each with
  // its own shard's count (one write per line, so ranks' lines do not interleave).
  const RankCoordinates coordinates = process_groups.coordinates();
  if (coordinates.data == 0) {
    printed << fmt::format(
        " > number of parameters on (tensor, pipeline) model parallel rank ({}, {}): {}\n",
        coordinates.tensor, coordinates.pipeline, result.parameter_count);
    printed.flush();
  }
  if (a.train_samples > 0) out << fmt::format("setting training iterations to {}\n", a.train_iters);
  out << fmt::format("time to initialize megatron (seconds): {:.3f}\n",
                     std::chrono::duration<double>(Clock::now() - setup_start).count());
  // --log-throughput's MFU (our extension) is against this machine's measured GEMM peak:
  // the CPU's sgemm, or the GPU's GEMM in the model's precision, measured once here (a
  // fraction of a second); benchmark mode reuses it.
  const bool on_gpu = device.memory_kind() == MemoryKind::cuda;
  const ElementType gemm_type = working_type(config.mixed_precision, ElementType::f32);
  const std::string peak_name =
      on_gpu ? fmt::format("{} GEMM peak", element_name(gemm_type)) : "sgemm peak";
  auto measure_peak = [&] {
    return on_gpu ? measure_device_gemm_peak(device, gemm_type) : measure_cpu_sgemm_peak();
  };
  std::optional<double> peak_flops;
  if (a.log_throughput) {
    peak_flops = measure_peak();
    spdlog::info("measured {}: {:.3f} TFLOP/s (the MFU reference)", peak_name,
                 *peak_flops / 1e12);
  }
  // TensorBoard and the iteration lines are the last rank's (Megatron's get_tensorboard_writer).
  TrainingArguments log_arguments = a;
  if (!process_groups.is_last_rank()) log_arguments.tensorboard_dir.clear();
  TrainingLog log(log_arguments, config.padded_vocab_size, peak_flops, out_last, peak_name);

  // ---- checkpointing (backend/ckpt): where training resumes, and saving (Megatron's
  // load_checkpoint in setup_model_and_optimizer; checkpoint_and_decide_exit in train).
  // One live run per --save directory (checkpoint.hpp), held until training ends.
  std::optional<common::ExclusiveFileLock> save_lock;
  // Data-parallel rank 0 writes the model's files (every data-parallel rank holds the same
  // weights), one per (tensor-parallel rank, stage), and with the distributed optimizer every
  // rank its moments' file; rank 0 makes the directories and moves the tracker, so it holds
  // the lock.
  if (!a.save.empty() && process_groups.is_first_rank()) {
    save_lock.emplace(lock_save_directory(a.save));
  }
  TrainingProgress resumed;
  int64_t last_saved_iteration = -1;  // a checkpoint of this iteration exists in --save
  // The whole model's parameter count (a ZeRO-3 model's buffers hold its range only).
  const int64_t whole_count = whole_count_of(model);
  const bool sharded = model.sharded_over_data_parallel();
  // The checkpoint `from` names (its --load and switches) into the model, optimizer and
  // scheduler; nothing when it holds none.
  auto load_from = [&](const TrainingArguments& from) -> std::optional<TrainingProgress> {
    // The distributed optimizer and ZeRO-3 read the moments of their range alone; ZeRO-3 loads
    // the whole model's weights into one process's model and keeps its range of them.
    std::optional<GptModel<float>> whole_model;
    if (sharded) {
      whole_model.emplace(config, device);
      whole_model->set_dropout_seed(model.dropout_seed());
    }
    std::optional<ShardRange> optimizer_range;
    if (shard) optimizer_range = shard->range;
    if (sharded) optimizer_range = model.parameter_shard_range();
    const auto loaded = load_checkpoint(from, whole_model ? *whole_model : model, optimizer,
                                        scheduler, out,
                                        optimizer_range ? &*optimizer_range : nullptr);
    if (whole_model && loaded) {
      const ShardRange range = model.parameter_shard_range();
      model.copy_parameters_from_host(whole_model->parameters().subspan(
          static_cast<size_t>(range.offset), static_cast<size_t>(range.numel)));
      model.set_dropout_seed(whole_model->dropout_seed());
      model.set_dropout_step(whole_model->dropout_step());
    }
    return loaded;
  };
  std::optional<TrainingProgress> loaded;
  if (!a.load.empty()) {
    loaded = load_from(a);
    if (loaded) {
      std::error_code ignored;
      if (!a.save.empty() && !a.finetune && std::filesystem::equivalent(a.load, a.save, ignored)) {
        last_saved_iteration = loaded->iteration;
      }
    }
  }
  // Megatron's finetuning start (tasks/finetune_utils.py): nothing to resume from --load, so
  // the weights of the pretrained checkpoint, with a fresh optimizer, scheduler and RNG.
  if (!loaded && !a.pretrained_checkpoint.empty()) {
    TrainingArguments pretrained = a;
    pretrained.load = a.pretrained_checkpoint;
    pretrained.finetune = true;
    pretrained.no_load_optim = true;
    pretrained.no_load_rng = true;
    require_checkpoint(a.pretrained_checkpoint, "--pretrained-checkpoint",
                       "point it at the --save directory of pretrain_gpt or checkpoint_util "
                       "(--import-hf --save)");
    loaded = load_from(pretrained);
    if (!loaded) {  // its tracker went away between the check and the load
      common::fail("--pretrained-checkpoint {}: {} disappeared while the checkpoint was loaded",
                   a.pretrained_checkpoint,
                   checkpoint_tracker_path(a.pretrained_checkpoint).string());
    }
  }
  if (loaded) resumed = *loaded;
  // Megatron builds the datasets after the model, the optimizer and the checkpoint.
  // An empty test split (--split 98,2,0) has no test pass, as in Megatron (do_test false).
  bool test_split_skipped = false;
  if (!source) {
    // Rank 0 first, as Megatron builds the index caches on rank 0 and the others read them.
    if (process_groups.is_first_rank()) {
      source = build_dataset_batch_source(a, config.vocab_size, out, &test_split_skipped);
    }
    world.barrier();
    if (!process_groups.is_first_rank()) {
      source = build_dataset_batch_source(a, config.vocab_size, out, &test_split_skipped);
    }
    out << fmt::format("[after dataloaders are built] datetime: {}\n",
                       format_timestamp(std::time(nullptr)));
  }
  // Training and validation both leave the EOD positions out, as Megatron's loss mask does.
  if (a.eod_mask_loss) {
    source = mask_end_of_document_losses(std::move(source), tokenizer.end_of_document);
  }
  int64_t consumed_train = resumed.consumed_train_samples;
  int64_t consumed_valid = resumed.consumed_valid_samples;
  auto save = [&](int64_t iteration) {
    // The distributed optimizer and ZeRO-3: each data-parallel rank writes its range of the
    // moments to its own file (checkpoint.hpp's OptimizerShard); nothing is gathered.
    std::optional<OptimizerShard> optimizer_shard;
    if (shard || sharded) {
      optimizer_shard = OptimizerShard{
          .data_parallel = &data_parallel,
          .parameter_count = whole_count,
          .range = sharded ? model.parameter_shard_range() : shard->range};
    }
    // ZeRO-3: the parameters gathered into one process's model, which data-parallel rank 0
    // saves (DeepSpeed's consolidated weights), so any layout loads the checkpoint.
    std::optional<GptModel<float>> whole_model;
    if (sharded) {
      std::vector<float> values(static_cast<size_t>(whole_count));
      const ShardRange range = model.parameter_shard_range();
      const auto own = std::span(values).subspan(static_cast<size_t>(range.offset),
                                                 static_cast<size_t>(range.numel));
      model.copy_parameters_to_host(own);
      data_parallel.all_gather(host_view(std::span(values)), host_view(own));
      if (coordinates.data == 0) {
        whole_model.emplace(config, device);
        whole_model->copy_parameters_from_host(values);
        whole_model->set_dropout_seed(model.dropout_seed());
        whole_model->set_dropout_step(model.dropout_step());
      }
    }
    if (coordinates.data == 0 || optimizer_shard) {
      save_checkpoint(a, {iteration, consumed_train, consumed_valid},
                      whole_model ? *whole_model : model, optimizer, scheduler, out,
                      optimizer_shard ? &*optimizer_shard : nullptr);
    }
    world.barrier();  // the checkpoint is whole before any rank goes on (or exits)
    last_saved_iteration = iteration;
  };

  out << fmt::format("[before the start of training step] datetime: {}\n",
                     format_timestamp(std::time(nullptr)));
  out.flush();

  // Megatron's evaluate_and_print_results; returns the loss.
  auto evaluate_and_log = [&](Split split, int64_t& consumed_samples, const std::string& prefix,
                              int64_t iteration) {
    const EvaluationResult evaluation =
        evaluate(model, source, split, consumed_samples, a, data_parallel);
    consumed_samples += evaluation.samples;
    log.add_evaluation(prefix, iteration, consumed_train, evaluation.lm_loss);
    return evaluation.lm_loss;
  };

  // --rollback-on-spike (docs/checkpoints.md "Loss spikes"). Every rank sees the same loss
  // (averaged over data parallelism, broadcast from the last stage), so all decide alike.
  SpikeDetector spike_detector({.threshold = a.spike_threshold,
                                .window = a.spike_window,
                                .nan_iterations = a.spike_nan_iterations});
  int64_t rollbacks = 0;
  double learning_rate_factor = 1.0;  // --spike-lr-factor to the power of the rollbacks
  bool spike_injected = false;        // --inject-loss-spike-at-iteration fires once
  // Reloads the last checkpoint this run saved in --save (weights, optimizer, scheduler,
  // dropout RNG) but keeps the data position: the samples since that checkpoint are skipped.
  // Returns the checkpoint's iteration, where the iteration numbering continues from.
  auto roll_back = [&](int64_t iteration, const Spike& spike) -> int64_t {
    const std::string flags = fmt::format(
        "--spike-threshold {} --spike-window {} --spike-nan-iterations {} --spike-lr-factor {} "
        "--spike-max-rollbacks {}",
        a.spike_threshold, a.spike_window, a.spike_nan_iterations, a.spike_lr_factor,
        a.spike_max_rollbacks);
    if (rollbacks >= a.spike_max_rollbacks) {
      common::fail("--rollback-on-spike: spike at iteration {} ({}) after {} rollback(s), the most "
                   "--spike-max-rollbacks allows; stopping ({}). The run does not recover by "
                   "rolling back: lower --lr, raise --spike-max-rollbacks or --spike-threshold, "
                   "or look at the data around consumed sample {}",
                   iteration, spike.reason(), rollbacks, flags, consumed_train);
    }
    if (last_saved_iteration < 0) {
      common::fail("--rollback-on-spike: spike at iteration {} ({}), but this run has saved no "
                   "checkpoint in --save {} yet to roll back to ({}); save sooner with a smaller "
                   "--save-interval",
                   iteration, spike.reason(), a.save, flags);
    }
    TrainingArguments from = a;
    from.load = a.save;
    from.finetune = false;
    from.pretrained_checkpoint.clear();
    from.no_load_optim = false;
    from.no_load_rng = a.no_save_rng;
    const std::optional<TrainingProgress> reloaded = load_from(from);
    if (!reloaded) {
      common::fail("--rollback-on-spike: spike at iteration {} ({}), but --save {} no longer holds "
                   "the checkpoint of iteration {} this run saved ({} is missing)",
                   iteration, spike.reason(), a.save, last_saved_iteration,
                   checkpoint_tracker_path(a.save).string());
    }
    ++rollbacks;
    learning_rate_factor *= a.spike_lr_factor;
    spike_detector.reset();
    std::string line = fmt::format(
        " rollback on spike at iteration {}: {}; reloaded iteration {} from {}, skipping samples "
        "{}..{} (rollback {} of {})",
        iteration, spike.reason(), reloaded->iteration, a.save,
        reloaded->consumed_train_samples, consumed_train - 1, rollbacks, a.spike_max_rollbacks);
    if (a.spike_lr_factor != 1.0) {
      line += fmt::format("; learning rate now × {}", learning_rate_factor);
    }
    log.add_rollback(line, iteration, rollbacks);
    return reloaded->iteration;
  };

  bool memory_reported = false;
  for (int64_t iteration = resumed.iteration + 1; iteration <= a.train_iters; ++iteration) {
    const auto step_start = Clock::now();
    const GlobalBatch batch{.first_sample = consumed_train,
                            .global_batch_size = batch_sizes.global_batch_size(consumed_train),
                            .num_micro_batches = batch_sizes.num_micro_batches(consumed_train)};
    if (iteration == a.inject_loss_spike_at_iteration && !spike_injected) {
      // The testing aid: the weights are damaged before this step, so its forward spikes and
      // the run goes on from damaged weights unless a rollback restores them.
      spike_injected = true;
      model.device().scale(model.parameter_buffer(), kInjectedWeightFactor);
      model.parameters_updated();
    }
    const TrainStepResult step = train_step(model, optimizer, scheduler, source, batch, a,
                                            data_parallel, shard ? &*shard : nullptr,
                                            learning_rate_factor);
    consumed_train += batch.global_batch_size;
    const double step_seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    result.iterations.push_back({.iteration = iteration,
                                 .lm_loss = step.lm_loss,
                                 .grad_norm = step.grad_norm,
                                 .learning_rate = step.learning_rate,
                                 .skipped = step.skipped,
                                 .elapsed_ms = 1000.0 * step_seconds,
                                 .global_batch_size = batch.global_batch_size,
                                 .consumed_samples = consumed_train,
                                 .loss_scale = step.loss_scale,
                                 .nan = step.nan,
                                 .memory = device.memory_usage(),
                                 .params_norm = step.params_norm,
                                 .num_zeros_in_grad = step.num_zeros_in_grad});
    log.add_iteration(result.iterations.back(), scheduler.learning_rate() * learning_rate_factor);
    // Megatron's report_memory, once, after the first logged interval with a learning rate
    // (the optimizer's state exists by then), from every rank of data-parallel rank 0.
    if (!memory_reported && iteration % a.log_interval == 0 && step.learning_rate > 0) {
      memory_reported = true;
      if (coordinates.data == 0) {
        printed << format_memory_line(world.rank(), iteration, device.memory_usage()) << '\n';
        printed.flush();
      }
    }

    // A spike is judged before this iteration's evaluation and save: its weights are not kept.
    if (a.rollback_on_spike) {
      if (const std::optional<Spike> spike = spike_detector.observe(step.lm_loss, step.nan)) {
        iteration = roll_back(iteration, *spike);  // the loop goes on at the checkpoint's + 1
        continue;
      }
    }

    // Megatron's --exit-duration-in-mins and --exit-signal-handler, decided by every rank
    // together in one max all-reduce: the longest elapsed time, and whether any rank got the
    // signal (Megatron all-gathers each rank's flag), so that all of them save and exit after
    // the same iteration.
    ExitConditions exit_conditions;
    if (a.exit_duration_in_mins > 0 || exit_signal) {
      std::array<float, 2> exits = {
          static_cast<float>(std::chrono::duration<double>(Clock::now() - setup_start).count() / 60.0),
          exit_signal && exit_signal->received() ? 1.0F : 0.0F};
      world.all_reduce(host_view(std::span<float>(exits)), ReduceOperation::max);
      exit_conditions.duration_exceeded =
          a.exit_duration_in_mins > 0 && exits[0] > a.exit_duration_in_mins;
      exit_conditions.exit_signal_received = exits[1] > 0;
    }
    const IterationActions actions = actions_after_iteration(a, iteration, exit_conditions);
    if (actions.evaluate) {
      evaluate_and_log(Split::validation, consumed_valid, fmt::format("iteration {}", iteration),
                       iteration);
    }
    if (actions.save) save(iteration);
    if (actions.exit) {
      // Megatron's print_datetime lines of its three exits.
      const std::string why =
          exit_conditions.exit_signal_received
              ? fmt::format("exiting program after receiving {}.", a.exit_signal)
          : exit_conditions.duration_exceeded
              ? fmt::format(
                    "exiting program after {} minutes",
                    std::chrono::duration<double>(Clock::now() - setup_start).count() / 60.0)
              : fmt::format("exiting program at iteration {}", iteration);
      out << fmt::format("[{}] datetime: {}\n", why, format_timestamp(std::time(nullptr)));
      out.flush();
      return result;
    }
  }
  if (const auto iteration = iteration_to_save_at_end(a, resumed.iteration, last_saved_iteration)) {
    save(*iteration);
  }
  if (!a.benchmark_output.empty() && process_groups.is_last_rank()) {
    report_benchmark(a, config.padded_vocab_size, result.parameter_count, result.iterations,
                     peak_flops ? *peak_flops : measure_peak(), peak_name, out_last);
  }
  if (a.eval_iters > 0) {
    result.validation_loss = evaluate_and_log(
        Split::validation, consumed_valid,
        fmt::format("iteration {} on validation set", a.train_iters), a.train_iters);
    if (!test_split_skipped) {
      int64_t consumed_test = 0;
      result.test_loss = evaluate_and_log(Split::test, consumed_test,
                                          fmt::format("iteration {} on test set", a.train_iters),
                                          a.train_iters);
    }
  }
  log.close();
  return result;
}

}  // namespace backend
