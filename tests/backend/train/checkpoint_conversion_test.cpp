// Checkpoint ↔ model for checkpoint_util: a trained checkpoint's weights come back bit for bit
// in the model its saved arguments describe; arguments_for_model is the inverse of
// model_config; release checkpoints load as weights only; and the whole chain checkpoint →
// Hugging Face → release checkpoint → pretrain_gpt's load keeps every bit.
#include "backend/train/checkpoint_conversion.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/hf_format.hpp"
#include "backend/common/error.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/trainer.hpp"
#include "tests/temporary_directory.hpp"

namespace {

using backend::GptConfig;
using backend::GptModel;
using backend::TrainingArguments;
using test_support::TemporaryDirectory;

TrainingArguments conversion_arguments(const std::filesystem::path& save) {
  TrainingArguments a;
  a.num_layers = 2;
  a.hidden_size = 16;
  a.ffn_hidden_size = 48;
  a.num_attention_heads = 2;
  a.seq_length = 8;
  a.max_position_embeddings = 12;
  a.tokenizer_type = "NullTokenizer";
  a.vocab_size = 40;
  a.make_vocab_size_divisible_by = 32;  // 41 tokens → 64 rows
  a.norm_epsilon = 1e-6;
  a.init_method_std = 0.03;
  a.hidden_dropout = 0.0;
  a.attention_dropout = 0.0;
  a.micro_batch_size = 1;
  a.global_batch_size = 1;
  a.train_iters = 5;
  a.lr = 1e-3;
  a.save = save.string();
  return a;
}

// A model with the arguments' shape, its weights moved away from the initialisation by a few
// optimizer steps' worth of noise, saved at iteration 5 with its optimizer state.
GptModel<float> save_trained_checkpoint(const TrainingArguments& arguments) {
  GptModel<float> model(backend::model_config(arguments));
  model.init_parameters(11);
  auto parameters = model.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) parameters[i] += 1e-3f * static_cast<float>(i % 7);
  backend::AdamW optimizer(backend::AdamWConfig{}, {}, static_cast<int64_t>(parameters.size()));
  backend::LearningRateScheduler scheduler({.max_lr = 1e-3, .decay_steps = 5});
  std::ostringstream log;
  backend::save_checkpoint(arguments, {.iteration = 5, .consumed_train_samples = 5,
                                       .consumed_valid_samples = 0},
                           model, optimizer, scheduler, log);
  return model;
}

void check_same_config(const GptConfig& a, const GptConfig& b) {
  CHECK(a.num_layers == b.num_layers);
  CHECK(a.hidden_size == b.hidden_size);
  CHECK(a.num_attention_heads == b.num_attention_heads);
  CHECK(a.ffn_hidden_size == b.ffn_hidden_size);
  CHECK(a.max_position_embeddings == b.max_position_embeddings);
  CHECK(a.vocab_size == b.vocab_size);
  CHECK(a.padded_vocab_size == b.padded_vocab_size);
  CHECK(a.layernorm_epsilon == b.layernorm_epsilon);
  CHECK(a.init_method_std == b.init_method_std);
  CHECK(a.hidden_dropout == b.hidden_dropout);
  CHECK(a.attention_dropout == b.attention_dropout);
  CHECK(a.position_embedding_type == b.position_embedding_type);
  CHECK(a.rotary_base == b.rotary_base);
  CHECK(a.rotary_percent == b.rotary_percent);
  CHECK(a.normalization == b.normalization);
  CHECK(a.swiglu == b.swiglu);
  CHECK(a.add_bias_linear == b.add_bias_linear);
  CHECK(a.share_embeddings_and_output_weights == b.share_embeddings_and_output_weights);
  CHECK(a.query_groups() == b.query_groups());
}

// The Llama switches on top of conversion_arguments (multi-query attention: one key/value head).
void make_llama(TrainingArguments& a) {
  a.position_embedding_type = "rope";
  a.rotary_base = 20000;
  a.normalization = "RMSNorm";
  a.swiglu = true;
  a.add_bias_linear = false;
  a.untie_embeddings_and_output_weights = true;
  a.group_query_attention = true;
  a.num_query_groups = 1;
}

bool same_parameters(const GptModel<float>& a, const GptModel<float>& b) {
  return a.parameters().size() == b.parameters().size() &&
         std::equal(a.parameters().begin(), a.parameters().end(), b.parameters().begin());
}

}  // namespace

TEST_CASE("checkpoint conversion: a checkpoint's weights load into the model its arguments describe") {
  TemporaryDirectory directory;
  auto arguments = conversion_arguments(directory.path / "ckpt");
  SUBCASE("GPT") {}
  SUBCASE("Llama") { make_llama(arguments); }
  const auto saved = save_trained_checkpoint(arguments);
  std::ostringstream log;
  const auto loaded = backend::load_checkpoint_weights(directory.path / "ckpt", log);
  check_same_config(loaded.config(), saved.config());
  CHECK(same_parameters(loaded, saved));
  CHECK(log.str().find("loading checkpoint from") != std::string::npos);

  CHECK_THROWS_WITH_AS(backend::load_checkpoint_weights(directory.path / "absent", log),
                       doctest::Contains("holds no checkpoint"), common::Error);
  // The tracker names an iteration that is not there.
  std::ofstream(directory.path / "ckpt" / "latest_checkpointed_iteration.txt") << "7";
  CHECK_THROWS_WITH_AS(backend::load_checkpoint_weights(directory.path / "ckpt", log),
                       doctest::Contains("iter_0000007"), common::Error);
}

