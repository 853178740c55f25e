// The activation plan of one micro-batch shape: which buffers the forward keeps for the
// backward, which the recompute schedule drops, the backward's scratch, all as regions of one
// arena carved before the first step (device/arena.hpp), so no step allocates.
//
// Activation recompute (Megatron's --recompute-*) trades time for memory without changing a
// bit of the loss or the gradients: selective drops each layer's attention softmax statistics
// (log-sum-exp; the blockwise attention keeps no probabilities, so this saves little) and the
// backward runs the attention core again from the stored qkv; full drops whole layers
// (uniform: chunks of recompute_num_layers layers, storing each chunk's input; block: the first
// recompute_num_layers layers, one by one) and the backward runs the chunk's forward again
// before its backward. A recomputed layer keeps at most its output (when the next layer's
// recompute, or the final norm, starts from it); the recomputed layers of one chunk run in
// shared slots: slot j serves the j-th layer of every chunk.
//
// Pipeline parallelism (pipeline_stage.hpp): a stage plans its chunks' layers only, the embedding
// output (its first chunk's input, received on a later stage) everywhere, the other chunks' inputs
// and every chunk's output gradient (both received) when pipelined, the final norm and the logits
// on the last stage. A stage holds the kept buffers of several micro batches at once (the 1F1B
// schedules keep up to pp in flight): ActivationPart splits the plan into what each micro batch
// keeps and the scratch all of them share, one arena each.
//
// Dimensions: B batch, T sequence, C hidden, NH heads, QKV = (NH + 2·NG)·HD, F ffn (F1 = 2F with
// SwiGLU), V padded vocabulary; rows = B·T.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/device/arena.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/model/pipeline_stage.hpp"

namespace backend {

class RecomputeSchedule {
 public:
  // `chunks`: the model chunks whose layers are recomputed each on their own, as Megatron's
  // TransformerBlock of each pipeline stage does (uniform chunks and block's first layers count
  // from a chunk's first layer); empty: the whole model is one chunk.
  explicit RecomputeSchedule(const GptConfig& config, std::vector<LayerRange> chunks = {});

  // Whether layer l's activations are recomputed in the backward (full recompute), the first
  // layer of its chunk (the layers recomputed together, from the chunk's stored input), and
  // whether it ends its chunk.
  bool recomputed(int64_t l) const;
  int64_t chunk_begin(int64_t l) const;
  bool last_of_chunk(int64_t l) const;
  // Selective: every layer's attention log-sum-exp is recomputed, into one shared buffer.
  bool selective() const { return granularity_ == RecomputeGranularity::selective; }

 private:
  const LayerRange& chunk_of(int64_t l) const;

