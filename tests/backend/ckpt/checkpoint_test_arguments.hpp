// The arguments of the small GPT that the checkpoint tests save, load, reshard and convert: two
// layers, hidden size 16, FFN 48, two heads, sequences of 8 (12 positions), the NullTokenizer's
// 40 tokens padded to 64 rows, one sample a step, 5 iterations at lr 1e-3, saving into `save`.
// A test changes what it needs on the copy it gets.
#pragma once

#include <filesystem>

#include "backend/train/arguments.hpp"

namespace test_support {

inline backend::TrainingArguments checkpoint_test_arguments(const std::filesystem::path& save) {
  backend::TrainingArguments a;
  a.model.num_layers = 2;
  a.model.hidden_size = 16;
  a.model.ffn_hidden_size = 48;
  a.model.num_attention_heads = 2;
  a.model.seq_length = 8;
  a.model.max_position_embeddings = 12;
  a.tokenizer.tokenizer_type = "NullTokenizer";
  a.tokenizer.vocab_size = 40;
  a.model.make_vocab_size_divisible_by = 32;  // 41 tokens → 64 rows
  a.model.norm_epsilon = 1e-6;
  a.model.init_method_std = 0.03;
  a.run.micro_batch_size = 1;
  a.run.global_batch_size = 1;
  a.run.train_iters = 5;
  a.optimizer.lr = 1e-3;
  a.checkpointing.save = save.string();
  return a;
}

}  // namespace test_support
