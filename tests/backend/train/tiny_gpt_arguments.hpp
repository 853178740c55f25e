// The tiny GPT the backend's training tests train: 2 layers, hidden 32, 4 heads, sequence 16,
// micro batch 2 of global batch 4, lr 1e-3, the NullTokenizer's 255 ids (+ EOD: 256 rows) over
// mock data, no dropout, every iteration logged, no evaluation. Not validated: a test sets what
// it is about, then calls validate_arguments as pretrain_gpt's parser would, so Megatron's
// derived defaults (--lr-decay-iters from --train-iters, ...) follow its settings.
#pragma once

#include <cstdint>

#include "backend/train/arguments.hpp"

namespace test_support {

inline backend::TrainingArguments tiny_gpt_arguments(int64_t train_iters) {
  backend::TrainingArguments a;
  a.model.num_layers = 2;
  a.model.hidden_size = 32;
  a.model.num_attention_heads = 4;
  a.model.seq_length = 16;
  a.run.micro_batch_size = 2;
  a.run.global_batch_size = 4;
  a.run.train_iters = train_iters;
  a.optimizer.lr = 1e-3;
  a.tokenizer.vocab_size = 255;
  a.tokenizer.tokenizer_type = "NullTokenizer";
  a.data.mock_data = true;
  a.model.hidden_dropout = a.model.attention_dropout = 0;
  a.logging.log_interval = 1;
  a.evaluation.eval_iters = 0;
  return a;
}

// The tiny GPT with what a resumed run must restore to match an uninterrupted one: dropout on
// and a cosine schedule with two iterations of warm-up. Not validated, as above.
inline backend::TrainingArguments resumable_gpt_arguments(int64_t train_iters) {
  backend::TrainingArguments a = tiny_gpt_arguments(train_iters);
  a.optimizer.lr_warmup_iters = 2;
  a.optimizer.lr_decay_style = backend::LearningRateDecayStyle::cosine;
  a.model.hidden_dropout = a.model.attention_dropout = 0.1;
  a.command_line = {"pretrain_gpt"};
  return a;
}

}  // namespace test_support