  RecomputeGranularity granularity_;
  RecomputeMethod method_;
  int64_t recompute_num_layers_;
  std::vector<LayerRange> chunks_;
};

// Which buffers a plan carves: all of them (one micro batch at a time), what each micro batch
// in flight keeps, or the scratch they share.
enum class ActivationPart { all, per_micro_batch, shared };

// Region indices into ActivationPlan::layout of what one layer keeps; a region of 0 elements
// is a buffer this layer does not keep. The norms' means are empty with RMSNorm.
struct LayerActivationRegions {
  int64_t input_norm, input_norm_mean, input_norm_rstd;  // (rows, C), (rows), (rows)
  int64_t qkv;                                           // (rows, QKV), q and k rotated (RoPE)
  int64_t attention_logsumexp;                           // (B, NH, T)
  int64_t context;                                       // (rows, NH·HD)
  int64_t attention_residual;                            // (rows, C)
  int64_t mlp_norm, mlp_norm_mean, mlp_norm_rstd;        // (rows, C), (rows), (rows)
  int64_t fc1;                                           // (rows, F1)
  int64_t activation;                                    // (rows, F)
  int64_t output;                                        // (rows, C)
};

struct ActivationPlan {
  int64_t batch_size = 0;
  int64_t seq_length = 0;
  ArenaLayout layout;
  // layers[l]: layer l's buffers, or only its output for a recomputed layer (which works in
  // recompute_slots[l − chunk_begin(l)]).
  std::vector<LayerActivationRegions> layers;
  std::vector<LayerActivationRegions> recompute_slots;
  int64_t tokens = 0, labels = 0;  // (rows) i32
  // The tokens' index for the embedding backward (ops/embedding.hpp's index_tokens, uploaded
  // with the tokens), token_index_elements(rows) i32: on the first pipeline stage of a model
  // that trains; empty otherwise.
  int64_t token_index = 0;
  int64_t embedded = 0;            // (rows, C) the first chunk's input
  // Pipelined: chunk_inputs[c], c ≥ 1, the other chunks' inputs (chunk_inputs[0] is unused), and
  // output_gradients[c] each chunk's output gradient as received, (rows, C) each.
  std::vector<int64_t> chunk_inputs;
  std::vector<int64_t> output_gradients;
  int64_t recomputed_logsumexp = 0;  // (B, NH, T), selective recompute only
  int64_t final_norm = 0, final_norm_mean = 0, final_norm_rstd = 0;
  int64_t logits = 0;                  // (rows, V)
  int64_t losses = 0, logsumexp = 0;   // (rows)
  int64_t loss_total = 0;              // one f64: Σ losses, summed on the device
  // Tensor parallelism (vocab-parallel cross-entropy): every rank's log-sum-exp over its
  // vocabulary shard, (tp, rows), and the label's logit summed over the shards, (rows).
  int64_t logsumexp_parts = 0, target_logit = 0;
  // Sequence parallelism: a row-parallel output, and a column-parallel input gradient, reduce-
  // scattered to this rank's rows, (rows / tp, C) each.
  int64_t branch_shard = 0, dnorm_shard = 0;
  int64_t branch = 0;                  // (rows, C) linear_proj / linear_fc2 output
  int64_t rope_cos = 0, rope_sin = 0;  // (T, rotary_dim / 2), RoPE only
  // Backward scratch. The logits stay intact so a backward can be repeated.
  int64_t dlogits = 0;    // (rows, V)
  int64_t dresidual = 0;  // (rows, C) the residual stream
  int64_t dbranch = 0;    // (rows, C)
  int64_t dnorm = 0;      // (rows, C)
  int64_t dqkv = 0;       // (rows, QKV)
  int64_t dhidden = 0;    // (rows, F) gradient of the activation's output
  int64_t dfc1 = 0;       // (rows, F1) gradient of linear_fc1's output
  // Bytes of what the forward keeps for the backward (GptModel::activation_bytes): the layers'
  // buffers and slots, embedding, final norm, logits, losses. Not the scratch, nor padding.
  int64_t kept_bytes = 0;
};

// The plan for micro batches of (batch_size, seq_length), activations in `dtype` (statistics: norm
// means and rstds, log-sum-exps, losses, RoPE tables in fp32 when `dtype` is bf16 or fp16). Sizes
// are checked for overflow with messages naming the micro batch and sequence length. Under tensor
// parallelism `config` is the rank's shard (tensor_parallel_shard()) and `tensor_parallel` the
// group's size, which adds the vocab-parallel cross-entropy's buffers. With sequence_parallel the
// residual stream (embedding output, residuals, layer outputs, the norms' statistics and their
// gradients) holds this rank's rows / tensor_parallel rows only, and the shard buffers of the
// reduce-scatters are added. Under pipeline parallelism the plan is `stage`'s (the layers of
// `schedule`'s chunks, which must be the stage's), and `part` picks the buffers carved (the others
// have 0 elements); kept_bytes counts one micro batch's kept buffers either way.
ActivationPlan plan_activations(const GptConfig& config, const RecomputeSchedule& schedule,
                                int64_t batch_size, int64_t seq_length, ElementType dtype,
                                int64_t tensor_parallel = 1, bool sequence_parallel = false,
                                const PipelineStage& stage = {},
                                ActivationPart part = ActivationPart::all);

}  // namespace backend
