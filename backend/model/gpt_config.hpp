// Shape of a GPT decoder, as Megatron-LM's flags describe it (--num-layers, --hidden-size,
// --num-attention-heads, --ffn-hidden-size, --max-position-embeddings, --seq-length,
// --init-method-std, --norm-epsilon, --make-vocab-size-divisible-by, --hidden-dropout,
// --attention-dropout), and the Llama-family switches (--position-embedding-type,
// --rotary-base, --rotary-percent, --normalization, --swiglu, --disable-bias-linear,
// --untie-embeddings-and-output-weights, --group-query-attention --num-query-groups). Field names
// are Megatron core's (TransformerConfig, GPTModel's constructor arguments) where it has one. The
// vocabulary is padded as Megatron pads it (megatron/training/tokenizer: _vocab_size_with_padding):
// up to a multiple of make_vocab_size_divisible_by × tp.
// Every size derived from the shape (the tensors' element counts, the parameter count) is
// computed with overflow-checked arithmetic (common/checked_math.hpp): a shape whose sizes do
// not fit int64 fails validation naming the flags, before GptModel allocates anything.
#pragma once

#include <cstdint>
#include <span>

#include "backend/common/enum_names.hpp"
#include "backend/common/memory_estimate.hpp"
#include "backend/core/element_type.hpp"
#include "backend/ops/rope.hpp"

namespace backend {

enum class PositionEmbeddingType { learned_absolute, rope };
enum class Normalization { layer_norm, rms_norm };
// Activation recompute (Megatron's --recompute-granularity / --recompute-method): what the
// backward recomputes instead of the forward storing it. Changes memory and time, never a
// result bit.
enum class RecomputeGranularity { none, selective, full };
enum class RecomputeMethod { uniform, block };

// Megatron's spellings of the settings above (common/enum_names.hpp): on the command line, in
// checkpoints' records and in the arguments dump.
constexpr common::EnumName<PositionEmbeddingType> kPositionEmbeddingTypeNames[] = {
    {PositionEmbeddingType::learned_absolute, "learned_absolute"},
    {PositionEmbeddingType::rope, "rope"}};
// Megatron-LM's names, then Megatron-DeepSpeed's.
constexpr common::EnumName<Normalization> kNormalizationNames[] = {
    {Normalization::layer_norm, "LayerNorm"},
    {Normalization::rms_norm, "RMSNorm"},
    {Normalization::layer_norm, "layernorm"},
    {Normalization::rms_norm, "rmsnorm"}};
constexpr common::EnumName<RecomputeGranularity> kRecomputeGranularityNames[] = {
    {RecomputeGranularity::none, ""},
    {RecomputeGranularity::selective, "selective"},
    {RecomputeGranularity::full, "full"}};
constexpr common::EnumName<RecomputeMethod> kRecomputeMethodNames[] = {
    {RecomputeMethod::uniform, "uniform"}, {RecomputeMethod::block, "block"}};
constexpr std::span<const common::EnumName<PositionEmbeddingType>> enum_names(
    PositionEmbeddingType) {
  return kPositionEmbeddingTypeNames;
}
constexpr std::span<const common::EnumName<Normalization>> enum_names(Normalization) {
  return kNormalizationNames;
}
constexpr std::span<const common::EnumName<RecomputeGranularity>> enum_names(RecomputeGranularity) {
  return kRecomputeGranularityNames;
}
constexpr std::span<const common::EnumName<RecomputeMethod>> enum_names(RecomputeMethod) {
  return kRecomputeMethodNames;
}
// Megatron's --bf16 / --fp16 (GptConfig::mixed_precision); none: the parameters' type throughout.
enum class MixedPrecision { none, bf16, fp16 };

// The type of the working weights, the activations and the GEMMs under `precision`: bf16 or
// fp16, or `parameters` (the master weights' own type) without mixed precision.
constexpr ElementType working_type(MixedPrecision precision, ElementType parameters) {
  switch (precision) {
    case MixedPrecision::bf16: return ElementType::bf16;
    case MixedPrecision::fp16: return ElementType::f16;
    case MixedPrecision::none: break;
  }
  return parameters;
}

struct GptConfig {
  int64_t num_layers = 12;
  int64_t hidden_size = 768;
  int64_t num_attention_heads = 12;
  // Grouped-query attention (--group-query-attention --num-query-groups): NG key/value heads,
  // each shared by NH / NG query heads. 0 means NG = NH, multi-head attention.
  int64_t num_query_groups = 0;
  int64_t ffn_hidden_size = 3072;          // Megatron's default: 4 × hidden_size
  int64_t max_position_embeddings = 2048;  // rows of the learned position table
  int64_t vocab_size = 50257;              // the tokenizer's vocabulary
  int64_t padded_vocab_size = 50304;       // rows of the word embedding / logits
  double layernorm_epsilon = 1e-5;  // TransformerConfig's name; --norm-epsilon, for either norm
  double init_method_std = 0.02;
  // Dropout probabilities in [0, 1). Megatron's flags default to 0.1; here 0, so a model
  // built without them computes what it computed before dropout existed.
  double hidden_dropout = 0.0;     // after the embedding, in both bias-dropout-adds
  double attention_dropout = 0.0;  // on the attention probabilities

