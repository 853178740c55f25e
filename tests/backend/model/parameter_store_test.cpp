// The parameter store (parameter_store.hpp): the units it finds in a layout, the views it hands
// the ops (the flat buffer's, or ZeRO-3's gathered working slots), the gradient reduction of a
// sharded unit, the readiness callback of --overlap-grad-reduce, the arriving parameters of
// --overlap-param-gather (and their owed gathers under captured steps), and the initialisation.
#include "backend/model/parameter_store.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>
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

namespace parameter_store_arrivals {

// A started gather whose values land when it is waited for: `range` of `parameters` filled with
// `value`, and its name logged (so a test sees which buckets a use waited for).
class LandingGather final : public backend::Communicator::PendingCollective {
 public:
  LandingGather(backend::View parameters, BufferRange range, float value, std::string name,
                std::vector<std::string>& log)
      : parameters_(parameters), range_(range), value_(value), name_(std::move(name)), log_(log) {}
  void wait() override {
    if (landed_) return;
    landed_ = true;
    float* values = parameters_.as<float>() + range_.offset;
    for (int64_t i = 0; i < range_.numel; ++i) values[i] = value_;
    log_.push_back(name_);
  }

 private:
  backend::View parameters_;
  BufferRange range_;
  float value_;
  std::string name_;
  std::vector<std::string>& log_;
  bool landed_ = false;
};

backend::ArrivingParameters landing(backend::View parameters, BufferRange range, float value,
                                    std::string name, std::vector<std::string>& log) {
  return {range, std::make_unique<LandingGather>(parameters, range, value, std::move(name), log)};
}

// The bf16 bits the working copy holds for the tensor at `offset`.
std::vector<uint16_t> working_bits(ParameterStore<float>& store, int64_t offset) {
  const backend::View weights = store.parameter(offset);
  const auto* first = static_cast<const uint16_t*>(weights.data);
  return {first, first + weights.numel};
}

std::vector<uint16_t> bits_of(float value, int64_t numel) {
  return std::vector<uint16_t>(static_cast<size_t>(numel), backend::to_bfloat16(value).bits);
}

}  // namespace parameter_store_arrivals

TEST_CASE("arriving parameters are waited for unit by unit, each unit's working copy made then") {
  using namespace parameter_store_arrivals;
  const ParameterLayout layout(small_gpt_config(false));
  CpuDevice device;
  ParameterStore<float> store(layout, device, ElementType::bf16, true, nullptr);
  store.init_parameters(5);
  store.refresh_weights();
  const std::vector<BufferRange> units = store.unit_ranges();
  REQUIRE(units.size() == 4);  // the embedding, two layers, the head, in the forward's order
  const auto& embedding = layout.tensor("embedding.word_embeddings.weight");
  const auto& qkv0 = layout.tensor("decoder.layers.0.self_attention.linear_qkv.weight");
  const auto& qkv1 = layout.tensor("decoder.layers.1.self_attention.linear_qkv.weight");
  const std::vector<uint16_t> before = working_bits(store, qkv1.offset);

  // The optimizer wrote the parameters; two buckets arrive: [embedding, layer 0] and
  // [layer 1, head].
  const backend::View parameters = store.parameters();
  store.parameters_changed();
  std::vector<std::string> log;
  const BufferRange first{0, units[2].offset};
  const BufferRange second{units[2].offset, layout.numel() - units[2].offset};
  std::vector<backend::ArrivingParameters> arrivals;
  arrivals.push_back(landing(parameters, first, 2.0f, "first", log));
  arrivals.push_back(landing(parameters, second, 3.0f, "second", log));
  store.parameters_arriving(std::move(arrivals));

  // The forward's whole-copy refresh leaves the arriving units alone.
  store.refresh_weights();
  CHECK(log.empty());
  CHECK(working_bits(store, qkv1.offset) == before);
  // Layer 0's first use waits for the first bucket only, and makes layer 0's copy.
  store.gather(store.layer_unit(0));
  CHECK(log == std::vector<std::string>{"first"});
  CHECK(working_bits(store, qkv0.offset) == bits_of(2.0f, qkv0.numel));
  CHECK(working_bits(store, qkv1.offset) == before);
  // The embedding shares that bucket: no second wait, its copy made at its own first use.
  store.gather(store.embedding_unit());
  CHECK(log == std::vector<std::string>{"first"});
  CHECK(working_bits(store, embedding.offset) == bits_of(2.0f, embedding.numel));
  // Any access to the buffer outside the forward waits for the rest.
  CHECK(store_values(store.parameters())[static_cast<size_t>(layout.numel() - 1)] == 3.0f);
  CHECK(log == std::vector<std::string>{"first", "second"});
  CHECK(working_bits(store, qkv1.offset) == bits_of(3.0f, qkv1.numel));
  store.gather(store.head_unit());  // already in place
  CHECK(log.size() == 2);
}

