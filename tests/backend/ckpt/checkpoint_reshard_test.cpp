// Resharding checkpoints (checkpoint_util --target-tensor-parallel-size and
// --target-pipeline-parallel-size) within one process: a one-process checkpoint of a
// Llama-style model (GQA, SwiGLU's two-block linear_fc1, untied output) cut into two and four
// ranks holds, in each rank's file, the shard the parameter layout says that rank has, of the
// parameters and of both moments, with the metadata of the target size and the rest of the
// state unchanged; back at one rank every tensor is the original's bit for bit and the trainer
// loads it; the vocabulary rows follow the target's padding (cut, or the last row repeated);
// the export reads the shards whole; release checkpoints stay releases; and each bad input is
// one error naming the flag or file, before anything is written.
//
// Pipelined checkpoints (one file per tensor-parallel rank and stage, mp_rank_XX_YYY) are built
// here file by file as pretrain_gpt's ranks save them, from a state that is the same in every
// layout: each element holds the value of the whole model's initialisation stream at its place
// (parameter_layout.hpp initialises a shard or a stage's tensor with the whole tensor's values
// there, and the last stage's tied copy with the word embedding's), with one seed for the
// parameters and one per moment. A (tp 2, pp 2) checkpoint resharded to one process is then the
// one-process checkpoint bit for bit, and one process's resharded to (2, 2) is the built (2, 2)
// checkpoint bit for bit, tied copy and its moments included; interleaved chunks are kept or
// dropped as the target's pipeline size allows; and the pipeline refusals name the flag or file.
#include "backend/ckpt/checkpoint_reshard.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_conversion.hpp"
#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/common/error.hpp"
#include "backend/model/parameter_layout.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/trainer.hpp"
#include "tests/backend/ckpt/checkpoint_test_arguments.hpp"
#include "tests/temporary_directory.hpp"

namespace fs = std::filesystem;

