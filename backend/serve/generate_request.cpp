// Megatron's PUT /api request checks, in its order and words; see generate_request.hpp.
#include "backend/serve/generate_request.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

namespace backend {

namespace {

using nlohmann::json;

// Python's isinstance(value, int) without bool (JSON true is not a count here). Integers past
// int64 are held at its maximum, which every range check below then refuses or bounds.
std::optional<int64_t> integer(const json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t n = value.get<uint64_t>();
    return n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(n);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

// Python's isinstance(value, float): a JSON number written with a fraction or an exponent.
std::optional<double> real(const json& value) {
  if (value.is_number_float()) return value.get<double>();
  return std::nullopt;
}

// isinstance(value, (int, float)), bool excluded.
std::optional<double> number(const json& value) {
  if (value.is_number_float()) return value.get<double>();
  if (const auto n = integer(value)) return static_cast<double>(*n);
  return std::nullopt;
}

RequestRefusal refused(std::string message) { return RequestRefusal{400, std::move(message)}; }

}  // namespace

std::variant<GenerateRequest, RequestRefusal> parse_generate_request(std::string_view body,
                                                                      const GenerateLimits& limits) {
  const json document = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) {
    return refused("the request body is not JSON (an object such as {\"prompts\": [\"Hello\"], "
                   "\"tokens_to_generate\": 16} is expected)");
  }
  if (!document.is_object() || !document.contains("prompts")) return refused("prompts argument required");
  if (document.contains("max_len")) return refused("max_len is no longer used.  Replace with tokens_to_generate");
  if (document.contains("sentences")) return refused("sentences is no longer used.  Replace with prompts");

  GenerateRequest request;
  const json& prompts = document.at("prompts");
  if (!prompts.is_array()) return refused("prompts is not a list of strings");
  for (const json& prompt : prompts) {
    if (!prompt.is_string()) return refused("prompts is not a list of strings");
  }
  if (prompts.empty()) return refused("prompts is empty");
  if (static_cast<int64_t>(prompts.size()) > limits.max_prompts) {
    return refused(fmt::format("Maximum number of prompts is {}", limits.max_prompts));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    request.prompts.push_back(prompts[i].get<std::string>());
    if (static_cast<int64_t>(request.prompts.back().size()) > limits.max_prompt_bytes) {
      return refused(fmt::format("prompts[{}] is {} bytes; this server takes at most {} "
                                 "(its --max-prompt-bytes)",
                                 i, request.prompts.back().size(), limits.max_prompt_bytes));
    }
  }

  auto field = [&](const char* name) -> const json* {
    const auto found = document.find(name);
    return found == document.end() ? nullptr : &*found;
  };
  // A boolean field: absent keeps the default; anything but true/false is Megatron's message.
  auto boolean = [&](const char* name, bool& target) -> std::optional<RequestRefusal> {
    if (const json* value = field(name)) {
      if (!value->is_boolean()) return refused(fmt::format("{} must be a boolean value", name));
      target = value->get<bool>();
    }
    return std::nullopt;
  };

