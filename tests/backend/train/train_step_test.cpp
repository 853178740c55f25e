// One training iteration on a tiny model: which samples it reads, the loss it reports, the
// gradients it starts from, where clipping happens, and that a non-finite step changes nothing.
#include "backend/train/train_step.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/train/trainer.hpp"
#include "backend/train/training_schedule.hpp"
#include "tests/backend/train/tiny_gpt_arguments.hpp"

using namespace backend;

namespace {

TrainingArguments step_arguments() {
  TrainingArguments a = test_support::tiny_gpt_arguments(4);
  a.optimizer.lr_decay_style = backend::LearningRateDecayStyle::constant;
  return a;
}

// What pretrain builds from the arguments, without the loop around it.
struct TinyTraining {
  explicit TinyTraining(const TrainingArguments& a)
      : arguments(validated(a)),
        model(model_config(arguments)),
        optimizer(optimizer_for(model, arguments)),
        scheduler(learning_rate_schedule(arguments)),
        dataset(arguments.run.seed, model.config().vocab_size, arguments.model.seq_length) {
    model.init_parameters(arguments.run.seed);
  }
  static TrainingArguments validated(TrainingArguments a) {
    validate_arguments(a);
    return a;
  }
  static AdamW optimizer_for(const GptModel<float>& model, const TrainingArguments& a) {
    std::vector<ParameterGroup> groups;
    for (const auto& tensor : model.tensors()) {
      groups.push_back({tensor.offset, tensor.numel, tensor.weight_decay});
    }
    return AdamW({a.optimizer.adam_beta1, a.optimizer.adam_beta2, a.optimizer.adam_eps,
                  a.optimizer.weight_decay},
                 std::move(groups), static_cast<int64_t>(model.parameters().size()));
  }
  BatchSource source() const {
    return [this](Split split, int64_t first, int64_t batch, std::span<int32_t> tokens,
                  std::span<int32_t> labels) {
      dataset.fill_batch(split, first, batch, tokens, labels);
    };
  }
  TrainStepResult step(const GlobalBatch& batch) {
    return train_step(model, optimizer, scheduler, source(), batch, train_step_options(arguments));
  }

  TrainingArguments arguments;
  GptModel<float> model;
  AdamW optimizer;
  LearningRateScheduler scheduler;
  MockDataset dataset;
};

constexpr GlobalBatch kFirstBatch{
    .first_sample = 0, .global_batch_size = 4, .num_micro_batches = 2};

struct StepRead {
  Split split;
  int64_t first_sample, batch_size;
  bool operator==(const StepRead&) const = default;
};

}  // namespace

TEST_CASE("a step reads its global batch's training samples as micro batches, in order") {
  TinyTraining training(step_arguments());
  std::vector<StepRead> reads;
  const BatchSource recording = [&](Split split, int64_t first, int64_t batch,
                                    std::span<int32_t> tokens, std::span<int32_t> labels) {
    reads.push_back({split, first, batch});
    training.dataset.fill_batch(split, first, batch, tokens, labels);
  };
  const GlobalBatch batch{.first_sample = 8, .global_batch_size = 6, .num_micro_batches = 3};
  train_step(training.model, training.optimizer, training.scheduler, recording, batch,
             train_step_options(training.arguments));
  CHECK(reads ==
        std::vector<StepRead>{{Split::train, 8, 2}, {Split::train, 10, 2}, {Split::train, 12, 2}});
  CHECK(training.scheduler.num_steps() == 6);  // the scheduler counts samples
  CHECK(training.optimizer.steps_taken() == 1);
}

TEST_CASE("the step's loss is the mean of its micro batches' losses before the update") {
  TinyTraining training(step_arguments());
  TinyTraining reference(step_arguments());  // the same parameters, forward only
  std::vector<int32_t> tokens(2 * 16), labels(2 * 16);
  double expected = 0;
  for (int64_t first : {0, 2}) {
    reference.dataset.fill_batch(Split::train, first, 2, tokens, labels);
    expected += reference.model.forward(tokens, labels, 2, 16);
  }
  expected /= 2;
  const TrainStepResult result = training.step(kFirstBatch);
  CHECK(result.lm_loss == expected);
  CHECK_FALSE(result.skipped);
  CHECK(std::memcmp(training.model.parameters().data(), reference.model.parameters().data(),
                    training.model.parameters().size_bytes()) != 0);
}

