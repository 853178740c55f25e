// The tensor-parallel region of a group of one (tensor_parallel_region.hpp): every collective is
// the identity, the rank holds every row whatever --sequence-parallel says, and the cross-entropy
// is the plain one. Groups of several ranks run in tests/mpi (the model's tensor-parallel runs
// against one process).
#include "backend/model/tensor_parallel_region.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "backend/device/cpu_device.hpp"
#include "backend/ops/cross_entropy.hpp"

using backend::ElementType;
using backend::MemoryKind;
using backend::TensorParallelRegion;
using backend::View;

namespace {

View region_test_view(std::vector<float>& values) {
  return View{values.data(), static_cast<int64_t>(values.size()), ElementType::f32,
              MemoryKind::host};
}

}  // namespace

TEST_CASE("a tensor-parallel region of one rank changes nothing") {
  TensorParallelRegion region(nullptr, /*sequence_parallel=*/true);
  CHECK(region.size() == 1);
  CHECK(region.rank() == 0);
  CHECK_FALSE(region.active());
  CHECK_FALSE(region.sequence_parallel());  // nothing to shard over
  CHECK(region.group().name() == "tensor parallel");
  region.set_rows(6);
  CHECK(region.stream_rows() == 6);
  CHECK(region.first_own_element(4) == 0);
  std::vector<float> whole(24, 1.0f), shard(24, 0.0f);
  CHECK(region.own_rows(region_test_view(whole), 4).data == whole.data());
  const View reduced = region.reduce(region_test_view(whole), region_test_view(shard));
  CHECK(reduced.data == whole.data());
  CHECK(whole == std::vector<float>(24, 1.0f));
  CHECK(region.gather(region_test_view(whole), region_test_view(shard)).data == whole.data());
  CHECK(shard == std::vector<float>(24, 0.0f));
}

TEST_CASE("the region's cross-entropy over one rank is the plain cross-entropy") {
  TensorParallelRegion region(nullptr, false);
  backend::CpuDevice device;
  const int64_t rows = 3, vocab = 5;
  std::vector<float> logits{0.1f, 2.0f, -1.0f, 0.5f, 0.0f,  1.0f, 1.0f, 1.0f, 1.0f, 1.0f,
                            3.0f, -2.0f, 0.25f, 0.0f, 4.0f};
  std::vector<int32_t> labels{1, backend::kIgnoredLabel, 4};
  std::vector<float> losses(3), logsumexp(3), expected_losses(3), expected_logsumexp(3);
  std::vector<float> unused(3);
  const View label_view{labels.data(), rows, ElementType::i32, MemoryKind::host};
  region.cross_entropy(device, region_test_view(losses), region_test_view(logsumexp), region_test_view(unused),
                       region_test_view(unused), region_test_view(logits), label_view, rows, vocab, 0);
  backend::ops::cross_entropy_forward(device, region_test_view(expected_losses),
                                      region_test_view(expected_logsumexp), region_test_view(logits), label_view,
                                      rows, vocab);
  CHECK(losses == expected_losses);
  CHECK(logsumexp == expected_logsumexp);
  CHECK(losses[1] == 0.0f);
  CHECK(losses[0] > 0.0f);
}
