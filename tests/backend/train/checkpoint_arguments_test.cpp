// The arguments as checkpoints record them: the typed record a saved checkpoint holds comes
// back as the arguments it was made from (a missing field is an error naming it), and the
// save and load options carry each checkpoint flag to backend/ckpt.
#include "backend/train/checkpoint_arguments.hpp"

#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/common/error.hpp"
#include "backend/train/trainer.hpp"
#include "tests/backend/ckpt/checkpoint_test_arguments.hpp"
#include "tests/temporary_directory.hpp"

namespace {

using backend::TrainingArguments;

TrainingArguments saved_arguments(const std::filesystem::path& save) {
  return test_support::checkpoint_test_arguments(save);
}

}  // namespace

TEST_CASE("checkpoint arguments: the saved arguments come back as they were saved") {
  test_support::TemporaryDirectory directory;
  const auto arguments = saved_arguments(directory.path / "ckpt");
  {
    backend::GptModel<float> model(backend::model_config(arguments));
    backend::AdamW optimizer(backend::AdamWConfig{}, {}, static_cast<int64_t>(model.parameters().size()));
    backend::LearningRateScheduler scheduler({.max_lr = 1e-3, .decay_steps = 5});
    std::ostringstream log;
    backend::save_checkpoint(arguments, {.iteration = 5}, model, optimizer, scheduler, log);
  }
  const auto tracked = backend::read_checkpoint_tracker(directory.path / "ckpt");
  REQUIRE(tracked);
  const backend::CheckpointFileReader reader(tracked->file);
  const TrainingArguments back = backend::arguments_from_checkpoint(reader.metadata(), reader.path());
  CHECK(back.model.num_layers == arguments.model.num_layers);
  CHECK(back.model.ffn_hidden_size == arguments.model.ffn_hidden_size);
  CHECK(back.model.seq_length == arguments.model.seq_length);
  CHECK(back.tokenizer.tokenizer_type == arguments.tokenizer.tokenizer_type);
  CHECK(back.tokenizer.vocab_size == arguments.tokenizer.vocab_size);
  CHECK(back.model.make_vocab_size_divisible_by == arguments.model.make_vocab_size_divisible_by);
  CHECK(back.model.norm_epsilon == arguments.model.norm_epsilon);
  CHECK(back.model.init_method_std == arguments.model.init_method_std);
  CHECK(back.optimizer.lr == arguments.optimizer.lr);
  CHECK(back.run.train_iters == arguments.run.train_iters);
  CHECK(backend::checkpoint_arguments(back) == reader.metadata()["arguments"]);
  CHECK(reader.metadata()["arguments"]["use_rope_scaling"] == false);
  CHECK(reader.metadata()["arguments"]["rope_scaling_factor"] == 8.0);

  nlohmann::json metadata = reader.metadata();
  metadata["arguments"].erase("hidden_size");
  CHECK_THROWS_WITH_AS(backend::arguments_from_checkpoint(metadata, "model_optim_rng.bin"),
                       doctest::Contains("the metadata has no field 'hidden_size'"), common::Error);
  // An integer field takes integers only, within its type: nlohmann/json's own conversion
  // would cut 16.5 to 16 and turn 1e21 into undefined behaviour (found by
  // tests/fuzz/checkpoint_file_fuzzer.cpp).
  const std::string int64_range = "is not an integer from -9223372036854775808 to "
                                  "9223372036854775807";
  for (const auto& [value, shown] : std::vector<std::pair<nlohmann::json, std::string>>{
           {"sixteen", "\"sixteen\""},
           {16.5, "16.5"},
           {1e21, "1e+21"},
           {uint64_t{1} << 63, "9223372036854775808"}}) {
    metadata["arguments"]["hidden_size"] = value;
    const std::string expected = "checkpoint model_optim_rng.bin: metadata field 'hidden_size' " +
                                 int64_range + " (" + shown + ")";
    CHECK_THROWS_WITH_AS(backend::arguments_from_checkpoint(metadata, "model_optim_rng.bin"),
                         doctest::Contains(expected.c_str()), common::Error);
  }
  // Other types keep their message.
  metadata["arguments"]["hidden_size"] = 16;
  metadata["arguments"]["lr"] = "fast";
  CHECK_THROWS_WITH_AS(backend::arguments_from_checkpoint(metadata, "model_optim_rng.bin"),
                       doctest::Contains("metadata field 'lr' has the wrong type (\"fast\")"),
                       common::Error);
  // An enum-like setting is one of its names; another name is an error, not the default (a
  // record saying "BatchNorm" once gave a LayerNorm model).
  metadata["arguments"]["lr"] = 1e-3;
  metadata["arguments"]["normalization"] = "RMSNorm";
  CHECK(backend::arguments_from_checkpoint(metadata, "model_optim_rng.bin").model.normalization ==
        backend::Normalization::rms_norm);
  metadata["arguments"]["normalization"] = "BatchNorm";
  CHECK_THROWS_WITH_AS(backend::arguments_from_checkpoint(metadata, "model_optim_rng.bin"),
                       doctest::Contains("checkpoint model_optim_rng.bin: metadata field "
                                         "'normalization' names no setting this backend knows "
                                         "(\"BatchNorm\")"),
                       common::Error);
  metadata["arguments"]["normalization"] = "LayerNorm";
  metadata["arguments"]["position_embedding_type"] = 1;
  CHECK_THROWS_WITH_AS(backend::arguments_from_checkpoint(metadata, "model_optim_rng.bin"),
                       doctest::Contains("metadata field 'position_embedding_type' has the wrong "
                                         "type (1)"),
                       common::Error);
}