// A CPU device that counts where a GPU's host would wait for results: its reads of the
// device's memory (copy_to_host) and its waits for the mark after a copy it queued; and those
// queued copies. (The upload ring's waits are for slots, not results.)
class ReadCountingDevice final : public CpuDevice {
 public:
  void copy_to_host(void* destination, View source) override {
    ++reads;
    CpuDevice::copy_to_host(destination, source);
  }
  void queue_copy_to_host(void* destination, View source) override {
    ++queued_copies;
    copy_queued_ = true;
    std::memcpy(destination, source.data, static_cast<size_t>(source.bytes()));
  }
  DeviceMark mark() override {
    const DeviceMark made = CpuDevice::mark();
    if (copy_queued_) after_copy_ = made.sequence;
    copy_queued_ = false;
    return made;
  }
  void wait_for(DeviceMark mark) override {
    if (mark.sequence != 0 && mark.sequence == after_copy_) ++reads;
  }
  int64_t reads = 0;
  int64_t queued_copies = 0;

 private:
  bool copy_queued_ = false;
  uint64_t after_copy_ = 0;
};

TEST_CASE("a step waits for the device once, after it is queued, whatever its micro batches") {
  // The losses, the norm, the clipping factor and the skip stay on the device until the step's
  // end (issue 39, item 4); --log-params-norm and --log-num-zeros-in-grad join that one read.
  struct Case {
    int64_t micro_batches;
    bool params_norm, zeros;
    int64_t reads;
  };
  for (const Case c : {Case{1, false, false, 1}, Case{4, false, false, 1}, Case{4, true, false, 1},
                       Case{2, false, true, 1}, Case{2, true, true, 1}}) {
    CAPTURE(c.micro_batches);
    CAPTURE(c.zeros);
    auto a = step_arguments();
    a.run.micro_batch_size = 4 / c.micro_batches;
    a.logging.log_params_norm = c.params_norm;
    a.logging.log_num_zeros_in_grad = c.zeros;
    TinyTraining reference(a);
    ReadCountingDevice device;
    GptModel<float> model(reference.model.config(), device);
    model.init_parameters(reference.arguments.run.seed);
    const AdamW host_optimizer = TinyTraining::optimizer_for(reference.model, a);
    std::vector<ParameterGroup> groups;
    for (const auto& tensor : model.tensors()) {
      groups.push_back({tensor.offset, tensor.numel, tensor.weight_decay});
    }
    AdamW optimizer(host_optimizer.config(), groups, host_optimizer.numel(), device);
    LearningRateScheduler scheduler(learning_rate_schedule(reference.arguments));
    const GlobalBatch batch{
        .first_sample = 0, .global_batch_size = 4, .num_micro_batches = c.micro_batches};
    model.reserve(a.run.micro_batch_size, a.model.seq_length);
    device.reads = 0;
    const TrainStepResult result = train_step(model, optimizer, scheduler, reference.source(),
                                              batch, train_step_options(reference.arguments));
    CHECK(device.reads == c.reads);
    CHECK(device.queued_copies == 1);  // the scalars, read by waiting for the mark after them
    // And the step is the one on a device of its own.
    const TrainStepResult expected = reference.step(batch);
    CHECK(result.lm_loss == expected.lm_loss);
    CHECK(result.grad_norm == expected.grad_norm);
    CHECK(std::ranges::equal(model.parameters(), reference.model.parameters()));
  }
}

