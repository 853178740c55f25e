// How much memory training a GPT model takes, estimated before anything is allocated, and
// whether it fits what the machine has. One pure function serves the launcher's preflight (per
// GPU of the configured layout, against cluster.gpu_memory_gb) and pretrain_gpt and
// checkpoint_util (this process, against the machine's physical memory), so both print and
// refuse by the same numbers.
//
// Parameters: exactly the tensors GptModel lays out (backend/model/gpt_model.hpp): word
// embedding V·h (and an untied output layer V·h), a learned position table P·h, per layer the
// attention (q and output h² each, k and v h·g·d each for g key/value heads of d features),
// the MLP (2·h·f, or 3·h·f with SwiGLU's gate), the norms (h weights, h biases with LayerNorm)
// and the linear biases, and the final norm. With pipeline parallelism the first stage holds
// the embedding and the last the final norm and the output layer (with tied embeddings a copy of
// the word embedding, backend/model/pipeline_stage.hpp); all of it ÷ tp.
// Bytes per parameter Φ of the stage: Megatron's mixed-precision bookkeeping (bf16/fp16 weights
// 2 B, fp32 main gradients 4 B, fp32 master weights + Adam moments 12 B; fp32 training 4 + 4 +
// 8 B), then ZeRO (Rajbhandari et al. 2020) over the dp ranks:
//   stage 1 and 2: the optimizer state ÷ dp. Both are what pretrain_gpt's distributed optimizer
//     does: the backward accumulates into the whole fp32 gradient buffer (4 B), which is then
//     reduce-scattered into a separate fp32 shard (4/dp B) that the optimizer reads, so stage 2's
//     saving on gradients is not had and the shard is counted on top;
//   stage 3: weights, gradients and optimizer state all ÷ dp, plus pretrain_gpt's working set:
//     one slot per kind of unit on the stage (the embedding, a transformer layer, the head: the
//     final norm and an untied output layer, or the tied copy on a last pipeline stage), each
//     holding a unit's gathered parameters (at the weights' width) and its whole gradient (4 B)
//     until that is reduced into the shards.
//     DeepSpeed itself prefetches further and keeps up to stage3_max_live_parameters gathered.
//   offload_optimizer (stages 1-3; DeepSpeed's offload_optimizer, formerly cpu_offload): the
//     optimizer state and the fp32 gradient shard it reads live in host memory;
//   offload_parameters (stage 3; DeepSpeed's offload_param): the parameter shard lives in host
//     memory, the working set stays on the device.
// Offloaded bytes are the separate host_bytes, never part of the device total.
// Activations per layer from Korthikanti et al. 2022 ("Reducing Activation Recomputation in
// Large Transformer Models", Table 2): s·b·h·(10 + 24/t) + 5·a·s²·b/t bytes without recompute
// for 16-bit activations (doubled for fp32); the s² term of the attention scores is dropped with
// selective recompute and with attention that never stores them (flash, or the CPU path's
// blockwise attention); 2·s·b·h per layer with full recompute plus one layer's worth. Layers in
// flight on pipeline rank r (Megatron's schedules, with enough micro batches per step): 1F1B
// keeps pp − r micro batches of L/pp layers (the first stage: L layers' worth); the interleaved
// schedule with V chunks keeps 2·(pp − r − 1) + (V − 1)·pp + 1 chunks of L/(pp·V) layers (the
// first stage: L·(1 + (pp − 1)/(pp·V)), as Korthikanti et al. 2022 give it). The last stage adds
// the logits, s·b·V/t of the activations' type (4 B, or 2 B under mixed precision), whose
// gradient the fused classifier writes over them. The estimate is the first or the last
// stage, whichever needs more device memory (the others hold less than the first).
// Everything is computed in double, so a shape of any int64 sizes gives a (huge) number, never
// an overflow.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace common {

