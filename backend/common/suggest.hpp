// "Did you mean ...?" suggestions for unknown keys, config groups and group options, by
// edit distance (optimal string alignment: insertions, deletions, substitutions and
// adjacent transpositions each cost 1), as Hydra and most CLIs do for typos.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace common {

std::size_t edit_distance(std::string_view left, std::string_view right);

// The candidates close enough to `word` to be a typo of it, best first (at most
// max_results). A candidate whose last '/'-separated component equals `word` also counts,
// so "126m" suggests "gpt3/126m".
std::vector<std::string> closest_matches(std::string_view word,
                                         const std::vector<std::string>& candidates,
                                         std::size_t max_results = 3);

// " Did you mean 'x'?" / " Did you mean 'x' or 'y'?" or "" when nothing is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// "a, b, c" when there are at most `limit` items, else "" (a long list helps nobody).
std::string list_if_short(const std::vector<std::string>& items, std::size_t limit = 20);

}  // namespace common
