// Edit-distance suggestions; see suggest.hpp.
#include "backend/common/suggest.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace common {

std::size_t edit_distance(std::string_view left, std::string_view right) {
  // Three rolling rows are enough for the transposition rule, which looks two rows back.
  const std::size_t columns = right.size() + 1;
  std::vector<std::size_t> two_back(columns), previous(columns), current(columns);
  std::iota(previous.begin(), previous.end(), std::size_t{0});
  for (std::size_t i = 1; i <= left.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= right.size(); ++j) {
      const std::size_t substitution = left[i - 1] == right[j - 1] ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + substitution});
      if (i > 1 && j > 1 && left[i - 1] == right[j - 2] && left[i - 2] == right[j - 1]) {
        current[j] = std::min(current[j], two_back[j - 2] + 1);
      }
    }
    std::swap(two_back, previous);
    std::swap(previous, current);
  }
  return previous[right.size()];
}

namespace {

std::string lowercase(std::string_view text) {
  std::string result(text);
  for (char& character : result) {
    if (character >= 'A' && character <= 'Z') character = static_cast<char>(character - 'A' + 'a');
  }
  return result;
}

std::string_view last_component(std::string_view path) {
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::vector<std::string> closest_matches(std::string_view word,
                                         const std::vector<std::string>& candidates,
                                         std::size_t max_results) {
  // A quarter of the word's length (at least 1, at most 4) catches typos without suggesting
  // unrelated keys.
  const std::size_t threshold = std::clamp<std::size_t>(word.size() / 4, 1, 4);
  const std::string lowered = lowercase(word);
  std::vector<std::pair<std::size_t, std::string>> scored;
  for (const auto& candidate : candidates) {
    if (candidate == word) continue;
    std::size_t distance = edit_distance(lowered, lowercase(candidate));
    if (last_component(candidate) == word && candidate != word) distance = 0;
    if (distance <= threshold) scored.emplace_back(distance, candidate);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& left, const auto& right) { return left.first < right.first; });
  std::vector<std::string> result;
  for (const auto& [distance, candidate] : scored) {
    if (result.size() == max_results) break;
    if (std::find(result.begin(), result.end(), candidate) == result.end()) {
      result.push_back(candidate);
    }
  }
  return result;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const auto matches = closest_matches(word, candidates);
  if (matches.empty()) return "";
  std::string text = " Did you mean ";
  for (std::size_t i = 0; i < matches.size(); ++i) {
    if (i > 0) text += i + 1 == matches.size() ? " or " : ", ";
    text += fmt::format("'{}'", matches[i]);
  }
  return text + "?";
}

std::string list_if_short(const std::vector<std::string>& items, std::size_t limit) {
  if (items.empty() || items.size() > limit) return "";
  std::string text;
  for (const auto& item : items) {
    if (!text.empty()) text += ", ";
    text += item;
  }
  return text;
}

}  // namespace common