namespace {

using backend::CheckpointFileReader;
using backend::TrainingArguments;
using test_support::TemporaryDirectory;

TrainingArguments llama_arguments(const fs::path& save) {
  TrainingArguments a = test_support::checkpoint_test_arguments(save);
  a.model.hidden_size = 32;
  a.model.num_attention_heads = 8;
  a.model.group_query_attention = true;
  a.model.num_query_groups = 4;
  a.model.swiglu = true;
  a.model.position_embedding_type = backend::PositionEmbeddingType::rope;
  a.model.normalization = backend::Normalization::rms_norm;
  a.model.add_bias_linear = false;
  a.model.untie_embeddings_and_output_weights = true;
  a.model.max_position_embeddings = 8;
  // 41 tokens → 64 rows at TP=1; the norm and the initialisation are the defaults.
  const TrainingArguments defaults;
  a.model.norm_epsilon = defaults.model.norm_epsilon;
  a.model.init_method_std = defaults.model.init_method_std;
  return a;
}

// A one-process checkpoint of iteration `iteration` with distinct values everywhere: weights,
// moments (each element its own value), optimizer step, RNG state, samples.
void save_checkpoint(const TrainingArguments& arguments, int64_t iteration) {
  backend::GptModel<float> model(backend::model_config(arguments));
  model.init_parameters(7);
  model.set_dropout_seed(99);
  model.set_dropout_step(static_cast<uint64_t>(iteration) * 3);
  const size_t count = model.parameters().size();
  backend::AdamW optimizer(backend::AdamWConfig{}, {}, static_cast<int64_t>(count));
  std::vector<float> exp_avg(count), exp_avg_sq(count);
  for (size_t i = 0; i < count; ++i) {
    exp_avg[i] = 1e-3f * static_cast<float>(i) + static_cast<float>(iteration);
    exp_avg_sq[i] = 1e-6f * static_cast<float>(i);
  }
  optimizer.copy_moments_from_host(exp_avg, exp_avg_sq);
  optimizer.set_steps_taken(iteration);
  backend::LearningRateScheduler scheduler({.max_lr = 1e-3, .decay_steps = 5});
  std::ostringstream log;
  backend::save_checkpoint(
      arguments,
      {.iteration = iteration, .consumed_train_samples = iteration, .consumed_valid_samples = 2},
      model, optimizer, scheduler, log);
}

backend::ReshardResult reshard(const fs::path& load, const fs::path& save, int64_t size,
                               int64_t divisor = 0, int64_t pipeline = 1,
                               std::string* output = nullptr) {
  std::ostringstream out;
  auto result = backend::reshard_checkpoint({.load = load,
                                             .save = save,
                                             .target_tensor_parallel = size,
                                             .target_pipeline_parallel = pipeline,
                                             .make_vocab_size_divisible_by = divisor,
                                             .command_line = {"checkpoint_util", "test"}},
                                            out);
  if (output != nullptr) *output = out.str();
  return result;
}

std::vector<float> read_values(const CheckpointFileReader& reader, const std::string& name) {
  const backend::TensorEntry* entry = reader.find(name);
  REQUIRE_MESSAGE(entry != nullptr, name);
  std::vector<float> values(static_cast<size_t>(entry->numel()));
  reader.read(*entry, values);
  return values;
}

void check_same_tensors(const fs::path& actual, const fs::path& expected) {
  const CheckpointFileReader a(actual);
  const CheckpointFileReader b(expected);
  REQUIRE(a.tensors().size() == b.tensors().size());
  for (size_t i = 0; i < b.tensors().size(); ++i) {
    const std::string name = b.tensors()[i].name;
    CAPTURE(name);
    REQUIRE(a.tensors()[i].name == name);
    CHECK(a.tensors()[i].shape == b.tensors()[i].shape);
    CHECK(a.read_bytes(a.tensors()[i]) == b.read_bytes(b.tensors()[i]));
  }
}

std::string reshard_error(const fs::path& load, const fs::path& save, int64_t size,
                          int64_t divisor = 0, int64_t pipeline = 1) {
  try {
    reshard(load, save, size, divisor, pipeline);
  } catch (const common::Error& error) {
    return error.what();
  }
  FAIL("expected a refusal");
  return "";
}

// A GPT-2-style model (tied embeddings, LayerNorm, biases, learned positions) of `layers`
// layers: with pipeline stages, the last one holds a tied copy of the word embedding.
TrainingArguments gpt2_arguments(const fs::path& save, int64_t layers) {
  TrainingArguments a = test_support::checkpoint_test_arguments(save);
  a.model.num_layers = layers;
  a.model.hidden_size = 32;
  a.model.ffn_hidden_size = 64;
  a.model.num_attention_heads = 4;
  a.model.max_position_embeddings = 8;
  // 41 tokens → 64 rows at TP=1 (and with 16 at TP=2); the norm and the initialisation are
  // the defaults.
  const backend::TrainingArguments defaults;
  a.model.norm_epsilon = defaults.model.norm_epsilon;
  a.model.init_method_std = defaults.model.init_method_std;
  return a;
}

// `arguments` at another layout (and the --make-vocab-size-divisible-by keeping 64 rows).
TrainingArguments at_layout(TrainingArguments a, const fs::path& save, int64_t tensor_parallel,
                            int64_t pipeline_parallel, int64_t layers_per_virtual_stage = 0) {
  a.parallelism.tensor_model_parallel_size = tensor_parallel;
  a.parallelism.pipeline_model_parallel_size = pipeline_parallel;
  a.parallelism.num_layers_per_virtual_pipeline_stage = layers_per_virtual_stage;
  a.model.make_vocab_size_divisible_by = 32 / tensor_parallel;
  a.checkpointing.save = save.string();
  return a;
}

// The state of a layout's tensors that is the same in every layout: the whole model's
// initialisation stream at each element's place, with seed 7 for the parameters, 11 for
// exp_avg and 13 (squared) for exp_avg_sq.
struct LayoutState {
  std::vector<float> parameters, exp_avg, exp_avg_sq;
};
LayoutState layout_state(const backend::ParameterLayout& layout) {
  LayoutState state;
  for (auto* values : {&state.parameters, &state.exp_avg, &state.exp_avg_sq}) {
    values->resize(static_cast<size_t>(layout.numel()));
  }
  layout.init_parameters(state.parameters.data(), 7);
  layout.init_parameters(state.exp_avg.data(), 11);
  layout.init_parameters(state.exp_avg_sq.data(), 13);
  for (float& value : state.exp_avg_sq) value *= value;
  return state;
}

constexpr int64_t kIteration = 5;

// The one-process checkpoint of that state at iteration 5, saved by the trainer's save; its file.
fs::path save_whole_checkpoint(const TrainingArguments& arguments) {
  const backend::GptConfig config = backend::model_config(arguments);
  backend::GptModel<float> model(config);
  model.init_parameters(7);
  model.set_dropout_seed(99);
  model.set_dropout_step(15);
  const LayoutState state = layout_state(backend::ParameterLayout(config));
  const auto parameters = model.parameters();
  REQUIRE(std::equal(parameters.begin(), parameters.end(), state.parameters.begin()));
  backend::AdamW optimizer(backend::AdamWConfig{}, {}, static_cast<int64_t>(parameters.size()));
  optimizer.copy_moments_from_host(state.exp_avg, state.exp_avg_sq);
  optimizer.set_steps_taken(kIteration);
  backend::LearningRateScheduler scheduler({.max_lr = 1e-3, .decay_steps = 5});
  std::ostringstream log;
  backend::save_checkpoint(
      arguments,
      {.iteration = kIteration, .consumed_train_samples = kIteration, .consumed_valid_samples = 2},
      model, optimizer, scheduler, log);
  return backend::checkpoint_file_path(arguments.checkpointing.save, kIteration, 0);
}

// The checkpoint of `arguments`' layout (its tensor- and pipeline-parallel sizes and chunks)
// of that state, written file by file as pretrain_gpt's ranks save one: each file the tensors
// of its (rank, stage)'s layout in the trainer's order (the parameters, then each one's two
// moments), the metadata the one-process checkpoint `whole`'s with the layout's arguments and
// the file's place.
void save_layout_checkpoint(const TrainingArguments& arguments, const fs::path& whole) {
  const backend::GptConfig config = backend::model_config(arguments);
  const int64_t tp = arguments.parallelism.tensor_model_parallel_size;
  const int64_t pp = arguments.parallelism.pipeline_model_parallel_size;
  nlohmann::json metadata = CheckpointFileReader(whole).metadata();
  metadata["arguments"] = backend::checkpoint_arguments(arguments);
  metadata["args"]["tensor_model_parallel_size"] = std::to_string(tp);
  metadata["args"]["pipeline_model_parallel_size"] = std::to_string(pp);
  metadata["args"]["world_size"] = std::to_string(tp * pp);
  metadata["args"]["make_vocab_size_divisible_by"] =
      std::to_string(arguments.model.make_vocab_size_divisible_by);
  metadata["padded_vocab_size"] = config.padded_vocab_size;
  LayoutState state;
  const auto lock = backend::lock_save_directory(arguments.checkpointing.save);
  std::ostringstream log;
  backend::write_checkpoint_files(
      arguments.checkpointing.save, kIteration, false, tp, pp,
      [&](int64_t rank, int64_t stage) {
        const backend::ParameterLayout layout(
            config, tp, rank,
            {.pipeline_parallel = pp,
             .rank = stage,
             .virtual_chunks = arguments.virtual_pipeline_chunks()});
        state = layout_state(layout);
        backend::CheckpointRankFile file;
        file.metadata = metadata;
        file.metadata["tensor_parallel"] = {{"size", tp}, {"rank", rank}};
        file.metadata["pipeline_parallel"] = {{"size", pp}, {"rank", stage}};
        auto span_of = [&](const std::vector<float>& values, const backend::ParameterTensor& t) {
          return std::span<const float>(values).subspan(static_cast<size_t>(t.offset),
                                                        static_cast<size_t>(t.numel));
        };
        for (const auto& t : layout.tensors()) {
          file.tensors.push_back({t.name, t.shape, span_of(state.parameters, t)});
        }
        for (const auto& t : layout.tensors()) {
          file.tensors.push_back(
              {"optimizer.exp_avg." + t.name, t.shape, span_of(state.exp_avg, t)});
          file.tensors.push_back(
              {"optimizer.exp_avg_sq." + t.name, t.shape, span_of(state.exp_avg_sq, t)});
        }
        return file;
      },
      log);
}

// Every file of the checkpoints `actual` and `expected` (both of `tp` × `pp` files, iteration
// 5): the same tensors bit for bit, and the same metadata but for the record of a resharding.
void check_same_checkpoint(const fs::path& actual, const fs::path& expected, int64_t tp,
                           int64_t pp) {
  for (int64_t stage = 0; stage < pp; ++stage) {
    for (int64_t rank = 0; rank < tp; ++rank) {
      const fs::path file = backend::checkpoint_file_path(actual, kIteration, rank, stage, pp);
      const std::string name = file.string();
      CAPTURE(name);
      const fs::path reference =
          backend::checkpoint_file_path(expected, kIteration, rank, stage, pp);
      check_same_tensors(file, reference);
      auto a = CheckpointFileReader(file).metadata();
      auto b = CheckpointFileReader(reference).metadata();
      a.erase("resharded");
      b.erase("resharded");
      CHECK(a == b);
    }
  }
}

}  // namespace

