// Megatron's rank order and process groups, checked against initialize_model_parallel's own
// worked example (16 GPUs, tp 2, pp 4: megatron/core/parallel_state.py's docstring), and the
// one-process communicator every single-process run uses.
#include <doctest/doctest.h>

#include <limits>
#include <set>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/dist/process_groups.hpp"

using namespace backend;

namespace {

std::set<std::vector<int64_t>> all_groups(const ParallelLayout& layout, GroupKind kind) {
  std::set<std::vector<int64_t>> groups;
  for (int64_t rank = 0; rank < layout.world_size; ++rank) {
    groups.insert(group_ranks(layout, rank, kind));
  }
  return groups;
}

}  // namespace

TEST_CASE("16 ranks at tp 2, pp 4: Megatron's groups, as its docstring lists them") {
  const ParallelLayout layout = make_parallel_layout(16, 2, 4);
  CHECK(layout.data_parallel == 2);
  CHECK(all_groups(layout, GroupKind::data_parallel) ==
        std::set<std::vector<int64_t>>{{0, 2}, {1, 3}, {4, 6}, {5, 7},
                                       {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(all_groups(layout, GroupKind::tensor_parallel) ==
        std::set<std::vector<int64_t>>{{0, 1}, {2, 3}, {4, 5}, {6, 7},
                                       {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(all_groups(layout, GroupKind::pipeline_parallel) ==
        std::set<std::vector<int64_t>>{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14},
                                       {3, 7, 11, 15}});
  // The embedding group: first and last stage of each pipeline.
  CHECK(group_ranks(layout, 9, GroupKind::embedding) == std::vector<int64_t>{1, 13});
}

TEST_CASE("rank coordinates and global ranks are inverse, tp fastest, then dp, then pp") {
  const ParallelLayout layout = make_parallel_layout(24, 2, 3);  // dp 4
  for (int64_t rank = 0; rank < 24; ++rank) {
    CAPTURE(rank);
    const RankCoordinates c = rank_coordinates(layout, rank);
    CHECK(global_rank(layout, c) == rank);
    CHECK(c.tensor == rank % 2);
    CHECK(c.data == rank / 2 % 4);
    CHECK(c.pipeline == rank / 8);
  }
  CHECK_THROWS_WITH_AS(rank_coordinates(layout, 24), "rank 24 is outside the world of 24 ranks",
                       common::Error);
  // pp = 1: the embedding group is the rank alone.
  CHECK(group_ranks(make_parallel_layout(4, 1, 1), 3, GroupKind::embedding) ==
        std::vector<int64_t>{3});
}

TEST_CASE("a layout that does not divide the world is refused naming the flags") {
  CHECK_THROWS_WITH_AS(make_parallel_layout(6, 4, 1),
                       "world size 6 is not divisible by --tensor-model-parallel-size 4 × "
                       "--pipeline-model-parallel-size 1",
                       common::Error);
}

TEST_CASE("shards of a flat buffer: contiguous, in rank order, the first ones one longer") {
  CHECK(shard_range(10, 3, 0).offset == 0);
  CHECK(shard_range(10, 3, 0).numel == 4);
  CHECK(shard_range(10, 3, 1).offset == 4);
  CHECK(shard_range(10, 3, 1).numel == 3);
  CHECK(shard_range(10, 3, 2).offset == 7);
  CHECK(shard_range(10, 3, 2).numel == 3);
  CHECK(shard_range(2, 4, 3).numel == 0);
  CHECK(shard_range(2, 4, 3).offset == 2);
  CHECK_THROWS_AS(shard_range(10, 3, 3), common::Error);
}

TEST_CASE("shard_member_holding is the inverse of shard_range, for every size and count") {
  for (int64_t numel = 1; numel <= 40; ++numel) {
    for (int64_t members = 1; members <= 12; ++members) {
      for (int64_t member = 0; member < members; ++member) {
        const ShardRange range = shard_range(numel, members, member);
        for (int64_t element = range.offset; element < range.offset + range.numel; ++element) {
          CHECK(shard_member_holding(numel, members, element) == member);
        }
      }
    }
  }
  // Far more members than elements, and sizes near the top of int64_t, without overflow.
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  CHECK(shard_member_holding(5, kHuge, 4) == 4);
  CHECK(shard_member_holding(kHuge, 2, kHuge - 1) == 1);
  CHECK(shard_member_holding(kHuge, kHuge - 1, kHuge - 1) == kHuge - 2);
  CHECK_THROWS_AS(shard_member_holding(10, 3, 10), common::Error);
  CHECK_THROWS_AS(shard_member_holding(10, 0, 0), common::Error);
}

TEST_CASE("one process: every group is the identity, and has no peer to send to") {
  ProcessGroups groups = single_process_groups();
  CHECK(groups.is_first_rank());
  CHECK(groups.is_last_rank());
  CHECK(groups.data_parallel->size() == 1);
  std::vector<float> values = {1.5f, -2.0f};
  const View view = host_view(std::span(values));
  groups.data_parallel->all_reduce(view, ReduceOperation::sum);
  CHECK(values == std::vector<float>{1.5f, -2.0f});
  std::vector<float> gathered(2);
  groups.world->all_gather(host_view(std::span(gathered)), view);
  CHECK(gathered == values);
  CHECK_THROWS_WITH_AS(groups.pipeline_parallel->send(view, 1),
                       "send to rank 1: the one-process pipeline model parallel group has no "
                       "other member",
                       common::Error);
  // make_process_groups checks the layout against the processes that run.
  CHECK_THROWS_WITH_AS(make_process_groups(make_single_process_communicator("world"),
                                           make_parallel_layout(2, 1, 1)),
                       "the layout is for 2 ranks, but 1 processes were started", common::Error);
}