TEST_CASE("the next step's gradients queued before this step is read give the same bits") {
  // train_step.hpp's three parts in the trainer's order when it queues ahead: the gradients of
  // step k+1 between the update of step k and its read.
  TinyTraining in_order(step_arguments());
  TinyTraining ahead(step_arguments());
  const auto batch = [](int64_t k) {
    return GlobalBatch{.first_sample = 4 * k, .global_batch_size = 4, .num_micro_batches = 2};
  };
  const TrainStepOptions options = train_step_options(ahead.arguments);
  const auto one_process = make_single_process_communicator("data parallel");
  std::vector<TrainStepResult> expected, results;
  for (int64_t k = 0; k < 4; ++k) expected.push_back(in_order.step(batch(k)));
  QueuedStep current = queue_gradients(ahead.model, ahead.optimizer, ahead.source(), batch(0),
                                       options, *one_process);
  for (int64_t k = 0; k < 4; ++k) {
    queue_update(current, ahead.model, ahead.optimizer, ahead.scheduler, options, *one_process);
    std::optional<QueuedStep> next;
    if (k < 3) {
      next = queue_gradients(ahead.model, ahead.optimizer, ahead.source(), batch(k + 1), options,
                             *one_process);
    }
    results.push_back(finish_step(current, ahead.model, ahead.optimizer, ahead.scheduler));
    if (next) current = std::move(*next);
  }
  for (size_t k = 0; k < 4; ++k) {
    CAPTURE(k);
    CHECK(results[k].lm_loss == expected[k].lm_loss);
    CHECK(results[k].grad_norm == expected[k].grad_norm);
    CHECK(results[k].learning_rate == expected[k].learning_rate);
  }
  CHECK(std::ranges::equal(ahead.model.parameters(), in_order.model.parameters()));
  // Each part in its place: a second update, or a read before the update, is refused.
  CHECK_THROWS_WITH_AS(
      queue_update(current, ahead.model, ahead.optimizer, ahead.scheduler, options, *one_process),
      "queue_update: this step's update is queued already", common::Error);
  QueuedStep unqueued = queue_gradients(ahead.model, ahead.optimizer, ahead.source(), batch(4),
                                        options, *one_process);
  CHECK_THROWS_WITH_AS(finish_step(unqueued, ahead.model, ahead.optimizer, ahead.scheduler),
                       "finish_step: the step's update was not queued", common::Error);
}

namespace {

// A data-parallel group of one that notes what it is asked to watch
// (Communicator::watch_queued_work); its collectives are the single process's.
class WatchNotingGroup final : public Communicator {
 public:
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  std::string name() const override { return inner_->name(); }
  bool queued_on_device() const override { return true; }
  void watch_queued_work(const std::string& what) override { watched.push_back(what); }
  void all_reduce(View values, ReduceOperation operation) override {
    inner_->all_reduce(values, operation);
  }
  void reduce_scatter(View output, View input) override { inner_->reduce_scatter(output, input); }
  void all_gather(View output, View input) override { inner_->all_gather(output, input); }
  void broadcast(View values, int64_t root) override { inner_->broadcast(values, root); }
  void send(View values, int64_t peer) override { inner_->send(values, peer); }
  void receive(View values, int64_t peer) override { inner_->receive(values, peer); }
  void exchange(std::span<const PointToPoint> transfers) override { inner_->exchange(transfers); }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<PendingCollective> start_reduce_scatter(
      View output, View input, std::span<const int64_t> counts) override {
    return inner_->start_reduce_scatter(output, input, counts);
  }
  std::unique_ptr<PendingCollective> start_all_gather(View output, View input,
                                                      std::span<const int64_t> counts) override {
    return inner_->start_all_gather(output, input, counts);
  }
  std::unique_ptr<Communicator> split(int64_t color, int64_t key, std::string name) override {
    return inner_->split(color, key, std::move(name));
  }

  std::vector<std::string> watched;

 private:
  std::unique_ptr<Communicator> inner_ = make_single_process_communicator("data parallel");
};

}  // namespace

