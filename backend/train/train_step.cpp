// Megatron's train_step on one process; see train_step.hpp.
#include "backend/train/train_step.hpp"

#include <cmath>
#include <vector>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"

namespace backend {

namespace {

// The gradients of the global batch accumulate over its micro batches, each backward scaled by
// loss_scale / num_micro_batches; returns the mean (unscaled) loss.
double forward_backward(GptModel<float>& model, const BatchSource& source, const GlobalBatch& batch,
                        double loss_scale, const TrainingArguments& a) {
  const int64_t micro_tokens = common::checked_multiply(a.micro_batch_size, a.seq_length,
                                                        "--micro-batch-size × --seq-length");
  std::vector<int32_t> tokens(micro_tokens), labels(micro_tokens);
  double loss_sum = 0;
  for (int64_t m = 0; m < batch.num_micro_batches; ++m) {
    source(Split::train, batch.first_sample + m * a.micro_batch_size, a.micro_batch_size, tokens,
           labels);
    loss_sum += model.forward(tokens, labels, a.micro_batch_size, a.seq_length);
    // Without a scaler (scale 1) the factor is 1/num_micro_batches exactly as before; a power-of-
    // two scale multiplies it exactly.
    model.backward(static_cast<float>(loss_scale) /
                   static_cast<float>(batch.num_micro_batches));
  }
  return loss_sum / static_cast<double>(batch.num_micro_batches);
}

}  // namespace

TrainStepResult train_step(GptModel<float>& model, AdamW& optimizer,
                           LearningRateScheduler& scheduler, const BatchSource& source,
                           const GlobalBatch& batch, const TrainingArguments& a) {
  // Two CPU devices share the host's memory; a GPU's memory is that GPU's alone.
  if (optimizer.device().name() != model.device().name()) {
    common::fail("train_step: the model is on {} but the optimizer's state on {}",
                 model.device().name(), optimizer.device().name());
  }
  const View gradients = model.gradient_buffer();
  LossScaler& scaler = optimizer.loss_scaler();
  model.zero_gradients();
  TrainStepResult result;
  result.lm_loss = forward_backward(model, source, batch, scaler.scale(), a);
  result.learning_rate = scheduler.learning_rate();
  if (scaler.enabled()) {
    // Megatron's mixed-precision step: unscale the gradients, look for inf/nan (here: a norm
    // that is not finite, which any non-finite gradient makes it), tell the scaler, and skip
    // the update when one was found. The loss itself does not decide: a non-finite loss with
    // finite gradients is a nan iteration that still updates, as in Megatron.
    if (scaler.scale() != 1.0) optimizer.device().scale(gradients, scaler.inverse_scale());
    result.grad_norm = optimizer.gradient_norm(gradients);
    const bool found_inf = !std::isfinite(result.grad_norm);
    scaler.update(found_inf);
    result.skipped = found_inf;
  } else {
    // Reduced on the device; the host reads one double (and decides, as every rank will).
    result.grad_norm = optimizer.gradient_norm(gradients);
    // In fp32 there is no loss scale to back off: a non-finite loss or norm is the only reason
    // to skip, and the update it would have made is dropped whole.
    result.skipped = !std::isfinite(result.lm_loss) || !std::isfinite(result.grad_norm);
  }
  result.nan = !std::isfinite(result.lm_loss) || (!scaler.enabled() && result.skipped);
  result.loss_scale = scaler.scale();
  if (!result.skipped) {
    optimizer.clip_gradients(gradients, result.grad_norm, a.clip_grad);
    // fp32: the model's parameters are the master weights, no working copy to rewrite.
    optimizer.step(model.parameter_buffer(), View{}, gradients, result.learning_rate,
                   scheduler.weight_decay());
    scheduler.step(batch.global_batch_size);
  }
  return result;
}

}  // namespace backend
