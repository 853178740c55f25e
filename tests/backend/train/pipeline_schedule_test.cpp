// Megatron's 1F1B and interleaved 1F1B schedules (with and without overlapped p2p
// communication) as step lists: all ranks of a pipeline are run together under MPI's semantics
// (a batch completes once every send and receive in it has met its partner in the peer's posted
// batches; same pair and message kind match in order; a post's batch is waited for at its wait
// step) and under NCCL's (each rank's batches run one after another on its communication stream,
// and a transfer completes only while its partner's batch is the one running on the peer's), which
// must finish and pair each send with a receive of the same micro batch one virtual stage away;
// each rank's list must run every forward and backward once, in dependency order, and never touch
// a buffer that a transfer in flight reads or writes; a few schedules are pinned step by step as
// derived by hand from schedules.py; the refusals name Megatron's flags.
#include "backend/train/pipeline_schedule.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"

using namespace backend;

namespace {

struct Configuration {
  int64_t pp = 1;
  int64_t vp = 1;
  int64_t micro_batches = 1;
  bool overlap = false;  // overlapped p2p communication
};

std::string name(const Configuration& c) {
  return fmt::format("pp={} vp={} M={}{}", c.pp, c.vp, c.micro_batches,
                     c.overlap ? " overlapped" : "");
}

// pp 1–5; vp 1, and 2 and 3 where interleaving is allowed (pp > 2, or pp > 1 overlapped);
// M = pp, 2pp, 3pp, and for 1F1B also 1, pp + 1 and 7 (fewer micro batches than stages, and
// not a multiple). Interleaved ones both with and without the overlap.
std::vector<Configuration> configurations() {
  std::vector<Configuration> result;
  for (int64_t pp = 1; pp <= 5; ++pp) {
    for (int64_t vp : {1, 2, 3}) {
      if (vp > 1 && pp == 1) continue;
      std::set<int64_t> counts{pp, 2 * pp, 3 * pp};
      if (vp == 1) counts.insert({1, pp + 1, 7});
      for (int64_t m : counts) {
        if (vp == 1 || pp > 2) result.push_back({pp, vp, m, false});
        if (vp > 1) result.push_back({pp, vp, m, true});
      }
    }
  }
  return result;
}

std::vector<std::vector<PipelineStep>> all_ranks(const Configuration& c) {
  std::vector<std::vector<PipelineStep>> ranks;
  for (int64_t rank = 0; rank < c.pp; ++rank) {
    ranks.push_back(pipeline_schedule(c.pp, rank, c.vp, c.micro_batches, c.overlap));
  }
  return ranks;
}

// F0c1: forward of micro batch 0 on chunk 1; sA2c0p3: send the activation of micro batch 2,
// chunk 0, to rank 3; rG..: receive a gradient. A batch's transfers are separated by spaces,
// steps by " | "; a post is P<handle>[its batch], its wait W<handle>.
std::string describe(const PipelineStep& step) {
  if (step.kind == PipelineStep::Kind::compute) {
    return fmt::format("{}{}c{}", step.work == PipelineWork::forward ? 'F' : 'B', step.micro_batch,
                       step.chunk);
  }
  if (step.kind == PipelineStep::Kind::wait) return fmt::format("W{}", step.handle);
  std::vector<std::string> parts;
  for (const PipelineTransfer& t : step.transfers) {
    parts.push_back(fmt::format("{}{}{}c{}p{}", t.send ? 's' : 'r',
                                t.message == PipelineMessage::activation ? 'A' : 'G', t.micro_batch,
                                t.chunk, t.peer));
  }
  if (step.kind == PipelineStep::Kind::post) {
    return fmt::format("P{}[{}]", step.handle, fmt::join(parts, " "));
  }
  return fmt::format("{}", fmt::join(parts, " "));
}

std::string describe(const std::vector<PipelineStep>& steps) {
  std::vector<std::string> parts;
  for (const PipelineStep& step : steps) parts.push_back(describe(step));
  return fmt::format("{}", fmt::join(parts, " | "));
}

// ---- all ranks together

using ChannelKey = std::tuple<int64_t, int64_t, PipelineMessage>;  // sender, receiver, kind

struct Endpoint {
  int64_t rank = 0;
  PipelineTransfer transfer;
  size_t batch = 0;  // the posting's number among all ranks' (stream semantics)
};

struct Channel {
  std::vector<Endpoint> sends;
  std::vector<Endpoint> receives;
};

struct Simulation {
  bool finished = false;
  std::string where_stuck;
  std::map<ChannelKey, Channel> channels;
};

// A posted transfer: its channel and place in it.
struct Pending {
  ChannelKey key;
  size_t index = 0;
  bool send = false;
};

// The ranks' host sides: each walks its steps, posting a transfer's or a post's batch with
// `post` (which returns its number) and moving past a transfer or a wait only once `done` says
// its batch has completed. `progress_devices` lets the communication make progress; returns
// whether it did. Runs until nothing moves.
template <typename Done, typename ProgressDevices>
Simulation run_ranks(const std::vector<std::vector<PipelineStep>>& ranks, Simulation& sim,
                     std::vector<std::vector<Pending>>& batches, Done done,
                     ProgressDevices progress_devices) {
  const size_t n = ranks.size();
  std::vector<size_t> position(n, 0);
  std::vector<std::optional<size_t>> blocking(n);       // a transfer's batch, posted
  std::vector<std::map<int64_t, size_t>> by_handle(n);  // a post's batch
  const auto post = [&](size_t r, const PipelineStep& step) {
    const auto rank = static_cast<int64_t>(r);
    const size_t batch = batches.size();
    batches.emplace_back();
    for (const PipelineTransfer& t : step.transfers) {
      const ChannelKey key =
          t.send ? ChannelKey{rank, t.peer, t.message} : ChannelKey{t.peer, rank, t.message};
      auto& queue = t.send ? sim.channels[key].sends : sim.channels[key].receives;
      batches[batch].push_back({key, queue.size(), t.send});
      queue.push_back({rank, t, batch});
    }
    return batch;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < n; ++r) {
      while (position[r] < ranks[r].size()) {
        const PipelineStep& step = ranks[r][position[r]];
        if (step.kind == PipelineStep::Kind::compute) {
          ++position[r];
          progress = true;
          continue;
        }
        if (step.kind == PipelineStep::Kind::post) {
          by_handle[r][step.handle] = post(r, step);
          ++position[r];
          progress = true;
          continue;
        }
        size_t batch = 0;
        if (step.kind == PipelineStep::Kind::wait) {
          batch = by_handle[r].at(step.handle);
        } else {
          if (!blocking[r]) {
            blocking[r] = post(r, step);
            progress = true;
          }
          batch = *blocking[r];
        }
        if (!done(batch)) break;
        blocking[r].reset();
        ++position[r];
        progress = true;
      }
    }
    if (progress_devices()) progress = true;
  }
  sim.finished = true;
  for (size_t r = 0; r < n; ++r) {
    if (position[r] == ranks[r].size()) continue;
    sim.finished = false;
    sim.where_stuck +=
        fmt::format("rank {} at step {} ({}); ", r, position[r], describe(ranks[r][position[r]]));
  }
  return sim;
}

