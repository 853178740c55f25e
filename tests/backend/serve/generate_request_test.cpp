// parse_generate_request against Megatron's MegatronGenerate.put: each field's defaults, and for
// each bad value the message Megatron's server returns (copied from its checks, in its order),
// plus the refusals of our own (not JSON, non-string prompts, the server's limits, beam search).
#include <doctest/doctest.h>

#include <string>
#include <variant>

#include "backend/serve/generate_request.hpp"

using backend::GenerateLimits;
using backend::GenerateRequest;
using backend::parse_generate_request;
using backend::RequestRefusal;

namespace {

std::string refusal(const std::string& body, const GenerateLimits& limits = {}) {
  const auto parsed = parse_generate_request(body, limits);
  if (std::holds_alternative<GenerateRequest>(parsed)) return "<accepted>";
  CHECK(std::get<RequestRefusal>(parsed).status == 400);
  return std::get<RequestRefusal>(parsed).message;
}

GenerateRequest accepted(const std::string& body) {
  const auto parsed = parse_generate_request(body, {});
  if (const auto* refused = std::get_if<RequestRefusal>(&parsed)) FAIL("refused: " << refused->message);
  return std::get<GenerateRequest>(parsed);
}

}  // namespace

TEST_CASE("a request with prompts only takes Megatron's defaults") {
  const GenerateRequest request = accepted(R"({"prompts": ["Hello", "Bonjour \u00e9"]})");
  CHECK(request.prompts == std::vector<std::string>{"Hello", "Bonjour \xC3\xA9"});
  CHECK(request.tokens_to_generate == 64);
  CHECK_FALSE(request.logprobs);
  CHECK(request.temperature == 1.0);
  CHECK(request.top_k == 0);
  CHECK(request.top_p == 0.0);
  CHECK(request.top_p_decay == 0.0);
  CHECK(request.top_p_bound == 0.0);
  CHECK_FALSE(request.add_BOS);
  CHECK_FALSE(request.stop_on_double_eol);
  CHECK_FALSE(request.stop_on_eol);
  CHECK_FALSE(request.prevent_newline_after_colon);
  CHECK(request.random_seed == -1);
  CHECK_FALSE(request.no_log);
  CHECK(request.stop_token == 50256);
  CHECK(request.length_penalty == 1.0);
}

TEST_CASE("every field is read") {
  const GenerateRequest request = accepted(
      R"({"prompts": ["", "x"], "tokens_to_generate": 0, "logprobs": true, "temperature": 0.5,
          "top_p": 0.9, "top_p_decay": 0.5, "top_p_bound": 0.25, "add_BOS": true,
          "stop_on_double_eol": true, "stop_on_eol": true, "prevent_newline_after_colon": true,
          "random_seed": 1234, "no_log": true, "stop_token": 2, "length_penalty": 0.75,
          "an_unknown_field": "ignored, as Megatron ignores it"})");
  CHECK(request.prompts == std::vector<std::string>{"", "x"});
  CHECK(request.tokens_to_generate == 0);
  CHECK(request.logprobs);
  CHECK(request.temperature == 0.5);
  CHECK(request.top_p == 0.9);
  CHECK(request.top_p_decay == 0.5);
  CHECK(request.top_p_bound == 0.25);
  CHECK(request.add_BOS);
  CHECK(request.stop_on_double_eol);
  CHECK(request.stop_on_eol);
  CHECK(request.prevent_newline_after_colon);
  CHECK(request.random_seed == 1234);
  CHECK(request.no_log);
  CHECK(request.stop_token == 2);
  CHECK(request.length_penalty == 0.75);
  CHECK(accepted(R"({"prompts": ["a"], "top_k": 1000, "temperature": 100})").top_k == 1000);
}

