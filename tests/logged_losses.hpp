// The lm loss (or another field) of each iteration line of Megatron's log format in `log` (iteration → loss), for
// the end-to-end tests that compare two runs; `lines` (when given) receives how many iteration
// lines there were, so a test can check that each was printed once.
#pragma once

#include <map>
#include <regex>
#include <string>

namespace test_support {

inline std::map<int, double> logged_losses(const std::string& log, int* lines = nullptr) {
  static const std::regex line(R"( iteration +(\d+)/ +\d+ \|.*\| lm loss: ([0-9.E+-]+) \|)");
  std::map<int, double> losses;
  int count = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it, ++count) {
    losses[std::stoi((*it)[1])] = std::stod((*it)[2]);
  }
  if (lines != nullptr) *lines = count;
  return losses;
}

// Another field of the iteration lines (iteration → value), e.g. "params norm".
inline std::map<int, double> logged_field(const std::string& log, const std::string& field) {
  const std::regex line(R"( iteration +(\d+)/ +\d+ \|.*\| )" + field + R"(: ([0-9.E+-]+) \|)");
  std::map<int, double> values;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    values[std::stoi((*it)[1])] = std::stod((*it)[2]);
  }
  return values;
}

}  // namespace test_support
