// --cuda-graph-impl local over data-parallel ranks (mpirun -np 3, the CPU device, whose capture
// records the ops and, through captured_collectives, the data-parallel group's all-reduces of
// the gradients and the loss in their places): after the warm-up the step is captured once and
// replayed, and every iteration's loss, gradient norm and parameter norm are the eager DP=3
// run's bits, with dropout (each rank's micro batches at their own dropout steps) and with the
// fp16 loss scaler, with the distributed optimizer (the gradients reduce-scattered into each
// rank's shard, the updated shards gathered), and at TP=3 (the model's tensor-parallel
// collectives, through the trainer's captured group), and with ZeRO-3 (each unit's gather and
// gradient sum inside the forward and backward, likewise), and with --overlap-grad-reduce's
// buckets started during the backward, and at PP=3 (the schedule's transfers, overlapped or
// not, through the trainer's captured pipeline group), and with --overlap-param-gather (the
// updated shards' gathers started by the next step's graph), and with --log-num-zeros-in-grad
// (the count in the step's graph).
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>

#include "backend/dist/process_groups.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trainer.hpp"
#include "captured_log.hpp"
#include "mpi/mpi_test_world.hpp"
#include "tests/backend/train/same_iterations.hpp"
#include "tests/backend/train/tiny_gpt_arguments.hpp"

using namespace backend;

namespace {

// `a` trained over the test's three ranks at DP=3 (or the layout its flags ask for).
TrainingResult train_on_three_ranks(TrainingArguments a) {
  Communicator& world = mpi_test::world();
  a.parallelism.world_size = world.size();  // what parse_arguments reads from the launcher
  validate_arguments(a);
  ProcessGroups groups =
      make_process_groups(world.split(0, world.rank(), "world"), parallel_layout(a.parallelism));
  std::ostringstream out;
  return pretrain(a, out, {}, groups);
}

// `eager` trained as it is and with graphs after one warm-up step: the same bits every
// iteration. Returns the graphs run's log.
std::string check_graphs_keep_the_eager_bits(const TrainingArguments& eager) {
  const TrainingResult expected = train_on_three_ranks(eager);
  auto graphs = eager;
  graphs.cuda_graph_impl = CudaGraphImpl::local;
  graphs.cuda_graph_warmup_steps = 1;
  test_support::CapturedLog log;
  const TrainingResult replayed = train_on_three_ranks(graphs);
  test_support::check_same_iterations(replayed, expected);
  return log.text.str();
}

// The tiny GPT at DP=3: global batch 12 of micro batch 2, two micro batches a rank.
TrainingArguments data_parallel_arguments() {
  auto a = test_support::tiny_gpt_arguments(6);
  a.run.global_batch_size = 12;
  a.logging.log_params_norm = true;
  return a;
}

}  // namespace

TEST_CASE("DP=3 steps replayed from graphs are the eager DP=3 run's bits, with dropout") {
  auto a = data_parallel_arguments();
  a.model.hidden_dropout = a.model.attention_dropout = 0.1;
  const std::string text = check_graphs_keep_the_eager_bits(a);
  CAPTURE(text);
  CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
  CHECK(text.find("step: eager at iteration 3") == std::string::npos);
}

TEST_CASE("DP=3 --calculate-per-token-loss steps replayed from graphs divide by the ranks' count") {
  // Each rank's micro batches scaled by their own counts; the summed gradients divided by the
  // count summed over the ranks (a host sum before the step's device work). Mock data scores
  // every label, so the counts are equal; the loss's weighting by them is checked anyway.
  auto a = data_parallel_arguments();
  a.data.calculate_per_token_loss = true;
  const std::string text = check_graphs_keep_the_eager_bits(a);
  CAPTURE(text);
  CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
  CHECK(text.find("step: eager at iteration 3") == std::string::npos);
}

TEST_CASE("DP=3 fp16 steps replayed from graphs take each step's loss scale") {
  auto a = data_parallel_arguments();
  a.precision.fp16 = true;
  a.precision.loss_scale_window = 1;  // the scale doubles every step, replays included
  const std::string text = check_graphs_keep_the_eager_bits(a);
  CAPTURE(text);
  CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
}

