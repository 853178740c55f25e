// What one rank's GptModel holds (gpt_model.hpp), for the two files that define it: the layer
// order (gpt_model.cpp) and the public members over it (gpt_model_interface.cpp). Its config
// and this rank's shard of it, the layout, the parallel groups, the device, the parameter store
// and the micro batches' buffers, made in that order; the views and masks the layer order asks
// for by name; the selected micro batch. Not included outside backend/model.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/model/activation_plan.hpp"
#include "backend/model/dropout_sites.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/model/layer_ops.hpp"
#include "backend/model/micro_batch_activations.hpp"
#include "backend/model/model_parallelism.hpp"
#include "backend/model/parameter_store.hpp"
#include "backend/model/tensor_parallel_region.hpp"
#include "backend/ops/attention.hpp"
#include "backend/ops/rope.hpp"

namespace backend {

// The scale of the head's dlogits for a backward of grad_scale: d(mean loss)/dlogits ·
// grad_scale. Every later gradient is linear in dlogits, so the scale is applied once, to
// dlogits (computed in Scalar, as the CPU twin takes it). The mean is over the micro batch's
// scored positions (0 when there are none); ignored ones get a zero row whatever the scale.
template <typename Scalar>
Scalar classifier_gradient_scale(Scalar grad_scale, int64_t scored_positions) {
  return scored_positions == 0 ? Scalar{0} : grad_scale / static_cast<Scalar>(scored_positions);
}

template <typename Scalar>
struct GptModelState {
  static constexpr ElementType kElementType = element_type_of<Scalar>();

  GptModelState(const GptConfig& model_config, Device* borrowed,
                const ModelParallelism& parallelism)
      : config(model_config),
        tensor_parallel(parallelism.tensor_parallel, parallelism.sequence_parallel),
        shard(tensor_parallel.active() ? tensor_parallel_shard(config, tensor_parallel.size())
                                       : config),
        stage(parallelism.pipeline),
        layout(config, tensor_parallel.size(), tensor_parallel.rank(), stage),
        chunks(layout.chunks()),
        schedule(config, chunks),
        embedding_group(parallelism.embedding),
        owned_pipeline_group(parallelism.pipeline_parallel == nullptr
                                 ? make_single_process_communicator("pipeline model parallel")
                                 : nullptr),
        pipeline_group(parallelism.pipeline_parallel != nullptr ? parallelism.pipeline_parallel
                                                                : owned_pipeline_group.get()),
        vocab_start(tensor_parallel.rank() * shard.padded_vocab_size),
        norm_ranges(backend::gradient_norm_ranges(layout.tensors(), tensor_parallel.rank())),
        owned_device(borrowed == nullptr ? std::make_unique<CpuDevice>() : nullptr),
        device(borrowed != nullptr ? borrowed : owned_device.get()),
        store((check_layout(parallelism), layout), *device, activation_type(),
              !config.inference_only, parallelism.sharded_data_parallel),
        micro_batches(shard, schedule, stage, std::ssize(chunks), activation_type(),
                      tensor_parallel.size(), tensor_parallel.sequence_parallel(), *device) {}

  void check_layout(const ModelParallelism& parallelism) const {
    check_model_parallelism(config, parallelism, {tensor_parallel.size(), pipeline_group->size()},
                            kElementType, *device);
  }

  // The activations' type: bf16 or fp16 under GptConfig::mixed_precision, else the parameters'.
  ElementType activation_type() const { return working_type(config.mixed_precision, kElementType); }

  GptConfig config;
  TensorParallelRegion tensor_parallel;
  GptConfig shard;  // this rank's part of config (config itself without tensor parallelism)
  PipelineStage stage;
  ParameterLayout layout;
  std::vector<LayerRange> chunks;  // the stage's model chunks
  RecomputeSchedule schedule;
  Communicator* embedding_group = nullptr;  // first and last stage (tied embeddings, pp > 1)
  std::unique_ptr<Communicator> owned_pipeline_group;  // a group of one, when none was given
  Communicator* pipeline_group = nullptr;
  int64_t vocab_start = 0;  // the first vocabulary row of this rank's shard
  std::vector<BufferRange> norm_ranges;
  std::unique_ptr<Device> owned_device;  // the CpuDevice of GptModel(config)
  Device* device = nullptr;
  ParameterStore<Scalar> store;
  MicroBatchActivations micro_batches;
  MicroBatchBuffers* batch = nullptr;  // the selected slot (select()), which the ops below use

  // Dropout: the mode and the generator's state for the next forward (the last forward's are
  // its slot's: the backward regenerates the masks from them).
  bool training = true;
  // set_loss_accumulation's: where a scoring forward adds its loss (empty: it returns it).
  typename GptModel<Scalar>::LossAccumulation loss_accumulation{};
  uint64_t dropout_seed = 0;
  uint64_t dropout_step = 0;

  View parameter(int64_t offset) const { return store.parameter(offset); }
  View gradient(int64_t offset) const { return store.gradient(offset); }
  // A parameter that the sum over the tensor-parallel group must hold once (a row-parallel
  // bias, the position table): rank 0's, an empty view elsewhere.
  View added_once(int64_t offset) const {
    return tensor_parallel.rank() == 0 ? parameter(offset) : store.absent();
  }
  const SharedActivations& work() const { return micro_batches.shared(); }
  int64_t batch_size() const { return micro_batches.batch_size(); }
  int64_t seq_length() const { return micro_batches.seq_length(); }
  int64_t rows() const { return micro_batches.rows(); }
  bool rope() const { return config.position_embedding_type == PositionEmbeddingType::rope; }

