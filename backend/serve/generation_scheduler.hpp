// Continuous batching for the text generation server: many requests' prompts generated together
// by one model step (vLLM's and Orca's iteration-level scheduling, as Megatron core's dynamic
// inference engine does; facts only). Each prompt of a request is one sequence
// (GenerationSequence, generation.hpp: Megatron's rules for one prompt) in one slot of a
// KV-cache decoder (GptDecoder, model/gpt_decoder.hpp). One worker thread owns the step; each
// iteration it
//   1. admits waiting sequences (requests first come, first served; a request's prompts in
//      order) into free slots;
//   2. packs the step's rows, at most max_rows: one decode row (the last token) for every
//      sequence whose prompt is cached, then the prompt rows of sequences still prefilling, in
//      admission order, as many as the rows left allow (a long prompt is prefilled in chunks
//      over several steps). A row asks for logits only where they are read: the last token's
//      position, and the prompt's positions when the request asked for logprobs;
//   3. runs one step and hands each sequence its rows' logits (sampling, stop rules, logprobs);
//   4. retires finished sequences, freeing their slots, and fulfils a request when all its
//      prompts are done, with the results in prompt order (each prompt stops on its own, as in
//      Megatron's batch, where a finished prompt's later tokens are discarded).
// Requests are refused at once, without waiting: 400 for a request Megatron refuses (the length
// rule, an empty prompt; GenerationSequence's checks), 503 when max_concurrent_requests are
// already queued or running, or when the scheduler is stopping. A request that fails while
// running (sampling parameters refused for the model's vocabulary: 400; the step throws: 500)
// frees its slots and leaves the others running. A request whose submitter asks it to stop (the
// server's client closed its connection) leaves the queue or its slots before the next step and
// is answered 499, nginx's "client closed request", which nobody reads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "backend/data/tokenizer.hpp"
#include "backend/model/gpt_decoder.hpp"
#include "backend/serve/generate_request.hpp"
#include "backend/serve/generation.hpp"

namespace backend {

// The sizes of the step the scheduler drives (GptDecoder's).
struct DecodeStepShape {
  int64_t slots = 0;
  int64_t max_length = 0;  // tokens of one sequence: prompt + generated ≤ this
  int64_t max_rows = 0;    // rows of one step; ≥ slots, so that every sequence decodes each step
  int64_t padded_vocab_size = 0;
};

// One step over packed rows: writes padded_vocab_size logits for each row with `logits` set,
// in order (GptDecoder::step's contract).
using DecodeStep = std::function<void(std::span<const DecodeRow> rows, std::span<float> logits)>;

struct SchedulerOptions {
  int64_t max_concurrent_requests = 64;  // queued + running; beyond: 503
  uint64_t server_seed = 0;              // the draws of requests without random_seed
};

// A request's answer: the results of its prompts in order (status 200), or a refusal.
struct GenerationOutcome {
  int status = 200;  // 200, 400 refused, 503 busy or stopping, 500 internal, 499 abandoned
  std::string message;
  std::vector<GenerationResult> results;
};

struct SchedulerStatistics {
  int64_t steps = 0;
  int64_t rows = 0;
  int64_t most_requests_in_one_step = 0;  // the most different requests one step held
  int64_t requests_completed = 0;
  int64_t requests_abandoned = 0;  // stopped when their submitters asked (clients gone)
};

class GenerationScheduler {
 public:
  // `tokenizer` must outlive the scheduler; the scheduler serializes its use. common::Error for
  // sizes < 1 or max_rows < slots.
  GenerationScheduler(DecodeStepShape shape, DecodeStep step, Tokenizer& tokenizer,
                      SchedulerOptions options);
  ~GenerationScheduler();  // stop()
  GenerationScheduler(const GenerationScheduler&) = delete;
  GenerationScheduler& operator=(const GenerationScheduler&) = delete;

  // Queues a parsed request (parse_generate_request). Tokenizes and checks its prompts on the
  // caller's thread; a refusal comes back as an already fulfilled future. Once `abandon` is
  // asked to stop, the request is dropped before the next step and answered 499.
  std::future<GenerationOutcome> submit(const GenerateRequest& request,
                                        std::stop_token abandon = {});
  // The same, with the answer handed to `answer` instead of a future: called once, on the
  // caller's thread for a refusal at submission, else on the worker's, which it should not
  // hold up (the HTTP server hands the answer on to a thread of its own) nor call back into
  // the scheduler from.
  using AnswerCallback = std::function<void(GenerationOutcome)>;
  void submit(const GenerateRequest& request, std::stop_token abandon, AnswerCallback answer);

  // Stops the worker after its current step; every request not yet answered is answered 503
  // ("the server is shutting down"), and later submits too. Idempotent.
  void stop();

  SchedulerStatistics statistics() const;

 private:
  struct Request;
  struct Sequence;

  void run();
  void fail_request(Request& request, int status, const std::string& message);
  void abandon_request(Request& request);
  void finish_if_done(Request& request);

  DecodeStepShape shape_;
  DecodeStep step_;
  Tokenizer* tokenizer_;
  SchedulerOptions options_;

  std::mutex tokenizer_mutex_;
  mutable std::mutex mutex_;  // guards what follows
  std::condition_variable wake_;
  bool stopping_ = false;
  uint64_t next_request_number_ = 0;
  int64_t requests_in_flight_ = 0;
  std::deque<std::shared_ptr<Sequence>> waiting_;
  SchedulerStatistics statistics_;

  std::thread worker_;
};

}  // namespace backend