TEST_CASE(
    "with the distributed optimizer, replayed DP=3 steps reduce-scatter and gather the "
    "eager run's bits") {
  auto a = data_parallel_arguments();
  a.parallelism.use_distributed_optimizer = true;
  const std::string text = check_graphs_keep_the_eager_bits(a);
  CAPTURE(text);
  CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
  CHECK(text.find("step: eager at iteration 3") == std::string::npos);
}

TEST_CASE(
    "with --overlap-grad-reduce, replayed DP=3 steps start the buckets in the backward as "
    "eagerly") {
  // Small buckets, so that several start during the last micro batch's backward: all-reduced
  // (DDP) or reduce-scattered into the shards (the distributed optimizer).
  for (const bool distributed_optimizer : {false, true}) {
    CAPTURE(distributed_optimizer);
    auto a = data_parallel_arguments();
    a.parallelism.overlap_grad_reduce = true;
    a.parallelism.ddp_bucket_size = 2000;
    a.parallelism.use_distributed_optimizer = distributed_optimizer;
    const std::string text = check_graphs_keep_the_eager_bits(a);
    CAPTURE(text);
    CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
    CHECK(text.find("step: eager at iteration 3") == std::string::npos);
  }
}

TEST_CASE("ZeRO-3 steps replayed from graphs gather each unit and sum its gradients as eagerly") {
  auto a = data_parallel_arguments();
  a.parallelism.zero_stage = 3;
  a.model.hidden_dropout = a.model.attention_dropout = 0.1;
  const std::string text = check_graphs_keep_the_eager_bits(a);
  CAPTURE(text);
  CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
  CHECK(text.find("step: eager at iteration 3") == std::string::npos);
}

TEST_CASE(
    "TP=3 steps replayed from graphs, with and without sequence parallelism, are the "
    "eager run's bits") {
  // The tensor-parallel group's collectives inside the forward and backward (the vocabulary
  // shards' cross-entropy, sequence parallelism's gathers and scatters, the norms' gradient
  // sums) recorded in their places; the classifier shard's backward reads its staged scale.
  for (const bool sequence_parallel : {false, true}) {
    CAPTURE(sequence_parallel);
    auto a = data_parallel_arguments();
    a.parallelism.tensor_model_parallel_size = 3;
    a.parallelism.sequence_parallel = sequence_parallel;
    a.run.global_batch_size = 4;
    a.model.num_attention_heads = 3;
    a.model.hidden_size = 24;
    a.model.seq_length = 15;  // sequence parallelism shares it over the three ranks
    a.model.hidden_dropout = a.model.attention_dropout = 0.1;
    const std::string text = check_graphs_keep_the_eager_bits(a);
    CAPTURE(text);
    CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
    CHECK(text.find("step: eager at iteration 3") == std::string::npos);
  }
}

TEST_CASE(
    "PP=3 steps replayed from graphs, 1F1B and interleaved with overlapped transfers, are the "
    "eager run's bits") {
  // The schedule's transfers between stages (each overlapped post and its wait recorded in
  // their places), the tied embedding's gradient sum over the first and last stage, the loss's
  // broadcast from the last stage and the norm's sums over the stages; each stage's micro
  // batches staged with their dropout keys and scales.
  for (const bool interleaved : {false, true}) {
    CAPTURE(interleaved);
    auto a = data_parallel_arguments();
    // Three micro batches (the interleaved schedule takes a multiple of the stages), four
    // iterations: captured at 2, replayed at 3 and 4.
    a.run.global_batch_size = 6;
    a.run.train_iters = 4;
    a.parallelism.pipeline_model_parallel_size = 3;
    a.model.num_layers = interleaved ? 6 : 3;
    // Megatron's default with interleaving: the transfers overlapped (post, compute, wait).
    if (interleaved) a.parallelism.num_layers_per_virtual_pipeline_stage = 1;
    a.model.hidden_dropout = a.model.attention_dropout = 0.1;
    a.data.calculate_per_token_loss = interleaved;
    const std::string text = check_graphs_keep_the_eager_bits(a);
    CAPTURE(text);
    CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
    CHECK(text.find("step: eager at iteration 3") == std::string::npos);
  }
}

