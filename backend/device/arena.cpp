// ArenaLayout's offsets and the Arena's one allocation.
#include "backend/device/arena.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"
#include "backend/device/device.hpp"

namespace backend {

int64_t ArenaLayout::add(std::string what, ElementType dtype, int64_t numel) {
  if (numel < 0) common::fail("arena region '{}' has a negative size {}", what, numel);
  const int64_t size = common::checked_multiply(numel, element_size(dtype), what);
  const int64_t offset = bytes_;
  // Round up to the alignment, then leave room for this region.
  const int64_t padded = common::checked_add(size, kAlignment - 1, what) / kAlignment * kAlignment;
  bytes_ = common::checked_add(offset, padded, what);
  regions_.push_back({std::move(what), dtype, numel, offset});
  return static_cast<int64_t>(regions_.size()) - 1;
}

namespace {

// "activations (3.2 GiB: logits 1.6 GiB, dlogits 1.6 GiB, ...)": what an out-of-memory error
// says was being carved.
std::string describe(const ArenaLayout& layout, std::string_view name) {
  std::vector<const ArenaLayout::Region*> largest;
  for (const auto& region : layout.regions()) largest.push_back(&region);
  std::sort(largest.begin(), largest.end(), [](const auto* a, const auto* b) {
    return a->numel * element_size(a->type) > b->numel * element_size(b->type);
  });
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::string text = fmt::format("{} ({:.2f} GiB", name, static_cast<double>(layout.bytes()) / kGiB);
  for (size_t i = 0; i < largest.size() && i < 3; ++i) {
    text += fmt::format("{} {} {:.2f} GiB", i == 0 ? ":" : ",", largest[i]->what,
                        static_cast<double>(largest[i]->numel * element_size(largest[i]->type)) / kGiB);
  }
  return text + ")";
}

}  // namespace

Arena::Arena(Device& device, ArenaLayout layout, std::string_view name)
    : layout_(std::move(layout)) {
  memory_ = device.allocate_zeroed(layout_.bytes(), describe(layout_, name));
}

View Arena::view(int64_t region) const {
  const auto& regions = layout_.regions();
  if (region < 0 || region >= static_cast<int64_t>(regions.size())) {
    common::fail("arena region {} does not exist (the arena has {})", region, regions.size());
  }
  const auto& r = regions[static_cast<size_t>(region)];
  if (r.numel == 0) return View{nullptr, 0, r.type, memory_.on()};
  return View{static_cast<char*>(memory_.data()) + r.offset, r.numel, r.type, memory_.on()};
}

}  // namespace backend
