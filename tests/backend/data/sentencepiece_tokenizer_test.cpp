// The SentencePiece tokenizers against Debian's spm_encode (package sentencepiece) on messy
// text, exact ids: the checked-in BPE model tests/data/sentencepiece_bpe.model (Llama's
// trainer settings: byte fallback, identity normalization, split digits) and a unigram model
// with spm_train's defaults (NFKC, whitespace runs collapsed) trained here on the repository's
// docs. Megatron's added tokens and special-token split (SentencePieceTokenizer), Llama2's BOS,
// preprocess_data end to end (the .bin/.idx ids are spm_encode's with bos:eos), and the errors
// for a missing or corrupt model and the wrong flags. Without spm_encode/spm_train the
// comparisons are skipped with a message, or fail under CI (install-deps.sh --tests has them).
#include "backend/data/sentencepiece_tokenizer.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/indexed_dataset.hpp"
#include "backend/data/preprocess_data.hpp"
#include "backend/data/tokenizer.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"
#include "tests/reference_tools.hpp"

using namespace backend;
namespace fs = std::filesystem;

namespace {

const std::string kBpeModel = test_support::kTestData + "/sentencepiece_bpe.model";
using Kind = SentencePieceTokenizer::Kind;

// One text per line (spm_encode reads lines): whitespace runs, tabs, empty lines, emoji (ZWJ,
// skin tones, flags), CJK, Arabic, Devanagari, combining marks, full-width and ligature forms
// (which NFKC folds), digits, the model's own control pieces as text, and long runs.
const std::vector<std::string> kMessyTexts = {
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "   ",
    "  two leading spaces and two trailing  ",
    "tabs\tand\t\tmore\ttabs",
    "many     spaces      between    words",
    "Ünïcödé: 中文, العربية, हिन्दी, 👩‍💻 and é.",
    "e\u0301 (e + combining acute) vs \u00e9",
    "🦙🦙🦙 👍🏽 🇩🇪 🏳️‍🌈",
    "ｆｕｌｌ-ｗｉｄｔｈ ＡＢＣ １２３ and the ligature ﬁ",
    "digits 1234567890 and 3.14159, -42, 1e-3",
    "<s> literal </s> and <unk> and <0x41>",
    "--tokenizer-type Llama2Tokenizer --tokenizer-model tokenizer.model",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ǅ ǈ ß ẞ İ ı ﬀ ǰ ΐ",
    "\u00a0non-breaking\u00a0spaces\u2003and\u3000ideographic space",
    "`code` {braces} [brackets] (parens) #hash $dollar %percent ^caret &amp *star",
};

// True when the spm_* command works; otherwise skips (MESSAGE) or, under CI, fails.
bool spm_available(const std::string& command) {
  return test_support::reference_available(
      command + " --help", command,
      "Debian: apt-get install sentencepiece, or container/install-deps.sh --tests",
      [](const test_support::CommandResult& result) {
        return result.output.find("Usage") != std::string::npos || result.exit_status == 0;
      });
}

// spm_encode's ids for each line of `texts`; `extra` is its --extra_options (bos, eos, bos:eos).
std::vector<std::vector<int32_t>> spm_encode(const fs::path& work, const std::string& model,
                                             const std::vector<std::string>& texts,
                                             const std::string& extra = "") {
  const fs::path input = work / "spm_input.txt", output = work / "spm_output.txt";
  {
    std::ofstream out(input, std::ios::binary);
    for (const auto& text : texts) out << text << '\n';
  }
  std::string command = "spm_encode --model=" + model + " --output_format=id";
  if (!extra.empty()) command += " --extra_options=" + extra;
  const auto run = test_support::run_command(command + " < " + input.string() + " > " +
                                             output.string());
  REQUIRE_MESSAGE(run.exit_status == 0, run.output);
  std::vector<std::vector<int32_t>> ids;
  std::istringstream lines(test_support::read_file(output));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::vector<int32_t> line_ids;
    for (int32_t id; fields >> id;) line_ids.push_back(id);
    ids.push_back(std::move(line_ids));
  }
  REQUIRE(ids.size() == texts.size());
  return ids;
}

// A unigram model with spm_train's defaults (nmt_nfkc normalization, whitespace collapsed),
// trained on the repository's README and docs.
std::string train_unigram(const fs::path& work, const std::string& extra_flags = "") {
  const fs::path corpus = work / "corpus.txt";
  {
    std::ofstream out(corpus, std::ios::binary);
    out << test_support::read_file(std::string(TEST_SOURCE_DIR) + "/README.md");
    for (const char* doc : {"data.md", "backend.md", "launcher.md"}) {
      out << test_support::read_file(std::string(TEST_SOURCE_DIR) + "/docs/" + doc);
    }
  }
  const std::string prefix = (work / "unigram").string();
  const auto run = test_support::run_command(
      "spm_train --input=" + corpus.string() + " --model_prefix=" + prefix +
      " --model_type=unigram --vocab_size=500 --num_threads=2 " + extra_flags);
  REQUIRE_MESSAGE(run.exit_status == 0, run.output);
  return prefix + ".model";
}

