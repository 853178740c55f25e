// GenerationScheduler (continuous batching, generation_scheduler.hpp) against generate(), one
// prompt at a time. The step under test is an oracle that lives here: it keeps each slot's token
// history and answers every row with a full forward of a real small GptModel over the slot's
// history up to the row, so a KV-cache decoder that is right gives the same logits. Checked:
// requests from several threads get exactly generate()'s tokens, text, segments and logprobs for
// the same seeds; a step holds rows of two requests (continuous batching); long prompts are
// prefilled in chunks; the queue limit refuses at once; a refused or failing request leaves the
// others alone; stop() answers pending requests instead of hanging; a request abandoned by its
// submitter, running or queued, is answered 499 and gives its slot and its place back before the
// next step, while the others generate on; an answer callback (the HTTP server's way) is called
// once, at once for a refusal and from the worker for an answer.
#include "backend/serve/generation_scheduler.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "backend/data/null_tokenizer.hpp"
#include "tests/backend/serve/small_generation_model.hpp"

using namespace backend;
using namespace std::chrono_literals;

namespace {

constexpr int64_t kPadded = test_support::kSmallGenerationPaddedVocab;

GptConfig scheduler_model_config() { return test_support::small_generation_config(32); }

// The recomputing oracle: a full forward per slot and step, over the slot's history.
struct OracleStep {
  GptModel<float> model{scheduler_model_config()};
  std::vector<std::vector<int32_t>> history;
  std::mutex mutex;
  std::vector<std::vector<DecodeRow>> steps;  // every step's rows, for the tests to inspect
  std::function<void(int64_t step)> before_step;  // a test's hook (gates)

  explicit OracleStep(int64_t slots) : history(static_cast<size_t>(slots)) {
    model.init_parameters(5);
    model.set_training(false);
  }

  void operator()(std::span<const DecodeRow> rows, std::span<float> logits) {
    int64_t step_number = 0;
    {
      std::lock_guard lock(mutex);
      steps.emplace_back(rows.begin(), rows.end());
      step_number = std::ssize(steps);
    }
    if (before_step) before_step(step_number);
    std::map<int32_t, int32_t> last_position;  // slot → its last row's position
    for (const DecodeRow& row : rows) {
      auto& tokens = history.at(static_cast<size_t>(row.slot));
      // No gap in the cache. (A throw here fails the step's requests with 500.)
      if (row.position > std::ssize(tokens)) throw std::runtime_error("a gap in a slot's cache");
      tokens.resize(static_cast<size_t>(row.position));
      tokens.push_back(row.token);
      last_position[row.slot] = row.position;
    }
    std::vector<size_t> offsets;  // each row's logits offset, or npos
    size_t next = 0;
    for (const DecodeRow& row : rows) {
      offsets.push_back(row.logits ? next : std::string::npos);
      if (row.logits) next += static_cast<size_t>(kPadded);
    }
    if (logits.size() != next) throw std::runtime_error("logits of the wrong size");
    for (const auto& [slot, position] : last_position) {
      const std::vector<int32_t> tokens(history[static_cast<size_t>(slot)].begin(),
                                        history[static_cast<size_t>(slot)].begin() + position + 1);
      const std::vector<int32_t> labels(tokens.size(), 0);
      model.forward(tokens, labels, 1, std::ssize(tokens));
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i].slot != slot || !rows[i].logits) continue;
        const std::vector<float> row_logits = model.last_position_logits(0, rows[i].position);
        std::copy(row_logits.begin(), row_logits.end(), logits.begin() + offsets[i]);
      }
    }
  }
};

// Holds every step of the oracle until opened (at most 10 s each), and knows whether one began.
struct StepGate {
  std::atomic<bool> open = false;
  std::atomic<int64_t> started = 0;

  explicit StepGate(OracleStep& oracle) {
    oracle.before_step = [this](int64_t step) {
      started = step;
      for (int i = 0; i < 10000 && !open; ++i) std::this_thread::sleep_for(1ms);
    };
  }
  void wait_for_a_step() const {
    for (int i = 0; i < 10000 && started == 0; ++i) std::this_thread::sleep_for(1ms);
  }
};

DecodeStepShape shape(int64_t slots, int64_t max_rows) {
  return {.slots = slots, .max_length = 32, .max_rows = max_rows, .padded_vocab_size = kPadded};
}

DecodeStep step_of(OracleStep& oracle) {
  return [&oracle](std::span<const DecodeRow> rows, std::span<float> logits) {
    oracle(rows, logits);
  };
}

