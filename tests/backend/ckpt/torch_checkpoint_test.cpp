// Reading what torch.save writes: write_torch_checkpoints.py makes files with PyTorch itself
// (a Megatron-style dict of tensors of every dtype, views sharing a storage, args, RNG states;
// under pickle protocols 2 and 4) and says what they hold; TorchCheckpointFile must find the
// same tensors, values and args, and must refuse the file whose pickle would call os.system,
// naming it, without running anything. Damaged archives are refused naming the file.
//
// It needs torch in Debian's /usr/bin/python3 (python3-torch, container/install-deps.sh
// --tests). Without it the test is skipped with a message, except under CI, where that fails.
#include "backend/ckpt/torch_checkpoint.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/common/error.hpp"
#include "tests/reference_tools.hpp"
#include "tests/temporary_directory.hpp"
#include "tests/test_files.hpp"

namespace {

namespace fs = std::filesystem;

// Runs write_torch_checkpoints.py into `directory`; false (skipped) without torch, outside CI.
bool write_torch_checkpoints(const fs::path& directory) {
  if (!test_support::python_imports("torch, numpy", "python3-torch python3-numpy")) return false;
  const auto written = test_support::run_command(
      std::string(test_support::kPython) + " " + test_support::kTestSource +
      "/tests/backend/ckpt/write_torch_checkpoints.py " + directory.string());
  REQUIRE_MESSAGE(written.exit_status == 0, written.output);
  return true;
}

void check_file(const backend::TorchCheckpointFile& file, const nlohmann::json& expected) {
  const backend::PickleValue& root = file.root();
  REQUIRE(root.kind == backend::PickleKind::dict);
  const backend::PickleValue* model = root.find("model");
  REQUIRE(model != nullptr);
  REQUIRE(model->kind == backend::PickleKind::dict);
  CHECK(model->entries.size() == expected["tensors"].size());
  for (const auto& item : expected["tensors"].items()) {
    const std::string name = item.key();
    const nlohmann::json& want = item.value();
    CAPTURE(name);
    const backend::PickleValue* value = model->find(name);
    REQUIRE(value != nullptr);
    const backend::TorchTensor tensor = file.tensor(*value, name);
    CHECK(backend::torch_dtype_name(tensor.dtype) == want["dtype"].get<std::string>());
    CHECK(tensor.shape == want["shape"].get<std::vector<int64_t>>());
    CHECK(file.tensor_values(tensor) == want["values"].get<std::vector<double>>());
  }
  // The args: an argparse.Namespace whose state is its attributes.
  const backend::PickleValue* args = root.find("args");
  REQUIRE(args != nullptr);
  CHECK(args->name == "argparse.Namespace");
  REQUIRE(args->state != nullptr);
  CHECK(args->state->find("num_layers")->integer == 2);
  CHECK(args->state->find("lr")->real == 1e-3);
  CHECK(args->state->find("tokenizer_type")->text == "GPT2BPETokenizer");
  CHECK(args->state->find("bf16")->boolean);
  CHECK(args->state->find("seed")->kind == backend::PickleKind::none);
  CHECK(args->state->find("data_path")->items.size() == 2);
  CHECK(args->state->find("params_dtype")->name == "bfloat16");
  CHECK(root.find("iteration")->integer == 7);
  CHECK(root.find("checkpoint_version")->real == 3.0);
  // The RNG states: numpy's ('MT19937', uint32 array as numpy pickles it, ...), torch's a
  // uint8 tensor.
  const backend::PickleValue& rng = *root.find("rng_state")->items.at(0);
  const backend::PickleValue* numpy_state = rng.find("np_rng_state");
  REQUIRE(numpy_state != nullptr);
  CHECK(numpy_state->items.at(0)->text == "MT19937");
  const backend::PickleValue& words = *numpy_state->items.at(1);
  CHECK(words.name.ends_with("multiarray._reconstruct"));
  REQUIRE(words.state != nullptr);  // (version, shape, dtype, fortran, raw bytes)
  CHECK(words.state->items.at(4)->text.size() == 4 * expected["np_rng_words"].get<size_t>());
  const auto torch_state = file.tensor(*rng.find("torch_rng_state"), "torch_rng_state");
  CHECK(torch_state.dtype == backend::TorchDtype::uint8);
  CHECK(torch_state.numel() == expected["torch_rng_state_bytes"].get<int64_t>());
  const backend::PickleValue& plain = *root.find("plain");
  CHECK(plain.find("big")->integer == int64_t{1} << 40);
  CHECK(plain.find("negative")->integer == -5);
  CHECK(plain.find("bytes")->text == std::string("\x00\xff", 2));
  CHECK(plain.find("text")->text == "pi ≈ 3.14");
  CHECK(plain.find("ratio")->real == 0.1);
  CHECK(plain.find("nested")->items.at(2)->find("k")->kind == backend::PickleKind::none);
}

}  // namespace

TEST_CASE(
    "torch.save's files: tensors of every dtype, views, args and RNG states, read as "
    "PyTorch wrote them") {
  test_support::TemporaryDirectory directory;
  if (!write_torch_checkpoints(directory.path)) return;
  std::ifstream in(directory.path / "expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  for (const char* name : {"plain.pt", "protocol4.pt"}) {
    CAPTURE(name);
    check_file(backend::TorchCheckpointFile(directory.path / name), expected);
  }
  // A pickle that would run a command is refused, naming the global; nothing runs.
  CHECK_THROWS_WITH_AS(backend::TorchCheckpointFile(directory.path / "evil.pt"),
                       doctest::Contains("evil/data.pkl: the pickle names posix.system, which a "
                                         "checkpoint has no use for and is not loaded"),
                       common::Error);
}

TEST_CASE("torch.save's files: a damaged archive is refused naming the file") {
  test_support::TemporaryDirectory directory;
  if (!write_torch_checkpoints(directory.path)) return;
  const std::string bytes = test_support::read_file(directory.path / "plain.pt");
  auto refused = [&](const std::string& damaged, const char* message) {
    CAPTURE(message);
    const fs::path path = directory.path / "damaged.pt";
    test_support::write_file(path, damaged);
    CHECK_THROWS_WITH_AS(backend::TorchCheckpointFile{path}, doctest::Contains(message),
                         common::Error);
  };
  refused(bytes.substr(0, bytes.size() / 2), "no zip end of central directory record");
  refused("", "0 bytes is too short for a zip archive");
  refused(std::string(100, 'x'), "not a torch.save archive of PyTorch 1.6 or later");
  // The central directory's offset moved past the end.
  std::string moved = bytes;
  const size_t end = moved.rfind(std::string("PK\x05\x06", 4));
  REQUIRE(end != std::string::npos);
  moved[end + 16] = '\xff';
  moved[end + 17] = '\xff';
  moved[end + 18] = '\xff';
  moved[end + 19] = '\x7f';
  refused(moved, "lies past its end");
  // Entries torch.save never writes: a name out of the archive's directory, a symbolic link.
  CHECK_THROWS_WITH_AS(backend::TorchCheckpointFile(directory.path / "climbing.pt"),
                       doctest::Contains("entry name 'plain/../../outside' leaves the archive's"),
                       common::Error);
  CHECK_THROWS_WITH_AS(backend::TorchCheckpointFile(directory.path / "symlink.pt"),
                       doctest::Contains("entry plain/link is a symbolic link"), common::Error);
  CHECK_THROWS_WITH_AS(backend::TorchCheckpointFile(directory.path / "absent.pt"),
                       doctest::Contains("cannot read checkpoint"), common::Error);
}
