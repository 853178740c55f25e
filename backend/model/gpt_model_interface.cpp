// GptModel's public members (gpt_model.hpp) over what the model holds (gpt_model_state.hpp):
// construction, the checks of what a caller passes before the layer order (gpt_model.cpp) runs,
// the parameter store's buffers and host copies, the pipeline schedule's chunk API, the
// gradients' finalisation over the model-parallel groups, and the readouts that evaluation and
// generation take from the last forward.
#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/model/gpt_model_state.hpp"

namespace backend {

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config)
    : state_((validate(config), std::make_unique<State>(config, nullptr, ModelParallelism()))) {}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config, Device& device)
    : state_((validate(config), std::make_unique<State>(config, &device, ModelParallelism()))) {}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config, Device& device, Communicator& tensor_parallel,
                           bool sequence_parallel)
    : state_((validate(config),
              std::make_unique<State>(config, &device,
                                      tensor_parallelism(tensor_parallel, sequence_parallel)))) {}

template <typename Scalar>
GptModel<Scalar>::GptModel(const GptConfig& config, Device& device,
                           const ModelParallelism& parallelism)
    : state_((validate(config), std::make_unique<State>(config, &device, parallelism))) {}

template <typename Scalar>
GptModel<Scalar>::~GptModel() = default;
template <typename Scalar>
GptModel<Scalar>::GptModel(GptModel&&) noexcept = default;
template <typename Scalar>
GptModel<Scalar>& GptModel<Scalar>::operator=(GptModel&&) noexcept = default;

template <typename Scalar>
const GptConfig& GptModel<Scalar>::config() const {
  return state_->config;
}

template <typename Scalar>
const std::vector<ParameterTensor>& GptModel<Scalar>::tensors() const {
  return state_->layout.tensors();
}

template <typename Scalar>
const ParameterTensor& GptModel<Scalar>::tensor(const std::string& name) const {
  return state_->layout.tensor(name);
}

namespace {

// A host span over a buffer of the model, refused for device memory the host cannot touch.
template <typename Scalar>
std::span<Scalar> host_span(View buffer, const Device& device, const char* what) {
  if (buffer.on != MemoryKind::host) {
    common::fail(
        "GptModel::{}(): the model's buffers live on {}, not in host memory; copy them "
        "with copy_{}_to_host",
        what, device.name(), what);
  }
  return {buffer.template as<Scalar>(), static_cast<size_t>(buffer.numel)};
}

void check_host_size(size_t size, int64_t numel, const char* what) {
  if (static_cast<int64_t>(size) != numel) {
    common::fail("GptModel::{}: the host buffer has {} elements, the model {}", what, size, numel);
  }
}

}  // namespace

template <typename Scalar>
std::span<Scalar> GptModel<Scalar>::parameters() {
  return host_span<Scalar>(state_->store.parameters(), *state_->device, "parameters");
}
template <typename Scalar>
std::span<const Scalar> GptModel<Scalar>::parameters() const {
  return host_span<Scalar>(state_->store.parameters(), *state_->device, "parameters");
}
template <typename Scalar>
std::span<Scalar> GptModel<Scalar>::gradients() {
  return host_span<Scalar>(state_->store.gradients(), *state_->device, "gradients");
}
template <typename Scalar>
std::span<const Scalar> GptModel<Scalar>::gradients() const {
  return host_span<Scalar>(state_->store.gradients(), *state_->device, "gradients");
}

template <typename Scalar>
Communicator& GptModel<Scalar>::tensor_parallel_group() const {
  return state_->tensor_parallel.group();
}

template <typename Scalar>
bool GptModel<Scalar>::sharded_over_data_parallel() const {
  return state_->store.sharded();
}

template <typename Scalar>
const Communicator* GptModel<Scalar>::sharded_data_parallel_group() const {
  return state_->store.sharded_group();
}

template <typename Scalar>
ShardRange GptModel<Scalar>::parameter_shard_range() const {
  return state_->store.held();
}

