// HuggingFaceTokenizer: reading tokenizer.json (and tokenizer_config.json's eos_token) into the
// shared byte-level BPE tables, the added-token split and the post-processor template (the rules
// and their sources are in hf_tokenizer.hpp).
#include "backend/data/hf_tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bitset>
#include <limits>
#include <optional>
#include <unordered_map>

#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"
#include "backend/data/unicode_text.hpp"

namespace backend {

// The pre-tokenizer regexes recognised in a Split, exactly as tokenizer.json spells them.
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct HuggingFaceTokenizer::Tables {
  int32_t eod = 0;
  std::vector<int32_t> prefix_ids, suffix_ids;
  // Added tokens: content → id (views into added_text), the distinct content lengths (longest
  // first) and the bytes a content can start with, for the leftmost-longest scan.
  std::string added_text;
  std::unordered_map<std::string_view, int32_t> added_id;
  std::vector<size_t> added_lengths;
  std::bitset<256> added_first_bytes;
};

namespace {

using nlohmann::json;

std::string quoted(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The member `key` of `object`, or nullptr when absent or null.
const json* member(const json& object, std::string_view key) {
  const auto found = object.find(std::string(key));
  if (found == object.end() || found->is_null()) return nullptr;
  return &*found;
}

bool flag(const json& object, std::string_view key, bool absent, const std::string& file,
          std::string_view where) {
  const json* value = member(object, key);
  if (value == nullptr) return absent;
  if (!value->is_boolean()) {
    common::fail("{}: {}.{} must be true or false, found {}", file, where, key, quoted(*value));
  }
  return value->get<bool>();
}

std::string type_of(const json& object, const std::string& file, std::string_view where) {
  const json* type = object.is_object() ? member(object, "type") : nullptr;
  if (type == nullptr || !type->is_string()) {
    common::fail("{}: {} must be an object with a string \"type\", found {}", file, where,
                 quoted(object));
  }
  return type->get<std::string>();
}

json parse_json_file(const std::filesystem::path& path, std::string_view what) {
  const std::string text = common::read_small_file(path, what);
  try {
    return json::parse(text);
  } catch (const json::exception& error) {
    std::string reason = error.what();
    if (const size_t bracket = reason.find("] "); bracket != std::string::npos) {
      reason = reason.substr(bracket + 2);
    }
    common::fail("{}: --tokenizer-model's {} is not valid JSON ({})", path.string(), what, reason);
  }
}

// ByteLevel's options: add_prefix_space (HF's default true) must be false; use_regex as given.
bool byte_level_uses_regex(const json& byte_level, const std::string& file,
                           std::string_view where) {
  if (flag(byte_level, "add_prefix_space", true, file, where)) {
    common::fail("{}: {} has add_prefix_space true (or unset, which means true); only "
                 "add_prefix_space false is supported", file, where);
  }
  return flag(byte_level, "use_regex", true, file, where);
}

PretokenizerPattern read_pretokenizer(const json& root, const std::string& file) {
  const json* pre = member(root, "pre_tokenizer");
  const std::string supported =
      "supported: {\"type\": \"ByteLevel\", \"use_regex\": true} (GPT-2), or a Sequence of "
      "Split{\"Regex\": GPT-2's or Llama 3's pattern, \"behavior\": \"Isolated\"} and "
      "ByteLevel{\"use_regex\": false}";
  if (pre == nullptr) common::fail("{}: no pre_tokenizer ({})", file, supported);
  const std::string type = type_of(*pre, file, "pre_tokenizer");
  if (type == "ByteLevel") {
    if (!byte_level_uses_regex(*pre, file, "pre_tokenizer")) {
      common::fail("{}: pre_tokenizer ByteLevel with use_regex false would not split the text "
                   "at all ({})", file, supported);
    }
    return PretokenizerPattern::gpt2;
  }
  const json* steps = type == "Sequence" ? member(*pre, "pretokenizers") : nullptr;
  if (steps == nullptr || !steps->is_array() || steps->size() != 2) {
    common::fail("{}: pre_tokenizer {} is not supported ({})", file, quoted(*pre).substr(0, 300),
                 supported);
  }
  const json& split = (*steps)[0];
  const json& byte_level = (*steps)[1];
  if (type_of(split, file, "pre_tokenizer.pretokenizers[0]") != "Split" ||
      type_of(byte_level, file, "pre_tokenizer.pretokenizers[1]") != "ByteLevel") {
    common::fail("{}: pre_tokenizer Sequence of {} and {} is not supported ({})", file,
                 quoted(split.value("type", json())), quoted(byte_level.value("type", json())),
                 supported);
  }
  if (byte_level_uses_regex(byte_level, file, "pre_tokenizer.pretokenizers[1]")) {
    common::fail("{}: pre_tokenizer.pretokenizers[1] (ByteLevel after a Split) must have "
                 "use_regex false", file);
  }
  const json* behavior = member(split, "behavior");
  if (behavior == nullptr || *behavior != "Isolated" || flag(split, "invert", false, file,
                                                             "pre_tokenizer.pretokenizers[0]")) {
    common::fail("{}: pre_tokenizer.pretokenizers[0] (Split) must have behavior \"Isolated\" and "
                 "invert false, found behavior {}", file,
                 behavior == nullptr ? "none" : quoted(*behavior));
  }
  const json* pattern = member(split, "pattern");
  const json* regex = pattern != nullptr && pattern->is_object() ? member(*pattern, "Regex")
                                                                  : nullptr;
  if (regex == nullptr || !regex->is_string()) {
    common::fail("{}: pre_tokenizer.pretokenizers[0].pattern must be {{\"Regex\": \"...\"}}, "
                 "found {}", file, pattern == nullptr ? "none" : quoted(*pattern));
  }
  const std::string text = regex->get<std::string>();
  if (text == kLlama3Regex) return PretokenizerPattern::llama3;
  if (text == kGpt2Regex) return PretokenizerPattern::gpt2;
  common::fail("{}: the pre-tokenizer regex {} is not supported: only these patterns are "
               "implemented (by hand, not by a regex engine): GPT-2's {} and Llama 3's "
               "(= tiktoken cl100k_base's) {}", file, quoted(*regex), quoted(json(kGpt2Regex)),
               quoted(json(kLlama3Regex)));
}

// The `single` template of a TemplateProcessing post-processor: ids before and after "$A".
void read_template(const json& processor, const std::string& file, std::vector<int32_t>& prefix,
                   std::vector<int32_t>& suffix) {
  const json* single = member(processor, "single");
  const json* special = member(processor, "special_tokens");
  if (single == nullptr || !single->is_array()) {
    common::fail("{}: post_processor TemplateProcessing has no \"single\" template array", file);
  }
  bool seen_sequence = false;
  for (const json& piece : *single) {
    if (const json* sequence = piece.is_object() ? member(piece, "Sequence") : nullptr) {
      if (seen_sequence || sequence->value("id", "") != "A") {
        common::fail("{}: post_processor's single template must hold sequence A once, found {}",
                     file, quoted(*single));
      }
      seen_sequence = true;
      continue;
    }
    const json* token = piece.is_object() ? member(piece, "SpecialToken") : nullptr;
    const json* name = token != nullptr && token->is_object() ? member(*token, "id") : nullptr;
    if (name == nullptr || !name->is_string()) {
      common::fail("{}: post_processor's single template piece {} is neither a Sequence nor a "
                   "SpecialToken", file, quoted(piece));
    }
    const json* entry = special != nullptr && special->is_object()
                            ? member(*special, name->get<std::string>())
                            : nullptr;
    const json* ids = entry != nullptr && entry->is_object() ? member(*entry, "ids") : nullptr;
    if (ids == nullptr || !ids->is_array()) {
      common::fail("{}: post_processor's special token {} has no \"ids\" in special_tokens",
                   file, quoted(*name));
    }
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        common::fail("{}: post_processor's special token {} has id {}", file, quoted(*name),
                     quoted(id));
      }
      (seen_sequence ? suffix : prefix).push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  if (!seen_sequence) {
    common::fail("{}: post_processor's single template has no sequence A", file);
  }
}

void read_post_processor(const json& processor, const std::string& file,
                         std::vector<int32_t>& prefix, std::vector<int32_t>& suffix,
                         int depth = 0) {
  const std::string type = type_of(processor, file, "post_processor");
  if (type == "ByteLevel") return;  // offsets only
  if (type == "TemplateProcessing") {
    if (!prefix.empty() || !suffix.empty()) {
      common::fail("{}: post_processor has two TemplateProcessing steps", file);
    }
    read_template(processor, file, prefix, suffix);
    return;
  }
  if (type == "Sequence" && depth == 0) {
    const json* steps = member(processor, "processors");
    if (steps == nullptr || !steps->is_array()) {
      common::fail("{}: post_processor Sequence has no \"processors\" array", file);
    }
    for (const json& step : *steps) read_post_processor(step, file, prefix, suffix, depth + 1);
    return;
  }
  common::fail("{}: post_processor type {} is not supported (supported: ByteLevel, "
               "TemplateProcessing, a Sequence of these, or null)", file, quoted(json(type)));
}

// tokenizer_config.json's eos_token, else special_tokens_map.json's.
std::optional<std::string> read_eos_token(const std::filesystem::path& directory,
                                          std::string& source) {
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const std::filesystem::path path = directory / name;
    if (!std::filesystem::exists(path)) continue;
    const json config = parse_json_file(path, name);
    const json* eos = config.is_object() ? member(config, "eos_token") : nullptr;
    if (eos == nullptr) continue;
    if (eos->is_object()) eos = member(*eos, "content");
    if (eos == nullptr || !eos->is_string()) {
      common::fail("{}: eos_token must be a string or {{\"content\": \"...\"}}",
                   path.string());
    }
    source = path.string();
    return eos->get<std::string>();
  }
  return std::nullopt;
}

int32_t checked_id(const json& value, const std::string& file, std::string_view where,
                   const std::string& token) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
      value.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    common::fail("{}: {} token {} has id {}; ids are integers 0 .. 2^31−1", file, where,
                 quoted(json(token)), quoted(value));
  }
  return static_cast<int32_t>(value.get<int64_t>());
}

}  // namespace

