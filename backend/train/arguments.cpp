// Megatron-LM flag parsing and validation; see arguments.hpp.
// Reference: megatron/training/arguments.py (_add_network_size_args, _add_training_args,
// _add_learning_rate_args, _add_regularization_args, validate_args).
#include "backend/train/arguments.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <map>
#include <set>
#include <span>
#include <tuple>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/common/checked_math.hpp"
#include "backend/common/command_line.hpp"
#include "backend/common/error.hpp"
#include "backend/common/python_format.hpp"
#include "backend/data/data_blend.hpp"
#include "backend/data/tokenizer.hpp"
#include "backend/device/cuda_inventory.hpp"
#include "backend/dist/parallel_layout.hpp"
#include "backend/dist/process_environment.hpp"
#include "backend/model/pipeline_stage.hpp"
#include "backend/train/buffer_buckets.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/deepspeed_config.hpp"
#include "backend/train/flag_table.hpp"
#include "backend/train/training_schedule.hpp"

namespace backend {

namespace {

// Megatron flags that this backend recognises but does not implement yet. Each is refused
// with the reason, so a translated script fails at once instead of training something else.
constexpr common::RefusedFlag kUnsupportedFlags[] = {
    {"--deepspeed-activation-checkpointing", false,
     "DeepSpeed's activation checkpointing is not built; --recompute-granularity full is"},
    {"--reset-position-ids", false,
     "positions run 0 .. seq-1 in every sample; resetting them at each EOD is not built yet"},
    {"--reset-attention-mask", false,
     "attention is causal over the whole sample; document masks are not built yet"},
    {"--qk-layernorm", false, "a norm on the queries and keys is not built"},
    {"--squared-relu", false, "the MLP's activations are GELU and SwiGLU (--swiglu)"},
    {"--num-experts", true, "mixture-of-experts layers are not built"},
    {"--fp8-format", true, "fp8 training is not built; --bf16 and --fp16 are"},
    {"--tp-comm-overlap", false,
     "overlapping the tensor-parallel communication with GEMMs is not built"},
    {"--use-dist-ckpt", false,
     "Megatron's distributed checkpoint format is not built; checkpoints are Megatron's per-rank "
     "layout (docs/checkpoints.md)"},
    {"--use-torch-fsdp2", false,
     "PyTorch FSDP2 is not built; ZeRO-3 is (--zero-stage 3, docs/parallelism.md)"},
    {"--distribute-saved-activations", false,
     "spreading the recompute inputs over the tensor-parallel ranks is not built"},
    {"--distribute-recomputed-activations", false,
     "spreading the recompute inputs over the tensor-parallel ranks is not built (older "
     "Megatron's name of --distribute-saved-activations)"},
    {"--distribute-checkpointed-activations", false,
     "spreading the recompute inputs over the tensor-parallel ranks is not built (older "
     "Megatron's name of --distribute-saved-activations)"},
    {"--decoupled-lr", true,
     "a separate learning rate for the embedding and output layer is not built"},
    {"--init-method-xavier-uniform", false,
     "initialisation is Megatron's normal one (--init-method-std)"},
    {"--log-progress", false, "progress.txt is not written"},
    {"--profile", false,
     "Megatron's profiling window is not built: run the whole job under nsys or perf"},
    {"--train-tokens", true,
     "Megatron-DeepSpeed's token-based schedule is not built: give samples (tokens ÷ "
     "--seq-length) with --train-samples, --lr-decay-samples and --lr-warmup-samples"},
    {"--lr-decay-tokens", true,
     "Megatron-DeepSpeed's token-based schedule is not built: --lr-decay-samples (tokens ÷ "
     "--seq-length)"},
    {"--lr-warmup-tokens", true,
     "Megatron-DeepSpeed's token-based schedule is not built: --lr-warmup-samples (tokens ÷ "
     "--seq-length)"},
    {"--hf-ckpt-dir", true,
     "a Hugging Face model is not read during training: convert it first with checkpoint_util "
     "--import-hf DIR --save CKPT and train with --load CKPT --finetune (docs/checkpoints.md)"},
    {"--to-hf-ckpt", false,
     "the export is a step of its own: checkpoint_util --load CKPT --export-hf DIR"},
    {"--log-optimizer-states-to-tensorboard", false,
     "the optimizer's state statistics are not written"},
    {"--use-pytorch-profiler", false,
     "there is no PyTorch profiler here: run the job under nsys or perf"},
    {"--shuffle-sample-in-corpus", false,
     "the ALCF fork's order within a corpus is not built: the --data-file-list corpus column is "
     "read, and the samples are Megatron-LM's one blend over all the listed datasets, each by "
     "its weight (docs/data.md)"},
    {"--blend-sample-in-corpus", false,
     "the ALCF fork's order within a corpus is not built: the --data-file-list corpus column is "
     "read, and the samples are Megatron-LM's one blend over all the listed datasets, each by "
     "its weight (docs/data.md)"},
};

// Megatron switches that change nothing here: each turns one of Megatron's fused kernels or
// implementation choices off or on, or tunes PyTorch's machinery, and this backend computes
// the same function either way. Accepted so that a Megatron script runs unchanged; each one
// given is logged with its reason. docs/backend.md ("Flags without effect") lists them.
struct FlagWithoutEffect {
  const char* flag;
  const char* reason;
};
constexpr const char* kFusionSwitch =
    "it turns off one of Megatron's fused kernels, which computes the same function; the "
    "kernels here are this backend's own";
constexpr const char* kModelImplementation =
    "Megatron's choice between its two implementations of the same model; there is one here";
constexpr FlagWithoutEffect kSwitchesWithoutEffect[] = {
    {"--use-mcore-models", kModelImplementation},
    {"--use-legacy-models", kModelImplementation},
    {"--no-masked-softmax-fusion", kFusionSwitch},
    {"--no-bias-gelu-fusion", kFusionSwitch},
    {"--no-bias-swiglu-fusion", kFusionSwitch},
    {"--no-bias-dropout-fusion", kFusionSwitch},
    {"--no-rope-fusion", kFusionSwitch},
    {"--no-persist-layer-norm", kFusionSwitch},
    {"--no-gradient-accumulation-fusion", kFusionSwitch},
    {"--cross-entropy-loss-fusion",
     "it turns on Megatron's fused cross-entropy, which computes the same function; the kernels "
     "here are this backend's own"},
    {"--no-async-tensor-model-parallel-allreduce", "Megatron ignores it too (deprecated)"},
    {"--attention-softmax-in-fp32", "attention's softmax runs in fp32 here in every precision"},
    {"--apply-query-key-layer-scaling",
     "Megatron divides the scores by the layer number and multiplies them back inside the softmax, "
     "an fp16 range device: the same function, and the scores are fp32 here"},
    {"--no-query-key-layer-scaling",
     "Megatron divides the scores by the layer number and multiplies them back inside the softmax, "
     "an fp16 range device: the same function, and the scores are fp32 here"},
    {"--accumulate-allreduce-grads-in-fp32",
     "gradients are accumulated and reduced in fp32 here in every precision"},
    {"--no-create-attention-mask-in-dataloader",
     "no attention mask is made: attention is causal inside the kernel"},
    {"--no-mmap-bin-files",
     "the .bin files are memory-mapped either way; the samples are the same"},
    {"--mmap-warmup", "the .bin files are memory-mapped without a warm-up read"},
    {"--deterministic-mode",
     "runs are deterministic here without it: no float atomics in reductions"},
    {"--use-cpu-initialization",
     "the weights are made on the host, the same on every device and tensor-parallel layout"},
    {"--manual-gc", "Python's garbage collector; there is none here"},
    {"--log-batch-size-to-tensorboard",
     "the batch size is written to TensorBoard always (with --tensorboard-dir), as current "
     "Megatron does"},
};
// The same for flags that take a value (their values are checked by the flag rules).
constexpr FlagWithoutEffect kValuesWithoutEffect[] = {
    {"--num-workers",
     "PyTorch's data-loader processes; samples are read from the memory-mapped files in the "
     "training process"},
    {"--empty-unused-memory-level",
     "PyTorch's cache allocator; memory here is carved once at setup"},
    {"--manual-gc-interval", "Python's garbage collector; there is none here"},
    {"--timing-log-option", "Megatron's timer breakdown is not built (--timing-log-level 0)"},
    {"--wandb-exp-name", "Weights & Biases logging is not built (--wandb-project)"},
    {"--wandb-save-dir", "Weights & Biases logging is not built (--wandb-project)"},
};

// Megatron flags built for one value, Megatron's default: any other is refused with the reason.
// Their values are checked by the flag rules first, which also write them in canonical form
// ("01" → "1"), so a given value is compared with `built` as text.
struct DefaultOnlyFlag {
  const char* flag;
  const char* built;  // the value that is built
  const char* help;
  const char* refusal;  // after "<flag> <value>: "
};
constexpr DefaultOnlyFlag kDefaultOnlyFlags[] = {
    {"--optimizer", "adam",
     "adam: Adam with decoupled weight decay (Megatron's adam); sgd is not built",
     "not built; the optimizer is Adam with decoupled weight decay (--optimizer adam, "
     "Megatron's default)"},
    {"--dataloader-type", "single",
     "single: Megatron's single-pass order; cyclic and external are not built",
     "not built; samples are read in Megatron's single-pass order (--dataloader-type single, "
     "Megatron's default)"},
    {"--vocab-extra-ids", "0",
     "0: training on SentencePiece's extra ids is not built (preprocess_data adds them)",
     "training with SentencePieceTokenizer's <extra_id_N> tokens is not built (0, Megatron's "
     "default, is; preprocess_data adds them to a dataset)"},
    {"--context-parallel-size", "1", "1: context parallelism is not built",
     "context parallelism is not built (1 is)"},
    {"--expert-model-parallel-size", "1", "1: mixture-of-experts layers are not built",
     "mixture-of-experts layers are not built (1 is)"},
    {"--timing-log-level", "0", "0: the iteration time; Megatron's finer timers are not built",
     "Megatron's timer breakdown is not built; level 0, the iteration time in each log line, is "
     "what is logged"},
    {"--wandb-project", "", "Empty: Weights & Biases logging is not built (TensorBoard is)",
     "Weights & Biases logging is not built; TensorBoard is (--tensorboard-dir)"},
};

// Megatron's tokenizers that this backend builds; the others are valid values of
// --tokenizer-type (common/flag_rules.cpp) that are refused as not built yet.
const std::vector<std::string> kBuiltTokenizers = {
    "GPT2BPETokenizer", "NullTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
    "Llama2Tokenizer", "HuggingFaceTokenizer"};

// The concerns whose flags are tables (flag_table.hpp). Ours (docs/checkpoints.md "Loss
// spikes"); not in Megatron's dump.
const FlagRow<SpikeHandlingArguments> kSpikeHandlingFlags[] = {
    {"--rollback-on-spike", &SpikeHandlingArguments::rollback_on_spike,
     "On a loss spike (or persistent NaN/Inf loss), reload the last checkpoint of --save and "
     "continue past the batches that caused it (not a Megatron flag)"},
    {"--spike-threshold", &SpikeHandlingArguments::threshold,
     "A spike: lm loss > X × the median of the last --spike-window losses"},
    {"--spike-window", &SpikeHandlingArguments::window,
     "Iterations whose median loss is the spike reference"},
    {"--spike-nan-iterations", &SpikeHandlingArguments::nan_iterations,
     "This many consecutive NaN/Inf iterations count as a spike"},
    {"--spike-lr-factor", &SpikeHandlingArguments::lr_factor,
     "Multiply the learning rate by F after each rollback, in (0, 1]"},
    {"--spike-max-rollbacks", &SpikeHandlingArguments::max_rollbacks,
     "A spike after this many rollbacks stops the run"},
    {"--inject-loss-spike-at-iteration", &SpikeHandlingArguments::inject_loss_spike_at_iteration,
     "Testing aid: multiply every parameter by 100 before iteration I's step, once"},
};

// Megatron's tasks/main.py (the zero-shot GPT tasks; zero_shot_tasks.hpp says what each does).
const FlagRow<TaskArguments> kTaskFlags[] = {
    {"--task", enum_flag_field<&TaskArguments::task>(), "WIKITEXT103 or LAMBADA", "task",
     FlagDump::value, FlagRequirement::required},
    {"--valid-data", &TaskArguments::valid_data,
     "The task's file(s): WikiText's wiki.test.tokens, LAMBADA's .jsonl", "valid_data",
     FlagDump::value, FlagRequirement::required},
    {"--overlapping-eval", &TaskArguments::overlapping_eval,
     "WIKITEXT103: windows start this many tokens apart (default 32)", "overlapping_eval"},
    {"--strict-lambada", &TaskArguments::strict_lambada,
     "LAMBADA: predict the whole last word, not its last token", "strict_lambada"},
    {"--results-json", &TaskArguments::results_json,
     "Also write the results to this JSON file (not a Megatron flag)", "results_json",
     FlagDump::none_if_empty},
};

// Megatron's tools/run_text_generation_server.py has --port; the rest are ours
// (docs/serving.md).
const FlagRow<ServingArguments> kServingFlags[] = {
    {"--host", &ServingArguments::host, "Address to listen on (default 127.0.0.1)", "host"},
    {"--port", &ServingArguments::port, "Port to listen on (default 5000; 0: any free port)",
     "port"},
    {"--max-batch-size", &ServingArguments::max_batch_size,
     "Sequences (prompts) decoded together: the KV cache's slots", "max_batch_size"},
    {"--max-concurrent-requests", &ServingArguments::max_concurrent_requests,
     "Requests queued or running at once, at most 4096; beyond it: 503", "max_concurrent_requests"},
    {"--max-request-bytes", &ServingArguments::max_request_bytes,
     "Largest request body; beyond it: 400", "max_request_bytes"},
    {"--max-prompt-bytes", &ServingArguments::max_prompt_bytes, "Largest prompt; beyond it: 400",
     "max_prompt_bytes"},
    {"--max-tokens-to-generate", &ServingArguments::max_tokens_to_generate,
     "Largest tokens_to_generate of a request; beyond it: 400", "max_tokens_to_generate"},
    {"--socket-timeout", &ServingArguments::socket_timeout,
     "Seconds a request may take to arrive whole (from its first byte), and a response to be "
     "written, before the connection is closed",
     "socket_timeout"},
};

// The flags that are fields of TrainingArguments itself, a table per concern in --help's order
// (the flags between the tables are registered by hand: they set no field, or their rules
// depend on the program).
const FlagRow<ModelArguments> kModelFlags[] = {
    {"--num-layers", &ModelArguments::num_layers, "Number of transformer layers", "num_layers",
     FlagDump::value, FlagRequirement::shape},
    {"--hidden-size", &ModelArguments::hidden_size, "Transformer hidden size", "hidden_size",
     FlagDump::value, FlagRequirement::shape},
    {"--ffn-hidden-size", &ModelArguments::ffn_hidden_size, "MLP hidden size (default 4 × hidden)",
     "ffn_hidden_size"},
    {"--num-attention-heads", &ModelArguments::num_attention_heads, "Attention heads",
     "num_attention_heads", FlagDump::value, FlagRequirement::shape},
    {"--seq-length,--encoder-seq-length", &ModelArguments::seq_length,
     "Sequence length (--encoder-seq-length: Megatron's other name for it in a GPT model)",
     "seq_length", FlagDump::value, FlagRequirement::shape},
    {"--max-position-embeddings", &ModelArguments::max_position_embeddings,
     "Rows of the position table (default: --seq-length)", "max_position_embeddings"},
    {"--make-vocab-size-divisible-by", &ModelArguments::make_vocab_size_divisible_by,
     "Pad the vocabulary to a multiple of this", "make_vocab_size_divisible_by"},
    {"--init-method-std", &ModelArguments::init_method_std, "Std of the normal init",
     "init_method_std"},
    {"--norm-epsilon,--layernorm-epsilon", &ModelArguments::norm_epsilon,
     "Epsilon of LayerNorm and RMSNorm (--layernorm-epsilon: the old name)", "norm_epsilon"},
    {"--hidden-dropout", &ModelArguments::hidden_dropout, "Dropout after attention/MLP",
     "hidden_dropout"},
    {"--attention-dropout", &ModelArguments::attention_dropout, "Dropout on attention probs",
     "attention_dropout"},
    {"--position-embedding-type", enum_flag_field<&ModelArguments::position_embedding_type>(),
     "learned_absolute or rope", "position_embedding_type"},
    {"--rotary-base,--rotary-position-embeddings-theta", &ModelArguments::rotary_base,
     "RoPE base period (--rotary-position-embeddings-theta: Megatron-DeepSpeed's name)",
     "rotary_base"},
    {"--rotary-percent", &ModelArguments::rotary_percent,
     "Share of each head's features that RoPE rotates", "rotary_percent"},
    {"--use-rope-scaling", &ModelArguments::use_rope_scaling,
     "Llama 3.x's RoPE frequency scaling (low frequencies divided by the factor)",
     "use_rope_scaling"},
    {"--rope-scaling-factor", &ModelArguments::rope_scaling_factor,
     "Llama 3.x's RoPE scaling factor (with --use-rope-scaling)", "rope_scaling_factor",
     FlagDump::python_float, FlagRequirement::optional, "8.0"},
    {"--normalization", enum_flag_field<&ModelArguments::normalization>(), "LayerNorm or RMSNorm",
     "normalization"},
    {"--apply-layernorm-1p", &ModelArguments::apply_layernorm_1p,
     "LayerNorm weights stored as gamma - 1, initialised to 0 (NeMo's layernorm1p)",
     "apply_layernorm_1p"},
    {"--swiglu", &ModelArguments::swiglu, "SwiGLU MLP (linear_fc1 gives 2 × ffn features)",
     "swiglu"},
    // Attention is fused on every device (blockwise on the CPU, cuDNN's or our FlashAttention-2-
    // style kernels on the GPU), never s × s scores. On the GPU the flags pick the kernels
    // (device/cuda_context.hpp's AttentionBackend); the CPU has one.
    {"--attention-backend", enum_flag_field<&ModelArguments::attention_backend>(),
     "GPU attention kernels: auto (cuDNN's fused attention where it runs the call, else flash), "
     "fused (cuDNN), flash (ours, on tensor cores: bf16/fp16, head dims 64, 128), unfused or "
     "local (ours, on CUDA cores)",
     "attention_backend"},
    {"--use-flash-attn,--use-flash-attn-v2", &ModelArguments::use_flash_attn,
     "--attention-backend flash (Megatron's older spelling)", "use_flash_attn"},
    {"--disable-bias-linear{false}", &ModelArguments::add_bias_linear,
     "No biases on linear_qkv, linear_proj, linear_fc1, linear_fc2", "add_bias_linear"},
    {"--untie-embeddings-and-output-weights", &ModelArguments::untie_embeddings_and_output_weights,
     "A separate output_layer.weight instead of the word embedding",
     "untie_embeddings_and_output_weights"},
    {"--group-query-attention", &ModelArguments::group_query_attention,
     "Grouped-query attention with --num-query-groups key/value heads", "group_query_attention"},
    {"--num-query-groups", &ModelArguments::num_query_groups,
     "Key/value heads with --group-query-attention", "num_query_groups"},
};

// After --recompute-activations.
const FlagRow<ModelArguments> kRecomputeFlags[] = {
    {"--recompute-granularity", enum_flag_field<&ModelArguments::recompute_granularity>(),
     "selective (attention core) or full (whole layers)", "recompute_granularity",
     FlagDump::none_if_empty},
    {"--recompute-method", enum_flag_field<&ModelArguments::recompute_method>(),
     "Full recompute: uniform (chunks of N layers) or block (the first N layers)",
     "recompute_method", FlagDump::none_if_empty},
    {"--recompute-num-layers", &ModelArguments::recompute_num_layers,
     "Full recompute: N of --recompute-method", "recompute_num_layers"},
};

// Megatron-DeepSpeed's and older Megatron's, after their recompute spellings.
const FlagRow<DataArguments> kLegacyDataFlags[] = {
    {"--data-impl", enum_flag_field<&DataArguments::data_impl>(),
     "mmap or infer: the .bin/.idx reader (lazy and cached are not built)", "data_impl"},
};
const FlagRow<ParallelismArguments> kLegacyParallelismFlags[] = {
    {"--distributed-backend", enum_flag_field<&ParallelismArguments::distributed_backend>(),
     "nccl or gloo: gloo stages the collectives through host memory over Open MPI (ranks may "
     "share a GPU); nccl, the default, is Open MPI on CPU ranks (docs/parallelism.md)",
     "distributed_backend"},
    {"--DDP-impl", enum_flag_field<&ParallelismArguments::ddp_impl>(),
     "local or torch: recorded; gradients are summed after the backward either way", "DDP_impl"},
};

// Megatron-DeepSpeed's configuration file, mapped by deepspeed_config.hpp; what it sets is
// dumped from TrainingArguments after the mapping.
const FlagRow<DeepSpeedFlags> kDeepSpeedFlags[] = {
    {"--deepspeed", &DeepSpeedFlags::deepspeed,
     "Megatron-DeepSpeed: read --deepspeed_config (ZeRO 1/2 → the distributed optimizer)"},
    {"--deepspeed_config", &DeepSpeedFlags::config_file,
     "DeepSpeed's JSON configuration, mapped (docs/parallelism.md)"},
    {"--zero-stage", &DeepSpeedFlags::zero_stage, "ZeRO stage (0, 1, 2, 3)"},
};

const FlagRow<TokenizerOptions> kTokenizerFlags[] = {
    {"--tokenizer-type", &TokenizerOptions::tokenizer_type,
     "GPT2BPETokenizer, NullTokenizer, Llama2Tokenizer, GPTSentencePieceTokenizer, "
     "SentencePieceTokenizer or HuggingFaceTokenizer",
     "tokenizer_type"},
    {"--vocab-size", &TokenizerOptions::vocab_size, "Vocabulary size (NullTokenizer)", "vocab_size",
     FlagDump::none_if_not_positive},
    {"--vocab-file", &TokenizerOptions::vocab_file, "GPT-2 vocab.json"},
    {"--merge-file", &TokenizerOptions::merge_file, "GPT-2 merges.txt"},
    {"--tokenizer-model", &TokenizerOptions::tokenizer_model,
     "SentencePiece model (Llama 2's tokenizer.model), or HuggingFaceTokenizer's tokenizer.json "
     "directory",
     "tokenizer_model", FlagDump::none_if_empty},
};

const FlagRow<DataArguments> kDataFlags[] = {
    {"--mock-data", &DataArguments::mock_data, "Synthetic tokens, for benchmarks and tests",
     "mock_data"},
    {"--data-path", &DataArguments::data_path,
     "Dataset prefix, or weighted blend: weight prefix weight prefix ...", "data_path"},
    {"--data-args-path", &DataArguments::data_args_path,
     "A file holding what --data-path would (for long blends)", "data_args_path",
     FlagDump::none_if_empty},
    {"--data-file-list,--data-path-file", &DataArguments::data_file_list,
     "A file with one \"weight prefix\" or \"weight prefix corpus\" per line, # comments "
     "(Megatron-DeepSpeed's ALCF fork)",
     "data_file_list", FlagDump::none_if_empty},
    {"--split", &DataArguments::split,
     "Train,validation,test shares of each dataset's sequences (default 969, 30, 1)", "split",
     FlagDump::none_if_empty},
    {"--train-data-path", &DataArguments::train_data_path,
     "The training split's own prefix or blend", "train_data_path"},
    {"--valid-data-path", &DataArguments::valid_data_path,
     "The validation split's own prefix or blend", "valid_data_path"},
    {"--test-data-path", &DataArguments::test_data_path, "The test split's own prefix or blend",
     "test_data_path"},
    {"--per-split-data-args-path", &DataArguments::per_split_data_args_path,
     "A JSON file {\"train\": [...], \"valid\": [...], \"test\": [...]} of per-split blends",
     "per_split_data_args_path", FlagDump::none_if_empty},
    {"--data-cache-path", &DataArguments::data_cache_path,
     "Directory for the cached index arrays (default: next to each dataset)", "data_cache_path",
     FlagDump::none_if_empty},
    {"--num-dataset-builder-threads", &DataArguments::num_dataset_builder_threads,
     "Datasets of a blend indexed at once (default 0: one per core)",
     "num_dataset_builder_threads"},
    {"--eod-mask-loss", &DataArguments::eod_mask_loss,
     "Leave out of the loss the positions whose input token is the end of document",
     "eod_mask_loss"},
    {"--calculate-per-token-loss", &DataArguments::calculate_per_token_loss,
     "Average the loss over the global batch's scored tokens, not per micro batch",
     "calculate_per_token_loss"},
};

// --micro-batch-size is required but by the server, which batches its requests' prompts
// itself (parse_command_line).
const FlagRow<RunArguments> kRunFlags[] = {
    {"--micro-batch-size", &RunArguments::micro_batch_size, "Samples per micro batch",
     "micro_batch_size"},
    {"--global-batch-size", &RunArguments::global_batch_size,
     "Samples per iteration (gradient accumulation)", "global_batch_size"},
    {"--train-iters", &RunArguments::train_iters, "Iterations to train", "train_iters"},
    {"--train-samples", &RunArguments::train_samples,
     "Samples to train (sample-based training, instead of --train-iters)", "train_samples",
     FlagDump::none_if_not_positive},
    {.names = "--rampup-batch-size",
     .field = &RunArguments::rampup_batch_size,
     .help = "START INCREMENT SAMPLES: grow the global batch from START by INCREMENT over "
             "SAMPLES samples (with --train-samples)",
     .dump_name = "rampup_batch_size",
     .words = 3},
    {"--seed", &RunArguments::seed, "Random seed", "seed"},
};

// The parallel layout's, between the run's length and the precision's (--help's order).
const FlagRow<ParallelismArguments> kParallelismFlags[] = {
    {"--tensor-model-parallel-size", &ParallelismArguments::tensor_model_parallel_size, "TP size",
     "tensor_model_parallel_size"},
    {"--pipeline-model-parallel-size", &ParallelismArguments::pipeline_model_parallel_size,
     "PP size", "pipeline_model_parallel_size"},
    {"--num-layers-per-virtual-pipeline-stage",
     &ParallelismArguments::num_layers_per_virtual_pipeline_stage,
     "Layers per model chunk: the interleaved pipeline schedule"},
    {"--distributed-timeout-minutes", &ParallelismArguments::distributed_timeout_minutes,
     "End the job when a collective waits longer than this for the other ranks (fractions "
     "allowed)",
     "distributed_timeout_minutes"},
    {"--overlap-grad-reduce", &ParallelismArguments::overlap_grad_reduce,
     "Start each bucket's data-parallel gradient reduction (all-reduce, or reduce-scatter with "
     "the distributed optimizer) during the backward",
     "overlap_grad_reduce"},
    {"--ddp-bucket-size", &ParallelismArguments::ddp_bucket_size,
     "Elements per bucket of --overlap-grad-reduce and --overlap-param-gather (default: "
     "max(40M, 1M x data-parallel size))",
     "ddp_bucket_size"},
    {"--grad-reduce-in-bf16", &ParallelismArguments::grad_reduce_in_bf16,
     "With --bf16 on GPUs, sum the data-parallel gradients in bf16 (half the bytes; they "
     "accumulate in fp32)",
     "grad_reduce_in_bf16"},
    {"--overlap-p2p-communication", &ParallelismArguments::overlap_p2p_communication_flag,
     "Overlap the interleaved schedule's pipeline transfers with the computes (the default; "
     "Megatron-LM's flag before it was)"},
    {"--no-overlap-p2p-communication", &ParallelismArguments::no_overlap_p2p_communication_flag,
     "Complete each batch of the interleaved schedule's pipeline transfers before the next "
     "compute"},
    {"--overlap-param-gather", &ParallelismArguments::overlap_param_gather,
     "Start the distributed optimizer's parameter all-gather in buckets after the step; the "
     "next forward waits for each layer's bucket before using it",
     "overlap_param_gather"},
    {"--sequence-parallel", &ParallelismArguments::sequence_parallel,
     "Shard the residual stream (norms, dropout) over the tensor-parallel ranks",
     "sequence_parallel"},
    {"--use-distributed-optimizer", &ParallelismArguments::use_distributed_optimizer,
     "Shard the optimizer state and update over the data-parallel ranks (ZeRO-1)",
     "use_distributed_optimizer"},
};

const FlagRow<MixedPrecisionArguments> kPrecisionFlags[] = {
    {"--bf16", &MixedPrecisionArguments::bf16, "bf16 mixed precision (CUDA path)", "bf16"},
    {"--fp16", &MixedPrecisionArguments::fp16, "fp16 mixed precision (CUDA path)", "fp16"},
    {"--loss-scale", &MixedPrecisionArguments::loss_scale,
     "Constant loss scale with --fp16/--bf16 (default: dynamic with --fp16)", "loss_scale"},
    // 2^32, not CLI11's 4.29497e+09.
    {"--initial-loss-scale", &MixedPrecisionArguments::initial_loss_scale,
     "Dynamic loss scaling's first scale", "initial_loss_scale", FlagDump::value,
     FlagRequirement::optional, "4294967296"},
    {"--min-loss-scale", &MixedPrecisionArguments::min_loss_scale, "Dynamic loss scaling's floor",
     "min_loss_scale"},
    {"--loss-scale-window", &MixedPrecisionArguments::loss_scale_window,
     "Clean iterations before the dynamic scale doubles", "loss_scale_window"},
    {"--hysteresis", &MixedPrecisionArguments::hysteresis,
     "Overflows (since the last growth) before the dynamic scale halves", "hysteresis"},
};

// Ours, last of the training group.
const FlagRow<TrainingArguments> kDeviceFlags[] = {
    {"--device", enum_flag_field<&TrainingArguments::device>(),
     "auto, cpu or cuda (not a Megatron flag)", "device"},
    {"--gemm-autotune", &TrainingArguments::gemm_autotune,
     "On a GPU, time each GEMM shape's candidate algorithms that give the heuristic's bits and "
     "keep the fastest (not a Megatron flag)",
     "gemm_autotune"},
};

// Megatron core's CUDA graphs (docs/step_on_device.md, item 5).
const FlagRow<TrainingArguments> kCudaGraphFlags[] = {
    {"--cuda-graph-impl", enum_flag_field<&TrainingArguments::cuda_graph_impl>(),
     "CUDA graphs: none; local or full_iteration (the step's forward and backward in one graph, "
     "its update in another, replayed every step); transformer_engine is refused",
     "cuda_graph_impl"},
    {"--enable-cuda-graph", &TrainingArguments::enable_cuda_graph,
     "--cuda-graph-impl local (Megatron's older spelling)", "enable_cuda_graph"},
    {"--external-cuda-graph", &TrainingArguments::external_cuda_graph,
     "--cuda-graph-impl transformer_engine (Megatron's older spelling; refused)",
     "external_cuda_graph"},
    {"--cuda-graph-warmup-steps", &TrainingArguments::cuda_graph_warmup_steps,
     "Steps of a shape run eagerly before the step is captured (at least 1)",
     "cuda_graph_warmup_steps"},
};

// --lr is required but by evaluate_gpt and the server (parse_command_line). --lr-decay-iters is
// dumped by hand: None under sample-based training.
const FlagRow<OptimizerArguments> kOptimizerFlags[] = {
    {"--lr", &OptimizerArguments::lr, "Peak learning rate", "lr"},
    {"--min-lr", &OptimizerArguments::min_lr, "Minimum learning rate", "min_lr"},
    {"--lr-decay-style", enum_flag_field<&OptimizerArguments::lr_decay_style>(),
     "constant, linear, cosine, inverse-square-root or WSD", "lr_decay_style"},
    {"--lr-warmup-iters", &OptimizerArguments::lr_warmup_iters, "Linear warmup iterations",
     "lr_warmup_iters"},
    {"--lr-warmup-samples", &OptimizerArguments::lr_warmup_samples,
     "Linear warmup samples (sample-based training)", "lr_warmup_samples"},
    {"--lr-warmup-fraction", &OptimizerArguments::lr_warmup_fraction,
     "Warmup as a fraction of the decay steps", "lr_warmup_fraction"},
    {"--lr-decay-iters", &OptimizerArguments::lr_decay_iters, "Decay iterations (default: train)"},
    {"--lr-decay-samples", &OptimizerArguments::lr_decay_samples,
     "Decay samples (sample-based training; default: --train-samples)", "lr_decay_samples",
     FlagDump::none_if_not_positive},
    {"--lr-wsd-decay-style", enum_flag_field<&OptimizerArguments::lr_wsd_decay_style>(),
     "WSD's final decay: exponential, linear, cosine or minus_sqrt", "lr_wsd_decay_style"},
    {"--lr-wsd-decay-iters", &OptimizerArguments::lr_wsd_decay_iters,
     "Iterations of WSD's final decay", "lr_wsd_decay_iters"},
    {"--lr-wsd-decay-samples", &OptimizerArguments::lr_wsd_decay_samples,
     "Samples of WSD's final decay (sample-based training)", "lr_wsd_decay_samples"},
    {"--lr-warmup-init", &OptimizerArguments::lr_warmup_init, "Learning rate at warmup start",
     "lr_warmup_init"},
    {"--weight-decay", &OptimizerArguments::weight_decay, "AdamW decoupled weight decay",
     "weight_decay"},
    {"--start-weight-decay", &OptimizerArguments::start_weight_decay,
     "Weight decay at the start (with --weight-decay-incr-style linear/cosine)",
     "start_weight_decay"},
    {"--end-weight-decay", &OptimizerArguments::end_weight_decay,
     "Weight decay at the end of training", "end_weight_decay"},
    {"--weight-decay-incr-style", enum_flag_field<&OptimizerArguments::weight_decay_incr_style>(),
     "constant, linear or cosine"},
    {"--clip-grad", &OptimizerArguments::clip_grad, "Clip gradients to this global norm",
     "clip_grad"},
    {"--adam-beta1", &OptimizerArguments::adam_beta1, "Adam beta1", "adam_beta1"},
    {"--adam-beta2", &OptimizerArguments::adam_beta2, "Adam beta2", "adam_beta2"},
    {"--adam-eps", &OptimizerArguments::adam_eps, "Adam epsilon", "adam_eps"},
};

// The "Evaluation, logging, checkpoints" group holds four concerns' flags, interleaved in the
// order --help has always listed them: so each concern's table comes in pieces, registered in
// turn (parse_command_line) and all dumped (argument_values).
const FlagRow<EvaluationArguments> kEvaluationFlags[] = {
    {"--eval-interval", &EvaluationArguments::eval_interval, "Validate every N iterations",
     "eval_interval"},
    {"--eval-iters", &EvaluationArguments::eval_iters, "Iterations per validation/test pass",
     "eval_iters"},
};

const FlagRow<LoggingArguments> kLogIntervalFlags[] = {
    {"--log-interval", &LoggingArguments::log_interval, "Print every N iterations", "log_interval"},
};

const FlagRow<CheckpointingArguments> kCheckpointDirectoryFlags[] = {
    {"--save", &CheckpointingArguments::save, "Checkpoint directory to write", "save",
     FlagDump::none_if_empty},
    {"--load", &CheckpointingArguments::load, "Checkpoint directory to read", "load",
     FlagDump::none_if_empty},
    {"--pretrained-checkpoint", &CheckpointingArguments::pretrained_checkpoint,
     "When --load holds no checkpoint: start from this checkpoint's weights, as --finetune "
     "(Megatron's finetuning flag)",
     "pretrained_checkpoint", FlagDump::none_if_empty},
};

// Before --no-log-loss-scale-to-tensorboard (a switch that clears its field); then
// kLoggingToTensorBoardFlags.
const FlagRow<LoggingArguments> kLoggingFlags[] = {
    {"--benchmark-output", &LoggingArguments::benchmark_output,
     "Write step time, tokens/s, TFLOP/s, MFU and memory as JSON (not a Megatron flag)"},
    {"--log-throughput", &LoggingArguments::log_throughput,
     "Print TFLOP/s per GPU in the iteration line (and tokens/s, MFU on a line of its own)",
     "log_throughput"},
    {"--tensorboard-dir", &LoggingArguments::tensorboard_dir,
     "Write TensorBoard event files into this directory", "tensorboard_dir",
     FlagDump::none_if_empty},
    {"--tensorboard-log-interval", &LoggingArguments::tensorboard_log_interval,
     "Write training scalars to TensorBoard every N iterations", "tensorboard_log_interval"},
    {"--tensorboard-queue-size", &LoggingArguments::tensorboard_queue_size,
     "Events kept in memory before they are written out", "tensorboard_queue_size"},
    {"--log-params-norm", &LoggingArguments::log_params_norm,
     "Also log the parameters' L2 norm after each update", "log_params_norm"},
    {"--log-num-zeros-in-grad", &LoggingArguments::log_num_zeros_in_grad,
     "Also log how many gradient elements are zero", "log_num_zeros_in_grad"},
    {"--log-timers-to-tensorboard", &LoggingArguments::log_timers_to_tensorboard,
     "Also write iteration-time (and throughput with --log-throughput)",
     "log_timers_to_tensorboard"},
};

const FlagRow<LoggingArguments> kLoggingToTensorBoardFlags[] = {
    {"--log-validation-ppl-to-tensorboard", &LoggingArguments::log_validation_ppl_to_tensorboard,
     "Also write the validation perplexity", "log_validation_ppl_to_tensorboard"},
    {"--log-world-size-to-tensorboard", &LoggingArguments::log_world_size_to_tensorboard,
     "Also write world-size", "log_world_size_to_tensorboard"},
    {"--log-memory-to-tensorboard", &LoggingArguments::log_memory_to_tensorboard,
     "Also write the device's memory: mem-reserved-bytes, mem-allocated-bytes, "
     "mem-max-allocated-bytes, mem-allocated-count",
     "log_memory_to_tensorboard"},
    {"--log-dir", &LoggingArguments::log_dir,
     "Write cmd-args.log and hparams.yaml here, as NeMo's exp_manager (not a Megatron flag)",
     "log_dir", FlagDump::none_if_empty},
};

const FlagRow<CheckpointingArguments> kSaveIntervalFlags[] = {
    {"--save-interval", &CheckpointingArguments::save_interval,
     "Save a checkpoint every N iterations (with --save)", "save_interval",
     FlagDump::none_if_not_positive},
};

// --exit-signal is dumped by hand, as Python prints a signal: Signals.SIGTERM.
const FlagRow<RunArguments> kExitFlags[] = {
    {"--exit-interval", &RunArguments::exit_interval,
     "Exit after the iteration divisible by N, saving first (with --save)", "exit_interval",
     FlagDump::none_if_not_positive},
    {"--exit-duration-in-mins", &RunArguments::exit_duration_in_mins,
     "Exit, saving first (with --save), after the iteration that ends more than N minutes "
     "after the start",
     "exit_duration_in_mins", FlagDump::none_if_not_positive},
    {"--exit-signal-handler", &RunArguments::exit_signal_handler,
     "On SIGTERM (or --exit-signal), save a checkpoint (with --save) after the iteration and "
     "exit",
     "exit_signal_handler"},
    {"--exit-signal", &RunArguments::exit_signal,
     "The signal --exit-signal-handler takes: SIGTERM, SIGINT, SIGHUP, SIGUSR1 or SIGUSR2 "
     "(sbatch --signal=USR1@300 gives notice before the time limit's SIGTERM)"},
};

// Megatron's _add_checkpointing_args (--save and --load above).
const FlagRow<CheckpointingArguments> kCheckpointingFlags[] = {
    {"--exit-on-missing-checkpoint", &CheckpointingArguments::exit_on_missing_checkpoint,
     "With --load: stop with an error when it holds no checkpoint, instead of training from "
     "scratch",
     "exit_on_missing_checkpoint"},
    {"--finetune", &CheckpointingArguments::finetune,
     "Load the weights only: iteration 0, no optimizer or RNG state", "finetune"},
    {"--no-load-optim", &CheckpointingArguments::no_load_optim,
     "Do not load the optimizer and scheduler state", "no_load_optim"},
    {"--no-load-rng", &CheckpointingArguments::no_load_rng, "Do not load the RNG (dropout) state",
     "no_load_rng"},
    {"--no-save-optim", &CheckpointingArguments::no_save_optim,
     "Do not save the optimizer and scheduler state", "no_save_optim"},
    {"--no-save-rng", &CheckpointingArguments::no_save_rng, "Do not save the RNG (dropout) state",
     "no_save_rng"},
    {"--override-opt_param-scheduler", &CheckpointingArguments::override_opt_param_scheduler,
     "On load, keep the schedule the flags give (only the step count is loaded)",
     "override_opt_param_scheduler"},
    {"--use-checkpoint-opt_param-scheduler",
     &CheckpointingArguments::use_checkpoint_opt_param_scheduler,
     "On load, take the schedule from the checkpoint, whatever the flags say",
     "use_checkpoint_opt_param_scheduler"},
    {"--ckpt-format", enum_flag_field<&CheckpointingArguments::ckpt_format>(),
     "What --save writes: native (this backend's model_optim_rng.bin files), torch "
     "(Megatron-LM's model_optim_rng.pt, which Megatron loads with --no-load-rng) or torch_dist "
     "(Megatron core's distributed checkpoint: metadata.json, common.pt and PyTorch's DCP "
     "files); zarr and torch_dcp are not built. --load reads all three alike",
     "ckpt_format"},
    {"--transformer-impl", enum_flag_field<&CheckpointingArguments::transformer_impl>(),
     "Megatron core's module spec, whose tensor names a --ckpt-format torch save writes: "
     "transformer_engine (the norms fused into linear_qkv and linear_fc1) or local; the model "
     "computed is the same",
     "transformer_impl"},
};

// Registered last, for every program.
const FlagRow<CheckpointingArguments> kCheckpointArgumentsFlags[] = {
    {"--use-checkpoint-args", &CheckpointingArguments::use_checkpoint_args,
     "The model's shape and tokenizer type from the --load checkpoint", "use_checkpoint_args"},
};

// What the command line alone says, before the environment, a DeepSpeed configuration or a
// checkpoint add to it: the flags' values (old spellings resolved), which flags were given
// (every name of each), and what the steps after need of the flags that set no field.
struct CommandLine {
  TrainingArguments arguments;
  DeepSpeedFlags deepspeed;
  std::set<std::string, std::less<>> given;
  bool no_position_embedding = false;
  std::optional<int64_t> kv_channels;
  // Other spellings of settings above, resolved into `arguments` by resolve_other_spellings and
  // resolve_recompute_spellings.
  struct Spellings {
    bool recompute_activations = false;
    bool checkpoint_activations = false;
    std::optional<int64_t> checkpoint_num_layers;
    std::string activations_checkpoint_method;
    std::optional<int64_t> activations_checkpoint_num_layers;
    bool use_rotary_position_embeddings = false;
    std::optional<int64_t> num_key_value_heads;
    bool no_pipeline_parallel = false;
  } spellings;
  bool was_given(std::string_view flag) const { return given.contains(flag); }
};

// Megatron-DeepSpeed's spellings (its validate_args and model code): lower-case norm names;
// key/value heads counted as heads; no pipeline engine, which only pipeline size 1 allows; and
// Megatron's old RoPE switch.
void resolve_other_spellings(CommandLine& line) {
  TrainingArguments& arguments = line.arguments;
  ModelArguments& model = arguments.model;
  const CommandLine::Spellings& spellings = line.spellings;
  if (spellings.num_key_value_heads) {
    if (line.was_given("--num-query-groups") &&
        model.num_query_groups != *spellings.num_key_value_heads) {
      common::fail(
          "--num-key-value-heads {} and --num-query-groups {} disagree: they are the "
          "same setting (Megatron-DeepSpeed's name and Megatron-LM's); give one",
          *spellings.num_key_value_heads, model.num_query_groups);
    }
    if (*spellings.num_key_value_heads != model.num_attention_heads) {
      model.group_query_attention = true;
      model.num_query_groups = *spellings.num_key_value_heads;
    }
  }
  if (spellings.no_pipeline_parallel && arguments.parallelism.pipeline_model_parallel_size != 1) {
    common::fail(
        "--no-pipeline-parallel with --pipeline-model-parallel-size {}: Megatron-DeepSpeed "
        "requires size 1 then",
        arguments.parallelism.pipeline_model_parallel_size);
  }
  // Megatron's validate_args: the old RoPE switch sets the type, whatever else was given.
  if (spellings.use_rotary_position_embeddings) {
    model.position_embedding_type = PositionEmbeddingType::rope;
  }
}

// --recompute-activations, and the full recompute's old spellings.
void resolve_recompute_spellings(CommandLine& line) {
  ModelArguments& model = line.arguments.model;
  const CommandLine::Spellings& spellings = line.spellings;
  if (spellings.recompute_activations) {
    model.recompute_granularity = RecomputeGranularity::selective;
  }
  // The full recompute's old spellings: older Megatron's --activations-checkpoint-method M
  // with --activations-checkpoint-num-layers N (August 2021 to May 2022, before the
  // --recompute-* names), where --checkpoint-activations set the method uniform; and
  // Megatron-DeepSpeed's --checkpoint-activations with --checkpoint-num-layers N. Each is
  // --recompute-granularity full --recompute-method M --recompute-num-layers N, N 1 by default.
  std::string old_method_flag = "--activations-checkpoint-method";
  std::string old_method = spellings.activations_checkpoint_method;
  if (spellings.checkpoint_activations) {
    if (!old_method.empty() && old_method != "uniform") {
      common::fail("--checkpoint-activations is --activations-checkpoint-method uniform, but "
                   "--activations-checkpoint-method {} is given too: give one of them",
                   old_method);
    }
    if (old_method.empty()) old_method_flag = "--checkpoint-activations";
    old_method = "uniform";
  }
  std::optional<int64_t> old_num_layers = spellings.checkpoint_num_layers;
  const char* old_num_layers_flag = "--checkpoint-num-layers";
  if (spellings.activations_checkpoint_num_layers) {
    if (spellings.checkpoint_num_layers &&
        *spellings.checkpoint_num_layers != *spellings.activations_checkpoint_num_layers) {
      common::fail("--checkpoint-num-layers {} and --activations-checkpoint-num-layers {} "
                   "disagree: they are the same setting (Megatron-DeepSpeed's name and older "
                   "Megatron's); give one",
                   *spellings.checkpoint_num_layers, *spellings.activations_checkpoint_num_layers);
    }
    old_num_layers = spellings.activations_checkpoint_num_layers;
    old_num_layers_flag = "--activations-checkpoint-num-layers";
  }
  if (old_num_layers && old_method.empty()) {
    common::fail("{} {} needs --checkpoint-activations or --activations-checkpoint-method uniform|"
                 "block (or use --recompute-granularity full --recompute-method uniform "
                 "--recompute-num-layers N)", old_num_layers_flag, *old_num_layers);
  }
  if (!old_method.empty()) {
    if (model.recompute_granularity != RecomputeGranularity::none || model.recompute_method ||
        model.recompute_num_layers) {
      common::fail("{} is the old spelling of --recompute-granularity full --recompute-method {}: "
                   "give one or the other, not both", old_method_flag, old_method);
    }
    model.recompute_granularity = RecomputeGranularity::full;
    model.recompute_method = common::enum_from_name<RecomputeMethod>(old_method);
    model.recompute_num_layers = old_num_layers.value_or(1);
  }
}

// Which program reads the flags decides what is asked for: evaluate_gpt and the server train
// nothing (no schedule or training data), the server batches its requests' prompts itself.
struct ProgramFlags {
  bool evaluation;
  bool server;
  const char* name;
};
ProgramFlags program_flags(ArgumentsProgram program) {
  const bool evaluation = program != ArgumentsProgram::pretrain_gpt;
  const bool server = program == ArgumentsProgram::text_generation_server;
  return {.evaluation = evaluation,
          .server = server,
          .name = server       ? "text_generation_server"
                  : evaluation ? "evaluate_gpt"
                               : "pretrain_gpt"};
}

// The compatibility flags' values as given, checked once parsing is done.
struct CompatibilityValues {
  std::map<std::string, std::string> without_effect;
  std::map<std::string, std::string> default_only;
};

// The model's flags, the recompute switches and the older spellings of both. The shape's
// options are collected: --use-checkpoint-args decides whether they are required.
void add_model_flags(CLI::App& app, CommandLine& line, std::vector<CLI::Option*>& shape_options) {
  TrainingArguments& arguments = line.arguments;
  CommandLine::Spellings& spellings = line.spellings;
  auto* model = "Model";
  add_flag_rows<ModelArguments>(app, arguments.model, kModelFlags, model, &shape_options);
  app.add_flag("--recompute-activations", spellings.recompute_activations,
               "Selective recompute (same as --recompute-granularity selective)")->group(model);
  add_flag_rows<ModelArguments>(app, arguments.model, kRecomputeFlags, model);

  // Megatron-DeepSpeed's and older Megatron's spellings, as the published scripts use them.
  auto* legacy = "Megatron-DeepSpeed and older Megatron";
  app.add_flag("--checkpoint-activations", spellings.checkpoint_activations,
               "Full recompute, as --recompute-granularity full --recompute-method uniform")
      ->group(legacy);
  app.add_option("--checkpoint-num-layers", spellings.checkpoint_num_layers,
                 "Layers per recompute chunk with --checkpoint-activations (default 1)")
      ->group(legacy);
  app.add_option("--activations-checkpoint-method", spellings.activations_checkpoint_method,
                 "Older Megatron's full recompute: uniform or block, as --recompute-granularity "
                 "full --recompute-method")
      ->group(legacy);
  app.add_option("--activations-checkpoint-num-layers",
                 spellings.activations_checkpoint_num_layers,
                 "N of --activations-checkpoint-method (default 1): --recompute-num-layers")
      ->group(legacy);
  add_flag_rows<DataArguments>(app, arguments.data, kLegacyDataFlags, legacy);
  add_flag_rows<ParallelismArguments>(app, arguments.parallelism, kLegacyParallelismFlags, legacy);
  add_flag_rows<DeepSpeedFlags>(app, line.deepspeed, kDeepSpeedFlags, legacy);
}

// The data, the run, the layout, the precision and the optimizer.
void add_training_flags(CLI::App& app, TrainingArguments& arguments, ProgramFlags program) {
  add_flag_rows<TokenizerOptions>(app, arguments.tokenizer, kTokenizerFlags, "Data and tokenizer");
  add_flag_rows<DataArguments>(app, arguments.data, kDataFlags, "Data and tokenizer");
  add_flag_rows<RunArguments>(app, arguments.run, kRunFlags, "Training");
  add_flag_rows<ParallelismArguments>(app, arguments.parallelism, kParallelismFlags, "Training");
  add_flag_rows<MixedPrecisionArguments>(app, arguments.precision, kPrecisionFlags, "Training");
  add_flag_rows<TrainingArguments>(app, arguments, kDeviceFlags, "Training");
  add_flag_rows<TrainingArguments>(app, arguments, kCudaGraphFlags, "Training");
  if (program.server) {
    arguments.run.micro_batch_size = 1;
  } else {
    app.get_option("--micro-batch-size")->required();
  }
  add_flag_rows<OptimizerArguments>(app, arguments.optimizer, kOptimizerFlags,
                                    "Optimizer and learning rate");
  if (!program.evaluation) app.get_option("--lr")->required();
}

// Evaluation, logging and checkpoints; then each program's own: spike handling and the
// launcher's switch (pretrain_gpt), the tasks (evaluate_gpt), the server's.
void add_run_output_flags(CLI::App& app, TrainingArguments& arguments, ProgramFlags program) {
  auto* logging = "Evaluation, logging, checkpoints";
  add_flag_rows<EvaluationArguments>(app, arguments.evaluation, kEvaluationFlags, logging);
  add_flag_rows<LoggingArguments>(app, arguments.logging, kLogIntervalFlags, logging);
  add_flag_rows<CheckpointingArguments>(app, arguments.checkpointing, kCheckpointDirectoryFlags,
                                        logging);
  add_flag_rows<LoggingArguments>(app, arguments.logging, kLoggingFlags, logging);
  app.add_flag_callback(
         "--no-log-loss-scale-to-tensorboard",
         [&arguments] { arguments.logging.log_loss_scale_to_tensorboard = false; },
         "Do not write loss-scale")
      ->group(logging);
  add_flag_rows<LoggingArguments>(app, arguments.logging, kLoggingToTensorBoardFlags, logging);
  add_flag_rows<CheckpointingArguments>(app, arguments.checkpointing, kSaveIntervalFlags, logging);
  add_flag_rows<RunArguments>(app, arguments.run, kExitFlags, logging);
  add_flag_rows<CheckpointingArguments>(app, arguments.checkpointing, kCheckpointingFlags, logging);

  if (!program.evaluation) {
    // Ours: the launcher's training jobs pass it (launcher/stages/training_stage.cpp).
    app.add_flag("--name-config-keys", arguments.name_config_keys,
                 "Name the launcher's config keys (training.model.*) instead of flags where a "
                 "message asks for shape flags: the launcher rendered this command (not a "
                 "Megatron flag)")
        ->group(logging);
    // Ours: automatic recovery from loss spikes (docs/checkpoints.md "Loss spikes").
    add_flag_rows<SpikeHandlingArguments>(app, arguments.spike, kSpikeHandlingFlags, logging);
  }

  if (program.evaluation && !program.server) {
    add_flag_rows<TaskArguments>(app, arguments.tasks, kTaskFlags, "Tasks");
  }
  add_flag_rows<CheckpointingArguments>(app, arguments.checkpointing, kCheckpointArgumentsFlags,
                                        logging);
  if (program.server) {
    add_flag_rows<ServingArguments>(app, arguments.serving, kServingFlags, "Server");
  }
}

// Megatron's (and Megatron-DeepSpeed's) flags that change nothing here, other spellings of
// flags above, and flags accepted with their default value only (checked after parsing).
void add_compatibility_flags(CLI::App& app, CommandLine& line, CompatibilityValues& values) {
  CommandLine::Spellings& spellings = line.spellings;
  auto* compatibility = "Megatron compatibility (no effect, other spellings, defaults only)";
  for (const FlagWithoutEffect& entry : kSwitchesWithoutEffect) {
    app.add_flag(entry.flag, entry.reason)->group(compatibility);
  }
  for (const FlagWithoutEffect& entry : kValuesWithoutEffect) {
    app.add_option(entry.flag, values.without_effect[entry.flag], entry.reason)
        ->group(compatibility);
  }
  app.add_flag("--use-rotary-position-embeddings", spellings.use_rotary_position_embeddings,
               "Megatron's old spelling of --position-embedding-type rope")
      ->group(compatibility);
  app.add_flag("--no-position-embedding", line.no_position_embedding,
               "No learned position table: what --position-embedding-type rope has; refused "
               "otherwise, as Megatron refuses it")
      ->group(compatibility);
  for (const DefaultOnlyFlag& entry : kDefaultOnlyFlags) {
    values.default_only[entry.flag] = entry.built;
    app.add_option(entry.flag, values.default_only[entry.flag], entry.help)->group(compatibility);
  }
  app.add_option("--kv-channels", line.kv_channels,
                 "Head dimension: --hidden-size / --num-attention-heads, the only one built")
      ->group(compatibility);
  app.add_option("--num-key-value-heads", spellings.num_key_value_heads,
                 "Megatron-DeepSpeed's grouped-query attention: --group-query-attention "
                 "--num-query-groups N (N = --num-attention-heads: plain multi-head)")
      ->group(compatibility);
  app.add_flag("--no-pipeline-parallel", spellings.no_pipeline_parallel,
               "Megatron-DeepSpeed's switch off its pipeline engine: what "
               "--pipeline-model-parallel-size 1 is here")
      ->group(compatibility);
}

// After CLI11 has parsed `words` (abbreviations written out): the flags without effect said,
// which flags were given, the old spellings resolved and the default-only values checked.
void finish_command_line(const CLI::App& app, std::span<const std::string> words,
                         const CompatibilityValues& values, CommandLine& line) {
  for (const std::span<const FlagWithoutEffect> table :
       {std::span<const FlagWithoutEffect>(kSwitchesWithoutEffect),
        std::span<const FlagWithoutEffect>(kValuesWithoutEffect)}) {
    for (const FlagWithoutEffect& entry : table) {
      if (app.count(entry.flag) > 0) {
        spdlog::info("{} has no effect here: {}", entry.flag, entry.reason);
      }
    }
  }
  // Megatron's validate_args asserts that at most one of the two names is given.
  const auto given = [&](std::string_view flag) {
    return std::any_of(words.begin(), words.end(), [flag](const std::string& word) {
      return word == flag ||
             (word.starts_with(flag) && word.size() > flag.size() && word[flag.size()] == '=');
    });
  };
  if (given("--seq-length") && given("--encoder-seq-length")) {
    common::fail(
        "--seq-length and --encoder-seq-length are the same setting in a GPT model: "
        "give one of them");
  }
  for (const CLI::Option* option : app.get_options()) {
    if (option->count() == 0) continue;
    for (const std::string& name : option->get_lnames()) line.given.insert("--" + name);
  }
  line.deepspeed.clip_grad_given = line.was_given("--clip-grad");
  line.deepspeed.global_batch_size_given = line.was_given("--global-batch-size");
  line.deepspeed.micro_batch_size_given = line.was_given("--micro-batch-size");
  resolve_other_spellings(line);
  for (const DefaultOnlyFlag& entry : kDefaultOnlyFlags) {
    const std::string& value = values.default_only.at(entry.flag);
    if (value != entry.built) common::fail("{} {}: {}", entry.flag, value, entry.refusal);
  }
  resolve_recompute_spellings(line);
}

// Step 1, the flags: CLI11 over the words (abbreviations written out), the shared value rules,
// the refusals of what is not built, and the old spellings resolved. Reads nothing but argv;
// std::nullopt after --help.
std::optional<CommandLine> parse_command_line(int argc, const char* const* argv,
                                              ArgumentsProgram program) {
  CommandLine line;
  line.arguments.program = program;
  for (int i = 0; i < argc; ++i) line.arguments.command_line.emplace_back(argv[i]);
  const ProgramFlags flags = program_flags(program);
  CLI::App app{flags.server
                   ? "Serve text generation from a GPT checkpoint over HTTP (Megatron-LM's "
                     "PUT /api; Megatron-LM compatible flags)"
               : flags.evaluation ? "Evaluate a GPT model on Megatron-LM's zero-shot tasks "
                                    "(Megatron-LM compatible flags)"
                                  : "Pretrain a GPT model (Megatron-LM compatible flags)",
               flags.name};
  // argparse semantics: a flag given twice takes its last value.
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  app.get_formatter()->column_width(44);

  std::vector<CLI::Option*> shape_options;
  CompatibilityValues compatibility_values;
  add_model_flags(app, line, shape_options);
  add_training_flags(app, line.arguments, flags);
  add_run_output_flags(app, line.arguments, flags);
  add_compatibility_flags(app, line, compatibility_values);

  // Every value is checked by the shared table (backend/common/flag_rules.cpp) before CLI11
  // converts it: kind, range, finiteness, choices. What remains for validate_arguments is the
  // rules between flags and what is not built yet.
  common::apply_flag_rules(app, common::flag_rules());
  const common::RefusedFlags unsupported(app, kUnsupportedFlags);
  const std::vector<std::string> words = common::expand_abbreviations(app, argc, argv, flags.name);
  const std::span<const std::string> flag_words =
      std::span(words).subspan(std::min<std::size_t>(1, words.size()));
  // --use-checkpoint-args: the checkpoint gives the shape, so no model flag is required. That
  // is read from the words as CLI11 will see them (abbreviations written out, which needs every
  // option registered) and before CLI11 parses, which checks required options.
  if (std::find(flag_words.begin(), flag_words.end(), "--use-checkpoint-args") ==
      flag_words.end()) {
    for (CLI::Option* option : shape_options) option->required();
  }
  std::vector<const char*> expanded_argv;
  for (const std::string& word : words) expanded_argv.push_back(word.c_str());
  if (!common::parse_command_line(app, static_cast<int>(expanded_argv.size()), expanded_argv.data(),
                                  flags.name, unsupported,
                                  "is a Megatron-LM flag this backend does not support yet")) {
    return std::nullopt;
  }
  finish_command_line(app, flag_words, compatibility_values, line);
  return line;
}

// Step 2, the environment: the ranks that will train together, MPI's world when this task
// joins MPI, or the launcher's, for GPU ranks that meet without it (torchrun's variables, srun
// without PMIx: NCCL through the rendezvous, device_collectives.hpp): --device cuda, or auto
// where a GPU is visible. A task of several that can do neither (a CPU rank without MPI)
// validates as one process, so that pretrain's refusal names the launch instead of a batch
// size that does not divide.
int64_t world_size_from_environment(DeviceChoice device) {
  const ProcessEnvironment process = read_process_environment();
  if (started_through_mpi(process)) return process.world_size;
  if (process.world_size > 1 &&
      (device == DeviceChoice::cuda ||
       (device == DeviceChoice::automatic && !discover_cuda_devices().devices.empty()))) {
    return process.world_size;
  }
  return 1;
}

// Step 4, --use-checkpoint-args: the model's shape and tokenizer from the --load checkpoint,
// where the flags do not give them (Megatron's load_args_from_checkpoint).
void take_checkpoint_arguments(CommandLine& line, std::ostream& out) {
  TrainingArguments& arguments = line.arguments;
  const auto given_flag = [&](std::string_view flag) { return line.was_given(flag); };
  if (arguments.program == ArgumentsProgram::pretrain_gpt &&
      !arguments.checkpointing.load.empty() &&
      !read_checkpoint_tracker(arguments.checkpointing.load)) {
    // A first run of a job that resumes from its own --save finds nothing yet, and trains the
    // model its flags describe.
    out << "Checkpoint not found to provide arguments, using provided arguments." << std::endl;
    std::vector<std::string> missing;
    for (const FlagRow<ModelArguments>& row : kModelFlags) {
      if (row.requirement != FlagRequirement::shape) continue;
      const std::string_view names = row.names;
      const std::string flag(names.substr(0, names.find(',')));
      if (!given_flag(flag)) missing.push_back(flag);
    }
    if (!missing.empty()) {
      common::fail(
          "--use-checkpoint-args: --load {} holds no checkpoint yet ({} is missing), "
          "so the model flags must describe the model: {} not given",
          arguments.checkpointing.load,
          checkpoint_tracker_path(arguments.checkpointing.load).string(), fmt::join(missing, ", "));
    }
  } else {
    take_checkpoint_model_arguments(arguments, given_flag, out);
  }
}

}  // namespace

std::optional<TrainingArguments> parse_arguments(int argc, const char* const* argv,
                                                ArgumentsProgram program) {
  std::optional<CommandLine> line = parse_command_line(argc, argv, program);
  if (!line) return std::nullopt;
  TrainingArguments& arguments = line->arguments;
  arguments.parallelism.world_size = world_size_from_environment(arguments.device);
  // Step 3, a DeepSpeed configuration file (--deepspeed_config), read and mapped.
  apply_deepspeed_config(line->deepspeed, arguments);
  if (arguments.checkpointing.use_checkpoint_args) take_checkpoint_arguments(*line, std::cout);
  // Step 5, the rules between flags: those that need the checkpoint's arguments (which may give
  // the type) last.
  if (line->no_position_embedding &&
      arguments.model.position_embedding_type != PositionEmbeddingType::rope) {
    common::fail(
        "--no-position-embedding without --position-embedding-type rope: a model "
        "without position embeddings is not built (Megatron refuses it too: "
        "'--no-position-embedding is deprecated, use --position-embedding-type')");
  }
  validate_arguments(arguments);
  if (line->kv_channels &&
      *line->kv_channels * arguments.model.num_attention_heads != arguments.model.hidden_size) {
    common::fail(
        "--kv-channels {}: a head dimension other than --hidden-size / "
        "--num-attention-heads ({} / {}) is not built",
        *line->kv_channels, arguments.model.hidden_size, arguments.model.num_attention_heads);
  }
  return arguments;
}

namespace {

// Megatron's rules for the data flags (validate_args, get_blend_and_blend_per_split), with
// messages where Megatron asserts.
void validate_data_arguments(TrainingArguments& arguments) {
  std::vector<std::string> blend_flags, per_split_flags;
  if (!arguments.data.data_path.empty()) blend_flags.push_back("--data-path");
  if (!arguments.data.data_args_path.empty()) blend_flags.push_back("--data-args-path");
  if (!arguments.data.data_file_list.empty()) blend_flags.push_back("--data-file-list");
  if (!arguments.data.train_data_path.empty()) per_split_flags.push_back("--train-data-path");
  if (!arguments.data.valid_data_path.empty()) per_split_flags.push_back("--valid-data-path");
  if (!arguments.data.test_data_path.empty()) per_split_flags.push_back("--test-data-path");
  if (!arguments.data.per_split_data_args_path.empty()) {
    per_split_flags.push_back("--per-split-data-args-path");
  }
  if (blend_flags.size() > 1) {
    common::fail("{} are exclusive: name the data one way", fmt::join(blend_flags, " and "));
  }
  if (!blend_flags.empty() && !per_split_flags.empty()) {
    common::fail("{} and {} are exclusive: one blend split by --split, or each split's own data",
                 blend_flags.front(), per_split_flags.front());
  }
  if (!arguments.data.per_split_data_args_path.empty() && per_split_flags.size() > 1) {
    common::fail("--per-split-data-args-path and {} are exclusive", per_split_flags.front());
  }
  const bool real_data = !blend_flags.empty() || !per_split_flags.empty();
  if (arguments.data.mock_data && real_data) {
    common::fail("--mock-data and {} are exclusive: train on synthetic tokens or on the datasets",
                 real_data && !blend_flags.empty() ? blend_flags.front() : per_split_flags.front());
  }
  if (!arguments.data.mock_data && !real_data) {
    common::fail("no training data: pass --data-path PREFIX (a Megatron .bin/.idx pair, e.g. from "
                 "preprocess_data) or a blend (--data-path 0.3 A 0.7 B, --data-args-path FILE, "
                 "--data-file-list FILE), or --train-data-path/--valid-data-path/--test-data-path, "
                 "or --mock-data for synthetic tokens");
  }
  if (!per_split_flags.empty() && !arguments.data.split.empty()) {
    common::fail(
        "--split {} applies to one blend (--data-path); with {} each split has its own "
        "data: leave --split out",
        arguments.data.split, per_split_flags.front());
  }
  if (!blend_flags.empty()) {
    if (arguments.data.split.empty()) {
      arguments.data.split = "969, 30, 1";
      spdlog::warn("Please specify --split when using {}. Using legacy default value of \"{}\"",
                   blend_flags.front(), arguments.data.split);
    }
    parse_split(arguments.data.split);  // reports a bad --split now, not after the model is built
  }
}

// Megatron's defaults derived from other model flags, and the sequence that must fit them.
void resolve_model_defaults(ModelArguments& model) {
  if (model.ffn_hidden_size == 0) {
    // Megatron's default keeps SwiGLU's three matrices near the parameters of GELU's two
    // 4h ones: 2/3 of 4h, rounded down to a multiple of 64.
    const int64_t four_h = common::checked_multiply(
        4, model.hidden_size, "--ffn-hidden-size (default 4 × --hidden-size)");
    model.ffn_hidden_size = model.swiglu
                                ? common::checked_multiply(four_h, 2,
                                                           "--ffn-hidden-size (default for "
                                                           "--swiglu: 4 × --hidden-size × 2/3)") /
                                      3 / 64 * 64
                                : four_h;
  }
  if (model.max_position_embeddings == 0) {
    model.max_position_embeddings = model.seq_length;
  }
  if (model.seq_length > model.max_position_embeddings) {
    common::fail(
        "--seq-length {} exceeds --max-position-embeddings {}: raise "
        "--max-position-embeddings or shorten --seq-length",
        model.seq_length, model.max_position_embeddings);
  }
}

// Sequence parallelism and the overlap switches: Megatron's rules, and what is accepted but
// not overlapped yet, said once.
void validate_sequence_parallel_and_overlap(ParallelismArguments& parallelism,
                                            const ModelArguments& model) {
  // Megatron: sequence parallelism is switched off without tensor parallelism.
  if (parallelism.tensor_model_parallel_size == 1) {
    parallelism.sequence_parallel = false;
  }
  if (parallelism.sequence_parallel &&
      model.seq_length % parallelism.tensor_model_parallel_size != 0) {
    common::fail(
        "--seq-length {} must be divisible by --tensor-model-parallel-size {} with "
        "--sequence-parallel",
        model.seq_length, parallelism.tensor_model_parallel_size);
  }
  if (parallelism.overlap_param_gather &&
      !parallelism.use_distributed_optimizer) {
    common::fail("--overlap-param-gather is only supported with --use-distributed-optimizer "
                 "(Megatron's rule)");
  }
  // The layouts whose reduction runs after the backward all the same (train_step's rule).
  const auto after_backward = reduction_after_backward(
      parallelism.zero_stage == 3, parallelism.use_distributed_optimizer,
      parallelism.pipeline_model_parallel_size > 1 && !model.untie_embeddings_and_output_weights);
  if (parallelism.overlap_grad_reduce && after_backward) {
    spdlog::warn(
        "--overlap-grad-reduce with {}: the gradients are reduced after the backward, "
        "not overlapped yet (the results are the same)",
        *after_backward);
  }
}

// Megatron core's distributed checkpoint formats that are not built.
void refuse_unbuilt_checkpoint_format(const CheckpointingArguments& checkpointing) {
  const CheckpointFormat format = checkpointing.ckpt_format;
  if (format == CheckpointFormat::zarr || format == CheckpointFormat::torch_dcp) {
    common::fail(
        "--ckpt-format {}: not built; --save writes this backend's files "
        "(--ckpt-format native, the default), Megatron-LM's legacy ones (--ckpt-format torch) "
        "or Megatron core's distributed checkpoint (--ckpt-format torch_dist; "
        "docs/checkpoints.md)",
        common::enum_name(format));
  }
}

// Megatron's pipeline rules (validate_args and the schedules).
void validate_pipeline(const ModelArguments& model, const ParallelismArguments& parallelism) {
  const int64_t pp = parallelism.pipeline_model_parallel_size;
  check_pipeline_stage(model.num_layers, {.pipeline_parallel = pp, .rank = 0, .virtual_chunks = 1});
  if (parallelism.overlap_p2p_communication_flag && parallelism.no_overlap_p2p_communication_flag) {
    common::fail(
        "--overlap-p2p-communication and --no-overlap-p2p-communication contradict "
        "each other: give one (the overlap is the default)");
  }
  if (parallelism.num_layers_per_virtual_pipeline_stage == 0) {
    if (parallelism.overlap_p2p_communication_flag && pp > 1) {
      spdlog::warn(
          "--overlap-p2p-communication applies to the interleaved schedule "
          "(--num-layers-per-virtual-pipeline-stage) only: the 1F1B schedule runs without it, "
          "as Megatron sets it to False");
    }
    return;
  }
  // Megatron's validate_args.
  if (pp == 1) {
    common::fail(
        "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size greater "
        "than 1 (the interleaved schedule), got 1");
  }
  if (pp == 2 && !parallelism.overlap_p2p_communication()) {
    common::fail(
        "--num-layers-per-virtual-pipeline-stage with --no-overlap-p2p-communication needs "
        "--pipeline-model-parallel-size greater than 2, to avoid having multiple p2p sends and "
        "recvs between the same 2 ranks per communication batch; got 2");
  }
  const int64_t per_stage = model.num_layers / pp;
  if (per_stage % parallelism.num_layers_per_virtual_pipeline_stage != 0) {
    common::fail(
        "--num-layers-per-virtual-pipeline-stage {} must divide the {} layers of each "
        "pipeline stage (--num-layers {} / --pipeline-model-parallel-size {})",
        parallelism.num_layers_per_virtual_pipeline_stage, per_stage, model.num_layers, pp);
  }
}

// A process that no MPI launcher started is one rank: a model split over more is a launch to
// correct (say how), not sizes.
void check_launch_holds_model(const TrainingArguments& arguments) {
  const ParallelismArguments& parallelism = arguments.parallelism;
  const int64_t pp = parallelism.pipeline_model_parallel_size;
  const int64_t model_parallel =
      common::checked_multiply(parallelism.tensor_model_parallel_size, pp,
                               "--tensor-model-parallel-size × --pipeline-model-parallel-size");
  if (arguments.program != ArgumentsProgram::pretrain_gpt ||
      parallelism.world_size % model_parallel == 0) {
    return;
  }
  const ProcessEnvironment process = read_process_environment();
  if (started_through_mpi(process)) return;
  const int64_t ranks =
      process.world_size % model_parallel == 0 ? process.world_size : model_parallel;
  common::fail(
      "--tensor-model-parallel-size {} × --pipeline-model-parallel-size {} needs {} "
      "ranks or a multiple, and {}",
      parallelism.tensor_model_parallel_size, pp, model_parallel,
      not_started_through_mpi(process, ranks));
}

// Data parallelism takes the processes model parallelism leaves (world = tp × pp × dp); the
// global batch is whole micro batches of every data-parallel rank. Returns the data-parallel
// size.
int64_t resolve_global_batch_size(TrainingArguments& arguments) {
  const int64_t pp = arguments.parallelism.pipeline_model_parallel_size;
  RunArguments& run = arguments.run;
  const int64_t data_parallel_size = parallel_layout(arguments.parallelism).data_parallel;
  const int64_t micro_batches_at_once = common::checked_multiply(
      run.micro_batch_size, data_parallel_size, "--micro-batch-size × data-parallel size");
  if (run.global_batch_size == 0) run.global_batch_size = micro_batches_at_once;
  if (run.global_batch_size % micro_batches_at_once != 0) {
    common::fail(
        "--global-batch-size {} is not divisible by --micro-batch-size {} × "
        "data-parallel size {}",
        run.global_batch_size, run.micro_batch_size, data_parallel_size);
  }
  if (arguments.virtual_pipeline_chunks() > 1 &&
      (run.global_batch_size / micro_batches_at_once) % pp != 0) {
    common::fail(
        "the interleaved pipeline schedule needs the number of micro batches "
        "(--global-batch-size {} / (--micro-batch-size {} × data-parallel size {}) = "
        "{}) divisible by --pipeline-model-parallel-size {}",
        run.global_batch_size, run.micro_batch_size, data_parallel_size,
        run.global_batch_size / micro_batches_at_once, pp);
  }
  return data_parallel_size;
}

// Grouped-query attention, and Megatron's TransformerConfig rules for recompute.
void validate_attention_and_recompute(const ModelArguments& model) {
  if (model.use_flash_attn && model.attention_backend != AttentionBackend::automatic &&
      model.attention_backend != AttentionBackend::flash) {
    common::fail(
        "--use-flash-attn asks for --attention-backend flash, and --attention-backend "
        "{} asks for another: give one of them",
        common::enum_name(model.attention_backend));
  }
  if (model.group_query_attention && model.num_attention_heads % model.num_query_groups != 0) {
    common::fail("--num-query-groups {} must divide --num-attention-heads {}",
                 model.num_query_groups, model.num_attention_heads);
  }
  if (model.recompute_granularity == RecomputeGranularity::selective) {
    if (model.recompute_method) {
      common::fail(
          "--recompute-method {}: a recompute method is not supported with selective "
          "recompute (--recompute-activations / --recompute-granularity selective)",
          common::enum_name(*model.recompute_method));
    }
    if (model.recompute_num_layers) {
      common::fail("--recompute-num-layers {}: with selective recompute it must not be given",
                   *model.recompute_num_layers);
    }
  } else if (model.recompute_granularity == RecomputeGranularity::full) {
    if (!model.recompute_method) {
      common::fail("--recompute-granularity full needs --recompute-method uniform or block");
    }
    if (!model.recompute_num_layers) {
      common::fail("--recompute-granularity full needs --recompute-num-layers N");
    }
  }
}

// The precision flags and the dataset reader that is built.
void validate_precision_and_data_impl(const TrainingArguments& arguments) {
  if (arguments.precision.bf16 && arguments.precision.fp16) {
    common::fail("--bf16 and --fp16 are mutually exclusive");
  }
  if (arguments.data.data_impl == DataImplementation::lazy ||
      arguments.data.data_impl == DataImplementation::cached) {
    common::fail(
        "--data-impl {}: only the memory-mapped reader is built (--data-impl mmap, or "
        "infer, which finds mmap in every .idx this backend reads)",
        common::enum_name(arguments.data.data_impl));
  }
  // Loss scaling: build the scaler the flags give (backend/optim/mixed_precision_arguments.hpp),
  // so that Megatron's grad-scaler asserts are refused now, naming the flags: --min-loss-scale ≤
  // --initial-loss-scale where the dynamic scaler is built (--fp16 without --loss-scale;
  // Megatron checks it nowhere else), scales that float32 holds. Each value's own range
  // (positive scales, window and hysteresis ≥ 1) is a flag rule.
  make_loss_scaler(arguments.precision);
  if (arguments.precision.loss_scale && !arguments.precision.fp16 && !arguments.precision.bf16) {
    // Megatron's fp32 optimizer has no scaler and ignores the flag; say so rather than stay silent.
    spdlog::warn(
        "--loss-scale {} has no effect without --fp16 or --bf16: fp32 training does not "
        "scale the loss",
        *arguments.precision.loss_scale);
  }
}

// The tokenizer the flags name, its type filled in where the flags imply it: the vocabulary
// size is what the model needs; GPT-2's is a fixed fact.
void resolve_tokenizer_type(TokenizerOptions& tokenizer) {
  // Megatron-DeepSpeed's pretrain_gpt.py: a GPT-2 vocabulary and merges mean GPT-2's BPE.
  if (tokenizer.tokenizer_type.empty() && !tokenizer.vocab_file.empty() &&
      !tokenizer.merge_file.empty()) {
    tokenizer.tokenizer_type = "GPT2BPETokenizer";
  }
  if (tokenizer.tokenizer_type.empty()) {
    if (tokenizer.vocab_size <= 0) {
      common::fail("no tokenizer: pass --tokenizer-type GPT2BPETokenizer (with --vocab-file and "
                   "--merge-file) or --tokenizer-type NullTokenizer --vocab-size N");
    }
    tokenizer.tokenizer_type = "NullTokenizer";
  }
  if (std::find(kBuiltTokenizers.begin(), kBuiltTokenizers.end(), tokenizer.tokenizer_type) ==
      kBuiltTokenizers.end()) {
    common::fail(
        "--tokenizer-type {} is not built yet: this backend has GPT2BPETokenizer, "
        "NullTokenizer, Llama2Tokenizer, GPTSentencePieceTokenizer, "
        "SentencePieceTokenizer and HuggingFaceTokenizer",
        tokenizer.tokenizer_type);
  }
  // --tokenizer-model with a type that does not read it, or a SentencePiece type without it.
  // The model file itself is read where the vocabulary size is needed (tokenizer_vocab_size).
  check_tokenizer_flags(tokenizer);
  if (tokenizer.tokenizer_type == "NullTokenizer" && tokenizer.vocab_size <= 0) {
    common::fail("--tokenizer-type NullTokenizer needs --vocab-size N (N > 0)");
  }
}

// Checkpointing. --save-interval without --save is accepted, as Megatron accepts it: scripts
// often pass the interval always and --save only sometimes.
void validate_checkpointing(const TrainingArguments& arguments) {
  const CheckpointingArguments& checkpointing = arguments.checkpointing;
  if (checkpointing.finetune && checkpointing.load.empty()) {
    common::fail("--finetune needs --load DIR (the checkpoint whose weights to start from)");
  }
  if (arguments.spike.rollback_on_spike && checkpointing.save.empty()) {
    common::fail("--rollback-on-spike needs --save DIR (and a --save-interval): a spike rolls "
                 "back to the last checkpoint this run saved there");
  }
  if (arguments.spike.rollback_on_spike && checkpointing.no_save_optim) {
    common::fail("--rollback-on-spike and --no-save-optim: a rollback restores the optimizer's "
                 "moments from the checkpoint, which --no-save-optim leaves out (a spike's "
                 "moments would stay); drop --no-save-optim");
  }
  if (checkpointing.override_opt_param_scheduler &&
      checkpointing.use_checkpoint_opt_param_scheduler) {
    common::fail("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are "
                 "mutually exclusive: the schedule comes from the flags or from the checkpoint");
  }
}

}  // namespace

// Megatron core's rules for the CUDA graph flags (transformer_config.py): the older spellings
// alone, and mapped; then what this backend builds (docs/step_on_device.md, item 5).
void resolve_cuda_graphs(TrainingArguments& arguments) {
  if ((arguments.enable_cuda_graph || arguments.external_cuda_graph) &&
      arguments.cuda_graph_impl != CudaGraphImpl::none) {
    common::fail("Do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl");
  }
  if (arguments.enable_cuda_graph && arguments.external_cuda_graph) {
    common::fail(
        "--enable-cuda-graph and --external-cuda-graph cannot be enabled at the same time");
  }
  if (arguments.enable_cuda_graph) arguments.cuda_graph_impl = CudaGraphImpl::local;
  if (arguments.external_cuda_graph) arguments.cuda_graph_impl = CudaGraphImpl::transformer_engine;
  if (arguments.cuda_graph_impl == CudaGraphImpl::transformer_engine) {
    common::fail(
        "--cuda-graph-impl transformer_engine (--external-cuda-graph) captures through "
        "NVIDIA Transformer Engine, which this backend does not use; "
        "--cuda-graph-impl local captures the whole step");
  }
  if (arguments.cuda_graph_warmup_steps < 1) {
    common::fail(
        "--cuda-graph-warmup-steps {}: at least 1 (a shape's first step builds the GEMM "
        "and attention plans, which a capture cannot)",
        arguments.cuda_graph_warmup_steps);
  }
}

// Each value's own range was checked when it was parsed (common/flag_rules); these are the
// rules between flags, the defaults derived from other flags, and what is not built yet, in
// the order a command line with several mistakes reports them.
void validate_arguments(TrainingArguments& arguments) {
  resolve_model_defaults(arguments.model);
  validate_sequence_parallel_and_overlap(arguments.parallelism, arguments.model);
  refuse_unbuilt_checkpoint_format(arguments.checkpointing);
  validate_pipeline(arguments.model, arguments.parallelism);
  check_launch_holds_model(arguments);
  const int64_t data_parallel_size = resolve_global_batch_size(arguments);
  if (arguments.optimizer.min_lr > arguments.optimizer.lr) {
    common::fail("--min-lr {} must lie in [0, --lr {}]", arguments.optimizer.min_lr,
                 arguments.optimizer.lr);
  }
  // Training length (iterations or samples), batch-size ramp-up, learning-rate and weight-decay
  // schedule: Megatron's rules in backend/train/training_schedule.cpp. evaluate_gpt trains
  // nothing: no length or schedule to resolve, and it reads its task's files (--valid-data),
  // not Megatron's indexed datasets.
  const bool trains = arguments.program == ArgumentsProgram::pretrain_gpt;
  if (trains) resolve_training_schedule(arguments, data_parallel_size);
  validate_attention_and_recompute(arguments.model);
  validate_precision_and_data_impl(arguments);
  resolve_tokenizer_type(arguments.tokenizer);
  if (trains) validate_data_arguments(arguments);
  validate_checkpointing(arguments);
  resolve_cuda_graphs(arguments);
}

namespace {

// Every row's value by its dump name, into `values` (as text or as JSON: dump_flag_rows), then
// what no flag sets by itself: the DeepSpeed configuration's mapping, the launch, and the
// values Megatron prints its own way, as Megatron's args hold them.
template <typename Values>
void dump_arguments(const TrainingArguments& a, Values& values) {
  dump_flag_rows<ModelArguments>(a.model, kModelFlags, values);
  dump_flag_rows<ModelArguments>(a.model, kRecomputeFlags, values);
  dump_flag_rows<TokenizerOptions>(a.tokenizer, kTokenizerFlags, values);
  dump_flag_rows<DataArguments>(a.data, kDataFlags, values);
  dump_flag_rows<ParallelismArguments>(a.parallelism, kParallelismFlags, values);
  dump_flag_rows<MixedPrecisionArguments>(a.precision, kPrecisionFlags, values);
  dump_flag_rows<OptimizerArguments>(a.optimizer, kOptimizerFlags, values);
  dump_flag_rows<RunArguments>(a.run, kRunFlags, values);
  dump_flag_rows<RunArguments>(a.run, kExitFlags, values);
  dump_flag_rows<EvaluationArguments>(a.evaluation, kEvaluationFlags, values);
  dump_flag_rows<LoggingArguments>(a.logging, kLogIntervalFlags, values);
  dump_flag_rows<LoggingArguments>(a.logging, kLoggingFlags, values);
  dump_flag_rows<LoggingArguments>(a.logging, kLoggingToTensorBoardFlags, values);
  dump_flag_rows<CheckpointingArguments>(a.checkpointing, kCheckpointDirectoryFlags, values);
  dump_flag_rows<CheckpointingArguments>(a.checkpointing, kSaveIntervalFlags, values);
  dump_flag_rows<CheckpointingArguments>(a.checkpointing, kCheckpointingFlags, values);
  dump_flag_rows<CheckpointingArguments>(a.checkpointing, kCheckpointArgumentsFlags, values);
  dump_flag_rows<DataArguments>(a.data, kLegacyDataFlags, values);
  dump_flag_rows<ParallelismArguments>(a.parallelism, kLegacyParallelismFlags, values);
  dump_flag_rows<TrainingArguments>(a, kDeviceFlags, values);
  dump_flag_rows<TrainingArguments>(a, kCudaGraphFlags, values);
  if (a.program == ArgumentsProgram::evaluate_gpt) {
    // Megatron's tasks/main.py arguments, in its dump too.
    dump_flag_rows<TaskArguments>(a.tasks, kTaskFlags, values);
  }
  if (a.program == ArgumentsProgram::text_generation_server) {
    dump_flag_rows<ServingArguments>(a.serving, kServingFlags, values);
  }
}

// What no flag sets by itself (dump_arguments).
nlohmann::json derived_arguments(const TrainingArguments& a) {
  return {
      {"deepspeed", a.deepspeed},
      {"deepspeed_config",
       a.deepspeed_config.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.deepspeed_config)},
      {"zero_stage", a.parallelism.zero_stage},
      {"lr_decay_iters", a.run.train_samples > 0 ? nlohmann::json(nullptr)
                                                 : nlohmann::json(a.optimizer.lr_decay_iters)},
      {"log_loss_scale_to_tensorboard", a.logging.log_loss_scale_to_tensorboard},
      {"world_size", a.parallelism.world_size},
      {"data_parallel_size", a.parallelism.data_parallel_size()},
  };
}

}  // namespace