TEST_CASE("each replayed graph is handed to the collectives' watchdog, eager steps are not") {
  // The collectives inside a graph were queued at capture, where no watchdog thread can ask
  // about them: after each replay the group watches the device's work so far instead (the NCCL
  // communicator records an event and watches it with --distributed-timeout-minutes).
  TinyTraining eager(step_arguments());
  // The model and the optimizer on one device, whose capture records them both (as the
  // trainer's; TinyTraining's optimizer has a device of its own).
  CpuDevice device;
  GptModel<float> model(eager.model.config(), device);
  model.init_parameters(eager.arguments.run.seed);
  std::vector<ParameterGroup> groups;
  for (const auto& tensor : model.tensors()) {
    groups.push_back({tensor.offset, tensor.numel, tensor.weight_decay});
  }
  AdamW optimizer(eager.optimizer.config(), groups, eager.optimizer.numel(), device);
  LearningRateScheduler scheduler(learning_rate_schedule(eager.arguments));
  const TrainStepOptions options = train_step_options(eager.arguments);
  StepGraphs graphs;
  graphs.warmup_steps = 1;
  WatchNotingGroup group;
  std::vector<std::vector<std::string>> watched_per_step;
  for (int64_t k = 0; k < 4; ++k) {
    const GlobalBatch batch{.first_sample = 4 * k, .global_batch_size = 4, .num_micro_batches = 2};
    group.watched.clear();
    QueuedStep step =
        queue_gradients(model, optimizer, eager.source(), batch, options, group, nullptr, &graphs);
    queue_update(step, model, optimizer, scheduler, options, group, nullptr, 1.0, &graphs);
    const StepExecution execution = step.execution;
    const TrainStepResult result = finish_step(step, model, optimizer, scheduler);
    CAPTURE(k);
    CHECK(execution == (k == 0 ? StepExecution::eager
                               : (k == 1 ? StepExecution::captured : StepExecution::replayed)));
    watched_per_step.push_back(group.watched);
    const TrainStepResult expected = eager.step(batch);
    CHECK(result.lm_loss == expected.lm_loss);
  }
  const std::vector<std::string> replayed = {"a replayed step's forward and backward",
                                             "a replayed step's update"};
  CHECK(watched_per_step[0].empty());
  CHECK(watched_per_step[1] == replayed);  // captured, then replayed once
  CHECK(watched_per_step[2] == replayed);
  CHECK(watched_per_step[3] == replayed);
  CHECK(std::ranges::equal(model.parameters(), eager.model.parameters()));
  // TinyTraining's optimizer, on a device other than its model's, is not captured: a capture
  // records one device's work, and the update would run at capture time instead.
  TinyTraining two_devices(step_arguments());
  StepGraphs refused;
  refused.warmup_steps = 0;
  const GlobalBatch batch{.first_sample = 0, .global_batch_size = 4, .num_micro_batches = 2};
  QueuedStep step = queue_gradients(two_devices.model, two_devices.optimizer, two_devices.source(),
                                    batch, options, group, nullptr, &refused);
  CHECK(step.execution == StepExecution::eager);
  CHECK(step.execution_note ==
        "the optimizer's state is on another device object than the model's");
}

TEST_CASE("the step reports the rate its update used — the scheduler moves on by the global batch") {
  auto a = step_arguments();
  a.optimizer.lr_decay_style = backend::LearningRateDecayStyle::linear;
  a.optimizer.lr_warmup_iters = 2;  // 0, 5e-4, then 1e-3
  TinyTraining training(a);
  CHECK(training.step(kFirstBatch).learning_rate == doctest::Approx(0.0));
  CHECK(training.step({.first_sample = 4, .global_batch_size = 4, .num_micro_batches = 2})
            .learning_rate == doctest::Approx(5e-4));
  CHECK(training.scheduler.num_steps() == 8);
  CHECK(training.scheduler.learning_rate() == doctest::Approx(1e-3));
}

TEST_CASE("every step starts from zero gradients") {
  auto a = step_arguments();
  a.optimizer.lr = 0;  // the parameters stay, so the same batch has the same gradients
  TinyTraining training(a);
  const double first = training.step(kFirstBatch).grad_norm;
  const double second = training.step(kFirstBatch).grad_norm;
  CHECK(first > 0);
  CHECK(second == first);
}