TEST_CASE(
    "resharding cuts every tensor and both moments by the layout, and comes back bit for bit") {
  TemporaryDirectory directory;
  const TrainingArguments arguments = llama_arguments(directory.path / "tp1");
  save_checkpoint(arguments, 5);
  const fs::path original = backend::checkpoint_file_path(directory.path / "tp1", 5, 0);
  const CheckpointFileReader whole(original);
  const backend::GptConfig config = backend::model_config(arguments);  // 64 rows

  for (const int64_t size : {2, 4}) {
    CAPTURE(size);
    const fs::path sharded = directory.path / ("tp" + std::to_string(size));
    // --make-vocab-size-divisible-by 32 / size keeps the 64 rows.
    const auto result = reshard(directory.path / "tp1", sharded, size, 32 / size);
    CHECK(result.iteration == 5);
    CHECK_FALSE(result.release);
    CHECK(result.source_tensor_parallel == 1);
    CHECK(result.source_padded_vocab_size == 64);
    CHECK(result.target_padded_vocab_size == 64);
    CHECK(result.optimizer_state);
    CHECK(result.target_arguments.parallelism.tensor_model_parallel_size == size);
    CHECK(result.target_arguments.model.make_vocab_size_divisible_by == 32 / size);
    CHECK(fs::is_regular_file(backend::checkpoint_tracker_path(sharded)));
    CHECK_FALSE(fs::exists(backend::checkpoint_file_path(sharded, 5, size)));

    for (int64_t rank = 0; rank < size; ++rank) {
      CAPTURE(rank);
      const CheckpointFileReader reader(backend::checkpoint_file_path(sharded, 5, rank));
      const backend::ParameterLayout layout(config, size, rank);
      REQUIRE(reader.tensors().size() == 3 * layout.tensors().size());
      for (const std::string prefix : {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."}) {
        for (const auto& tensor : layout.tensors()) {
          const std::string name = prefix + tensor.name;
          CAPTURE(name);
          CHECK(reader.find(name)->shape == tensor.shape);
          const auto shard = read_values(reader, name);
          const auto full = read_values(whole, name);
          // Row r of a row-split tensor's block j is row j·(rows/blocks) + rank·(part) + r of
          // the whole; a column split takes columns [rank·c, (rank + 1)·c) of every row.
          const int64_t rows = tensor.shape[0];
          const int64_t columns = tensor.shape.size() > 1 ? tensor.shape[1] : 1;
          bool same = true;
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < columns; ++c) {
              int64_t whole_row = r, whole_column = c;
              const int64_t whole_columns = tensor.full_shape.size() > 1 ? tensor.full_shape[1] : 1;
              if (tensor.partition == backend::TensorPartition::rows) {
                const int64_t part = rows / tensor.partition_blocks;
                whole_row = (r / part) * part * size + rank * part + r % part;
              } else if (tensor.partition == backend::TensorPartition::columns) {
                whole_column = rank * columns + c;
              }
              same =
                  same && shard[static_cast<size_t>(r * columns + c)] ==
                              full[static_cast<size_t>(whole_row * whole_columns + whole_column)];
            }
          }
          CHECK(same);
        }
      }
      const auto& metadata = reader.metadata();
      CHECK(metadata["tensor_parallel"] == nlohmann::json{{"size", size}, {"rank", rank}});
      CHECK(metadata["arguments"]["tensor_model_parallel_size"] == size);
      CHECK(metadata["args"]["tensor_model_parallel_size"] == std::to_string(size));
      CHECK(metadata["padded_vocab_size"] == 64);
      CHECK(metadata["resharded"]["from_tensor_parallel_size"] == 1);
      CHECK(metadata["resharded"]["command_line"] ==
            nlohmann::json::array({"checkpoint_util", "test"}));
      for (const char* key : {"iteration", "consumed_train_samples", "consumed_valid_samples",
                              "optimizer", "opt_param_scheduler", "rng_state", "command_line"}) {
        CAPTURE(key);
        CHECK(metadata[key] == whole.metadata()[key]);
      }
    }

    // Back to one rank: every tensor as it was, and the trainer loads it.
    const fs::path back = directory.path / ("back_from_tp" + std::to_string(size));
    reshard(sharded, back, 1, 32);
    check_same_tensors(backend::checkpoint_file_path(back, 5, 0), original);
    auto metadata = CheckpointFileReader(backend::checkpoint_file_path(back, 5, 0)).metadata();
    CHECK(metadata["resharded"]["from_tensor_parallel_size"] == size);
    metadata.erase("resharded");
    CHECK(metadata == whole.metadata());
    TrainingArguments resumed = arguments;
    resumed.checkpointing.load = back.string();
    resumed.checkpointing.save.clear();
    backend::GptModel<float> model(config);
    backend::AdamW optimizer(backend::AdamWConfig{}, {},
                             static_cast<int64_t>(model.parameters().size()));
    backend::LearningRateScheduler scheduler({.max_lr = 1e-3, .decay_steps = 5});
    std::ostringstream log;
    const auto progress = backend::load_checkpoint(resumed, model, optimizer, scheduler, log);
    REQUIRE(progress);
    CHECK(progress->iteration == 5);
    CHECK(optimizer.steps_taken() == 5);
    CHECK(model.dropout_step() == 15);
  }
}

