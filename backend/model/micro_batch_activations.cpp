// MicroBatchActivations (micro_batch_activations.hpp): the micro batches' kept buffers and the
// shared scratch, carved from activation_plan.hpp's plan, the checks of a micro batch's ids, and
// the copies of results to the host.
#include "backend/model/micro_batch_activations.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "backend/common/error.hpp"
#include "backend/model/dropout_sites.hpp"
#include "backend/ops/cross_entropy.hpp"
#include "backend/ops/embedding.hpp"

namespace backend {
namespace {

constexpr int64_t kUploadSlots = 12;

// The callers check the ids' shape first (check_token_ids, check_labels): a mismatch here is
// this backend's own error.
void check_upload_size(View destination, int64_t count, const char* what) {
  if (count != destination.numel) {
    common::fail("a micro batch's {}: {} values for a buffer of {}", what, count,
                 destination.numel);
  }
}

LayerActivations layer_views(const Arena& arena, const LayerActivationRegions& r) {
  return {arena.view(r.input_norm), arena.view(r.input_norm_mean), arena.view(r.input_norm_rstd),
          arena.view(r.qkv),        arena.view(r.attention_logsumexp), arena.view(r.context),
          arena.view(r.attention_residual), arena.view(r.mlp_norm), arena.view(r.mlp_norm_mean),
          arena.view(r.mlp_norm_rstd), arena.view(r.fc1), arena.view(r.activation),
          arena.view(r.output)};
}

}  // namespace

MicroBatchActivations::MicroBatchActivations(const GptConfig& shard,
                                             const RecomputeSchedule& schedule,
                                             const PipelineStage& stage, int64_t num_chunks,
                                             ElementType type, int64_t tensor_parallel_size,
                                             bool sequence_parallel, Device& device)
    : shard_(&shard),
      schedule_(&schedule),
      stage_(&stage),
      num_chunks_(num_chunks),
      type_(type),
      tensor_parallel_size_(tensor_parallel_size),
      sequence_parallel_(sequence_parallel),
      device_(&device) {}

bool MicroBatchActivations::reserve(int64_t batch_size, int64_t seq_length, int64_t slots) {
  if (batch_size == batch_size_ && seq_length == seq_length_ && slots == std::ssize(slots_)) {
    return false;
  }
  if (slots < 1) common::fail("GptModel::reserve: {} micro-batch slots; at least 1", slots);
  if (sequence_parallel_ && seq_length % tensor_parallel_size_ != 0) {
    common::fail("--seq-length {} must be divisible by --tensor-model-parallel-size {} with "
                 "--sequence-parallel (each rank holds an equal share of the sequence)",
                 seq_length, tensor_parallel_size_);
  }
  // The per-micro-batch and the shared part carve the same regions (each with the other's
  // left empty), so one plan's indices serve both arenas.
  ActivationPlan kept = plan_activations(*shard_, *schedule_, batch_size, seq_length, type_,
                                         tensor_parallel_size_, sequence_parallel_, *stage_,
                                         ActivationPart::per_micro_batch);
  const ActivationPlan shared =
      plan_activations(*shard_, *schedule_, batch_size, seq_length, type_, tensor_parallel_size_,
                       sequence_parallel_, *stage_, ActivationPart::shared);
  // The old arenas go first: a smaller shape gives its memory back, a larger one does not
  // need both at once. The device may still be reading them, and the upload slots, for the
  // work queued so far (a batch-size ramp-up reserves between queued steps): it finishes first.
  if (!slots_.empty()) device_->synchronize();
  batch_size_ = seq_length_ = 0;
  slots_.clear();
  staged_.clear();
  ++generation_;
  shared_ = SharedActivations();
  shared_.arena = Arena(*device_, shared.layout, "activations shared by the micro batches");
  for (int64_t k = 0; k < slots; ++k) {
    MicroBatchBuffers buffers;
    buffers.arena = Arena(*device_, kept.layout,
                          slots == 1 ? std::string("activations")
                                     : "activations of micro-batch slot " + std::to_string(k));
    const Arena& a = buffers.arena;
    for (const auto& regions : kept.layers) buffers.layers.push_back(layer_views(a, regions));
    buffers.tokens = a.view(kept.tokens);
    buffers.token_index = a.view(kept.token_index);
    buffers.labels = a.view(kept.labels);
    buffers.embedded = a.view(kept.embedded);
    buffers.final_norm = a.view(kept.final_norm);
    buffers.final_norm_mean = a.view(kept.final_norm_mean);
    buffers.final_norm_rstd = a.view(kept.final_norm_rstd);
    buffers.logits = a.view(kept.logits);
    buffers.losses = a.view(kept.losses);
    buffers.logsumexp = a.view(kept.logsumexp);
    for (const int64_t region : kept.chunk_inputs) buffers.chunk_inputs.push_back(a.view(region));
    for (const int64_t region : kept.output_gradients) {
      buffers.output_gradients.push_back(a.view(region));
    }
    buffers.forward_done.assign(static_cast<size_t>(num_chunks_), false);
    slots_.push_back(std::move(buffers));
  }
  host_token_index_.assign(static_cast<size_t>(slots_.front().token_index.numel), 0);
  {
    // Three uploads a micro batch (tokens, their index, labels; a staged one's dropout keys
    // too): slots for four micro batches before the host waits for the device to take one.
    const MicroBatchBuffers& first = slots_.front();
    const int64_t key_table_bytes =
        dropout_key_table_size(shard_->num_layers) * element_size(ElementType::u64);
    const int64_t slot_bytes =
        std::max({first.tokens.bytes(), first.token_index.bytes(), first.labels.bytes(),
                  key_table_bytes, 2 * element_size(ElementType::f64)});
    uploads_ = PinnedUploadRing(*device_, kUploadSlots, slot_bytes,
                                "the page-locked slots of the micro batches' uploads");
  }
  plan_ = std::move(kept);
  batch_size_ = batch_size;
  seq_length_ = seq_length;
  const Arena& a = shared_.arena;
  for (const auto& regions : plan_.recompute_slots) {
    shared_.recompute_slots.push_back(layer_views(a, regions));
  }
  shared_.recomputed_logsumexp = a.view(plan_.recomputed_logsumexp);
  shared_.loss_total = a.view(plan_.loss_total);
  shared_.logsumexp_parts = a.view(plan_.logsumexp_parts);
  shared_.target_logit = a.view(plan_.target_logit);
  shared_.branch_shard = a.view(plan_.branch_shard);
  shared_.dnorm_shard = a.view(plan_.dnorm_shard);
  shared_.branch = a.view(plan_.branch);
  shared_.rope_cos = a.view(plan_.rope_cos);
  shared_.rope_sin = a.view(plan_.rope_sin);
  shared_.dlogits = a.view(plan_.dlogits);
  shared_.dresidual = a.view(plan_.dresidual);
  shared_.dbranch = a.view(plan_.dbranch);
  shared_.dnorm = a.view(plan_.dnorm);
  shared_.dqkv = a.view(plan_.dqkv);
  shared_.dhidden = a.view(plan_.dhidden);
  shared_.dfc1 = a.view(plan_.dfc1);
  return true;
}

void MicroBatchActivations::upload_ids(View tokens, View token_index,
                                       std::span<const int32_t> ids) {
  check_upload_size(tokens, std::ssize(ids), "tokens");
  uploads_.upload(tokens, ids.data());
  if (token_index.empty()) return;
  index_tokens(ids.data(), std::ssize(ids), host_token_index_.data());
  uploads_.upload(token_index, host_token_index_.data());
}

void MicroBatchActivations::upload_tokens(MicroBatchBuffers& buffers,
                                          std::span<const int32_t> tokens) {
  buffers.forget_staged_values();
  upload_ids(buffers.tokens, buffers.token_index, tokens);
}

void MicroBatchActivations::upload_labels(MicroBatchBuffers& buffers,
                                          std::span<const int32_t> labels) {
  check_upload_size(buffers.labels, std::ssize(labels), "labels");
  buffers.forget_staged_values();
  uploads_.upload(buffers.labels, labels.data());
}

void MicroBatchActivations::stage(int64_t index, std::span<const int32_t> tokens,
                                  std::span<const int32_t> labels, const StagedForward& staged,
                                  std::span<const uint64_t> dropout_keys) {
  if (!reserved()) common::fail("MicroBatchActivations::stage: no shape is reserved");
  if (index < 0 || index > staged_count()) {
    common::fail("MicroBatchActivations::stage: micro batch {} staged after {}", index,
                 staged_count());
  }
  const int64_t key_count = dropout_key_table_size(shard_->num_layers);
  if (std::ssize(dropout_keys) != key_count) {
    common::fail("MicroBatchActivations::stage: {} dropout keys for {} layers; the table has {}",
                 dropout_keys.size(), shard_->num_layers, key_count);
  }
  if (index == staged_count()) {
    const MicroBatchBuffers& shape = slots_.front();
    ArenaLayout layout;
    const int64_t tokens_region = layout.add("staged tokens", ElementType::i32, shape.tokens.numel);
    const int64_t index_region =
        layout.add("staged token index", ElementType::i32, shape.token_index.numel);
    const int64_t labels_region = layout.add("staged labels", ElementType::i32, shape.labels.numel);
    const int64_t keys_region = layout.add("staged dropout keys", ElementType::u64, key_count);
    const int64_t scalars_region = layout.add("staged scalars", ElementType::f64, 2);
    StagedSet set;
    set.arena = Arena(*device_, std::move(layout),
                      "the staged inputs of micro batch " + std::to_string(index));
    set.tokens = set.arena.view(tokens_region);
    set.token_index = set.arena.view(index_region);
    set.labels = set.arena.view(labels_region);
    set.dropout_keys = set.arena.view(keys_region);
    set.scalars = set.arena.view(scalars_region);
    staged_.push_back(std::move(set));
  }
  StagedSet& set = staged_[static_cast<size_t>(index)];
  upload_ids(set.tokens, set.token_index, tokens);
  check_upload_size(set.labels, std::ssize(labels), "labels");
  uploads_.upload(set.labels, labels.data());
  uploads_.upload(set.dropout_keys, dropout_keys.data());
  const double scalars[2] = {static_cast<double>(staged.scored_positions), staged.classifier_scale};
  uploads_.upload(set.scalars, scalars);
  set.forward = staged;
}

void MicroBatchActivations::take_staged(MicroBatchBuffers& buffers, int64_t index,
                                        const ForwardDropout& forward,
                                        std::optional<double> backward_scale) {
  if (index < 0 || index >= staged_count()) {
    common::fail("MicroBatchActivations::take_staged: micro batch {} was not staged ({} are)",
                 index, staged_count());
  }
  const StagedSet& set = staged_[static_cast<size_t>(index)];
  const auto mode = [](const ForwardDropout& dropout) {
    return fmt::format("{}, seed {}", dropout.training ? "training" : "evaluation", dropout.seed);
  };
  if (set.forward.dropout != forward) {
    common::fail(
        "MicroBatchActivations::take_staged: micro batch {} was staged for the forward at "
        "dropout step {} ({}), not for this one at step {} ({})",
        index, set.forward.dropout.step, mode(set.forward.dropout), forward.step, mode(forward));
  }
  if (set.forward.backward_scale != backward_scale) {
    const auto text = [](std::optional<double> scale) {
      return scale ? fmt::format("a backward of scale {}", *scale) : std::string("no backward");
    };
    common::fail(
        "MicroBatchActivations::take_staged: micro batch {} was staged for {}, this "
        "forward is given {}",
        index, text(set.forward.backward_scale), text(backward_scale));
  }
  for (const auto& [to, from] :
       {std::pair{buffers.tokens, set.tokens}, std::pair{buffers.token_index, set.token_index},
        std::pair{buffers.labels, set.labels}}) {
    if (!to.empty()) device_->copy(to, from);
  }
  buffers.scored_positions = set.forward.scored_positions;
  buffers.dropout_keys = set.dropout_keys;
  buffers.stored_scored_positions = set.scalars.slice(0, 1);
  buffers.stored_classifier_scale = set.scalars.slice(1, 1);
}

bool MicroBatchActivations::holds_staged(const MicroBatchBuffers& buffers, int64_t index) const {
  return index >= 0 && index < staged_count() && !buffers.dropout_keys.empty() &&
         buffers.dropout_keys.data == staged_[static_cast<size_t>(index)].dropout_keys.data;
}

namespace {

template <typename Narrow, typename Scalar>
void widen_to_host(Device& device, Scalar* host, View source) {
  std::vector<Narrow> narrow(static_cast<size_t>(source.numel));
  device.copy_to_host(narrow.data(), source);
  std::transform(narrow.begin(), narrow.end(), host,
                 [](Narrow value) { return static_cast<Scalar>(to_float(value)); });
}

}  // namespace

template <typename Scalar>
void copy_activations_to_host(Device& device, Scalar* host, View source) {
  switch (source.type) {
    case ElementType::bf16: widen_to_host<bfloat16>(device, host, source); return;
    case ElementType::f16: widen_to_host<float16>(device, host, source); return;
    default: device.copy_to_host(host, source); return;
  }
}

template <typename Scalar>
std::vector<int32_t> row_argmax(Device& device, View values, int64_t rows, int64_t width) {
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 22) / width);
  std::vector<Scalar> host(static_cast<size_t>(std::min(block, rows) * width));
  std::vector<int32_t> argmax(static_cast<size_t>(rows));
  for (int64_t first = 0; first < rows; first += block) {
    const int64_t count = std::min(block, rows - first);
    copy_activations_to_host(device, host.data(), values.slice(first * width, count * width));
    for (int64_t r = 0; r < count; ++r) {
      const Scalar* row = host.data() + r * width;
      // std::max_element returns the first of equal maxima.
      argmax[static_cast<size_t>(first + r)] =
          static_cast<int32_t>(std::max_element(row, row + width) - row);
    }
  }
  return argmax;
}