TEST_CASE("the reported norm is the one before clipping — the update sees the clipped gradients") {
  // Clipping is folded into AdamW's pass (the gradient buffer keeps the unclipped values), with
  // --log-num-zeros-in-grad too (its count multiplies by the factor as it reads): the update
  // AdamW makes from the clipped gradients.
  for (const bool count_zeros : {false, true}) {
    CAPTURE(count_zeros);
    auto a = step_arguments();
    a.optimizer.clip_grad = 1e-3;
    a.logging.log_num_zeros_in_grad = count_zeros;
    TinyTraining training(a);
    const std::vector<float> before(training.model.parameters().begin(),
                                    training.model.parameters().end());
    const TrainStepResult result = training.step(kFirstBatch);
    CHECK(result.grad_norm > 10 * a.optimizer.clip_grad);
    std::vector<float> clipped(training.model.gradients().begin(),
                               training.model.gradients().end());
    const double buffer_norm = global_gradient_norm(clipped);
    CHECK(buffer_norm == result.grad_norm);
    clip_gradients(clipped, buffer_norm, a.optimizer.clip_grad);
    AdamW reference = TinyTraining::optimizer_for(training.model, training.arguments);
    std::vector<float> expected = before;
    reference.step(expected, clipped, result.learning_rate, a.optimizer.weight_decay);
    CHECK(std::ranges::equal(training.model.parameters(), expected));
  }
}

TEST_CASE("a non-finite loss skips the step: parameters, optimizer and schedule unchanged") {
  TinyTraining training(step_arguments());
  const auto& norm = training.model.tensor("decoder.final_layernorm.weight");
  training.model.parameters()[static_cast<size_t>(norm.offset)] =
      std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> before(training.model.parameters().begin(),
                                  training.model.parameters().end());
  const TrainStepResult result = training.step(kFirstBatch);
  CHECK(result.skipped);
  CHECK_FALSE(std::isfinite(result.lm_loss));
  CHECK(result.learning_rate == doctest::Approx(1e-3));
  CHECK(training.optimizer.steps_taken() == 0);
  CHECK(training.scheduler.num_steps() == 0);
  CHECK(std::memcmp(before.data(), training.model.parameters().data(),
                    training.model.parameters().size_bytes()) == 0);
}

TEST_CASE("with a loss scaler, a power-of-two scale leaves the step's result unchanged") {
  // Scaling the backward by 2^16 and the gradients back by 2^-16 is exact in fp32 (nothing
  // here overflows or falls below the normal range), so the step is the unscaled step, bit for bit.
  TinyTraining plain(step_arguments());
  TinyTraining scaled(step_arguments());
  scaled.optimizer.set_loss_scaler(LossScaler::dynamic({.initial_scale = 65536.0,
                                                        .growth_interval = 2}));
  for (int64_t step = 0; step < 3; ++step) {
    const GlobalBatch batch{.first_sample = 4 * step, .global_batch_size = 4,
                            .num_micro_batches = 2};
    const TrainStepResult a = plain.step(batch);
    const TrainStepResult b = scaled.step(batch);
    CHECK(a.lm_loss == b.lm_loss);
    CHECK(a.grad_norm == b.grad_norm);
    CHECK(!b.skipped);
    CHECK(a.loss_scale == 1.0);
  }
  CHECK(scaled.optimizer.loss_scaler().scale() == 131072.0);  // grew once, after 2 clean steps
  CHECK(std::equal(plain.model.parameters().begin(), plain.model.parameters().end(),
                   scaled.model.parameters().begin()));
}

