// sort_positions_by_token (embedding.hpp): the index of positions grouped by token that the
// CUDA twin's embedding backward sums without atomics. A stable sort of B·T ints on the host.
#include <algorithm>
#include <numeric>

#include "backend/ops/embedding.hpp"

namespace backend {

void sort_positions_by_token(const int32_t* tokens, int64_t count, int32_t* order,
                             int32_t* segment_starts, int32_t* unique_tokens,
                             int64_t* unique_count) {
  std::iota(order, order + count, int32_t{0});
  // Stable: a token's positions stay ascending, the order in which the CPU twin adds them.
  std::stable_sort(order, order + count,
                   [tokens](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  int64_t unique = 0;
  for (int64_t k = 0; k < count; ++k) {
    const int32_t token = tokens[order[k]];
    if (unique == 0 || unique_tokens[unique - 1] != token) {
      unique_tokens[unique] = token;
      segment_starts[unique] = static_cast<int32_t>(k);
      ++unique;
    }
  }
  segment_starts[unique] = static_cast<int32_t>(count);
  *unique_count = unique;
}

}  // namespace backend