template <typename Scalar>
void GptModel<Scalar>::set_gradients_ready(std::function<void(BufferRange)> callback) {
  state_->store.set_gradients_ready(std::move(callback));
}

template <typename Scalar>
void GptModel<Scalar>::set_loss_accumulation(LossAccumulation accumulation) {
  const View& total = accumulation.total;
  if (!total.empty() && (total.type != ElementType::f64 || total.numel != 1 ||
                         total.on != state_->device->memory_kind())) {
    common::fail("GptModel::set_loss_accumulation: the total must be one f64 of {}, got {} {}",
                 state_->device->name(), total.numel, element_name(total.type));
  }
  state_->loss_accumulation = accumulation;
}

template <typename Scalar>
std::vector<BufferRange> GptModel<Scalar>::parameter_units() const {
  return state_->store.unit_ranges();
}

template <typename Scalar>
void GptModel<Scalar>::parameters_arriving(std::vector<ArrivingParameters> arrivals) {
  state_->store.parameters_arriving(std::move(arrivals));
}

template <typename Scalar>
void GptModel<Scalar>::parameters_owed(Communicator& group, ParameterGathers gathers) {
  state_->store.parameters_owed(group, std::move(gathers));
}

template <typename Scalar>
void GptModel<Scalar>::start_parameter_gathers(Communicator& group,
                                               const ParameterGathers& gathers) {
  state_->store.start_gathers(group, gathers);
}

template <typename Scalar>
void GptModel<Scalar>::parameters_arrived() {
  state_->store.parameters_arrived();
}

template <typename Scalar>
void GptModel<Scalar>::abandon_parameter_gathers() {
  state_->store.abandon_arrivals();
}

template <typename Scalar>
void GptModel<Scalar>::finish_parameter_gathers() {
  state_->store.finish_arrivals();
}

template <typename Scalar>
void GptModel<Scalar>::parameters_updated(bool working_copy_written) {
  if (working_copy_written) {
    if (state_->store.working_copy().empty()) {
      common::fail(
          "GptModel::parameters_updated: a working copy was said to be written, but "
          "this model has none (fp32, or ZeRO-3)");
    }
    state_->store.parameters_and_working_copy_changed();
  } else {
    state_->store.parameters_changed();
  }
}

template <typename Scalar>
View GptModel<Scalar>::working_copy_buffer() const {
  return state_->store.working_copy();
}

template <typename Scalar>
Communicator& GptModel<Scalar>::pipeline_parallel_group() const {
  return *state_->pipeline_group;
}

template <typename Scalar>
const Communicator* GptModel<Scalar>::embedding_group() const {
  return state_->tied_copies() ? state_->embedding_group : nullptr;
}

template <typename Scalar>
const std::vector<BufferRange>& GptModel<Scalar>::gradient_norm_ranges() const {
  return state_->norm_ranges;
}

template <typename Scalar>
View GptModel<Scalar>::parameter_buffer() const {
  return state_->store.parameters();
}
template <typename Scalar>
View GptModel<Scalar>::gradient_buffer() const {
  return state_->store.gradients();
}
template <typename Scalar>
Device& GptModel<Scalar>::device() const {
  return *state_->device;
}

template <typename Scalar>
void GptModel<Scalar>::copy_parameters_from_host(std::span<const Scalar> host) {
  const View parameters = state_->store.parameters();
  check_host_size(host.size(), parameters.numel, "copy_parameters_from_host");
  state_->device->copy_from_host(parameters, host.data());
  state_->store.parameters_changed();
}
template <typename Scalar>
void GptModel<Scalar>::copy_parameters_to_host(std::span<Scalar> host) const {
  const View parameters = state_->store.parameters();
  check_host_size(host.size(), parameters.numel, "copy_parameters_to_host");
  state_->device->copy_to_host(host.data(), parameters);
}
template <typename Scalar>
void GptModel<Scalar>::copy_gradients_to_host(std::span<Scalar> host) const {
  const View gradients = state_->store.gradients();
  check_host_size(host.size(), gradients.numel, "copy_gradients_to_host");
  state_->device->copy_to_host(host.data(), gradients);
}

