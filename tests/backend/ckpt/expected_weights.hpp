// Checks a model's every tensor against an expected.json that a Python fixture script wrote
// ({name: {"shape": [...], "values": [...]}}, by this backend's names): the same names, shapes
// and values exactly. For the tests of the readers of other tools' checkpoints
// (megatron_checkpoint_test.cpp, nemo_archive_test.cpp).
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "backend/model/gpt_model.hpp"

namespace test_support {

inline void check_expected_weights(const backend::GptModel<float>& model,
                                   const std::filesystem::path& expected_file) {
  const nlohmann::json expected = nlohmann::json::parse(std::ifstream(expected_file));
  std::vector<float> host(static_cast<size_t>(model.parameter_buffer().numel));
  model.copy_parameters_to_host(std::span<float>(host));
  size_t checked = 0;
  for (const auto& tensor : model.tensors()) {
    CAPTURE(tensor.name);
    REQUIRE(expected.contains(tensor.name));
    const nlohmann::json& want = expected[tensor.name];
    CHECK(tensor.shape == want["shape"].get<std::vector<int64_t>>());
    const std::vector<float> values(host.begin() + tensor.offset,
                                    host.begin() + tensor.offset + tensor.numel);
    CHECK(values == want["values"].get<std::vector<float>>());
    ++checked;
  }
  CHECK(checked == expected.size());
}

}  // namespace test_support
