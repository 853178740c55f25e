// The body of Megatron-LM's text generation request (`PUT /api`, megatron/inference/
// text_generation_server.py, MegatronGenerate.put, as of Megatron core 0.12): a JSON object with
// `prompts` and the sampling fields below, checked in Megatron's order with Megatron's
// messages, so that a client which reads them sees the same text. Differences, by design
// (docs/serving.md): every refusal is status 400 with the body {"message": "..."} (Megatron
// sends some with status 200, and as a bare JSON string, which its own text_generation_cli
// cannot read); JSON true/false are not integers (Python's bool is an int); a body that is
// not JSON, a prompt that is not a string, and the server's own limits (prompt bytes, tokens to
// generate) are refused with messages of our own; beam search is refused by name until it
// exists.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace backend {

// A request's fields with Megatron's defaults.
struct GenerateRequest {
  std::vector<std::string> prompts;
  int64_t tokens_to_generate = 64;
  bool logprobs = false;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 0.0;
  double top_p_decay = 0.0;
  double top_p_bound = 0.0;
  bool add_BOS = false;
  bool stop_on_double_eol = false;
  bool stop_on_eol = false;
  bool prevent_newline_after_colon = false;
  int64_t random_seed = -1;  // -1: the server's own sequence
  bool no_log = false;
  int64_t stop_token = 50256;
  double length_penalty = 1.0;
};

// The server's limits on one request (text_generation_server's flags).
struct GenerateLimits {
  int64_t max_prompts = 128;                // Megatron's
  int64_t max_tokens_to_generate = 4096;    // ours: one request cannot hold the batch forever
  int64_t max_prompt_bytes = 1 << 20;       // ours, per prompt
};

struct RequestRefusal {
  int status = 400;
  std::string message;
};

// Parses and checks a request body. Never throws on any input.
std::variant<GenerateRequest, RequestRefusal> parse_generate_request(std::string_view body,
                                                                      const GenerateLimits& limits);

}  // namespace backend