void check_against_spm_encode(const fs::path& work, const std::string& model) {
  SentencePieceTokenizer gpt(Kind::gpt_sentencepiece, model);
  SentencePieceTokenizer llama(Kind::llama2, model);
  const auto expected = spm_encode(work, model, kMessyTexts);
  const auto expected_bos = spm_encode(work, model, kMessyTexts, "bos");
  for (size_t i = 0; i < kMessyTexts.size(); ++i) {
    INFO("text " << i << ": \"" << kMessyTexts[i] << "\"");
    CHECK(gpt.tokenize(kMessyTexts[i]) == expected[i]);
    CHECK(llama.tokenize(kMessyTexts[i]) == expected_bos[i]);
  }
}

}  // namespace

TEST_CASE("GPTSentencePieceTokenizer and Llama2Tokenizer give spm_encode's ids on messy text") {
  if (!spm_available("spm_encode") || !spm_available("spm_train")) return;
  test_support::TemporaryDirectory work;
  SUBCASE("the checked-in BPE model (Llama's settings)") { check_against_spm_encode(work.path, kBpeModel); }
  SUBCASE("a unigram model with NFKC normalization, trained here") {
    check_against_spm_encode(work.path, train_unigram(work.path));
  }
}

TEST_CASE("the three kinds: Megatron's vocabulary sizes, eod, bos and detokenize") {
  SentencePieceTokenizer gpt(Kind::gpt_sentencepiece, kBpeModel);
  CHECK(gpt.piece_count() == 500);
  CHECK(gpt.vocab_size() == 500);
  CHECK(gpt.eod() == 2);  // the model's eos_id (</s>)
  CHECK(gpt.bos() == 1);
  CHECK(gpt.pad() == -1);
  CHECK(gpt.special_tokens().empty());
  const std::string text = "Megatron-LM's pretrain_gpt, with Llama 2's tokenizer 🦙.";
  const auto ids = gpt.tokenize(text);
  CHECK(gpt.detokenize(ids) == text);  // byte fallback: lossless

  SentencePieceTokenizer llama(Kind::llama2, kBpeModel);
  CHECK(llama.vocab_size() == 500);
  CHECK(llama.eod() == 2);
  std::vector<int32_t> with_bos = {1};
  with_bos.insert(with_bos.end(), ids.begin(), ids.end());
  CHECK(llama.tokenize(text) == with_bos);
  CHECK(llama.tokenize("") == std::vector<int32_t>{1});  // Megatron: [bos] + encode("")
  CHECK(llama.detokenize(with_bos) == text);              // decode drops control pieces
  CHECK_THROWS_WITH_AS(llama.detokenize(std::vector<int32_t>{500}),
                       doctest::Contains("id 500 is outside the Llama2Tokenizer vocabulary [0, 500)"),
                       common::Error);
  CHECK_THROWS_AS(llama.detokenize(std::vector<int32_t>{-1}), common::Error);

  // Invalid UTF-8 is replaced as Python's decode("utf-8", "replace") would, then encoded.
  CHECK(gpt.tokenize("a\xff\xfe b\xe2\x82") == gpt.tokenize("a\uFFFD\uFFFD b\uFFFD"));

  // Clones share the model and give the same ids.
  const auto clone = llama.clone();
  CHECK(clone->tokenize(text) == with_bos);
  CHECK(clone->vocab_size() == 500);
}