TEST_CASE("units outside the arriving ranges are in place, and bad arrivals are refused") {
  using namespace parameter_store_arrivals;
  const ParameterLayout layout(small_gpt_config(false));
  CpuDevice device;
  ParameterStore<float> store(layout, device, ElementType::bf16, true, nullptr);
  store.init_parameters(5);
  const backend::View parameters = store.parameters();
  const std::vector<BufferRange> units = store.unit_ranges();
  const auto& qkv0 = layout.tensor("decoder.layers.0.self_attention.linear_qkv.weight");
  for (int64_t i = 0; i < qkv0.numel; ++i) parameters.as<float>()[qkv0.offset + i] = 0.5f;
  store.parameters_changed();
  std::vector<std::string> log;
  std::vector<backend::ArrivingParameters> head_only;
  head_only.push_back(landing(parameters, units[3], 4.0f, "head", log));
  store.parameters_arriving(std::move(head_only));
  // Layer 0 is not arriving: its copy was made from the written values at once.
  store.gather(store.layer_unit(0));
  CHECK(log.empty());
  CHECK(working_bits(store, qkv0.offset) == bits_of(0.5f, qkv0.numel));
  // A write (parameters_changed) waits for what is still arriving first.
  store.parameters_changed();
  CHECK(log == std::vector<std::string>{"head"});

  std::vector<backend::ArrivingParameters> crossing;
  crossing.push_back(landing(parameters, {0, units[0].numel + 1}, 1.0f, "crossing", log));
  CHECK_THROWS_WITH_AS(store.parameters_arriving(std::move(crossing)),
                       doctest::Contains("crosses the edge of arriving range"), common::Error);

  auto group = backend::make_single_process_communicator("data parallel");
  ParameterStore<float> sharded(layout, device, ElementType::f32, true, group.get());
  CHECK_THROWS_WITH_AS(sharded.parameters_arriving({}),
                       doctest::Contains("a ZeRO-3 store gathers its own units"), common::Error);
}

