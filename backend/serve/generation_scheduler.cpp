// Continuous batching of generation requests over one decoder step (generation_scheduler.hpp
// explains the iteration and the refusals).
#include "backend/serve/generation_scheduler.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "backend/common/error.hpp"

namespace backend {

struct GenerationScheduler::Request {
  AnswerCallback answer;
  std::vector<std::optional<GenerationResult>> results;
  int64_t remaining = 0;  // prompts not finished yet
  bool answered = false;  // the worker's, once submitted
  std::stop_token abandon;  // the submitter's: its client is gone
};

struct GenerationScheduler::Sequence {
  std::shared_ptr<Request> request;
  size_t prompt_index = 0;
  GenerationSequence generation;
  int32_t slot = -1;
  int64_t cached = 0;  // positions 0..cached−1 are in the slot's cache
};

namespace {

GenerationOutcome refusal(int status, std::string message) {
  GenerationOutcome outcome;
  outcome.status = status;
  outcome.message = std::move(message);
  return outcome;
}

}  // namespace

GenerationScheduler::GenerationScheduler(DecodeStepShape shape, DecodeStep step,
                                         Tokenizer& tokenizer, SchedulerOptions options)
    : shape_(shape), step_(std::move(step)), tokenizer_(&tokenizer), options_(options) {
  if (shape.slots < 1 || shape.max_length < 1 || shape.max_rows < 1 ||
      shape.padded_vocab_size < 1) {
    common::fail("the generation scheduler needs slots ({}), max_length ({}), max_rows ({}) and "
                 "padded_vocab_size ({}) ≥ 1",
                 shape.slots, shape.max_length, shape.max_rows, shape.padded_vocab_size);
  }
  if (shape.max_rows < shape.slots) {
    common::fail("the generation scheduler needs max_rows ({}) ≥ slots ({}), so that every "
                 "running sequence decodes in each step", shape.max_rows, shape.slots);
  }
  if (options.max_concurrent_requests < 1) {
    common::fail("max_concurrent_requests {} must be ≥ 1", options.max_concurrent_requests);
  }
  try {
    worker_ = std::thread([this] { run(); });
  } catch (const std::system_error& error) {
    common::fail("the generation scheduler cannot start its worker thread: {}", error.what());
  }
}

GenerationScheduler::~GenerationScheduler() { stop(); }

void GenerationScheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

SchedulerStatistics GenerationScheduler::statistics() const {
  std::lock_guard lock(mutex_);
  return statistics_;
}

std::future<GenerationOutcome> GenerationScheduler::submit(const GenerateRequest& request,
                                                           std::stop_token abandon) {
  // Shared: AnswerCallback, a std::function, must be copyable.
  auto promise = std::make_shared<std::promise<GenerationOutcome>>();
  std::future<GenerationOutcome> future = promise->get_future();
  submit(request, std::move(abandon),
         [promise](GenerationOutcome outcome) { promise->set_value(std::move(outcome)); });
  return future;
}

void GenerationScheduler::submit(const GenerateRequest& request, std::stop_token abandon,
                                 AnswerCallback answer) {
  uint64_t request_number = 0;
  std::optional<GenerationOutcome> refused;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      refused = refusal(503, "the server is shutting down");
    } else if (requests_in_flight_ >= options_.max_concurrent_requests) {
      refused = refusal(
          503, fmt::format("the server is busy: {} requests are queued or running, its limit "
                           "(--max-concurrent-requests); try again later",
                           requests_in_flight_));
    } else {
      ++requests_in_flight_;
      request_number = next_request_number_++;
    }
  }
  // Answered outside the lock.
  if (refused) {
    answer(std::move(*refused));
    return;
  }
  auto release = [&](GenerationOutcome outcome) {
    {
      std::lock_guard lock(mutex_);
      --requests_in_flight_;
    }
    answer(std::move(outcome));
  };
  if (request.prompts.empty()) return release(refusal(400, "prompts is empty"));

  auto shared = std::make_shared<Request>();
  shared->results.resize(request.prompts.size());
  shared->remaining = std::ssize(request.prompts);
  shared->abandon = std::move(abandon);
  std::vector<std::shared_ptr<Sequence>> sequences;
  // Each sequence keeps the request's settings; one copy of the prompts is enough.
  GenerateRequest settings = request;
  settings.prompts.clear();
  try {
    std::lock_guard lock(tokenizer_mutex_);
    for (size_t i = 0; i < request.prompts.size(); ++i) {
      const GenerationOptions generation_options{.server_seed = options_.server_seed,
                                                 .request_number = request_number,
                                                 .prompt_index = i};
      sequences.push_back(std::make_shared<Sequence>(Sequence{
          .request = shared,
          .prompt_index = i,
          .generation = GenerationSequence(*tokenizer_, shape_.max_length, request.prompts[i],
                                           settings, generation_options)}));
    }
  } catch (const common::Error& error) {
    return release(refusal(400, error.what()));
  } catch (const std::exception& error) {
    return release(refusal(500, fmt::format("internal error: {}", error.what())));
  }
  bool queued = false;
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      // Set before the worker can see the request.
      shared->answer = std::move(answer);
      for (auto& sequence : sequences) waiting_.push_back(std::move(sequence));
      queued = true;
    }
  }
  if (queued) {
    wake_.notify_all();
    return;
  }
  // Stopped meanwhile: nobody else will answer it.
  release(refusal(503, "the server is shutting down"));
}