  // Llama-family switches; the defaults are the GPT-2 model.
  PositionEmbeddingType position_embedding_type = PositionEmbeddingType::learned_absolute;
  int64_t rotary_base = 10000;  // RoPE: inv_freq[i] = rotary_base^(−2i / rotary_dim)
  double rotary_percent = 1.0;  // RoPE: share of each head's features that rotate
  // RoPE: Llama 3's frequency scaling (--use-rope-scaling --rope-scaling-factor; ops/rope.hpp)
  RopeScaling rope_scaling{};
  Normalization normalization = Normalization::layer_norm;  // all three norms of the model
  // --apply-layernorm-1p (NeMo's normalization: layernorm1p): each LayerNorm's weight is
  // stored as γ − 1, initialised to 0, and the norm scales by weight + 1 (apex's
  // zero-centered gamma), so weight decay pulls γ towards 1. LayerNorm only.
  bool apply_layernorm_1p = false;
  bool swiglu = false;          // gated MLP: linear_fc1 gives 2F, silu(a) · b (else GELU)
  bool add_bias_linear = true;  // biases of linear_qkv, linear_proj, linear_fc1, linear_fc2
  bool share_embeddings_and_output_weights = true;  // false: a separate output_layer.weight

  // selective: the attention core runs again in the backward, so its softmax statistics
  //            (B·NH·T per layer; the blockwise attention never keeps probabilities) are
  //            not stored.
  // full + uniform: layers in chunks of recompute_num_layers, only each chunk's input stored.
  // full + block: the first recompute_num_layers layers one by one, the rest stored.
  RecomputeGranularity recompute_granularity = RecomputeGranularity::none;
  RecomputeMethod recompute_method = RecomputeMethod::uniform;
  int64_t recompute_num_layers = 1;

  // Megatron's --bf16 / --fp16 on a GPU: the forward and backward read a bf16 (fp16) working
  // copy of the parameters and keep bf16 (fp16) activations, while the parameters themselves
  // (the optimizer's master weights), their gradients and the statistics stay fp32. fp16's
  // narrow range is the trainer's to guard (the loss scaler; overflowing steps are skipped).
  // GptModel<float> on a device with bf16 and fp16 ops (the CUDA device), one rank's whole
  // model (no tensor or pipeline parallelism, no ZeRO-3) for now; GptModel refuses anything
  // else by name.
  MixedPrecision mixed_precision = MixedPrecision::none;

  // A model that only runs forwards (text_generation_server, evaluate_gpt): no gradient
  // buffer is carved, which halves the fp32 model's memory, and backward() is refused.
  bool inference_only = false;