TEST_CASE(
    "resharding pads the vocabulary as the target's size pads it: cut, or the last row repeated") {
  TemporaryDirectory directory;
  const TrainingArguments arguments = llama_arguments(directory.path / "tp1");
  save_checkpoint(arguments, 5);
  const CheckpointFileReader whole(backend::checkpoint_file_path(directory.path / "tp1", 5, 0));
  const int64_t hidden = 32;
  // The checkpoint's divisor 32 × 2 ranks: 64 → 64 rows; × 4: 128 rows; divisor 8 at 1: 48.
  const auto grown = reshard(directory.path / "tp1", directory.path / "tp4", 4);
  CHECK(grown.target_padded_vocab_size == 128);
  CHECK(grown.divisor_keeping_padding == 8);
  const auto shrunk = reshard(directory.path / "tp4", directory.path / "tp1_48", 1, 8);
  CHECK(shrunk.source_padded_vocab_size == 128);
  CHECK(shrunk.target_padded_vocab_size == 48);
  CHECK(shrunk.divisor_keeping_padding == 128);  // the checkpoint's 32 × 4 ranks / 1
  const CheckpointFileReader cut(backend::checkpoint_file_path(directory.path / "tp1_48", 5, 0));
  CHECK(cut.metadata()["padded_vocab_size"] == 48);
  for (const std::string prefix : {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."}) {
    for (const std::string table : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
      const std::string name = prefix + table;
      CAPTURE(name);
      const auto original = read_values(whole, name);
      REQUIRE(original.size() == 64 * hidden);
      // Grown: rank r of 4 holds rows [32r, 32r + 32) of 128, rows ≥ 64 copies of row 63.
      std::vector<float> rows128;
      for (int64_t rank = 0; rank < 4; ++rank) {
        const CheckpointFileReader reader(
            backend::checkpoint_file_path(directory.path / "tp4", 5, rank));
        const auto shard = read_values(reader, name);
        REQUIRE(shard.size() == 32 * hidden);
        rows128.insert(rows128.end(), shard.begin(), shard.end());
      }
      CHECK(std::equal(original.begin(), original.end(), rows128.begin()));
      bool copies = true;
      for (int64_t row = 64; row < 128; ++row) {
        copies = copies &&
                 std::equal(rows128.begin() + row * hidden, rows128.begin() + (row + 1) * hidden,
                            original.begin() + 63 * hidden);
      }
      CHECK(copies);
      // Cut to 48: the first 48 rows (the tokenizer's 41 and 7 of the padding).
      const auto rows48 = read_values(cut, name);
      REQUIRE(rows48.size() == 48 * hidden);
      CHECK(std::equal(rows48.begin(), rows48.end(), original.begin()));
    }
  }
}

TEST_CASE("checkpoint_util's export reads a tensor-parallel checkpoint's weights whole") {
  TemporaryDirectory directory;
  const TrainingArguments arguments = llama_arguments(directory.path / "tp1");
  save_checkpoint(arguments, 5);
  reshard(directory.path / "tp1", directory.path / "tp2", 2);  // 32 × 2: still 64 rows
  std::ostringstream out;
  const auto whole = backend::load_checkpoint_weights(directory.path / "tp1", out);
  const auto assembled = backend::load_checkpoint_weights(directory.path / "tp2", out);
  CHECK(out.str().find("from its 2 tensor-parallel shard file(s)") != std::string::npos);
  CHECK(assembled.config().padded_vocab_size == 64);
  const auto a = assembled.parameters();
  const auto b = whole.parameters();
  REQUIRE(a.size() == b.size());
  CHECK(std::equal(a.begin(), a.end(), b.begin()));
}

TEST_CASE("a release checkpoint reshards as a release, weights only") {
  TemporaryDirectory directory;
  TrainingArguments arguments = llama_arguments(directory.path / "release");
  arguments.checkpointing.no_save_optim = true;
  arguments.checkpointing.no_save_rng = true;
  backend::GptModel<float> model(backend::model_config(arguments));
  model.init_parameters(3);
  std::ostringstream log;
  backend::save_release_checkpoint(arguments, model, log);
  const auto result = reshard(directory.path / "release", directory.path / "tp2", 2, 16);
  CHECK(result.release);
  CHECK_FALSE(result.optimizer_state);
  CHECK(backend::read_checkpoint_tracker(directory.path / "tp2")->release);
  for (int64_t rank = 0; rank < 2; ++rank) {
    const CheckpointFileReader reader(directory.path / "tp2" / "release" /
                                      backend::checkpoint_rank_directory_name(rank) /
                                      "model_optim_rng.bin");
    CHECK(reader.tensors().size() ==
          backend::ParameterLayout(backend::model_config(arguments), 2, rank).tensors().size());
    CHECK_FALSE(reader.metadata().contains("optimizer"));
  }
}

TEST_CASE("resharding refuses bad input before writing, naming the flag or file") {
  TemporaryDirectory directory;
  const fs::path tp1 = directory.path / "tp1";
  TrainingArguments arguments = llama_arguments(tp1);
  save_checkpoint(arguments, 5);
  save_checkpoint(arguments, 6);
  const fs::path out = directory.path / "out";

  // 8 heads, 4 query groups, 48 MLP features: not 3 ranks, nor 8 (the groups).
  std::string message = reshard_error(tp1, out, 3);
  CHECK(message.find("--target-tensor-parallel-size 3: the model of") != std::string::npos);
  CHECK(message.find(
            "--num-attention-heads (8) must be divisible by --tensor-model-parallel-size (3)") !=
        std::string::npos);
  CHECK(reshard_error(tp1, out, 8).find("--num-query-groups (4) must be divisible") !=
        std::string::npos);
  CHECK(reshard_error(tp1, tp1, 2).find("is the --load directory") != std::string::npos);
  CHECK(reshard_error(tp1, tp1 / ".." / "tp1", 2).find("is the --load directory") !=
        std::string::npos);
  CHECK(reshard_error(directory.path / "none", out, 2).find("holds no checkpoint") !=
        std::string::npos);
  CHECK(reshard_error(tp1, out, 0).find("--target-tensor-parallel-size must be at least 1") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(backend::checkpoint_tracker_path(out)));

  // Iteration 6 at TP=2, and iteration 5: then pieces of the two mixed, or missing.
  reshard(tp1, directory.path / "tp2", 2, 16);  // the tracker names 6
  CHECK(reshard_error(tp1, directory.path / "tp2", 1).find("holds a checkpoint already") !=
        std::string::npos);
  const fs::path tp2 = directory.path / "tp2";
  const fs::path rank1 = backend::checkpoint_file_path(tp2, 6, 1);
  const fs::path rank0 = backend::checkpoint_file_path(tp2, 6, 0);
  const fs::path aside = directory.path / "rank1.bin";
  fs::rename(rank1, aside);
  message = reshard_error(tp2, out, 1);
  CHECK(message.find(rank1.string() + " is missing") != std::string::npos);
  CHECK(message.find("was saved with --tensor-model-parallel-size 2") != std::string::npos);
  // Rank 0's file where rank 1's belongs.
  fs::copy_file(rank0, rank1);
  CHECK(reshard_error(tp2, out, 1).find("records rank 0 of 2") != std::string::npos);
  fs::remove(rank1);
  // Rank 1 of another iteration (5, from a second resharding).
  const fs::path other = directory.path / "tp2_iteration5";
  {
    const fs::path five = directory.path / "tp1_iteration5";
    fs::create_directories(five);
    fs::copy(tp1 / "iter_0000005", five / "iter_0000005", fs::copy_options::recursive);
    std::ofstream(backend::checkpoint_tracker_path(five)) << "5";
    reshard(five, other, 2, 16);
  }
  fs::copy_file(backend::checkpoint_file_path(other, 5, 1), rank1);
  CHECK(reshard_error(tp2, out, 1)
            .find("its metadata differs from " + rank0.string() +
                  "'s in 'consumed_train_samples'") != std::string::npos);
  CHECK_FALSE(fs::exists(backend::checkpoint_tracker_path(out)));
}

TEST_CASE("divisor_keeping_padding: the --make-vocab-size-divisible-by that keeps a padded size") {
  using backend::divisor_keeping_padding;
  CHECK(divisor_keeping_padding(300, 384, 64, 2, 1) == 128);
  CHECK(divisor_keeping_padding(300, 384, 128, 1, 2) == 64);
  CHECK(divisor_keeping_padding(300, 384, 128, 1, 3) == 128);  // 384 / 3
  CHECK(divisor_keeping_padding(300, 320, 64, 1, 3) == 0);     // 320 rows do not split 3 ways
  CHECK(divisor_keeping_padding(41, 64, 32, 1, 4) == 8);
}

TEST_CASE(
    "a (tp 2, pp 2) checkpoint reshards to one process as the one-process checkpoint, bit for "
    "bit") {
  for (const std::string style : {"gpt2", "llama"}) {
    CAPTURE(style);
    TemporaryDirectory directory;
    const fs::path& d = directory.path;
    const TrainingArguments arguments =
        style == "gpt2" ? gpt2_arguments(d / "whole", 4) : llama_arguments(d / "whole");
    const fs::path whole = save_whole_checkpoint(arguments);
    save_layout_checkpoint(at_layout(arguments, d / "tp2_pp2", 2, 2), whole);
    CHECK(fs::is_regular_file(backend::checkpoint_file_path(d / "tp2_pp2", kIteration, 1, 1, 2)));
    CHECK_FALSE(fs::exists(backend::checkpoint_file_path(d / "tp2_pp2", kIteration, 0)));

    std::string output;
    const auto result = reshard(d / "tp2_pp2", d / "one", 1, 32, 1, &output);
    CHECK(result.source_tensor_parallel == 2);
    CHECK(result.source_pipeline_parallel == 2);
    CHECK(result.target_arguments.parallelism.pipeline_model_parallel_size == 1);
    CHECK_FALSE(result.interleaving_dropped);
    CHECK(output.find("resharding from tensor-parallel size 2, pipeline-parallel size 2 to "
                      "tensor-parallel size 1, pipeline-parallel size 1 (parameters and "
                      "optimizer state)") != std::string::npos);
    CHECK(output.find("[ t 1/1, p 1/1 ]") != std::string::npos);
    // Every tensor of the whole model (the tied copy gone), the moments too, in the trainer's
    // order; the metadata the one-process checkpoint's.
    const fs::path one = backend::checkpoint_file_path(d / "one", kIteration, 0);
    check_same_tensors(one, whole);
    auto metadata = CheckpointFileReader(one).metadata();
    CHECK(metadata["resharded"]["from_tensor_parallel_size"] == 2);
    CHECK(metadata["resharded"]["from_pipeline_parallel_size"] == 2);
    metadata.erase("resharded");
    CHECK(metadata == CheckpointFileReader(whole).metadata());

    // The trainer loads it, and the export reads the pipelined files whole.
    TrainingArguments resumed = arguments;
    resumed.checkpointing.load = (d / "one").string();
    resumed.checkpointing.save.clear();
    backend::GptModel<float> model(backend::model_config(arguments));
    backend::AdamW optimizer(backend::AdamWConfig{}, {},
                             static_cast<int64_t>(model.parameters().size()));
    backend::LearningRateScheduler scheduler({.max_lr = 1e-3, .decay_steps = 5});
    std::ostringstream log;
    const auto progress = backend::load_checkpoint(resumed, model, optimizer, scheduler, log);
    REQUIRE(progress);
    CHECK(progress->iteration == kIteration);
    std::ostringstream out;
    const auto exported = backend::load_checkpoint_weights(d / "tp2_pp2", out);
    CHECK(out.str().find("from its 4 files (2 tensor-parallel rank(s) × 2 pipeline stages)") !=
          std::string::npos);
    const auto a = exported.parameters();
    const auto b = model.parameters();
    REQUIRE(a.size() == b.size());
    CHECK(std::equal(a.begin(), a.end(), b.begin()));
  }
}

TEST_CASE(
    "resharding one process → (tp 2, pp 2) → one process: every file as the layout's, and back bit "
    "for bit") {
  for (const std::string style : {"gpt2", "llama"}) {
    CAPTURE(style);
    TemporaryDirectory directory;
    const fs::path& d = directory.path;
    const TrainingArguments arguments =
        style == "gpt2" ? gpt2_arguments(d / "whole", 4) : llama_arguments(d / "whole");
    const fs::path whole = save_whole_checkpoint(arguments);
    save_layout_checkpoint(at_layout(arguments, d / "built", 2, 2), whole);

    std::string output;
    const auto result = reshard(d / "whole", d / "tp2_pp2", 2, 16, 2, &output);
    CHECK(result.target_arguments.parallelism.tensor_model_parallel_size == 2);
    CHECK(result.target_arguments.parallelism.pipeline_model_parallel_size == 2);
    CHECK(output.find("[ t 1/2, p 1/2 ]") != std::string::npos);
    CHECK_FALSE(fs::exists(backend::checkpoint_file_path(d / "tp2_pp2", kIteration, 0)));
    // Each (rank, stage)'s file is the one its ranks would have saved: the stage's tensors, the
    // tied copy and its moments on the last, the sizes in the metadata and the arguments.
    check_same_checkpoint(d / "tp2_pp2", d / "built", 2, 2);
    for (int64_t rank = 0; rank < 2; ++rank) {
      CAPTURE(rank);
      const fs::path split = d / "tp2_pp2";
      const CheckpointFileReader first(
          backend::checkpoint_file_path(split, kIteration, rank, 0, 2));
      const CheckpointFileReader last(backend::checkpoint_file_path(split, kIteration, rank, 1, 2));
      for (const CheckpointFileReader* reader : {&first, &last}) {
        const auto& metadata = reader->metadata();
        CHECK(metadata["tensor_parallel"] == nlohmann::json{{"size", 2}, {"rank", rank}});
        CHECK(metadata["pipeline_parallel"] ==
              nlohmann::json{{"size", 2}, {"rank", reader == &first ? 0 : 1}});
        CHECK(metadata["arguments"]["tensor_model_parallel_size"] == 2);
        CHECK(metadata["arguments"]["pipeline_model_parallel_size"] == 2);
        CHECK(metadata["arguments"]["num_layers_per_virtual_pipeline_stage"] == 0);
        CHECK(metadata["args"]["pipeline_model_parallel_size"] == "2");
        CHECK(metadata["args"]["world_size"] == "4");
      }
      // Layers [0, L/2) on the first stage, [L/2, L) on the last.
      const std::string half = std::to_string(arguments.model.num_layers / 2);
      CHECK(first.find("decoder.layers.0.mlp.linear_fc1.weight") != nullptr);
      CHECK(first.find("decoder.layers." + half + ".mlp.linear_fc1.weight") == nullptr);
      CHECK(last.find("decoder.layers." + half + ".mlp.linear_fc1.weight") != nullptr);
      CHECK(last.find("embedding.word_embeddings.weight") == nullptr);
      CHECK(last.find("decoder.final_layernorm.weight") != nullptr);
      for (const std::string prefix : {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."}) {
        CAPTURE(prefix);
        const auto embedding = read_values(first, prefix + "embedding.word_embeddings.weight");
        const auto output_layer = read_values(last, prefix + "output_layer.weight");
        // Tied: the last stage's copy is the word embedding's shard; untied, its own tensor.
        CHECK((output_layer == embedding) == (style == "gpt2"));
      }
    }

    // And back: the one-process checkpoint, every tensor and moment bit for bit.
    reshard(d / "tp2_pp2", d / "back", 1, 32);
    check_same_checkpoint(d / "back", d / "whole", 1, 1);
  }
}

TEST_CASE(
    "resharding keeps interleaved chunks where the target's pipeline size takes them, else drops "
    "them, saying so") {
  TemporaryDirectory directory;
  const fs::path& d = directory.path;
  // 8 layers over 4 stages of two chunks of one layer: stage s holds layers s and 4 + s.
  const TrainingArguments arguments = gpt2_arguments(d / "whole", 8);
  const fs::path whole = save_whole_checkpoint(arguments);
  const TrainingArguments interleaved = at_layout(arguments, d / "pp4", 1, 4, 1);
  REQUIRE(interleaved.virtual_pipeline_chunks() == 2);
  save_layout_checkpoint(interleaved, whole);
  CHECK(CheckpointFileReader(backend::checkpoint_file_path(d / "pp4", kIteration, 0, 1, 4))
            .find("decoder.layers.5.self_attention.linear_qkv.weight") != nullptr);

  // Kept at (2, 4).
  save_layout_checkpoint(at_layout(arguments, d / "built_tp2_pp4", 2, 4, 1), whole);
  std::string output;
  auto result = reshard(d / "pp4", d / "tp2_pp4", 2, 16, 4, &output);
  CHECK(result.source_layers_per_virtual_stage == 1);
  CHECK_FALSE(result.interleaving_dropped);
  CHECK(result.target_arguments.parallelism.num_layers_per_virtual_pipeline_stage == 1);
  CHECK(output.find("interleaved") == std::string::npos);
  check_same_checkpoint(d / "tp2_pp4", d / "built_tp2_pp4", 2, 4);

  // Kept at PP=2 too (two stages take the interleaved schedule with its overlapped transfers,
  // the default): four chunks of one layer per stage.
  save_layout_checkpoint(at_layout(arguments, d / "built_pp2", 1, 2, 1), whole);
  result = reshard(d / "pp4", d / "pp2", 1, 32, 2, &output);
  CHECK_FALSE(result.interleaving_dropped);
  CHECK(result.target_arguments.parallelism.num_layers_per_virtual_pipeline_stage == 1);
  check_same_checkpoint(d / "pp2", d / "built_pp2", 1, 2);
  // Dropped at one process, saying so.
  result = reshard(d / "pp4", d / "one", 1, 32, 1, &output);
  CHECK(result.interleaving_dropped);
  CHECK(output.find("--num-layers-per-virtual-pipeline-stage 1 of the checkpoint does not fit "
                    "--target-pipeline-parallel-size 1 (the interleaved schedule needs a "
                    "pipeline-parallel size greater than 1): the resharded checkpoint has no "
                    "interleaved schedule") != std::string::npos);
  check_same_checkpoint(d / "one", d / "whole", 1, 1);
}

TEST_CASE("pipeline resharding refuses bad input before writing, naming the flag or file") {
  TemporaryDirectory directory;
  const fs::path& d = directory.path;
  const TrainingArguments arguments = gpt2_arguments(d / "whole", 4);
  const fs::path whole = save_whole_checkpoint(arguments);
  const fs::path source = d / "tp2_pp2";
  save_layout_checkpoint(at_layout(arguments, source, 2, 2), whole);
  const fs::path out = d / "out";

  std::string message = reshard_error(d / "whole", out, 1, 32, 3);
  CHECK(message.find("--target-pipeline-parallel-size 3 does not divide the 4 layers of the model "
                     "of " +
                     whole.string() +
                     " (--num-layers 4): every pipeline stage holds the "
                     "same number of layers; valid sizes: 1, 2, 4") != std::string::npos);
  CHECK(reshard_error(source, out, 1, 32, 0)
            .find("--target-pipeline-parallel-size must be at least 1, got 0") !=
        std::string::npos);

  // A stage's file missing, then another stage's in its place.
  const fs::path last = backend::checkpoint_file_path(source, kIteration, 1, 1, 2);
  const fs::path aside = d / "last.bin";
  fs::rename(last, aside);
  message = reshard_error(source, out, 1, 32);
  CHECK(message.find(last.string() + " is missing: the checkpoint") != std::string::npos);
  CHECK(message.find("was saved with --tensor-model-parallel-size 2 and "
                     "--pipeline-model-parallel-size 2, and resharding needs every one of its "
                     "files mp_rank_00_000..mp_rank_01_001") != std::string::npos);
  fs::copy_file(backend::checkpoint_file_path(source, kIteration, 1, 0, 2), last);
  CHECK(reshard_error(source, out, 1, 32)
            .find("is the file of pipeline stage 1 of 2, but it records stage 0 of 2") !=
        std::string::npos);
  fs::remove(last);
  fs::rename(aside, last);
  CHECK_FALSE(fs::exists(backend::checkpoint_tracker_path(out)));
  CHECK_FALSE(fs::exists(out / "iter_0000005"));
  reshard(source, out, 1, 32);  // complete again: it reshards
  CHECK(fs::exists(backend::checkpoint_tracker_path(out)));
}