void GenerationScheduler::fail_request(Request& request, int status, const std::string& message) {
  if (request.answered) return;
  request.answered = true;
  {
    std::lock_guard lock(mutex_);
    --requests_in_flight_;
  }
  request.answer(refusal(status, message));
}

void GenerationScheduler::abandon_request(Request& request) {
  if (request.answered) return;
  {
    std::lock_guard lock(mutex_);
    ++statistics_.requests_abandoned;
  }
  fail_request(request, 499, "the client closed its connection");
}

void GenerationScheduler::finish_if_done(Request& request) {
  if (request.answered || request.remaining > 0) return;
  GenerationOutcome outcome;
  outcome.results.reserve(request.results.size());
  for (auto& result : request.results) outcome.results.push_back(std::move(*result));
  request.answered = true;
  {
    // Before the answer, so that whoever waits on it sees the counts that include it.
    std::lock_guard lock(mutex_);
    --requests_in_flight_;
    ++statistics_.requests_completed;
  }
  request.answer(std::move(outcome));
}

void GenerationScheduler::run() {
  std::vector<std::shared_ptr<Sequence>> running;  // in admission order
  std::vector<int32_t> free_slots;
  for (int64_t slot = shape_.slots - 1; slot >= 0; --slot) {
    free_slots.push_back(static_cast<int32_t>(slot));
  }
  std::vector<DecodeRow> rows;
  std::vector<Sequence*> row_owners;
  std::vector<float> logits;
  const auto vocabulary = static_cast<size_t>(shape_.padded_vocab_size);

  auto retire = [&](size_t index) {
    free_slots.push_back(running[index]->slot);
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(index));
  };

  std::vector<std::shared_ptr<Sequence>> abandoned_waiting;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running.empty(); });
      if (stopping_) break;
      // Requests whose clients left while they were queued: out of the queue, answered below
      // (outside the lock, which answering takes).
      std::erase_if(waiting_, [&](const std::shared_ptr<Sequence>& sequence) {
        if (!sequence->request->abandon.stop_requested()) return false;
        abandoned_waiting.push_back(sequence);
        return true;
      });
      while (!waiting_.empty() && !free_slots.empty()) {
        std::shared_ptr<Sequence> sequence = std::move(waiting_.front());
        waiting_.pop_front();
        if (sequence->request->answered) continue;  // its request failed meanwhile
        sequence->slot = free_slots.back();
        free_slots.pop_back();
        running.push_back(std::move(sequence));
      }
    }
    for (auto& sequence : abandoned_waiting) abandon_request(*sequence->request);
    abandoned_waiting.clear();
    // Requests whose clients left while they ran give their slots back before the step.
    for (int64_t back = std::ssize(running) - 1; back >= 0; --back) {
      Request& request = *running[static_cast<size_t>(back)]->request;
      if (request.abandon.stop_requested()) abandon_request(request);
      if (request.answered) retire(static_cast<size_t>(back));
    }
    if (running.empty()) continue;

    // The rows: decode rows first (one per sequence whose prompt is cached), then prompt rows.
    rows.clear();
    row_owners.clear();
    int64_t budget = shape_.max_rows;
    auto add_row = [&](Sequence& sequence, int64_t position) {
      const GenerationSequence& generation = sequence.generation;
      const bool last = position == std::ssize(generation.tokens()) - 1;
      const bool wanted = (last && !generation.finished()) ||
                          (generation.prompt_logits_wanted() &&
                           position + 1 < generation.prompt_length());
      rows.push_back(DecodeRow{.token = generation.tokens()[static_cast<size_t>(position)],
                               .position = static_cast<int32_t>(position),
                               .slot = sequence.slot,
                               .logits = wanted});
      row_owners.push_back(&sequence);
      --budget;
    };
    for (auto& sequence : running) {
      if (sequence->cached >= sequence->generation.prompt_length()) {
        add_row(*sequence, sequence->cached);
      }
    }
    for (auto& sequence : running) {
      const int64_t end = std::ssize(sequence->generation.tokens());
      for (int64_t position = sequence->cached;
           sequence->cached < sequence->generation.prompt_length() && position < end &&
           budget > 0;
           ++position) {
        add_row(*sequence, position);
      }
    }
    const auto wanted_rows = static_cast<size_t>(
        std::count_if(rows.begin(), rows.end(), [](const DecodeRow& row) { return row.logits; }));
    logits.resize(wanted_rows * vocabulary);

    {
      std::vector<const Request*> requests;
      for (const Sequence* owner : row_owners) requests.push_back(owner->request.get());
      std::sort(requests.begin(), requests.end());
      const auto distinct = std::unique(requests.begin(), requests.end()) - requests.begin();
      std::lock_guard lock(mutex_);
      ++statistics_.steps;
      statistics_.rows += std::ssize(rows);
      statistics_.most_requests_in_one_step =
          std::max<int64_t>(statistics_.most_requests_in_one_step, distinct);
    }

    try {
      step_(rows, logits);
    } catch (const std::exception& error) {
      // The caches of the step's slots are in doubt: every running request fails.
      const std::string message = fmt::format("internal error in the model step: {}", error.what());
      for (auto& sequence : running) fail_request(*sequence->request, 500, message);
      while (!running.empty()) retire(running.size() - 1);
      continue;
    }

    size_t logits_row = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      Sequence& sequence = *row_owners[i];
      const int64_t position = rows[i].position;
      sequence.cached = std::max<int64_t>(sequence.cached, position + 1);
      if (!rows[i].logits) continue;
      const std::span<float> row_logits(logits.data() + logits_row * vocabulary, vocabulary);
      ++logits_row;
      if (sequence.request->answered) continue;
      GenerationSequence& generation = sequence.generation;
      try {
        if (position + 1 < generation.prompt_length()) {
          generation.accept_prompt_logits(position, row_logits);
        }
        if (position == std::ssize(generation.tokens()) - 1 && !generation.finished()) {
          generation.accept_logits(row_logits);
        }
      } catch (const common::Error& error) {
        fail_request(*sequence.request, 400, error.what());
      } catch (const std::exception& error) {
        fail_request(*sequence.request, 500, fmt::format("internal error: {}", error.what()));
      }
    }

    // From the back, so that retiring (an erase) moves none of the sequences still to visit; a signed
    // index, since `index-- > 0` wraps past 0 as the loop ends (the integer sanitizer's report).
    for (int64_t back = std::ssize(running) - 1; back >= 0; --back) {
      const auto index = static_cast<size_t>(back);
      Sequence& sequence = *running[index];
      // Held here: retiring the request's last sequence would release it.
      const std::shared_ptr<Request> held = sequence.request;
      Request& request = *held;
      if (request.answered) {
        retire(index);
        continue;
      }
      const GenerationSequence& generation = sequence.generation;
      if (!generation.finished() || sequence.cached < generation.prompt_length()) continue;
      try {
        std::lock_guard lock(tokenizer_mutex_);
        request.results[sequence.prompt_index] = generation.result();
        --request.remaining;
      } catch (const std::exception& error) {
        fail_request(request, 500, fmt::format("internal error: {}", error.what()));
      }
      retire(index);
      finish_if_done(request);
    }
  }

  // Stopping: whatever is not answered yet is answered now.
  std::deque<std::shared_ptr<Sequence>> waiting;
  {
    std::lock_guard lock(mutex_);
    waiting.swap(waiting_);
  }
  for (auto& sequence : running) fail_request(*sequence->request, 503, "the server is shutting down");
  for (auto& sequence : waiting) fail_request(*sequence->request, 503, "the server is shutting down");
}

}  // namespace backend
