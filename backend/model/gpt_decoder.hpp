// Incremental decoding of a trained GptModel with a key/value cache, the inference forward
// that text generation runs (Megatron core's InferenceContext / KV cache, vLLM's and llm.c's
// idea; facts only): a step takes a batch of rows, each one token of one sequence at one
// position, and
//   x_r = word_embeddings[token_r] (+ position_embeddings[position_r])
//   per layer:  h = input_layernorm(x); qkv = linear_qkv(h); q, k = rope(q, k at position_r);
//               key_cache[slot_r][position_r], value_cache[slot_r][position_r] = k, v;
//               a = softmax(q · key_cache[slot_r][0..position_r]^T / sqrt(HD)) · value_cache[...]
//               x = x + linear_proj(a);  x = x + linear_fc2(act(linear_fc1(pre_mlp_layernorm(x))))
//   logits_r = final_layernorm(x_r) · W^T
// which is GptModel::forward's computation in evaluation mode (no dropout) for the position,
// position by position: row r's logits equal the full forward's logits of the slot's sequence
// at position_r (to float rounding, the sums run in another order). The rows of a step are
// packed (no padding), so one step can hold a prompt's prefill rows next to other sequences'
// single decode rows, and the linear layers run once over all rows (continuous batching).
//
// A slot is one sequence's cache: its keys and values for positions 0..max_length−1 of every
// layer, on the model's device. Within a step, every row's keys and values are stored before
// any row attends, so the rows of one slot at consecutive positions (a prefill) see each other
// causally.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "backend/model/gpt_model.hpp"

namespace backend {

// One token of one sequence in a decoding step.
struct DecodeRow {
  int32_t token = 0;     // in [0, vocab_size)
  int32_t position = 0;  // in [0, max_length); positions 0..position−1 of the slot are cached
  int32_t slot = 0;      // in [0, slots)
  bool logits = true;    // whether step() returns this row's logits (prefill rows of a prompt
                         // whose log-probabilities nobody asked for need none)
};

class GptDecoder {
 public:
  // Borrows `model`'s parameters (they must outlive the decoder and not change while it is
  // used) and carves, on the model's device, the caches of `slots` sequences of up to
  // `max_length` tokens (≤ max_position_embeddings) and the activations of steps of up to
  // `max_rows` rows. A whole model only: common::Error under tensor, pipeline or ZeRO-3
  // parallelism, and for sizes < 1.
  GptDecoder(const GptModel<float>& model, int64_t slots, int64_t max_length, int64_t max_rows);
  ~GptDecoder();
  GptDecoder(GptDecoder&&) noexcept;
  GptDecoder& operator=(GptDecoder&&) noexcept;

  int64_t slots() const;
  int64_t max_length() const;
  int64_t max_rows() const;
  int64_t padded_vocab_size() const;  // the model's config().padded_vocab_size()

  // Bytes of the caches (all slots, both keys and values, all layers).
  int64_t cache_bytes() const;

  // One step over `rows` (1 ≤ rows.size() ≤ max_rows): stores each row's keys and values in
  // its slot and writes, for each row with `logits` set in order, padded_vocab_size() logits
  // into `logits` (host memory, exactly that many rows × padded_vocab_size() floats).
  // common::Error for a row outside the bounds above or a `logits` of the wrong size; what a
  // slot held at positions ≥ a row's position is overwritten, so a slot is reused by starting
  // again at position 0.
  void step(std::span<const DecodeRow> rows, std::span<float> logits);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace backend
