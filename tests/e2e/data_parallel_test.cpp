// Data parallelism with real Open MPI ranks (mpirun --oversubscribe on the CI's two cores):
// DP=2 and DP=4 train the same losses as one process accumulating the same global batch
// (Megatron's sampler gives each rank its slice, gradients are summed over the group), for a
// GPT-2-style model with dropout and a Llama-style model (GQA, SwiGLU, RoPE); the weights saved
// after 20 steps agree within 1e-5; the iteration lines are printed once, by the last rank; a rank
// killed with SIGKILL ends the whole job, non-zero, within seconds; a rank stopped with SIGSTOP
// (which mpirun does not notice) ends it through --distributed-timeout-minutes, the waiting rank
// naming itself, its host, the call and the flag; SIGTERM to one rank under --exit-signal-handler
// saves the same iteration on both and ends the job 0; and a multi-task launch that is not MPI's is
// refused with how to launch instead.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_file.hpp"
#include "e2e/mpi_runs.hpp"
#include "logged_losses.hpp"
#include "mpi_test_environment.hpp"
#include "sanitized_build.hpp"
#include "spawned_process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using test_support::check_same_losses;
using test_support::check_staged_for;
using test_support::logged_losses;
using test_support::mpi_test_environment;
using test_support::output_tail;
using test_support::pretrain_command;
using test_support::read_file;
using test_support::release_only;
using test_support::run_pretrain;
using test_support::spawn_process;
using test_support::stage_collectives_for;
using test_support::TemporaryDirectory;
using test_support::tensor_parallel_training_flags;
using test_support::wait_for_exit;
using test_support::weight_difference;

namespace fs = std::filesystem;

