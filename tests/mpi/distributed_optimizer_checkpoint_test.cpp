// The distributed optimizer's checkpoint files on real ranks (mpirun -np 3): each data-parallel
// rank writes its range of the AdamW moments to its own distrib_optim_ZZZ.bin beside the
// model's file, nothing gathered; the model's file holds no moments. A load in one process
// reads the three files back into the whole buffers, bit for bit; each rank loads its own range
// alone, from these files and from a one-process checkpoint; and any other cut of the buffer
// (DP=2's ranges, whose edges fall inside the files) reads the same values. A missing file and
// files of two ranks swapped are errors naming the file.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "mpi/mpi_test_world.hpp"

using namespace backend;
namespace fs = std::filesystem;

namespace {

GptConfig small_config() {
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 16;
  config.num_attention_heads = 2;
  config.ffn_hidden_size = 24;
  config.max_position_embeddings = 8;
  config.vocab_size = 29;
  config.padded_vocab_size = 31;  // an odd count: the ranges of 2 and 3 ranks cut unevenly
  return config;
}

// Moments no optimizer step would make but every element different: a wrong offset shows.
std::vector<float> pattern(int64_t count, float scale) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = scale * static_cast<float>(i + 1);
  return values;
}

std::vector<ParameterGroup> whole_group(int64_t count) { return {{0, count, true}}; }

}  // namespace

