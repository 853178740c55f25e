// Pipeline parallelism on real ranks (mpirun -np 3): three GptModel<double> stages running
// Megatron's 1F1B schedule, and its interleaved schedule with two model chunks per stage, over
// Open MPI (train/pipeline_execution.hpp; the interleaved one also with its transfers overlapped)
// compute what one process computes with the whole
// model: the same initial values in every stage's tensors (the last stage's copy of a tied
// word embedding equal to the first stage's), the same summed loss over a global batch of six
// micro batches, and the same gradients tensor by tensor (fp64, to 1e-12), for a GPT-2-style
// model (tied embeddings, hidden and attention dropout) and a Llama-style one (GQA, SwiGLU,
// RoPE, RMSNorm, untied output layer). Every rank runs the reference model too and checks its
// own stage's tensors; the forward-only schedule of evaluation gives the same loss. Each unit's
// gradients are announced (--overlap-grad-reduce) once, by its chunk's last backward, complete.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/train/pipeline_execution.hpp"
#include "backend/train/pipeline_schedule.hpp"
#include "mpi/mpi_test_world.hpp"

using backend::GptConfig;
using backend::GptModel;

namespace {

constexpr int64_t kMicroBatches = 6;
constexpr int64_t kBatchSize = 2;
constexpr int64_t kSeqLength = 8;

GptConfig pipeline_gpt2_config(int64_t num_layers) {
  GptConfig config;
  config.num_layers = num_layers;
  config.hidden_size = 32;
  config.num_attention_heads = 4;
  config.ffn_hidden_size = 48;
  config.max_position_embeddings = 16;
  config.vocab_size = 97;
  config.padded_vocab_size = 100;
  config.hidden_dropout = 0.1;
  config.attention_dropout = 0.1;
  return config;
}

GptConfig pipeline_llama_config(int64_t num_layers) {
  GptConfig config = pipeline_gpt2_config(num_layers);
  config.num_attention_heads = 8;
  config.num_query_groups = 2;
  config.swiglu = true;
  config.position_embedding_type = backend::PositionEmbeddingType::rope;
  config.normalization = backend::Normalization::rms_norm;
  config.add_bias_linear = false;
  config.share_embeddings_and_output_weights = false;
  config.hidden_dropout = 0;
  config.attention_dropout = 0;
  return config;
}

backend::ModelParallelism pipeline_parallelism(const backend::PipelineStage& stage,
                                               backend::Communicator& pipeline,
                                               backend::Communicator* embedding) {
  backend::ModelParallelism parallelism;
  parallelism.pipeline = stage;
  parallelism.pipeline_parallel = &pipeline;
  parallelism.embedding = embedding;
  return parallelism;
}

// Micro batch m's tokens and labels.
void read_micro_batch(int64_t vocab_size, int64_t m, std::span<int32_t> tokens,
                      std::span<int32_t> labels) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto k = static_cast<int64_t>(i);
    tokens[i] = static_cast<int32_t>((k * 37 + 5 + m * 13) % vocab_size);
    labels[i] = static_cast<int32_t>((k * 53 + 11 + m * 7) % vocab_size);
  }
}

// max |stage − whole| over the stage's tensors (a tied copy against the word embedding),
// relative to the whole's largest magnitude; `values` picks parameters or gradients.
template <typename Values>
double stage_difference(const GptModel<double>& stage, const GptModel<double>& whole,
                        Values values) {
  double worst = 0, scale = 0;
  for (const auto& tensor : stage.tensors()) {
    const auto& reference =
        whole.tensor(tensor.tied_copy ? "embedding.word_embeddings.weight" : tensor.name);
    REQUIRE(reference.shape == tensor.shape);
    const double* stage_values = values(stage).data() + tensor.offset;
    const double* whole_values = values(whole).data() + reference.offset;
    for (int64_t i = 0; i < tensor.numel; ++i) {
      worst = std::max(worst, std::fabs(stage_values[i] - whole_values[i]));
      scale = std::max(scale, std::fabs(whole_values[i]));
    }
  }
  return worst / std::max(scale, 1e-300);
}