TEST_CASE("SentencePieceTokenizer adds Megatron's special tokens and cuts text at them") {
  // The model has <unk> <s> </s> and no pad: <CLS> <SEP> <EOD> <MASK> <PAD> are added after its
  // 500 pieces, <s> and </s> are its own bos and eos.
  SentencePieceTokenizer gpt(Kind::gpt_sentencepiece, kBpeModel);
  SentencePieceTokenizer tokenizer(Kind::sentencepiece, kBpeModel, 11);
  CHECK(tokenizer.piece_count() == 500);
  CHECK(tokenizer.vocab_size() == 500 + 5 + 11);
  CHECK(tokenizer.eod() == 502);
  CHECK(tokenizer.bos() == 1);
  CHECK(tokenizer.eos() == 2);
  CHECK(tokenizer.pad() == 504);
  const std::vector<std::pair<std::string, int32_t>> first = {
      {"<CLS>", 500}, {"<SEP>", 501}, {"<EOD>", 502}, {"<MASK>", 503},
      {"<PAD>", 504}, {"<s>", 1},     {"</s>", 2},    {"<extra_id_0>", 505}};
  REQUIRE(tokenizer.special_tokens().size() == 7 + 11);
  for (size_t i = 0; i < first.size(); ++i) CHECK(tokenizer.special_tokens()[i] == first[i]);
  CHECK(tokenizer.special_tokens().back() == std::pair<std::string, int32_t>{"<extra_id_10>", 515});

  const auto concat = [](std::vector<std::vector<int32_t>> parts) {
    std::vector<int32_t> all;
    for (const auto& part : parts) all.insert(all.end(), part.begin(), part.end());
    return all;
  };
  // Each part between special tokens is encoded on its own (with its own dummy prefix).
  CHECK(tokenizer.tokenize("one<EOD>two <s>three</s>") ==
        concat({gpt.tokenize("one"), {502}, gpt.tokenize("two "), {1}, gpt.tokenize("three"), {2}}));
  CHECK(tokenizer.tokenize("<CLS><SEP>") == std::vector<int32_t>{500, 501});
  CHECK(tokenizer.tokenize("no special tokens") == gpt.tokenize("no special tokens"));
  CHECK(tokenizer.tokenize("").empty());
  CHECK(tokenizer.tokenize("<extra_id_10>") == std::vector<int32_t>{515});
  CHECK(tokenizer.tokenize("<extra_id_1>0 <extra_id_1") ==
        concat({{506}, gpt.tokenize("0 <extra_id_1")}));
  // A token found again after the cut has passed an earlier match of it.
  CHECK(tokenizer.tokenize("a<MASK>b<EOD>c<MASK>d") ==
        concat({gpt.tokenize("a"), {503}, gpt.tokenize("b"), {502}, gpt.tokenize("c"), {503},
                gpt.tokenize("d")}));
  // Megatron's detokenize writes a special token between spaces.
  CHECK(tokenizer.detokenize(tokenizer.tokenize("one<EOD>two")) == "one <EOD> two");
  CHECK(tokenizer.detokenize(std::vector<int32_t>{515}) == " <extra_id_10> ");
}

TEST_CASE("a model that has Megatron's tokens already keeps their ids, and one without bos and eos") {
  if (!spm_available("spm_train")) return;
  test_support::TemporaryDirectory work;
  const std::string with_specials = train_unigram(
      work.path, "'--user_defined_symbols=<EOD>,<MASK>' --pad_id=3 --unk_id=0 --bos_id=1 --eos_id=2");
  SentencePieceTokenizer tokenizer(Kind::sentencepiece, with_specials);
  // Pieces 0..3 are <unk> <s> </s> <pad>, then the user-defined <EOD>=4 and <MASK>=5.
  CHECK(tokenizer.piece_count() == 500);
  CHECK(tokenizer.vocab_size() == 502);  // only <CLS> and <SEP> are added
  CHECK(tokenizer.eod() == 4);
  CHECK(tokenizer.pad() == 3);
  CHECK(tokenizer.tokenize("<SEP>") == std::vector<int32_t>{501});

  fs::create_directory(work.path / "plain");
  const std::string no_bos_eos =
      train_unigram(work.path / "plain", "--bos_id=-1 --eos_id=-1 --unk_id=0");
  CHECK_THROWS_WITH_AS(SentencePieceTokenizer(Kind::llama2, no_bos_eos),
                       doctest::Contains("the model has no BOS piece (bos_id -1), and "
                                         "Llama2Tokenizer begins every text with it"),
                       common::Error);
  CHECK_THROWS_WITH_AS(SentencePieceTokenizer(Kind::gpt_sentencepiece, no_bos_eos),
                       doctest::Contains("the model has no EOS piece (eos_id -1)"), common::Error);
  // SentencePieceTokenizer adds <BOS> and <EOS> after <PAD>.
  SentencePieceTokenizer added(Kind::sentencepiece, no_bos_eos);
  CHECK(added.vocab_size() == 507);
  CHECK(added.bos() == 505);
  CHECK(added.eos() == 506);
}

TEST_CASE("a missing or corrupt model file is an error naming --tokenizer-model and the file") {
  test_support::TemporaryDirectory work;
  const auto refused = [](const std::string& file, const std::string& why) {
    const std::string message = "--tokenizer-model " + file + ": " + why;
    for (const Kind kind : {Kind::sentencepiece, Kind::gpt_sentencepiece, Kind::llama2}) {
      CHECK_THROWS_WITH_AS(SentencePieceTokenizer(kind, file), doctest::Contains(message.c_str()),
                           common::Error);
    }
  };
  refused((work.path / "absent.model").string(), "No such file or directory");
  refused(work.path.string(), "it is a directory");
  refused("/dev/zero", "it is a character device");
  const std::string not_a_model = "not a SentencePiece model";
  refused(test_support::kTestData + "/gpt2-merges.txt", not_a_model);
  refused(test_support::kTestData + "/preprocess_sample.jsonl", not_a_model);
  const std::string model = test_support::read_file(kBpeModel);
  const fs::path truncated = work.path / "truncated.model", empty = work.path / "empty.model";
  std::ofstream(truncated, std::ios::binary) << model.substr(0, model.size() / 2);
  std::ofstream{empty};
  refused(truncated.string(), not_a_model);
  refused(empty.string(), not_a_model);
}