TEST_CASE("an overflowing scaled gradient skips the update and backs the scale off (fp16)") {
  // Word embeddings of 1e10 (tied to the output layer) make the scaled gradient of the final
  // norm's output about 2^122 · 1e10: infinite in fp32. The loss itself stays finite.
  TinyTraining training(step_arguments());
  for (float& value : training.model.parameters().subspan(
           static_cast<size_t>(training.model.tensor("embedding.word_embeddings.weight").offset),
           static_cast<size_t>(training.model.tensor("embedding.word_embeddings.weight").numel))) {
    value *= 5e11f;
  }
  const std::vector<float> before(training.model.parameters().begin(),
                                  training.model.parameters().end());
  training.optimizer.set_loss_scaler(
      LossScaler::dynamic({.initial_scale = 0x1p127, .hysteresis = 2}));
  const TrainStepResult first = training.step(kFirstBatch);
  CHECK(first.skipped);
  CHECK_FALSE(first.nan);  // an overflow is skipped, not a nan iteration (Megatron's counts)
  CHECK(std::isfinite(first.lm_loss));
  CHECK(first.loss_scale == 0x1p127);  // hysteresis 2: the first overflow spends a credit
  const TrainStepResult second = training.step(kFirstBatch);
  CHECK(second.skipped);
  CHECK(second.loss_scale == 0x1p126);  // the second halves the scale
  CHECK(training.optimizer.steps_taken() == 0);
  CHECK(training.scheduler.num_steps() == 0);
  CHECK(std::equal(before.begin(), before.end(), training.model.parameters().begin()));
  // Without the scale the same gradients are finite: the step updates.
  training.optimizer.set_loss_scaler(LossScaler::none());
  const TrainStepResult unscaled = training.step(kFirstBatch);
  CHECK_FALSE(unscaled.skipped);
  CHECK(training.optimizer.steps_taken() == 1);
}

TEST_CASE("--log-params-norm: the parameters' L2 norm after the update, and nothing without it") {
  TinyTraining plain(step_arguments());
  CHECK_FALSE(plain.step(kFirstBatch).params_norm.has_value());

  auto a = step_arguments();
  a.logging.log_params_norm = true;
  TinyTraining training(a);
  const std::vector<float> before(training.model.parameters().begin(),
                                  training.model.parameters().end());
  const TrainStepResult result = training.step(kFirstBatch);
  REQUIRE(result.params_norm.has_value());
  double squares = 0, squares_before = 0;
  for (const float value : training.model.parameters()) squares += double(value) * value;
  for (const float value : before) squares_before += double(value) * value;
  CHECK(*result.params_norm == doctest::Approx(std::sqrt(squares)).epsilon(1e-12));
  CHECK(*result.params_norm != doctest::Approx(std::sqrt(squares_before)).epsilon(1e-12));
}

TEST_CASE("--log-num-zeros-in-grad: the gradient's zeros, the unseen vocabulary rows among them") {
  TinyTraining plain(step_arguments());
  CHECK_FALSE(plain.step(kFirstBatch).num_zeros_in_grad.has_value());

  auto a = step_arguments();
  a.logging.log_num_zeros_in_grad = true;
  a.model.untie_embeddings_and_output_weights = true;  // unseen tokens' embedding rows get nothing
  TinyTraining training(a);
  const TrainStepResult result = training.step(kFirstBatch);
  REQUIRE(result.num_zeros_in_grad.has_value());
  int64_t zeros = 0;
  for (const float gradient : training.model.gradients()) zeros += gradient == 0.0f ? 1 : 0;
  CHECK(*result.num_zeros_in_grad == static_cast<double>(zeros));
  // The step's 4 samples of 16 tokens leave most of the 256 vocabulary rows unseen.
  std::vector<int32_t> tokens(4 * 16), labels(4 * 16);
  training.dataset.fill_batch(Split::train, 0, 4, tokens, labels);
  std::sort(tokens.begin(), tokens.end());
  const auto seen = std::unique(tokens.begin(), tokens.end()) - tokens.begin();
  const int64_t unseen_rows = training.model.config().padded_vocab_size - seen;
  CHECK(zeros >= unseen_rows * a.model.hidden_size);

  // Counted after clipping, as Megatron counts: a gradient the clipping factor takes below
  // float's smallest subnormal counts, the factor being the step's (max_norm / (norm + 1e-6),
  // rounded to float, as AdamW applies it).
  a.optimizer.clip_grad = 1e-37;
  TinyTraining clipped(a);
  const TrainStepResult clipped_result = clipped.step(kFirstBatch);
  REQUIRE(clipped_result.num_zeros_in_grad.has_value());
  const auto factor = static_cast<float>(1e-37 / (clipped_result.grad_norm + 1e-6));
  int64_t clipped_zeros = 0, unclipped_zeros = 0;
  for (const float gradient : clipped.model.gradients()) {
    clipped_zeros += gradient * factor == 0.0f ? 1 : 0;
    unclipped_zeros += gradient == 0.0f ? 1 : 0;
  }
  CHECK(*clipped_result.num_zeros_in_grad == static_cast<double>(clipped_zeros));
  CHECK(clipped_zeros > unclipped_zeros);
  CHECK(zeros < static_cast<int64_t>(training.model.gradients().size()));
}

