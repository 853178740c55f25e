// The parameter store (parameter_store.hpp): the units it finds in a layout, the views it hands
// the ops (the flat buffer's, or ZeRO-3's gathered working slots), the gradient reduction of a
// sharded unit, the readiness callback of --overlap-grad-reduce, and the initialisation.
#include "backend/model/parameter_store.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "tests/backend/model/small_gpt_config.hpp"

using backend::BufferRange;
using backend::CpuDevice;
using backend::ElementType;
using backend::ParameterLayout;
using backend::ParameterStore;
using backend::testing::small_gpt_config;

namespace {

std::vector<float> store_values(backend::View view) {
  const float* first = view.as<float>();
  return {first, first + view.numel};
}

}  // namespace

TEST_CASE("the store's units are the embedding, each layer and the head, tiling the layout") {
  const ParameterLayout layout(small_gpt_config(false));
  CpuDevice device;
  ParameterStore<float> store(layout, device, ElementType::f32, true, nullptr);
  std::vector<BufferRange> ready;
  store.set_gradients_ready([&](BufferRange range) { ready.push_back(range); });
  for (int64_t unit : {store.embedding_unit(), store.layer_unit(0), store.layer_unit(1),
                       store.head_unit()}) {
    store.gradients_done(unit);
  }
  const auto offset = [&](const char* name) { return layout.tensor(name).offset; };
  REQUIRE(ready.size() == 4);
  CHECK(ready[0].offset == 0);
  CHECK(ready[1].offset == offset("decoder.layers.0.input_layernorm.weight"));
  CHECK(ready[2].offset == offset("decoder.layers.1.input_layernorm.weight"));
  CHECK(ready[3].offset == offset("decoder.final_layernorm.weight"));
  for (size_t u = 0; u + 1 < ready.size(); ++u) {
    CHECK(ready[u].offset + ready[u].numel == ready[u + 1].offset);
  }
  CHECK(ready[3].offset + ready[3].numel == layout.numel());
  store.gradients_done(-1);  // a unit this stage does not hold: nothing to tell
  CHECK(ready.size() == 4);
}

TEST_CASE("an unsharded store hands out the flat buffers' tensors, initialised as the layout") {
  const ParameterLayout layout(small_gpt_config(false));
  CpuDevice device;
  ParameterStore<float> store(layout, device, ElementType::f32, true, nullptr);
  CHECK_FALSE(store.sharded());
  CHECK(store.held().offset == 0);
  CHECK(store.held().numel == layout.numel());
  store.init_parameters(7);
  std::vector<float> expected(static_cast<size_t>(layout.numel()));
  layout.init_parameters(expected.data(), 7);
  CHECK(store_values(store.parameters()) == expected);
  const auto& fc2 = layout.tensor("decoder.layers.1.mlp.linear_fc2.weight");
  const backend::View weight = store.parameter(fc2.offset);
  CHECK(weight.numel == fc2.numel);
  CHECK(weight.as<float>() == store.parameters().as<float>() + fc2.offset);
  CHECK(store.gradient(fc2.offset).as<float>() == store.gradients().as<float>() + fc2.offset);
  CHECK(store.parameter(backend::kAbsentTensor).empty());
  CHECK_THROWS_WITH_AS(store.parameter(fc2.offset + 1),
                       doctest::Contains("no parameter tensor starts at offset"),
                       common::Error);
}

TEST_CASE("an inference-only store has no gradient buffer") {
  const ParameterLayout layout(small_gpt_config(false));
  CpuDevice device;
  ParameterStore<float> store(layout, device, ElementType::f32, false, nullptr);
  CHECK(store.gradients().numel == 0);
  CHECK(store.parameters().numel == layout.numel());
}

TEST_CASE("a sharded store uses a unit only once gathered, and sums its gradients into its range") {
  const ParameterLayout layout(small_gpt_config(false));
  CpuDevice device;
  auto group = backend::make_single_process_communicator("data parallel");
  ParameterStore<float> store(layout, device, ElementType::f32, true, group.get());
  CHECK(store.sharded());
  store.init_parameters(3);
  const auto& qkv = layout.tensor("decoder.layers.0.self_attention.linear_qkv.weight");
  const int64_t unit = store.layer_unit(0);
  CHECK_THROWS_WITH_AS(store.parameter(qkv.offset),
                       doctest::Contains("a parameter of sharded unit 1 was used before it was "
                                         "gathered"),
                       common::Error);
  store.gather(unit);
  const std::vector<float> held = store_values(store.parameters());
  const std::vector<float> gathered = store_values(store.parameter(qkv.offset));
  CHECK(gathered == std::vector<float>(held.begin() + qkv.offset,
                                       held.begin() + qkv.offset + qkv.numel));
  // A write of the parameters makes the gathered copy stale: it must be gathered again.
  store.parameters_changed();
  CHECK_THROWS_AS(store.parameter(qkv.offset), common::Error);

  CHECK_THROWS_WITH_AS(store.gradient(qkv.offset),
                       doctest::Contains("a gradient of sharded unit 1"), common::Error);
  store.begin_gradients(unit);
  const backend::View gradient = store.gradient(qkv.offset);
  for (int64_t i = 0; i < gradient.numel; ++i) gradient.as<float>()[i] = 0.5f;
  store.flush_gradients(unit);
  store.begin_gradients(unit);
  for (int64_t i = 0; i < gradient.numel; ++i) gradient.as<float>()[i] = 0.25f;
  store.flush_gradients(unit);
  const std::vector<float> sums = store_values(store.gradients());
  CHECK(sums[static_cast<size_t>(qkv.offset)] == 0.75f);
  CHECK(sums[static_cast<size_t>(qkv.offset + qkv.numel - 1)] == 0.75f);
  CHECK(sums[static_cast<size_t>(qkv.offset + qkv.numel)] == 0.0f);  // the next tensor's
}