  // A model whose every backward follows a forward given the backward's scale (the trainer's:
  // GptModel::forward's fused classifier writes the logits' gradient over the logits): the
  // backward's (rows, vocabulary) dlogits scratch is not carved, and a backward after a forward
  // without the scale is refused.
  bool classifier_gradient_in_forward = false;

  // Features per attention head (Megatron's kv_channels); 0: hidden_size / num_attention_heads,
  // the only value the flags give. A tensor-parallel shard (tensor_parallel_shard()) sets it,
  // since its heads keep the full model's head size while it holds fewer of them.
  int64_t kv_channels = 0;

  int64_t head_dim() const {
    return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads;
  }
  // Features of the attention context, linear_proj's input (Megatron's query_projection_size):
  // hidden_size in a whole model, NH/tp heads' worth in a tensor-parallel shard.
  int64_t attention_features() const { return num_attention_heads * head_dim(); }
  int64_t query_groups() const {
    return num_query_groups > 0 ? num_query_groups : num_attention_heads;
  }
  // Output features of linear_qkv: per query group [NH/NG query heads | key | value].
  int64_t qkv_features() const { return (num_attention_heads + 2 * query_groups()) * head_dim(); }
  // Features of a head that RoPE rotates: Megatron's int(head_dim × rotary_percent).
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim()) * rotary_percent);
  }
  // Output features of linear_fc1: the gate and the linear half with SwiGLU.
  int64_t fc1_features() const { return swiglu ? 2 * ffn_hidden_size : ffn_hidden_size; }
};

// Megatron's padding rule: round vocab_size up to a multiple of divisible_by × tp.
int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tensor_parallel);

// Megatron's tensor-parallel divisibility rules (megatron/core/tensor_parallel, the
// transformer config's checks): heads, query groups, --ffn-hidden-size and the padded
// vocabulary must split evenly over `tensor_parallel` ranks; common::Error naming the flags.
void check_tensor_parallel(const GptConfig& config, int64_t tensor_parallel);

// The part of a validated `config` one of `tensor_parallel` ranks computes (Megatron's column-
// and row-parallel layers): NH/tp query heads and NG/tp query groups (kv_channels keeps the
// head size), ffn_hidden_size/tp features of the MLP, padded_vocab_size/tp rows of the
// vocabulary. The hidden size, sequence and norms are whole. Not a model of its own (validate()
// would refuse its vocabulary): the shape a rank's layout and activations are sized by.
GptConfig tensor_parallel_shard(const GptConfig& config, int64_t tensor_parallel);

// Throws common::Error naming the flag when the shape is inconsistent
// (heads must divide hidden, every size positive, padded ≥ vocab, dropout in [0, 1), a
// parameter count that fits int64, ...).
void validate(const GptConfig& config);

// The number of parameters GptModel lays out for `config`, exactly; common::Error naming the
// tensor and flags when it does not fit int64.
int64_t parameter_count(const GptConfig& config);

// The shape as the memory estimate (common/memory_estimate.hpp) reads it.
common::ModelShape model_shape(const GptConfig& config);

// How a run is spread over ranks, as far as one rank's memory is concerned.
struct TrainingParallelism {
  int64_t tensor_parallel = 1;
  int64_t data_parallel = 1;
  int64_t pipeline_parallel = 1;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;  // ZeRO stage 1 when zero_stage is 0
  // DeepSpeed's zero_optimization: stage (0: distributed_optimizer decides), offload_optimizer
  // (or cpu_offload) and offload_param; see common::TrainingSetup.
  int64_t zero_stage = 0;
  bool offload_optimizer = false;
  bool offload_parameters = false;
  int64_t virtual_pipeline_chunks = 1;  // model chunks per pipeline stage (interleaved schedule)
};

// Training `config` on this backend: fp32 throughout, and the blockwise attention that never
// stores the s × s scores; one rank's share under `parallelism`.
common::MemoryEstimate training_memory_estimate(const GptConfig& config, int64_t micro_batch_size,
                                                int64_t seq_length,
                                                const TrainingParallelism& parallelism = {});

}  // namespace backend