namespace {

// The mock batches with a label ignored wherever the token is even in the first half of the
// global batch and wherever it is divisible by 5 in the second: micro batches with unequal
// numbers of scored positions.
BatchSource unevenly_masked(const TinyTraining& training) {
  return [&training](Split split, int64_t first, int64_t batch, std::span<int32_t> tokens,
                     std::span<int32_t> labels) {
    training.dataset.fill_batch(split, first, batch, tokens, labels);
    const int64_t per_sample = static_cast<int64_t>(tokens.size()) / batch;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int64_t sample = first + static_cast<int64_t>(i) / per_sample;
      if (tokens[i] % (sample < 2 ? 2 : 5) == 0) labels[i] = kIgnoredLabel;
    }
  };
}

}  // namespace

TEST_CASE("--calculate-per-token-loss: micro batches weigh by their scored tokens, as one batch") {
  // Two micro batches of two samples against one of four, the second and third sample's
  // positions ignored at different rates: with the per-token loss the step is the one batch's
  // (the mean over all its scored tokens); Megatron's default averages the two means instead.
  struct Run {
    TrainStepResult result;
    std::vector<float> gradients;
  };
  auto run = [](bool per_token, int64_t micro_batch_size) {
    auto a = step_arguments();
    a.data.calculate_per_token_loss = per_token;
    a.run.micro_batch_size = micro_batch_size;
    a.optimizer.clip_grad = 0;  // the gradients as they come
    TinyTraining training(a);
    const GlobalBatch batch{.first_sample = 0, .global_batch_size = 4,
                            .num_micro_batches = 4 / micro_batch_size};
    const TrainStepResult result =
        train_step(training.model, training.optimizer, training.scheduler,
                   unevenly_masked(training), batch, train_step_options(training.arguments));
    return Run{result, std::vector<float>(training.model.gradients().begin(),
                                          training.model.gradients().end())};
  };
  const Run one_batch = run(true, 4);
  const Run per_token = run(true, 2);
  const Run mean_of_means = run(false, 2);
  CHECK(run(false, 4).result.lm_loss == doctest::Approx(one_batch.result.lm_loss).epsilon(1e-6));
  CHECK(per_token.result.lm_loss == doctest::Approx(one_batch.result.lm_loss).epsilon(1e-6));
  CHECK(per_token.result.grad_norm == doctest::Approx(one_batch.result.grad_norm).epsilon(1e-5));
  double worst = 0, largest = 0;
  for (size_t i = 0; i < one_batch.gradients.size(); ++i) {
    worst = std::max(worst, std::abs(double(per_token.gradients[i]) - one_batch.gradients[i]));
    largest = std::max(largest, std::abs(double(one_batch.gradients[i])));
  }
  CHECK(worst <= 1e-5 * largest);
  // The default is another loss and another gradient when the counts differ.
  CHECK(std::abs(mean_of_means.result.lm_loss - one_batch.result.lm_loss) > 1e-4);
  CHECK(std::abs(mean_of_means.result.grad_norm - one_batch.result.grad_norm) >
        1e-4 * one_batch.result.grad_norm);
}
