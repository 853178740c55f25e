// ParameterLayout: the tensors in Megatron core's state-dict order, and their initialisation.
// The normal deviates come from a counter-based generator: element i is Φ⁻¹ of a uniform made
// from splitmix64 output i (Steele, Lea & Flood 2014) of a stream keyed by splitmix64(seed), by
// Wichura's AS 241 (common/inverse_normal_cdf.hpp; it replaced a Box–Muller transform, whose
// logarithm and sine/cosine per pair made the 126M model's initialisation take seconds). It is
// computed in double and rounded to Scalar, so a float and a double model with the same seed
// hold the same parameters up to float rounding.
#include "backend/model/parameter_layout.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"
#include "backend/common/inverse_normal_cdf.hpp"
#include "backend/common/splitmix64.hpp"

namespace backend {
namespace {

// values[j] = Scalar(scale · deviate first + j of the stream keyed by `key`), j < count ≤
// kNormalBlock: common::standard_normal_at, in two passes so the common case vectorises: the
// central rational function for every element (85 % need nothing else), then the tails
// (|p − 1/2| > 0.425, a logarithm and a square root) one by one.
constexpr int64_t kNormalBlock = 512;
template <typename Scalar>
void fill_normal_block(Scalar* values, int64_t count, uint64_t key, uint64_t first, double scale) {
  double deviates[kNormalBlock];
  double uniforms[kNormalBlock];
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) {
    uniforms[j] = common::normal_uniform_at(key, first + static_cast<uint64_t>(j));
    deviates[j] = common::central_inverse_normal_cdf(uniforms[j] - 0.5);
  }
  for (int64_t j = 0; j < count; ++j) {
    if (std::abs(uniforms[j] - 0.5) > common::kCentralHalfWidth) {
      deviates[j] = common::inverse_normal_cdf(uniforms[j]);
    }
  }
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) values[j] = static_cast<Scalar>(scale * deviates[j]);
}

}  // namespace

ParameterLayout::ParameterLayout(const GptConfig& config)
    : num_layers_(config.num_layers), init_method_std_(config.init_method_std) {
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t F1 = config.fc1_features();
  const int64_t QKV = config.qkv_features();
  const bool rms_norm = config.normalization == Normalization::rms_norm;
  // Optional tensors: added when the configuration has them, else kAbsentTensor.
  auto norm_bias = [&](std::string name) {
    return rms_norm ? kAbsentTensor : add(std::move(name), {C}, ParameterInit::zeros);
  };
  auto linear_bias = [&](std::string name, int64_t features) {
    return config.add_bias_linear ? add(std::move(name), {features}, ParameterInit::zeros)
                                  : kAbsentTensor;
  };
  word_embeddings_ = add("embedding.word_embeddings.weight", {config.padded_vocab_size, C},
                         ParameterInit::normal);
  if (config.position_embedding_type != PositionEmbeddingType::rope) {
    position_embeddings_ = add("embedding.position_embeddings.weight",
                               {config.max_position_embeddings, C}, ParameterInit::normal);
  }
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string prefix = "decoder.layers." + std::to_string(i) + ".";
    LayerParameters layer{};
    layer.input_norm_weight = add(prefix + "input_layernorm.weight", {C}, ParameterInit::ones);
    layer.input_norm_bias = norm_bias(prefix + "input_layernorm.bias");
    layer.qkv_weight =
        add(prefix + "self_attention.linear_qkv.weight", {QKV, C}, ParameterInit::normal);
    layer.qkv_bias = linear_bias(prefix + "self_attention.linear_qkv.bias", QKV);
    layer.proj_weight =
        add(prefix + "self_attention.linear_proj.weight", {C, C}, ParameterInit::scaled_normal);
    layer.proj_bias = linear_bias(prefix + "self_attention.linear_proj.bias", C);
    layer.mlp_norm_weight = add(prefix + "pre_mlp_layernorm.weight", {C}, ParameterInit::ones);
    layer.mlp_norm_bias = norm_bias(prefix + "pre_mlp_layernorm.bias");
    layer.fc1_weight = add(prefix + "mlp.linear_fc1.weight", {F1, C}, ParameterInit::normal);
    layer.fc1_bias = linear_bias(prefix + "mlp.linear_fc1.bias", F1);
    layer.fc2_weight = add(prefix + "mlp.linear_fc2.weight", {C, F}, ParameterInit::scaled_normal);
    layer.fc2_bias = linear_bias(prefix + "mlp.linear_fc2.bias", C);
    layers_.push_back(layer);
  }
  final_norm_weight_ = add("decoder.final_layernorm.weight", {C}, ParameterInit::ones);
  final_norm_bias_ = norm_bias("decoder.final_layernorm.bias");
  output_weight_ = config.share_embeddings_and_output_weights
                       ? word_embeddings_
                       : add("output_layer.weight", {config.padded_vocab_size, C},
                             ParameterInit::normal);
}