GenerateRequest request_of(std::vector<std::string> prompts, int64_t tokens, int64_t seed,
                           bool logprobs, int64_t top_k = 0) {
  GenerateRequest request;
  request.prompts = std::move(prompts);
  request.tokens_to_generate = tokens;
  request.random_seed = seed;
  request.logprobs = logprobs;
  request.top_k = top_k;
  request.stop_on_eol = true;  // so that the eod (often a clamped padding row) does not stop
  return request;
}

// generate() one prompt at a time, the reference.
std::vector<GenerationResult> serial(const GenerateRequest& request) {
  GptModel<float> model(scheduler_model_config());
  model.init_parameters(5);
  NullTokenizer tokenizer(63);
  std::vector<GenerationResult> results;
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    results.push_back(generate(model, tokenizer, request.prompts[i], request,
                               {.server_seed = 0, .request_number = 0, .prompt_index = i}));
  }
  return results;
}

void check_same(const std::vector<GenerationResult>& got,
                const std::vector<GenerationResult>& expected) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].tokens == expected[i].tokens);
    CHECK(got[i].prompt_length == expected[i].prompt_length);
    CHECK(got[i].text == expected[i].text);
    CHECK(got[i].segments == expected[i].segments);
    CHECK(got[i].logprobs == expected[i].logprobs);  // exactly: the same forwards
  }
}

GenerationOutcome wait(std::future<GenerationOutcome>& future) {
  REQUIRE(future.wait_for(60s) == std::future_status::ready);
  return future.get();
}

}  // namespace

TEST_CASE("requests from several threads get generate()'s results, one prompt at a time") {
  const std::vector<GenerateRequest> requests = {
      request_of({"4 8 15 16"}, 8, 1, true, 1),                  // greedy, logprobs
      request_of({"1 2 3", "40 41", "7"}, 6, 2, false),          // sampled, three prompts
      request_of({"9 9 9 9 9"}, 7, 3, true),                     // sampled, logprobs
      request_of({"23 42", "5 6 7 8 9 10"}, 0, 4, true),         // scoring only
      request_of({"11"}, 10, 5, false, 5),                       // top-k
      request_of({"30 31 32", "33"}, 5, 6, true, 1),
  };
  std::vector<std::vector<GenerationResult>> expected;
  for (const auto& request : requests) expected.push_back(serial(request));

  OracleStep oracle(4);
  NullTokenizer tokenizer(63);
  GenerationScheduler scheduler(shape(4, 64), step_of(oracle), tokenizer, {});
  std::vector<GenerationOutcome> outcomes(requests.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] {
      auto future = scheduler.submit(requests[i]);
      if (future.wait_for(60s) == std::future_status::ready) outcomes[i] = future.get();
      else outcomes[i].status = -1;
    });
  }
  for (auto& client : clients) client.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    CAPTURE(i);
    REQUIRE(outcomes[i].status == 200);
    check_same(outcomes[i].results, expected[i]);
  }
  // Scoring returns the prompt's log-probabilities and no new token.
  CHECK(outcomes[3].results[1].tokens.size() == 6);
  CHECK(outcomes[3].results[1].logprobs.size() == 5);
  CHECK(scheduler.statistics().requests_completed == std::ssize(requests));
}

TEST_CASE("a request admitted while another runs shares its steps (continuous batching)") {
  OracleStep oracle(2);
  NullTokenizer tokenizer(63);
  std::atomic<bool> second_submitted = false;
  // The first step (the first request's prefill) waits until the second request is queued.
  oracle.before_step = [&](int64_t step) {
    if (step != 1) return;
    for (int i = 0; i < 5000 && !second_submitted; ++i) std::this_thread::sleep_for(1ms);
  };
  GenerationScheduler scheduler(shape(2, 16), step_of(oracle), tokenizer, {});
  const GenerateRequest first = request_of({"4 8 15 16"}, 10, 1, true, 1);
  const GenerateRequest second = request_of({"3 1 4 1 5"}, 4, 2, true);
  auto first_future = scheduler.submit(first);
  std::this_thread::sleep_for(50ms);
  auto second_future = scheduler.submit(second);
  second_submitted = true;
  GenerationOutcome first_outcome = wait(first_future);
  GenerationOutcome second_outcome = wait(second_future);
  REQUIRE(first_outcome.status == 200);
  REQUIRE(second_outcome.status == 200);
  check_same(first_outcome.results, serial(first));
  check_same(second_outcome.results, serial(second));
  // Some step held the first request's decode row (slot 0) and the second's rows (slot 1).
  bool shared = false;
  for (const auto& rows : oracle.steps) {
    std::set<int32_t> slots;
    for (const auto& row : rows) slots.insert(row.slot);
    shared = shared || slots.size() == 2;
  }
  CHECK(shared);
  CHECK(scheduler.statistics().most_requests_in_one_step == 2);
}

