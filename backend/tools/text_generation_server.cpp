// text_generation_server: Megatron-LM's text generation server (tools/run_text_generation_server.py
// with megatron/inference/text_generation_server.py; facts only), native. Reads pretrain_gpt's
// model, tokenizer, device and --load flags (the same parser, backend/train/arguments.hpp, with
// --use-checkpoint-args) and the server's flags, loads the checkpoint's weights and answers
// `PUT /api` with Megatron's body and response:
//   request   {"prompts": [...], "tokens_to_generate": N, ...}  (serve/generate_request.hpp)
//   response  {"logprobs": [[...]] (only when asked), "segments": [[...]], "text": [...]}
// as Flask's jsonify writes it: keys sorted, compact, non-ASCII as \uXXXX, a final newline.
// Refusals are 400 with {"message": ...} (generate_request.hpp says how this differs from
// Megatron), a full server 503, other paths 404 and other methods on /api 405.
//
// Unlike Megatron's server, which holds a lock around each request so that requests run one
// after another, requests are generated together: a GenerationScheduler (serve/
// generation_scheduler.hpp) batches every running prompt into each step of a KV-cache decoder
// (model/gpt_decoder.hpp), admitting new requests between steps (continuous batching). The HTTP
// server (serve/http_server.hpp) reads and writes every connection on one event-loop thread
// with bounds on each request (header bytes and fields, body bytes however framed, one deadline
// for the whole request) and on open connections, so that no client holds more than its own
// connection; a client that closes its connection while it waits has its request stopped.
// SIGTERM or SIGINT stops accepting, answers what is pending with 503 and exits 0 (before the
// server listens, at once). docs/serving.md describes the tool. A user error at startup is one
// clear line and exit status 2, as pretrain_gpt's.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/logging.hpp"
#include "backend/common/tool_main.hpp"
#include "backend/data/tokenizer.hpp"
#include "backend/model/gpt_decoder.hpp"
#include "backend/serve/generate_request.hpp"
#include "backend/serve/generation_scheduler.hpp"
#include "backend/serve/http_server.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trained_model.hpp"
#include "backend/train/trainer.hpp"

namespace {

using backend::TrainingArguments;

// Rows of one step beyond the batch's decode rows: a long prompt is prefilled in chunks of this
// many tokens, so that it does not stall the running sequences for its whole length.
constexpr int64_t kPrefillRowsPerStep = 512;
// Open connections beyond --max-concurrent-requests: for clients that are still sending their
// requests, idle between keep-alive requests, or refused (503) by the scheduler. Beyond them a
// new connection is answered 503 and closed by the HTTP server.
constexpr int64_t kSpareConnections = 256;
// Descriptors kept for everything else (the checkpoint's files, the listener, epoll, ...).
constexpr int64_t kReservedDescriptors = 64;
// The HTTP server's handler threads: they parse requests and tokenize their prompts (on
// submission) and write the JSON of answers; waiting takes none.
constexpr int kHandlerThreads = 4;

// Flask's jsonify: sorted keys (nlohmann's objects are ordered by key), compact, ASCII only,
// a final newline.
std::string flask_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) + "\n";
}

backend::HttpResponse message_response(int status, const std::string& message) {
  return backend::HttpResponse{.status = status,
                               .content_type = "application/json",
                               .headers = {},
                               .body = flask_json({{"message", message}})};
}

nlohmann::json response_body(const backend::GenerateRequest& request,
                             const std::vector<backend::GenerationResult>& results) {
  nlohmann::json text = nlohmann::json::array();
  nlohmann::json segments = nlohmann::json::array();
  nlohmann::json logprobs = nlohmann::json::array();
  for (const auto& result : results) {
    text.push_back(result.text);
    segments.push_back(result.segments);
    logprobs.push_back(result.logprobs);
  }
  nlohmann::json body = {{"text", std::move(text)}, {"segments", std::move(segments)}};
  if (request.logprobs) body["logprobs"] = std::move(logprobs);
  return body;
}

int64_t token_count(const std::vector<backend::GenerationResult>& results) {
  int64_t count = 0;
  for (const auto& result : results) count += std::ssize(result.tokens) - result.prompt_length;
  return count;
}

const char* signal_name(int signal_number) {
  return signal_number == SIGINT ? "SIGINT" : "SIGTERM";
}

