// Arena and View: aligned, disjoint, zeroed regions carved in one allocation; empty regions as
// empty views of the right type; slices and element types checked with messages that say what
// was wrong.
#include "backend/device/arena.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"

using backend::Arena;
using backend::ArenaLayout;
using backend::CpuDevice;
using backend::ElementType;
using backend::View;

TEST_CASE("an arena's regions are aligned, disjoint, zeroed and of their own type") {
  ArenaLayout layout;
  const int64_t a = layout.add("a", ElementType::f32, 3);
  const int64_t absent = layout.add("absent", ElementType::f64, 0);
  const int64_t b = layout.add("b", ElementType::f64, 100);
  const int64_t ids = layout.add("ids", ElementType::i32, 1);
  // 3 floats round up to one 256-byte block, nothing for the empty one, 800 bytes to 1024.
  CHECK(layout.regions()[static_cast<size_t>(a)].offset == 0);
  CHECK(layout.regions()[static_cast<size_t>(b)].offset == 256);
  CHECK(layout.regions()[static_cast<size_t>(ids)].offset == 256 + 1024);
  CHECK(layout.bytes() == 256 + 1024 + 256);

  CpuDevice device;
  const Arena arena(device, layout, "test");
  const View va = arena.view(a), vb = arena.view(b), vi = arena.view(ids);
  CHECK(va.numel == 3);
  CHECK(va.type == ElementType::f32);
  CHECK(vb.type == ElementType::f64);
  CHECK(vi.type == ElementType::i32);
  for (const View& v : {va, vb, vi}) {
    CHECK(reinterpret_cast<uintptr_t>(v.data) % ArenaLayout::kAlignment == 0);
  }
  CHECK(static_cast<char*>(va.data) + va.bytes() <= static_cast<char*>(vb.data));
  CHECK(static_cast<char*>(vb.data) + vb.bytes() <= static_cast<char*>(vi.data));
  const double* values = vb.as<double>();
  CHECK(std::all_of(values, values + vb.numel, [](double x) { return x == 0; }));

  const View empty = arena.view(absent);
  CHECK(empty.empty());
  CHECK(empty.type == ElementType::f64);
  CHECK(empty.as<double>() == nullptr);
  CHECK_THROWS_WITH_AS(arena.view(4), "arena region 4 does not exist (the arena has 4)",
                       common::Error);
}

TEST_CASE("region sizes that overflow are refused, naming the region") {
  ArenaLayout layout;
  CHECK_THROWS_AS(layout.add("logits", ElementType::f64, std::numeric_limits<int64_t>::max() / 4),
                  common::Error);
  CHECK_THROWS_WITH_AS(layout.add("minus", ElementType::f32, -1),
                       "arena region 'minus' has a negative size -1", common::Error);
}

TEST_CASE("views check their slices and their element type") {
  float storage[8] = {};
  const View view{storage, 8, ElementType::f32};
  const View part = view.slice(2, 3);
  CHECK(part.as<float>() == storage + 2);
  CHECK(part.numel == 3);
  CHECK(view.tail(8).numel == 0);
  CHECK_THROWS_WITH_AS(view.slice(6, 3), "view slice [6, 9) is outside the view's 8 fp32 elements",
                       common::Error);
  CHECK_THROWS_AS(view.slice(-1, 1), common::Error);
  CHECK_THROWS_WITH_AS(view.as<double>(), "a fp32 view was used as fp64 memory", common::Error);
}