TEST_CASE("a prompt longer than a step's rows is prefilled in chunks") {
  OracleStep oracle(2);
  NullTokenizer tokenizer(63);
  GenerationScheduler scheduler(shape(2, 2), step_of(oracle), tokenizer, {});
  const GenerateRequest request = request_of({"1 2 3 4 5 6 7", "8 9 10 11 12"}, 5, 7, true, 1);
  auto future = scheduler.submit(request);
  const GenerationOutcome outcome = wait(future);
  REQUIRE(outcome.status == 200);
  for (const auto& rows : oracle.steps) CHECK(rows.size() <= 2);
  // Chunks forward a shorter history than generate()'s one forward of the prompt: the same
  // tokens, and log-probabilities to float rounding.
  const auto expected = serial(request);
  REQUIRE(outcome.results.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CHECK(outcome.results[i].tokens == expected[i].tokens);
    CHECK(outcome.results[i].text == expected[i].text);
    REQUIRE(outcome.results[i].logprobs.size() == expected[i].logprobs.size());
    for (size_t j = 0; j < expected[i].logprobs.size(); ++j) {
      CHECK(outcome.results[i].logprobs[j] == doctest::Approx(expected[i].logprobs[j]).epsilon(1e-4));
    }
  }
}

TEST_CASE("beyond max_concurrent_requests a request is refused at once with 503") {
  OracleStep oracle(1);
  NullTokenizer tokenizer(63);
  StepGate gate(oracle);
  GenerationScheduler scheduler(shape(1, 8), step_of(oracle), tokenizer,
                                {.max_concurrent_requests = 2});
  auto first = scheduler.submit(request_of({"1 2"}, 3, 1, false));
  auto second = scheduler.submit(request_of({"3 4"}, 3, 1, false));  // queued: one slot
  auto third = scheduler.submit(request_of({"5 6"}, 3, 1, false));
  REQUIRE(third.wait_for(0s) == std::future_status::ready);
  const GenerationOutcome refused = third.get();
  CHECK(refused.status == 503);
  CHECK(refused.message.find("--max-concurrent-requests") != std::string::npos);
  gate.open = true;
  CHECK(wait(first).status == 200);
  CHECK(wait(second).status == 200);
  // With the queue drained, requests are taken again.
  auto fourth = scheduler.submit(request_of({"5 6"}, 3, 1, false));
  CHECK(wait(fourth).status == 200);
}

TEST_CASE("a refused or failing request does not disturb the others") {
  OracleStep oracle(2);
  NullTokenizer tokenizer(63);
  GenerationScheduler scheduler(shape(2, 16), step_of(oracle), tokenizer, {});
  const GenerateRequest good = request_of({"4 8 15 16", "2 3"}, 8, 3, true);
  auto good_future = scheduler.submit(good);
  // The length rule: 20 prompt tokens + 20 > 32.
  std::string long_prompt;
  for (int i = 0; i < 20; ++i) long_prompt += std::to_string(i) + " ";
  auto too_long = scheduler.submit(request_of({"1", long_prompt}, 20, 1, false));
  REQUIRE(too_long.wait_for(0s) == std::future_status::ready);
  const GenerationOutcome refused = too_long.get();
  CHECK(refused.status == 400);
  CHECK(refused.message.find("Length of prompt + tokens_to_generate longer than allowed") == 0);
  // top_k 64 is the whole vocabulary: refused when the first token is sampled, mid-flight.
  auto failing = scheduler.submit(request_of({"5 5", "6"}, 4, 1, false, 64));
  const GenerationOutcome failed = wait(failing);
  CHECK(failed.status == 400);
  CHECK(failed.message.find("top_k") != std::string::npos);
  const GenerationOutcome outcome = wait(good_future);
  REQUIRE(outcome.status == 200);
  check_same(outcome.results, serial(good));
}

TEST_CASE("stop() answers pending requests with 503 rather than hanging") {
  OracleStep oracle(1);
  NullTokenizer tokenizer(63);
  StepGate gate(oracle);
  GenerationScheduler scheduler(shape(1, 8), step_of(oracle), tokenizer, {});
  std::vector<std::future<GenerationOutcome>> futures;
  for (int i = 0; i < 3; ++i) futures.push_back(scheduler.submit(request_of({"1 2 3"}, 20, i, false)));
  std::thread stopper([&] { scheduler.stop(); });
  std::this_thread::sleep_for(20ms);
  gate.open = true;  // the step in flight finishes; no other starts
  stopper.join();
  for (auto& future : futures) {
    const GenerationOutcome outcome = wait(future);
    CHECK(outcome.status == 503);
    CHECK(outcome.message == "the server is shutting down");
  }
  auto late = scheduler.submit(request_of({"1"}, 1, 1, false));
  CHECK(wait(late).status == 503);
}