TEST_CASE("checkpoint conversion: arguments_for_model rebuilds the model it was given") {
  struct Vocabulary {
    int64_t tokens, padded;
    const char* tokenizer;
    int64_t divisible_by;
  };
  for (const Vocabulary v : {Vocabulary{50257, 50304, "GPT2BPETokenizer", 128},
                             Vocabulary{50257, 50257, "GPT2BPETokenizer", 1},  // a Hub GPT-2
                             Vocabulary{100, 128, "NullTokenizer", 128},
                             Vocabulary{32000, 32000, "NullTokenizer", 128},
                             Vocabulary{100, 112, "NullTokenizer", 16},
                             Vocabulary{100, 300, "NullTokenizer", 300}}) {
    CAPTURE(v.tokens);
    CAPTURE(v.padded);
    GptConfig config;
    config.num_layers = 3;
    config.hidden_size = 24;
    config.num_attention_heads = 3;
    config.ffn_hidden_size = 40;
    config.max_position_embeddings = 20;
    config.vocab_size = v.tokens;
    config.padded_vocab_size = v.padded;
    config.layernorm_epsilon = 1e-6;
    config.init_method_std = 0.01;
    config.hidden_dropout = 0.1;
    const TrainingArguments arguments = backend::arguments_for_model(config);
    CHECK(arguments.tokenizer_type == v.tokenizer);
    CHECK(arguments.make_vocab_size_divisible_by == v.divisible_by);
    check_same_config(backend::model_config(arguments), config);
  }
  // The Llama switches, grouped-query attention and a partial rotation come back too.
  GptConfig llama;
  llama.num_layers = 2;
  llama.hidden_size = 32;
  llama.num_attention_heads = 4;
  llama.num_query_groups = 2;
  llama.ffn_hidden_size = 64;
  llama.max_position_embeddings = 16;
  llama.vocab_size = 100;
  llama.padded_vocab_size = 128;
  llama.position_embedding_type = backend::PositionEmbeddingType::rope;
  llama.rotary_base = 500000;
  llama.rotary_percent = 0.5;
  llama.normalization = backend::Normalization::rms_norm;
  llama.swiglu = true;
  llama.add_bias_linear = false;
  llama.share_embeddings_and_output_weights = false;
  check_same_config(backend::model_config(backend::arguments_for_model(llama)), llama);

  GptConfig single;
  single.vocab_size = 1;
  single.padded_vocab_size = 8;
  CHECK_THROWS_WITH_AS(backend::arguments_for_model(single),
                       doctest::Contains("a vocabulary of 1 token(s) has no pretrain_gpt tokenizer"),
                       common::Error);
}

TEST_CASE("checkpoint conversion: checkpoint → Hugging Face → release checkpoint keeps every bit") {
  TemporaryDirectory directory;
  auto arguments = conversion_arguments(directory.path / "ckpt");
  SUBCASE("GPT") {}
  SUBCASE("Llama") { make_llama(arguments); }
  const auto trained = save_trained_checkpoint(arguments);
  std::ostringstream log;
  backend::export_hf(directory.path / "hf", backend::load_checkpoint_weights(directory.path / "ckpt", log));

  const auto imported = backend::import_hf(directory.path / "hf");
  TrainingArguments release_arguments = backend::arguments_for_model(imported.config());
  release_arguments.save = (directory.path / "release_ckpt").string();
  release_arguments.no_save_optim = true;
  release_arguments.no_save_rng = true;
  backend::save_release_checkpoint(release_arguments, imported, log);
  std::ifstream tracker(directory.path / "release_ckpt" / "latest_checkpointed_iteration.txt");
  std::string tracker_text;
  tracker >> tracker_text;
  CHECK(tracker_text == "release");
  CHECK(std::filesystem::is_regular_file(directory.path / "release_ckpt" / "release" / "mp_rank_00" /
                                         "model_optim_rng.bin"));

  // pretrain_gpt's own load path, with the flags arguments_for_model gives and a training
  // run's settings: weights only, from iteration 0, no optimizer state asked for.
  TrainingArguments training = release_arguments;
  training.load = release_arguments.save;
  training.seq_length = 8;
  training.micro_batch_size = 1;
  training.global_batch_size = 1;
  training.train_iters = 2;
  training.lr = 1e-3;
  GptModel<float> model(backend::model_config(training));
  backend::AdamW optimizer(backend::AdamWConfig{}, {}, static_cast<int64_t>(model.parameters().size()));
  backend::LearningRateScheduler scheduler({.max_lr = 1e-3, .decay_steps = 2});
  const auto progress = backend::load_checkpoint(training, model, optimizer, scheduler, log);
  REQUIRE(progress);
  CHECK(progress->iteration == 0);
  CHECK(log.str().find("loading release checkpoint from") != std::string::npos);
  check_same_config(model.config(), trained.config());
  CHECK(same_parameters(model, trained));
}