TEST_CASE(
    "with --overlap-param-gather, replayed DP=3 steps gather the shards in buckets at the "
    "forward, and an evaluation or a save between gathers them at once") {
  // A captured update leaves the other ranks' ranges owed; the next step's graph starts the
  // buckets' all-gathers and each unit's first use waits for its own. Evaluations after 2, 4
  // and 6 gather them at once (the capture at 3 follows one, and its graph must gather anyway),
  // saves after 3 and 6 too, every rank alike; iteration 6 replays onto the update of 5 with
  // nothing between: a replay that did not gather would train on stale ranges. With
  // --log-params-norm, whose norm reads every parameter, the update gathers them whole.
  for (const bool params_norm : {false, true}) {
    CAPTURE(params_norm);
    auto a = data_parallel_arguments();
    a.run.train_iters = 7;
    a.parallelism.use_distributed_optimizer = true;
    a.parallelism.overlap_grad_reduce = true;
    a.parallelism.overlap_param_gather = true;
    a.parallelism.ddp_bucket_size = 2000;  // several buckets
    a.logging.log_params_norm = params_norm;
    a.evaluation.eval_interval = 2;
    a.evaluation.eval_iters = 1;
    a.checkpointing.save_interval = 3;
    Communicator& world = mpi_test::world();
    const std::filesystem::path directory =
        std::filesystem::temp_directory_path() /
        fmt::format("overlap-param-gather-graphs-{}", ::getppid());
    if (world.rank() == 0) std::filesystem::remove_all(directory);
    world.barrier();
    a.checkpointing.save = (directory / "eager").string();
    const TrainingResult expected = train_on_three_ranks(a);
    auto graphs = a;
    graphs.checkpointing.save = (directory / "graphs").string();
    graphs.cuda_graph_impl = CudaGraphImpl::local;
    graphs.cuda_graph_warmup_steps = 2;
    test_support::CapturedLog log;
    const TrainingResult replayed = train_on_three_ranks(graphs);
    test_support::check_same_iterations(replayed, expected);
    CHECK(replayed.validation_loss == expected.validation_loss);
    const std::string text = log.text.str();
    CAPTURE(text);
    CHECK(text.find("step: graphs captured at iteration 3 on cpu (") != std::string::npos);
    CHECK(text.find("step: eager at iteration 4") == std::string::npos);
    world.barrier();
    if (world.rank() == 0) std::filesystem::remove_all(directory);
  }
}

TEST_CASE("over ranks, --log-num-zeros-in-grad's counts in replayed steps are the eager run's") {
  // Each rank's count of its gradients, summed over the group where the ranks hold shards
  // (the distributed optimizer), in the step's graph.
  for (const bool distributed_optimizer : {false, true}) {
    CAPTURE(distributed_optimizer);
    auto a = data_parallel_arguments();
    a.logging.log_num_zeros_in_grad = true;
    a.model.untie_embeddings_and_output_weights = true;  // unseen tokens' rows: zeros
    a.parallelism.use_distributed_optimizer = distributed_optimizer;
    const TrainingResult expected = train_on_three_ranks(a);
    auto graphs = a;
    graphs.cuda_graph_impl = CudaGraphImpl::local;
    graphs.cuda_graph_warmup_steps = 1;
    test_support::CapturedLog log;
    const TrainingResult replayed = train_on_three_ranks(graphs);
    test_support::check_same_iterations(replayed, expected);
    const std::string text = log.text.str();
    CAPTURE(text);
    CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
    for (size_t i = 0; i < expected.iterations.size(); ++i) {
      CAPTURE(i);
      REQUIRE(expected.iterations[i].num_zeros_in_grad.has_value());
      CHECK(*expected.iterations[i].num_zeros_in_grad > 0);
      CHECK(replayed.iterations[i].num_zeros_in_grad == expected.iterations[i].num_zeros_in_grad);
    }
  }
}