template <typename Scalar>
void GptModel<Scalar>::init_parameters(uint64_t seed) {
  state_->store.init_parameters(seed);
}

template <typename Scalar>
void GptModel<Scalar>::reserve(int64_t batch_size, int64_t seq_length, int64_t micro_batch_slots) {
  State& s = *state_;
  check_micro_batch_shape(s.config, batch_size, seq_length);
  s.reserve(batch_size, seq_length, micro_batch_slots);
}

namespace {

// forward()'s preconditions: a whole model, and no finished forward left to differentiate (a
// forward that fails leaves nothing: a backward() after it must not silently reuse the micro
// batch before).
template <typename State>
void start_whole_model_forward(State& s, const char* what) {
  if (!s.stage.whole_model()) {
    common::fail(
        "GptModel::{}() runs the whole model; stage {} of a {}-stage pipeline runs "
        "forward_chunk() in a pipeline schedule",
        what, s.stage.rank, s.stage.pipeline_parallel);
  }
  for (int64_t k = 0; k < s.micro_batches.slots(); ++k) {
    s.micro_batches.slot(k).forward_done.assign(s.chunks.size(), false);
  }
}

// Then the micro batch's shape and ids checked and its shape reserved: its scored positions.
// A pipeline stage may stage its micro batches (`whole_model_only` false): their forwards are
// the schedule's forward_chunk_staged.
template <typename State>
int64_t start_micro_batch(State& s, const char* what, std::span<const int32_t> tokens,
                          std::span<const int32_t> labels, int64_t batch_size, int64_t seq_length,
                          bool whole_model_only = true) {
  if (whole_model_only || s.stage.whole_model()) start_whole_model_forward(s, what);
  check_micro_batch_shape(s.config, batch_size, seq_length);
  check_token_ids(s.config, tokens, batch_size, seq_length);
  const int64_t scored_positions = check_labels(s.config, labels, batch_size, seq_length);
  s.reserve(batch_size, seq_length, std::max<int64_t>(1, s.micro_batches.slots()));
  return scored_positions;
}

}  // namespace

template <typename Scalar>
Scalar GptModel<Scalar>::forward(std::span<const int32_t> tokens, std::span<const int32_t> labels,
                                 int64_t batch_size, int64_t seq_length,
                                 std::optional<Scalar> backward_scale) {
  State& s = *state_;
  const int64_t scored_positions =
      start_micro_batch(s, "forward", tokens, labels, batch_size, seq_length);
  MicroBatchBuffers& buffers = s.micro_batches.slot(0);
  s.micro_batches.upload_tokens(buffers, tokens);
  s.micro_batches.upload_labels(buffers, labels);
  buffers.scored_positions = scored_positions;
  const Scalar loss = s.forward_chunk(0, 0, backward_scale);
  if (s.training) ++s.dropout_step;
  return loss;
}

template <typename Scalar>
int64_t GptModel<Scalar>::stage_micro_batch(int64_t index, std::span<const int32_t> tokens,
                                            std::span<const int32_t> labels, int64_t batch_size,
                                            int64_t seq_length,
                                            std::optional<Scalar> backward_scale,
                                            uint64_t dropout_step_stride) {
  State& s = *state_;
  const int64_t scored_positions =
      start_micro_batch(s, "stage_micro_batch", tokens, labels, batch_size, seq_length, false);
  // The masks of the index-th forward from now: each training forward advances the step (by
  // the stride, where ranks take turns).
  const uint64_t steps_ahead =
      s.training ? static_cast<uint64_t>(index) * dropout_step_stride : uint64_t{0};
  StagedForward staged{.dropout = {.training = s.training,
                                   .seed = s.dropout_seed,
                                   .step = s.dropout_step + steps_ahead},
                       .backward_scale = std::nullopt,
                       .scored_positions = scored_positions,
                       .classifier_scale = 0};
  if (backward_scale) {
    staged.backward_scale = static_cast<double>(*backward_scale);
    staged.classifier_scale =
        static_cast<double>(classifier_gradient_scale(*backward_scale, scored_positions));
  }
  s.micro_batches.stage(index, tokens, labels, staged,
                        dropout_key_table(s.config, staged.dropout, s.tensor_parallel));
  return scored_positions;
}