struct ModelShape {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;  // key/value heads; 0: as many as attention heads
  int64_t ffn_hidden_size = 0;
  int64_t padded_vocab_size = 0;
  int64_t position_rows = 0;  // rows of a learned position table; 0 with RoPE
  bool gated_mlp = false;     // SwiGLU: linear_fc1 gives 2 × ffn features
  bool linear_biases = true;
  bool norm_biases = true;  // LayerNorm; RMSNorm has none
  bool untied_output = false;
};

enum class Recompute { none, selective, full };

struct TrainingSetup {
  int64_t seq_length = 1;
  int64_t micro_batch_size = 1;
  int64_t tensor_parallel = 1;
  int64_t pipeline_parallel = 1;
  int64_t data_parallel = 1;
  // Model chunks per pipeline stage: > 1 is Megatron's interleaved schedule.
  int64_t virtual_pipeline_chunks = 1;
  bool mixed_precision = false;  // bf16/fp16 weights, fp32 gradients and master weights
  // ZeRO over the data-parallel ranks: 0 none; 1 and 2 the distributed optimizer
  // (--use-distributed-optimizer, DeepSpeed stages 1 and 2); 3 the parameters too.
  int64_t zero_stage = 0;
  bool offload_optimizer = false;   // optimizer state in host memory (zero_stage ≥ 1)
  bool offload_parameters = false;  // the stage-3 parameter shard in host memory
  // The residual stream sharded over the tensor-parallel ranks (--sequence-parallel; tp > 1).
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  bool attention_scores_stored = true;  // false: attention keeps no s × s scores
};

struct MemoryEstimate {
  double parameters = 0;  // the whole model
  double weights_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;
  double file_tensors_bytes = 0;  // conversions: the tensors read from files, held alongside
  double host_bytes = 0;          // offloaded to host memory (ZeRO offload); not in total_bytes()
  // What the device (or, without an accelerator, the process) holds.
  double total_bytes() const {
    return weights_bytes + gradients_bytes + optimizer_bytes + activations_bytes +
           file_tensors_bytes;
  }
};

// The model's parameters, as GptModel lays them out.
double parameter_count(const ModelShape& shape);

// Training: per device of the layout (the most loaded pipeline stage). common::Error for a ZeRO
// stage outside 0-3, offload_optimizer without a stage, offload_parameters below stage 3.
MemoryEstimate estimate_training_memory(const ModelShape& shape, const TrainingSetup& setup);

// Converting a model (checkpoint_util): its fp32 weights, and a second copy of them as the
// tensors read from the files it comes from.
MemoryEstimate estimate_conversion_memory(const ModelShape& shape);

// Resharding a checkpoint (checkpoint_util --target-tensor-parallel-size): the whole model's
// fp32 weights and, with `optimizer_state`, its two Adam moments, assembled from the source
// files; and one target file's shards of all three, as the tensors written to it: at most the
// whole model's ÷ the target tensor-parallel size (a pipeline stage holds a part of the model,
// the last one's tied copy of the word embedding standing in for the first stage's layers).
MemoryEstimate estimate_reshard_memory(const ModelShape& shape, bool optimizer_state,
                                       int64_t target_tensor_parallel);

// The table: "  weights             0.25 GB" ... "  total               1.02 GB<capacity>",
// one line each; `capacity` follows the total (" of 80.00 GB"), empty when unknown. Offloaded
// bytes follow the total on a line of their own ("  host memory ..."), only when there are any.
std::vector<std::string> format_memory_estimate(const MemoryEstimate& estimate,
                                                std::string_view capacity = {});

// "12.35 GB" (10^9 bytes).
std::string format_gigabytes(double bytes);

// What this process may use: the physical memory, or the cgroup's memory limit when the
// process runs in a container that sets a smaller one.
struct AvailableMemory {
  double bytes = 0;
  std::string source;  // "physical memory" or "the cgroup's memory limit"
};
AvailableMemory available_memory();

// When the estimate exceeds what is available: common::Error "<what> does not fit in this
// machine's memory: an estimated X (N parameters) for Y available (<source>)", the table, and
// `ways_out` (what to change).
void require_memory_fits(const MemoryEstimate& estimate, const AvailableMemory& available,
                         std::string_view what, std::string_view ways_out);

}  // namespace common
