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
// (model/gpt_decoder.hpp), admitting new requests between steps (continuous batching). HTTP
// threads only parse, wait and write, with read/write timeouts, so a slow client holds its own
// connection and nothing else, and a client that closes its connection while it waits has its
// request stopped (serve/client_connection.hpp). SIGTERM or SIGINT stops accepting, answers what
// is pending with 503 and exits 0. docs/serving.md describes the tool. A user error at startup
// is one clear line and exit status 2, as pretrain_gpt's.
#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/logging.hpp"
#include "backend/common/tool_main.hpp"
#include "backend/data/tokenizer.hpp"
#include "backend/model/gpt_decoder.hpp"
#include "backend/serve/client_connection.hpp"
#include "backend/serve/generate_request.hpp"
#include "backend/serve/generation_scheduler.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trained_model.hpp"
#include "backend/train/trainer.hpp"

namespace {

using backend::TrainingArguments;

// Rows of one step beyond the batch's decode rows: a long prompt is prefilled in chunks of this
// many tokens, so that it does not stall the running sequences for its whole length.
constexpr int64_t kPrefillRowsPerStep = 512;
// HTTP threads beyond --max-concurrent-requests: for the connections that are refused (503) or
// idle between keep-alive requests.
constexpr int64_t kSpareHttpThreads = 8;
// How often a waiting request's HTTP thread looks whether its client has gone. The answer itself
// is not delayed by it: the wait ends as soon as the answer is ready.
constexpr std::chrono::milliseconds kClientPollInterval{50};

// Flask's jsonify: sorted keys (nlohmann's objects are ordered by key), compact, ASCII only,
// a final newline.
std::string flask_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) + "\n";
}