TEST_CASE("the distributed optimizer's ranks each write their moments to their own file") {
  Communicator& world = mpi_test::world();
  REQUIRE(world.size() == 3);
  CpuDevice device;
  GptModel<float> model(small_config(), device);
  model.init_parameters(1234);
  const int64_t count = model.parameter_buffer().numel;
  const std::vector<float> exp_avg = pattern(count, 1e-3f), exp_avg_sq = pattern(count, 1e-6f);
  const ShardRange range = shard_range(count, world.size(), world.rank());
  const auto part = [&](const std::vector<float>& values) {
    return std::span(values).subspan(static_cast<size_t>(range.offset),
                                     static_cast<size_t>(range.numel));
  };
  AdamW optimizer(AdamWConfig{}, {{0, range.numel, true}}, range.numel, device);
  optimizer.copy_moments_from_host(part(exp_avg), part(exp_avg_sq));
  optimizer.set_steps_taken(5);
  LearningRateScheduler scheduler(LearningRateSchedule{.max_lr = 1e-3, .decay_steps = 800});

  // One directory for all ranks (they share the parent mpirun).
  const fs::path directory =
      fs::temp_directory_path() / fmt::format("distributed-optimizer-test-{}", ::getppid());
  if (world.rank() == 0) fs::remove_all(directory);
  world.barrier();
  std::ostringstream log;
  const OptimizerShard shard{.data_parallel = &world, .parameter_count = count, .range = range};
  save_checkpoint(CheckpointSaveOptions{.directory = directory}, {5, 40, 0}, model, optimizer,
                  scheduler, log, &shard);

  const fs::path rank_directory = checkpoint_iteration_directory(directory, 5) / "mp_rank_00";
  for (int64_t member = 0; member < 3; ++member) {
    CHECK(fs::is_regular_file(rank_directory / distributed_optimizer_file_name(member)));
  }
  const CheckpointFileReader model_file(rank_directory / "model_optim_rng.bin");
  for (const TensorEntry& entry : model_file.tensors()) {
    CHECK_MESSAGE(!entry.name.starts_with("optimizer."), entry.name);
  }

  // A load in one process: the whole moments, bit for bit.
  {
    GptModel<float> loaded_model(small_config(), device);
    AdamW loaded(AdamWConfig{}, whole_group(count), count, device);
    LearningRateScheduler loaded_scheduler(LearningRateSchedule{.max_lr = 1e-3, .decay_steps = 800});
    const auto progress = load_checkpoint(CheckpointLoadOptions{.directory = directory},
                                          loaded_model, loaded, loaded_scheduler, log);
    REQUIRE(progress.has_value());
    CHECK(progress->iteration == 5);
    CHECK(loaded.steps_taken() == 5);
    CHECK(std::ranges::equal(loaded.exp_avg(), exp_avg));
    CHECK(std::ranges::equal(loaded.exp_avg_sq(), exp_avg_sq));
    CHECK(std::ranges::equal(loaded_model.parameters(), model.parameters()));
  }

  // Each rank loads its range alone (as the trainer does), from these files and from a
  // one-process checkpoint, whose moments are by tensor: ranges cut across tensors.
  const fs::path whole_directory = directory.string() + "-whole";
  if (world.rank() == 0) {
    AdamW whole(AdamWConfig{}, whole_group(count), count, device);
    whole.copy_moments_from_host(exp_avg, exp_avg_sq);
    whole.set_steps_taken(5);
    save_checkpoint(CheckpointSaveOptions{.directory = whole_directory}, {5, 40, 0}, model, whole,
                    scheduler, log);
  }
  world.barrier();
  for (const fs::path& from : {directory, whole_directory}) {
    CAPTURE(from);
    GptModel<float> loaded_model(small_config(), device);
    AdamW loaded(AdamWConfig{}, {{0, range.numel, true}}, range.numel, device);
    LearningRateScheduler loaded_scheduler(LearningRateSchedule{.max_lr = 1e-3, .decay_steps = 800});
    REQUIRE(load_checkpoint(CheckpointLoadOptions{.directory = from}, loaded_model, loaded,
                            loaded_scheduler, log, &range));
    CHECK(loaded.steps_taken() == 5);
    CHECK(std::ranges::equal(loaded.exp_avg(), part(exp_avg)));
    CHECK(std::ranges::equal(loaded.exp_avg_sq(), part(exp_avg_sq)));
  }

  // DP=2's ranges (edges inside the files) and a stretch across all three.
  const CheckpointMetadata metadata(model_file.metadata(), model_file.path());
  REQUIRE(has_distributed_moments(metadata));
  for (const ShardRange wanted :
       {shard_range(count, 2, 0), shard_range(count, 2, 1), ShardRange{count / 3 - 5, count / 3 + 10}}) {
    CAPTURE(wanted.offset);
    std::vector<float> got_avg(static_cast<size_t>(wanted.numel)), got_sq(got_avg.size());
    read_distributed_moments(model_file.path(), metadata, count, wanted, got_avg, got_sq);
    CHECK(std::ranges::equal(got_avg, std::span(exp_avg).subspan(static_cast<size_t>(wanted.offset),
                                                                 got_avg.size())));
    CHECK(std::ranges::equal(got_sq, std::span(exp_avg_sq).subspan(static_cast<size_t>(wanted.offset),
                                                                   got_sq.size())));
  }

  world.barrier();
  if (world.rank() == 0) {
    std::vector<float> all_avg(static_cast<size_t>(count)), all_sq(all_avg.size());
    // Two ranks' files swapped: the ranges do not match, named.
    fs::rename(rank_directory / distributed_optimizer_file_name(0), rank_directory / "kept.bin");
    fs::rename(rank_directory / distributed_optimizer_file_name(1),
               rank_directory / distributed_optimizer_file_name(0));
    CHECK_THROWS_WITH_AS(
        read_distributed_moments(model_file.path(), metadata, count, {0, count}, all_avg, all_sq),
        doctest::Contains("distrib_optim_000.bin does not hold the range [0, "), common::Error);
    // A missing file: named, with the way to load the weights alone.
    fs::remove(rank_directory / distributed_optimizer_file_name(0));
    try {
      read_distributed_moments(model_file.path(), metadata, count, {0, count}, all_avg, all_sq);
      FAIL("a missing distrib_optim file was not noticed");
    } catch (const common::Error& error) {
      const std::string message = error.what();
      CHECK(message.find("distrib_optim_000.bin (rank 0's optimizer state) does not exist") !=
            std::string::npos);
      CHECK(message.find("--no-load-optim") != std::string::npos);
    }
    fs::remove_all(directory);
    fs::remove_all(whole_directory);
  }
  world.barrier();
}