// MPI's semantics: a batch completes once each of its transfers' partners is posted.
Simulation simulate(const std::vector<std::vector<PipelineStep>>& ranks) {
  Simulation sim;
  std::vector<std::vector<Pending>> batches;
  const auto done = [&](size_t batch) {
    return std::all_of(batches[batch].begin(), batches[batch].end(), [&](const Pending& p) {
      const Channel& channel = sim.channels[p.key];
      return (p.send ? channel.receives : channel.sends).size() > p.index;
    });
  };
  return run_ranks(ranks, sim, batches, done, [] { return false; });
}

// NCCL's semantics (one communicator, one stream per rank): a rank's batches run in posting
// order, each as one group launch; a running batch's transfer completes when its partner is
// posted and its partner's batch is the one running on the peer's stream; the batch completes
// when all its transfers have.
Simulation simulate_streams(const std::vector<std::vector<PipelineStep>>& ranks) {
  Simulation sim;
  std::vector<std::vector<Pending>> batches;
  std::vector<bool> completed;
  std::map<int64_t, std::vector<size_t>> streams;  // by rank: posted, not completed, in order
  std::map<size_t, int64_t> rank_of;
  size_t seen = 0;
  const auto enqueue_new = [&] {
    for (; seen < batches.size(); ++seen) {
      completed.push_back(false);
      // A batch's rank: its first transfer's own side.
      const Pending& first = batches[seen].front();
      const int64_t rank = first.send ? std::get<0>(first.key) : std::get<1>(first.key);
      streams[rank].push_back(seen);
      rank_of[seen] = rank;
    }
  };
  const auto done = [&](size_t batch) {
    enqueue_new();
    return static_cast<bool>(completed[batch]);
  };
  // A transfer completes while both its batch and its partner's run (are their streams'
  // heads); it stays complete after either batch moves on.
  std::set<std::tuple<ChannelKey, size_t, bool>> transferred;
  const auto running = [&](size_t batch) {
    const auto& stream = streams[rank_of[batch]];
    return !stream.empty() && stream.front() == batch;
  };
  const auto progress_devices = [&] {
    enqueue_new();
    bool moved = false;
    for (const auto& [rank, stream] : streams) {
      if (stream.empty()) continue;
      for (const Pending& p : batches[stream.front()]) {
        const Channel& channel = sim.channels[p.key];
        const auto& partners = p.send ? channel.receives : channel.sends;
        if (partners.size() <= p.index || !running(partners[p.index].batch)) continue;
        moved |= transferred.insert({p.key, p.index, p.send}).second;
        moved |= transferred.insert({p.key, p.index, !p.send}).second;
      }
    }
    for (auto& [rank, stream] : streams) {
      if (stream.empty()) continue;
      const size_t head = stream.front();
      const bool all =
          std::all_of(batches[head].begin(), batches[head].end(), [&](const Pending& p) {
            return transferred.contains({p.key, p.index, p.send});
          });
      if (!all) continue;
      completed[head] = true;
      stream.erase(stream.begin());
      moved = true;
    }
    return moved;
  };
  return run_ranks(ranks, sim, batches, done, progress_devices);
}