HuggingFaceTokenizer::Loaded HuggingFaceTokenizer::load(const std::filesystem::path& model_path) {
  std::filesystem::path file_path = model_path;
  std::error_code error;
  if (std::filesystem::is_directory(model_path, error)) file_path = model_path / "tokenizer.json";
  if (!std::filesystem::exists(model_path, error)) {
    common::fail("--tokenizer-model {} does not exist (HuggingFaceTokenizer reads a directory "
                 "holding tokenizer.json, or that file)", model_path.string());
  }
  if (!std::filesystem::exists(file_path, error)) {
    common::fail("--tokenizer-model {}: no {} (HuggingFaceTokenizer reads a directory holding "
                 "tokenizer.json, or that file)", model_path.string(), file_path.string());
  }
  const std::string file = file_path.string();
  const json root = parse_json_file(file_path, "tokenizer.json");
  if (!root.is_object()) {
    common::fail("{}: tokenizer.json must be a JSON object, found {}", file, root.type_name());
  }
  auto tables_pointer = std::make_shared<Tables>();
  auto bpe_pointer = std::make_shared<ByteLevelBpeTables>();
  Tables& tables = *tables_pointer;
  ByteLevelBpeTables& bpe = *bpe_pointer;

  // ---- model
  const json* model = member(root, "model");
  if (model == nullptr || !model->is_object()) common::fail("{}: no \"model\" object", file);
  const json* model_type = member(*model, "type");
  if (model_type == nullptr || *model_type != "BPE") {
    common::fail("{}: model.type is {}; HuggingFaceTokenizer reads byte-level BPE models only "
                 "(\"BPE\"; WordPiece, Unigram and WordLevel are not built)", file,
                 model_type == nullptr ? "missing" : quoted(*model_type));
  }
  if (flag(*model, "byte_fallback", false, file, "model")) {
    common::fail("{}: model.byte_fallback is true, which is not implemented (byte-level BPE "
                 "vocabularies cover every byte and do not use it)", file);
  }
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* value = member(*model, key);
    if (value != nullptr && !(value->is_string() && value->get<std::string>().empty())) {
      common::fail("{}: model.{} is {}; only null is supported", file, key, quoted(*value));
    }
  }
  bpe.ignore_merges = flag(*model, "ignore_merges", false, file, "model");
  if (const json* normalizer = member(root, "normalizer")) {
    common::fail("{}: normalizer {} is not supported (byte-level BPE files have none)", file,
                 quoted(*normalizer).substr(0, 200));
  }
  if (const json* decoder = member(root, "decoder")) {
    if (type_of(*decoder, file, "decoder") != "ByteLevel") {
      common::fail("{}: decoder {} is not supported (ByteLevel or null)", file,
                   quoted((*decoder)["type"]));
    }
  }
  bpe.pattern = read_pretokenizer(root, file);

  const json* vocab = member(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object() || vocab->empty()) {
    common::fail("{}: model.vocab must be a non-empty object of token → id", file);
  }
  // Ids → token text (vocabulary entries in byte characters; added tokens as written).
  std::vector<std::optional<std::string>> bytes_of_id;
  std::vector<bool> is_added;
  std::unordered_map<std::string, int32_t> id_of_token;
  id_of_token.reserve(vocab->size() * 2);
  std::string bytes;
  const auto place = [&](int32_t id, std::string token_bytes, bool added) {
    if (static_cast<size_t>(id) >= bytes_of_id.size()) {
      if (static_cast<size_t>(id) > 4 * (vocab->size() + 1024)) {
        common::fail("{}: id {} is far beyond the {} vocabulary entries; ids must be 0 .. N−1",
                     file, id, vocab->size());
      }
      bytes_of_id.resize(id + 1);
      is_added.resize(id + 1, false);
    }
    if (bytes_of_id[id] && !(added && *bytes_of_id[id] == token_bytes)) {
      common::fail("{}: id {} is given to two tokens", file, id);
    }
    bytes_of_id[id] = std::move(token_bytes);
    if (added) is_added[id] = true;
  };
  for (const auto& [token, value] : vocab->items()) {
    const int32_t id = checked_id(value, file, "model.vocab", token);
    id_of_token.emplace(token, id);
  }

  // ---- added tokens (their text is the content itself, not byte characters)
  if (const json* added = member(root, "added_tokens")) {
    if (!added->is_array()) common::fail("{}: added_tokens must be an array", file);
    for (const json& token : *added) {
      const json* content = token.is_object() ? member(token, "content") : nullptr;
      const json* id_value = token.is_object() ? member(token, "id") : nullptr;
      if (content == nullptr || !content->is_string() || content->get<std::string>().empty() ||
          id_value == nullptr) {
        common::fail("{}: added token {} needs a non-empty \"content\" and an \"id\"", file,
                     quoted(token));
      }
      const std::string text = content->get<std::string>();
      for (const char* key : {"lstrip", "rstrip", "single_word"}) {
        if (flag(token, key, false, file, "added_tokens[]")) {
          common::fail("{}: added token {} has {} true, which is not implemented", file,
                       quoted(*content), key);
        }
      }
      const int32_t id = checked_id(*id_value, file, "added_tokens", text);
      if (const auto found = id_of_token.find(text); found != id_of_token.end() &&
                                                     found->second != id) {
        common::fail("{}: added token {} has id {} but model.vocab gives it {}", file,
                     quoted(*content), id, found->second);
      }
      place(id, text, true);
      id_of_token.emplace(text, id);
      tables.added_first_bytes.set(static_cast<unsigned char>(text[0]));
      if (std::find(tables.added_lengths.begin(), tables.added_lengths.end(), text.size()) ==
          tables.added_lengths.end()) {
        tables.added_lengths.push_back(text.size());
      }
    }
    std::sort(tables.added_lengths.begin(), tables.added_lengths.end(), std::greater<>());
  }
  {
    std::vector<std::pair<size_t, int32_t>> spans;  // added_text offset, id
    for (size_t id = 0; id < is_added.size(); ++id) {
      if (!is_added[id]) continue;
      spans.emplace_back(tables.added_text.size(), static_cast<int32_t>(id));
      tables.added_text += *bytes_of_id[id];
    }
    for (const auto& [offset, id] : spans) {
      tables.added_id.emplace(
          std::string_view(tables.added_text).substr(offset, bytes_of_id[id]->size()), id);
    }
  }

  // ---- the BPE vocabulary in byte characters
  for (const auto& [token, value] : vocab->items()) {
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    if (static_cast<size_t>(id) < is_added.size() && is_added[id]) continue;  // e.g. GPT-2's <|endoftext|>
    if (char32_t bad = 0; !byte_level_text_to_bytes(token, bytes, bad)) {
      common::fail("{}: model.vocab token {} contains U+{:04X}, which is not one of the 256 "
                   "byte-level characters (and it is not an added token)", file,
                   quoted(json(token)), uint32_t(bad));
    }
    place(id, bytes, false);
  }
  for (size_t id = 0; id < bytes_of_id.size(); ++id) {
    if (!bytes_of_id[id]) {
      common::fail("{}: no token has id {}; the ids of model.vocab and added_tokens must be "
                   "0 .. {} without gaps", file, id, bytes_of_id.size() - 1);
    }
  }
  std::vector<std::string> all_bytes;
  all_bytes.reserve(bytes_of_id.size());
  for (auto& token : bytes_of_id) all_bytes.push_back(std::move(*token));
  bpe.set_tokens(all_bytes);
  for (int b = 0; b < 256; ++b) {
    const char32_t c = byte_level_character(static_cast<uint8_t>(b));
    std::string text;  // c in UTF-8
    if (c < 0x80) {
      text.push_back(static_cast<char>(c));
    } else {
      text.push_back(static_cast<char>(0xC0 | (c >> 6)));
      text.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    const auto token = id_of_token.find(text);
    if (token == id_of_token.end() || is_added[token->second]) {
      common::fail("{}: model.vocab has no token for byte 0x{:02X} ({}); a byte-level BPE "
                   "vocabulary has one for each of the 256 bytes", file, b, quoted(json(text)));
    }
    bpe.byte_token[b] = token->second;
  }
  if (bpe.ignore_merges) {
    bpe.id_of_bytes.reserve(vocab->size() * 2);
    for (size_t id = 0; id < is_added.size(); ++id) {
      if (!is_added[id]) bpe.id_of_bytes.emplace(bpe.bytes_of(static_cast<int32_t>(id)), id);
    }
  }

  // ---- merges: "left right" strings or [left, right] pairs, best first
  const json* merges = member(*model, "merges");
  if (merges == nullptr || !merges->is_array()) {
    common::fail("{}: model.merges must be an array", file);
  }
  std::vector<std::array<int32_t, 3>> merge_ids;
  merge_ids.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const json& merge = (*merges)[rank];
    std::string left, right;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        common::fail("{}: model.merges[{}] {} is not two tokens separated by one space", file,
                     rank, quoted(merge));
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      common::fail("{}: model.merges[{}] {} is neither \"a b\" nor [\"a\", \"b\"]", file, rank,
                   quoted(merge));
    }
    std::array<int32_t, 3> ids{};
    const std::string merged = left + right;
    const std::string* parts[3] = {&left, &right, &merged};
    for (int k = 0; k < 3; ++k) {
      const auto found = id_of_token.find(*parts[k]);
      if (found == id_of_token.end() || is_added[found->second]) {
        common::fail("{}: model.merges[{}] {}: {} {} is not in model.vocab", file, rank,
                     quoted(merge), k == 2 ? "the merged token" : "the token",
                     quoted(json(*parts[k])));
      }
      ids[k] = found->second;
    }
    merge_ids.push_back(ids);
  }
  if (merge_ids.size() > size_t(std::numeric_limits<int32_t>::max())) {
    common::fail("{}: too many merges", file);
  }
  bpe.set_merges(merge_ids);

  // ---- post-processor and eod
  if (const json* processor = member(root, "post_processor")) {
    read_post_processor(*processor, file, tables.prefix_ids, tables.suffix_ids);
  }
  for (const auto& ids : {tables.prefix_ids, tables.suffix_ids}) {
    for (const int32_t id : ids) {
      if (id >= bpe.vocab_size) {
        common::fail("{}: post_processor adds id {}, outside the vocabulary [0, {})", file, id,
                     bpe.vocab_size);
      }
    }
  }
  std::string eos_source;
  const auto eos = read_eos_token(file_path.parent_path(), eos_source);
  if (!eos) {
    common::fail("--tokenizer-model {}: no eos_token in tokenizer_config.json or "
                 "special_tokens_map.json next to tokenizer.json; Megatron's HuggingFaceTokenizer "
                 "takes the end-of-document id from it", model_path.string());
  }
  const auto eos_id = id_of_token.find(*eos);
  if (eos_id == id_of_token.end()) {
    common::fail("{}: eos_token {} is not a token of {}", eos_source, quoted(json(*eos)), file);
  }
  tables.eod = eos_id->second;
  return {std::move(tables_pointer), std::move(bpe_pointer)};
}

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::filesystem::path& model_path,
                                           ByteLevelBpeOptions options)
    : HuggingFaceTokenizer(load(model_path), options) {}