TEST_CASE(
    "owed parameters are gathered at their first use outside a step, or by the step that "
    "starts them") {
  // --overlap-param-gather under captured steps: the update leaves the rest of the buffer owed;
  // a use before the next step (an evaluation's forward, a save) gathers it through the owed
  // group at once, and the next step starts the gathers through its own group whatever came
  // before.
  using namespace parameter_store_arrivals;
  const ParameterLayout layout(small_gpt_config(false));
  CpuDevice device;
  ParameterStore<float> store(layout, device, ElementType::bf16, true, nullptr);
  store.init_parameters(5);
  store.refresh_weights();
  const std::vector<BufferRange> units = store.unit_ranges();
  const auto& qkv1 = layout.tensor("decoder.layers.1.self_attention.linear_qkv.weight");
  const backend::View parameters = store.parameters();
  auto owed_group = backend::make_single_process_communicator("owed");
  auto step_group = backend::make_single_process_communicator("step");
  std::vector<std::string> log;
  // Two buckets landing `value`, logged with the group they were started through.
  const auto gathers = [&](float value) -> backend::ParameterGathers {
    return [&, value](backend::Communicator& group, backend::View buffer) {
      CHECK(buffer.data == parameters.data);
      std::vector<backend::ArrivingParameters> arrivals;
      arrivals.push_back(
          landing(buffer, {0, units[2].offset}, value, group.name() + " first", log));
      arrivals.push_back(landing(buffer, {units[2].offset, layout.numel() - units[2].offset}, value,
                                 group.name() + " second", log));
      return arrivals;
    };
  };

  // A forward's first use (its whole-copy refresh) gathers what is owed, all of it, through the
  // owed group, and makes the working copy of it.
  store.parameters_changed();
  store.parameters_owed(*owed_group, gathers(2.0f));
  CHECK(log.empty());
  store.refresh_weights();
  CHECK(log == std::vector<std::string>{"owed first", "owed second"});
  CHECK(working_bits(store, qkv1.offset) == bits_of(2.0f, qkv1.numel));
  // As does a unit's gather, or any access to the buffer; once.
  for (int use = 0; use < 2; ++use) {
    log.clear();
    store.parameters_changed();
    store.parameters_owed(*owed_group, gathers(3.0f + static_cast<float>(use)));
    if (use == 0) {
      store.gather(store.head_unit());
    } else {
      CHECK(store_values(store.parameters())[static_cast<size_t>(qkv1.offset)] == 4.0f);
    }
    CHECK(log == std::vector<std::string>{"owed first", "owed second"});
    store.parameters();
    CHECK(log.size() == 2);
  }

  // The step's start: the gathers through its group, the owed ones dropped; each unit waits for
  // its bucket at its first use.
  log.clear();
  store.parameters_changed();
  store.parameters_owed(*owed_group, gathers(5.0f));
  store.start_gathers(*step_group, gathers(6.0f));
  CHECK(log.empty());
  store.gather(store.layer_unit(0));
  CHECK(log == std::vector<std::string>{"step first"});
  // Not done: a replay cannot be said to have brought them.
  CHECK_THROWS_WITH_AS(store.parameters_arrived(), doctest::Contains("units are still arriving"),
                       common::Error);
  store.finish_arrivals();
  CHECK(log == std::vector<std::string>{"step first", "step second"});
  CHECK(working_bits(store, qkv1.offset) == bits_of(6.0f, qkv1.numel));
  // Started whether or not anything is owed (a capture holds them whatever came before).
  log.clear();
  store.start_gathers(*step_group, gathers(7.0f));
  store.finish_arrivals();
  CHECK(log == std::vector<std::string>{"step first", "step second"});

  // After a replayed step the store is told what its graph did: nothing owed any more, the
  // working copy current (the replay converted it; the store's own pass would not run).
  log.clear();
  store.parameters_changed();
  store.parameters_owed(*owed_group, gathers(8.0f));
  store.parameters_arrived();
  store.refresh_weights();
  store.parameters();
  CHECK(log.empty());
  CHECK(working_bits(store, qkv1.offset) == bits_of(7.0f, qkv1.numel));

  // A failed capture's gathers are dropped unwaited, and the working copy is made again.
  store.start_gathers(*step_group, gathers(9.0f));
  store.abandon_arrivals();
  store.parameters();
  CHECK(log.empty());
  for (int64_t i = 0; i < qkv1.numel; ++i) parameters.as<float>()[qkv1.offset + i] = 0.25f;
  store.refresh_weights();
  CHECK(working_bits(store, qkv1.offset) == bits_of(0.25f, qkv1.numel));

  auto group = backend::make_single_process_communicator("data parallel");
  ParameterStore<float> sharded(layout, device, ElementType::f32, true, group.get());
  CHECK_THROWS_WITH_AS(sharded.parameters_owed(*owed_group, gathers(1.0f)),
                       doctest::Contains("a ZeRO-3 store gathers its own units"), common::Error);
}
