// The parameters and gradients of one model rank as the ops use them (Megatron core's
// distributed/param_and_grad_buffer.py; DeepSpeed's stage-3 partition, Rajbhandari et al. 2020):
//   - one flat buffer of the parameters and a second of the gradients, in ParameterLayout's
//     order, so the optimizer, gradient clipping, checkpoints and the data-parallel reduction
//     see one contiguous array each (the gradients are absent for an inference-only model);
//   - under mixed precision (--bf16, --fp16) a third, the working copy of the parameters the ops
//     read, converted from the fp32 parameters before the first forward after any write;
//   - the units of the layout (the embedding, each transformer layer, the head: the final norm
//     and an untied output layer), each a contiguous run of tensors: the buckets whose
//     gradients are announced ready as a unit's backward ends (--overlap-grad-reduce) and, under
//     ZeRO-3, what is gathered whole for use;
//   - ZeRO-3: the rank holds a contiguous range of the flat layout (shard_range, as the
//     distributed optimizer's); a unit is gathered into the working slot of its kind when it is
//     used (in the working type: under mixed precision the gather converts and moves bf16 or
//     fp16, and there is no whole working copy) and its gradients (fp32) are summed over the
//     group into the held range when its backward is done;
//   - --overlap-param-gather (Megatron core's DistributedDataParallel with overlap_param_gather):
//     the distributed optimizer's updated shards come back in started all-gathers, one per
//     bucket of units; a unit's first use in the next forward (gather(), the same hook ZeRO-3
//     uses) waits for the bucket that holds it and, under mixed precision, converts that unit's
//     part of the working copy then, so the first layer does not wait for the last bucket. Any
//     other access to the parameter buffer (a save, the parameter norm, a spike rollback, a
//     load) waits for them all first. Under captured steps (train_step.hpp's StepGraphs) the
//     gathers are the next step's: a graph must join what it starts, so the update's graph
//     leaves the rest of the buffer owed (parameters_owed) and the forward's graph starts the
//     gathers (start_gathers), each unit waiting for its bucket as above; any other use before
//     it gathers at once, through the group's collective.
// Tensors are found by their offset in the layout (the word embedding serves two roles when
// tied, so offsets, not names, identify them); kAbsentTensor gives an empty view.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/core/view.hpp"
#include "backend/device/arena.hpp"
#include "backend/device/device.hpp"
#include "backend/dist/communicator.hpp"
#include "backend/model/parameter_layout.hpp"

namespace backend {

enum class ParameterUnitKind { embedding = 0, layer = 1, head = 2 };

struct ParameterUnit {
  int64_t begin = 0, end = 0;  // flat offsets
  ParameterUnitKind kind = ParameterUnitKind::head;
};

// A range of the flat parameter buffer whose values are still arriving, and the started
// collective that brings them (--overlap-param-gather).
struct ArrivingParameters {
  BufferRange range;
  std::unique_ptr<Communicator::PendingCollective> pending;
};

// What starts the gathers of --overlap-param-gather through `group` into `parameters`, the flat
// buffer: the ranges that will arrive, each a run of whole units.
using ParameterGathers =
    std::function<std::vector<ArrivingParameters>(Communicator& group, View parameters)>;

template <typename Scalar>
class ParameterStore {
 public:
  static constexpr ElementType kElementType = element_type_of<Scalar>();

  // `layout` and `device` (and `sharded_group`, when not nullptr) must outlive the store.
  // `working_type`: the ops' type (kElementType, or bf16/fp16 for a working copy);
  // `with_gradients` false: an inference-only model, no gradient buffer. `sharded_group`: ZeRO-3
  // over that data-parallel group; nullptr: the whole layout held.
  ParameterStore(const ParameterLayout& layout, Device& device, ElementType working_type,
                 bool with_gradients, Communicator* sharded_group);

  // The held range of the flat buffers (the whole layout unless sharded). The parameters as
  // they stand: any arriving parameters are waited for first, so whoever reads or writes the
  // buffer outside the forward sees the whole model.
  View parameters() {
    finish_arrivals();
    return parameters_;
  }
  View gradients() const { return gradients_; }
  ShardRange held() const { return held_; }
  bool sharded() const { return sharded_group_ != nullptr; }
  const Communicator* sharded_group() const { return sharded_group_; }

  // A tensor as the ops read it (the working copy, or the gathered unit), and its gradient (of a
  // unit whose backward is running, when sharded); an empty view for kAbsentTensor.
  View parameter(int64_t offset) const;
  View gradient(int64_t offset) const;
  View absent() const { return View{nullptr, 0, kElementType, parameters_.on}; }