// ---- one rank's own order

struct Key {
  int64_t micro_batch = 0;
  int64_t chunk = 0;
  auto operator<=>(const Key&) const = default;
};

void check_rank_order(const Configuration& c, int64_t rank,
                      const std::vector<PipelineStep>& steps) {
  INFO(name(c), " rank ", rank, ": ", describe(steps));
  const int64_t next = (rank + 1) % c.pp;
  const int64_t prev = (rank - 1 + c.pp) % c.pp;
  std::map<Key, size_t> forward_at, backward_at, activation_in, activation_out, gradient_in,
      gradient_out;
  // Each post's one wait, later: a posted receive's data is there from its wait on.
  std::map<int64_t, size_t> posted_at, waited_at;
  for (size_t i = 0; i < steps.size(); ++i) {
    const PipelineStep& step = steps[i];
    if (step.kind == PipelineStep::Kind::post) {
      CHECK_MESSAGE(posted_at.emplace(step.handle, i).second, "posted twice: ", step.handle);
    }
    if (step.kind == PipelineStep::Kind::wait) {
      CHECK_MESSAGE(waited_at.emplace(step.handle, i).second, "waited twice: ", step.handle);
      REQUIRE_MESSAGE(posted_at.contains(step.handle), "waited before posted: ", step.handle);
      CHECK(step.transfers == steps[posted_at[step.handle]].transfers);
    }
  }
  CHECK(posted_at.size() == waited_at.size());
  if (!c.overlap) CHECK(posted_at.empty());
  for (size_t i = 0; i < steps.size(); ++i) {
    const PipelineStep& step = steps[i];
    if (step.kind == PipelineStep::Kind::compute) {
      CHECK(step.transfers.empty());
      const Key key{step.micro_batch, step.chunk};
      auto& at = step.work == PipelineWork::forward ? forward_at : backward_at;
      CHECK_MESSAGE(at.emplace(key, i).second, "computed twice: step ", i);
      continue;
    }
    if (step.kind == PipelineStep::Kind::wait) continue;
    CHECK(c.pp > 1);
    CHECK_FALSE(step.transfers.empty());
    for (const PipelineTransfer& t : step.transfers) {
      const Key key{t.micro_batch, t.chunk};
      const bool activation = t.message == PipelineMessage::activation;
      // Activations flow to the next rank, gradients to the previous.
      CHECK(t.peer == (activation == t.send ? next : prev));
      auto& at = activation ? (t.send ? activation_out : activation_in)
                            : (t.send ? gradient_out : gradient_in);
      // A receive counts where its data is there; a send where it is posted.
      const size_t where =
          step.kind == PipelineStep::Kind::post && !t.send ? waited_at[step.handle] : i;
      CHECK_MESSAGE(at.emplace(key, where).second, "transferred twice: step ", i);
    }
  }
  const int64_t expected = c.micro_batches * c.vp;
  CHECK(static_cast<int64_t>(forward_at.size()) == expected);
  CHECK(static_cast<int64_t>(backward_at.size()) == expected);
  size_t first_stage_buffers = 0;
  size_t last_stage_buffers = 0;
  for (int64_t mb = 0; mb < c.micro_batches; ++mb) {
    for (int64_t chunk = 0; chunk < c.vp; ++chunk) {
      INFO("micro batch ", mb, " chunk ", chunk);
      const Key key{mb, chunk};
      REQUIRE(forward_at.contains(key));
      REQUIRE(backward_at.contains(key));
      CHECK(forward_at[key] < backward_at[key]);
      const bool first_virtual_stage = rank == 0 && chunk == 0;
      const bool last_virtual_stage = rank == c.pp - 1 && chunk == c.vp - 1;
      if (first_virtual_stage) {
        ++first_stage_buffers;
        CHECK_FALSE(activation_in.contains(key));
        CHECK_FALSE(gradient_out.contains(key));
      } else {
        REQUIRE(activation_in.contains(key));
        CHECK(activation_in[key] < forward_at[key]);
        REQUIRE(gradient_out.contains(key));
        CHECK(gradient_out[key] > backward_at[key]);
      }
      if (last_virtual_stage) {
        ++last_stage_buffers;
        CHECK_FALSE(activation_out.contains(key));
        CHECK_FALSE(gradient_in.contains(key));
      } else {
        REQUIRE(activation_out.contains(key));
        CHECK(activation_out[key] > forward_at[key]);
        REQUIRE(gradient_in.contains(key));
        CHECK(gradient_in[key] < backward_at[key]);
      }
    }
  }
  // Nothing transferred for a micro batch or chunk out of range.
  CHECK(activation_in.size() + first_stage_buffers == static_cast<size_t>(expected));
  CHECK(gradient_out.size() + first_stage_buffers == static_cast<size_t>(expected));
  CHECK(activation_out.size() + last_stage_buffers == static_cast<size_t>(expected));
  CHECK(gradient_in.size() + last_stage_buffers == static_cast<size_t>(expected));
}

