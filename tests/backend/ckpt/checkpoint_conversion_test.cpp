// Checkpoint ↔ model for checkpoint_util: a trained checkpoint's weights come back bit for bit
// in the model its saved arguments describe; arguments_for_model is the inverse of
// model_config; release checkpoints load as weights only; and the whole chain checkpoint →
// Hugging Face → release checkpoint → pretrain_gpt's load keeps every bit.
#include "backend/ckpt/checkpoint_conversion.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/hf_format.hpp"
#include "backend/common/error.hpp"
#include "backend/data/compressed_input.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/trainer.hpp"
#include "tests/backend/ckpt/checkpoint_test_arguments.hpp"
#include "tests/temporary_directory.hpp"
#include "tests/test_files.hpp"

namespace {

using backend::GptConfig;
using backend::GptModel;
using backend::TrainingArguments;
using test_support::TemporaryDirectory;

TrainingArguments conversion_arguments(const std::filesystem::path& save) {
  TrainingArguments a = test_support::checkpoint_test_arguments(save);
  a.model.hidden_dropout = 0.0;
  a.model.attention_dropout = 0.0;
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
  backend::save_checkpoint(
      arguments, {.iteration = 5, .consumed_train_samples = 5, .consumed_valid_samples = 0}, model,
      optimizer, scheduler, log);
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
  a.model.position_embedding_type = backend::PositionEmbeddingType::rope;
  a.model.rotary_base = 20000;
  a.model.normalization = backend::Normalization::rms_norm;
  a.model.swiglu = true;
  a.model.add_bias_linear = false;
  a.model.untie_embeddings_and_output_weights = true;
  a.model.group_query_attention = true;
  a.model.num_query_groups = 1;
}

bool same_parameters(const GptModel<float>& a, const GptModel<float>& b) {
  return a.parameters().size() == b.parameters().size() &&
         std::equal(a.parameters().begin(), a.parameters().end(), b.parameters().begin());
}

}  // namespace