void send_message(httplib::Response& response, int status, const std::string& message) {
  response.status = status;
  response.set_content(flask_json({{"message", message}}), "application/json");
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

// SIGINT and SIGTERM are blocked in every thread (main blocks them before any thread starts)
// and taken here by sigwait.
class SignalWaiter {
 public:
  explicit SignalWaiter(sigset_t signals) : signals_(signals) {
    thread_ = std::thread([this] {
      int signal_number = 0;
      sigwait(&signals_, &signal_number);
      if (signal_number == SIGUSR1) return;  // our own wake-up at exit
      received_ = signal_number;
    });
  }
  ~SignalWaiter() {
    if (received_ == 0) pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }
  int received() const { return received_; }

 private:
  sigset_t signals_;
  std::atomic<int> received_ = 0;
  std::thread thread_;
};

int run(const TrainingArguments& arguments, const SignalWaiter& signals) {
  backend::check_whole_model_launch(arguments, "text_generation_server");
  auto tokenizer = backend::build_tokenizer({.tokenizer_type = arguments.tokenizer_type,
                                             .vocab_file = arguments.vocab_file,
                                             .merge_file = arguments.merge_file,
                                             .vocab_size = arguments.vocab_size,
                                             .tokenizer_model = arguments.tokenizer_model});
  const backend::SelectedDevice selected = backend::select_device(arguments);
  backend::GptModel<float> model =
      backend::load_trained_model(arguments, selected, "text_generation_server");
  const backend::GptConfig& config = model.config();
  if (tokenizer->vocab_size() > config.vocab_size) {
    common::fail("the tokenizer's {} ids do not fit the model's vocabulary of {} (vocab_size)",
                 tokenizer->vocab_size(), config.vocab_size);
  }
  const int64_t slots = arguments.max_batch_size;
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
      {.max_concurrent_requests = arguments.max_concurrent_requests,
       .server_seed = static_cast<uint64_t>(arguments.seed)});
  const backend::GenerateLimits limits{.max_prompts = 128,
                                       .max_tokens_to_generate = arguments.max_tokens_to_generate,
                                       .max_prompt_bytes = arguments.max_prompt_bytes};

  httplib::Server server;
  const auto http_threads =
      static_cast<size_t>(arguments.max_concurrent_requests + kSpareHttpThreads);
  server.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
  // A client that stops sending or reading is cut off after --socket-timeout seconds, and holds
  // only its own HTTP thread meanwhile.
  server.set_read_timeout(static_cast<time_t>(arguments.socket_timeout), 0);
  server.set_write_timeout(static_cast<time_t>(arguments.socket_timeout), 0);
  // Idle keep-alive connections hold an HTTP thread; not for long.
  server.set_keep_alive_timeout(2);
  server.set_payload_max_length(static_cast<size_t>(arguments.max_request_bytes));

  server.Put("/api", [&](const httplib::Request& http_request, httplib::Response& response) {
    const auto start = std::chrono::steady_clock::now();
    auto parsed = backend::parse_generate_request(http_request.body, limits);
    if (const auto* refusal = std::get_if<backend::RequestRefusal>(&parsed)) {
      send_message(response, refusal->status, refusal->message);
      spdlog::info("request from {}: {} {}", http_request.remote_addr, refusal->status,
                   refusal->message);
      return;
    }
    const backend::GenerateRequest& request = std::get<backend::GenerateRequest>(parsed);
    std::stop_source abandon;
    std::future<backend::GenerationOutcome> future = scheduler.submit(request, abandon.get_token());
    // A client that closes its connection while it waits gives its slots back (at most
    // kClientPollInterval later): nobody would read the answer.
    backend::ClientWatch client({.local_address = http_request.local_addr,
                                 .local_port = http_request.local_port,
                                 .remote_address = http_request.remote_addr,
                                 .remote_port = http_request.remote_port});
    while (future.wait_for(kClientPollInterval) != std::future_status::ready) {
      if (!abandon.stop_requested() && client.client_has_closed()) abandon.request_stop();
    }
    backend::GenerationOutcome outcome = future.get();
    if (outcome.status != 200) {
      send_message(response, outcome.status, outcome.message);
    } else {
      response.status = 200;
      response.set_content(flask_json(response_body(request, outcome.results)),
                           "application/json");
    }
    if (!request.no_log) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (outcome.status == 200) {
        spdlog::info("request from {}: 200, {} prompts, {} tokens generated in {:.3f} s",
                     http_request.remote_addr, request.prompts.size(),
                     token_count(outcome.results), seconds);
      } else {
        spdlog::info("request from {}: {} {}", http_request.remote_addr, outcome.status,
                     outcome.message);
      }
    }
  });
  auto method_not_allowed = [](const httplib::Request&, httplib::Response& response) {
    response.set_header("Allow", "PUT");
    send_message(response, 405, "/api takes PUT only");
  };
  server.Get("/api", method_not_allowed);
  server.Post("/api", method_not_allowed);
  server.Delete("/api", method_not_allowed);
  server.Patch("/api", method_not_allowed);
  server.Options("/api", method_not_allowed);
  const int64_t max_request_bytes = arguments.max_request_bytes;
  server.set_error_handler(httplib::Server::HandlerWithResponse(
      [max_request_bytes](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (response.status == 413) {
      // A body over --max-request-bytes (httplib reads and drops it): a refusal like any other.
      send_message(response, 400,
                   fmt::format("the request body is larger than --max-request-bytes {}",
                               max_request_bytes));
    } else if (response.status == 404) {
      send_message(response, 404,
                   fmt::format("{} {}: not found; the server answers PUT /api", request.method,
                               request.path));
    } else {
      send_message(response, response.status,
                   fmt::format("{} {}: bad request", request.method, request.path));
    }
    return httplib::Server::HandlerResponse::Handled;
  }));

  const int port = arguments.port == 0
                       ? server.bind_to_any_port(arguments.host)
                       : (server.bind_to_port(arguments.host, static_cast<int>(arguments.port))
                              ? static_cast<int>(arguments.port)
                              : -1);
  if (port < 0) {
    common::fail("--host {} --port {}: cannot listen there (in use, or not an address of this "
                 "machine)", arguments.host, arguments.port);
  }
  // The line the CLI's users and the tests look for.
  std::cout << fmt::format("serving on http://{}:{}/api", arguments.host, port) << std::endl;

  // The signal thread only records; this one acts on it: first the scheduler stops, answering
  // the requests in flight with 503 so that their HTTP threads finish, then the server (which
  // joins its threads), once it is listening.
  std::atomic<bool> listening_done = false;
  std::thread stopper([&] {
    bool scheduler_stopped = false;
    while (!listening_done) {
      if (signals.received() != 0) {
        if (!scheduler_stopped) scheduler.stop();
        scheduler_stopped = true;
        if (server.is_running()) {
          server.stop();
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const bool listened = server.listen_after_bind();
  listening_done = true;
  stopper.join();
  scheduler.stop();
  if (signals.received() == 0 && !listened) {
    common::fail("the server stopped listening on {}:{} on its own", arguments.host, port);
  }
  const backend::SchedulerStatistics statistics = scheduler.statistics();
  spdlog::info("stopped on {} after {} requests ({} model steps{})",
               signals.received() == SIGINT ? "SIGINT" : "SIGTERM", statistics.requests_completed,
               statistics.steps,
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
  SignalWaiter waiter(signals);
  return common::run_tool([&] {
    auto arguments = backend::parse_arguments(argc, argv,
                                              backend::ArgumentsProgram::text_generation_server);
    if (!arguments) return 0;  // --help
    for (const auto& line : backend::format_arguments(*arguments)) std::cout << line << '\n';
    return run(*arguments, waiter);
  });
}