template <typename Scalar>
int64_t GptModel<Scalar>::activations_generation() const {
  return state_->micro_batches.generation();
}

template <typename Scalar>
Scalar GptModel<Scalar>::forward_staged(int64_t index, std::optional<Scalar> backward_scale) {
  State& s = *state_;
  start_whole_model_forward(s, "forward_staged");
  if (!s.micro_batches.reserved()) {
    common::fail("GptModel::forward_staged({}): no micro batch was staged", index);
  }
  s.micro_batches.take_staged(
      s.micro_batches.slot(0), index,
      {.training = s.training, .seed = s.dropout_seed, .step = s.dropout_step},
      backward_scale ? std::optional<double>(static_cast<double>(*backward_scale)) : std::nullopt);
  const Scalar loss = s.forward_chunk(0, 0, backward_scale);
  if (s.training) ++s.dropout_step;
  return loss;
}

namespace {

// The per-position accessors' precondition: a whole, unsharded model whose last forward()
// finished (a failed forward clears forward_done, so stale buffers are never read).
template <typename State>
void check_last_forward(const State& s, const char* what) {
  if (!s.stage.whole_model() || s.tensor_parallel.active()) {
    common::fail(
        "GptModel::{}: needs the whole model on one rank (this one holds stage {} of {} "
        "and tensor-parallel shard of {})",
        what, s.stage.rank, s.stage.pipeline_parallel, s.tensor_parallel.size());
  }
  if (!s.micro_batches.reserved() || s.micro_batches.slot(0).forward_done.empty() ||
      !s.micro_batches.slot(0).forward_done.front()) {
    common::fail("GptModel::{}: no finished forward() to read", what);
  }
}

// The logits' accessors' precondition besides: a forward given the backward's scale (the fused
// classifier) overwrote them with their gradient.
template <typename State>
void check_logits_intact(const State& s, const char* what) {
  check_last_forward(s, what);
  if (s.micro_batches.slot(0).logits_hold_gradient_of_scale) {
    common::fail(
        "GptModel::{}: the last forward() was given the backward's scale, so its logits were "
        "overwritten by their gradient (the fused classifier); run forward() without it to read "
        "them",
        what);
  }
}

}  // namespace

template <typename Scalar>
std::vector<Scalar> GptModel<Scalar>::last_position_losses() const {
  State& s = *state_;
  check_last_forward(s, "last_position_losses");
  const View losses = s.micro_batches.slot(0).losses.slice(0, s.rows());
  std::vector<Scalar> host(static_cast<size_t>(s.rows()));
  s.device->copy_to_host(host.data(), losses);
  return host;
}

template <typename Scalar>
std::vector<int32_t> GptModel<Scalar>::last_position_argmax() const {
  State& s = *state_;
  check_logits_intact(s, "last_position_argmax");
  return row_argmax<Scalar>(*s.device, s.micro_batches.slot(0).logits, s.rows(),
                            s.shard.padded_vocab_size);
}

template <typename Scalar>
std::vector<Scalar> GptModel<Scalar>::last_position_logits(int64_t row, int64_t position) const {
  State& s = *state_;
  check_logits_intact(s, "last_position_logits");
  if (row < 0 || row >= s.batch_size() || position < 0 || position >= s.seq_length()) {
    common::fail(
        "GptModel::last_position_logits: (row {}, position {}) is outside the last "
        "forward's batch of {} rows of {} positions",
        row, position, s.batch_size(), s.seq_length());
  }
  const int64_t vocabulary = s.shard.padded_vocab_size;
  const View logits = s.micro_batches.slot(0).logits;
  std::vector<Scalar> host(static_cast<size_t>(vocabulary));
  copy_activations_to_host(
      *s.device, host.data(),
      logits.slice((row * s.seq_length() + position) * vocabulary, vocabulary));
  return host;
}

