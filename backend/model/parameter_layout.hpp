// The parameter layout of the decoder gpt_model.hpp describes: every tensor's Megatron name,
// shape and offset into the one flat parameter buffer (and the gradient buffer of the same
// layout), the offsets the composition reads per layer, and Megatron's initialisation.
//
// Initialisation (Megatron's init_method_normal / scaled_init_method_normal): every weight
// element, including both embedding tables and the untied output_layer.weight, is
// N(0, init_method_std); linear_proj and linear_fc2 weights are N(0, init_method_std /
// sqrt(2 · num_layers)); biases are 0 and norm weights 1. Element i of the flat buffer depends
// only on (seed, i), never on the thread count or the order in which tensors are filled.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/model/gpt_config.hpp"

namespace backend {

struct ParameterTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // into parameters() / gradients()
  int64_t numel = 0;
  bool weight_decay = true;  // false for biases and norm weights (Megatron's default)
};

// The offset of a tensor the configuration leaves out (a norm bias with RMSNorm, a linear bias
// with --disable-bias-linear, the position table with RoPE).
constexpr int64_t kAbsentTensor = -1;

// Offsets into the flat buffers of one transformer layer's tensors.
struct LayerParameters {
  int64_t input_norm_weight, input_norm_bias;
  int64_t qkv_weight, qkv_bias;
  int64_t proj_weight, proj_bias;
  int64_t mlp_norm_weight, mlp_norm_bias;
  int64_t fc1_weight, fc1_bias;
  int64_t fc2_weight, fc2_bias;
};

enum class ParameterInit { normal, scaled_normal, zeros, ones };

class ParameterLayout {
 public:
  explicit ParameterLayout(const GptConfig& config);  // config already validated

  const std::vector<ParameterTensor>& tensors() const { return tensors_; }
  const ParameterTensor& tensor(const std::string& name) const;  // common::Error if unknown
  int64_t numel() const { return tensors_.back().offset + tensors_.back().numel; }

  int64_t word_embeddings() const { return word_embeddings_; }
  int64_t position_embeddings() const { return position_embeddings_; }  // or kAbsentTensor
  const LayerParameters& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  int64_t final_norm_weight() const { return final_norm_weight_; }
  int64_t final_norm_bias() const { return final_norm_bias_; }
  // The logits' weight: output_layer.weight when untied, else the word embedding.
  int64_t output_weight() const { return output_weight_; }

  // Megatron's initialisation of `values` (numel() elements of this layout).
  template <typename Scalar>
  void init_parameters(Scalar* values, uint64_t seed) const;

 private:
  int64_t add(std::string name, std::vector<int64_t> shape, ParameterInit init);

  int64_t num_layers_ = 0;
  double init_method_std_ = 0;
  std::vector<ParameterTensor> tensors_;
  std::vector<ParameterInit> tensor_init_;  // parallel to tensors_
  std::unordered_map<std::string, size_t> tensor_index_;
  int64_t word_embeddings_ = 0;
  int64_t position_embeddings_ = kAbsentTensor;
  std::vector<LayerParameters> layers_;
  int64_t final_norm_weight_ = 0;
  int64_t final_norm_bias_ = kAbsentTensor;
  int64_t output_weight_ = 0;
};

extern template void ParameterLayout::init_parameters<float>(float*, uint64_t) const;
extern template void ParameterLayout::init_parameters<double>(double*, uint64_t) const;

}  // namespace backend
