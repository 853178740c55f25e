// index_tokens (embedding.hpp): the index of positions grouped by token that both twins'
// embedding backward sum from. A sort of B·T ints on the host, made when the tokens are uploaded.
#include <algorithm>
#include <limits>
#include <numeric>

#include "backend/ops/embedding.hpp"

namespace backend {

void index_tokens(const int32_t* tokens, int64_t count, int32_t* index) {
  if (count < 0 || count > std::numeric_limits<int32_t>::max()) {
    common::fail("index_tokens: {} positions do not fit the token index's int32 positions",
                 count);
  }
  const TokenIndexLayout layout = token_index_layout(count);
  int32_t* order = index + layout.order;
  int32_t* segment_starts = index + layout.segment_starts;
  int32_t* unique_tokens = index + layout.unique_tokens;
  std::iota(order, order + count, int32_t{0});
  // By token, then position: a token's positions ascend, the order in which the twins add
  // them. std::sort with the position as tie-break rather than std::stable_sort, which takes a
  // heap buffer: this runs inside a step, which allocates nothing.
  std::sort(order, order + count, [tokens](int32_t a, int32_t b) {
    return tokens[a] < tokens[b] || (tokens[a] == tokens[b] && a < b);
  });
  int32_t unique = 0;
  for (int64_t k = 0; k < count; ++k) {
    const int32_t token = tokens[order[k]];
    if (unique == 0 || unique_tokens[unique - 1] != token) {
      unique_tokens[unique] = token;
      segment_starts[unique] = static_cast<int32_t>(k);
      ++unique;
    }
  }
  segment_starts[unique] = static_cast<int32_t>(count);
  // The unused tails are written too, so the buffer's bytes depend on the tokens alone.
  std::fill(segment_starts + unique + 1, segment_starts + count + 1, int32_t{0});
  std::fill(unique_tokens + unique, unique_tokens + count, int32_t{0});
  index[0] = unique;
}

}  // namespace backend
