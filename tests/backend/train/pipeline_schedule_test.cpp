// Megatron's 1F1B and interleaved 1F1B schedules as step lists: all ranks of a pipeline are run
// together under blocking batch semantics (a batch completes once every send and receive in it
// has met its partner in the peer's posted batch; same pair and message kind match in order),
// which must finish and pair each send with a receive of the same micro batch one virtual stage
// away; each rank's list must run every forward and backward once, in dependency order; a few
// schedules are pinned step by step as derived by hand from schedules.py; the refusals name
// Megatron's flags.
#include "backend/train/pipeline_schedule.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
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
};

std::string name(const Configuration& c) {
  return fmt::format("pp={} vp={} M={}", c.pp, c.vp, c.micro_batches);
}

// pp 1–4; vp 1, and 2 and 3 where interleaving is allowed (pp > 2); M = pp, 2pp, 3pp, and
// for 1F1B also 1, pp + 1 and 7 (fewer micro batches than stages, and not a multiple).
std::vector<Configuration> configurations() {
  std::vector<Configuration> result;
  for (int64_t pp = 1; pp <= 4; ++pp) {
    for (int64_t vp : {1, 2, 3}) {
      if (vp > 1 && pp <= 2) continue;
      std::set<int64_t> counts{pp, 2 * pp, 3 * pp};
      if (vp == 1) counts.insert({1, pp + 1, 7});
      for (int64_t m : counts) result.push_back({pp, vp, m});
    }
  }
  return result;
}

std::vector<std::vector<PipelineStep>> all_ranks(const Configuration& c) {
  std::vector<std::vector<PipelineStep>> ranks;
  for (int64_t rank = 0; rank < c.pp; ++rank) {
    ranks.push_back(pipeline_schedule(c.pp, rank, c.vp, c.micro_batches));
  }
  return ranks;
}

// F0c1: forward of micro batch 0 on chunk 1; sA2c0p3: send the activation of micro batch 2,
// chunk 0, to rank 3; rG..: receive a gradient. A batch's transfers are separated by spaces,
// steps by " | ".
std::string describe(const PipelineStep& step) {
  if (step.kind == PipelineStep::Kind::compute) {
    return fmt::format("{}{}c{}", step.work == PipelineWork::forward ? 'F' : 'B', step.micro_batch,
                       step.chunk);
  }
  std::vector<std::string> parts;
  for (const PipelineTransfer& t : step.transfers) {
    parts.push_back(fmt::format("{}{}{}c{}p{}", t.send ? 's' : 'r',
                                t.message == PipelineMessage::activation ? 'A' : 'G', t.micro_batch,
                                t.chunk, t.peer));
  }
  return fmt::format("{}", fmt::join(parts, " "));
}

std::string describe(const std::vector<PipelineStep>& steps) {
  std::vector<std::string> parts;
  for (const PipelineStep& step : steps) parts.push_back(describe(step));
  return fmt::format("{}", fmt::join(parts, " | "));
}

// ---- all ranks together under blocking batch semantics

using ChannelKey = std::tuple<int64_t, int64_t, PipelineMessage>;  // sender, receiver, kind

struct Endpoint {
  int64_t rank = 0;
  PipelineTransfer transfer;
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

Simulation simulate(const std::vector<std::vector<PipelineStep>>& ranks) {
  Simulation sim;
  const size_t n = ranks.size();
  std::vector<size_t> position(n, 0);
  std::vector<bool> posted(n, false);
  struct Pending {
    ChannelKey key;
    size_t index = 0;
    bool send = false;
  };
  std::vector<std::vector<Pending>> pending(n);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < n; ++r) {
      const auto rank = static_cast<int64_t>(r);
      while (position[r] < ranks[r].size()) {
        const PipelineStep& step = ranks[r][position[r]];
        if (step.kind == PipelineStep::Kind::compute) {
          ++position[r];
          progress = true;
          continue;
        }
        if (!posted[r]) {
          pending[r].clear();
          for (const PipelineTransfer& t : step.transfers) {
            const ChannelKey key =
                t.send ? ChannelKey{rank, t.peer, t.message} : ChannelKey{t.peer, rank, t.message};
            auto& queue = t.send ? sim.channels[key].sends : sim.channels[key].receives;
            pending[r].push_back({key, queue.size(), t.send});
            queue.push_back({rank, t});
          }
          posted[r] = true;
          progress = true;
        }
        const bool complete =
            std::all_of(pending[r].begin(), pending[r].end(), [&](const Pending& p) {
              const Channel& channel = sim.channels[p.key];
              return (p.send ? channel.receives : channel.sends).size() > p.index;
            });
        if (!complete) break;
        ++position[r];
        posted[r] = false;
        progress = true;
      }
    }
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
  for (size_t i = 0; i < steps.size(); ++i) {
    const PipelineStep& step = steps[i];
    if (step.kind == PipelineStep::Kind::compute) {
      CHECK(step.transfers.empty());
      const Key key{step.micro_batch, step.chunk};
      auto& at = step.work == PipelineWork::forward ? forward_at : backward_at;
      CHECK_MESSAGE(at.emplace(key, i).second, "computed twice: step ", i);
      continue;
    }
    CHECK(c.pp > 1);
    CHECK_FALSE(step.transfers.empty());
    for (const PipelineTransfer& t : step.transfers) {
      const Key key{t.micro_batch, t.chunk};
      const bool activation = t.message == PipelineMessage::activation;
      // Activations flow to the next rank, gradients to the previous.
      CHECK(t.peer == (activation == t.send ? next : prev));
      auto& at = activation ? (t.send ? activation_out : activation_in)
                            : (t.send ? gradient_out : gradient_in);
      CHECK_MESSAGE(at.emplace(key, i).second, "transferred twice: step ", i);
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

TEST_CASE("every rank runs each forward and backward once, after what it depends on") {
  for (const Configuration& c : configurations()) {
    const auto ranks = all_ranks(c);
    for (int64_t rank = 0; rank < c.pp; ++rank) {
      check_rank_order(c, rank, ranks[static_cast<size_t>(rank)]);
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
  SUBCASE("interleaving needs more than two stages") {
    const std::string message = error_message([] { pipeline_schedule(2, 0, 2, 4); });
    CHECK(message.find("--pipeline-model-parallel-size") != std::string::npos);
    CHECK(message.find("--num-layers-per-virtual-pipeline-stage") != std::string::npos);
    CHECK(message.find("greater than 2") != std::string::npos);
    CHECK_THROWS_AS(pipeline_schedule(1, 0, 2, 4), common::Error);
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
