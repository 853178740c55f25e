// Running pretrain_gpt on real Open MPI ranks for the end-to-end tests of parallel training
// (mpirun --oversubscribe on the CI's two cores), and reading what the runs saved: the
// parameters of a checkpoint as whole tensors, whatever tensor-parallel size wrote it (each
// rank's mp_rank_XX shard put in place by the layout's shard_pieces), so runs of different
// layouts can be compared weight by weight; and the flags of the tensor-parallel tests.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/model/parameter_layout.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/trainer.hpp"
#include "logged_losses.hpp"
#include "mpi_test_environment.hpp"
#include "spawned_process.hpp"
#include "test_files.hpp"

namespace test_support {

inline std::string mpirun_path() {
  for (const char* candidate : {"/usr/bin/mpirun", "/usr/local/bin/mpirun"}) {
    if (std::filesystem::exists(candidate)) return candidate;
  }
  return {};
}

// pretrain_gpt with `flags`, under mpirun -np `ranks` when ranks > 1.
inline std::vector<std::string> pretrain_command(int ranks, const std::vector<std::string>& flags) {
  std::vector<std::string> argv;
  if (ranks > 1) argv = {mpirun_path(), "-np", std::to_string(ranks), "--oversubscribe"};
  argv.push_back(std::string(TEST_BIN_DIR) + "/pretrain_gpt");
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

// Runs it to the end with its output in `log`; the exit status. Under mpirun each rank's
// output goes to files of its own (--output-filename DIR:nocopy) that are appended to `log`
// rank by rank after mpirun's own messages: mpirun forwards what it reads from a rank's pipe
// in chunks of up to 4 KiB, so when it falls behind (two cores, several ranks) a chunk can end
// inside a line and another rank's chunk land in the middle of it, which would break the
// iteration line a test counts. Each rank's lines stay whole and in order this way.
inline int run_pretrain(int ranks, const std::vector<std::string>& flags,
                        const std::filesystem::path& log) {
  static const std::vector<std::string> environment = mpi_test_environment();
  std::vector<std::string> command = pretrain_command(ranks, flags);
  const std::filesystem::path rank_output = log.string() + ".ranks";
  if (ranks > 1) {
    std::filesystem::remove_all(rank_output);
    command.insert(command.begin() + 4, {"--output-filename", rank_output.string() + ":nocopy"});
  }
  const int status = wait_for_exit(spawn_process(command, log, environment));
  if (ranks > 1) {
    std::ofstream merged(log, std::ios::app | std::ios::binary);
    for (int rank = 0; rank < ranks; ++rank) {
      for (const char* stream : {"stdout", "stderr"}) {
        // Open MPI 4 writes DIR/1/rank.N/{stdout,stderr} (the 1: the job's number).
        const std::filesystem::path file =
            rank_output / "1" / ("rank." + std::to_string(rank)) / stream;
        if (std::filesystem::exists(file)) merged << read_file(file);
      }
    }
  }
  return status;
}

inline std::vector<float> as_floats(const std::vector<std::byte>& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

// The parameters of iteration `iteration` in the save directory `save` (with `prefix`, e.g.
// "optimizer.exp_avg.", the tensors of that name instead: the optimizer's moments), parameter
// name → the whole tensor, assembled from every tensor-parallel rank's file of every pipeline
// stage (the last stage's copy of a tied word embedding left out).
inline std::map<std::string, std::vector<float>> whole_parameters(
    const std::filesystem::path& save, int64_t iteration, const std::string& prefix = "") {
  const auto tracked = backend::read_checkpoint_tracker(save);
  const std::filesystem::path first_file =
      tracked && tracked->iteration == iteration
          ? tracked->file
          : backend::checkpoint_file_path(save, iteration, 0);
  const backend::CheckpointFileReader first(first_file);
  const backend::TrainingArguments arguments =
      backend::arguments_from_checkpoint(first.metadata(), first.path());
  const backend::GptConfig config = backend::model_config(arguments);
  const int64_t tp = arguments.parallelism.tensor_model_parallel_size;
  const int64_t pp = arguments.parallelism.pipeline_model_parallel_size;
  std::map<std::string, std::vector<float>> whole;
  for (int64_t stage = 0; stage < pp; ++stage)
  for (int64_t rank = 0; rank < tp; ++rank) {
    const backend::ParameterLayout layout(
        config, tp, rank,
        {.pipeline_parallel = pp, .rank = stage, .virtual_chunks = arguments.virtual_pipeline_chunks()});
    const backend::CheckpointFileReader reader(
        backend::checkpoint_file_path(save, iteration, rank, stage, pp));
    for (const auto& tensor : layout.tensors()) {
      if (tensor.tied_copy) continue;
      const auto* entry = reader.find(prefix + tensor.name);
      if (entry == nullptr) continue;
      const std::vector<float> shard = as_floats(reader.read_bytes(*entry));
      std::vector<float>& values = whole[tensor.name];
      int64_t full_numel = 1;
      for (const int64_t extent : tensor.full_shape) full_numel *= extent;
      values.resize(static_cast<size_t>(full_numel));
      for (const auto& piece : backend::shard_pieces(tensor, tp, rank)) {
        std::memcpy(values.data() + piece.full_offset, shard.data() + piece.shard_offset,
                    static_cast<size_t>(piece.numel) * sizeof(float));
      }
    }
  }
  return whole;
}

// The flags of the tensor-parallel end-to-end tests: a GPT-2-style model (hidden dropout) or a
// Llama-style one (GQA, SwiGLU, RoPE, RMSNorm, no biases, untied output; --eod-mask-loss, so
// the positions after the mock data's EOD tokens, about one in 300, are ignored through the
// vocabulary-parallel loss and the pipeline's last stage, and --calculate-per-token-loss, so
// the global batch's scored tokens are counted across the layout) of 2 layers, 20
// iterations on mock data, saved to `save`. The vocabulary is padded to the same 384 rows at
// every size (--make-vocab-size-divisible-by 128 / tp), as Megatron's padding to a multiple of
// divisible_by × tp would otherwise give the TP=2 model 128 more (never used) rows.
inline std::vector<std::string> tensor_parallel_training_flags(const std::string& style,
                                                               int tensor_parallel,
                                                               const std::filesystem::path& save) {
  std::vector<std::string> flags = {
      "--num-layers", "2", "--hidden-size", "64", "--seq-length", "32",
      "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "20",
      "--lr", "2e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine",
      "--clip-grad", "1.0", "--vocab-size", "299", "--tokenizer-type", "NullTokenizer",
      "--mock-data", "--log-interval", "1", "--eval-interval", "10", "--eval-iters", "1",
      "--attention-dropout", "0", "--save", save.string(),
      "--tensor-model-parallel-size", std::to_string(tensor_parallel),
      "--make-vocab-size-divisible-by", std::to_string(128 / tensor_parallel)};
  if (style == "llama") {
    flags.insert(flags.end(), {"--num-attention-heads", "8", "--group-query-attention",
                               "--num-query-groups", "2", "--swiglu", "--ffn-hidden-size", "96",
                               "--position-embedding-type", "rope", "--normalization", "RMSNorm",
                               "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                               "--hidden-dropout", "0", "--eod-mask-loss",
                               "--calculate-per-token-loss"});
  } else {
    // Hidden dropout applies to activations every tensor-parallel rank holds whole: one
    // process's masks.
    flags.insert(flags.end(), {"--num-attention-heads", "4", "--hidden-dropout", "0.1"});
  }
  return flags;
}

// The layout tests run their Llama-style model with --distributed-backend gloo: every
// collective staged through a host buffer over Open MPI (backend/dist/device_collectives.hpp),
// the route a GPU rank's tensors take. Staging copies bytes, so the same expected losses hold;
// GPT-2's runs keep Open MPI reading the model's memory directly.
inline void stage_collectives_for(const std::string& style, std::vector<std::string>& flags) {
  if (style == "llama") flags.insert(flags.end(), {"--distributed-backend", "gloo"});
}
inline void check_staged_for(const std::string& style, const std::string& output) {
  CHECK((output.find("--distributed-backend gloo: every collective over Open MPI") !=
         std::string::npos) == (style == "llama"));
}

// Every iteration of `losses` has the loss `expected` has for it, within 1e-6 relative; with
// `all`, the two have the same iterations.
inline void check_same_losses(const std::map<int, double>& losses,
                              const std::map<int, double>& expected, bool all = true) {
  if (all) REQUIRE(losses.size() == expected.size());
  REQUIRE(!losses.empty());
  for (const auto& entry : losses) {  // (clang 14: no CAPTURE of a structured binding)
    const int iteration = entry.first;
    CAPTURE(iteration);
    REQUIRE(expected.count(iteration) == 1);
    const double loss = expected.at(iteration);
    CHECK(std::fabs(entry.second - loss) <= 1e-6 * std::fabs(loss));
  }
}

// The losses of a run resumed in the layout it saved (`output`, its log): `count` iterations,
// each with the same bits as the loss `expected` has for it.
inline void check_resumed_bit_for_bit(const std::string& output,
                                      const std::map<int, double>& expected, size_t count) {
  const auto resumed = logged_losses(output);
  REQUIRE(resumed.size() == count);
  for (const auto& entry : resumed) {
    const int iteration = entry.first;
    CAPTURE(iteration);
    REQUIRE(expected.count(iteration) == 1);
    CHECK(entry.second == expected.at(iteration));
  }
}

// Whether element i of a linear_qkv bias is a key's: its gradient is zero in exact arithmetic
// (q · (k + b) adds q · b to every score of a row, which the softmax ignores), so what it gets is
// rounding noise, which Adam's normalisation turns into steps of the learning rate's size; two
// runs that round differently move it differently by design.
inline bool is_key_bias(const backend::GptConfig& config, size_t i) {
  const int64_t head_dim = config.head_dim();
  const int64_t queries = config.num_attention_heads / config.query_groups();
  const int64_t in_group = static_cast<int64_t>(i) % ((queries + 2) * head_dim);
  return in_group >= queries * head_dim && in_group < (queries + 1) * head_dim;
}

// max |a − b| / max |b| over the parameters of two checkpoints (iteration `iteration` of save
// directories `actual` and `expected`), key biases (is_key_bias) left out; a tensor missing
// from `actual` makes it infinite. `worst_tensor` (when given) receives the name and index of
// the element where the largest difference is.
inline double weight_difference(const std::filesystem::path& actual,
                                const std::filesystem::path& expected, int64_t iteration,
                                std::string* worst_tensor = nullptr) {
  const auto a = whole_parameters(actual, iteration);
  const auto b = whole_parameters(expected, iteration);
  const auto tracked = backend::read_checkpoint_tracker(expected);
  const backend::CheckpointFileReader first(
      tracked && tracked->iteration == iteration ? tracked->file
                                                 : backend::checkpoint_file_path(expected, iteration, 0));
  const backend::GptConfig config =
      backend::model_config(backend::arguments_from_checkpoint(first.metadata(), first.path()));
  double worst = 0, scale = 0;
  for (const auto& [name, values] : b) {
    const auto found = a.find(name);
    if (found == a.end() || found->second.size() != values.size()) return INFINITY;
    const bool qkv_bias = name.ends_with("linear_qkv.bias");
    for (size_t i = 0; i < values.size(); ++i) {
      if (qkv_bias && is_key_bias(config, i)) continue;
      const double difference = std::fabs(static_cast<double>(found->second[i]) - values[i]);
      if (difference > worst && worst_tensor != nullptr) {
        *worst_tensor = name + "[" + std::to_string(i) + "]";
      }
      worst = std::max(worst, difference);
      scale = std::max(scale, std::fabs(static_cast<double>(values[i])));
    }
  }
  return worst / std::max(scale, 1e-30);
}

}  // namespace test_support
