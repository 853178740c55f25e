// Arenas: all of a device's memory is carved at setup, none in a step (llm.c's one allocation
// for the parameters and one for the activations; docs/device.md). A plan
// lists the regions (ArenaLayout::add: what, type, count); an Arena makes one zeroed
// allocation of the whole layout on a Device and hands out a View per region. It cannot grow:
// a new shape is a new plan and a new arena, made outside the step.
//
// Regions start at 256-byte boundaries: what cuBLASLt wants for its operands and what 16-byte
// vector loads need, at a negligible cost in padding.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/device/device_memory.hpp"
#include "backend/core/view.hpp"

namespace backend {

class Device;

class ArenaLayout {
 public:
  static constexpr int64_t kAlignment = 256;

  struct Region {
    std::string what;
    ElementType type = ElementType::f32;
    int64_t numel = 0;
    int64_t offset = 0;  // bytes from the arena's start
  };

  // Adds a region of `numel` elements (0 is allowed: an absent buffer, an empty view);
  // returns its index. Sizes are checked for overflow, naming `what`.
  int64_t add(std::string what, ElementType dtype, int64_t numel);

  int64_t bytes() const { return bytes_; }
  const std::vector<Region>& regions() const { return regions_; }

 private:
  std::vector<Region> regions_;
  int64_t bytes_ = 0;
};

class Arena {
 public:
  Arena() = default;
  // One allocation of layout.bytes() zeroed bytes on `device`. `name` ("parameters",
  // "activations") goes into the out-of-memory message with the largest regions.
  Arena(Device& device, ArenaLayout layout, std::string_view name);

  View view(int64_t region) const;
  int64_t bytes() const { return layout_.bytes(); }
  const ArenaLayout& layout() const { return layout_; }

 private:
  ArenaLayout layout_;
  DeviceMemory memory_;
};

}  // namespace backend