template <typename Scalar>
void GptModel<Scalar>::backward(Scalar grad_scale) {
  State& s = *state_;
  if (!s.micro_batches.reserved() || !s.stage.whole_model()) {
    common::fail(
        "GptModel::backward() called without a completed forward(); run forward() on "
        "the micro batch first");
  }
  s.backward_chunk(0, 0, grad_scale);
}

template <typename Scalar>
Scalar GptModel<Scalar>::forward_chunk(int64_t slot, int64_t chunk, std::span<const int32_t> tokens,
                                       std::span<const int32_t> labels,
                                       std::optional<Scalar> backward_scale) {
  State& s = *state_;
  s.check_slot(slot, chunk, "forward_chunk");
  MicroBatchBuffers& buffers = s.micro_batches.slot(slot);
  buffers.forward_done[static_cast<size_t>(chunk)] = false;
  // A micro batch's first chunk here: the slot's values staged for an earlier step's micro
  // batch are not this one's (a middle stage uploads nothing that would drop them).
  if (chunk == 0) buffers.forget_staged_values();
  if (s.first_virtual_stage(chunk)) {
    check_token_ids(s.config, tokens, s.batch_size(), s.seq_length());
    s.micro_batches.upload_tokens(buffers, tokens);
  }
  if (s.last_virtual_stage(chunk)) {
    buffers.scored_positions = check_labels(s.config, labels, s.batch_size(), s.seq_length());
    s.micro_batches.upload_labels(buffers, labels);
  }
  return s.forward_chunk(slot, chunk, backward_scale);
}

template <typename Scalar>
Scalar GptModel<Scalar>::forward_chunk_staged(int64_t slot, int64_t chunk, int64_t index,
                                              Scalar backward_scale) {
  State& s = *state_;
  s.check_slot(slot, chunk, "forward_chunk_staged");
  MicroBatchBuffers& buffers = s.micro_batches.slot(slot);
  buffers.forward_done[static_cast<size_t>(chunk)] = false;
  // The set's ids and values go into the slot at the micro batch's first chunk here; its later
  // chunks find them there (a slot holds one micro batch until its backward).
  if (chunk == 0) {
    s.micro_batches.take_staged(
        buffers, index, {.training = s.training, .seed = s.dropout_seed, .step = s.dropout_step},
        static_cast<double>(backward_scale));
  } else if (!s.micro_batches.holds_staged(buffers, index)) {
    common::fail(
        "GptModel::forward_chunk_staged(slot {}, chunk {}): the slot does not hold staged micro "
        "batch {}; its chunk 0 forward takes it first",
        slot, chunk, index);
  }
  return s.forward_chunk(
      slot, chunk,
      s.last_virtual_stage(chunk) ? std::optional<Scalar>(backward_scale) : std::nullopt);
}

template <typename Scalar>
void GptModel<Scalar>::backward_chunk(int64_t slot, int64_t chunk, Scalar grad_scale) {
  State& s = *state_;
  s.check_slot(slot, chunk, "backward_chunk");
  s.backward_chunk(slot, chunk, grad_scale);
}

template <typename Scalar>
View GptModel<Scalar>::chunk_input(int64_t slot, int64_t chunk) const {
  const State& s = *state_;
  s.check_slot(slot, chunk, "chunk_input");
  const MicroBatchBuffers& buffers = s.micro_batches.slot(slot);
  return chunk == 0 ? buffers.embedded : buffers.chunk_inputs[static_cast<size_t>(chunk)];
}

template <typename Scalar>
View GptModel<Scalar>::chunk_output(int64_t slot, int64_t chunk) const {
  const State& s = *state_;
  s.check_slot(slot, chunk, "chunk_output");
  const int64_t last = s.chunks[static_cast<size_t>(chunk)].end - 1;
  return s.micro_batches.slot(slot).layers[static_cast<size_t>(last)].output;
}

