// libFuzzer target: the text generation server's request parser (backend/serve/
// generate_request.cpp) on arbitrary bytes, as a PUT /api body arrives: parse_generate_request
// returns the request or a refusal and never throws. An accepted request must hold what the
// checks promise (docs/serving.md's table, within the limits given); a refusal must be a 400
// with a message. Anything else, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>

#include "backend/serve/generate_request.hpp"

namespace {

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "FINDING: generate_request_fuzzer: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  backend::GenerateLimits limits;
  limits.max_prompts = 16;
  limits.max_tokens_to_generate = 256;
  limits.max_prompt_bytes = 64;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  std::variant<backend::GenerateRequest, backend::RequestRefusal> parsed;
  try {
    parsed = backend::parse_generate_request(body, limits);
  } catch (...) {
    finding("parse_generate_request threw");
  }
  if (const auto* refusal = std::get_if<backend::RequestRefusal>(&parsed)) {
    if (refusal->status != 400 || refusal->message.empty()) finding("a refusal without 400 and a message");
    return 0;
  }
  const auto& request = std::get<backend::GenerateRequest>(parsed);
  if (request.prompts.empty() || static_cast<int64_t>(request.prompts.size()) > limits.max_prompts) {
    finding("accepted prompts outside [1, max_prompts]");
  }
  for (const std::string& prompt : request.prompts) {
    if (static_cast<int64_t>(prompt.size()) > limits.max_prompt_bytes) finding("a prompt over the byte limit");
    if (prompt.empty() && !request.add_BOS) finding("an empty prompt without add_BOS");
  }
  if (request.tokens_to_generate < 0 || request.tokens_to_generate > limits.max_tokens_to_generate) {
    finding("tokens_to_generate outside [0, max]");
  }
  if (request.tokens_to_generate == 0 && !request.logprobs) finding("tokens_to_generate 0 without logprobs");
  if (!(request.temperature > 0.0 && request.temperature <= 100.0)) finding("temperature outside (0, 100]");
  if (request.top_k < 0 || request.top_k > 1000) finding("top_k outside [0, 1000]");
  if (!(request.top_p >= 0.0 && request.top_p <= 1.0)) finding("top_p outside [0, 1]");
  if (request.top_k > 0 && request.top_p > 0.0) finding("both top_k and top_p");
  if (!(request.top_p_decay >= 0.0 && request.top_p_decay <= 1.0)) finding("top_p_decay outside [0, 1]");
  if (request.top_p_bound < 0.0 || request.top_p_bound > request.top_p) finding("top_p_bound outside [0, top_p]");
  if (request.random_seed < -1) finding("random_seed below -1");
  return 0;
}
