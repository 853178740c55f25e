// Resharding checkpoints (checkpoint_util --target-tensor-parallel-size) within one process: a
// one-process checkpoint of a Llama-style model (GQA, SwiGLU's two-block linear_fc1, untied
// output) cut into two and four ranks holds, in each rank's file, the shard the parameter
// layout says that rank has, of the parameters and of both moments, with the metadata of the
// target size and the rest of the state unchanged; back at one rank every tensor is the
// original's bit for bit and the trainer loads it; the vocabulary rows follow the target's
// padding (cut, or the last row repeated); the export reads the shards whole; release
// checkpoints stay releases; and each bad
// input is one error naming the flag or file, before anything is written.
#include "backend/train/checkpoint_reshard.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/common/error.hpp"
#include "backend/model/parameter_layout.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/checkpoint_conversion.hpp"
#include "backend/train/trainer.hpp"
#include "tests/temporary_directory.hpp"

namespace fs = std::filesystem;

namespace {

using backend::CheckpointFileReader;
using backend::TrainingArguments;
using test_support::TemporaryDirectory;

TrainingArguments llama_arguments(const fs::path& save) {
  TrainingArguments a;
  a.num_layers = 2;
  a.hidden_size = 32;
  a.ffn_hidden_size = 48;
  a.num_attention_heads = 8;
  a.group_query_attention = true;
  a.num_query_groups = 4;
  a.swiglu = true;
  a.position_embedding_type = "rope";
  a.normalization = "RMSNorm";
  a.add_bias_linear = false;
  a.untie_embeddings_and_output_weights = true;
  a.seq_length = 8;
  a.max_position_embeddings = 8;
  a.tokenizer_type = "NullTokenizer";
  a.vocab_size = 40;
  a.make_vocab_size_divisible_by = 32;  // 41 tokens → 64 rows at TP=1
  a.micro_batch_size = 1;
  a.global_batch_size = 1;
  a.train_iters = 5;
  a.lr = 1e-3;
  a.save = save.string();
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
  backend::save_checkpoint(arguments, {.iteration = iteration,
                                       .consumed_train_samples = iteration,
                                       .consumed_valid_samples = 2},
                           model, optimizer, scheduler, log);
}

backend::ReshardResult reshard(const fs::path& load, const fs::path& save, int64_t size,
                               int64_t divisor = 0) {
  std::ostringstream out;
  return backend::reshard_checkpoint({.load = load,
                                      .save = save,
                                      .target_tensor_parallel = size,
                                      .make_vocab_size_divisible_by = divisor,
                                      .command_line = {"checkpoint_util", "test"}},
                                     out);
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
                          int64_t divisor = 0) {
  try {
    reshard(load, save, size, divisor);
  } catch (const common::Error& error) {
    return error.what();
  }
  FAIL("expected a refusal");
  return "";
}

}  // namespace

TEST_CASE("resharding cuts every tensor and both moments by the layout, and comes back bit for bit") {
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
    CHECK(result.target_arguments.tensor_model_parallel_size == size);
    CHECK(result.target_arguments.make_vocab_size_divisible_by == 32 / size);
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
              same = same && shard[static_cast<size_t>(r * columns + c)] ==
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
    resumed.load = back.string();
    resumed.save.clear();
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

TEST_CASE("resharding pads the vocabulary as the target's size pads it: cut, or the last row repeated") {
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
        const CheckpointFileReader reader(backend::checkpoint_file_path(directory.path / "tp4", 5, rank));
        const auto shard = read_values(reader, name);
        REQUIRE(shard.size() == 32 * hidden);
        rows128.insert(rows128.end(), shard.begin(), shard.end());
      }
      CHECK(std::equal(original.begin(), original.end(), rows128.begin()));
      bool copies = true;
      for (int64_t row = 64; row < 128; ++row) {
        copies = copies && std::equal(rows128.begin() + row * hidden, rows128.begin() + (row + 1) * hidden,
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
  arguments.no_save_optim = true;
  arguments.no_save_rng = true;
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
    CHECK(reader.tensors().size() == backend::ParameterLayout(backend::model_config(arguments), 2, rank).tensors().size());
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
  CHECK(message.find("--num-attention-heads (8) must be divisible by --tensor-model-parallel-size (3)") !=
        std::string::npos);
  CHECK(reshard_error(tp1, out, 8).find("--num-query-groups (4) must be divisible") != std::string::npos);
  CHECK(reshard_error(tp1, tp1, 2).find("is the --load directory") != std::string::npos);
  CHECK(reshard_error(tp1, tp1 / ".." / "tp1", 2).find("is the --load directory") != std::string::npos);
  CHECK(reshard_error(directory.path / "none", out, 2).find("holds no checkpoint") != std::string::npos);
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
  CHECK(reshard_error(tp2, out, 1).find("its metadata differs from " + rank0.string() + "'s in 'consumed_train_samples'") !=
        std::string::npos);
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
