// Megatron's evaluate on one process; see evaluation.hpp.
#include "backend/train/evaluation.hpp"

#include <algorithm>
#include <vector>

#include "backend/common/checked_math.hpp"
#include "backend/train/pipeline_execution.hpp"

namespace backend {

EvaluationResult evaluate(GptModel<float>& model, const BatchSource& source, Split split,
                          int64_t first_sample, const EvaluationOptions& options) {
  const auto one_process = make_single_process_communicator("data parallel");
  return evaluate(model, source, split, first_sample, options, *one_process);
}

EvaluationResult evaluate(GptModel<float>& model, const BatchSource& source, Split split,
                          int64_t first_sample, const EvaluationOptions& options,
                          Communicator& data_parallel) {
  const int64_t dp_size = data_parallel.size();
  const int64_t dp_rank = data_parallel.rank();
  const int64_t num_micro_batches =
      options.global_batch_size / (options.micro_batch_size * dp_size);
  const int64_t micro_tokens = common::checked_multiply(
      options.micro_batch_size, options.seq_length, "--micro-batch-size × --seq-length");
  std::vector<int32_t> tokens(micro_tokens), labels(micro_tokens);
  const bool per_token = options.calculate_per_token_loss;
  model.set_training(false);
  EvaluationResult result;
  // One running sum over every micro batch, divided once: a mean of per-batch means would
  // round differently. Per token: the token losses' sum and their count.
  double totals[2] = {0, 0};
  if (!model.pipeline_stage().whole_model()) {
    // Forward only through the pipeline; the last stage holds the losses and tells the others.
    const auto steps = pipeline_forward_schedule(model.pipeline_stage(), num_micro_batches);
    std::vector<int64_t> scored(static_cast<size_t>(num_micro_batches), 0);
    for (int64_t i = 0; i < options.eval_iters; ++i) {
      const int64_t first = first_sample + result.samples;
      std::fill(scored.begin(), scored.end(), 0);
      PipelineMicroBatches inputs{
          .count = num_micro_batches,
          .read =
              [&](int64_t m, std::span<int32_t> micro_tokens, std::span<int32_t> micro_labels) {
                source(split, first + (m * dp_size + dp_rank) * options.micro_batch_size,
                       options.micro_batch_size, micro_tokens, micro_labels);
                if (per_token) scored[static_cast<size_t>(m)] = scored_label_count(micro_labels);
              },
          .dropout_step = {},
          .loss_weight = {}};
      if (per_token) {
        inputs.loss_weight = [&](int64_t m) {
          return static_cast<double>(scored[static_cast<size_t>(m)]);
        };
      }
      totals[0] += run_pipeline_steps(model, steps, inputs, 1.0f, options.micro_batch_size,
                                      options.seq_length);
      if (model.pipeline_stage().last()) {
        for (const int64_t count : scored) totals[1] += static_cast<double>(count);
      }
      result.samples += num_micro_batches * options.micro_batch_size * dp_size;
    }
    Communicator& pipeline = model.pipeline_parallel_group();
    pipeline.broadcast(host_view(std::span<double>(totals)), pipeline.size() - 1);
  } else {
    for (int64_t i = 0; i < options.eval_iters; ++i) {
      for (int64_t m = 0; m < num_micro_batches; ++m) {
        // This rank's slice of the step's D micro batches, as the training sampler reads them.
        source(split, first_sample + result.samples + dp_rank * options.micro_batch_size,
               options.micro_batch_size, tokens, labels);
        result.samples += options.micro_batch_size * dp_size;
        const double loss =
            model.forward(tokens, labels, options.micro_batch_size, options.seq_length);
        if (per_token) {
          const int64_t count = scored_label_count(labels);
          totals[0] += loss * static_cast<double>(count);
          totals[1] += static_cast<double>(count);
        } else {
          totals[0] += loss;
        }
      }
    }
  }
  model.set_training(true);
  if (per_token) {
    // Megatron core's evaluate: the token losses' sum over their count, both summed at once.
    data_parallel.all_reduce(host_view(std::span<double>(totals)), ReduceOperation::sum);
    result.lm_loss = totals[1] > 0 ? totals[0] / totals[1] : 0.0;
  } else {
    result.lm_loss = all_reduce_sum(data_parallel, totals[0]) /
                     static_cast<double>(options.eval_iters * num_micro_batches * dp_size);
  }
  return result;
}

}  // namespace backend
