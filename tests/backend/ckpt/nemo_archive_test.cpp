// NeMo's .nemo archives: write_nemo_archives.py saves, with Python's tarfile and PyTorch, a GPT
// and a Llama-like model as NeMo 1.x (NeMo-Megatron-Launcher 23.x) saves them, with their
// tokenizers packed in. Imported here, every tensor is the one the script drew (SwiGLU's
// dense_h_to_4h and dense_h_to_4h_2 joined into linear_fc1), the model's flags come from
// model_config.yaml and the tokenizer files are extracted. Exported again, the archive is read
// as NeMo's restore reads it (read_nemo_archive.py: tarfile, OmegaConf.load, torch.load with the
// weights_only globals): the same tensors under the same names in the same order, a config that
// OmegaConf merges into NeMo's own model section with no key NeMo does not have; imported back,
// the same model. What is not built (Megatron core's mcore_gpt, files per rank, a config this
// backend cannot compute) and hostile archives (a member climbing out with "..", a symbolic
// link, something not a tar) are refused by name.
//
// Needs torch and omegaconf in Debian's /usr/bin/python3 (container/install-deps.sh --tests);
// skipped without them except under CI.
#include "backend/ckpt/nemo_archive.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "backend/ckpt/tar_archive.hpp"
#include "backend/common/error.hpp"
#include "tests/backend/ckpt/expected_weights.hpp"
#include "tests/backend/ckpt/python_fixtures.hpp"
#include "tests/reference_tools.hpp"
#include "tests/temporary_directory.hpp"
#include "tests/test_files.hpp"

namespace {

namespace fs = std::filesystem;

const fs::path* nemo_archives() {
  return test_support::python_fixtures("write_nemo_archives.py", "torch, yaml, omegaconf",
                                       "python3-torch python3-yaml python3-omegaconf");
}

// read_nemo_archive.py's JSON of `archive`, merged against the launcher's 23.08 Llama 2 config.
nlohmann::json read_with_nemo_tools(const fs::path& archive) {
  const auto read = test_support::run_command(
      std::string(test_support::kPython) + " " + test_support::kTestSource +
      "/tests/backend/ckpt/read_nemo_archive.py " + archive.string() + " " +
      test_support::kTestSource + "/tests/data/nemo_23.08.02/conf/training/llama/llama2_7b.yaml");
  REQUIRE_MESSAGE(read.exit_status == 0, read.output);
  return nlohmann::json::parse(read.output);
}

}  // namespace

TEST_CASE("nemo archive: NeMo 23.x GPT and Llama-like archives import with weights and tokenizer") {
  const fs::path* root = nemo_archives();
  if (root == nullptr) return;
  test_support::TemporaryDirectory artifacts;
  const backend::NemoImport gpt = backend::import_nemo(*root / "gpt.nemo", artifacts.path / "gpt");
  test_support::check_expected_weights(gpt.model, *root / "expected_gpt.json");
  CHECK(gpt.record.model.num_layers == 2);
  CHECK(gpt.record.model.seq_length == 8);
  CHECK(gpt.record.model.ffn_hidden_size == 64);
  CHECK_FALSE(gpt.record.model.untie_embeddings_and_output_weights);
  CHECK(gpt.record.tokenizer.tokenizer_type == "GPT2BPETokenizer");
  const fs::path vocab = fs::absolute(artifacts.path / "gpt" / "vocab.json");
  const fs::path merges = fs::absolute(artifacts.path / "gpt" / "merges.txt");
  CHECK(gpt.tokenizer_flags ==
        std::vector<std::string>{"--vocab-file", vocab.string(), "--merge-file", merges.string()});
  CHECK(
      test_support::read_file(vocab) ==
      test_support::read_file(fs::path(test_support::kTestSource) / "tests/data/gpt2-vocab.json"));

  // gzip-compressed, SentencePiece, RMSNorm, RoPE, SwiGLU's two halves, no biases, untied.
  const backend::NemoImport llama =
      backend::import_nemo(*root / "llama.nemo", artifacts.path / "llama");
  test_support::check_expected_weights(llama.model, *root / "expected_llama.json");
  const backend::ModelArguments& model = llama.record.model;
  CHECK(model.swiglu);
  CHECK(model.normalization == backend::Normalization::rms_norm);
  CHECK(model.position_embedding_type == backend::PositionEmbeddingType::rope);
  CHECK_FALSE(model.add_bias_linear);
  CHECK(model.untie_embeddings_and_output_weights);
  CHECK(llama.record.tokenizer.tokenizer_type == "GPTSentencePieceTokenizer");
  CHECK(llama.record.tokenizer.tokenizer_model ==
        fs::absolute(artifacts.path / "llama" / "tokenizer.model").string());
  CHECK(llama.tokenizer_flags.empty());
}