TEST_CASE("checkpoint arguments: the save and load options carry every checkpoint flag") {
  TrainingArguments a = saved_arguments("/runs/save");
  a.checkpointing.load = "/runs/load";
  a.command_line = {"pretrain_gpt", "--hidden-size", "16"};
  a.checkpointing.no_save_optim = true;
  a.checkpointing.finetune = true;
  a.checkpointing.no_load_rng = true;
  a.checkpointing.use_checkpoint_opt_param_scheduler = true;
  const backend::CheckpointSaveOptions save = backend::checkpoint_save_options(a);
  CHECK(save.directory == "/runs/save");
  CHECK(save.no_save_optim);
  CHECK_FALSE(save.no_save_rng);
  CHECK(save.arguments == backend::checkpoint_arguments(a));
  CHECK(save.args["hidden_size"] == "16");
  CHECK(save.args.size() == backend::argument_values(a).size());
  CHECK(save.command_line == a.command_line);

  const backend::CheckpointLoadOptions load = backend::checkpoint_load_options(a);
  CHECK(load.directory == "/runs/load");
  CHECK(load.finetune);
  CHECK_FALSE(load.no_load_optim);
  CHECK(load.no_load_rng);
  CHECK(load.use_checkpoint_opt_param_scheduler);
  CHECK_FALSE(load.override_opt_param_scheduler);
  CHECK(load.arguments == backend::checkpoint_arguments(a));
  CHECK(load.command_line == a.command_line);

  a.checkpointing.no_save_optim = false;
  a.checkpointing.no_save_rng = true;
  a.checkpointing.finetune = false;
  a.checkpointing.no_load_optim = true;
  a.checkpointing.no_load_rng = false;
  a.checkpointing.use_checkpoint_opt_param_scheduler = false;
  a.checkpointing.override_opt_param_scheduler = true;
  CHECK_FALSE(backend::checkpoint_save_options(a).no_save_optim);
  CHECK(backend::checkpoint_save_options(a).no_save_rng);
  const backend::CheckpointLoadOptions other = backend::checkpoint_load_options(a);
  CHECK_FALSE(other.finetune);
  CHECK(other.no_load_optim);
  CHECK_FALSE(other.no_load_rng);
  CHECK_FALSE(other.use_checkpoint_opt_param_scheduler);
  CHECK(other.override_opt_param_scheduler);
}

TEST_CASE("checkpoint arguments: a SentencePiece run records its --tokenizer-model") {
  test_support::TemporaryDirectory directory;
  auto arguments = saved_arguments(directory.path / "ckpt");
  arguments.tokenizer.tokenizer_type = "Llama2Tokenizer";
  arguments.tokenizer.vocab_size = 0;
  arguments.tokenizer.tokenizer_model =
      std::string(TEST_SOURCE_DIR) + "/tests/data/sentencepiece_bpe.model";
  const backend::GptConfig config = backend::model_config(arguments);
  CHECK(config.vocab_size == 500);  // the model's pieces
  CHECK(config.padded_vocab_size == 512);
  {
    backend::GptModel<float> model(config);
    backend::AdamW optimizer(backend::AdamWConfig{}, {}, static_cast<int64_t>(model.parameters().size()));
    backend::LearningRateScheduler scheduler({.max_lr = 1e-3, .decay_steps = 5});
    std::ostringstream log;
    backend::save_checkpoint(arguments, {.iteration = 5}, model, optimizer, scheduler, log);
  }
  const auto tracked = backend::read_checkpoint_tracker(directory.path / "ckpt");
  REQUIRE(tracked);
  const backend::CheckpointFileReader reader(tracked->file);
  TrainingArguments back = backend::arguments_from_checkpoint(reader.metadata(), reader.path());
  CHECK(back.tokenizer.tokenizer_type == "Llama2Tokenizer");
  CHECK(back.tokenizer.tokenizer_model == arguments.tokenizer.tokenizer_model);
  CHECK(backend::model_config(back).padded_vocab_size == 512);
  // Checkpoints of before the SentencePiece tokenizers have no such key: no model.
  auto metadata = reader.metadata();
  metadata["arguments"].erase("tokenizer_model");
  CHECK(backend::arguments_from_checkpoint(metadata, reader.path())
            .tokenizer.tokenizer_model.empty());
}

