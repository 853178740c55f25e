// ParameterStore (parameter_store.hpp): the flat parameter and gradient buffers, the working
// copy of mixed precision, the units of the layout and ZeRO-3's gather and gradient reduction.
#include "backend/model/parameter_store.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "backend/common/error.hpp"
#include "backend/ops/convert.hpp"
#include "backend/ops/residual.hpp"

namespace backend {

template <typename Scalar>
ParameterStore<Scalar>::ParameterStore(const ParameterLayout& layout, Device& device,
                                       ElementType working_type, bool with_gradients,
                                       Communicator* sharded_group)
    : layout_(&layout),
      device_(&device),
      working_type_(working_type),
      held_{0, layout.numel()} {
  build_units();
  if (sharded_group != nullptr) shard_over(*sharded_group);
  // Parameters and gradients: one arena of two regions of the same layout (this rank's range
  // of it when sharded), and under mixed precision a third, the working copy the ops read
  // (ZeRO-3's ops read its gathered units, converted in the gather, instead).
  const bool working_copy = working_type != kElementType && !sharded();
  ArenaLayout regions;
  const int64_t count = held_.numel;
  const int64_t parameter_region = regions.add("parameters", kElementType, count);
  const int64_t gradient_region =
      regions.add("gradients", kElementType, with_gradients ? count : 0);
  const int64_t weight_region =
      regions.add(fmt::format("{} working weights", element_name(working_type)), working_type,
                  working_copy ? count : 0);
  arena_ = Arena(device, std::move(regions), "parameters");
  parameters_ = arena_.view(parameter_region);
  gradients_ = arena_.view(gradient_region);
  weights_ = working_copy ? arena_.view(weight_region) : parameters_;
}

// The units of the layout: the embedding, each layer, the head (final norm and an untied output
// layer), each a contiguous run of tensors.
template <typename Scalar>
void ParameterStore<Scalar>::build_units() {
  std::string current;
  for (const ParameterTensor& tensor : layout_->tensors()) {
    std::string key = "head";
    ParameterUnitKind kind = ParameterUnitKind::head;
    if (tensor.name.starts_with("embedding.")) {
      key = "embedding";
      kind = ParameterUnitKind::embedding;
    } else if (tensor.name.starts_with("decoder.layers.")) {
      key = tensor.name.substr(0, tensor.name.find('.', std::string("decoder.layers.").size()));
      kind = ParameterUnitKind::layer;
    }
    if (units_.empty() || key != current) {
      units_.push_back({tensor.offset, tensor.offset, kind});
      current = key;
    }
    units_.back().end = tensor.offset + tensor.numel;
  }
  const PipelineStage& stage = layout_->stage();
  embedding_unit_ = stage.first() ? unit_of(layout_->word_embeddings()) : -1;
  head_unit_ = stage.last() ? unit_of(layout_->final_norm_weight()) : -1;
  layer_units_.assign(static_cast<size_t>(layout_->num_layers()), -1);
  for (const LayerRange& chunk : layout_->chunks()) {
    for (int64_t l = chunk.begin; l < chunk.end; ++l) {
      layer_units_[static_cast<size_t>(l)] = unit_of(layout_->layer(l).input_norm_weight);
    }
  }
}

// ZeRO-3's partition: this rank's contiguous range of the flat layout, and a working slot per
// kind of unit, as wide as the widest unit of that kind.
template <typename Scalar>
void ParameterStore<Scalar>::shard_over(Communicator& group) {
  sharded_group_ = &group;
  held_ = shard_range(layout_->numel(), group.size(), group.rank());
  std::array<int64_t, 3> widest{};
  for (const ParameterUnit& unit : units_) {
    int64_t& width = widest[static_cast<size_t>(unit.kind)];
    width = std::max(width, unit.end - unit.begin);
  }
  ArenaLayout slots;
  std::array<std::array<int64_t, 2>, 3> regions{};
  for (size_t kind = 0; kind < 3; ++kind) {
    regions[kind][0] = slots.add("gathered parameters", working_type_, widest[kind]);
    regions[kind][1] = slots.add("gathered gradients", kElementType, widest[kind]);
  }
  working_arena_ = Arena(*device_, std::move(slots), "ZeRO-3 working set");
  for (size_t kind = 0; kind < 3; ++kind) {
    working_[kind].parameters = working_arena_.view(regions[kind][0]);
    working_[kind].gradients = working_arena_.view(regions[kind][1]);
  }
}

template <typename Scalar>
View ParameterStore<Scalar>::parameter(int64_t offset) const {
  return sharded() ? working_view(offset, false) : tensor_view(weights_, offset);
}

template <typename Scalar>
View ParameterStore<Scalar>::gradient(int64_t offset) const {
  return sharded() ? working_view(offset, true) : tensor_view(gradients_, offset);
}

template <typename Scalar>
int64_t ParameterStore<Scalar>::unit_of(int64_t offset) const {
  const auto found =
      std::upper_bound(units_.begin(), units_.end(), offset,
                       [](int64_t value, const ParameterUnit& unit) { return value < unit.begin; });
  return std::distance(units_.begin(), found) - 1;
}

// The element count of the tensor at `offset` (they increase in table order).
template <typename Scalar>
int64_t ParameterStore<Scalar>::numel_at(int64_t offset) const {
  const auto& tensors = layout_->tensors();
  const auto found = std::lower_bound(
      tensors.begin(), tensors.end(), offset,
      [](const ParameterTensor& tensor, int64_t value) { return tensor.offset < value; });
  if (found == tensors.end() || found->offset != offset) {
    common::fail("no parameter tensor starts at offset {}", offset);
  }
  return found->numel;
}

template <typename Scalar>
View ParameterStore<Scalar>::tensor_view(View buffer, int64_t offset) const {
  if (offset == kAbsentTensor) return View{nullptr, 0, kElementType, buffer.on};
  return buffer.slice(offset, numel_at(offset));
}

// A tensor of a gathered unit (or its gradient, of a unit whose backward is running).
template <typename Scalar>
View ParameterStore<Scalar>::working_view(int64_t offset, bool gradient_of) const {
  if (offset == kAbsentTensor) return absent();
  const int64_t u = unit_of(offset);
  const ParameterUnit& unit = units_[static_cast<size_t>(u)];
  const WorkingSlot& slot = working_[static_cast<size_t>(unit.kind)];
  if ((gradient_of ? slot.gradient_unit : slot.parameter_unit) != u) {
    common::fail("GptModel: a {} of sharded unit {} was used before it was gathered",
                 gradient_of ? "gradient" : "parameter", u);
  }
  return (gradient_of ? slot.gradients : slot.parameters)
      .slice(offset - unit.begin, numel_at(offset));
}

namespace {

// This rank's part of a unit: [begin, end) of the flat layout, possibly empty.
std::pair<int64_t, int64_t> held_part(const ParameterUnit& unit, ShardRange held) {
  return {std::max(unit.begin, held.offset), std::min(unit.end, held.offset + held.numel)};
}

}  // namespace

// DeepSpeed's all-gather of a partitioned unit: each rank's part into zeros, summed over the
// group (every element held by one rank: the sum is that rank's value, exactly, in any type).
// Under mixed precision each rank converts its part to the working type first, so the gather
// moves 16-bit values (as PyTorch FSDP's mixed-precision param_dtype does) and the ops read
// exactly what an unsharded model's working copy would hold.
template <typename Scalar>
void ParameterStore<Scalar>::gather(int64_t u) {
  if (owed_gathers_) finish_arrivals();
  if (u < 0) return;
  if (!sharded()) {
    await_unit(u);
    return;
  }
  const ParameterUnit& unit = units_[static_cast<size_t>(u)];
  WorkingSlot& slot = slot_of(unit);
  if (slot.parameter_unit == u) return;
  const View whole = slot.parameters.slice(0, unit.end - unit.begin);
  device_->fill_zero(whole);
  const auto [begin, end] = held_part(unit, held_);
  if (begin < end) {
    const View part = whole.slice(begin - unit.begin, end - begin);
    const View own = parameters_.slice(begin - held_.offset, end - begin);
    if (working_type_ == kElementType) {
      device_->copy(part, own);
    } else {
      ops::convert(*device_, part, own);
    }
  }
  sharded_group_->all_reduce(whole, ReduceOperation::sum);
  slot.parameter_unit = u;
}

template <typename Scalar>
void ParameterStore<Scalar>::begin_gradients(int64_t u) {
  if (!sharded() || u < 0) return;
  const ParameterUnit& unit = units_[static_cast<size_t>(u)];
  WorkingSlot& slot = slot_of(unit);
  device_->fill_zero(slot.gradients.slice(0, unit.end - unit.begin));
  slot.gradient_unit = u;
}

// The unit's gradients summed over the group, this rank's part added to its held gradients.
template <typename Scalar>
void ParameterStore<Scalar>::flush_gradients(int64_t u) {
  if (!sharded() || u < 0) return;
  const ParameterUnit& unit = units_[static_cast<size_t>(u)];
  WorkingSlot& slot = slot_of(unit);
  const View whole = slot.gradients.slice(0, unit.end - unit.begin);
  sharded_group_->all_reduce(whole, ReduceOperation::sum);
  const auto [begin, end] = held_part(unit, held_);
  if (begin < end) {
    const View mine = gradients_.slice(begin - held_.offset, end - begin);
    ops::residual_forward(*device_, mine, mine, whole.slice(begin - unit.begin, end - begin));
  }
  slot.gradient_unit = -1;
}

template <typename Scalar>
void ParameterStore<Scalar>::gradients_done(int64_t u) const {
  if (!gradients_ready_ || u < 0) return;
  const ParameterUnit& unit = units_[static_cast<size_t>(u)];
  gradients_ready_({unit.begin, unit.end - unit.begin});
}

template <typename Scalar>
void ParameterStore<Scalar>::refresh_weights() {
  if (owed_gathers_) finish_arrivals();
  if (working_type_ == kElementType || sharded() || !weights_stale_) return;
  ops::convert(*device_, weights_, parameters_);
  weights_stale_ = false;
}

template <typename Scalar>
void ParameterStore<Scalar>::parameters_changed() {
  finish_arrivals();
  for (WorkingSlot& slot : working_) slot.parameter_unit = -1;
  weights_stale_ = true;
}

template <typename Scalar>
std::vector<BufferRange> ParameterStore<Scalar>::unit_ranges() const {
  std::vector<BufferRange> ranges;
  ranges.reserve(units_.size());
  for (const ParameterUnit& unit : units_) ranges.push_back({unit.begin, unit.end - unit.begin});
  return ranges;
}

// Each unit is matched to the range that holds it; with a working copy whose parameters were
// written, the units in place are converted now and the others as they arrive (await_unit), so
// the whole-copy refresh has nothing left to do.
template <typename Scalar>
void ParameterStore<Scalar>::parameters_arriving(std::vector<ArrivingParameters> arrivals) {
  if (sharded()) {
    common::fail("ParameterStore: a ZeRO-3 store gathers its own units; no parameters arrive");
  }
  // Matched before anything changes: refused arrivals are finished by their destructors.
  std::vector<int64_t> assignment(units_.size(), -1);
  int64_t arriving = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    const ParameterUnit& unit = units_[u];
    for (size_t a = 0; a < arrivals.size(); ++a) {
      const BufferRange& range = arrivals[a].range;
      const int64_t range_end = range.offset + range.numel;
      if (unit.end <= range.offset || unit.begin >= range_end) continue;
      if (unit.begin < range.offset || unit.end > range_end) {
        common::fail("ParameterStore: unit [{}, {}) crosses the edge of arriving range [{}, {})",
                     unit.begin, unit.end, range.offset, range_end);
      }
      assignment[u] = static_cast<int64_t>(a);
      ++arriving;
      break;
    }
  }
  finish_arrivals();
  if (weights_stale_) {
    for (size_t u = 0; u < units_.size(); ++u) {
      if (assignment[u] < 0) refresh_unit_weights(units_[u]);
    }
  }
  weights_stale_ = false;
  arrivals_ = std::move(arrivals);
  unit_arrival_ = std::move(assignment);
  units_arriving_ = arriving;
  if (units_arriving_ == 0) finish_arrivals();
}

