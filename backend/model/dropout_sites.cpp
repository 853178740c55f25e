// The model's dropout masks by site (dropout_sites.hpp).
#include "backend/model/dropout_sites.hpp"

#include "backend/common/splitmix64.hpp"

namespace backend {

Dropout dropout_at(DropoutSite site, int64_t layer, const GptConfig& config,
                   const ForwardDropout& drawn, const TensorParallelRegion& tensor_parallel,
                   const uint64_t* stored_keys) {
  const double probability =
      site == DropoutSite::attention ? config.attention_dropout : config.hidden_dropout;
  if (!drawn.training || probability == 0) return {};
  Dropout mask{.probability = probability,
               .key = dropout_key(drawn.seed, drawn.step, static_cast<uint64_t>(site),
                                  static_cast<uint64_t>(layer)),
               .first_index = 0,
               .stored_key = nullptr};
  if (stored_keys != nullptr) mask.stored_key = stored_keys + dropout_key_entry(site, layer);
  if (site == DropoutSite::attention) {
    if (tensor_parallel.active()) {
      mask.key = common::splitmix64_at(mask.key, static_cast<uint64_t>(tensor_parallel.rank()));
    }
    return mask;
  }
  // A hidden site: element i of this rank's rows is element first + i of the whole tensor.
  mask.first_index = static_cast<uint64_t>(tensor_parallel.first_own_element(config.hidden_size));
  return mask;
}

std::vector<uint64_t> dropout_key_table(const GptConfig& config, const ForwardDropout& drawn,
                                        const TensorParallelRegion& tensor_parallel) {
  std::vector<uint64_t> keys(static_cast<size_t>(dropout_key_table_size(config.num_layers)), 0);
  const auto put = [&](DropoutSite site, int64_t layer) {
    keys[static_cast<size_t>(dropout_key_entry(site, layer))] =
        dropout_at(site, layer, config, drawn, tensor_parallel).key;
  };
  put(DropoutSite::embedding, 0);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    for (const DropoutSite site :
         {DropoutSite::attention, DropoutSite::attention_output, DropoutSite::mlp_output}) {
      put(site, l);
    }
  }
  return keys;
}

}  // namespace backend
