// GptModel: the forward and backward of the decoder that gpt_model.hpp describes, composed
// once from the ops over a Device (backend/ops/; llm.c's gpt2_forward / gpt2_backward, with
// Megatron core's parameter names, layouts and initialisation). This file is the order of the
// ops; what they run over lives beside it: the parameter layout and its initialisation
// (parameter_layout), the flat parameter and gradient buffers with ZeRO-3's units and the
// mixed-precision working copy (parameter_store), the tensor- and sequence-parallel collectives
// and the vocab-parallel loss (tensor_parallel_region, which says what each layer computes on a
// rank), the activation buffers (micro_batch_activations) with their plan and recompute
// schedule (activation_plan), the dropout masks by site (dropout_sites), the configured norm
// and RoPE (layer_ops), and the layouts the model refuses (model_parallelism).
//
// The Llama switches change the composition, not the ops' contracts: a tensor the
// configuration leaves out (position table with RoPE, norm biases with RMSNorm, linear biases
// with --disable-bias-linear) has no entry in the flat buffer at all, and its place in the
// op calls is an empty View. RoPE rotates the q and k heads of the fused qkv activation in place
// after linear_qkv, so the stored qkv is what attention saw, and the backward rotates dqkv
// back before linear_qkv's backward.
//
// Pipeline parallelism (pipeline_stage.hpp; Narayanan et al. 2021): the model holds its stage's
// tensors and runs one chunk of one micro batch at a time (forward_chunk / backward_chunk); the
// schedule (train/pipeline_schedule.hpp) moves the activations and gradients between stages
// through the chunks' input, output and output-gradient buffers. Each micro batch in flight has
// its own kept buffers (a slot) and its own dropout key; the scratch is shared.
//
// Mixed precision (--bf16, --fp16): the ops read the store's bf16 or fp16 working copy and keep
// activations of that type with fp32 statistics (activation_plan.hpp); the parameter gradients
// stay fp32, so the optimizer, clipping and checkpoints see the fp32 path's buffers.
#include <type_traits>

#include "backend/model/gpt_model_state.hpp"
#include "backend/ops/attention.hpp"
#include "backend/ops/cross_entropy.hpp"
#include "backend/ops/dropout.hpp"
#include "backend/ops/embedding.hpp"
#include "backend/ops/linear.hpp"
#include "backend/ops/linear_gelu.hpp"
#include "backend/ops/reduction.hpp"
#include "backend/ops/residual.hpp"
#include "backend/ops/step_scalars.hpp"
#include "backend/ops/swiglu.hpp"