namespace {

using test_support::mpirun_path;

const std::vector<std::string> kEnvironment = mpi_test_environment();

std::vector<std::string> training_flags(const std::string& style, const fs::path& save) {
  std::vector<std::string> flags = {
      "--num-layers", "2", "--hidden-size", "64", "--seq-length", "32",
      "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "20",
      "--lr", "2e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine",
      "--clip-grad", "1.0", "--vocab-size", "299", "--tokenizer-type", "NullTokenizer",
      "--mock-data", "--log-interval", "1", "--eval-interval", "10", "--eval-iters", "1",
      "--hidden-dropout", "0", "--attention-dropout", "0", "--save", save.string()};
  if (style == "llama") {
    flags.insert(flags.end(), {"--num-attention-heads", "8", "--group-query-attention",
                               "--num-query-groups", "2", "--swiglu", "--ffn-hidden-size", "96",
                               "--position-embedding-type", "rope", "--normalization", "RMSNorm",
                               "--disable-bias-linear", "--untie-embeddings-and-output-weights"});
  } else {
    // With dropout: the masks follow the sample's place in the global batch, so DP=2 draws
    // the masks one process draws.
    flags.insert(flags.end(), {"--num-attention-heads", "4", "--hidden-dropout", "0.1",
                               "--attention-dropout", "0.1"});
  }
  return flags;
}

std::vector<std::string> command(int ranks, const std::vector<std::string>& flags) {
  return pretrain_command(ranks, flags);
}

int run(int ranks, const std::vector<std::string>& flags, const fs::path& log) {
  return run_pretrain(ranks, flags, log);
}

// The ranks mpirun started: its children.
std::vector<pid_t> children_of(pid_t mpirun) {
  const std::string children = read_file(fs::path("/proc") / std::to_string(mpirun) / "task" /
                                         std::to_string(mpirun) / "children");
  std::vector<pid_t> ranks;
  for (size_t at = 0; at < children.size();) {
    const size_t end = children.find(' ', at);
    const std::string word = children.substr(at, end - at);
    if (!word.empty()) ranks.push_back(std::stoi(word));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return ranks;
}

// Whether `pid` runs (or is stopped): it exists and is not a zombie waiting for its new parent
// to reap it.
bool running(pid_t pid) {
  std::error_code error;
  const fs::path stat_file = fs::path("/proc") / std::to_string(pid) / "stat";
  if (!fs::exists(stat_file, error)) return false;
  const std::string stat = read_file(stat_file);
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// Waits for the training lines to start (an iteration line in `log`).
void wait_for_training(const fs::path& log) {
  const auto started = std::chrono::steady_clock::now();
  while (read_file(log).find(" iteration ") == std::string::npos) {
    REQUIRE(std::chrono::steady_clock::now() - started < std::chrono::seconds(60));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

// release-only: 2 minutes under the sanitizers; DP=2 with and without the distributed
// optimizer runs sanitized in "checkpoints move between DP=2, the distributed optimizer and
// one process".
TEST_CASE(
    "DP=2 and DP=4 over Open MPI, with and without the distributed optimizer, train as one "
    "process" *
    release_only()) {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  for (const std::string style : {"gpt2", "llama"}) {
    CAPTURE(style);
    const fs::path single_save = directory.path / (style + "_dp1");
    const fs::path single_log = directory.path / (style + "_dp1.log");
    REQUIRE(run(1, training_flags(style, single_save), single_log) == 0);
    int single_lines = 0;
    const auto expected = logged_losses(read_file(single_log), &single_lines);
    REQUIRE(expected.size() == 20);
    for (const auto& [ranks_value, distributed_value] :
         {std::pair{2, false}, std::pair{4, false}, std::pair{2, true}, std::pair{4, true}}) {
      const int ranks = ranks_value;  // (clang 14: no CAPTURE of a structured binding)
      const bool distributed = distributed_value;
      CAPTURE(ranks);
      CAPTURE(distributed);
      const std::string name = style + "_dp" + std::to_string(ranks) + (distributed ? "_zero1" : "");
      const fs::path save = directory.path / name;
      const fs::path log = directory.path / (name + ".log");
      auto flags = training_flags(style, save);
      if (distributed) flags.push_back("--use-distributed-optimizer");
      stage_collectives_for(style, flags);
      const int status = run(ranks, flags, log);
      const std::string output = read_file(log);
      INFO(output_tail(output));
      REQUIRE(status == 0);
      check_staged_for(style, output);
      int lines = 0;
      const auto losses = logged_losses(output, &lines);
      CHECK(lines == 20);  // printed once, by the last rank
      CHECK(output.find("> initialized tensor model parallel with size 1") != std::string::npos);
      CHECK(output.find(fmt::format("setting number of micro-batches to constant {}",
                                    4 / ranks)) != std::string::npos);
      size_t dumps = 0;
      for (size_t at = output.find("-- arguments --"); at != std::string::npos;
           at = output.find("-- arguments --", at + 1)) {
        ++dumps;
      }
      CHECK(dumps == 1);  // rank 0's
      CHECK(std::regex_search(output, std::regex(fmt::format(R"(\n  data_parallel_size \.+ {}\n)",
                                                              ranks))));
      REQUIRE(losses.size() == expected.size());
      for (const auto& entry : expected) {  // (clang 14: no CAPTURE of a structured binding)
        const int iteration = entry.first;
        const double loss = entry.second;
        CAPTURE(iteration);
        CHECK(std::fabs(losses.at(iteration) - loss) <= 1e-6 * std::fabs(loss));
      }
      CHECK(weight_difference(save, single_save, 20) <= 1e-5);
    }
  }
}

TEST_CASE(
    "--overlap-grad-reduce over DP=2 and TP=2 x DP=2 with sequence parallelism, with and without "
    "the distributed optimizer and --overlap-param-gather, trains as one process") {
  // Each bucket's reduction starts inside the last micro batch's backward (MPI_Iallreduce, or
  // for the distributed optimizer MPI_Ireduce_scatter into the shards): every unit its own
  // bucket (--ddp-bucket-size 1) at TP=1, Megatron's default size (one bucket for these models)
  // at TP=2, and buckets of about two layers with the distributed optimizer (at TP=1, and at
  // TP=2 with sequence parallelism, whose norm gradients are then summed over the
  // tensor-parallel group on the shards), whose parameters also come back in buckets
  // (MPI_Iallgatherv) that the next forward waits for layer by layer; the sums are the same,
  // so the losses and weights are one process's. The last layout again with --cuda-graph-impl
  // local (release build only): the replayed steps start those gathers at their forward, among
  // the tensor-parallel collectives, and still train as one process.
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  struct Layout {
    int tensor_parallel;
    bool distributed;
    const char* bucket_size;  // nullptr: Megatron's default
    bool graphs = false;
  };
  for (const std::string& style : test_support::model_styles()) {
    CAPTURE(style);
    const fs::path single_save = directory.path / (style + "_one");
    const fs::path single_log = directory.path / (style + "_one.log");
    REQUIRE(run(1, tensor_parallel_training_flags(style, 1, single_save), single_log) == 0);
    const auto expected = logged_losses(read_file(single_log));
    for (const Layout layout :
         {Layout{1, false, "1"}, Layout{2, false, nullptr}, Layout{1, true, "20000"},
          Layout{2, true, "20000"}, Layout{2, true, "20000", true}}) {
      // Sanitized, the first and the eager last (each bucket's all-reduce; the distributed
      // optimizer's reduce-scatters and gathers under TP and SP), which reach every collective
      // the other two do: each run costs several times more there.
      if (test_support::kSanitizedBuild &&
          (layout.graphs || layout.tensor_parallel != (layout.distributed ? 2 : 1))) {
        continue;
      }
      CAPTURE(layout.tensor_parallel);
      CAPTURE(layout.distributed);
      CAPTURE(layout.graphs);
      const fs::path save =
          directory.path /
          fmt::format("{}_overlap_tp{}_{}", style, layout.tensor_parallel, layout.distributed);
      auto flags = tensor_parallel_training_flags(style, layout.tensor_parallel, save);
      flags.push_back("--overlap-grad-reduce");
      if (layout.tensor_parallel == 2) flags.push_back("--sequence-parallel");
      if (layout.distributed) {
        flags.insert(flags.end(), {"--use-distributed-optimizer", "--overlap-param-gather"});
      }
      if (layout.bucket_size != nullptr) {
        flags.insert(flags.end(), {"--ddp-bucket-size", layout.bucket_size});
      }
      if (layout.graphs) flags.insert(flags.end(), {"--cuda-graph-impl", "local"});
      stage_collectives_for(style, flags);
      const fs::path log = directory.path / (style + "_overlap.log");
      const int status = run(2 * layout.tensor_parallel, flags, log);
      const std::string output = read_file(log);
      INFO(output_tail(output));
      REQUIRE(status == 0);
      check_staged_for(style, output);
      CHECK(std::regex_search(output, std::regex(R"(\n  overlap_grad_reduce \.+ True\n)")));
      CHECK(std::regex_search(output,
                              std::regex(fmt::format(R"(\n  overlap_param_gather \.+ {}\n)",
                                                     layout.distributed ? "True" : "False"))));
      CHECK(std::regex_search(
          output,
          std::regex(fmt::format(R"(\n  ddp_bucket_size \.+ {}\n)",
                                 layout.bucket_size != nullptr ? layout.bucket_size : "None"))));
      CHECK(output.find("not overlapped yet") == std::string::npos);
      // The reductions did start during the backward: one bucket per unit (embedding, two
      // layers, head) at --ddp-bucket-size 1, one at the default size.
      std::smatch buckets;
      REQUIRE(std::regex_search(
          output, buckets,
          std::regex(R"(\nNumber of buckets for gradient all-reduce / reduce-scatter: (\d+)\n)")));
      if (layout.bucket_size == nullptr) CHECK(buckets[1] == "1");
      if (std::string(layout.bucket_size != nullptr ? layout.bucket_size : "") == "1") {
        CHECK(buckets[1] == "4");
      }
      if (layout.graphs) {
        // After Megatron's three warm-up steps, captured once and replayed to the end.
        CHECK(output.find("step: graphs captured at iteration 4 on cpu (") != std::string::npos);
        CHECK(output.find("step: eager at iteration 5") == std::string::npos);
      }
      check_same_losses(logged_losses(output), expected);
      CHECK(weight_difference(save, single_save, 20) <= 1e-5);
    }
  }
}

TEST_CASE("a warning every rank derives alike from the flags is said once in a DP=2 job") {
  // --bf16 on the CPU and --grad-reduce-in-bf16 without bf16 mixed precision: each rank would
  // say the same line (it did, twice here, N times on N ranks); the first rank says it.
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  auto flags = training_flags("llama", directory.path / "save");
  for (size_t i = 0; i + 1 < flags.size(); ++i) {
    if (flags[i] == "--train-iters") flags[i + 1] = "3";
  }
  flags.insert(flags.end(), {"--bf16", "--grad-reduce-in-bf16"});
  const fs::path log = directory.path / "dp2.log";
  const int status = run(2, flags, log);
  const std::string output = read_file(log);
  INFO(output_tail(output));
  REQUIRE(status == 0);
  const auto count = [&](const std::string& text) {
    size_t found = 0;
    for (size_t at = output.find(text); at != std::string::npos; at = output.find(text, at + 1)) {
      ++found;
    }
    return found;
  };
  CHECK(count("--bf16: the CPU path computes in fp32") == 1);
  CHECK(count("--grad-reduce-in-bf16 without bf16 mixed precision") == 1);
}

TEST_CASE("checkpoints move between DP=2, the distributed optimizer and one process with the uninterrupted losses") {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  const fs::path single_log = directory.path / "single.log";
  REQUIRE(run(1, training_flags("gpt2", directory.path / "single"), single_log) == 0);
  int lines = 0;
  const auto expected = logged_losses(read_file(single_log), &lines);

  // DP=2 with the distributed optimizer (each rank's moments in its own file) → one process;
  // one process → DP=2 with the distributed optimizer (each rank keeps its range); DP=4's four
  // files → DP=2, whose ranges cut across them.
  struct Leg {
    int ranks;
    bool distributed;
  };
  for (const auto& [first, second] : {std::pair{Leg{2, true}, Leg{1, false}},
                                      std::pair{Leg{2, false}, Leg{1, false}},
                                      std::pair{Leg{1, false}, Leg{2, true}},
                                      std::pair{Leg{4, true}, Leg{2, true}}}) {
    // Sanitized, the legs that start from the distributed optimizer's files (the first and the
    // last: each rank's file read back by one process, DP=4's by DP=2); the other two read and
    // write the same checkpoint code, and each run costs several times more there.
    if (test_support::kSanitizedBuild && !first.distributed) continue;
    const std::string name = fmt::format("{}{}_then_{}{}", first.ranks,
                                         first.distributed ? "z" : "", second.ranks,
                                         second.distributed ? "z" : "");
    CAPTURE(name);
    const fs::path save = directory.path / name;
    auto first_half = training_flags("gpt2", save);
    first_half.insert(first_half.end(), {"--exit-interval", "10", "--eval-iters", "0"});
    if (first.distributed) first_half.push_back("--use-distributed-optimizer");
    REQUIRE(run(first.ranks, first_half, directory.path / (name + "_first.log")) == 0);
    // The distributed optimizer's moments: one distrib_optim file per rank, none in the model's.
    const fs::path files = save / "iter_0000010" / "mp_rank_00";
    for (int rank = 0; rank < first.ranks; ++rank) {
      CHECK(fs::exists(files / fmt::format("distrib_optim_{:03d}.bin", rank)) == first.distributed);
    }
    CHECK((read_file(files / "model_optim_rng.bin").find("optimizer.exp_avg.") ==
           std::string::npos) == first.distributed);
    auto second_half = training_flags("gpt2", save);
    second_half.insert(second_half.end(), {"--load", save.string()});
    if (second.distributed) second_half.push_back("--use-distributed-optimizer");
    const fs::path log = directory.path / (name + "_second.log");
    REQUIRE(run(second.ranks, second_half, log) == 0);
    const std::string output = read_file(log);
    INFO(output_tail(output, 2000));
    const auto resumed = logged_losses(output, &lines);
    REQUIRE(resumed.size() == 10);
    for (const auto& entry : resumed) {
      const int iteration = entry.first;
      const double loss = entry.second;
      CAPTURE(iteration);
      CHECK(std::fabs(loss - expected.at(iteration)) <= 1e-6 * std::fabs(expected.at(iteration)));
    }
  }
}

TEST_CASE("a rank killed with SIGKILL ends the whole data-parallel job, non-zero, within seconds") {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  auto flags = training_flags("gpt2", directory.path / "save");
  flags.insert(flags.end(), {"--train-iters", "100000", "--eval-iters", "0"});
  const fs::path log = directory.path / "killed.log";
  const pid_t mpirun = spawn_process(command(2, flags), log, kEnvironment);
  // Wait until training runs (an iteration line), then kill one rank: mpirun's child.
  wait_for_training(log);
  const std::vector<pid_t> ranks = children_of(mpirun);
  REQUIRE(ranks.size() == 2);
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE(kill(ranks.back(), SIGKILL) == 0);
  const int status = wait_for_exit(mpirun);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  CHECK(status != 0);
  CHECK(seconds < 30);
  // No rank is left running (a zombie waiting for its new parent to reap it has ended).
  for (const pid_t rank : ranks) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (running(rank) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK_FALSE(running(rank));
  }
}

TEST_CASE(
    "--exit-signal-handler: SIGTERM to one rank of two saves one iteration on both and ends the "
    "job 0") {
  // What a Slurm time limit or preemption does (srun passes the scheduler's SIGTERM on to its
  // tasks, which may not all get it at the same moment): here only the rank that prints
  // nothing gets it, and the other must stop at the same iteration.
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  const fs::path save = directory.path / "save";
  auto flags = training_flags("gpt2", save);
  flags.insert(flags.end(),
               {"--train-iters", "100000", "--eval-iters", "0", "--exit-signal-handler"});
  const fs::path log = directory.path / "signalled.log";
  const pid_t mpirun = spawn_process(command(2, flags), log, kEnvironment);
  wait_for_training(log);
  const std::vector<pid_t> ranks = children_of(mpirun);
  REQUIRE(ranks.size() == 2);
  REQUIRE(kill(ranks.back(), SIGTERM) == 0);
  const int status = wait_for_exit(mpirun);
  const std::string output = read_file(log);
  CAPTURE(output_tail(output));
  CHECK(status == 0);
  CHECK(output.find("[exiting program after receiving SIGTERM.] datetime: ") != std::string::npos);
  const auto tracked = backend::read_checkpoint_tracker(save);
  REQUIRE(tracked.has_value());
  CHECK(tracked->iteration >= 1);
  CHECK(tracked->iteration < 100000);
  CHECK(fs::is_regular_file(tracked->file));
  // The saved iteration is the last one trained, and a restart goes on from it.
  const std::regex last_line(" iteration +" + std::to_string(tracked->iteration) + "/ +100000 \\|");
  CHECK(std::regex_search(output, last_line));
  auto resumed = training_flags("gpt2", save);
  resumed.insert(resumed.end(),
                 {"--load", save.string(), "--train-iters", "100000", "--exit-interval",
                  std::to_string(tracked->iteration + 2), "--eval-iters", "0"});
  const fs::path resumed_log = directory.path / "resumed.log";
  CHECK(run(2, resumed, resumed_log) == 0);
  const std::string resumed_output = read_file(resumed_log);
  CAPTURE(output_tail(resumed_output));
  CHECK(resumed_output.find(" at iteration " + std::to_string(tracked->iteration) + "\n") !=
        std::string::npos);
  CHECK(backend::read_checkpoint_tracker(save)->iteration == tracked->iteration + 2);
}

TEST_CASE("a stopped rank ends the whole job within --distributed-timeout-minutes, the waiting rank naming itself") {
  // SIGSTOP, not SIGKILL: a stopped rank keeps its connections open, so mpirun notices nothing
  // and the other rank would wait in its collective forever, were it not for the watchdog.
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  auto flags = training_flags("gpt2", directory.path / "save");
  flags.insert(flags.end(), {"--train-iters", "100000", "--eval-iters", "0",
                             "--distributed-timeout-minutes", "0.05"});  // 3 seconds
  const fs::path log = directory.path / "stopped.log";
  const pid_t mpirun = spawn_process(command(2, flags), log, kEnvironment);
  wait_for_training(log);
  const std::vector<pid_t> ranks = children_of(mpirun);
  REQUIRE(ranks.size() == 2);
  // Whatever happens below, nothing is left stopped or running: continued and killed (if it is
  // still a pretrain_gpt), and mpirun reaped.
  struct Cleanup {
    pid_t mpirun;
    std::vector<pid_t> ranks;
    bool reaped = false;
    ~Cleanup() {
      for (const pid_t rank : ranks) {
        const fs::path comm = fs::path("/proc") / std::to_string(rank) / "comm";
        std::error_code error;
        if (running(rank) && fs::exists(comm, error) &&
            read_file(comm).starts_with("pretrain_gpt")) {
          kill(rank, SIGCONT);
          kill(rank, SIGKILL);
        }
      }
      if (!reaped) {
        kill(mpirun, SIGKILL);
        int status = 0;
        waitpid(mpirun, &status, 0);
      }
    }
  } cleanup{mpirun, ranks};

  // Which rank is stopped (its environment says), so the other is the one that must report.
  const std::string environment =
      read_file(fs::path("/proc") / std::to_string(ranks.back()) / "environ");
  const std::string rank_variable = std::string("OMPI_COMM_WORLD_RANK=");
  const size_t rank_at = environment.find(rank_variable);
  REQUIRE(rank_at != std::string::npos);
  const int stopped_rank = std::stoi(environment.substr(rank_at + rank_variable.size()));
  const int waiting_rank = 1 - stopped_rank;

  const size_t log_size_at_stop = read_file(log).size();
  const auto stopped_at = std::chrono::steady_clock::now();
  REQUIRE(kill(ranks.back(), SIGSTOP) == 0);
  // Bounded wait: a watchdog that does not fire fails here instead of hanging the suite.
  int status = -1;
  while (std::chrono::steady_clock::now() - stopped_at < std::chrono::seconds(60)) {
    int raw = 0;
    const pid_t done = waitpid(mpirun, &raw, WNOHANG);
    REQUIRE(done >= 0);
    if (done == mpirun) {
      cleanup.reaped = true;
      status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  const std::string output = read_file(log);
  INFO(output_tail(output));
  REQUIRE(cleanup.reaped);
  CHECK(status != 0);
  CHECK(seconds < 20);
  CHECK(seconds >= 2);  // the timeout, not something else, ended it
  // Nothing timed out before the stop (a 3-second timeout on two shared cores).
  CHECK(output.substr(0, log_size_at_stop).find("did not complete") == std::string::npos);
  CAPTURE(waiting_rank);
  CHECK(std::regex_search(
      output,
      std::regex(fmt::format(
          R"(\[error\] rank {} \(host [^)\s]+\): MPI_\w+ in the [a-z ]+ group did not complete )"
          R"(in 3 seconds \(--distributed-timeout-minutes 0\.05\): another rank has probably )"
          R"(failed or hangs; aborting the job)",
          waiting_rank))));
  // The stopped rank, continued by mpirun to be ended, does not blame the others: the time it
  // was stopped is its own.
  CHECK(output.find(fmt::format("rank {} (host", stopped_rank)) == std::string::npos);
  // The stopped rank was ended too (mpirun continues and kills it).
  for (const pid_t rank : ranks) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (running(rank) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK_FALSE(running(rank));
  }
}

TEST_CASE("several CPU tasks started without MPI are refused, saying how to launch") {
  TemporaryDirectory directory;
  const fs::path log = directory.path / "torchrun.log";
  auto flags = training_flags("gpt2", directory.path / "save");
  // A global batch of one micro batch: two data-parallel ranks could not share it, but the
  // message must be about the launch, which is what is wrong.
  flags.insert(flags.end(), {"--global-batch-size", "2", "--device", "cpu"});
  const pid_t pid = spawn_process(command(1, flags), log,
                                  {"OMP_NUM_THREADS=1", "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0"});
  CHECK(wait_for_exit(pid) == 2);
  const std::string output = read_file(log);
  CHECK(output.find("this process is task 0 of 2 (torchrun launch") != std::string::npos);
  CHECK(output.find("launch with mpirun/mpiexec") != std::string::npos);
}

// The flags of Megatron-DeepSpeed's examples/pretrain_gpt_distributed.sh-style scripts (old
// spellings, GPT-2 BPE files without --tokenizer-type, fp16 loss scaling), on the test corpus
// (15 documents: the split gives validation and test a tenth each, 949,50,1 would leave the
// test split empty, which pretrain_gpt refuses by name), saving into `directory`.
namespace {
std::vector<std::string> seed_style_flags(const fs::path& directory) {
  const std::string data = std::string(TEST_SOURCE_DIR) + "/tests/data/";
  return {
      "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--micro-batch-size", "2", "--global-batch-size", "8", "--seq-length", "64",
      "--max-position-embeddings", "64", "--train-iters", "6", "--lr-decay-iters", "6",
      "--save", (directory / "checkpoints").string(), "--load",
      (directory / "checkpoints").string(), "--data-path",
      data + "preprocess_sample_text_document", "--vocab-file", data + "gpt2-vocab.json",
      "--merge-file", data + "gpt2-merges.txt", "--data-impl", "mmap", "--split", "800,100,100",
      "--distributed-backend", "nccl", "--lr", "0.00015", "--lr-decay-style", "cosine",
      "--min-lr", "1.0e-5", "--weight-decay", "1e-2", "--clip-grad", "1.0",
      "--lr-warmup-fraction", ".01", "--checkpoint-activations", "--log-interval", "1",
      "--save-interval", "3", "--eval-interval", "3", "--eval-iters", "1", "--fp16",
      "--data-cache-path", (directory / "cache").string()};
}
}  // namespace

TEST_CASE(
    "a Megatron-DeepSpeed seed-style command line runs unchanged under mpirun, shrunk in size" *
    test_support::release_only()) {
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  const fs::path log = directory.path / "seed.log";
  const int status = run(2, seed_style_flags(directory.path), log);
  const std::string output = read_file(log);
  INFO(output_tail(output, 4000));
  CHECK(status == 0);
  int lines = 0;
  CHECK(logged_losses(output, &lines).size() == 6);
  CHECK(output.find("loss scale: 4294967296.0 |") != std::string::npos);
  CHECK(std::regex_search(output, std::regex(R"(\n  tokenizer_type \.+ GPT2BPETokenizer\n)")));
  CHECK(std::regex_search(output, std::regex(R"(\n  recompute_granularity \.+ full\n)")));
  const auto tracker = backend::read_checkpoint_tracker(directory.path / "checkpoints");
  REQUIRE(tracker.has_value());
  CHECK(tracker->iteration == 6);
}

// release-only: under the sanitizers the DeepSpeed mapping is its unit tests' (deepspeed_config)
// and the distributed optimizer the checkpoint tests'.
TEST_CASE(
    "the seed-style command line with DeepSpeed's ZeRO-2 configuration trains as the distributed "
    "optimizer" *
    release_only()) {
  // Megatron-DeepSpeed's --deepspeed --deepspeed_config ds_config.json --zero-stage 2: ZeRO
  // stage 2 is Megatron's distributed optimizer here, its overlap_comm --overlap-grad-reduce;
  // the file's fp16 section sets the scaler (initial_scale_power 11: 2048). Its ZeRO-3 + CPU
  // offload configuration trains too.
  REQUIRE_MESSAGE(!mpirun_path().empty(), "Open MPI's mpirun (container/install-deps.sh)");
  TemporaryDirectory directory;
  const std::string configs = std::string(TEST_SOURCE_DIR) + "/tests/data/deepspeed/";
  auto flags = seed_style_flags(directory.path);
  flags.insert(flags.end(), {"--deepspeed", "--deepspeed_config",
                             configs + "ds_config_gpt_zero2.json", "--zero-stage", "2"});
  const fs::path log = directory.path / "zero2.log";
  const int status = run(2, flags, log);
  const std::string output = read_file(log);
  INFO(output_tail(output, 4000));
  CHECK(status == 0);
  int lines = 0;
  CHECK(logged_losses(output, &lines).size() == 6);
  CHECK(output.find("loss scale: 2048.0 |") != std::string::npos);
  CHECK(std::regex_search(output, std::regex(R"(\n  use_distributed_optimizer \.+ True\n)")));
  CHECK(std::regex_search(output, std::regex(R"(\n  zero_stage \.+ 2\n)")));
  // overlap_comm with reduce_bucket_size 5e7: one bucket reduce-scattered during the backward.
  CHECK(output.find("\nNumber of buckets for gradient all-reduce / reduce-scatter: 1\n") !=
        std::string::npos);

  auto zero3 = seed_style_flags(directory.path / "zero3");
  zero3.insert(zero3.end(), {"--deepspeed", "--deepspeed_config",
                             configs + "ds_config_gpt_zero3_offload.json", "--zero-stage", "3"});
  const fs::path zero3_log = directory.path / "zero3.log";
  const int zero3_status = run(2, zero3, zero3_log);
  const std::string zero3_output = read_file(zero3_log);
  INFO(output_tail(zero3_output, 4000));
  CHECK(zero3_status == 0);
  CHECK(logged_losses(zero3_output).size() == 6);
  CHECK(std::regex_search(zero3_output, std::regex(R"(\n  zero_stage \.+ 3\n)")));
}
