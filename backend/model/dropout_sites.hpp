// Where the model drops and with which mask (Megatron core's four dropout sites, and its
// model-parallel RNG tracker's rule for tensor-parallel ranks). The masks draw from a
// counter-based generator (splitmix64, ops/dropout.hpp), keyed by
// dropout_key(dropout seed, dropout step, site, layer): the embedding is site 0 (layer 0), the
// attention probabilities of layer l site 1, linear_proj's bias-dropout-add site 2,
// linear_fc2's site 3. Mask indices are row-major element indices of the dropped tensor:
// (B, T, C) for the hidden sites, (B, NH, T, T) for the probabilities (an index space only: the
// blockwise attention draws the elements of the blocks it computes, attention.hpp). Nothing is
// generated for a p = 0 site.
//
// Under tensor parallelism the hidden masks are one rank's (every rank holds the same
// activations; under sequence parallelism a rank's rows are offset by its first row, so the
// ranks together drop exactly the one-process mask), and the attention-probability masks are
// keyed by the rank too, each rank dropping its own heads. Under pipeline parallelism the masks
// are keyed by the global layer index, so a stage draws the masks those layers draw in one
// process.
//
// A captured step (docs/step_on_device.md) stages each micro batch's keys in device memory, a
// table of uint64 with the embedding's first and each layer's attention, attention-output and
// MLP-output keys after it (dropout_key_entry), and its masks read them from there
// (Dropout::stored_key): the same keys, computed on the host as ever, found through an address
// that stays the same from one replay to the next.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/model/gpt_config.hpp"
#include "backend/model/micro_batch_activations.hpp"
#include "backend/model/tensor_parallel_region.hpp"
#include "backend/ops/dropout.hpp"

namespace backend {

// Where a dropout mask applies; part of its key.
enum class DropoutSite : uint64_t {
  embedding = 0,
  attention = 1,
  attention_output = 2,
  mlp_output = 3
};

// The mask at `site` of `layer` for a micro batch whose forward drew `drawn`: inactive (p = 0)
// in evaluation mode or for a p = 0 site. With `stored_keys` (a key table on the device the ops
// run on, as dropout_key_table made it for `drawn`), an active mask reads its key from there.
Dropout dropout_at(DropoutSite site, int64_t layer, const GptConfig& config,
                   const ForwardDropout& drawn, const TensorParallelRegion& tensor_parallel,
                   const uint64_t* stored_keys = nullptr);

// A key table's length for `num_layers` layers, and where the key of (site, layer) sits in it.
constexpr int64_t dropout_key_table_size(int64_t num_layers) {
  return 1 + 3 * num_layers;
}
constexpr int64_t dropout_key_entry(DropoutSite site, int64_t layer) {
  return site == DropoutSite::embedding ? 0 : 1 + 3 * layer + static_cast<int64_t>(site) - 1;
}

// The key of every site of the config's layers for a forward that draws `drawn` (0 where the
// mask is inactive).
std::vector<uint64_t> dropout_key_table(const GptConfig& config, const ForwardDropout& drawn,
                                        const TensorParallelRegion& tensor_parallel);

}  // namespace backend