TEST_CASE("pretrain_gpt --use-checkpoint-args: the shape from --load, the dropouts from the flags") {
  // Megatron's Llama guide finetunes with --use-checkpoint-args and only the training flags.
  test_support::TemporaryDirectory directory;
  auto saved = saved_arguments(directory.path / "llama");
  saved.model.position_embedding_type = backend::PositionEmbeddingType::rope;
  saved.model.normalization = backend::Normalization::rms_norm;
  saved.model.swiglu = true;
  saved.model.add_bias_linear = false;
  saved.model.untie_embeddings_and_output_weights = true;
  saved.model.group_query_attention = true;
  saved.model.num_query_groups = 1;
  saved.model.use_rope_scaling = true;  // Llama 3.x: the scaling comes with the checkpoint too
  saved.model.rope_scaling_factor = 32;
  saved.model.hidden_dropout = saved.model.attention_dropout = 0;
  saved.data.mock_data = true;
  saved.logging.log_interval = 1;
  saved.evaluation.eval_iters = 0;
  saved.command_line = {"pretrain_gpt"};
  backend::validate_arguments(saved);
  std::ostringstream log;
  backend::pretrain(saved, log);

  auto parse = [](std::vector<std::string> words) {
    words.insert(words.begin(), {"pretrain_gpt", "--micro-batch-size", "1", "--global-batch-size",
                                 "2", "--train-iters", "3", "--lr", "1e-4", "--mock-data",
                                 "--finetune", "--no-load-optim", "--no-load-rng"});
    std::vector<const char*> argv;
    for (const auto& word : words) argv.push_back(word.c_str());
    return backend::parse_arguments(static_cast<int>(argv.size()), argv.data());
  };
  const auto a = parse(
      {"--use-checkpoint-args", "--load", saved.checkpointing.save, "--hidden-dropout", "0.2"});
  REQUIRE(a);
  CHECK(a->model.num_layers == 2);
  CHECK(a->model.hidden_size == 16);
  CHECK(a->model.ffn_hidden_size == 48);
  CHECK(a->model.seq_length == 8);
  CHECK(a->model.max_position_embeddings == 12);
  CHECK(a->model.position_embedding_type == backend::PositionEmbeddingType::rope);
  CHECK(a->model.normalization == backend::Normalization::rms_norm);
  CHECK(a->model.swiglu);
  CHECK_FALSE(a->model.add_bias_linear);
  CHECK(a->model.untie_embeddings_and_output_weights);
  CHECK(a->model.num_query_groups == 1);
  CHECK(a->model.use_rope_scaling);
  CHECK(a->model.rope_scaling_factor == 32);
  CHECK(a->tokenizer.vocab_size == 40);
  // Training follows its own dropout flags (Megatron's defaults where not given).
  CHECK(a->model.hidden_dropout == doctest::Approx(0.2));
  CHECK(a->model.attention_dropout == doctest::Approx(0.1));
  // And it trains from those weights.
  std::ostringstream finetuned;
  const auto result = backend::pretrain(*a, finetuned);
  CHECK(result.iterations.size() == 3);
  CHECK(finetuned.str().find(" loading checkpoint from " + saved.checkpointing.save) !=
        std::string::npos);

  // A --load with nothing in it yet (the first run of a job that resumes from its own --save):
  // Megatron's line, and the flags describe the model, which must then be given.
  const std::string empty = (directory.path / "empty").string();
  const auto fresh = parse({"--use-checkpoint-args", "--load", empty, "--num-layers", "2",
                            "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length",
                            "8", "--vocab-size", "40"});
  REQUIRE(fresh);
  CHECK(fresh->model.num_layers == 2);
  const std::string missing_flags =
      "--use-checkpoint-args: --load " + empty + " holds no checkpoint yet (" + empty +
      "/latest_checkpointed_iteration.txt is missing), so the model flags must describe the "
      "model: --hidden-size, --num-attention-heads, --seq-length not given";
  CHECK_THROWS_WITH_AS(parse({"--use-checkpoint-args", "--load", empty, "--num-layers", "2"}),
                       doctest::Contains(missing_flags.c_str()), common::Error);
}