// SIGINT and SIGTERM are blocked in every thread (main blocks them before any thread starts)
// and taken here by sigwait. Before the server serves (while the checkpoint loads) a signal
// ends the process at once: there is nothing to answer and nothing written.
class SignalWaiter {
 public:
  explicit SignalWaiter(sigset_t signals) : signals_(signals) {
    try {
      thread_ = std::thread([this] {
        int signal_number = 0;
        sigwait(&signals_, &signal_number);
        if (signal_number == SIGUSR1) return;  // our own wake-up at exit
        received_ = signal_number;
        if (!serving_) {
          spdlog::info("stopped on {} before serving", signal_name(signal_number));
          spdlog::default_logger()->flush();
          std::cout.flush();
          std::_Exit(0);
        }
      });
    } catch (const std::system_error& error) {
      common::fail("text_generation_server cannot start its signal thread: {}", error.what());
    }
  }
  ~SignalWaiter() {
    if (received_ == 0) pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }
  int received() const { return received_; }
  // From here on a signal is the server's to act on (received()).
  void serving() { serving_ = true; }

 private:
  sigset_t signals_;
  std::atomic<int> received_ = 0;
  std::atomic<bool> serving_ = false;
  std::thread thread_;
};

// The open connections the server allows: --max-concurrent-requests and the spare ones, within
// this process's descriptor limit, whose soft value is raised to the hard one when it is short
// (as Go's runtime and nginx's worker_rlimit_nofile do).
int64_t connection_limit(int64_t max_concurrent_requests) {
  const int64_t wanted = max_concurrent_requests + kSpareConnections;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return wanted;
  const auto needed = static_cast<rlim_t>(wanted + kReservedDescriptors);
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < needed) {
    const rlim_t raised =
        limit.rlim_max == RLIM_INFINITY ? needed : std::min(needed, limit.rlim_max);
    if (raised > limit.rlim_cur) {
      rlimit wider = limit;
      wider.rlim_cur = raised;
      if (setrlimit(RLIMIT_NOFILE, &wider) == 0) limit = wider;
    }
  }
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed) return wanted;
  const int64_t fitting =
      std::max<int64_t>(static_cast<int64_t>(limit.rlim_cur) - kReservedDescriptors, 16);
  spdlog::warn("the descriptor limit (ulimit -n {}) allows {} open connections, not {}",
               static_cast<int64_t>(limit.rlim_cur), fitting, wanted);
  return fitting;
}

