// The SentencePiece tokenizers: loading and checking the model, Megatron's special tokens, and
// the special-token split of SentencePieceTokenizer (what each kind does, and the reference, in
// sentencepiece_tokenizer.hpp).
#include "backend/data/sentencepiece_tokenizer.hpp"

#include <sentencepiece_processor.h>

#include <exception>
#include <limits>
#include <unordered_map>

#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"
#include "backend/data/unicode_text.hpp"

namespace backend {

namespace {

// The most --vocab-extra-ids taken: T5 uses 100; a million sentinels is already far beyond any
// use, and each costs a string and a search per document, so a typo such as 1000000000 is
// refused rather than left to run the machine out of memory.
constexpr int64_t kMaxVocabExtraIds = int64_t(1) << 20;

const char* kind_name(SentencePieceTokenizer::Kind kind) {
  switch (kind) {
    case SentencePieceTokenizer::Kind::sentencepiece: return "SentencePieceTokenizer";
    case SentencePieceTokenizer::Kind::gpt_sentencepiece: return "GPTSentencePieceTokenizer";
    case SentencePieceTokenizer::Kind::llama2: return "Llama2Tokenizer";
  }
  return "?";
}

}  // namespace

struct SentencePieceTokenizer::Model {
  sentencepiece::SentencePieceProcessor processor;
  // SentencePieceTokenizer only: the special tokens in the order Megatron adds them (the order
  // that breaks a tie between two tokens found at the same place), and id → text for detokenize.
  std::vector<std::pair<std::string, int32_t>> special_tokens;
  std::unordered_map<int32_t, std::string> special_text;
};

std::optional<SentencePieceTokenizer::Kind> sentencepiece_kind(std::string_view tokenizer_type) {
  if (tokenizer_type == "SentencePieceTokenizer") return SentencePieceTokenizer::Kind::sentencepiece;
  if (tokenizer_type == "GPTSentencePieceTokenizer") {
    return SentencePieceTokenizer::Kind::gpt_sentencepiece;
  }
  if (tokenizer_type == "Llama2Tokenizer") return SentencePieceTokenizer::Kind::llama2;
  return std::nullopt;
}

SentencePieceTokenizer::SentencePieceTokenizer(Kind kind, const std::filesystem::path& model_file,
                                               int64_t vocab_extra_ids)
    : kind_(kind) {
  const std::string file = model_file.string();
  const char* type = kind_name(kind);
  // Read through the one bounded reader, so a FIFO, a device or a huge file is refused by name
  // before the library sees it ("cannot read --tokenizer-model <file>: ...").
  const std::string serialized = common::read_small_file(model_file, "--tokenizer-model");
  if (vocab_extra_ids < 0 || vocab_extra_ids > kMaxVocabExtraIds) {
    common::fail("--vocab-extra-ids {} is outside [0, {}]", vocab_extra_ids, kMaxVocabExtraIds);
  }
  if (vocab_extra_ids != 0 && kind != Kind::sentencepiece) {
    common::fail("--vocab-extra-ids {}: only --tokenizer-type SentencePieceTokenizer adds extra "
                 "ids; {} takes none (Megatron's passes 0)", vocab_extra_ids, type);
  }

  auto model = std::make_shared<Model>();
  // The library reports a bad file through its Status; anything it throws (bad_alloc on a
  // huge file) is turned into the same error, so no user file ends in a crash.
  std::string problem;
  try {
    const auto status = model->processor.LoadFromSerializedProto(serialized);
    if (!status.ok()) problem = status.ToString();
    // The library's parse failure names its source line; say what it means instead.
    if (problem.find("ParseFromArray") != std::string::npos) {
      problem = "it does not parse as a serialized SentencePiece ModelProto";
    }
  } catch (const std::exception& exception) {
    problem = exception.what();
  }
  const int64_t pieces = problem.empty() ? model->processor.GetPieceSize() : 0;
  if (problem.empty() && pieces <= 0) problem = "the model has no pieces";
  if (!problem.empty()) {
    common::fail("--tokenizer-model {}: not a SentencePiece model ({}); pass the model file that "
                 "spm_train writes (<prefix>.model, Llama's tokenizer.model)", file, problem);
  }
  piece_count_ = pieces;
  const auto& processor = model->processor;
  const auto model_id = [&](int id) { return id >= 0 && id < pieces ? id : -1; };

  if (kind != Kind::sentencepiece) {
    // Megatron's _GPTSentencePieceTokenizer and _Llama2Tokenizer: the model's ids and size.
    vocab_size_ = pieces;
    bos_ = model_id(processor.bos_id());
    eos_ = model_id(processor.eos_id());
    pad_ = model_id(processor.pad_id());
    if (kind == Kind::llama2 && bos_ < 0) {
      common::fail("--tokenizer-model {}: the model has no BOS piece (bos_id {}), and "
                   "Llama2Tokenizer begins every text with it; train it with a bos_id, or use "
                   "--tokenizer-type GPTSentencePieceTokenizer", file, processor.bos_id());
    }
    if (eos_ < 0) {
      common::fail("--tokenizer-model {}: the model has no EOS piece (eos_id {}), which is {}'s "
                   "end-of-document id; train it with an eos_id, or use --tokenizer-type "
                   "SentencePieceTokenizer (which adds <EOD>)", file, processor.eos_id(), type);
    }
    eod_ = eos_;
  } else {
    // Megatron's _SentencePieceTokenizer._initalize: the model's vocabulary as a piece → id
    // dict, then each special token appended with the next id unless the dict has it already.
    std::unordered_map<std::string, int32_t> vocabulary;
    vocabulary.reserve(static_cast<size_t>(pieces) + 7 + static_cast<size_t>(vocab_extra_ids));
    for (int id = 0; id < pieces; ++id) vocabulary[processor.IdToPiece(id)] = id;
    const auto add_special = [&](const std::string& token) {
      // An empty token would match everywhere (Megatron would loop forever on it).
      if (token.empty()) common::fail("--tokenizer-model {}: the model has an empty piece", file);
      const auto size = static_cast<int32_t>(vocabulary.size());
      const int32_t id = vocabulary.try_emplace(token, size).first->second;
      if (model->special_text.try_emplace(id, token).second) {
        model->special_tokens.emplace_back(token, id);
      }
      return id;
    };
    // Megatron asks the model for the piece of its pad/bos/eos id; an id the model lacks (-1)
    // makes sentencepiece raise IndexError, and Megatron then adds <PAD>/<BOS>/<EOS>.
    const auto piece_or = [&](int id, const char* fallback) {
      return model_id(id) >= 0 ? processor.IdToPiece(id) : std::string(fallback);
    };
    if (pieces + 7 + vocab_extra_ids > std::numeric_limits<int32_t>::max()) {
      common::fail("--tokenizer-model {}: {} pieces and --vocab-extra-ids {} exceed 32-bit ids",
                   file, pieces, vocab_extra_ids);
    }
    add_special("<CLS>");
    add_special("<SEP>");
    eod_ = add_special("<EOD>");
    add_special("<MASK>");
    pad_ = add_special(piece_or(processor.pad_id(), "<PAD>"));
    bos_ = add_special(piece_or(processor.bos_id(), "<BOS>"));
    eos_ = add_special(piece_or(processor.eos_id(), "<EOS>"));
    for (int64_t i = 0; i < vocab_extra_ids; ++i) add_special("<extra_id_" + std::to_string(i) + ">");
    vocab_size_ = static_cast<int64_t>(vocabulary.size());
  }
  model_ = std::move(model);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

const std::vector<std::pair<std::string, int32_t>>& SentencePieceTokenizer::special_tokens() const {
  return model_->special_tokens;
}

void SentencePieceTokenizer::encode_part(std::string_view text, std::vector<int32_t>& ids) {
  if (text.empty()) return;
  part_ids_.clear();
  const auto status = model_->processor.Encode(text, &part_ids_);
  if (!status.ok()) common::fail("SentencePiece could not encode a text: {}", status.ToString());
  ids.insert(ids.end(), part_ids_.begin(), part_ids_.end());
}

void SentencePieceTokenizer::tokenize(std::string_view text, std::vector<int32_t>& ids) {
  std::string_view valid = text;
  if (!is_valid_utf8(text)) {
    replace_invalid_utf8(text, repaired_text_);
    valid = repaired_text_;
  }
  if (kind_ == Kind::llama2) ids.push_back(bos_);
  const auto& specials = model_->special_tokens;
  if (specials.empty()) {
    encode_part(valid, ids);
    return;
  }
  // Megatron searches every special token from the cut on each round; a token's next match is
  // kept instead and searched again only once the cut has passed it, which finds the same
  // matches in linear time. (Byte offsets and Python's code point offsets order the matches
  // alike: UTF-8 is self-synchronising, so a token's bytes match only at character starts.)
  constexpr size_t kNone = std::string_view::npos;
  next_match_.assign(specials.size(), 0);
  for (size_t k = 0; k < specials.size(); ++k) next_match_[k] = valid.find(specials[k].first);
  size_t cut = 0;
  for (;;) {
    size_t best = kNone, best_token = 0;
    for (size_t k = 0; k < specials.size(); ++k) {
      if (next_match_[k] != kNone && next_match_[k] < cut) {
        next_match_[k] = valid.find(specials[k].first, cut);
      }
      if (next_match_[k] < best) {  // strictly: the first-added token wins a tie
        best = next_match_[k];
        best_token = k;
      }
    }
    if (best == kNone) break;
    encode_part(valid.substr(cut, best - cut), ids);
    ids.push_back(specials[best_token].second);
    cut = best + specials[best_token].first.size();
  }
  encode_part(valid.substr(cut), ids);
}

std::string SentencePieceTokenizer::detokenize(std::span<const int32_t> ids) const {
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) {
      common::fail("detokenize: id {} is outside the {} vocabulary [0, {})", id, kind_name(kind_),
                   vocab_size_);
    }
  }
  const auto decode = [&](std::span<const int32_t> part) {
    std::string text;
    const auto status =
        model_->processor.Decode(std::vector<int>(part.begin(), part.end()), &text);
    if (!status.ok()) common::fail("SentencePiece could not decode ids: {}", status.ToString());
    return text;
  };
  if (model_->special_text.empty()) return decode(ids);
  std::string text;
  size_t last = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto special = model_->special_text.find(ids[i]);
    if (special == model_->special_text.end()) continue;
    text += decode(ids.subspan(last, i - last)) + " " + special->second + " ";
    last = i + 1;
  }
  return text + decode(ids.subspan(last));
}

std::unique_ptr<Tokenizer> SentencePieceTokenizer::clone() const {
  return std::make_unique<SentencePieceTokenizer>(*this);
}

}  // namespace backend