TEST_CASE("nemo archive: an export reads as NeMo reads it, and imports back unchanged") {
  const fs::path* root = nemo_archives();
  if (root == nullptr) return;
  for (const char* name : {"gpt", "llama"}) {
    CAPTURE(name);
    test_support::TemporaryDirectory directory;
    const fs::path original = *root / (std::string(name) + ".nemo");
    const backend::NemoImport imported = backend::import_nemo(original, directory.path / "tok");
    const fs::path exported = directory.path / "out" / "megatron_gpt.nemo";
    fs::create_directories(exported.parent_path());
    backend::export_nemo(exported, imported.model, imported.record);

    const nlohmann::json theirs = read_with_nemo_tools(exported);
    const nlohmann::json reference = read_with_nemo_tools(original);
    const std::set<std::string> members(theirs["members"].begin(), theirs["members"].end());
    CHECK(members.count("./model_config.yaml") == 1);
    CHECK(members.count("./model_weights.ckpt") == 1);
    // The state dict: NeMo's names in its order, the values the archive came with (RoPE's
    // buffer within float rounding: it is recomputed).
    const nlohmann::json& weights = theirs["weights"];
    const nlohmann::json& want = reference["weights"];
    REQUIRE(weights.size() == want.size());
    for (size_t i = 0; i < weights.size(); ++i) {
      CAPTURE(want[i][0].get<std::string>());
      CHECK(weights[i][0] == want[i][0]);
      CHECK(weights[i][1]["shape"] == want[i][1]["shape"]);
      const auto got = weights[i][1]["values"].get<std::vector<float>>();
      const auto expected = want[i][1]["values"].get<std::vector<float>>();
      if (want[i][0].get<std::string>().ends_with("inv_freq")) {
        REQUIRE(got.size() == expected.size());
        for (size_t j = 0; j < got.size(); ++j) CHECK(got[j] == doctest::Approx(expected[j]));
      } else {
        CHECK(got == expected);
      }
    }
    // The config: NeMo's keys (merged into its own model section by OmegaConf; those beyond it
    // are the ones NeMo's save adds), the model's values, the tokenizer's file packed in.
    CHECK(theirs["unknown_keys"] ==
          nlohmann::json::array({"precision", "target", "nemo_version"}));
    const nlohmann::json& config = theirs["config"];
    CHECK(config["num_layers"] == 2);
    CHECK(config["hidden_size"] == 16);
    CHECK(config["encoder_seq_length"] == 8);
    CHECK(config["mcore_gpt"] == false);
    CHECK(config["target"] ==
          "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel");
    if (std::string(name) == "llama") {
      CHECK(config["activation"] == "swiglu");
      CHECK(config["normalization"] == "rmsnorm");
      CHECK(config["position_embedding_type"] == "rope");
      CHECK(config["share_embeddings_and_output_weights"] == false);
      CHECK(config["tokenizer"]["library"] == "sentencepiece");
      const std::string model = config["tokenizer"]["model"];
      REQUIRE(model.starts_with("nemo:"));
      CHECK(members.count("./" + model.substr(5)) == 1);
    } else {
      CHECK(config["tokenizer"]["type"] == "GPT2BPETokenizer");
      CHECK(config["activation"] == "gelu");
    }
    // Imported back: the same model.
    const backend::NemoImport again = backend::import_nemo(exported, directory.path / "again");
    test_support::check_expected_weights(again.model, *root / ("expected_" + std::string(name) + ".json"));
  }
}

TEST_CASE("nemo archive: what is not built, and hostile archives, are refused by name") {
  const fs::path* root = nemo_archives();
  if (root == nullptr) return;
  test_support::TemporaryDirectory directory;
  auto refusal = [&](const fs::path& archive) {
    return test_support::refusal_of(
        [&] { backend::import_nemo(archive, directory.path / "artifacts"); });
  };
  CHECK(refusal(*root / "mcore.nemo").find("mcore_gpt: true") != std::string::npos);
  const std::string ranks = refusal(*root / "tp2.nemo");
  CHECK(ranks.find("mp_rank_00/model_weights.ckpt") != std::string::npos);
  CHECK(ranks.find("not read yet") != std::string::npos);
  CHECK(refusal(*root / "dotdot.nemo").find("member '../escaped' climbs out of the archive") !=
        std::string::npos);
  CHECK(refusal(*root / "symlink.nemo").find("is a symbolic link") != std::string::npos);
  CHECK_FALSE(fs::exists(directory.path / "artifacts"));
  CHECK(refusal(*root / "expected_llama.json").find("bad checksum") != std::string::npos);
  // Cut short inside the weights.
  const std::string whole = test_support::read_file(*root / "gpt.nemo");
  const fs::path truncated = directory.path / "truncated.nemo";
  std::ofstream(truncated, std::ios::binary) << whole.substr(0, whole.size() / 2);
  CHECK(refusal(truncated).find("past the archive's end") != std::string::npos);
  // A config this backend cannot compute, in an archive of this backend's own tar writer.
  const std::string config =
      "num_layers: 2\nhidden_size: 16\nnum_attention_heads: 4\nencoder_seq_length: 8\n"
      "activation: geglu\ntokenizer:\n  library: megatron\n  type: GPT2BPETokenizer\n";
  const std::vector<backend::TarMember> members = {
      {"model_config.yaml", std::as_bytes(std::span(config.data(), config.size()))}};
  const fs::path geglu = directory.path / "geglu.nemo";
  backend::write_tar_archive(geglu, members);
  CHECK(refusal(geglu).find("model_config.yaml's activation 'geglu' is not one this backend "
                            "builds (valid: gelu, swiglu, fast-swiglu)") != std::string::npos);
}
