// Precision's name, for log lines and errors.
#include "backend/device/precision.hpp"

#include <fmt/format.h>

namespace backend {

std::string Precision::name() const {
  if (weights == activations && activations == gradients) return std::string(element_name(weights));
  return fmt::format("{} weights, {} activations, {} gradients", element_name(weights),
                     element_name(activations), element_name(gradients));
}

}  // namespace backend