  // One of the model's three norms over the residual stream's rows; `output` is whole
  // (rows, C): under sequence parallelism this rank normalises its rows into its part of it and
  // the parts are all-gathered (Megatron's gather_from_sequence_parallel_region before a
  // column-parallel layer).
  // With `residual`, input = residual + branch is computed in the same kernel first (the
  // residual stream's rows, as input).
  void norm_forward(View output, View mean, View rstd, View input, int64_t weight, int64_t bias,
                    ResidualViews residual = {}) {
    const View own = tensor_parallel.own_rows(output, config.hidden_size);
    backend::norm_forward(*device, config, own, {mean, rstd}, input, parameter(weight),
                          parameter(bias), tensor_parallel.stream_rows(), residual);
    tensor_parallel.gather(own, output);
  }
  // doutput, input and dinput are the residual stream's rows; `mode` accumulate adds the norm's
  // input gradient to dinput (the fused residual connection's backward).
  void norm_backward(View dinput, int64_t weight, int64_t bias, View doutput, View input, View mean,
                     View rstd, InputGradient mode = InputGradient::overwrite) {
    backend::norm_backward(*device, config, dinput, gradient(weight), gradient(bias), doutput,
                           input, parameter(weight), {mean, rstd}, tensor_parallel.stream_rows(),
                           mode);
  }
  void rotate_queries_and_keys(View qkv, bool backward) {
    backend::rotate_queries_and_keys(*device, shard, qkv, work().rope_cos, work().rope_sin,
                                     batch_size(), seq_length(), backward);
  }
  // The attention core's dimensions on this rank: its heads and query groups (all of them
  // without tensor parallelism) over the micro batch.
  AttentionShape attention_shape() const {
    return {.batch_size = batch_size(),
            .seq_length = seq_length(),
            .hidden_size = shard.attention_features(),
            .num_heads = shard.num_attention_heads,
            .num_query_groups = shard.query_groups()};
  }
  // The selected micro batch's mask at a site (its key read from the staged table where the
  // micro batch was staged).
  Dropout dropout(DropoutSite site, int64_t layer) const {
    return dropout_at(site, layer, config, batch->dropout, tensor_parallel,
                      static_cast<const uint64_t*>(batch->dropout_keys.data));
  }

  const LayerActivations& layer_activations(int64_t l) const {
    return schedule.recomputed(l)
               ? work().recompute_slots[static_cast<size_t>(l - schedule.chunk_begin(l))]
               : batch->layers[static_cast<size_t>(l)];
  }
  View layer_output(int64_t l) {
    const View kept = batch->layers[static_cast<size_t>(l)].output;
    return kept.empty() ? layer_activations(l).output : kept;
  }
  // The input of layer l: its chunk's input for a chunk's first layer (the embedding output for
  // the first), else layer l − 1's output.
  View layer_input(int64_t l) {
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (chunks[c].begin == l) return c == 0 ? batch->embedded : batch->chunk_inputs[c];
    }
    return layer_output(l - 1);
  }
  View attention_logsumexp(const LayerActivations& a) const {
    return schedule.selective() ? work().recomputed_logsumexp : a.attention_logsumexp;
  }
  bool first_virtual_stage(int64_t chunk) const { return stage.first() && chunk == 0; }
  bool last_virtual_stage(int64_t chunk) const {
    return stage.last() && chunk + 1 == static_cast<int64_t>(chunks.size());
  }
  // The last stage's copy of a tied word embedding (pipeline_stage.hpp), or the first stage's
  // original: kept equal over the embedding group.
  bool tied_copies() const { return holds_tied_embedding(config, stage); }
  void select(int64_t slot) { batch = &micro_batches.slot(slot); }
  void check_slot(int64_t slot, int64_t chunk, const char* what) const;
  void reserve(int64_t batch_size, int64_t seq_length, int64_t slots);
  void layer_forward(int64_t l);
  void layer_backward(int64_t l);
  Scalar forward_chunk(int64_t slot, int64_t chunk, std::optional<Scalar> backward_scale);
  void backward_chunk(int64_t slot, int64_t chunk, Scalar grad_scale);
  // backward_chunk's three parts: the head (last virtual stage), the chunk's layers, the
  // embedding (first virtual stage).
  void head_backward(int64_t last_layer, Scalar grad_scale);
  void layers_backward(const LayerRange& layers);
  void embedding_backward();
};

template <typename Scalar>
void GptModelState<Scalar>::reserve(int64_t new_batch_size, int64_t new_seq_length, int64_t slots) {
  if (!micro_batches.reserve(new_batch_size, new_seq_length, slots)) return;
  tensor_parallel.set_rows(rows());
  if (rope()) {
    ops::rope_tables(*device, work().rope_cos, work().rope_sin, seq_length(), shard.rotary_dim(),
                     static_cast<double>(config.rotary_base), config.rope_scaling);
  }
  select(0);
}

template <typename Scalar>
void GptModelState<Scalar>::check_slot(int64_t slot, int64_t chunk, const char* what) const {
  if (!micro_batches.reserved()) {
    common::fail("GptModel::{}: no micro-batch shape reserved; call reserve() first", what);
  }
  if (slot < 0 || slot >= micro_batches.slots()) {
    common::fail("GptModel::{}: micro-batch slot {} is outside the {} reserved", what, slot,
                 micro_batches.slots());
  }
  if (chunk < 0 || chunk >= static_cast<int64_t>(chunks.size())) {
    common::fail("GptModel::{}: model chunk {} is outside this stage's {}", what, chunk,
                 chunks.size());
  }
}

}  // namespace backend