// The buffers of pipeline_execution: a chunk's input (a received activation; a sent input
// gradient, which the backward writes there), its output (a sent activation) and its output
// gradient (a received gradient), each per slot (micro batch % pipeline_slots).
enum class BufferKind { input, output, output_gradient };
using BufferId = std::tuple<BufferKind, int64_t, int64_t>;  // kind, slot, chunk

BufferId transfer_buffer(const PipelineTransfer& t, int64_t slots) {
  const bool activation = t.message == PipelineMessage::activation;
  const BufferKind kind = activation ? (t.send ? BufferKind::output : BufferKind::input)
                                     : (t.send ? BufferKind::input : BufferKind::output_gradient);
  return {kind, t.micro_batch % slots, t.chunk};
}

// No step touches a buffer that a transfer in flight uses: a compute neither reads nor writes a
// receiving buffer nor writes a sending one; two transfers in flight (or in one batch) share no
// buffer that either receives into. Nothing is in flight at the end.
void check_buffers(const Configuration& c, int64_t rank, const std::vector<PipelineStep>& steps) {
  INFO(name(c), " rank ", rank, ": ", describe(steps));
  const int64_t slots = pipeline_slots(steps);
  struct InFlight {
    BufferId buffer;
    bool receiving = false;
    int64_t handle = -1;  // -1: the blocking batch being checked
  };
  std::vector<InFlight> in_flight;
  const auto conflicts = [&](const BufferId& buffer, bool receiving) {
    return std::any_of(in_flight.begin(), in_flight.end(), [&](const InFlight& f) {
      return f.buffer == buffer && (f.receiving || receiving);
    });
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    INFO("step ", i, ": ", describe(steps[i]));
    const PipelineStep& step = steps[i];
    if (step.kind == PipelineStep::Kind::compute) {
      const int64_t slot = step.micro_batch % slots;
      const bool forward = step.work == PipelineWork::forward;
      const BufferId read{forward ? BufferKind::input : BufferKind::output_gradient, slot,
                          step.chunk};
      const BufferId written{forward ? BufferKind::output : BufferKind::input, slot, step.chunk};
      CHECK_FALSE(std::any_of(in_flight.begin(), in_flight.end(), [&](const InFlight& f) {
        return f.buffer == written || (f.receiving && f.buffer == read);
      }));
      continue;
    }
    if (step.kind == PipelineStep::Kind::wait) {
      std::erase_if(in_flight, [&](const InFlight& f) { return f.handle == step.handle; });
      continue;
    }
    const int64_t handle = step.kind == PipelineStep::Kind::post ? step.handle : -1;
    for (const PipelineTransfer& t : step.transfers) {
      const BufferId buffer = transfer_buffer(t, slots);
      CHECK_FALSE(conflicts(buffer, !t.send));
      in_flight.push_back({buffer, !t.send, handle});
    }
    std::erase_if(in_flight, [](const InFlight& f) { return f.handle == -1; });
  }
  CHECK(in_flight.empty());
}

std::vector<Key> computes(const std::vector<PipelineStep>& steps, PipelineWork work) {
  std::vector<Key> result;
  for (const PipelineStep& step : steps) {
    if (step.kind == PipelineStep::Kind::compute && step.work == work) {
      result.push_back({step.micro_batch, step.chunk});
    }
  }
  return result;
}

int64_t forwards_before_first_backward(const std::vector<PipelineStep>& steps) {
  int64_t count = 0;
  for (const PipelineStep& step : steps) {
    if (step.kind != PipelineStep::Kind::compute) continue;
    if (step.work == PipelineWork::backward) break;
    ++count;
  }
  return count;
}

