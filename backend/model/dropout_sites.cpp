// The model's dropout masks by site (dropout_sites.hpp).
#include "backend/model/dropout_sites.hpp"

#include "backend/common/splitmix64.hpp"

namespace backend {

Dropout dropout_at(DropoutSite site, int64_t layer, const GptConfig& config,
                   const ForwardDropout& drawn, const TensorParallelRegion& tensor_parallel) {
  const double probability =
      site == DropoutSite::attention ? config.attention_dropout : config.hidden_dropout;
  if (!drawn.training || probability == 0) return {};
  uint64_t key = dropout_key(drawn.seed, drawn.step, static_cast<uint64_t>(site),
                             static_cast<uint64_t>(layer));
  if (site == DropoutSite::attention) {
    if (tensor_parallel.active()) {
      key = common::splitmix64_at(key, static_cast<uint64_t>(tensor_parallel.rank()));
    }
    return {probability, key};
  }
  // A hidden site: element i of this rank's rows is element first + i of the whole tensor.
  const auto first = static_cast<uint64_t>(tensor_parallel.first_own_element(config.hidden_size));
  return {probability, key, first};
}

}  // namespace backend
