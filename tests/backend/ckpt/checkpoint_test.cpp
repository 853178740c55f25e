// Checkpoints end to end in one process: Megatron's layout and messages, an exact round trip
// of every piece of state, validation of what is loaded (shapes with the table and the fitting
// flags, corruption, missing optimizer/RNG state, a changed schedule), the --finetune /
// --no-load-* semantics, the clean-up of interrupted saves, and the property it all exists
// for: a run interrupted at iteration N and resumed computes the same losses and weights, bit
// for bit, as one that never stopped, dropout included. Most cases go through pretrain_gpt's
// arguments (backend/train/checkpoint_arguments.hpp); one uses the plain options alone.
#include "backend/ckpt/checkpoint.hpp"

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/nemo_config_keys.hpp"
#include "backend/data/mock_dataset.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/trainer.hpp"
#include "backend/train/training_schedule.hpp"
#include "temporary_directory.hpp"
#include "tests/backend/ckpt/live_training_state.hpp"
#include "tests/backend/train/tiny_gpt_arguments.hpp"

using namespace backend;
namespace fs = std::filesystem;

namespace {

// Dropout on and a cosine schedule with warm-up: resume must restore the RNG and the schedule.
TrainingArguments resumable_arguments() {
  TrainingArguments a = test_support::resumable_gpt_arguments(8);
  validate_arguments(a);
  return a;
}

// The same run with Llama's layer: RoPE, RMSNorm, SwiGLU, no biases.
TrainingArguments resumable_llama_arguments() {
  TrainingArguments a = resumable_arguments();
  a.model.position_embedding_type = backend::PositionEmbeddingType::rope;
  a.model.normalization = backend::Normalization::rms_norm;
  a.model.swiglu = true;
  a.model.add_bias_linear = false;
  return a;
}

using test_support::LiveState;

bool same_bytes(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string load_error(const TrainingArguments& a) {
  LiveState state(a);
  std::ostringstream log;
  try {
    load_checkpoint(a, state.model, state.optimizer, state.scheduler, log);
  } catch (const common::Error& error) {
    return error.what();
  }
  return "";
}

// Saves a trained tiny model to `directory` at `iteration`; returns its arguments.
TrainingArguments save_trained(const fs::path& directory, int64_t iteration = 3,
                               TrainingArguments a = resumable_arguments()) {
  a.checkpointing.save = directory.string();
  LiveState state(a);
  state.train(a, 3);
  std::ostringstream log;
  save_checkpoint(a, {iteration, 4 * iteration, 8}, state.model, state.optimizer, state.scheduler, log);
  return a;
}

pid_t finished_process_id() {
  std::fflush(nullptr);  // the child must not repeat buffered output
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

TrainingResult train(TrainingArguments a, std::ostream& log) { return pretrain(a, log); }

}  // namespace

TEST_CASE("save then load restores parameters, optimizer, scheduler and RNG state exactly") {
  test_support::TemporaryDirectory directory;
  auto a = resumable_arguments();
  a.checkpointing.save = a.checkpointing.load = directory.path.string();
  LiveState saved(a);
  saved.train(a, 3);
  saved.model.set_dropout_seed(987654321987654321ull);  // a seed beyond 2^53 survives JSON
  std::ostringstream log;
  save_checkpoint(a, {3, 12, 8}, saved.model, saved.optimizer, saved.scheduler, log);

  LiveState loaded(a, /*init_seed=*/99);
  REQUIRE_FALSE(same_bytes(loaded.model.parameters(), saved.model.parameters()));
  const auto progress = load_checkpoint(a, loaded.model, loaded.optimizer, loaded.scheduler, log);
  REQUIRE(progress.has_value());
  CHECK(progress->iteration == 3);
  CHECK(progress->consumed_train_samples == 12);
  CHECK(progress->consumed_valid_samples == 8);
  CHECK(same_bytes(loaded.model.parameters(), saved.model.parameters()));
  CHECK(same_bytes(loaded.optimizer.exp_avg(), saved.optimizer.exp_avg()));
  CHECK(same_bytes(loaded.optimizer.exp_avg_sq(), saved.optimizer.exp_avg_sq()));
  CHECK(loaded.optimizer.steps_taken() == 3);
  CHECK(loaded.scheduler.num_steps() == saved.scheduler.num_steps());
  CHECK(loaded.scheduler.learning_rate() == saved.scheduler.learning_rate());
  CHECK(loaded.model.dropout_step() == saved.model.dropout_step());
  CHECK(loaded.model.dropout_step() == 3);
  CHECK(loaded.model.dropout_seed() == 987654321987654321ull);
}

TEST_CASE("Megatron's layout, tracker and messages") {
  test_support::TemporaryDirectory directory;
  const fs::path dir = directory.path / "checkpoints";  // created by the save
  auto a = resumable_arguments();
  a.checkpointing.save = a.checkpointing.load = dir.string();
  LiveState state(a);
  std::ostringstream save_log;
  save_checkpoint(a, {500, 2000, 0}, state.model, state.optimizer, state.scheduler, save_log);
  CHECK(read_text(dir / "latest_checkpointed_iteration.txt") == "500");  // as Megatron writes it
  CHECK(fs::is_regular_file(dir / "iter_0000500" / "mp_rank_00" / "model_optim_rng.bin"));
  CHECK(checkpoint_file_path(dir, 500) == dir / "iter_0000500/mp_rank_00/model_optim_rng.bin");
  // Nothing else: no temporary left behind.
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++entries;
  CHECK(entries == 2);
  const std::string text = save_log.str();
  const std::regex saving(R"(^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] saving checkpoint at iteration     500 to (.*) in native format$)");
  const std::regex saved(R"(^  \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] successfully saved checkpoint from iteration     500 to (.*) \[ t 1/1, p 1/1 \]$)");
  std::istringstream lines(text);
  std::string first, second;
  std::getline(lines, first);
  std::getline(lines, second);
  std::smatch match;
  REQUIRE_MESSAGE(std::regex_match(first, match, saving), first);
  CHECK(match[1] == dir.string());
  REQUIRE_MESSAGE(std::regex_match(second, match, saved), second);
  CHECK(match[1] == dir.string());

  std::ostringstream load_log;
  LiveState loaded(a);
  load_checkpoint(a, loaded.model, loaded.optimizer, loaded.scheduler, load_log);
  CHECK(load_log.str() ==
        " loading checkpoint from " + dir.string() + " at iteration 500\n"
        "  successfully loaded checkpoint from " + dir.string() + " [ t 1/1, p 1/1 ] at iteration 500\n");

  // The metadata records the iteration, the samples and the arguments (typed and the dump).
  const CheckpointFileReader reader(checkpoint_file_path(dir, 500));
  CHECK(reader.metadata()["iteration"] == 500);
  CHECK(reader.metadata()["consumed_train_samples"] == 2000);
  CHECK(reader.metadata()["arguments"]["hidden_size"] == 32);
  CHECK(reader.metadata()["args"]["hidden_size"] == "32");
  CHECK(reader.metadata()["opt_param_scheduler"]["num_steps"] == 0);
  CHECK(reader.metadata()["rng_state"]["dropout_step"] == 0);
  // Every parameter by its Megatron name, and both AdamW moments of each.
  CHECK(reader.tensors().size() == 3 * state.model.tensors().size());
  CHECK(reader.find("decoder.layers.1.mlp.linear_fc2.weight") != nullptr);
  CHECK(reader.find("optimizer.exp_avg_sq.embedding.word_embeddings.weight") != nullptr);
  CHECK(reader.metadata()["pipeline_parallel"]["size"] == 1);
}

TEST_CASE("a pipelined checkpoint's files are mp_rank_XX_YYY, and the tracker finds the first") {
  CHECK(backend::checkpoint_rank_directory_name(3) == "mp_rank_03");
  CHECK(backend::checkpoint_rank_directory_name(1, 2, 4) == "mp_rank_01_002");
  CHECK(backend::checkpoint_rank_directory_name(1, 0, 1) == "mp_rank_01");
  test_support::TemporaryDirectory directory;
  const fs::path dir = directory.path;
  CHECK(checkpoint_file_path(dir, 7, 1, 3, 4) == dir / "iter_0000007/mp_rank_01_003/model_optim_rng.bin");
  fs::create_directories(dir / "iter_0000007" / "mp_rank_00_000");
  std::ofstream(dir / "iter_0000007" / "mp_rank_00_000" / "model_optim_rng.bin") << "x";
  std::ofstream(dir / "latest_checkpointed_iteration.txt") << "7";
  const auto tracked = backend::read_checkpoint_tracker(dir);
  REQUIRE(tracked.has_value());
  CHECK(tracked->file == dir / "iter_0000007/mp_rank_00_000/model_optim_rng.bin");
  CHECK(backend::checkpoint_rank_file(*tracked, 1, 2, 4) ==
        dir / "iter_0000007/mp_rank_01_002/model_optim_rng.bin");
}

TEST_CASE("the plain options: the records are stored as given, the current one names the flags that fit") {
  test_support::TemporaryDirectory directory;
  const auto a = resumable_arguments();
  LiveState saved(a);
  saved.train(a, 2);
  const CheckpointSaveOptions save{
      .directory = directory.path,
      .no_save_rng = true,
      .arguments = {{"num_layers", 2}, {"hidden_size", 32}, {"note", "kept as given"}},
      .args = {{"num_layers", "2"}},
      .command_line = {"some_tool", "--flag"}};
  std::ostringstream log;
  save_checkpoint(save, {4, 16, 0}, saved.model, saved.optimizer, saved.scheduler, log);
  {
    const CheckpointFileReader reader(checkpoint_file_path(directory.path, 4));
    CHECK(reader.metadata()["arguments"] == save.arguments);
    CHECK(reader.metadata()["args"] == save.args);
    CHECK(reader.metadata()["command_line"] == nlohmann::json(save.command_line));
    CHECK(reader.metadata()["no_save_rng"] == true);
    CHECK_FALSE(reader.metadata().contains("rng_state"));
  }

  CheckpointLoadOptions load{.directory = directory.path, .no_load_rng = true};
  LiveState loaded(a, 99);
  const auto progress = load_checkpoint(load, loaded.model, loaded.optimizer, loaded.scheduler, log);
  REQUIRE(progress);
  CHECK(progress->iteration == 4);
  CHECK(progress->consumed_train_samples == 16);
  CHECK(same_bytes(loaded.model.parameters(), saved.model.parameters()));
  CHECK(same_bytes(loaded.optimizer.exp_avg_sq(), saved.optimizer.exp_avg_sq()));
  CHECK(loaded.optimizer.steps_taken() == 2);
  CHECK(loaded.scheduler.num_steps() == saved.scheduler.num_steps());

  // A model that does not fit: the flags named come from the saved record and the given one.
  auto deeper = a;
  deeper.model.num_layers = 3;
  LiveState other(deeper);
  load.arguments = {{"num_layers", 3}, {"hidden_size", 32}};
  CHECK_THROWS_WITH_AS(load_checkpoint(load, other.model, other.optimizer, other.scheduler, log),
                       doctest::Contains("The checkpoint was saved with --num-layers 2; pass this "
                                         "flag (instead of --num-layers 3) to load it."),
                       common::Error);
}

TEST_CASE("--load without a tracker warns as Megatron and starts from scratch") {
  test_support::TemporaryDirectory directory;
  auto a = resumable_arguments();
  a.checkpointing.load = directory.path.string();
  LiveState state(a);
  const std::vector<float> before(state.model.parameters().begin(), state.model.parameters().end());
  std::ostringstream log;
  CHECK_FALSE(load_checkpoint(a, state.model, state.optimizer, state.scheduler, log).has_value());
  CHECK(log.str() == "WARNING: could not find the metadata file " + directory.path.string() +
                         "/latest_checkpointed_iteration.txt\n"
                         "    will not load any checkpoints and will start from random\n");
  CHECK(same_bytes(state.model.parameters(), before));

  // pretrain() then trains from iteration 1 and saves into the same directory.
  a.checkpointing.save = a.checkpointing.load;
  a.run.train_iters = 2;
  std::ostringstream run_log;
  const auto result = train(a, run_log);
  REQUIRE(result.iterations.size() == 2);
  CHECK(result.iterations[0].iteration == 1);
  CHECK(read_checkpoint_tracker(directory.path)->iteration == 2);
}

TEST_CASE("the tracker: an integer, 'release', or an error naming the file") {
  test_support::TemporaryDirectory directory;
  const fs::path tracker = directory.path / "latest_checkpointed_iteration.txt";
  CHECK_FALSE(read_checkpoint_tracker(directory.path).has_value());
  std::ofstream(tracker) << "1200\n";
  CHECK(read_checkpoint_tracker(directory.path)->iteration == 1200);
  CHECK(read_checkpoint_tracker(directory.path)->file == checkpoint_file_path(directory.path, 1200));
  std::ofstream(tracker) << "release";
  CHECK(read_checkpoint_tracker(directory.path)->release);
  CHECK(read_checkpoint_tracker(directory.path)->file ==
        directory.path / "release/mp_rank_00/model_optim_rng.bin");
  std::ofstream(tracker) << "12x";
  const std::string expected = "invalid metadata file " + tracker.string() + ": it holds '12x'";
  CHECK_THROWS_WITH_AS(read_checkpoint_tracker(directory.path), doctest::Contains(expected.c_str()),
                       common::Error);

  // A tracker naming an iteration that is not there.
  std::ofstream(tracker) << "7";
  auto a = resumable_arguments();
  a.checkpointing.load = directory.path.string();
  CHECK(load_error(a).find("names iteration 7, but " +
                           checkpoint_file_path(directory.path, 7).string() + " does not exist") !=
        std::string::npos);
}

TEST_CASE("require_checkpoint: the tracked file, or an error naming option, tracker and remedy") {
  test_support::TemporaryDirectory directory;
  const fs::path tracker = directory.path / "latest_checkpointed_iteration.txt";
  const std::string no_checkpoint = "--load " + directory.path.string() +
                                    " holds no checkpoint: " + tracker.string() +
                                    " is missing (point it elsewhere)";
  CHECK_THROWS_WITH_AS(require_checkpoint(directory.path, "--load", "point it elsewhere"),
                       doctest::Contains(no_checkpoint.c_str()), common::Error);
  std::ofstream(tracker) << "7";
  const fs::path file = checkpoint_file_path(directory.path, 7);
  const std::string missing_file = "--pretrained-checkpoint " + directory.path.string() + ": " +
                                   tracker.string() + " names " + file.string() +
                                   ", which does not exist (is it the --save directory of a "
                                   "training run?)";
  CHECK_THROWS_WITH_AS(require_checkpoint(directory.path, "--pretrained-checkpoint"),
                       doctest::Contains(missing_file.c_str()), common::Error);
  fs::create_directories(file.parent_path());
  std::ofstream(file) << "x";
  const TrackedCheckpoint tracked = require_checkpoint(directory.path, "--load");
  CHECK(tracked.iteration == 7);
  CHECK(tracked.file == file);
  // A saved-arguments reader refuses what require_checkpoint refuses, with its option first.
  const std::string absent =
      "--load " + (directory.path / "absent").string() + " holds no checkpoint";
  CHECK_THROWS_WITH_AS(read_saved_arguments(directory.path / "absent", "--load"),
                       doctest::Contains(absent.c_str()), common::Error);
  // The tracked file is no checkpoint: the reader's error names it.
  CHECK_THROWS_WITH_AS(read_saved_arguments(directory.path, "--load"),
                       doctest::Contains(file.string().c_str()), common::Error);
}

TEST_CASE("a checkpoint that does not fit the flags is one error: the table and the flags that fit") {
  test_support::TemporaryDirectory directory;
  auto a = save_trained(directory.path);
  a.checkpointing.load = a.checkpointing.save;

  auto wider = a;
  wider.model.hidden_size = 64;
  wider.model.num_attention_heads = 8;
  wider.model.ffn_hidden_size = 256;
  wider.command_line = {"pretrain_gpt", "--hidden-size", "64", "--num-attention-heads", "8"};
  const std::string message = load_error(wider);
  INFO(message);
  CHECK(message.find("checkpoint " + checkpoint_file_path(directory.path, 3).string() +
                     " does not fit the model the current flags describe (28 parameter tensors "
                     "there, 28 in the model; 28 differ):") != std::string::npos);
  CHECK(std::regex_search(message, std::regex(R"(\n  tensor +checkpoint +current\n)")));
  CHECK(std::regex_search(message,
                          std::regex(R"(\n  embedding\.word_embeddings\.weight +\(256, 32\) +\(256, 64\)\n)")));
  CHECK(std::regex_search(message, std::regex(R"(\n  decoder\.layers\.0\.self_attention\.linear_qkv\.weight +\(96, 32\) +\(192, 64\)\n)")));
  CHECK(message.find("\n  ... and 8 more\n") != std::string::npos);  // 20 rows shown
  // --ffn-hidden-size follows --hidden-size by default, so only the two flags are named.
  CHECK(message.find("The checkpoint was saved with --hidden-size 32 --num-attention-heads 4; pass "
                     "these flags (instead of --hidden-size 64 --num-attention-heads 8) to load "
                     "it.") != std::string::npos);

  auto deeper = a;
  deeper.model.num_layers = 3;
  const std::string missing = load_error(deeper);
  INFO(missing);
  CHECK(std::regex_search(missing, std::regex(
                                       R"(\n  decoder\.layers\.2\.mlp\.linear_fc1\.weight +not in the checkpoint +\(128, 32\)\n)")));
  CHECK(missing.find("pass this flag (instead of --num-layers 3)") != std::string::npos);
  CHECK(missing.find("saved with --num-layers 2;") != std::string::npos);

  auto shallower = a;
  shallower.model.num_layers = 1;
  const std::string extra = load_error(shallower);
  CHECK(std::regex_search(extra, std::regex(R"(\n  decoder\.layers\.1\.input_layernorm\.bias +\(32,\) +not in the model\n)")));
}

TEST_CASE("the vocabulary flags are named only when the embedding does not fit") {
  test_support::TemporaryDirectory directory;
  auto a = save_trained(directory.path);  // NullTokenizer --vocab-size 255: 256 rows
  a.checkpointing.load = a.checkpointing.save;

  // Another vocabulary that pads to the same 256 rows (as a Hugging Face import, saved with
  // NullTokenizer, continued with its SentencePiece model): only the layers are named.
  auto same_rows = a;
  same_rows.tokenizer.vocab_size = 250;
  same_rows.model.num_layers = 3;
  const std::string layers_only = load_error(same_rows);
  INFO(layers_only);
  CHECK(layers_only.find("The checkpoint was saved with --num-layers 2; pass this flag (instead "
                         "of --num-layers 3) to load it.") != std::string::npos);
  CHECK(layers_only.find("--vocab-size") == std::string::npos);

  // One that pads to 384 rows: the embedding is a row, and --vocab-size is named.
  auto more_rows = a;
  more_rows.tokenizer.vocab_size = 300;
  const std::string vocabulary = load_error(more_rows);
  INFO(vocabulary);
  CHECK(std::regex_search(vocabulary, std::regex(R"(\n  embedding\.word_embeddings\.weight +\(256, 32\) +\(384, 32\)\n)")));
  CHECK(vocabulary.find("The checkpoint was saved with --vocab-size 255; pass this flag (instead "
                        "of --vocab-size 300) to load it.") != std::string::npos);
}

TEST_CASE("a Llama checkpoint round-trips, and a GPT model is told the Llama flags it needs") {
  test_support::TemporaryDirectory directory;
  auto llama = resumable_llama_arguments();
  llama.model.untie_embeddings_and_output_weights = true;
  llama.model.group_query_attention = true;
  llama.model.num_query_groups = 2;
  llama.checkpointing.save = directory.path.string();
  LiveState saved(llama);
  saved.train(llama, 3);
  std::ostringstream log;
  save_checkpoint(llama, {3, 12, 8}, saved.model, saved.optimizer, saved.scheduler, log);

  llama.checkpointing.load = llama.checkpointing.save;
  LiveState loaded(llama, 99);
  load_checkpoint(llama, loaded.model, loaded.optimizer, loaded.scheduler, log);
  CHECK(same_bytes(loaded.model.parameters(), saved.model.parameters()));
  CHECK_NOTHROW(loaded.model.tensor("output_layer.weight"));

  auto gpt = resumable_arguments();
  gpt.checkpointing.load = llama.checkpointing.save;
  const std::string message = load_error(gpt);
  INFO(message);
  CHECK(message.find("The checkpoint was saved with --position-embedding-type rope "
                     "--normalization RMSNorm --swiglu --disable-bias-linear "
                     "--untie-embeddings-and-output-weights --group-query-attention "
                     "--num-query-groups 2; pass these flags (instead of "
                     "--position-embedding-type learned_absolute --normalization LayerNorm) to "
                     "load it.") != std::string::npos);
  CHECK(std::regex_search(message, std::regex(R"(\n  output_layer\.weight +\(256, 32\) +not in the model\n)")));
}

TEST_CASE("with --name-config-keys (a launcher job) the mismatch names the config keys to set") {
  test_support::TemporaryDirectory directory;
  auto llama = resumable_llama_arguments();
  // NullTokenizer --vocab-size 257: 258 ids, 260 rows here and 384 with the default 128, so
  // the embedding does not fit and the divisor is named.
  llama.tokenizer.vocab_size = 257;
  llama.model.make_vocab_size_divisible_by = 4;
  llama.checkpointing.save = directory.path.string();
  LiveState saved(llama);
  std::ostringstream log;
  save_checkpoint(llama, {3, 12, 8}, saved.model, saved.optimizer, saved.scheduler, log);

  // The launcher's job: GPT's defaults and one layer more.
  auto gpt = resumable_arguments();
  gpt.tokenizer.vocab_size = 257;
  gpt.checkpointing.load = llama.checkpointing.save;
  gpt.model.num_layers = 3;
  gpt.name_config_keys = true;
  const std::string message = load_error(gpt);
  INFO(message);
  CHECK(message.find("The checkpoint was saved with --num-layers 2 --make-vocab-size-divisible-by 4 "
                     "--position-embedding-type rope --normalization RMSNorm --swiglu "
                     "--disable-bias-linear; set training.model.num_layers=2 "
                     "training.model.make_vocab_size_divisible_by=4 "
                     "training.model.position_embedding_type=rope training.model.normalization=rmsnorm "
                     "training.model.activation=swiglu training.model.bias=false (instead of "
                     "training.model.num_layers=3 training.model.make_vocab_size_divisible_by=128 "
                     "training.model.position_embedding_type=learned_absolute "
                     "training.model.normalization=layernorm training.model.activation=gelu "
                     "training.model.bias=true) to load it: the launcher renders those flags from "
                     "these config keys.") != std::string::npos);
  CHECK(message.find("pass these flags") == std::string::npos);
}

TEST_CASE("the config settings for a shape flag: the keys the launcher renders it from") {
  CHECK(common::nemo_settings_for_flag("--make-vocab-size-divisible-by", "4") ==
        "training.model.make_vocab_size_divisible_by=4");
  CHECK(common::nemo_settings_for_flag("--tokenizer-type", "Llama2Tokenizer") ==
        "training.model.tokenizer.library=sentencepiece training.model.tokenizer.type=Llama2Tokenizer");
  CHECK(common::nemo_settings_for_flag("--tokenizer-type", "GPT2BPETokenizer") ==
        "training.model.tokenizer.library=megatron training.model.tokenizer.type=GPT2BPETokenizer");
  CHECK(common::nemo_settings_for_flag("--untie-embeddings-and-output-weights", "true") ==
        "training.model.share_embeddings_and_output_weights=false");
  CHECK(common::nemo_settings_for_flag("--vocab-size", "500").empty());  // no key renders it
}

TEST_CASE("a corrupt tensor in a saved checkpoint stops the load, naming the file and the tensor") {
  test_support::TemporaryDirectory directory;
  auto a = save_trained(directory.path);
  a.checkpointing.load = a.checkpointing.save;
  const fs::path file = checkpoint_file_path(directory.path, 3);
  uint64_t data_offset = 0, tensor_offset = 0;
  {
    const CheckpointFileReader reader(file);
    tensor_offset = reader.find("decoder.layers.1.mlp.linear_fc1.weight")->offset;
    std::ifstream in(file, std::ios::binary);
    in.seekg(32);
    in.read(reinterpret_cast<char*>(&data_offset), 8);
  }
  std::fstream stream(file, std::ios::binary | std::ios::in | std::ios::out);
  stream.seekp(static_cast<std::streamoff>(data_offset + tensor_offset + 100));
  stream.put('\x5a');
  stream.close();
  const std::string message = load_error(a);
  CHECK(message.find(file.string()) != std::string::npos);
  CHECK(message.find("tensor 'decoder.layers.1.mlp.linear_fc1.weight' fails its CRC-32C check") !=
        std::string::npos);
}

TEST_CASE("--finetune loads the weights only, --no-load-optim and --no-load-rng skip their part") {
  test_support::TemporaryDirectory directory;
  auto a = resumable_arguments();
  a.checkpointing.save = a.checkpointing.load = directory.path.string();
  LiveState saved(a);
  saved.train(a, 3);
  std::ostringstream log;
  save_checkpoint(a, {3, 12, 8}, saved.model, saved.optimizer, saved.scheduler, log);

  SUBCASE("--finetune") {
    auto finetune = a;
    finetune.checkpointing.finetune = true;
    LiveState state(finetune, 99);
    std::ostringstream load_log;
    const auto progress = load_checkpoint(finetune, state.model, state.optimizer, state.scheduler, load_log);
    REQUIRE(progress);
    CHECK(progress->iteration == 0);
    CHECK(progress->consumed_train_samples == 0);
    CHECK(progress->consumed_valid_samples == 0);
    CHECK(same_bytes(state.model.parameters(), saved.model.parameters()));
    CHECK(state.optimizer.steps_taken() == 0);
    CHECK(state.optimizer.exp_avg()[0] == 0.0f);
    CHECK(state.scheduler.num_steps() == 0);
    CHECK(state.model.dropout_step() == 0);
    // Megatron's lines: loading at the tracker's iteration, loaded "at iteration 0".
    CHECK(load_log.str().find("at iteration 3\n") != std::string::npos);
    CHECK(load_log.str().find("[ t 1/1, p 1/1 ] at iteration 0\n") != std::string::npos);
  }
  SUBCASE("--no-load-optim: no optimizer and no scheduler state (Megatron loads both together)") {
    auto no_optim = a;
    no_optim.checkpointing.no_load_optim = true;
    LiveState state(no_optim, 99);
    const auto progress = load_checkpoint(no_optim, state.model, state.optimizer, state.scheduler, log);
    CHECK(progress->iteration == 3);
    CHECK(progress->consumed_train_samples == 12);
    CHECK(same_bytes(state.model.parameters(), saved.model.parameters()));
    CHECK(state.optimizer.steps_taken() == 0);
    CHECK(state.scheduler.num_steps() == 0);
    CHECK(state.model.dropout_step() == 3);
  }
  SUBCASE("--no-load-rng") {
    auto no_rng = a;
    no_rng.checkpointing.no_load_rng = true;
    LiveState state(no_rng, 99);
    const auto progress = load_checkpoint(no_rng, state.model, state.optimizer, state.scheduler, log);
    CHECK(progress->iteration == 3);
    CHECK(state.optimizer.steps_taken() == 3);
    CHECK(same_bytes(state.optimizer.exp_avg(), saved.optimizer.exp_avg()));
    CHECK(state.model.dropout_step() == 0);
  }
}

TEST_CASE("--no-save-optim / --no-save-rng checkpoints load only with --no-load-optim / --no-load-rng") {
  test_support::TemporaryDirectory directory;
  auto a = resumable_arguments();
  a.checkpointing.no_save_optim = true;
  a.checkpointing.no_save_rng = true;
  a = save_trained(directory.path, 3, a);
  a.checkpointing.load = a.checkpointing.save;
  a.checkpointing.no_save_optim = a.checkpointing.no_save_rng = false;
  {
    const CheckpointFileReader reader(checkpoint_file_path(directory.path, 3));
    CHECK(reader.find("optimizer.exp_avg.embedding.word_embeddings.weight") == nullptr);
    CHECK_FALSE(reader.metadata().contains("rng_state"));
  }
  CHECK(load_error(a).find("Unable to load optimizer from checkpoint") != std::string::npos);
  CHECK(load_error(a).find("Specify --no-load-optim or --finetune") != std::string::npos);
  a.checkpointing.no_load_optim = true;
  CHECK(load_error(a).find("Unable to load rng state from checkpoint") != std::string::npos);
  a.checkpointing.no_load_rng = true;
  CHECK(load_error(a).empty());
}

TEST_CASE("a changed learning-rate schedule is refused unless told which schedule to follow") {
  test_support::TemporaryDirectory directory;
  auto a = save_trained(directory.path);
  a.checkpointing.load = a.checkpointing.save;
  auto changed = a;
  changed.optimizer.lr = 2e-3;
  changed.optimizer.lr_decay_iters = 16;
  const std::string message = load_error(changed);
  INFO(message);
  CHECK(message.find("the learning-rate schedule of the flags differs from the checkpoint's") !=
        std::string::npos);
  CHECK(message.find("learning rate (--lr): checkpoint 0.001, flags 0.002") != std::string::npos);
  CHECK(message.find("decay samples (--lr-decay-iters × --global-batch-size): checkpoint 32, flags 64") !=
        std::string::npos);
  CHECK(message.find("--use-checkpoint-opt_param-scheduler") != std::string::npos);

  std::ostringstream log;
  auto override_flags = changed;
  override_flags.checkpointing.override_opt_param_scheduler = true;
  LiveState kept(override_flags);
  load_checkpoint(override_flags, kept.model, kept.optimizer, kept.scheduler, log);
  CHECK(kept.scheduler.schedule().max_lr == 2e-3);
  CHECK(kept.scheduler.num_steps() == 12);  // 3 steps of 4 samples

  auto from_checkpoint = changed;
  from_checkpoint.checkpointing.use_checkpoint_opt_param_scheduler = true;
  LiveState taken(from_checkpoint);
  std::ostringstream taken_log;
  load_checkpoint(from_checkpoint, taken.model, taken.optimizer, taken.scheduler, taken_log);
  CHECK(taken.scheduler.schedule().max_lr == 1e-3);
  CHECK(taken.scheduler.schedule().decay_steps == 32);
  CHECK(taken.scheduler.num_steps() == 12);
  CHECK(taken_log.str().find(" > using checkpoint value 0.001 for learning rate (--lr)") !=
        std::string::npos);
}

TEST_CASE("a save removes what interrupted saves left, keeps a live process's, replaces its iteration") {
  test_support::TemporaryDirectory directory;
  const pid_t gone = finished_process_id();
  const fs::path dead_directory = directory.path / ("iter_0000009.tmp." + std::to_string(gone));
  const fs::path dead_tracker =
      directory.path / ("latest_checkpointed_iteration.txt.tmp." + std::to_string(gone));
  const fs::path dead_unique_tracker =  // durable_file's temporary_for name
      directory.path / ("latest_checkpointed_iteration.txt.tmp-" + std::to_string(gone) + "-a1B2c3");
  const fs::path live_directory = directory.path / ("iter_0000008.tmp." + std::to_string(getppid()));
  fs::create_directories(dead_directory / "mp_rank_00");
  std::ofstream(dead_directory / "mp_rank_00" / "model_optim_rng.bin") << "half a file";
  std::ofstream(dead_tracker) << "9";
  std::ofstream(dead_unique_tracker) << "9";
  fs::create_directories(live_directory);

  auto a = save_trained(directory.path, 3);
  CHECK_FALSE(fs::exists(dead_directory));
  CHECK_FALSE(fs::exists(dead_tracker));
  CHECK_FALSE(fs::exists(dead_unique_tracker));
  CHECK(fs::exists(live_directory));

  // Saving iteration 3 again (another state) replaces the directory whole.
  const auto first = read_text(checkpoint_file_path(directory.path, 3));
  a.run.seed = 4321;  // other weights
  a = save_trained(directory.path, 3, a);
  const auto second = read_text(checkpoint_file_path(directory.path, 3));
  CHECK(first != second);
  for (const auto& entry : fs::directory_iterator(directory.path)) {
    const std::string name = entry.path().filename().string();
    CAPTURE(name);
    CHECK((name == "iter_0000003" || name == "latest_checkpointed_iteration.txt" ||
           entry.path() == live_directory));
  }
  a.checkpointing.load = a.checkpointing.save;
  CHECK(load_error(a).empty());
}

TEST_CASE("a run stopped by --exit-interval and resumed equals an uninterrupted one, bit for bit") {
  test_support::TemporaryDirectory directory;
  auto base = resumable_arguments();
  base.run.train_iters = 8;
  base.evaluation.eval_interval =
      3;  // validation passes in both halves: consumed_valid must carry over
  base.evaluation.eval_iters = 1;
  base.logging.log_interval = 3;

  auto uninterrupted = base;
  uninterrupted.checkpointing.save = (directory.path / "uninterrupted").string();
  std::ostringstream log_whole;
  const TrainingResult whole = train(uninterrupted, log_whole);

  auto first_half = base;
  first_half.checkpointing.save = (directory.path / "resumed").string();
  first_half.run.exit_interval = 4;
  std::ostringstream log_first;
  const TrainingResult first = train(first_half, log_first);
  CHECK(log_first.str().find("[exiting program at iteration 4] datetime: ") != std::string::npos);
  CHECK(log_first.str().find(" on validation set") == std::string::npos);  // exited before it
  CHECK(read_checkpoint_tracker(first_half.checkpointing.save)->iteration == 4);

  auto second_half = base;
  second_half.checkpointing.save = second_half.checkpointing.load = first_half.checkpointing.save;
  std::ostringstream log_second;
  const TrainingResult second = train(second_half, log_second);
  CHECK(log_second.str().find(" loading checkpoint from " + second_half.checkpointing.load +
                              " at iteration 4\n") != std::string::npos);

  REQUIRE(whole.iterations.size() == 8);
  REQUIRE(first.iterations.size() == 4);
  REQUIRE(second.iterations.size() == 4);
  std::vector<IterationRecord> joined = first.iterations;
  joined.insert(joined.end(), second.iterations.begin(), second.iterations.end());
  for (size_t i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(joined[i].iteration == whole.iterations[i].iteration);
    CHECK(joined[i].lm_loss == whole.iterations[i].lm_loss);  // exact
    CHECK(joined[i].grad_norm == whole.iterations[i].grad_norm);
    CHECK(joined[i].learning_rate == whole.iterations[i].learning_rate);
  }
  REQUIRE(whole.validation_loss.has_value());
  CHECK(second.validation_loss == whole.validation_loss);
  CHECK(second.test_loss == whole.test_loss);

  // The final checkpoints hold the same bytes in every tensor, and the same state.
  const CheckpointFileReader a(checkpoint_file_path(uninterrupted.checkpointing.save, 8));
  const CheckpointFileReader b(checkpoint_file_path(second_half.checkpointing.save, 8));
  REQUIRE(a.tensors().size() == b.tensors().size());
  for (const auto& entry : a.tensors()) {
    CAPTURE(entry.name);
    REQUIRE(b.find(entry.name) != nullptr);
    CHECK(a.read_bytes(entry) == b.read_bytes(*b.find(entry.name)));
  }
  for (const char* key : {"iteration", "consumed_train_samples", "consumed_valid_samples",
                          "rng_state", "opt_param_scheduler", "optimizer"}) {
    CAPTURE(key);
    CHECK(a.metadata()[key] == b.metadata()[key]);
  }

  // Megatron's log-interval bookkeeping continues: the resumed run logs at 6 (iterations 5–6)
  // and 3 → the interval holds what ran in this process.
  CHECK(log_second.str().find(" iteration        6/       8 |") != std::string::npos);
  CHECK(log_second.str().find(" iteration        5/       8 |") == std::string::npos);

  // The dropout state is what makes it exact: resuming without it draws other masks.
  auto without_rng = second_half;
  without_rng.checkpointing.save = (directory.path / "without_rng").string();
  fs::create_directories(without_rng.checkpointing.save);
  fs::copy(first_half.checkpointing.save, without_rng.checkpointing.save,
           fs::copy_options::recursive);
  std::ofstream(checkpoint_tracker_path(without_rng.checkpointing.save))
      << "4";  // the second half moved it on
  without_rng.checkpointing.load = without_rng.checkpointing.save;
  without_rng.checkpointing.no_load_rng = true;
  std::ostringstream log_without;
  const TrainingResult different = train(without_rng, log_without);
  REQUIRE(different.iterations.size() == 4);
  CHECK(different.iterations[0].lm_loss != whole.iterations[4].lm_loss);
}

TEST_CASE("resume is exact under sample-based WSD, a weight-decay ramp and a batch-size ramp-up") {
  // Every schedule the checkpoint carries (learning rate, weight decay, batch size from the
  // consumed samples) must continue where it stopped.
  test_support::TemporaryDirectory directory;
  auto base = resumable_arguments();
  base.run.train_iters = 0;
  base.optimizer.lr_warmup_iters = 0;
  base.optimizer.lr_decay_iters = 0;  // resumable_arguments() derived it from --train-iters
  base.run.train_samples = 40;
  base.run.rampup_batch_size = {2, 2, 8};  // 2 until 8 samples are consumed, then 4
  base.optimizer.lr_warmup_samples = 4;
  base.optimizer.lr_decay_style = backend::LearningRateDecayStyle::wsd;
  base.optimizer.lr_wsd_decay_samples = 16;
  base.optimizer.lr_wsd_decay_style = backend::WsdDecayStyle::cosine;
  base.optimizer.start_weight_decay = 0.0;
  base.optimizer.end_weight_decay = 0.1;
  base.optimizer.weight_decay_incr_style = backend::WeightDecayIncrementStyle::linear;
  validate_arguments(base);
  REQUIRE(base.run.train_iters == 12);  // 4 batches of 2, then (40 − 8) / 4 = 8 batches of 4

  auto uninterrupted = base;
  uninterrupted.checkpointing.save = (directory.path / "uninterrupted").string();
  std::ostringstream log_whole;
  const TrainingResult whole = train(uninterrupted, log_whole);

  auto first_half = base;
  first_half.checkpointing.save = (directory.path / "resumed").string();
  first_half.run.exit_interval = 5;
  std::ostringstream log_first;
  const TrainingResult first = train(first_half, log_first);
  auto second_half = base;
  second_half.checkpointing.save = second_half.checkpointing.load = first_half.checkpointing.save;
  std::ostringstream log_second;
  const TrainingResult second = train(second_half, log_second);

  REQUIRE(whole.iterations.size() == 12);
  REQUIRE(first.iterations.size() == 5);
  REQUIRE(second.iterations.size() == 7);
  std::vector<IterationRecord> joined = first.iterations;
  joined.insert(joined.end(), second.iterations.begin(), second.iterations.end());
  for (size_t i = 0; i < joined.size(); ++i) {
    CAPTURE(i);
    CHECK(joined[i].lm_loss == whole.iterations[i].lm_loss);
    CHECK(joined[i].learning_rate == whole.iterations[i].learning_rate);
  }
  const CheckpointFileReader a(checkpoint_file_path(uninterrupted.checkpointing.save, 12));
  const CheckpointFileReader b(checkpoint_file_path(second_half.checkpointing.save, 12));
  for (const auto& entry : a.tensors()) {
    CAPTURE(entry.name);
    REQUIRE(b.find(entry.name) != nullptr);
    CHECK(a.read_bytes(entry) == b.read_bytes(*b.find(entry.name)));
  }
  CHECK(a.metadata()["opt_param_scheduler"] == b.metadata()["opt_param_scheduler"]);
  CHECK(a.metadata()["opt_param_scheduler"]["wsd_decay_style"] == "cosine");
}

TEST_CASE("--pretrained-checkpoint starts from its weights when --load holds nothing, and a restart resumes from --load") {
  test_support::TemporaryDirectory directory;
  auto base = resumable_arguments();
  base.run.train_iters = 4;
  auto pretraining = base;
  pretraining.checkpointing.save = (directory.path / "pretrained").string();
  std::ostringstream log_pretraining;
  train(pretraining, log_pretraining);

  // The same as --load pretrained --finetune, as Megatron's finetune_utils loads it.
  auto finetune = base;
  finetune.checkpointing.load = pretraining.checkpointing.save;
  finetune.checkpointing.finetune = true;
  finetune.checkpointing.no_load_optim = true;
  finetune.checkpointing.no_load_rng = true;
  std::ostringstream log_finetune;
  const TrainingResult expected = train(finetune, log_finetune);

  auto continued = base;
  continued.checkpointing.pretrained_checkpoint = pretraining.checkpointing.save;
  continued.checkpointing.save = continued.checkpointing.load =
      (directory.path / "continued").string();
  continued.run.exit_interval = 2;
  std::ostringstream log_first;
  const TrainingResult first = train(continued, log_first);
  CHECK(log_first.str().find("will not load any checkpoints and will start from random") !=
        std::string::npos);  // --load's warning, then the pretrained weights
  CHECK(log_first.str().find(" loading checkpoint from " + pretraining.checkpointing.save) !=
        std::string::npos);
  REQUIRE(first.iterations.size() == 2);
  REQUIRE(expected.iterations.size() == 4);
  CHECK(first.iterations[0].iteration == 1);
  CHECK(first.iterations[0].lm_loss == expected.iterations[0].lm_loss);
  CHECK(first.iterations[1].lm_loss == expected.iterations[1].lm_loss);

  // A restart (same flags, the job requeued) resumes this run's checkpoint, not the pretrained.
  continued.run.exit_interval = 0;
  std::ostringstream log_second;
  const TrainingResult second = train(continued, log_second);
  CHECK(log_second.str().find(" loading checkpoint from " + continued.checkpointing.load +
                              " at iteration 2") != std::string::npos);
  REQUIRE(second.iterations.size() == 2);
  CHECK(second.iterations[0].iteration == 3);

  // Without --load at all it is the finetuning start too.
  auto without_load = base;
  without_load.checkpointing.pretrained_checkpoint = pretraining.checkpointing.save;
  std::ostringstream log_without;
  const TrainingResult third = train(without_load, log_without);
  REQUIRE(third.iterations.size() == 4);
  CHECK(third.iterations[3].lm_loss == expected.iterations[3].lm_loss);

  // A directory with no checkpoint is refused, naming the flag and the tracker it looked for.
  auto missing = base;
  missing.checkpointing.pretrained_checkpoint = (directory.path / "nothing_here").string();
  std::ostringstream log_missing;
  try {
    train(missing, log_missing);
    FAIL("an empty --pretrained-checkpoint was accepted");
  } catch (const common::Error& error) {
    const std::string message = error.what();
    CHECK(message.find("--pretrained-checkpoint") != std::string::npos);
    CHECK(message.find("latest_checkpointed_iteration.txt") != std::string::npos);
  }
}

TEST_CASE("--exit-interval without --save stops there and saves nothing") {
  test_support::TemporaryDirectory directory;
  auto a = resumable_arguments();
  a.run.exit_interval = 2;
  std::ostringstream log;
  const auto result = train(a, log);
  CHECK(result.iterations.size() == 2);
  CHECK(log.str().find("saving checkpoint") == std::string::npos);
  CHECK(log.str().find("[exiting program at iteration 2]") != std::string::npos);
}

TEST_CASE("--save-interval saves every N iterations and the last one once") {
  test_support::TemporaryDirectory directory;
  auto a = resumable_arguments();
  a.run.train_iters = 5;
  a.checkpointing.save = directory.path.string();
  a.checkpointing.save_interval = 2;
  std::ostringstream log;
  train(a, log);
  CHECK(fs::exists(checkpoint_iteration_directory(directory.path, 2)));
  CHECK(fs::exists(checkpoint_iteration_directory(directory.path, 4)));
  CHECK(fs::exists(checkpoint_iteration_directory(directory.path, 5)));
  CHECK_FALSE(fs::exists(checkpoint_iteration_directory(directory.path, 3)));
  CHECK(read_checkpoint_tracker(directory.path)->iteration == 5);
  // Resuming at the end runs nothing and does not save iteration 5 again.
  a.checkpointing.load = a.checkpointing.save;
  std::ostringstream again;
  const auto result = train(a, again);
  CHECK(result.iterations.empty());
  CHECK(again.str().find("saving checkpoint") == std::string::npos);
}

TEST_CASE("one holder of a save directory at a time — a release import needs leave to replace a training tracker") {
  test_support::TemporaryDirectory directory;
  const fs::path save = directory.path / "run";
  {
    const common::ExclusiveFileLock held = lock_save_directory(save);  // creates the directory
    CHECK(fs::is_regular_file(save / "save.lock"));
    const std::string expected = "--save " + save.string() + " is in use by another run (pid " +
                                 std::to_string(getpid()) + " on " + common::local_host_name() + " holds " +
                                 (save / "save.lock").string() + ")";
    CHECK_THROWS_WITH_AS(lock_save_directory(save), doctest::Contains(expected.c_str()), common::Error);
    // pretrain saving there is refused the same way.
    TrainingArguments a = save_trained(directory.path / "other", 1);
    a.checkpointing.save = save.string();
    std::ostringstream out;
    CHECK_THROWS_WITH_AS(pretrain(a, out), doctest::Contains(expected.c_str()), common::Error);
  }
  CHECK_FALSE(fs::exists(save / "save.lock"));
  CHECK_NOTHROW(lock_save_directory(save));

  // No tracker, or a release: an import may go there.
  CHECK_NOTHROW(check_release_destination(save, false));
  std::ofstream(checkpoint_tracker_path(save)) << "release";
  CHECK_NOTHROW(check_release_destination(save, false));
  // A training tracker: refused unless asked for.
  std::ofstream(checkpoint_tracker_path(save)) << "12";
  CHECK_THROWS_WITH_AS(check_release_destination(save, false),
                       doctest::Contains("names training iteration 12; importing would point it to the release"),
                       common::Error);
  CHECK_NOTHROW(check_release_destination(save, true));
}

TEST_CASE("--fp16: the loss scaler's state is saved and a resumed run scales as an uninterrupted one") {
  test_support::TemporaryDirectory directory;
  auto base = resumable_arguments();
  base.run.train_iters = 8;
  base.precision.fp16 = true;
  base.precision.initial_loss_scale = 1024;
  base.precision.loss_scale_window = 3;  // grows at iterations 3 and 6: across the save at 4
  auto uninterrupted = base;
  std::ostringstream log_whole;
  const TrainingResult whole = train(uninterrupted, log_whole);
  CHECK(log_whole.str().find("loss scale: 2048.0 |") != std::string::npos);

  auto first_half = base;
  first_half.checkpointing.save = (directory.path / "fp16").string();
  first_half.run.exit_interval = 4;
  std::ostringstream log_first;
  train(first_half, log_first);
  const CheckpointFileReader saved(checkpoint_file_path(first_half.checkpointing.save, 4));
  CHECK(saved.metadata()["optimizer"]["grad_scaler"] ==
        nlohmann::json{{"scale", 2048.0}, {"growth_tracker", 1}, {"hysteresis_tracker", 2}});

  auto second_half = base;
  second_half.checkpointing.load = second_half.checkpointing.save = first_half.checkpointing.save;
  std::ostringstream log_second;
  const TrainingResult second = train(second_half, log_second);
  REQUIRE(second.iterations.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(second.iterations[i].loss_scale == whole.iterations[i + 4].loss_scale);
    CHECK(second.iterations[i].lm_loss == whole.iterations[i + 4].lm_loss);
  }
  CHECK(whole.iterations.back().loss_scale == 4096.0);

  // A run without a scaler ignores the saved state, with Megatron's warning.
  auto bf16 = base;
  bf16.precision.fp16 = false;
  bf16.precision.bf16 = true;
  bf16.checkpointing.load = first_half.checkpointing.save;
  bf16.checkpointing.save.clear();
  std::ostringstream log_bf16;
  train(bf16, log_bf16);
  CHECK(log_bf16.str().find("***WARNING*** fould the grad scaler in the checkpoint but it is None "
                            "in the class. Skipping loading grad scaler ...") != std::string::npos);
}

namespace {

// A rank file's metadata naming distributed optimizer state, and the distrib_optim files of
// `members` ranks beside it, each holding shard_range's part of moments exp_avg[i] = i + 1 and
// exp_avg_sq[i] = −(i + 1) of a buffer of `count` (written as the distributed optimizer's save
// writes them, for `members` files at most `written`).
struct DistributedMomentsFiles {
  test_support::TemporaryDirectory directory;
  nlohmann::json metadata;
  fs::path rank_file() const { return directory.path / "model_optim_rng.bin"; }

  DistributedMomentsFiles(int64_t count, int64_t members, int64_t written) {
    metadata = {
        {"optimizer", {{"distributed", {{"data_parallel", members}, {"parameter_count", count}}}}}};
    for (int64_t member = 0; member < std::min(members, written); ++member) {
      const ShardRange range = shard_range(count, members, member);
      std::vector<float> exp_avg, exp_avg_sq;
      for (int64_t i = range.offset; i < range.offset + range.numel; ++i) {
        exp_avg.push_back(static_cast<float>(i + 1));
        exp_avg_sq.push_back(-static_cast<float>(i + 1));
      }
      const std::vector<CheckpointTensor> tensors = {{"exp_avg", {range.numel}, exp_avg},
                                                     {"exp_avg_sq", {range.numel}, exp_avg_sq}};
      write_checkpoint_file(directory.path / distributed_optimizer_file_name(member),
                            {{"parameter_count", count},
                             {"range", {{"offset", range.offset}, {"numel", range.numel}}}},
                            tensors);
    }
  }
  // Elements `wanted` of a buffer of buffer_numel, as the load reads them.
  std::pair<std::vector<float>, std::vector<float>> read(int64_t buffer_numel,
                                                         ShardRange wanted) const {
    std::vector<float> exp_avg(static_cast<size_t>(wanted.numel)), exp_avg_sq(exp_avg.size());
    read_distributed_moments(rank_file(), CheckpointMetadata(metadata, rank_file()), buffer_numel,
                             wanted, exp_avg, exp_avg_sq);
    return {exp_avg, exp_avg_sq};
  }
};

}  // namespace

TEST_CASE("distributed optimizer state: any range of the buffer, from the files that hold it") {
  const DistributedMomentsFiles files(10, 3, 3);
  for (int64_t offset = 0; offset <= 10; ++offset) {
    for (int64_t numel = 0; offset + numel <= 10; ++numel) {
      CAPTURE(offset);
      CAPTURE(numel);
      const auto moments = files.read(10, {offset, numel});
      for (int64_t i = 0; i < numel; ++i) {
        CHECK(moments.first[static_cast<size_t>(i)] == static_cast<float>(offset + i + 1));
        CHECK(moments.second[static_cast<size_t>(i)] == -static_cast<float>(offset + i + 1));
      }
    }
  }
  // Rank 2's range [7, 10) needs no other file.
  fs::remove(files.directory.path / distributed_optimizer_file_name(0));
  CHECK(files.read(10, {7, 3}).first == std::vector<float>{8, 9, 10});
  CHECK_THROWS_WITH_AS(files.read(10, {3, 5}),
                       doctest::Contains("distrib_optim_000.bin (rank 0's optimizer state) "
                                         "does not exist: the checkpoint is incomplete"),
                       common::Error);
}

TEST_CASE(
    "distributed optimizer state: a rank count far beyond the parameters reads only the files that "
    "hold some") {
  // 2^62 ranks over 10 parameters: ranks 0..9 hold one each, the others none. Walking every
  // rank up to the ones wanted never ended.
  const int64_t members = int64_t{1} << 62;
  const DistributedMomentsFiles files(10, members, 10);
  CHECK(files.read(10, {0, 10}).first == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  CHECK(files.read(10, {9, 1}).second == std::vector<float>{-10});
}

TEST_CASE(
    "distributed optimizer state saved for another parameter count is refused, not misplaced") {
  // The files agree with each other on 12 parameters; read into a model of 10, every moment
  // would have landed at another parameter.
  const DistributedMomentsFiles files(12, 3, 3);
  CHECK_THROWS_WITH_AS(files.read(10, {0, 10}),
                       doctest::Contains("its distributed optimizer state covers 12 parameters "
                                         "over 3 data-parallel ranks, but this rank's model has "
                                         "10 parameters"),
                       common::Error);
  DistributedMomentsFiles wrong_type(10, 3, 3);
  wrong_type.metadata["optimizer"]["distributed"] = 3;
  CHECK_THROWS_WITH_AS(wrong_type.read(10, {0, 10}),
                       doctest::Contains("metadata field 'distributed' has the wrong type (3)"),
                       common::Error);
  DistributedMomentsFiles no_ranks(10, 3, 3);
  no_ranks.metadata["optimizer"]["distributed"]["data_parallel"] = 0;
  CHECK_THROWS_WITH_AS(no_ranks.read(10, {0, 10}), doctest::Contains("over 0 data-parallel ranks"),
                       common::Error);
}

TEST_CASE("a metadata section of another type is reported as such, not as missing") {
  // {"optimizer": 5} read as "no optimizer section" made a corrupt file's load say it was saved
  // without its optimizer state (--no-load-optim), and section() call it missing.
  const nlohmann::json root = {{"optimizer", 5}, {"arguments", "x"}, {"rng_state", nlohmann::json::object()}};
  const CheckpointMetadata metadata(root, "model_optim_rng.pt");
  CHECK(metadata.has("rng_state"));
  CHECK_FALSE(metadata.has("opt_param_scheduler"));
  CHECK_THROWS_WITH_AS(
      metadata.has("optimizer"),
      "checkpoint model_optim_rng.pt: metadata field 'optimizer' has the wrong type (5)",
      common::Error);
  CHECK_THROWS_WITH_AS(
      metadata.section("arguments"),
      "checkpoint model_optim_rng.pt: metadata field 'arguments' has the wrong type (\"x\")",
      common::Error);
  CHECK_THROWS_WITH_AS(metadata.section("opt_param_scheduler"),
                       doctest::Contains("the metadata has no field 'opt_param_scheduler'"),
                       common::Error);
}