void check_against_one_process(const GptConfig& config, int64_t virtual_chunks,
                               bool overlap_p2p_communication = false) {
  auto& world = mpi_test::world();
  const int64_t pp = world.size();
  const int64_t rank = world.rank();
  // The embedding group: the first and last stage; the middle one alone.
  const auto embedding =
      world.split(rank == 0 || rank == pp - 1 ? 0 : 1 + rank, rank, "embedding");
  backend::CpuDevice device;
  GptModel<double> whole(config);
  GptModel<double> stage(config, device,
                         pipeline_parallelism({.pipeline_parallel = pp,
                                               .rank = rank,
                                               .virtual_chunks = virtual_chunks},
                                              world, embedding.get()));
  whole.init_parameters(42);
  stage.init_parameters(42);
  const auto parameters = [](const GptModel<double>& model) { return model.parameters(); };
  const auto gradients = [](const GptModel<double>& model) { return model.gradients(); };
  CHECK(stage_difference(stage, whole, parameters) == 0);  // the same values, exactly
  CHECK(stage.num_chunks() == virtual_chunks);

  // The reference: the micro batches one after the other, each with its own dropout step.
  whole.set_dropout_seed(9);
  stage.set_dropout_seed(9);
  const double scale = 1.0 / kMicroBatches;
  std::vector<int32_t> tokens(kBatchSize * kSeqLength), labels(kBatchSize * kSeqLength);
  double expected = 0;
  for (int64_t m = 0; m < kMicroBatches; ++m) {
    read_micro_batch(config.vocab_size, m, tokens, labels);
    whole.set_dropout_step(100 + static_cast<uint64_t>(m));
    expected += whole.forward(tokens, labels, kBatchSize, kSeqLength);
    whole.backward(scale);
  }
  // --overlap-grad-reduce's announcements: each unit's gradients as the last micro batch's
  // backward of its chunk reports them done.
  std::vector<std::pair<backend::BufferRange, std::vector<double>>> announced;
  const backend::PipelineMicroBatches inputs{
      .count = kMicroBatches,
      .read = [&](int64_t m, std::span<int32_t> t,
                  std::span<int32_t> l) { read_micro_batch(config.vocab_size, m, t, l); },
      .dropout_step = [](int64_t m) { return 100 + static_cast<uint64_t>(m); },
      .last_gradients_ready =
          [&](backend::BufferRange unit) {
            const auto values = stage.gradients().subspan(static_cast<size_t>(unit.offset),
                                                          static_cast<size_t>(unit.numel));
            announced.emplace_back(unit, std::vector<double>(values.begin(), values.end()));
          }};
  const auto steps = backend::pipeline_schedule(pp, rank, virtual_chunks, kMicroBatches,
                                                overlap_p2p_communication);
  stage.reserve(kBatchSize, kSeqLength, backend::pipeline_slots(steps));
  double loss = backend::run_pipeline_steps(stage, steps, inputs, scale, kBatchSize, kSeqLength);
  // Every unit of the stage announced once, complete: its gradients then are its final ones.
  const std::vector<backend::BufferRange> units = stage.parameter_units();
  CHECK(announced.size() == units.size());
  for (const backend::BufferRange& unit : units) {
    const auto found = std::ranges::find_if(
        announced, [&](const auto& entry) { return entry.first.offset == unit.offset; });
    REQUIRE(found != announced.end());
    CHECK(found->first.numel == unit.numel);
    const auto final_values = stage.gradients().subspan(static_cast<size_t>(unit.offset),
                                                        static_cast<size_t>(unit.numel));
    CHECK(std::ranges::equal(found->second, final_values));
  }
  stage.finalize_gradients();
  world.broadcast(backend::host_view(std::span(&loss, 1)), pp - 1);
  CHECK(std::fabs(loss - expected) <= 1e-12 * std::fabs(expected));
  CHECK(stage_difference(stage, whole, gradients) <= 1e-12);

  // Evaluation: forward only, no dropout.
  whole.set_training(false);
  stage.set_training(false);
  double evaluated = 0;
  for (int64_t m = 0; m < kMicroBatches; ++m) {
    read_micro_batch(config.vocab_size, m, tokens, labels);
    evaluated += whole.forward(tokens, labels, kBatchSize, kSeqLength);
  }
  double pipelined = backend::run_pipeline_steps(
      stage, backend::pipeline_forward_schedule(stage.pipeline_stage(), kMicroBatches),
      backend::PipelineMicroBatches{.count = kMicroBatches, .read = inputs.read, .dropout_step = {}},
      1.0, kBatchSize,
      kSeqLength);
  world.broadcast(backend::host_view(std::span(&pipelined, 1)), pp - 1);
  CHECK(std::fabs(pipelined - evaluated) <= 1e-12 * std::fabs(evaluated));
}

}  // namespace

TEST_CASE(
    "PP=3 with 1F1B and with the interleaved schedule (overlapped or not) computes one process's "
    "loss and gradients") {
  REQUIRE(mpi_test::world().size() == 3);
  for (const std::string style : {"gpt2", "llama"}) {
    CAPTURE(style);
    {
      INFO("1F1B, one layer per stage");
      check_against_one_process(style == "gpt2" ? pipeline_gpt2_config(3) : pipeline_llama_config(3), 1);
    }
    {
      INFO("1F1B, two layers per stage");
      check_against_one_process(style == "gpt2" ? pipeline_gpt2_config(6) : pipeline_llama_config(6), 1);
    }
    {
      INFO("interleaved, two chunks of one layer per stage");
      check_against_one_process(style == "gpt2" ? pipeline_gpt2_config(6) : pipeline_llama_config(6), 2);
    }
    {
      INFO("interleaved with overlapped transfers (MPI_Isend/MPI_Irecv waited for later)");
      check_against_one_process(
          style == "gpt2" ? pipeline_gpt2_config(6) : pipeline_llama_config(6), 2, true);
    }
  }
}

TEST_CASE("a pipeline the layers do not divide over, or without its embedding group, is refused") {
  auto& world = mpi_test::world();
  backend::CpuDevice device;
  const backend::PipelineStage stage{.pipeline_parallel = 3, .rank = world.rank(),
                                     .virtual_chunks = 1};
  CHECK_THROWS_WITH_AS(
      GptModel<double>(pipeline_gpt2_config(4), device,
                       pipeline_parallelism(stage, world, nullptr)),
      doctest::Contains("--num-layers 4 must be divisible by --pipeline-model-parallel-size 3"),
      common::Error);
  if (world.rank() != 1) {  // the first and last stage hold the tied embedding
    CHECK_THROWS_WITH_AS(
        GptModel<double>(pipeline_gpt2_config(3), device,
                         pipeline_parallelism(stage, world, nullptr)),
        doctest::Contains("no embedding group"), common::Error);
  }
}