// The micro batches mentioned from their first step through their last, at each step: the
// definition of pipeline_slots, computed the slow way.
std::vector<std::set<int64_t>> in_flight_by_step(const std::vector<PipelineStep>& steps) {
  std::map<int64_t, std::pair<size_t, size_t>> extent;
  for (size_t i = 0; i < steps.size(); ++i) {
    std::vector<int64_t> mentioned;
    if (steps[i].kind == PipelineStep::Kind::compute) mentioned.push_back(steps[i].micro_batch);
    for (const PipelineTransfer& t : steps[i].transfers) mentioned.push_back(t.micro_batch);
    for (int64_t mb : mentioned) {
      if (!extent.contains(mb)) extent[mb] = {i, i};
      extent[mb].second = i;
    }
  }
  std::vector<std::set<int64_t>> result(steps.size());
  for (const auto& [mb, range] : extent) {
    for (size_t i = range.first; i <= range.second; ++i) result[i].insert(mb);
  }
  return result;
}

template <typename Call>
std::string error_message(Call call) {
  try {
    call();
  } catch (const common::Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("all ranks together finish and each send meets a receive of the same micro batch") {
  for (const Configuration& c : configurations()) {
    INFO(name(c));
    const auto ranks = all_ranks(c);
    // NCCL's stream order must not deadlock either (the same pairs then, by construction).
    const Simulation streams = simulate_streams(ranks);
    CHECK_MESSAGE(streams.finished, "deadlock on NCCL's streams: ", streams.where_stuck);
    const Simulation sim = simulate(ranks);
    CHECK_MESSAGE(sim.finished, "deadlock: ", sim.where_stuck);
    size_t matched = 0;
    for (const auto& [key, channel] : sim.channels) {
      // (clang 14: no INFO/CAPTURE of a structured binding)
      const auto sender = std::get<0>(key);
      const auto receiver = std::get<1>(key);
      const auto message = std::get<2>(key);
      INFO("from rank ", sender, " to rank ", receiver);
      REQUIRE(channel.sends.size() == channel.receives.size());
      for (size_t i = 0; i < channel.sends.size(); ++i) {
        const PipelineTransfer& send = channel.sends[i].transfer;
        const PipelineTransfer& receive = channel.receives[i].transfer;
        CHECK(send.micro_batch == receive.micro_batch);
        CHECK(send.message == receive.message);
        const int64_t sender_stage = sender + send.chunk * c.pp;
        const int64_t receiver_stage = receiver + receive.chunk * c.pp;
        const int64_t step = message == PipelineMessage::activation ? 1 : -1;
        CHECK(receiver_stage == sender_stage + step);
        ++matched;
      }
    }
    // Every virtual stage boundary carries one activation and one gradient per micro batch.
    CHECK(static_cast<int64_t>(matched) == 2 * (c.pp * c.vp - 1) * c.micro_batches);
  }
}

TEST_CASE("the simulations tell NCCL's stream order from MPI's") {
  // Two ranks that each post a send to the other, then a receive from it, as separate batches:
  // MPI pairs them whatever the order; on NCCL's streams each rank's send runs first and waits
  // for a receive queued behind the other's send, which the checks above must be able to see.
  const auto one_transfer = [](PipelineStep::Kind kind, bool send, int64_t peer, int64_t handle) {
    PipelineStep step;
    step.kind = kind;
    step.handle = handle;
    step.transfers.push_back({send, PipelineMessage::activation, 0, 0, peer});
    return step;
  };
  std::vector<std::vector<PipelineStep>> ranks(2);
  for (int64_t rank = 0; rank < 2; ++rank) {
    const int64_t peer = 1 - rank;
    auto& steps = ranks[static_cast<size_t>(rank)];
    steps.push_back(one_transfer(PipelineStep::Kind::post, true, peer, 0));
    steps.push_back(one_transfer(PipelineStep::Kind::post, false, peer, 1));
    steps.push_back(one_transfer(PipelineStep::Kind::wait, true, peer, 0));
    steps.push_back(one_transfer(PipelineStep::Kind::wait, false, peer, 1));
  }
  CHECK(simulate(ranks).finished);
  const Simulation streams = simulate_streams(ranks);
  CHECK_FALSE(streams.finished);
  CHECK(streams.where_stuck.find("rank 0 at step 2 (W0)") != std::string::npos);
  // In one batch each, NCCL runs both directions together.
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto& steps = ranks[static_cast<size_t>(rank)];
    steps[0].transfers.push_back(steps[1].transfers.front());
    steps.erase(steps.begin() + 1);
    steps.pop_back();
    steps[1].transfers = steps[0].transfers;
  }
  CHECK(simulate_streams(ranks).finished);
}

TEST_CASE("every rank runs each forward and backward once, after what it depends on") {
  for (const Configuration& c : configurations()) {
    const auto ranks = all_ranks(c);
    for (int64_t rank = 0; rank < c.pp; ++rank) {
      check_rank_order(c, rank, ranks[static_cast<size_t>(rank)]);
    }
  }
}

TEST_CASE("no compute touches a buffer while a transfer in flight uses it") {
  for (const Configuration& c : configurations()) {
    const auto ranks = all_ranks(c);
    for (int64_t rank = 0; rank < c.pp; ++rank) {
      check_buffers(c, rank, ranks[static_cast<size_t>(rank)]);
    }
  }
}

TEST_CASE(
    "overlapping the transfers keeps the computes and their order, and posts in the steady "
    "state") {
  for (const Configuration& c : configurations()) {
    if (!c.overlap || c.pp <= 2) continue;
    INFO(name(c));
    Configuration blocking = c;
    blocking.overlap = false;
    const auto overlapped = all_ranks(c);
    const auto plain = all_ranks(blocking);
    for (size_t rank = 0; rank < overlapped.size(); ++rank) {
      std::vector<std::string> computed, computed_plain;
      for (const PipelineStep& step : overlapped[rank]) {
        if (step.kind == PipelineStep::Kind::compute) computed.push_back(describe(step));
      }
      for (const PipelineStep& step : plain[rank]) {
        if (step.kind == PipelineStep::Kind::compute) computed_plain.push_back(describe(step));
      }
      CHECK(computed == computed_plain);
      // A rank with a steady state (a backward before its last forward) overlaps something.
      const bool steady = forwards_before_first_backward(overlapped[rank]) < c.micro_batches * c.vp;
      const bool posts = std::any_of(
          overlapped[rank].begin(), overlapped[rank].end(),
          [](const PipelineStep& step) { return step.kind == PipelineStep::Kind::post; });
      if (steady) CHECK(posts);
    }
  }
}

TEST_CASE("1F1B with pp=4, M=8: warmup shrinks down the pipeline, forwards in order") {
  const Configuration c{4, 1, 8};
  const auto ranks = all_ranks(c);
  // Warmup forwards: the forwards before the first backward, less the steady state's first.
  CHECK(forwards_before_first_backward(ranks[0]) - 1 == 3);
  CHECK(forwards_before_first_backward(ranks[1]) - 1 == 2);
  CHECK(forwards_before_first_backward(ranks[2]) - 1 == 1);
  CHECK(forwards_before_first_backward(ranks[3]) - 1 == 0);
  std::vector<Key> in_order;
  for (int64_t mb = 0; mb < 8; ++mb) in_order.push_back({mb, 0});
  for (const auto& steps : ranks) {
    CHECK(computes(steps, PipelineWork::forward) == in_order);
    CHECK(computes(steps, PipelineWork::backward) == in_order);
  }
}

TEST_CASE("fewer micro batches than stages: all warmup, then all cooldown") {
  const auto steps = pipeline_schedule(4, 0, 1, 2);
  CHECK(describe(steps) == "F0c0 | sA0c0p1 | F1c0 | sA1c0p1 | rG0c0p1 | B0c0 | rG1c0p1 | B1c0");
}

TEST_CASE("pp=1: forward then backward per micro batch, no transfers") {
  CHECK(describe(pipeline_schedule(1, 0, 1, 3)) == "F0c0 | B0c0 | F1c0 | B1c0 | F2c0 | B2c0");
}

TEST_CASE("1F1B with pp=2, M=3 step by step") {
  // Derived by hand from forward_backward_pipelining_without_interleaving: rank 0 has one
  // warmup forward; the first stage skips receive-forward and send-backward, the last stage
  // send-forward and receive-backward, so send_backward_recv_forward is a batch of two on rank
  // 1 only. In a batch: gradient to prev, activation from prev, activation to next, gradient
  // from next (_batched_p2p_ops).
  CHECK(describe(pipeline_schedule(2, 0, 1, 3)) ==
        "F0c0 | sA0c0p1 | F1c0 | sA1c0p1 rG0c0p1 | B0c0 | F2c0 | sA2c0p1 rG1c0p1 | B1c0 | "
        "rG2c0p1 | B2c0");
  CHECK(describe(pipeline_schedule(2, 1, 1, 3)) ==
        "rA0c0p0 | F0c0 | B0c0 | sG0c0p0 rA1c0p0 | F1c0 | B1c0 | sG1c0p0 rA2c0p0 | F2c0 | "
        "B2c0 | sG2c0p0");
}

TEST_CASE("interleaved 1F1B with pp=3, vp=2, M=3 step by step") {
  // Derived by hand from forward_backward_pipelining_with_interleaving. Rank 0: warmup
  // (3 − 0 − 1)·2 + (2 − 1)·3 = 7 ≥ 6 virtual micro batches, so all are warmup; it receives from
  // rank 2 only from iteration pp − 1 = 2 on (recv_tensor_from_previous_stage's leading stage),
  // into chunk 1, and never after its last chunk-0 forward's partner is chunk 1 (the last virtual
  // stage sends nothing). Its cooldown starts with recv_backward for chunk 1.
  CHECK(describe(pipeline_schedule(3, 0, 2, 3)) ==
        "F0c0 | sA0c0p1 | F1c0 | sA1c0p1 | F2c0 | rA0c1p2 sA2c0p1 | F0c1 | rA1c1p2 sA0c1p1 | "
        "F1c1 | rA2c1p2 sA1c1p1 | F2c1 | sA2c1p1 | rG0c1p1 | B0c1 | sG0c1p2 rG1c1p1 | B1c1 | "
        "sG1c1p2 rG2c1p1 | B2c1 | sG2c1p2 rG0c0p1 | B0c0 | rG1c0p1 | B1c0 | rG2c0p1 | B2c0");
  // Rank 2: warmup (vp − 1)·pp = 3; the last warmup iteration's batch would also receive a
  // gradient but the last rank's first backward is the last virtual stage's; in backward it is
  // the leading stage and receives from rank 0 from iteration 2 on.
  CHECK(describe(pipeline_schedule(3, 2, 2, 3)) ==
        "rA0c0p1 | F0c0 | rA1c0p1 sA0c0p0 | F1c0 | rA2c0p1 sA1c0p0 | F2c0 | rA0c1p1 sA2c0p0 | "
        "F0c1 | B0c1 | sG0c1p1 rA1c1p1 | F1c1 | B1c1 | sG1c1p1 rA2c1p1 | F2c1 | B2c1 | "
        "sG2c1p1 rG0c0p0 | B0c0 | sG0c0p1 rG1c0p0 | B1c0 | sG1c0p1 rG2c0p0 | B2c0 | sG2c0p1");
}

TEST_CASE("interleaved 1F1B with overlapped transfers, pp=2, vp=2, M=2 step by step") {
  // Derived by hand from forward_backward_pipelining_with_interleaving with overlap_p2p_comm
  // (pp=2 is allowed with it). Rank 0: warmup (2 − 0 − 1)·2 + (2 − 1)·2 = 4 = all, so there is
  // no steady state and nothing is posted: the blocking batches of the plain schedule.
  CHECK(describe(pipeline_schedule(2, 0, 2, 2, true)) ==
        "F0c0 | sA0c0p1 | F1c0 | rA0c1p1 sA1c0p1 | F0c1 | rA1c1p1 sA0c1p1 | F1c1 | sA1c1p1 | "
        "rG0c1p1 | B0c1 | sG0c1p1 rG1c1p1 | B1c1 | sG1c1p1 rG0c0p1 | B0c0 | rG1c0p1 | B1c0");
  // Rank 1: warmup 2 (its last-warmup gradient receive is none: the last rank's first backward
  // is the last virtual stage's). Steady k=0: F0c1, then pp_post_forward posts the receive of
  // micro batch 1's chunk-1 input (chunk 1's output is the last virtual stage's: no send); B0c1,
  // then pp_post_backward posts its input gradient's send. Steady k=1: pp_pre_forward waits for
  // the input (W0); F1c1 posts nothing (the last iteration receives nothing); B1c1 posts its
  // send with the receive of micro batch 0's chunk-0 output gradient, after which the previous
  // send is waited for (W1). The cool-down's first backward waits for that receive (W2) and
  // the rest is blocking.
  CHECK(describe(pipeline_schedule(2, 1, 2, 2, true)) ==
        "rA0c0p0 | F0c0 | rA1c0p0 sA0c0p0 | F1c0 | rA0c1p0 sA1c0p0 | F0c1 | P0[rA1c1p0] | B0c1 | "
        "P1[sG0c1p0] | W0 | F1c1 | B1c1 | P2[sG1c1p0 rG0c0p0] | W1 | W2 | B0c0 | "
        "sG0c0p0 rG1c0p0 | B1c0 | sG1c0p0");
}

TEST_CASE("interleaved 1F1B with pp=4, vp=2, M=8: warmup and the chunk order of the table") {
  const Configuration c{4, 2, 8};
  const auto ranks = all_ranks(c);
  // Warmup (pp − rank − 1)·2 + (vp − 1)·pp, then the first steady forward.
  for (int64_t rank = 0; rank < 4; ++rank) {
    CHECK(forwards_before_first_backward(ranks[static_cast<size_t>(rank)]) ==
          (4 - rank - 1) * 2 + 4 + 1);
  }
  // get_schedule_table with groups of pp micro batches: 0–3 on chunk 0, 0–3 on chunk 1, 4–7 on
  // chunk 0, 4–7 on chunk 1; backwards the same with the chunks reversed.
  std::vector<Key> forwards;
  std::vector<Key> backwards;
  for (int64_t group : {0, 4}) {
    for (int64_t chunk : {0, 1}) {
      for (int64_t mb = group; mb < group + 4; ++mb) {
        forwards.push_back({mb, chunk});
        backwards.push_back({mb, 1 - chunk});
      }
    }
  }
  for (const auto& steps : ranks) {
    CHECK(computes(steps, PipelineWork::forward) == forwards);
    CHECK(computes(steps, PipelineWork::backward) == backwards);
  }
}

TEST_CASE("pipeline_slots: the widest micro-batch span in flight, so mb % slots never collides") {
  for (const Configuration& c : configurations()) {
    const auto ranks = all_ranks(c);
    for (int64_t rank = 0; rank < c.pp; ++rank) {
      INFO(name(c), " rank ", rank);
      const auto& steps = ranks[static_cast<size_t>(rank)];
      const int64_t slots = pipeline_slots(steps);
      CHECK(slots >= 1);
      CHECK(slots <= c.micro_batches);
      int64_t widest = 1;
      for (const std::set<int64_t>& in_flight : in_flight_by_step(steps)) {
        if (in_flight.empty()) continue;
        widest = std::max(widest, *in_flight.rbegin() - *in_flight.begin() + 1);
        std::set<int64_t> used;
        for (int64_t mb : in_flight) CHECK(used.insert(mb % slots).second);
      }
      CHECK(slots == widest);
    }
  }
  CHECK(pipeline_slots({}) == 1);
}

TEST_CASE("pipeline_slots for 1F1B with M ≥ pp: pp on the first stage, pp − rank + 1 after") {
  // Rank r holds its pp − r − 1 warmup micro batches and the steady one; past the first stage
  // its steady send_backward_recv_forward batch sends micro batch i's gradient while receiving
  // micro batch i + pp − r's input, one more than that. pp=4, M=8: 4, 4, 3, 2.
  std::vector<int64_t> slots;
  for (int64_t rank = 0; rank < 4; ++rank)
    slots.push_back(pipeline_slots(pipeline_schedule(4, rank, 1, 8)));
  CHECK(slots == std::vector<int64_t>{4, 4, 3, 2});
  for (int64_t pp = 2; pp <= 4; ++pp) {
    for (int64_t m : {pp, pp + 1, 3 * pp}) {
      for (int64_t rank = 0; rank < pp; ++rank) {
        INFO("pp=", pp, " M=", m, " rank ", rank);
        CHECK(pipeline_slots(pipeline_schedule(pp, rank, 1, m)) ==
              (rank == 0 ? pp : pp - rank + 1));
      }
    }
  }
  // pp=1: one micro batch at a time.
  CHECK(pipeline_slots(pipeline_schedule(1, 0, 1, 5)) == 1);
}

TEST_CASE("refusals name Megatron's flags") {
  SUBCASE("interleaving needs more than two stages without the overlap, two with it") {
    const std::string message = error_message([] { pipeline_schedule(2, 0, 2, 4); });
    CHECK(message.find("--pipeline-model-parallel-size") != std::string::npos);
    CHECK(message.find("--num-layers-per-virtual-pipeline-stage") != std::string::npos);
    CHECK(message.find("--no-overlap-p2p-communication") != std::string::npos);
    CHECK(message.find("greater than 2") != std::string::npos);
    CHECK_NOTHROW(pipeline_schedule(2, 0, 2, 4, true));
    for (bool overlap : {false, true}) {
      CHECK_THROWS_WITH_AS(pipeline_schedule(1, 0, 2, 4, overlap),
                           doctest::Contains("greater than 1"), common::Error);
    }
  }
  SUBCASE("interleaving needs the micro batches to divide into groups of pp") {
    const std::string message = error_message([] { pipeline_schedule(4, 1, 2, 6); });
    CHECK(message.find("not divisible by --pipeline-model-parallel-size 4") != std::string::npos);
    CHECK(message.find("--global-batch-size") != std::string::npos);
    CHECK(message.find("--micro-batch-size") != std::string::npos);
    CHECK_THROWS_WITH_AS(pipeline_schedule(4, 0, 3, 2), doctest::Contains("not divisible"),
                         common::Error);
  }
  SUBCASE("sizes are at least 1") {
    CHECK_THROWS_WITH_AS(pipeline_schedule(4, 0, 1, 0), doctest::Contains("--global-batch-size"),
                         common::Error);
    CHECK_THROWS_WITH_AS(pipeline_schedule(0, 0, 1, 4),
                         doctest::Contains("--pipeline-model-parallel-size must be ≥ 1"),
                         common::Error);
    CHECK_THROWS_WITH_AS(pipeline_schedule(4, 0, 0, 4),
                         doctest::Contains("--num-layers-per-virtual-pipeline-stage"),
                         common::Error);
  }
  SUBCASE("the rank is one of the pipeline's") {
    for (int64_t rank : {-1, 4}) {
      const std::string message = error_message([&] { pipeline_schedule(4, rank, 1, 8); });
      CHECK(message.find("out of range for --pipeline-model-parallel-size 4") != std::string::npos);
    }
  }
}
