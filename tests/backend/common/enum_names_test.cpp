// An enum's names: the first row of a value is the name it is written under, later rows are
// other spellings read as it, and a name outside the table is no value.
#include "backend/common/enum_names.hpp"

#include <doctest/doctest.h>

#include <span>

namespace {

enum class Shade { none, light, dark };
constexpr common::EnumName<Shade> kShadeNames[] = {
    {Shade::none, ""}, {Shade::light, "Light"}, {Shade::dark, "Dark"}, {Shade::light, "light"}};
constexpr std::span<const common::EnumName<Shade>> enum_names(Shade) { return kShadeNames; }

}  // namespace

TEST_CASE("enum names: written under the first name, read under every spelling") {
  CHECK(common::enum_name(Shade::light) == "Light");
  CHECK(common::enum_name(Shade::dark) == "Dark");
  CHECK(common::enum_name(Shade::none).empty());
  CHECK(common::enum_from_name<Shade>("Light") == Shade::light);
  CHECK(common::enum_from_name<Shade>("light") == Shade::light);
  CHECK(common::enum_from_name<Shade>("") == Shade::none);
  CHECK_FALSE(common::enum_from_name<Shade>("LIGHT"));
  CHECK_FALSE(common::enum_from_name<Shade>("grey"));
  // A constant expression: tables can be checked where they are written.
  static_assert(common::enum_name(Shade::dark) == "Dark");
}