TEST_CASE(
    "checkpoint conversion: a checkpoint's weights load into the model its arguments describe") {
  TemporaryDirectory directory;
  auto arguments = conversion_arguments(directory.path / "ckpt");
  SUBCASE("GPT") {}
  SUBCASE("Llama") {
    make_llama(arguments);
  }
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
  for (const Vocabulary v :
       {Vocabulary{50257, 50304, "GPT2BPETokenizer", 128},
        Vocabulary{50257, 50257, "GPT2BPETokenizer", 1},  // a Hub GPT-2
        Vocabulary{100, 128, "NullTokenizer", 128}, Vocabulary{32000, 32000, "NullTokenizer", 128},
        Vocabulary{100, 112, "NullTokenizer", 16}, Vocabulary{100, 300, "NullTokenizer", 300}}) {
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
    const backend::CheckpointModelRecord arguments = backend::arguments_for_model(config);
    CHECK(arguments.tokenizer.tokenizer_type == v.tokenizer);
    CHECK(arguments.model.make_vocab_size_divisible_by == v.divisible_by);
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
  CHECK_THROWS_WITH_AS(
      backend::arguments_for_model(single),
      doctest::Contains("a vocabulary of 1 token(s) has no pretrain_gpt tokenizer"), common::Error);
}

TEST_CASE("checkpoint conversion: checkpoint → Hugging Face → release checkpoint keeps every bit") {
  TemporaryDirectory directory;
  auto arguments = conversion_arguments(directory.path / "ckpt");
  SUBCASE("GPT") {}
  SUBCASE("Llama") {
    make_llama(arguments);
  }
  const auto trained = save_trained_checkpoint(arguments);
  std::ostringstream log;
  backend::export_hf(directory.path / "hf",
                     backend::load_checkpoint_weights(directory.path / "ckpt", log));

  const auto imported = backend::import_hf(directory.path / "hf");
  TrainingArguments release_arguments =
      backend::arguments_with_model(backend::arguments_for_model(imported.config()));
  release_arguments.checkpointing.save = (directory.path / "release_ckpt").string();
  release_arguments.checkpointing.no_save_optim = true;
  release_arguments.checkpointing.no_save_rng = true;
  backend::save_release_checkpoint(release_arguments, imported, log);
  std::ifstream tracker(directory.path / "release_ckpt" / "latest_checkpointed_iteration.txt");
  std::string tracker_text;
  tracker >> tracker_text;
  CHECK(tracker_text == "release");
  CHECK(std::filesystem::is_regular_file(directory.path / "release_ckpt" / "release" /
                                         "mp_rank_00" / "model_optim_rng.bin"));

  // pretrain_gpt's own load path, with the flags arguments_for_model gives and a training
  // run's settings: weights only, from iteration 0, no optimizer state asked for.
  TrainingArguments training = release_arguments;
  training.checkpointing.load = release_arguments.checkpointing.save;
  training.model.seq_length = 8;
  training.run.micro_batch_size = 1;
  training.run.global_batch_size = 1;
  training.run.train_iters = 2;
  training.optimizer.lr = 1e-3;
  GptModel<float> model(backend::model_config(training));
  backend::AdamW optimizer(backend::AdamWConfig{}, {},
                           static_cast<int64_t>(model.parameters().size()));
  backend::LearningRateScheduler scheduler({.max_lr = 1e-3, .decay_steps = 2});
  const auto progress = backend::load_checkpoint(training, model, optimizer, scheduler, log);
  REQUIRE(progress);
  CHECK(progress->iteration == 0);
  CHECK(log.str().find("loading release checkpoint from") != std::string::npos);
  check_same_config(model.config(), trained.config());
  CHECK(same_parameters(model, trained));
}

TEST_CASE("checkpoint conversion: an imported directory's tokenizer is recorded when it fits") {
  namespace fs = std::filesystem;
  TemporaryDirectory directory;
  const fs::path hf = directory.path / "hf";
  fs::create_directories(hf);
  GptConfig config;
  config.vocab_size = 500;  // the SentencePiece model's ids
  config.padded_vocab_size = 512;
  const backend::CheckpointModelRecord imported = backend::arguments_for_model(config);
  REQUIRE(imported.tokenizer.tokenizer_type == "NullTokenizer");

  // Nothing to record: the note says so and the NullTokenizer stays.
  auto nothing = imported;
  CHECK(backend::record_hf_tokenizer(nothing, hf, 500)
            .find("neither tokenizer.model nor "
                  "tokenizer.json") != std::string::npos);
  CHECK(nothing.tokenizer.tokenizer_type == "NullTokenizer");

  // Llama 2's layout: tokenizer.model, SentencePiece, as Llama2Tokenizer.
  fs::copy_file(test_support::kTestData + "/sentencepiece_bpe.model", hf / "tokenizer.model");
  auto llama2 = imported;
  const std::string recorded = backend::record_hf_tokenizer(llama2, hf, 500);
  CHECK(recorded.find("--tokenizer-type Llama2Tokenizer") != std::string::npos);
  CHECK(llama2.tokenizer.tokenizer_type == "Llama2Tokenizer");
  CHECK(llama2.tokenizer.tokenizer_model == fs::absolute(hf / "tokenizer.model").string());
  // The model it describes is the imported one.
  CHECK(backend::model_config(llama2).padded_vocab_size == 512);

  // Another vocabulary size: not this model's tokenizer.
  auto other = imported;
  CHECK(backend::record_hf_tokenizer(other, hf, 501)
            .find("has 500 ids and the model's "
                  "vocabulary 501 rows") != std::string::npos);
  CHECK(other.tokenizer.tokenizer_type == "NullTokenizer");

  // A file the tokenizer cannot read: a note, not a failed import.
  std::ofstream(hf / "tokenizer.model", std::ios::trunc) << "not a model";
  auto unreadable = imported;
  CHECK(backend::record_hf_tokenizer(unreadable, hf, 500).find("not recorded") !=
        std::string::npos);
  CHECK(unreadable.tokenizer.tokenizer_type == "NullTokenizer");

  // Llama 3's layout: tokenizer.json alone, as HuggingFaceTokenizer of the directory.
  const fs::path llama3 = directory.path / "llama3";
  fs::create_directories(llama3);
  {
    backend::CompressedInput input(test_support::kTestData + "/llama3/tokenizer.json.xz");
    std::ofstream out(llama3 / "tokenizer.json", std::ios::binary);
    std::vector<char> buffer(1 << 20);
    while (const size_t n = input.read(buffer.data(), buffer.size())) {
      out.write(buffer.data(), static_cast<std::streamsize>(n));
    }
  }
  fs::copy_file(test_support::kTestData + "/llama3/tokenizer_config.json",
                llama3 / "tokenizer_config.json");
  GptConfig llama3_config;
  llama3_config.vocab_size = 128256;
  llama3_config.padded_vocab_size = 128256;
  auto llama3_arguments = backend::arguments_for_model(llama3_config);
  CHECK(backend::record_hf_tokenizer(llama3_arguments, llama3, 128256)
            .find("--tokenizer-type HuggingFaceTokenizer") != std::string::npos);
  CHECK(llama3_arguments.tokenizer.tokenizer_type == "HuggingFaceTokenizer");
  CHECK(llama3_arguments.tokenizer.tokenizer_model == fs::absolute(llama3).string());
  CHECK(backend::model_config(llama3_arguments).padded_vocab_size == 128256);

  // GPT-2's size keeps GPT2BPETokenizer.
  GptConfig gpt2;
  gpt2.vocab_size = 50257;
  gpt2.padded_vocab_size = 50304;
  auto gpt2_arguments = backend::arguments_for_model(gpt2);
  backend::record_hf_tokenizer(gpt2_arguments, hf, 50257);
  CHECK(gpt2_arguments.tokenizer.tokenizer_type == "GPT2BPETokenizer");
}