template <typename Scalar>
void ParameterStore<Scalar>::await_unit(int64_t u) {
  if (units_arriving_ == 0) return;
  int64_t& arrival = unit_arrival_[static_cast<size_t>(u)];
  if (arrival < 0) return;
  arrivals_[static_cast<size_t>(arrival)].pending->wait();
  arrival = -1;
  refresh_unit_weights(units_[static_cast<size_t>(u)]);
  if (--units_arriving_ == 0) {
    arrivals_.clear();
    unit_arrival_.clear();
  }
}

// A unit's part of the working copy made from its parameters (nothing without a working copy).
template <typename Scalar>
void ParameterStore<Scalar>::refresh_unit_weights(const ParameterUnit& unit) {
  if (working_type_ == kElementType) return;
  const int64_t numel = unit.end - unit.begin;
  ops::convert(*device_, weights_.slice(unit.begin, numel), parameters_.slice(unit.begin, numel));
}

template <typename Scalar>
void ParameterStore<Scalar>::finish_arrivals() {
  if (owed_gathers_) {
    const ParameterGathers gathers = std::exchange(owed_gathers_, nullptr);
    parameters_arriving(gathers(*std::exchange(owed_group_, nullptr), parameters_));
  }
  for (size_t u = 0; u < unit_arrival_.size() && units_arriving_ > 0; ++u) {
    await_unit(static_cast<int64_t>(u));
  }
  // Ranges that held no unit still finish before the buffers are touched.
  for (ArrivingParameters& arrival : arrivals_) arrival.pending->wait();
  arrivals_.clear();
  unit_arrival_.clear();
  units_arriving_ = 0;
}

