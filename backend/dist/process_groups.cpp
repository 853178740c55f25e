// Megatron's rank order and the groups built from it; see process_groups.hpp.
#include "backend/dist/process_groups.hpp"

#include <algorithm>

#include "backend/common/error.hpp"

namespace backend {

RankCoordinates rank_coordinates(const ParallelLayout& layout, int64_t rank) {
  if (rank < 0 || rank >= layout.world_size) {
    common::fail("rank {} is outside the world of {} ranks", rank, layout.world_size);
  }
  return {.tensor = rank % layout.tensor_parallel,
          .data = rank / layout.tensor_parallel % layout.data_parallel,
          .pipeline = rank / (layout.tensor_parallel * layout.data_parallel)};
}

int64_t global_rank(const ParallelLayout& layout, const RankCoordinates& c) {
  return c.tensor + layout.tensor_parallel * (c.data + layout.data_parallel * c.pipeline);
}

std::vector<int64_t> group_ranks(const ParallelLayout& layout, int64_t rank, GroupKind kind) {
  const RankCoordinates here = rank_coordinates(layout, rank);
  std::vector<int64_t> ranks;
  switch (kind) {
    case GroupKind::tensor_parallel:
      for (int64_t t = 0; t < layout.tensor_parallel; ++t) {
        ranks.push_back(global_rank(layout, {t, here.data, here.pipeline}));
      }
      break;
    case GroupKind::data_parallel:
      for (int64_t d = 0; d < layout.data_parallel; ++d) {
        ranks.push_back(global_rank(layout, {here.tensor, d, here.pipeline}));
      }
      break;
    case GroupKind::pipeline_parallel:
      for (int64_t p = 0; p < layout.pipeline_parallel; ++p) {
        ranks.push_back(global_rank(layout, {here.tensor, here.data, p}));
      }
      break;
    case GroupKind::embedding: {
      ranks.push_back(global_rank(layout, {here.tensor, here.data, 0}));
      if (layout.pipeline_parallel > 1) {
        ranks.push_back(global_rank(layout, {here.tensor, here.data, layout.pipeline_parallel - 1}));
      }
      break;
    }
  }
  return ranks;
}

namespace {

// split() by the group's first global rank (a color every member computes alike) and the
// position in it.
std::unique_ptr<Communicator> split_group(Communicator& world, const ParallelLayout& layout,
                                          int64_t rank, GroupKind kind, const char* name) {
  const std::vector<int64_t> ranks = group_ranks(layout, rank, kind);
  int64_t position = 0;
  while (ranks[position] != rank) ++position;
  return world.split(ranks.front(), position, name);
}

}  // namespace

ProcessGroups make_process_groups(std::unique_ptr<Communicator> world,
                                  const ParallelLayout& layout) {
  if (world->size() != layout.world_size) {
    common::fail("the layout is for {} ranks, but {} processes were started", layout.world_size,
                 world->size());
  }
  ProcessGroups groups;
  groups.layout = layout;
  groups.rank = world->rank();
  groups.tensor_parallel = split_group(*world, layout, groups.rank, GroupKind::tensor_parallel,
                                       "tensor model parallel");
  groups.data_parallel = split_group(*world, layout, groups.rank, GroupKind::data_parallel,
                                     "data parallel");
  groups.pipeline_parallel = split_group(*world, layout, groups.rank,
                                         GroupKind::pipeline_parallel, "pipeline model parallel");
  // The middle stages are no member of an embedding group: each gets a group of its own (a
  // color no group's first rank can be), which it never uses.
  const std::vector<int64_t> embedding = group_ranks(layout, groups.rank, GroupKind::embedding);
  groups.embedding =
      std::find(embedding.begin(), embedding.end(), groups.rank) != embedding.end()
          ? split_group(*world, layout, groups.rank, GroupKind::embedding, "embedding")
          : world->split(layout.world_size + groups.rank, 0, "embedding");
  groups.world = std::move(world);
  return groups;
}

ProcessGroups single_process_groups() {
  ProcessGroups groups;
  groups.world = make_single_process_communicator("world");
  groups.tensor_parallel = make_single_process_communicator("tensor model parallel");
  groups.data_parallel = make_single_process_communicator("data parallel");
  groups.pipeline_parallel = make_single_process_communicator("pipeline model parallel");
  groups.embedding = make_single_process_communicator("embedding");
  return groups;
}

}  // namespace backend