TEST_CASE("build_tokenizer: the SentencePiece types need --tokenizer-model, others refuse it") {
  CHECK_THROWS_WITH_AS(build_tokenizer({.tokenizer_type = "Llama2Tokenizer", .vocab_file = "",
                                        .merge_file = "", .vocab_size = 0, .tokenizer_model = "",
                                        .vocab_extra_ids = 0}),
                       doctest::Contains("--tokenizer-type Llama2Tokenizer needs --tokenizer-model"),
                       common::Error);
  CHECK_THROWS_WITH_AS(build_tokenizer({.tokenizer_type = "GPT2BPETokenizer", .vocab_file = "v",
                                        .merge_file = "m", .vocab_size = 0,
                                        .tokenizer_model = kBpeModel, .vocab_extra_ids = 0}),
                       doctest::Contains("is read only by the SentencePiece and HuggingFace "
                                         "tokenizers (valid --tokenizer-type: "
                                         "SentencePieceTokenizer, GPTSentencePieceTokenizer, "
                                         "Llama2Tokenizer, HuggingFaceTokenizer), not by "
                                         "--tokenizer-type GPT2BPETokenizer"),
                       common::Error);
  CHECK_THROWS_WITH_AS(build_tokenizer({.tokenizer_type = "Llama2Tokenizer", .vocab_file = "",
                                        .merge_file = "", .vocab_size = 0,
                                        .tokenizer_model = kBpeModel, .vocab_extra_ids = 3}),
                       doctest::Contains("--vocab-extra-ids 3 is not supported with "
                                         "--tokenizer-type Llama2Tokenizer"),
                       common::Error);
  const auto tokenizer = build_tokenizer({.tokenizer_type = "SentencePieceTokenizer",
                                          .vocab_file = "", .merge_file = "", .vocab_size = 0,
                                          .tokenizer_model = kBpeModel, .vocab_extra_ids = 2});
  CHECK(tokenizer->vocab_size() == 507);
  CHECK(tokenizer->eod() == 502);
}

TEST_CASE("preprocess_data with Llama2Tokenizer: the .bin/.idx ids are spm_encode's plus eod") {
  if (!spm_available("spm_encode")) return;
  test_support::TemporaryDirectory work;
  const fs::path jsonl = work.path / "messy.jsonl";
  {
    std::ofstream out(jsonl, std::ios::binary);
    for (const auto& text : kMessyTexts) out << nlohmann::json{{"text", text}}.dump() << '\n';
  }
  PreprocessOptions options;
  options.inputs = {jsonl.string()};
  options.output_prefix = (work.path / "messy").string();
  options.tokenizer = {.tokenizer_type = "Llama2Tokenizer", .vocab_file = "", .merge_file = "",
                       .vocab_size = 0, .tokenizer_model = kBpeModel, .vocab_extra_ids = 0};
  options.append_eod = true;
  options.workers = 2;
  options.batch_bytes = 256;  // several batches, so both workers' clones tokenize
  std::ostringstream out, err;
  const PreprocessSummary summary = preprocess_data(options, out, err);
  REQUIRE(summary.bad_lines == 0);
  // Megatron's Llama2Tokenizer.tokenize gives [bos] + ids, --append-eod adds the eos: exactly
  // spm_encode --extra_options=bos:eos, the empty text included ([bos, eos]).
  const auto expected = spm_encode(work.path, kBpeModel, kMessyTexts, "bos:eos");
  IndexedDataset dataset((work.path / "messy_text_document").string());
  CHECK(dataset.dtype() == DType::uint16);
  REQUIRE(dataset.document_count() == static_cast<int64_t>(kMessyTexts.size()));
  REQUIRE(dataset.sequence_count() == static_cast<int64_t>(kMessyTexts.size()));
  for (int64_t i = 0; i < dataset.sequence_count(); ++i) {
    INFO("document " << i << ": \"" << kMessyTexts[static_cast<size_t>(i)] << "\"");
    std::vector<int32_t> ids(static_cast<size_t>(dataset.sequence_length(i)));
    dataset.read_tokens(i, 0, ids);
    CHECK(ids == expected[static_cast<size_t>(i)]);
  }
}
