// The activations of one micro-batch shape as views (activation_plan.hpp carves them): what each
// micro batch in flight keeps for its backward (a slot: one arena), and the scratch all of them
// share (a second arena), reserved before the first step so no forward or backward allocates.
// A pipeline schedule keeps up to pp micro batches in flight, hence several slots; one slot
// serves a model without a pipeline. Also the checks a micro batch's ids pass before they are
// uploaded, the upload of the tokens with their index for the embedding backward, and the copies
// of results to the host that evaluation and generation read.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "backend/core/view.hpp"
#include "backend/device/arena.hpp"
#include "backend/device/device.hpp"
#include "backend/device/pinned_upload_ring.hpp"
#include "backend/model/activation_plan.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/model/pipeline_stage.hpp"

namespace backend {

// One layer's buffers (activation_plan.hpp's LayerActivationRegions, as views).
struct LayerActivations {
  View input_norm, input_norm_mean, input_norm_rstd;
  View qkv;
  View attention_logsumexp;
  View context;
  View attention_residual;
  View mlp_norm, mlp_norm_mean, mlp_norm_rstd;
  View fc1;
  View activation;
  View output;
};

// The dropout key a forward used (the backward regenerates its masks from it) and its mode.
struct ForwardDropout {
  bool training = false;
  uint64_t seed = 0;
  uint64_t step = 0;
  bool operator==(const ForwardDropout&) const = default;
};

// One micro batch's kept buffers, whether each model chunk's forward completed, and its
// dropout key.
struct MicroBatchBuffers {
  Arena arena;
  std::vector<LayerActivations> layers;
  View tokens, token_index, labels, embedded, final_norm, final_norm_mean, final_norm_rstd,
      logits, losses, logsumexp;
  std::vector<View> chunk_inputs, output_gradients;
  std::vector<bool> forward_done;
  ForwardDropout dropout;
  // A staged micro batch's values in device memory, which its ops read when they run (set by
  // take_staged; an upload of tokens or labels empties them): the dropout key table
  // (dropout_sites.hpp), its scored positions (one f64) and the fused classifier's scale (one
  // f64). Empty: the keys are computed from `dropout`, the count is scored_positions and the
  // scale the forward's, all passed by value.
  View dropout_keys, stored_scored_positions, stored_classifier_scale;
  void forget_staged_values() {
    dropout_keys = stored_scored_positions = stored_classifier_scale = View{};
  }
  // The labels' positions that are not kIgnoredLabel: the loss is their mean (counted on the
  // host at upload, so no count is read back from the device).
  int64_t scored_positions = 0;
  // Set by a forward given the backward's scale (the fused classifier, GptModel::forward): the
  // logits were overwritten by d(mean loss)/dlogits times that scale, where the head's backward
  // starts. Empty while the logits are intact.
  std::optional<double> logits_hold_gradient_of_scale;
};

// What a micro batch was staged for (MicroBatchActivations::stage): the forward that takes it
// (its dropout) and the scale of the backward that forward was told of (the fused classifier's;
// none: no backward), with the values derived from them and the labels, which the staged set
// holds in device memory.
struct StagedForward {
  ForwardDropout dropout;
  std::optional<double> backward_scale;
  int64_t scored_positions = 0;
  double classifier_scale = 0;  // backward_scale / scored_positions in the model's Scalar; 0
                                // without a scored position or a backward
};

// The buffers every micro batch uses in turn: the recompute slots, the vocab-parallel and
// sequence-parallel buffers, the layers' branch output, the RoPE tables and the backward's
// scratch (activation_plan.hpp names each).
struct SharedActivations {
  Arena arena;
  std::vector<LayerActivations> recompute_slots;
  View recomputed_logsumexp, loss_total, logsumexp_parts, target_logit, branch_shard, dnorm_shard,
      branch, rope_cos, rope_sin;
  View dlogits, dresidual, dbranch, dnorm, dqkv, dhidden, dfc1;
};

class MicroBatchActivations {
 public:
  // `shard`: the rank's part of the configuration; `schedule`, `stage` and `device` must outlive
  // this. `type`: the activations' element type.
  MicroBatchActivations(const GptConfig& shard, const RecomputeSchedule& schedule,
                        const PipelineStage& stage, int64_t num_chunks, ElementType type,
                        int64_t tensor_parallel_size, bool sequence_parallel, Device& device);