  // The units (ParameterUnit) by role: -1 for one this stage does not hold.
  int64_t embedding_unit() const { return embedding_unit_; }
  int64_t head_unit() const { return head_unit_; }
  int64_t layer_unit(int64_t layer) const { return layer_units_[static_cast<size_t>(layer)]; }
  // Before a unit's use: ZeRO-3's gather of it, or the wait for its arriving parameters (and its
  // part of the working copy made); nothing to do for unit -1 or a unit in place.
  void gather(int64_t unit);
  // ZeRO-3's start of a unit's gradients (zeroed) and end (summed over the group into the held
  // range); nothing to do when not sharded or for unit -1.
  void begin_gradients(int64_t unit);
  void flush_gradients(int64_t unit);
  // --overlap-grad-reduce: `callback` is told a unit's range of the flat gradient buffer when
  // gradients_done(unit) reports its backward of the micro batch finished.
  void set_gradients_ready(std::function<void(BufferRange)> callback) {
    gradients_ready_ = std::move(callback);
  }
  void gradients_done(int64_t unit) const;

  // Before a forward: the working copy made from the parameters if they changed since.
  void refresh_weights();
  // After the parameters were written: gathered units and the working copy are stale.
  void parameters_changed();
  // The whole working copy (bf16 or fp16, element for element of parameters()), for an
  // optimizer that rewrites it in its pass over the parameters; empty when the ops read the
  // parameters themselves (fp32) or the store is sharded (ZeRO-3 gathers units).
  View working_copy() const {
    return working_type_ == kElementType || sharded() ? View{} : weights_;
  }
  // After the parameters and the whole working copy were both written: the copy is current.
  void parameters_and_working_copy_changed() {
    parameters_changed();
    weights_stale_ = false;
  }
  // Megatron's initialisation (ParameterLayout::init_parameters) of the held range.
  void init_parameters(uint64_t seed);

  // The units' ranges of the flat buffer, in the layout's order (the forward's: the embedding,
  // the layers, the head).
  std::vector<BufferRange> unit_ranges() const;
  // --overlap-param-gather, after the parameters were written (parameters_changed()): the
  // ranges still arriving, each a run of whole units (a unit crossing two ranges is refused);
  // the units outside them are in place. Not for a sharded store (ZeRO-3 gathers its own).
  void parameters_arriving(std::vector<ArrivingParameters> arrivals);
  // Every arriving range waited for (and the working copy made of it), and owed parameters
  // gathered at once.
  void finish_arrivals();
  // --overlap-param-gather under captured steps, after parameters_changed(): the rest of the
  // buffer is owed and its gathers not started. The next captured step starts them
  // (start_gathers); a use before that (parameters(), a forward's gather() or
  // refresh_weights()) gathers them through `group` at once: a collective, which every rank
  // of `group` must reach alike (the trainer's evaluation, save and rollback do). `group` must
  // outlive the store or the next start_gathers.
  void parameters_owed(Communicator& group, ParameterGathers gathers);
  // A captured step's start: `gathers` started through `group` (the step's), the ranges
  // arriving as parameters_arriving's and nothing owed any more. Whether or not anything was
  // owed, so that the step's graph holds the gathers whatever preceded its capture.
  void start_gathers(Communicator& group, const ParameterGathers& gathers);
  // What a replayed graph did that the store did not see: every parameter arrived and the
  // working copy was made of them (nothing is arriving: the capture waited for it all).
  void parameters_arrived();
  // After a capture that failed: the ranges it started dropped unwaited (their calls belong to
  // no work that will run) and the working copy to be made again.
  void abandon_arrivals();

 private:
  int64_t unit_of(int64_t offset) const;
  void await_unit(int64_t unit);
  void refresh_unit_weights(const ParameterUnit& unit);
  int64_t numel_at(int64_t offset) const;
  View tensor_view(View buffer, int64_t offset) const;
  View working_view(int64_t offset, bool gradient_of) const;
  void build_units();
  void shard_over(Communicator& group);
  // What a working slot holds: a unit's gathered parameters and its gradients being summed.
  struct WorkingSlot {
    View parameters, gradients;
    int64_t parameter_unit = -1, gradient_unit = -1;
  };
  WorkingSlot& slot_of(const ParameterUnit& unit) {
    return working_[static_cast<size_t>(unit.kind)];
  }

  const ParameterLayout* layout_;
  Device* device_;
  ElementType working_type_;
  Arena arena_;
  View parameters_, gradients_, weights_;
  bool weights_stale_ = true;
  ShardRange held_;
  std::vector<ParameterUnit> units_;
  std::vector<int64_t> layer_units_;  // by global layer index
  int64_t embedding_unit_ = -1, head_unit_ = -1;
  std::function<void(BufferRange)> gradients_ready_;
  Communicator* sharded_group_ = nullptr;
  Arena working_arena_;
  std::array<WorkingSlot, 3> working_;  // by ParameterUnitKind
  // --overlap-param-gather: the ranges still arriving (declared after the arenas, so that
  // collectives dropped unwaited finish before the buffers go) and, by unit, the index of the
  // range it waits for (-1: in place).
  std::vector<ArrivingParameters> arrivals_;
  std::vector<int64_t> unit_arrival_;
  int64_t units_arriving_ = 0;
  // parameters_owed's: the group and the gathers a use before the next step runs.
  Communicator* owed_group_ = nullptr;
  ParameterGathers owed_gathers_;
};

extern template class ParameterStore<float>;
extern template class ParameterStore<double>;

}  // namespace backend