template <typename Scalar>
View GptModel<Scalar>::chunk_output_gradient(int64_t slot, int64_t chunk) const {
  const State& s = *state_;
  s.check_slot(slot, chunk, "chunk_output_gradient");
  return s.micro_batches.slot(slot).output_gradients[static_cast<size_t>(chunk)];
}

template <typename Scalar>
const PipelineStage& GptModel<Scalar>::pipeline_stage() const {
  return state_->stage;
}

template <typename Scalar>
int64_t GptModel<Scalar>::num_chunks() const {
  return std::ssize(state_->chunks);
}

template <typename Scalar>
int64_t GptModel<Scalar>::micro_batch_slots() const {
  return state_->micro_batches.slots();
}

template <typename Scalar>
void GptModel<Scalar>::finalize_gradients() {
  finalize_gradients(state_->store.gradients(), state_->store.held());
}

template <typename Scalar>
void GptModel<Scalar>::finalize_gradients(View held, ShardRange range) {
  State& s = *state_;
  const bool whole = range.offset == 0 && range.numel == s.layout.numel();
  if (held.numel != range.numel) {
    common::fail("GptModel::finalize_gradients: {} gradients held for a range of {}", held.numel,
                 range.numel);
  }
  if (s.tied_copies()) {
    if (!whole) {
      common::fail(
          "GptModel::finalize_gradients: the tied word embedding's two gradients (first and "
          "last pipeline stage) are summed on the whole buffer, not on a shard of it");
    }
    // The word embedding's two uses, on the first and the last stage, get one gradient.
    const int64_t tied = s.stage.first() ? s.layout.word_embeddings() : s.layout.output_weight();
    s.embedding_group->all_reduce(s.gradient(tied), ReduceOperation::sum);
  }
  if (!s.tensor_parallel.sequence_parallel()) return;
  // The norms ran on this rank's rows: their gradients are partial sums over the group. Each
  // tensor's part inside the range, where it has one.
  auto sum = [&](int64_t offset) {
    if (offset == kAbsentTensor) return;
    const int64_t numel = s.gradient(offset).numel;
    const int64_t begin = std::max(offset, range.offset);
    const int64_t end = std::min(offset + numel, range.offset + range.numel);
    if (begin < end) {
      s.tensor_parallel.group().all_reduce(held.slice(begin - range.offset, end - begin),
                                           ReduceOperation::sum);
    }
  };
  for (int64_t l = 0; l < s.config.num_layers; ++l) {
    if (!holds_layer(s.chunks, l)) continue;
    const LayerParameters& p = s.layout.layer(l);
    for (const int64_t offset :
         {p.input_norm_weight, p.input_norm_bias, p.mlp_norm_weight, p.mlp_norm_bias}) {
      sum(offset);
    }
  }
  sum(s.layout.final_norm_weight());
  sum(s.layout.final_norm_bias());
}

template <typename Scalar>
int64_t GptModel<Scalar>::activation_bytes() const {
  const State& s = *state_;
  return s.micro_batches.kept_bytes() * s.micro_batches.slots();
}

template <typename Scalar>
void GptModel<Scalar>::zero_gradients() {
  state_->device->fill_zero(state_->store.gradients());
}

template <typename Scalar>
void GptModel<Scalar>::set_training(bool training) {
  state_->training = training;
}

template <typename Scalar>
void GptModel<Scalar>::set_dropout_seed(uint64_t seed) {
  state_->dropout_seed = seed;
}

template <typename Scalar>
uint64_t GptModel<Scalar>::dropout_seed() const {
  return state_->dropout_seed;
}

template <typename Scalar>
uint64_t GptModel<Scalar>::dropout_step() const {
  return state_->dropout_step;
}

template <typename Scalar>
void GptModel<Scalar>::set_dropout_step(uint64_t step) {
  state_->dropout_step = step;
}

template class GptModel<float>;
template class GptModel<double>;

}  // namespace backend