template <typename Scalar>
void ParameterStore<Scalar>::parameters_owed(Communicator& group, ParameterGathers gathers) {
  if (sharded()) {
    common::fail("ParameterStore: a ZeRO-3 store gathers its own units; no parameters are owed");
  }
  finish_arrivals();
  owed_group_ = &group;
  owed_gathers_ = std::move(gathers);
}

template <typename Scalar>
void ParameterStore<Scalar>::start_gathers(Communicator& group, const ParameterGathers& gathers) {
  // What was owed is what these bring.
  owed_gathers_ = nullptr;
  owed_group_ = nullptr;
  parameters_arriving(gathers(group, parameters_));
}

template <typename Scalar>
void ParameterStore<Scalar>::parameters_arrived() {
  if (units_arriving_ > 0 || !arrivals_.empty()) {
    common::fail("ParameterStore::parameters_arrived: {} units are still arriving",
                 units_arriving_);
  }
  owed_gathers_ = nullptr;
  owed_group_ = nullptr;
  weights_stale_ = false;
}

template <typename Scalar>
void ParameterStore<Scalar>::abandon_arrivals() {
  arrivals_.clear();
  unit_arrival_.clear();
  units_arriving_ = 0;
  weights_stale_ = true;
}

template <typename Scalar>
void ParameterStore<Scalar>::init_parameters(uint64_t seed) {
  if (sharded()) {
    // The whole model's values, this rank's range kept.
    std::vector<Scalar> staged(static_cast<size_t>(layout_->numel()));
    layout_->init_parameters(staged.data(), seed);
    device_->copy_from_host(parameters_, staged.data() + held_.offset);
  } else if (parameters_.on == MemoryKind::host) {
    // In place: the threads that draw the values first-touch the pages.
    layout_->init_parameters(parameters_.template as<Scalar>(), seed);
  } else {
    std::vector<Scalar> staged(static_cast<size_t>(parameters_.numel));
    layout_->init_parameters(staged.data(), seed);
    device_->copy_from_host(parameters_, staged.data());
  }
  parameters_changed();
}

template class ParameterStore<float>;
template class ParameterStore<double>;

}  // namespace backend