TEST_CASE("bad requests get Megatron's messages, in Megatron's order") {
  struct Case {
    const char* body;
    const char* message;
  };
  const Case cases[] = {
      {R"({})", "prompts argument required"},
      {R"(["prompts"])", "prompts argument required"},
      {R"({"prompts": ["a"], "max_len": 5})", "max_len is no longer used.  Replace with tokens_to_generate"},
      {R"({"prompts": ["a"], "sentences": ["a"]})", "sentences is no longer used.  Replace with prompts"},
      {R"({"prompts": "a"})", "prompts is not a list of strings"},
      {R"({"prompts": ["a", 3]})", "prompts is not a list of strings"},
      {R"({"prompts": []})", "prompts is empty"},
      {R"({"prompts": ["a"], "tokens_to_generate": 1.5})", "tokens_to_generate must be an integer greater than 0"},
      {R"({"prompts": ["a"], "tokens_to_generate": true})", "tokens_to_generate must be an integer greater than 0"},
      {R"({"prompts": ["a"], "tokens_to_generate": -1})",
       "tokens_to_generate must be an integer greater than or equal to 0"},
      {R"({"prompts": ["a"], "logprobs": 1})", "logprobs must be a boolean value"},
      {R"({"prompts": ["a"], "tokens_to_generate": 0})", "tokens_to_generate=0 implies logprobs should be True"},
      {R"({"prompts": ["a"], "temperature": "hot"})", "temperature must be a positive number less than or equal to 1000.0"},
      {R"({"prompts": ["a"], "temperature": 0})", "temperature must be a positive number less than or equal to 100.0"},
      {R"({"prompts": ["a"], "temperature": 100.5})", "temperature must be a positive number less than or equal to 100.0"},
      // Below fp32's smallest normal number: logits / temperature would overflow in fp32.
      {R"({"prompts": ["a"], "temperature": 1e-300})",
       "temperature 1e-300 is too small: the logits are divided by it in 32-bit floating point, "
       "where it must be at least 1.1754944e-38 (for the most likely token every time, send "
       "top_k=1)"},
      {R"({"prompts": ["a"], "top_k": 0.5})",
       "top_k must be an integer equal to or greater than 0 and less than or equal to 1000"},
      {R"({"prompts": ["a"], "top_k": 1001})", "top_k must be equal to or greater than 0 and less than or equal to 1000"},
      {R"({"prompts": ["a"], "top_k": -1})", "top_k must be equal to or greater than 0 and less than or equal to 1000"},
      {R"({"prompts": ["a"], "top_p": 1})", "top_p must be a positive float less than or equal to 1.0"},
      {R"({"prompts": ["a"], "top_k": 5, "top_p": 0.5})", "cannot set both top-k and top-p samplings."},
      {R"({"prompts": ["a"], "top_p": 1.5})", "top_p must be less than or equal to 1.0"},
      {R"({"prompts": ["a"], "top_p": 0.5, "top_p_decay": 1})", "top_p_decay must be a positive float less than or equal to 1.0"},
      {R"({"prompts": ["a"], "top_p_decay": 0.5})", "top_p_decay cannot be set without top_p"},
      {R"({"prompts": ["a"], "top_p": 0.5, "top_p_decay": 2.0})", "top_p_decay must be less than or equal to 1.0"},
      {R"({"prompts": ["a"], "top_p": 0.5, "top_p_bound": "x"})",
       "top_p_bound must be a positive float less than or equal to top_p"},
      {R"({"prompts": ["a"], "top_p_bound": 0.1})", "top_p_bound cannot be set without top_p"},
      {R"({"prompts": ["a"], "top_p": 0.5, "top_p_bound": 0.75})", "top_p_bound must be greater than 0 and less than top_p"},
      {R"({"prompts": ["a"], "top_p": 0.5, "top_p_bound": 0.0})", "top_p_bound must be greater than 0 and less than top_p"},
      {R"({"prompts": ["a"], "add_BOS": "yes"})", "add_BOS must be a boolean value"},
      {R"({"prompts": ["a", ""]})", "Empty prompts require add_BOS=true"},
      {R"({"prompts": ["a"], "stop_on_double_eol": null})", "stop_on_double_eol must be a boolean value"},
      {R"({"prompts": ["a"], "stop_on_eol": 0})", "stop_on_eol must be a boolean value"},
      {R"({"prompts": ["a"], "prevent_newline_after_colon": []})", "prevent_newline_after_colon must be a boolean value"},
      {R"({"prompts": ["a"], "random_seed": "1"})", "random_seed must be integer"},
      {R"({"prompts": ["a"], "random_seed": -5})", "random_seed must be a positive integer"},
      {R"({"prompts": ["a"], "no_log": "true"})", "no_log must be a boolean value"},
      {R"({"prompts": ["a"], "beam_width": 2.0})", "beam_width must be integer"},
      {R"({"prompts": ["a"], "beam_width": 0})", "beam_width must be an integer > 1"},
      {R"({"prompts": ["a", "b"], "beam_width": 2})", "When doing beam_search, batch size must be 1"},
      {R"({"prompts": ["a"], "stop_token": "eos"})", "stop_token must be an integer"},
      {R"({"prompts": ["a"], "length_penalty": 1})", "length_penalty must be a float"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.body);
    CHECK(refusal(c.body) == c.message);
  }
}

TEST_CASE("refusals of our own: not JSON, the server's limits, beam search") {
  for (const char* body : {"", "{", "{\"prompts\": [\"a\"],}", "prompts=a", "{\"prompts\": [\"\xff\"]}", "[[[[[["}) {
    CAPTURE(body);
    CHECK(refusal(body).starts_with("the request body is not JSON"));
  }
  GenerateLimits limits;
  limits.max_prompts = 2;
  limits.max_tokens_to_generate = 8;
  limits.max_prompt_bytes = 4;
  CHECK(refusal(R"({"prompts": ["a", "b", "c"]})", limits) == "Maximum number of prompts is 2");
  CHECK(refusal(R"({"prompts": ["a"], "tokens_to_generate": 9})", limits) ==
        "tokens_to_generate must be at most 8 (this server's --max-tokens-to-generate)");
  CHECK(refusal(R"({"prompts": ["a"], "tokens_to_generate": 18446744073709551615})", limits) ==
        "tokens_to_generate must be at most 8 (this server's --max-tokens-to-generate)");
  CHECK(refusal(R"({"prompts": ["abcd", "abcde"], "tokens_to_generate": 1})", limits) ==
        "prompts[1] is 5 bytes; this server takes at most 4 (its --max-prompt-bytes)");
  CHECK(refusal(R"({"prompts": ["a"], "beam_width": 2})").starts_with(
      "beam_width: beam search is not supported by this server yet"));
  // The default limit is Megatron's 128 prompts.
  std::string many = R"({"prompts": [)";
  for (int i = 0; i < 129; ++i) many += (i ? ",\"p\"" : "\"p\"");
  CHECK(refusal(many + "]}") == "Maximum number of prompts is 128");
}