HuggingFaceTokenizer::HuggingFaceTokenizer(Loaded loaded, ByteLevelBpeOptions options)
    : tables_(std::move(loaded.first)), bpe_(std::move(loaded.second)), encoder_(bpe_, options) {}

HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

HuggingFaceTokenizer::HuggingFaceTokenizer(const HuggingFaceTokenizer& other)
    : tables_(other.tables_), bpe_(other.bpe_), encoder_(other.encoder_) {}

int64_t HuggingFaceTokenizer::vocab_size() const { return bpe_->vocab_size; }
int32_t HuggingFaceTokenizer::eod() const { return tables_->eod; }

std::span<const int32_t> HuggingFaceTokenizer::prefix_ids() const { return tables_->prefix_ids; }
std::span<const int32_t> HuggingFaceTokenizer::suffix_ids() const { return tables_->suffix_ids; }

std::unique_ptr<Tokenizer> HuggingFaceTokenizer::clone() const {
  return std::make_unique<HuggingFaceTokenizer>(*this);
}

void HuggingFaceTokenizer::tokenize(std::string_view text, std::vector<int32_t>& ids) {
  if (!is_valid_utf8(text)) {
    replace_invalid_utf8(text, repaired_text_);
    text = repaired_text_;
  }
  ids.insert(ids.end(), tables_->prefix_ids.begin(), tables_->prefix_ids.end());
  // Added tokens first: the leftmost match, the longest there; the text between goes to BPE.
  const Tables& tables = *tables_;
  size_t segment_start = 0;
  if (!tables.added_id.empty()) {
    for (size_t i = 0; i < text.size(); ++i) {
      if (!tables.added_first_bytes.test(static_cast<unsigned char>(text[i]))) continue;
      for (const size_t length : tables.added_lengths) {
        if (length > text.size() - i) continue;
        const auto found = tables.added_id.find(text.substr(i, length));
        if (found == tables.added_id.end()) continue;
        encoder_.encode(text.substr(segment_start, i - segment_start), ids);
        ids.push_back(found->second);
        segment_start = i + length;
        i = segment_start - 1;
        break;
      }
    }
  }
  encoder_.encode(text.substr(segment_start), ids);
  ids.insert(ids.end(), tables_->suffix_ids.begin(), tables_->suffix_ids.end());
}

std::string HuggingFaceTokenizer::detokenize(std::span<const int32_t> ids) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= bpe_->vocab_size) {
      common::fail("detokenize: id {} is outside the vocabulary [0, {})", id, bpe_->vocab_size);
    }
    bytes.append(bpe_->bytes_of(id));
  }
  return bytes;
}

}  // namespace backend
