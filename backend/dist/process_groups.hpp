// The process groups of a parallel layout, in Megatron's rank order (megatron/core/
// parallel_state.py initialize_model_parallel, order "tp-cp-ep-dp-pp" with cp = ep = 1): the
// tensor-parallel rank varies fastest, then the data-parallel rank, then the pipeline stage,
//   global rank = tp_rank + tp · (dp_rank + dp · pp_rank)
// so a TP group is tp consecutive ranks, a DP group the ranks tp apart within one stage, and a
// pipeline group the ranks tp · dp apart. The embedding group (tied word embeddings on the
// first and last stage) is a pipeline group's first and last member.
//
// group_ranks() is the pure function of the layout that the tests check; ProcessGroups holds the
// communicators of one rank's groups, made from the world's by split(): a value passed to what
// needs it, never a global.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/dist/communicator.hpp"
#include "backend/dist/parallel_layout.hpp"

namespace backend {

struct RankCoordinates {
  int64_t tensor = 0;
  int64_t data = 0;
  int64_t pipeline = 0;
  bool operator==(const RankCoordinates&) const = default;
};

RankCoordinates rank_coordinates(const ParallelLayout& layout, int64_t rank);
int64_t global_rank(const ParallelLayout& layout, const RankCoordinates& coordinates);

enum class GroupKind { tensor_parallel, data_parallel, pipeline_parallel, embedding };

// The global ranks of `rank`'s group of `kind`, in group-rank order.
std::vector<int64_t> group_ranks(const ParallelLayout& layout, int64_t rank, GroupKind kind);

// One rank's groups. `world` is every rank; the others are split from it.
struct ProcessGroups {
  ParallelLayout layout;
  int64_t rank = 0;  // global
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tensor_parallel;
  std::unique_ptr<Communicator> data_parallel;
  std::unique_ptr<Communicator> pipeline_parallel;
  // The first and last stage's ranks of this rank's pipeline (tied word embeddings); on a
  // middle stage a group of its own, unused.
  std::unique_ptr<Communicator> embedding;
  // Set once each communicator has its routes for device and host memory
  // (device_collectives.hpp), so they are not routed twice.
  bool routed = false;

  // The five communicators, in this order, for what treats them alike (device_collectives.cpp
  // gives each its routes).
  std::array<std::unique_ptr<Communicator>*, 5> communicators() {
    return {&world, &tensor_parallel, &data_parallel, &pipeline_parallel, &embedding};
  }

  RankCoordinates coordinates() const { return rank_coordinates(layout, rank); }
  // Megatron prints the iteration lines on the last rank, the rest on rank 0.
  bool is_first_rank() const { return rank == 0; }
  bool is_last_rank() const { return rank == layout.world_size - 1; }
};

// Every member of `world` calls this with the same layout (whose world size must be
// world->size()); the groups come from split() in Megatron's order.
ProcessGroups make_process_groups(std::unique_ptr<Communicator> world,
                                  const ParallelLayout& layout);

// The groups of a one-process run: every communicator is the one-process one.
ProcessGroups single_process_groups();

}  // namespace backend
