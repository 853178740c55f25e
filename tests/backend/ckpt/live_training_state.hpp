// The model, optimizer and scheduler pretrain() builds from a run's arguments, in one process,
// and a few real training steps on mock data: the state the checkpoint tests save and load.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/data/mock_dataset.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/training_schedule.hpp"

namespace test_support {

struct LiveState {
  backend::GptModel<float> model;
  backend::AdamW optimizer;
  backend::LearningRateScheduler scheduler;

  static std::vector<backend::ParameterGroup> groups_for(const backend::GptModel<float>& model) {
    std::vector<backend::ParameterGroup> groups;
    for (const auto& t : model.tensors()) groups.push_back({t.offset, t.numel, t.weight_decay});
    return groups;
  }
  explicit LiveState(const backend::TrainingArguments& a, uint64_t init_seed = 1234)
      : model(backend::model_config(a)),
        optimizer({a.optimizer.adam_beta1, a.optimizer.adam_beta2, a.optimizer.adam_eps,
                   a.optimizer.weight_decay},
                  groups_for(model), static_cast<int64_t>(model.parameters().size())),
        scheduler(backend::learning_rate_schedule(a)) {
    model.init_parameters(init_seed);
    model.set_dropout_seed(a.run.seed);
  }

  // A few real training steps, so every piece of state is non-trivial.
  void train(const backend::TrainingArguments& a, int steps) {
    const backend::MockDataset data(a.run.seed, a.tokenizer.vocab_size + 1, a.model.seq_length);
    std::vector<int32_t> tokens(a.run.micro_batch_size * a.model.seq_length), labels(tokens.size());
    for (int step = 0; step < steps; ++step) {
      model.zero_gradients();
      data.fill_batch(backend::Split::train, step * a.run.micro_batch_size, a.run.micro_batch_size,
                      tokens, labels);
      model.forward(tokens, labels, a.run.micro_batch_size, a.model.seq_length);
      model.backward(1.0f);
      optimizer.step(model.parameters(), model.gradients(), scheduler.learning_rate());
      scheduler.step(a.run.global_batch_size);
    }
  }
};

}  // namespace test_support
