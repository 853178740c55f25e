// A pipeline-parallel rank's part of the model (Megatron core's pipeline stage: the layers
// TransformerBlock builds on it, get_transformer_layer_offset, and pre_process / post_process):
// the first stage holds the embedding, the last the final norm and the output layer, and each
// rank `virtual_chunks` model chunks of L / (pp · vp) consecutive layers. Chunk c of rank r
// holds layers [c · L/vp + r · L/(pp·vp), … + L/(pp·vp)): virtual stage r + c · pp of pp · vp,
// the interleaved schedule's assignment (Narayanan et al. 2021). With one chunk, rank r holds
// layers [r · L/pp, (r + 1) · L/pp).
//
// With tied embeddings (share_embeddings_and_output_weights) and more than one stage the last
// stage keeps its own copy of the word embedding as output_layer.weight, made equal to the first
// stage's at initialisation and kept equal by summing the two gradients over the embedding group
// (Megatron's shared_embedding_or_output_weight and _allreduce_word_embedding_grads).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace backend {

struct PipelineStage {
  int64_t pipeline_parallel = 1;  // --pipeline-model-parallel-size
  int64_t rank = 0;               // this rank's stage
  int64_t virtual_chunks = 1;     // model chunks per rank (interleaved schedule)

  bool first() const { return rank == 0; }
  bool last() const { return rank == pipeline_parallel - 1; }
  bool whole_model() const { return pipeline_parallel == 1; }
};

struct LayerRange {
  int64_t begin = 0;
  int64_t end = 0;  // one past the last layer
  int64_t size() const { return end - begin; }
  bool contains(int64_t layer) const { return layer >= begin && layer < end; }
  bool operator==(const LayerRange&) const = default;
};

// Megatron's divisibility rules, as errors naming the flags: num_layers divisible by the
// pipeline-parallel size and, with virtual chunks, the layers per stage by the chunk count;
// sizes at least 1; the rank inside the pipeline.
void check_pipeline_stage(int64_t num_layers, const PipelineStage& stage);

// The layers of each of the stage's chunks, in chunk order (checked first).
std::vector<LayerRange> stage_layer_chunks(int64_t num_layers, const PipelineStage& stage);

// Whether one of `chunks` holds `layer`.
inline bool holds_layer(std::span<const LayerRange> chunks, int64_t layer) {
  for (const LayerRange& chunk : chunks) {
    if (chunk.contains(layer)) return true;
  }
  return false;
}

}  // namespace backend