std::map<std::string, std::string> argument_values(const TrainingArguments& a) {
  std::map<std::string, std::string> values;
  dump_arguments(a, values);
  const nlohmann::json derived = derived_arguments(a);
  for (const auto& [name, value] : derived.items()) values[name] = python_text(value);
  // Megatron's args hold the signal itself (signal.Signals), which prints with its class.
  values["exit_signal"] = "Signals." + a.run.exit_signal;
  return values;
}

nlohmann::json megatron_arguments(const TrainingArguments& a) {
  nlohmann::json values = nlohmann::json::object();
  dump_arguments(a, values);
  values.update(derived_arguments(a));
  // By the signal's name: a checkpoint's args hold plain values only.
  values["exit_signal"] = a.run.exit_signal;
  return values;
}

std::vector<std::string> format_arguments(const TrainingArguments& a) {
  // Megatron prints every argument sorted by name, dots padding to a fixed column.
  const std::map<std::string, std::string> values = argument_values(a);
  std::vector<std::string> lines;
  lines.push_back("------------------------ arguments ------------------------");
  for (const auto& [name, value] : values) {
    const size_t dots = name.size() < 48 ? 48 - name.size() : 1;
    lines.push_back(fmt::format("  {} {} {}", name, std::string(dots, '.'), value));
  }
  lines.push_back("-------------------- end of arguments ---------------------");
  return lines;
}

}  // namespace backend