int64_t ParameterLayout::add(std::string name, std::vector<int64_t> shape, ParameterInit init) {
  // validate() checked the whole layout's sizes; these checks keep each step honest too.
  int64_t numel = 1;
  for (int64_t extent : shape) numel = common::checked_multiply(numel, extent, name);
  const int64_t offset =
      tensors_.empty() ? 0 : common::checked_add(tensors_.back().offset, tensors_.back().numel, name);
  // Megatron's default: no weight decay on biases and norm parameters (the 1-D tensors).
  const bool weight_decay = shape.size() > 1;
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back({std::move(name), std::move(shape), offset, numel, weight_decay});
  tensor_init_.push_back(init);
  return offset;
}

const ParameterTensor& ParameterLayout::tensor(const std::string& name) const {
  const auto found = tensor_index_.find(name);
  if (found == tensor_index_.end()) {
    const auto& t = tensors_;
    common::fail(
        "unknown parameter tensor '{}'; this model has {} tensors, e.g. {}, {}, {}, {}, "
        "decoder.layers.{{0..{}}}.mlp.linear_fc1.weight",
        name, t.size(), t[0].name, t[1].name, t[2].name, t.back().name, num_layers_ - 1);
  }
  return tensors_[found->second];
}

template <typename Scalar>
void ParameterLayout::init_parameters(Scalar* values, uint64_t seed) const {
  const uint64_t key = common::splitmix64_mix(seed);
  const double base_std = init_method_std_;
  const double scaled_std = base_std / std::sqrt(2.0 * static_cast<double>(num_layers_));
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const ParameterTensor& tensor = tensors_[t];
    Scalar* tensor_values = values + tensor.offset;
    const ParameterInit init = tensor_init_[t];
    if (init == ParameterInit::zeros || init == ParameterInit::ones) {
      std::fill_n(tensor_values, tensor.numel,
                  static_cast<Scalar>(init == ParameterInit::ones ? 1 : 0));
      continue;
    }
    const double tensor_std = init == ParameterInit::scaled_normal ? scaled_std : base_std;
    const auto first = static_cast<uint64_t>(tensor.offset);
    // Blocks at fixed offsets from the tensor's start; the static schedule gives each thread
    // one contiguous range to first-touch (the buffer's pages are faulted in here).
    const int64_t blocks = (tensor.numel + kNormalBlock - 1) / kNormalBlock;
#pragma omp parallel for schedule(static) if (tensor.numel > (1 << 14))
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t begin = block * kNormalBlock;
      fill_normal_block(tensor_values + begin, std::min(kNormalBlock, tensor.numel - begin), key,
                        first + static_cast<uint64_t>(begin), tensor_std);
    }
  }
}

template void ParameterLayout::init_parameters<float>(float*, uint64_t) const;
template void ParameterLayout::init_parameters<double>(double*, uint64_t) const;

}  // namespace backend