namespace backend {

// One transformer layer of the reserved shape: reads the previous layer's output (or the
// embedding) and fills its activations.
template <typename Scalar>
void GptModelState<Scalar>::layer_forward(int64_t l) {
  store.gather(store.layer_unit(l));
  const LayerParameters& p = layout.layer(l);
  const LayerActivations& a = layer_activations(l);
  const SharedActivations& w = work();
  const View input = layer_input(l);
  const View output = layer_output(l);
  const int64_t C = config.hidden_size;
  // This rank's heads and MLP features (all of them without tensor parallelism).
  const int64_t A = shard.attention_features();
  const int64_t F = shard.ffn_hidden_size;
  const int64_t R = rows();
  Device& d = *device;

  norm_forward(a.input_norm, a.input_norm_mean, a.input_norm_rstd, input, p.input_norm_weight,
               p.input_norm_bias);
  ops::linear_forward(d, a.qkv, a.input_norm, parameter(p.qkv_weight), parameter(p.qkv_bias), R,
                      C, shard.qkv_features());
  if (rope()) rotate_queries_and_keys(a.qkv, false);
  ops::attention_forward(d, a.context, attention_logsumexp(a), a.qkv, attention_shape(),
                         dropout(DropoutSite::attention, l));
  ops::linear_forward(d, w.branch, a.context, parameter(p.proj_weight), added_once(p.proj_bias),
                      R, A, C);
  const View attention_output = tensor_parallel.reduce(w.branch, w.branch_shard);
  if (const Dropout mask = dropout(DropoutSite::attention_output, l); mask.active()) {
    ops::dropout_forward(d, attention_output, attention_output, mask);
  }
  // attention_residual = input + attention_output, and its norm, in one kernel.
  norm_forward(a.mlp_norm, a.mlp_norm_mean, a.mlp_norm_rstd, a.attention_residual,
               p.mlp_norm_weight, p.mlp_norm_bias, {input, attention_output});
  if (config.swiglu) {
    ops::linear_forward(d, a.fc1, a.mlp_norm, parameter(p.fc1_weight), parameter(p.fc1_bias), R, C,
                        shard.fc1_features());
    ops::swiglu_forward(d, a.activation, a.fc1, R, F);
  } else {
    // fc1 and its GELU in one op (the GEMM's epilogue on a GPU), fc1's output kept.
    ops::linear_gelu_forward(d, a.activation, a.fc1, a.mlp_norm, parameter(p.fc1_weight),
                             parameter(p.fc1_bias), R, C, shard.fc1_features());
  }
  ops::linear_forward(d, w.branch, a.activation, parameter(p.fc2_weight), added_once(p.fc2_bias),
                      R, F, C);
  const View mlp_output = tensor_parallel.reduce(w.branch, w.branch_shard);
  if (const Dropout mask = dropout(DropoutSite::mlp_output, l); mask.active()) {
    ops::dropout_forward(d, mlp_output, mlp_output, mask);
  }
  ops::residual_forward(d, output, a.attention_residual, mlp_output);
}

// The backward of layer_forward(l): on entry dresidual holds the gradient of the layer's
// output, on return that of its input; parameter gradients accumulate.
template <typename Scalar>
void GptModelState<Scalar>::layer_backward(int64_t l) {
  const int64_t unit = store.layer_unit(l);
  store.gather(unit);
  store.begin_gradients(unit);
  const LayerParameters& p = layout.layer(l);
  const LayerActivations& a = layer_activations(l);
  const SharedActivations& w = work();
  const View input = layer_input(l);
  const int64_t C = config.hidden_size;
  const int64_t A = shard.attention_features();
  const int64_t F = shard.ffn_hidden_size;
  const int64_t R = rows();
  Device& d = *device;

  // MLP block; dresidual is the gradient of both the block output and the dropped fc2
  // output, whose mask turns it into fc2's output gradient (in dbranch, free until the
  // norm backward below).
  View dmlp_output = w.dresidual;
  if (const Dropout mask = dropout(DropoutSite::mlp_output, l); mask.active()) {
    ops::dropout_backward(d, w.dbranch, w.dresidual, mask);
    dmlp_output = w.dbranch;
  }
  // (`branch` is free in the backward: the whole output gradient under sequence parallelism.)
  const View dfc2_output = tensor_parallel.gather(dmlp_output, w.branch);
  if (config.swiglu) {
    ops::linear_backward(d, w.dhidden, gradient(p.fc2_weight), gradient(p.fc2_bias), dfc2_output,
                         a.activation, parameter(p.fc2_weight), R, F, C);
    ops::swiglu_backward(d, w.dfc1, w.dhidden, a.fc1, R, F);
  } else {
    // fc2's backward and GELU's in one op (the dGELU epilogue on a GPU): dfc1 directly.
    ops::linear_dgelu_backward(d, w.dfc1, gradient(p.fc2_weight), gradient(p.fc2_bias), dfc2_output,
                               a.activation, parameter(p.fc2_weight), a.fc1, R, F, C);
  }
  ops::linear_backward(d, w.dnorm, gradient(p.fc1_weight), gradient(p.fc1_bias), w.dfc1,
                       a.mlp_norm, parameter(p.fc1_weight), R, C, shard.fc1_features());
  // The residual stream's gradient gains the norm's: added in the norm's kernel.
  norm_backward(w.dresidual, p.mlp_norm_weight, p.mlp_norm_bias,
                tensor_parallel.reduce(w.dnorm, w.dnorm_shard), a.attention_residual,
                a.mlp_norm_mean, a.mlp_norm_rstd, InputGradient::accumulate);

  // Attention block, the same way.
  View dattention_output = w.dresidual;
  if (const Dropout mask = dropout(DropoutSite::attention_output, l); mask.active()) {
    ops::dropout_backward(d, w.dbranch, w.dresidual, mask);
    dattention_output = w.dbranch;
  }
  // The row-parallel bias's gradient comes from the whole output gradient, the same on every
  // rank, so every rank's copy stays the same.
  ops::linear_backward(d, w.dnorm, gradient(p.proj_weight), gradient(p.proj_bias),
                       tensor_parallel.gather(dattention_output, w.branch), a.context,
                       parameter(p.proj_weight), R, A, C);
  if (schedule.selective()) {
    // The attention core again, from the stored qkv and with the forward's mask key: the
    // same log-sum-exp, and the same context bits (linear_proj's backward is done with it).
    ops::attention_forward(d, a.context, attention_logsumexp(a), a.qkv, attention_shape(),
                           dropout(DropoutSite::attention, l));
  }
  ops::attention_backward(d, w.dqkv, w.dnorm, a.qkv, a.context, attention_logsumexp(a),
                          attention_shape(), dropout(DropoutSite::attention, l));
  if (rope()) rotate_queries_and_keys(w.dqkv, true);
  ops::linear_backward(d, w.dnorm, gradient(p.qkv_weight), gradient(p.qkv_bias), w.dqkv,
                       a.input_norm, parameter(p.qkv_weight), R, C, shard.qkv_features());
  norm_backward(w.dresidual, p.input_norm_weight, p.input_norm_bias,
                tensor_parallel.reduce(w.dnorm, w.dnorm_shard), input, a.input_norm_mean,
                a.input_norm_rstd, InputGradient::accumulate);
  store.flush_gradients(unit);
  store.gradients_done(unit);
}

// One chunk's forward on slot `slot`'s buffers (tokens and labels already there): the
// embedding on the first virtual stage, the chunk's layers, the head on the last. Returns the
// mean loss on the last virtual stage, else 0. Given the backward's scale, the head also writes
// the logits' gradient over the logits (the fused classifier).
template <typename Scalar>
Scalar GptModelState<Scalar>::forward_chunk(int64_t slot, int64_t chunk,
                                            std::optional<Scalar> backward_scale) {
  select(slot);
  MicroBatchBuffers& b = *batch;
  b.forward_done[static_cast<size_t>(chunk)] = false;
  b.dropout = {training, dropout_seed, dropout_step};
  store.refresh_weights();
  const SharedActivations& w = work();
  Device& d = *device;
  const int64_t C = config.hidden_size;
  const int64_t V = shard.padded_vocab_size;  // this rank's vocabulary rows
  const int64_t R = rows();

  if (first_virtual_stage(chunk)) {
    store.gather(store.embedding_unit());
    // Each rank's vocabulary rows (and rank 0's positions), summed over the group: in place, or
    // through `branch` into this rank's rows.
    const View embedding_partial = tensor_parallel.sequence_parallel() ? w.branch : b.embedded;
    ops::embedding_forward(d, embedding_partial, b.tokens, parameter(layout.word_embeddings()),
                           added_once(layout.position_embeddings()), batch_size(), seq_length(),
                           C, vocab_start);
    tensor_parallel.reduce(embedding_partial, b.embedded);
    if (const Dropout mask = dropout(DropoutSite::embedding, 0); mask.active()) {
      ops::dropout_forward(d, b.embedded, b.embedded, mask);
    }
  }
  const LayerRange& layers_of_chunk = chunks[static_cast<size_t>(chunk)];
  for (int64_t l = layers_of_chunk.begin; l < layers_of_chunk.end; ++l) layer_forward(l);
  if (!last_virtual_stage(chunk)) {
    b.forward_done[static_cast<size_t>(chunk)] = true;
    return 0;
  }
  store.gather(store.head_unit());
  if (config.share_embeddings_and_output_weights) store.gather(store.embedding_unit());
  norm_forward(b.final_norm, b.final_norm_mean, b.final_norm_rstd,
               layer_output(layers_of_chunk.end - 1), layout.final_norm_weight(),
               layout.final_norm_bias());
  // logits = final_norm · W^T with W the word embedding (tied) or output_layer.weight.
  ops::linear_forward(d, b.logits, b.final_norm, parameter(layout.output_weight()),
                      View{nullptr, 0, b.logits.type, b.logits.on}, R, C, V);
  b.logits_hold_gradient_of_scale.reset();
  std::optional<double> gradient_scale;
  if (backward_scale) {
    gradient_scale = classifier_gradient_scale(*backward_scale, b.scored_positions);
  }
  tensor_parallel.cross_entropy(d, b.losses, b.logsumexp, w.logsumexp_parts, w.target_logit,
                                b.logits, b.labels, R, V, vocab_start, gradient_scale,
                                backward_scale ? b.stored_classifier_scale : View{});
  if (backward_scale) b.logits_hold_gradient_of_scale = static_cast<double>(*backward_scale);
  b.forward_done[static_cast<size_t>(chunk)] = true;

  // Summed on the device in a fixed order (and in double), so the loss does not depend on the
  // thread count; read back per micro batch, unless training keeps it on the device. Ignored
  // positions add 0 and are not counted; a micro batch without a scored position has loss 0
  // (Megatron divides 0 by 0).
  ops::sum(d, w.loss_total, b.losses);
  if (!loss_accumulation.total.empty()) {
    ops::accumulate_loss(d, loss_accumulation.total, w.loss_total, b.scored_positions,
                         loss_accumulation.weighted_by_scored_positions,
                         std::is_same_v<Scalar, float>, b.stored_scored_positions);
    return 0;
  }
  double total = 0;
  d.copy_to_host(&total, w.loss_total);
  if (b.scored_positions == 0) return 0;
  return static_cast<Scalar>(total / static_cast<double>(b.scored_positions));
}

// The head's backward on the last virtual stage: from the loss to the gradient of the last
// layer's output, in dresidual. dlogits are the forward's when it was given this scale (the
// fused classifier), else computed here from the intact logits.
template <typename Scalar>
void GptModelState<Scalar>::head_backward(int64_t last_layer, Scalar grad_scale) {
  const MicroBatchBuffers& b = *batch;
  const SharedActivations& w = work();
  const int64_t R = rows();
  const int64_t C = config.hidden_size;
  const int64_t V = shard.padded_vocab_size;
  Device& d = *device;
  View dlogits = w.dlogits;
  if (b.logits_hold_gradient_of_scale) {
    if (*b.logits_hold_gradient_of_scale != static_cast<double>(grad_scale)) {
      common::fail(
          "GptModel::backward({}): the forward computed the logits' gradient for a backward "
          "scale of {} (the fused classifier); the backward must be given that scale",
          grad_scale, *b.logits_hold_gradient_of_scale);
    }
    dlogits = b.logits;
  } else if (config.classifier_gradient_in_forward) {
    common::fail(
        "GptModel::backward(): this model computes the logits' gradient in the forward "
        "(GptConfig::classifier_gradient_in_forward, the trainer's), but the last forward was "
        "not given the backward's scale");
  } else {
    ops::cross_entropy_backward(
        d, dlogits, b.logits, b.logsumexp, b.labels,
        static_cast<double>(classifier_gradient_scale(grad_scale, b.scored_positions)), R, V,
        vocab_start);
  }
  ops::linear_backward(d, w.dnorm, gradient(layout.output_weight()),
                       View{nullptr, 0, kElementType, w.dnorm.on}, dlogits, b.final_norm,
                       parameter(layout.output_weight()), R, C, V);
  norm_backward(w.dresidual, layout.final_norm_weight(), layout.final_norm_bias(),
                tensor_parallel.reduce(w.dnorm, w.dnorm_shard), layer_output(last_layer),
                b.final_norm_mean, b.final_norm_rstd);
  store.flush_gradients(store.head_unit());
  store.gradients_done(store.head_unit());
}

// The layers' backward, last to first, dresidual carried through them; a recomputed chunk
// ending at l runs its forward again from the chunk's stored input (the dropout masks are
// keyed by the last forward's step, so they are the forward's), then its backward.
template <typename Scalar>
void GptModelState<Scalar>::layers_backward(const LayerRange& layers) {
  for (int64_t l = layers.end - 1; l >= layers.begin;) {
    if (!schedule.recomputed(l)) {
      layer_backward(l--);
      continue;
    }
    const int64_t begin = schedule.chunk_begin(l);
    for (int64_t k = begin; k <= l; ++k) layer_forward(k);
    for (int64_t k = l; k >= begin; --k) layer_backward(k);
    l = begin - 1;
  }
}

// The embedding's backward on the first virtual stage, from the gradient in dresidual. Every
// rank holds the whole embedding gradient: its vocabulary rows take their tokens', and the
// position table (whole on every rank) the same gradient everywhere.
template <typename Scalar>
void GptModelState<Scalar>::embedding_backward() {
  const MicroBatchBuffers& b = *batch;
  const SharedActivations& w = work();
  Device& d = *device;
  if (const Dropout mask = dropout(DropoutSite::embedding, 0); mask.active()) {
    ops::dropout_backward(d, w.dresidual, w.dresidual, mask);
  }
  ops::embedding_backward(d, gradient(layout.word_embeddings()),
                          gradient(layout.position_embeddings()),
                          tensor_parallel.gather(w.dresidual, w.branch), b.token_index,
                          batch_size(), seq_length(), config.hidden_size, vocab_start);
  store.flush_gradients(store.embedding_unit());
  store.gradients_done(store.embedding_unit());
}

// The backward of forward_chunk(slot, chunk): from the loss on the last virtual stage, else
// from the output gradient received into the slot; leaves the input's gradient in the chunk's
// input buffer (off the first virtual stage), and adds to the parameter gradients.
template <typename Scalar>
void GptModelState<Scalar>::backward_chunk(int64_t slot, int64_t chunk, Scalar grad_scale) {
  if (config.inference_only) {
    common::fail("GptModel::backward(): this model was made for inference only "
                 "(GptConfig::inference_only: no gradient buffer); a training model computes "
                 "gradients");
  }
  if (!micro_batches.slot(slot).forward_done[static_cast<size_t>(chunk)]) {
    common::fail(
        "GptModel::backward() called without a completed forward(); run forward() on "
        "the micro batch first");
  }
  select(slot);
  const MicroBatchBuffers& b = *batch;
  const SharedActivations& w = work();
  const LayerRange& layers_of_chunk = chunks[static_cast<size_t>(chunk)];
  if (store.sharded()) {
    // The whole model (ZeRO-3 runs without a pipeline): the embedding's gradients collect
    // from the head (tied) and the embedding backward, the head's from the head.
    store.begin_gradients(store.embedding_unit());
    store.begin_gradients(store.head_unit());
    store.gather(store.head_unit());
    store.gather(store.embedding_unit());
  }
  if (last_virtual_stage(chunk)) {
    head_backward(layers_of_chunk.end - 1, grad_scale);
  } else {
    device->copy(w.dresidual, b.output_gradients[static_cast<size_t>(chunk)]);
  }
  layers_backward(layers_of_chunk);
  if (first_virtual_stage(chunk)) {
    embedding_backward();
  } else {
    // The input's gradient, for the previous virtual stage; the input itself is spent.
    device->copy(chunk == 0 ? b.embedded : b.chunk_inputs[static_cast<size_t>(chunk)], w.dresidual);
  }
}

template struct GptModelState<float>;
template struct GptModelState<double>;

}  // namespace backend
