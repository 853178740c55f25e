// torch_checkpoint_writer: a tree of every kind a checkpoint holds (nested dicts and
// OrderedDicts, a Namespace, lists, tuples, integers small and beyond 32 bits, floats, booleans,
// None, strings, integer keys, and tensors of float32, bfloat16, float16 and int64 with scalar,
// empty and 3-D shapes) is written, read back by this backend's reader (torch_checkpoint.hpp)
// and by PyTorch itself (load_torch_checkpoint.py: its weights_only loader where it has one
// that reads floats, else torch.load with only that loader's globals and argparse.Namespace
// resolvable), value for value. The archive's data entries are 64-byte aligned.
#include "backend/ckpt/torch_checkpoint_writer.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/core/element_type.hpp"
#include "tests/reference_tools.hpp"
#include "tests/temporary_directory.hpp"
#include "tests/test_files.hpp"

namespace {

namespace fs = std::filesystem;
using backend::TorchDtype;
using backend::TorchValue;

TorchValue sample_tree(const std::vector<float>& weights, const std::vector<int64_t>& ids) {
  TorchValue root = TorchValue::dict();
  TorchValue args = TorchValue::name_space();
  args.set("num_layers", TorchValue::integer(4));
  args.set("lr", TorchValue::real(3e-4));
  args.set("bf16", TorchValue::boolean(true));
  args.set("tokenizer_model", TorchValue::none());
  args.set("tokenizer_type", TorchValue::text("GPT2BPETokenizer"));
  root.set("args", std::move(args));
  root.set("checkpoint_version", TorchValue::real(3.0));
  root.set("iteration", TorchValue::integer(5'000'000'000));  // beyond 32 bits
  root.set("negative", TorchValue::integer(-7));
  TorchValue model = TorchValue::ordered_dict();
  model.set("weight", TorchValue::tensor_from_floats(TorchDtype::float32, {2, 3, 2}, weights));
  model.set("weight_bf16", TorchValue::tensor_from_floats(TorchDtype::bfloat16, {12}, weights));
  model.set("weight_fp16", TorchValue::tensor_from_floats(TorchDtype::float16, {3, 4}, weights));
  model.set("scalar",
            TorchValue::tensor_from_floats(TorchDtype::float32, {}, std::span(weights).first(1)));
  model.set("empty", TorchValue::tensor_from_floats(TorchDtype::float32, {0, 4}, {}));
  model.set("ids", TorchValue::tensor(TorchDtype::int64, {3}, std::as_bytes(std::span(ids))));
  model.set("layer._extra_state", TorchValue::none());
  root.set("model", std::move(model));
  TorchValue state = TorchValue::dict();
  TorchValue first = TorchValue::dict();
  first.set("step", TorchValue::tensor_from_floats(TorchDtype::float32, {},
                                                   std::span(weights).subspan(2, 1)));
  state.set(int64_t{0}, std::move(first));
  TorchValue optimizer = TorchValue::dict();
  optimizer.set("state", std::move(state));
  optimizer.set(
      "param_groups",
      TorchValue::list({TorchValue::tuple({TorchValue::real(0.9), TorchValue::real(0.95)}),
                        TorchValue::list({})}));
  root.set("optimizer", std::move(optimizer));
  // A dict under a tuple of dtypes (the distributed optimizer's grad buffers).
  TorchValue buffers = TorchValue::dict();
  buffers.set(TorchValue::tuple({TorchValue::dtype(TorchDtype::bfloat16),
                                 TorchValue::dtype(TorchDtype::float32)}),
              TorchValue::integer(1));
  root.set("buffers", std::move(buffers));
  return root;
}

}  // namespace

TEST_CASE("torch checkpoint writer: every kind, read back here and by PyTorch") {
  test_support::TemporaryDirectory directory;
  std::vector<float> weights(12);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.25f * static_cast<float>(i) - 1.0f;
  weights[5] = 1.0f / 3.0f;  // rounds in bf16 and fp16
  const std::vector<int64_t> ids = {1, -2, int64_t{1} << 40};
  const fs::path file = directory.path / "model_optim_rng.pt";
  backend::write_torch_checkpoint(file, sample_tree(weights, ids));
  // A file is not replaced.
  CHECK_THROWS_AS(backend::write_torch_checkpoint(file, TorchValue::dict()), common::Error);

  // This backend's reader.
  const backend::TorchCheckpointFile read(file);
  const backend::PickleValue& root = read.root();
  REQUIRE(root.kind == backend::PickleKind::dict);
  CHECK(root.find("iteration")->integer == 5'000'000'000);
  CHECK(root.find("negative")->integer == -7);
  CHECK(root.find("checkpoint_version")->real == 3.0);
  const backend::PickleValue& model = *root.find("model");
  const backend::TorchTensor weight = read.tensor(*model.find("weight"), "weight");
  CHECK(weight.shape == std::vector<int64_t>{2, 3, 2});
  CHECK(weight.stride == std::vector<int64_t>{6, 2, 1});
  const std::vector<double> values = read.tensor_values(weight);
  CHECK(std::vector<float>(values.begin(), values.end()) == weights);
  const backend::TorchTensor bf16 = read.tensor(*model.find("weight_bf16"), "weight_bf16");
  CHECK(bf16.dtype == TorchDtype::bfloat16);
  CHECK(read.tensor_values(bf16)[5] ==
        static_cast<double>(backend::to_float(backend::to_bfloat16(1.0f / 3.0f))));
  CHECK(read.tensor_values(read.tensor(*model.find("ids"), "ids")) ==
        std::vector<double>{1, -2, static_cast<double>(int64_t{1} << 40)});
  CHECK(read.tensor(*model.find("scalar"), "scalar").shape.empty());
  const backend::PickleValue& buffers = *root.find("buffers");
  REQUIRE(buffers.entries.size() == 1);
  const backend::PickleValue& dtypes = *buffers.entries[0].first;
  REQUIRE(dtypes.kind == backend::PickleKind::tuple);
  REQUIRE(dtypes.items.size() == 2);
  CHECK(dtypes.items[0]->kind == backend::PickleKind::global);
  CHECK(dtypes.items[0]->text == "torch");
  CHECK(dtypes.items[0]->name == "bfloat16");
  CHECK(dtypes.items[1]->name == "float32");

  // The storages' data starts on 64-byte boundaries (the local header's extra field pads).
  const std::string bytes = test_support::read_file(file);
  for (const std::string name : {"model_optim_rng/data/0", "model_optim_rng/data/5"}) {
    CAPTURE(name);
    const size_t at = bytes.find(name);
    REQUIRE(at != std::string::npos);
    REQUIRE(at >= 30);
    const size_t header = at - 30;
    const auto extra = static_cast<size_t>(static_cast<uint8_t>(bytes[header + 28])) |
                       static_cast<size_t>(static_cast<uint8_t>(bytes[header + 29])) << 8;
    CHECK((at + name.size() + extra) % 64 == 0);
  }

  // PyTorch.
  if (!test_support::python_imports("torch", "python3-torch")) return;
  const auto loaded = test_support::run_command(
      std::string(test_support::kPython) + " " + test_support::kTestSource +
      "/tests/backend/ckpt/load_torch_checkpoint.py " + file.string());
  REQUIRE_MESSAGE(loaded.exit_status == 0, loaded.output);
  const nlohmann::json json = nlohmann::json::parse(loaded.output);
  INFO(json.dump());
  CHECK(json["bad_entry"].is_null());
  const nlohmann::json& top = json["value"]["dict"];
  REQUIRE(top.size() == 7);
  CHECK(top[6][0] == "buffers");
  CHECK(top[6][1]["dict"][0][0] ==
        nlohmann::json::parse(
            R"({"tuple": [{"dtype": "torch.bfloat16"}, {"dtype": "torch.float32"}]})"));
  CHECK(top[6][1]["dict"][0][1] == 1);
  CHECK(top[0][0] == "args");
  const nlohmann::json& args = top[0][1]["namespace"];
  CHECK(args["num_layers"] == 4);
  CHECK(args["lr"] == 3e-4);
  CHECK(args["bf16"] == true);
  CHECK(args["tokenizer_model"].is_null());
  CHECK(args["tokenizer_type"] == "GPT2BPETokenizer");
  CHECK(top[1][1] == 3.0);
  CHECK(top[2][1] == 5'000'000'000);
  CHECK(top[3][1] == -7);
  const nlohmann::json& tensors = top[4][1]["ordered_dict"];
  REQUIRE(tensors.size() == 7);
  CHECK(tensors[0][0] == "weight");
  CHECK(tensors[0][1]["tensor"] == "torch.float32");
  CHECK(tensors[0][1]["shape"] == std::vector<int64_t>{2, 3, 2});
  CHECK(tensors[0][1]["values"].get<std::vector<float>>() == weights);
  CHECK(tensors[1][1]["tensor"] == "torch.bfloat16");
  CHECK(tensors[1][1]["values"][5] ==
        static_cast<double>(backend::to_float(backend::to_bfloat16(1.0f / 3.0f))));
  CHECK(tensors[2][1]["tensor"] == "torch.float16");
  CHECK(tensors[2][1]["shape"] == std::vector<int64_t>{3, 4});
  CHECK(tensors[2][1]["values"][5] ==
        static_cast<double>(backend::to_float(backend::to_float16(1.0f / 3.0f))));
  CHECK(tensors[3][1]["shape"].empty());
  CHECK(tensors[3][1]["values"] == std::vector<double>{-1.0});
  CHECK(tensors[4][1]["shape"] == std::vector<int64_t>{0, 4});
  CHECK(tensors[5][1]["tensor"] == "torch.int64");
  CHECK(tensors[5][1]["values"] == std::vector<int64_t>{1, -2, int64_t{1} << 40});
  CHECK(tensors[6][1].is_null());
  const nlohmann::json& optimizer = top[5][1]["dict"];
  CHECK(optimizer[0][1]["dict"][0][0] == 0);  // an integer key
  CHECK(optimizer[0][1]["dict"][0][1]["dict"][0][1]["values"] == std::vector<double>{-0.5});
  CHECK(optimizer[1][1][0]["tuple"] == std::vector<double>{0.9, 0.95});
  CHECK(optimizer[1][1][1].empty());
}
