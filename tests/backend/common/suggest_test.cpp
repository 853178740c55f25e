// "Did you mean" suggestions shared by the launcher and pretrain_gpt.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "backend/common/suggest.hpp"

TEST_CASE("suggestions by edit distance") {
  CHECK(common::edit_distance("kitten", "sitting") == 3);
  CHECK(common::edit_distance("ab", "ba") == 1);
  const std::vector<std::string> keys = {"max_steps", "max_epochs", "devices", "num_nodes"};
  CHECK(common::closest_matches("max_step", keys) == std::vector<std::string>{"max_steps"});
  CHECK(common::closest_matches("zzz", keys).empty());
  CHECK(common::did_you_mean("126m", {"gpt3/126m", "gpt3/5b"}) == " Did you mean 'gpt3/126m'?");
  CHECK(common::list_if_short({"a", "b"}) == "a, b");
  CHECK(common::list_if_short(std::vector<std::string>(21, "k")).empty());
}