template void copy_activations_to_host<float>(Device&, float*, View);
template void copy_activations_to_host<double>(Device&, double*, View);
template std::vector<int32_t> row_argmax<float>(Device&, View, int64_t, int64_t);
template std::vector<int32_t> row_argmax<double>(Device&, View, int64_t, int64_t);

void check_micro_batch_shape(const GptConfig& config, int64_t batch_size, int64_t seq_length) {
  if (batch_size < 1) common::fail("batch size must be at least 1, got {}", batch_size);
  if (seq_length < 1 || seq_length > config.max_position_embeddings) {
    common::fail("sequence length {} is outside [1, {}] (--max-position-embeddings)", seq_length,
                 config.max_position_embeddings);
  }
}

namespace {

// B·T ids, each in the vocabulary; labels may also be kIgnoredLabel. Returns how many ids are
// not.
int64_t check_ids(const GptConfig& config, std::span<const int32_t> ids, const char* what,
                  int64_t batch_size, int64_t seq_length, bool ignored_allowed) {
  const int64_t rows = batch_size * seq_length;
  if (static_cast<int64_t>(ids.size()) != rows) {
    common::fail("{} has {} entries, expected batch size {} × sequence length {} = {}", what,
                 ids.size(), batch_size, seq_length, rows);
  }
  int64_t scored = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t id = ids[static_cast<size_t>(i)];
    if (ignored_allowed && id == kIgnoredLabel) continue;
    if (id < 0 || id >= config.vocab_size) {
      common::fail("{} value {} at index {} (batch row {}, position {}) is outside the "
                   "vocabulary [0, {}){}",
                   what, id, i, i / seq_length, i % seq_length, config.vocab_size,
                   ignored_allowed ? fmt::format(" and is not {} (ignored)", kIgnoredLabel) : "");
    }
    ++scored;
  }
  return scored;
}

}  // namespace

void check_token_ids(const GptConfig& config, std::span<const int32_t> tokens,
                     int64_t batch_size, int64_t seq_length) {
  check_ids(config, tokens, "tokens", batch_size, seq_length, false);
}

int64_t check_labels(const GptConfig& config, std::span<const int32_t> labels,
                     int64_t batch_size, int64_t seq_length) {
  return check_ids(config, labels, "labels", batch_size, seq_length, true);
}

}  // namespace backend