  // Carves `slots` micro batches of (batch_size, seq_length) and the shared scratch; returns
  // false, doing nothing, when that is already the reserved shape. The old arenas are freed
  // first: after a failure nothing is reserved.
  bool reserve(int64_t batch_size, int64_t seq_length, int64_t slots);
  bool reserved() const { return !slots_.empty(); }
  int64_t batch_size() const { return batch_size_; }
  int64_t seq_length() const { return seq_length_; }
  int64_t rows() const { return batch_size_ * seq_length_; }
  // Bytes each micro batch keeps (ActivationPlan::kept_bytes), 0 before a reserve.
  int64_t kept_bytes() const { return batch_size_ == 0 ? 0 : plan_.kept_bytes; }

  int64_t slots() const { return std::ssize(slots_); }
  MicroBatchBuffers& slot(int64_t k) { return slots_[static_cast<size_t>(k)]; }
  const MicroBatchBuffers& slot(int64_t k) const { return slots_[static_cast<size_t>(k)]; }
  const SharedActivations& shared() const { return shared_; }

  // The tokens into `buffers`, with their index for the embedding backward when it keeps one
  // (built on the host and copied with them, so the backward never reads the tokens back).
  // Both uploads, as upload_labels', go through page-locked slots (pinned_upload_ring.hpp): they
  // return once the copy is queued, without waiting for the device.
  void upload_tokens(MicroBatchBuffers& buffers, std::span<const int32_t> tokens);
  void upload_labels(MicroBatchBuffers& buffers, std::span<const int32_t> labels);

  // Inputs staged ahead of a captured step (docs/step_on_device.md, item 5): micro batch
  // `index`'s tokens, their index, labels, the dropout key table of `staged.dropout`
  // (dropout_sites.hpp) and its scored count and classifier scale uploaded (as upload_tokens
  // does) into memory of their own, one set per micro batch of the step, made when an index is
  // first staged; take_staged then copies a set's ids into a slot on the device, which a
  // capture can hold where an upload cannot, and points the slot's stored values at the set's.
  // The sets go with the shape (reserve).
  void stage(int64_t index, std::span<const int32_t> tokens, std::span<const int32_t> labels,
             const StagedForward& staged, std::span<const uint64_t> dropout_keys);
  // common::Error when the set was staged for another forward or backward scale than
  // `forward`'s (its masks or its gradient would not be that forward's).
  void take_staged(MicroBatchBuffers& buffers, int64_t index, const ForwardDropout& forward,
                   std::optional<double> backward_scale);
  // Whether `buffers` took set `index` last (take_staged) and kept its values since.
  bool holds_staged(const MicroBatchBuffers& buffers, int64_t index) const;
  int64_t staged_count() const { return std::ssize(staged_); }
  // Counts the reserves that carved new memory: a captured step holds the addresses of one
  // generation's buffers and must not be replayed over another's.
  int64_t generation() const { return generation_; }

 private:
  const GptConfig* shard_;
  const RecomputeSchedule* schedule_;
  const PipelineStage* stage_;
  int64_t num_chunks_;
  ElementType type_;
  int64_t tensor_parallel_size_;
  bool sequence_parallel_;
  Device* device_;
  ActivationPlan plan_;
  std::vector<MicroBatchBuffers> slots_;
  SharedActivations shared_;
  int64_t batch_size_ = 0;
  int64_t seq_length_ = 0;
  std::vector<int32_t> host_token_index_;
  PinnedUploadRing uploads_;
  struct StagedSet {
    Arena arena;
    View tokens, token_index, labels, dropout_keys, scalars;  // scalars: f64 count, scale
    StagedForward forward;
  };
  std::vector<StagedSet> staged_;
  void upload_ids(View tokens, View token_index, std::span<const int32_t> ids);
  int64_t generation_ = 0;
};

// Activations copied to the host as Scalar (float or double): bf16 and fp16 ones
// (GptConfig::mixed_precision) widened, exactly.
template <typename Scalar>
void copy_activations_to_host(Device& device, Scalar* host, View source);
// The index of each row's largest value in a (rows, width) activation, read to the host in
// blocks of rows (at most ~16 MiB), as Scalar: the lowest index among equal maxima, as
// torch.argmax.
template <typename Scalar>
std::vector<int32_t> row_argmax(Device& device, View values, int64_t rows, int64_t width);

// A micro batch's shape as reserve() and forward() accept it.
void check_micro_batch_shape(const GptConfig& config, int64_t batch_size, int64_t seq_length);
// A micro batch's token ids: B·T of them, each in the vocabulary.
void check_token_ids(const GptConfig& config, std::span<const int32_t> tokens,
                     int64_t batch_size, int64_t seq_length);
// Its labels, which may also be kIgnoredLabel; returns how many are not.
int64_t check_labels(const GptConfig& config, std::span<const int32_t> labels,
                     int64_t batch_size, int64_t seq_length);

}  // namespace backend
