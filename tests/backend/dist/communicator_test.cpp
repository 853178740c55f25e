// The one-process communicator's point-to-point batch (backend/dist/communicator.hpp): an empty
// batch is nothing to do, and any transfer is refused naming the group, as send and receive are
// (the group has no other member). The batch on real ranks is tests/mpi/communicator_test.cpp.
#include <doctest/doctest.h>

#include <span>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/dist/communicator.hpp"

using backend::PointToPoint;

TEST_CASE("the one-process communicator exchanges an empty batch and refuses any transfer") {
  auto group = backend::make_single_process_communicator("pipeline model parallel");
  group->exchange({});
  std::vector<float> values = {1.0f, 2.0f};
  const backend::View view = backend::host_view(std::span(values));
  const std::vector<PointToPoint> send = {
      {.direction = PointToPoint::Direction::send, .values = view, .peer = 1, .tag = 0}};
  CHECK_THROWS_WITH_AS(group->exchange(send),
                       "exchange: send to rank 1: the one-process pipeline model parallel group "
                       "has no other member",
                       common::Error);
  // A receive listed first is the one named, whatever follows it; itself is no peer either.
  const std::vector<PointToPoint> both = {
      {.direction = PointToPoint::Direction::receive, .values = view, .peer = 0, .tag = 3},
      {.direction = PointToPoint::Direction::send, .values = view, .peer = 0, .tag = 3}};
  CHECK_THROWS_WITH_AS(group->exchange(both),
                       "exchange: receive from rank 0: the one-process pipeline model parallel "
                       "group has no other member",
                       common::Error);
  CHECK(values == std::vector<float>{1.0f, 2.0f});
}
