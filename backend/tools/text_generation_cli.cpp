// text_generation_cli: Megatron-LM's tools/text_generation_cli.py (facts only), native. The one
// argument is the server's host:port; then, until the end of standard input:
//   Enter prompt: <a line>
//   Enter number of tokens to generate: <an integer>
// PUT http://host:port/api {"prompts": [prompt], "tokens_to_generate": N}, and prints
// "Megatron Response: " and the first text on the next line, or "Error <status>: <message>"
// (Megatron's strings, word for word). Megatron reads the number with Python's
// ast.literal_eval and ends with a traceback on anything else; here an entry that is not an
// integer is said so and asked again. A server that cannot be reached is one line and exit 1;
// the end of input exits 0. --version prints the project's version, as every tool's.
#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <charconv>
#include <iostream>
#include <string>

namespace {

bool read_line(const char* question, std::string& line) {
  std::cout << question << std::flush;
  if (!std::getline(std::cin, line)) {
    std::cout << '\n';
    return false;
  }
  return true;
}

// An integer as Python's int() reads it: surrounding blanks allowed, decimal digits, a sign.
bool parse_integer(std::string text, int64_t& value) {
  const auto first = text.find_first_not_of(" \t\r");
  const auto last = text.find_last_not_of(" \t\r");
  if (first == std::string::npos) return false;
  text = text.substr(first, last - first + 1);
  if (text.starts_with('+')) text.erase(0, 1);
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string_view(argv[1]) == "--version") {
    std::cout << PROJECT_VERSION_STRING << '\n';  // the launcher's, as every tool's
    return 0;
  }
  if (argc != 2 || std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h") {
    std::cerr << "usage: text_generation_cli <host:port>   (the address text_generation_server "
                 "prints: serving on http://HOST:PORT/api)\n";
    return argc == 2 ? 0 : 2;
  }
  const std::string url = std::string("http://") + argv[1];
  httplib::Client client(url);
  if (!client.is_valid()) {
    std::cerr << fmt::format("text_generation_cli: {} is not a host:port\n", argv[1]);
    return 2;
  }
  // Generation can take long; the server answers when all the tokens are there.
  client.set_read_timeout(3600, 0);
  std::string prompt, tokens_line;
  while (read_line("Enter prompt: ", prompt)) {
    int64_t tokens_to_generate = 0;
    bool have_number = false;
    while (!have_number) {
      if (!read_line("Enter number of tokens to generate: ", tokens_line)) return 0;
      have_number = parse_integer(tokens_line, tokens_to_generate);
      if (!have_number) std::cout << fmt::format("'{}' is not an integer\n", tokens_line);
    }
    const nlohmann::json body = {{"prompts", {prompt}}, {"tokens_to_generate", tokens_to_generate}};
    const httplib::Result result =
        client.Put("/api", body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                   "application/json");
    if (!result) {
      std::cerr << fmt::format("text_generation_cli: no answer from {}: {}\n", url,
                               httplib::to_string(result.error()));
      return 1;
    }
    const nlohmann::json answer = nlohmann::json::parse(result->body, nullptr, false);
    if (result->status != 200) {
      const std::string message = answer.is_object() && answer.contains("message") &&
                                          answer["message"].is_string()
                                      ? answer["message"].get<std::string>()
                                      : result->body;
      std::cout << fmt::format("Error {}: {}", result->status, message) << std::endl;
    } else if (answer.is_object() && answer.contains("text") && answer["text"].is_array() &&
               !answer["text"].empty() && answer["text"][0].is_string()) {
      std::cout << "Megatron Response: \n" << answer["text"][0].get<std::string>() << std::endl;
    } else {
      std::cout << fmt::format("Error {}: the answer has no text: {}", result->status,
                               result->body)
                << std::endl;
    }
  }
  return 0;
}