TEST_CASE("an abandoned request leaves its slot before the next step, and the others go on") {
  OracleStep oracle(1);
  NullTokenizer tokenizer(63);
  StepGate gate(oracle);
  GenerationScheduler scheduler(shape(1, 8), step_of(oracle), tokenizer, {});
  std::stop_source client;
  auto abandoned = scheduler.submit(request_of({"1 2"}, 20, 1, false), client.get_token());
  const GenerateRequest other = request_of({"3 4"}, 3, 1, false);
  auto queued = scheduler.submit(other);  // behind it: one slot
  gate.wait_for_a_step();
  client.request_stop();  // while its first step runs
  gate.open = true;
  const GenerationOutcome outcome = wait(abandoned);
  CHECK(outcome.status == 499);
  CHECK(outcome.message == "the client closed its connection");
  const GenerationOutcome served = wait(queued);
  REQUIRE(served.status == 200);
  check_same(served.results, serial(other));
  const SchedulerStatistics statistics = scheduler.statistics();
  CHECK(statistics.requests_abandoned == 1);
  CHECK(statistics.requests_completed == 1);
  // 20 tokens would have taken 20 steps; it had one, the other request the rest.
  std::lock_guard lock(oracle.mutex);
  REQUIRE(oracle.steps.size() >= 2);
  CHECK(oracle.steps[0].front().token == 1);
  CHECK(oracle.steps[1].front().token == 3);  // the next step is the other request's prompt
  CHECK(std::ssize(oracle.steps) < 20);
}

TEST_CASE("an abandoned queued request leaves the queue without running") {
  OracleStep oracle(1);
  NullTokenizer tokenizer(63);
  StepGate gate(oracle);
  GenerationScheduler scheduler(shape(1, 8), step_of(oracle), tokenizer,
                                {.max_concurrent_requests = 2});
  const GenerateRequest running = request_of({"1 2"}, 3, 1, false);
  auto first = scheduler.submit(running);
  std::stop_source client;
  auto queued = scheduler.submit(request_of({"5 5 5", "6"}, 4, 1, false), client.get_token());
  client.request_stop();
  gate.open = true;
  const GenerationOutcome outcome = wait(queued);
  CHECK(outcome.status == 499);
  const GenerationOutcome served = wait(first);
  REQUIRE(served.status == 200);
  check_same(served.results, serial(running));
  // Its place among max_concurrent_requests is free again: two more are taken.
  auto second = scheduler.submit(request_of({"7"}, 2, 1, false));
  auto third = scheduler.submit(request_of({"8"}, 2, 1, false));
  CHECK(wait(second).status == 200);
  CHECK(wait(third).status == 200);
  // No step ever held its prompts: every sequence's first row is at position 0.
  std::lock_guard lock(oracle.mutex);
  for (const auto& step : oracle.steps) {
    for (const DecodeRow& row : step) {
      if (row.position == 0) CHECK((row.token == 1 || row.token == 7 || row.token == 8));
    }
  }
  CHECK(scheduler.statistics().requests_abandoned == 1);
}

TEST_CASE("an answer callback is called once: at once for a refusal, from the worker for an answer") {
  OracleStep oracle(1);
  NullTokenizer tokenizer(63);
  GenerationScheduler scheduler(shape(1, 8), step_of(oracle), tokenizer, {});
  std::mutex mutex;
  std::vector<std::pair<int, std::thread::id>> answers;
  auto record = [&](GenerationOutcome outcome) {
    std::lock_guard lock(mutex);
    answers.emplace_back(outcome.status, std::this_thread::get_id());
  };
  scheduler.submit(request_of({}, 3, 1, false), {}, record);  // refused: no prompts
  {
    std::lock_guard lock(mutex);
    REQUIRE(answers.size() == 1);
    CHECK(answers[0].first == 400);
    CHECK(answers[0].second == std::this_thread::get_id());
  }
  scheduler.submit(request_of({"1 2"}, 3, 1, false), {}, record);
  for (int i = 0; i < 6000; ++i) {
    {
      std::lock_guard lock(mutex);
      if (answers.size() == 2) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(20ms);  // a second call, if there were one
  std::lock_guard lock(mutex);
  REQUIRE(answers.size() == 2);
  CHECK(answers[1].first == 200);
  CHECK(answers[1].second != std::this_thread::get_id());
}