  if (const json* value = field("tokens_to_generate")) {
    const auto n = integer(*value);
    if (!n) return refused("tokens_to_generate must be an integer greater than 0");
    if (*n < 0) return refused("tokens_to_generate must be an integer greater than or equal to 0");
    if (*n > limits.max_tokens_to_generate) {
      return refused(fmt::format("tokens_to_generate must be at most {} (this server's "
                                 "--max-tokens-to-generate)", limits.max_tokens_to_generate));
    }
    request.tokens_to_generate = *n;
  }
  if (auto refusal = boolean("logprobs", request.logprobs)) return *refusal;
  if (request.tokens_to_generate == 0 && !request.logprobs) {
    return refused("tokens_to_generate=0 implies logprobs should be True");
  }
  if (const json* value = field("temperature")) {
    const auto t = number(*value);
    if (!t) return refused("temperature must be a positive number less than or equal to 1000.0");
    if (!(0.0 < *t && *t <= 100.0)) return refused("temperature must be a positive number less than or equal to 100.0");
    // The logits are divided by the temperature in fp32 (as Megatron's div_): below fp32's
    // smallest normal number it is 0 or subnormal there, and every quotient overflows.
    if (*t < static_cast<double>(std::numeric_limits<float>::min())) {
      return refused(fmt::format("temperature {} is too small: the logits are divided by it in "
                                 "32-bit floating point, where it must be at least {} (for the "
                                 "most likely token every time, send top_k=1)",
                                 *t, std::numeric_limits<float>::min()));
    }
    request.temperature = *t;
  }
  if (const json* value = field("top_k")) {
    const auto k = integer(*value);
    if (!k) return refused("top_k must be an integer equal to or greater than 0 and less than or equal to 1000");
    if (!(0 <= *k && *k <= 1000)) return refused("top_k must be equal to or greater than 0 and less than or equal to 1000");
    request.top_k = *k;
  }
  if (const json* value = field("top_p")) {
    const auto p = real(*value);
    if (!p) return refused("top_p must be a positive float less than or equal to 1.0");
    if (*p > 0.0 && request.top_k > 0) return refused("cannot set both top-k and top-p samplings.");
    if (!(0.0 <= *p && *p <= 1.0)) return refused("top_p must be less than or equal to 1.0");
    request.top_p = *p;
  }
  if (const json* value = field("top_p_decay")) {
    const auto decay = real(*value);
    if (!decay) return refused("top_p_decay must be a positive float less than or equal to 1.0");
    if (request.top_p == 0.0) return refused("top_p_decay cannot be set without top_p");
    if (!(0.0 <= *decay && *decay <= 1.0)) return refused("top_p_decay must be less than or equal to 1.0");
    request.top_p_decay = *decay;
  }
  if (const json* value = field("top_p_bound")) {
    const auto bound = real(*value);
    if (!bound) return refused("top_p_bound must be a positive float less than or equal to top_p");
    if (request.top_p == 0.0) return refused("top_p_bound cannot be set without top_p");
    if (!(0.0 < *bound && *bound <= request.top_p)) {
      return refused("top_p_bound must be greater than 0 and less than top_p");
    }
    request.top_p_bound = *bound;
  }
  if (auto refusal = boolean("add_BOS", request.add_BOS)) return *refusal;
  for (const std::string& prompt : request.prompts) {
    if (prompt.empty() && !request.add_BOS) return refused("Empty prompts require add_BOS=true");
  }
  if (auto refusal = boolean("stop_on_double_eol", request.stop_on_double_eol)) return *refusal;
  if (auto refusal = boolean("stop_on_eol", request.stop_on_eol)) return *refusal;
  if (auto refusal = boolean("prevent_newline_after_colon", request.prevent_newline_after_colon)) return *refusal;
  if (const json* value = field("random_seed")) {
    const auto seed = integer(*value);
    if (!seed) return refused("random_seed must be integer");
    if (*seed < 0) return refused("random_seed must be a positive integer");
    request.random_seed = *seed;
  }
  if (auto refusal = boolean("no_log", request.no_log)) return *refusal;
  if (const json* value = field("beam_width")) {
    const auto width = integer(*value);
    if (!width) return refused("beam_width must be integer");
    if (*width < 1) return refused("beam_width must be an integer > 1");
    if (request.prompts.size() > 1) return refused("When doing beam_search, batch size must be 1");
    return refused("beam_width: beam search is not supported by this server yet; leave beam_width "
                   "out for sampling (temperature, top_k, top_p) or greedy decoding (top_k=1)");
  }
  if (const json* value = field("stop_token")) {
    const auto token = integer(*value);
    if (!token) return refused("stop_token must be an integer");
    request.stop_token = *token;
  }
  if (const json* value = field("length_penalty")) {
    const auto penalty = real(*value);
    if (!penalty) return refused("length_penalty must be a float");
    request.length_penalty = *penalty;
  }
  return request;
}

}  // namespace backend