int run(const TrainingArguments& arguments, SignalWaiter& signals) {
  backend::check_whole_model_launch(arguments, "text_generation_server");
  auto tokenizer = backend::build_tokenizer(arguments.tokenizer);
  const backend::SelectedDevice selected = backend::select_device(arguments);
  backend::GptModel<float> model =
      backend::load_trained_model(arguments, selected, "text_generation_server");
  const backend::GptConfig& config = model.config();
  if (tokenizer->vocab_size() > config.vocab_size) {
    common::fail("the tokenizer's {} ids do not fit the model's vocabulary of {} (vocab_size)",
                 tokenizer->vocab_size(), config.vocab_size);
  }
  const int64_t slots = arguments.serving.max_batch_size;
  const int64_t max_length = config.max_position_embeddings;
  const int64_t max_rows = slots + std::min(kPrefillRowsPerStep, max_length);
  backend::GptDecoder decoder(model, slots, max_length, max_rows);
  spdlog::info("KV cache: {} slots of {} tokens, {:.1f} MiB; steps of up to {} rows", slots,
               max_length, static_cast<double>(decoder.cache_bytes()) / (1 << 20), max_rows);
  backend::GenerationScheduler scheduler(
      {.slots = slots,
       .max_length = max_length,
       .max_rows = max_rows,
       .padded_vocab_size = decoder.padded_vocab_size()},
      [&decoder](std::span<const backend::DecodeRow> rows, std::span<float> logits) {
        decoder.step(rows, logits);
      },
      *tokenizer,
      {.max_concurrent_requests = arguments.serving.max_concurrent_requests,
       .server_seed = static_cast<uint64_t>(arguments.run.seed)});
  const backend::GenerateLimits limits{.max_prompts = 128,
                                       .max_tokens_to_generate = arguments.serving.max_tokens_to_generate,
                                       .max_prompt_bytes = arguments.serving.max_prompt_bytes};

  // PUT /api on a handler thread: parse, submit (which tokenizes), and answer when the scheduler
  // does, from a handler thread again; nothing waits meanwhile.
  auto handle = [&scheduler, &limits](backend::HttpRequest http_request,
                                      backend::HttpResponder responder) {
    if (http_request.path != "/api") {
      responder.respond(message_response(
          404, fmt::format("{} {}: not found; the server answers PUT /api", http_request.method,
                           http_request.path)));
      return;
    }
    if (http_request.method != "PUT") {
      backend::HttpResponse response = message_response(405, "/api takes PUT only");
      response.headers.push_back({"Allow", "PUT"});
      responder.respond(std::move(response));
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    auto parsed = backend::parse_generate_request(http_request.body, limits);
    if (const auto* refusal = std::get_if<backend::RequestRefusal>(&parsed)) {
      responder.respond(message_response(refusal->status, refusal->message));
      spdlog::info("request from {}: {} {}", http_request.remote_address, refusal->status,
                   refusal->message);
      return;
    }
    auto request = std::make_shared<const backend::GenerateRequest>(
        std::move(std::get<backend::GenerateRequest>(parsed)));
    // A client that closes its connection while it waits gives its slots back (client_gone):
    // nobody would read the answer.
    scheduler.submit(*request, responder.client_gone(),
                     [responder, request, start, remote = http_request.remote_address](
                         backend::GenerationOutcome outcome) {
      auto answer = std::make_shared<backend::GenerationOutcome>(std::move(outcome));
      responder.respond_with([request, start, remote, answer] {
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (!request->no_log) {
          if (answer->status == 200) {
            spdlog::info("request from {}: 200, {} prompts, {} tokens generated in {:.3f} s",
                         remote, request->prompts.size(), token_count(answer->results), seconds);
          } else {
            spdlog::info("request from {}: {} {}", remote, answer->status, answer->message);
          }
        }
        if (answer->status != 200) return message_response(answer->status, answer->message);
        return backend::HttpResponse{.status = 200,
                                     .content_type = "application/json",
                                     .headers = {},
                                     .body = flask_json(response_body(*request, answer->results))};
      });
    });
  };

  const auto timeout = std::chrono::seconds(arguments.serving.socket_timeout);
  const int64_t max_connections = connection_limit(arguments.serving.max_concurrent_requests);
  std::unique_ptr<backend::HttpServer> server;
  try {
    server = std::make_unique<backend::HttpServer>(
        backend::HttpServerOptions{
            .host = arguments.serving.host,
            .port = static_cast<int>(arguments.serving.port),
            .max_body_bytes = arguments.serving.max_request_bytes,
            .body_too_large_message =
                fmt::format("the request body is larger than --max-request-bytes {}",
                            arguments.serving.max_request_bytes),
            .request_timeout = timeout,
            .write_timeout = timeout,
            .idle_timeout = std::chrono::seconds(2),
            .max_connections = max_connections,
            .handler_threads = kHandlerThreads,
            .error_response = message_response},
        handle);
  } catch (const common::Error& error) {
    if (!std::string_view(error.what()).starts_with("cannot listen")) throw;
    common::fail("--host {} --port {}: {}", arguments.serving.host, arguments.serving.port, error.what());
  }
  // The signal thread only records; this one acts on it: first the scheduler stops, answering
  // the requests in flight with 503, then the server, which writes those answers and returns.
  std::atomic<bool> done = false;
  std::thread stopper;
  try {
    stopper = std::thread([&] {
      while (!done) {
        if (signals.received() != 0) {
          scheduler.stop();
          server->stop();
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  } catch (const std::system_error& error) {
    common::fail("text_generation_server cannot start its stopping thread: {}", error.what());
  }
  // The line the CLI's users and the tests look for.
  std::cout << fmt::format("serving on http://{}:{}/api", arguments.serving.host, server->port())
            << std::endl;
  spdlog::info("at most {} open connections; each request must arrive whole within {} s",
               max_connections, arguments.serving.socket_timeout);
  signals.serving();

  try {
    server->run();
  } catch (...) {
    done = true;
    stopper.join();
    throw;
  }
  done = true;
  stopper.join();
  scheduler.stop();
  const backend::SchedulerStatistics statistics = scheduler.statistics();
  spdlog::info("stopped on {} after {} requests ({} model steps{})",
               signal_name(signals.received()), statistics.requests_completed, statistics.steps,
               statistics.requests_abandoned == 0
                   ? std::string()
                   : fmt::format("; {} abandoned by their clients", statistics.requests_abandoned));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread starts (OpenMP's included), so that they all inherit the mask and the
  // signals reach SignalWaiter only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A client that closes its connection early must not end the server.
  signal(SIGPIPE, SIG_IGN);
  common::setup_logging("text_generation_server");
  return common::run_tool([&] {
    SignalWaiter waiter(signals);
    auto arguments = backend::parse_arguments(argc, argv,
                                              backend::ArgumentsProgram::text_generation_server);
    if (!arguments) return 0;  // --help
    for (const auto& line : backend::format_arguments(*arguments)) std::cout << line << '\n';
    return run(*arguments, waiter);
  });
}
