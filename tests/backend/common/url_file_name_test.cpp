// The file name a URL names, as wget and curl -O save it.
#include "backend/common/url_file_name.hpp"

#include <doctest/doctest.h>

TEST_CASE("url_file_name takes the last path segment, decoded, without query or fragment") {
  CHECK(common::url_file_name("https://huggingface.co/bigscience/misc-test-data/resolve/main/stas/oscar-1GB.jsonl.xz") ==
        "oscar-1GB.jsonl.xz");
  CHECK(common::url_file_name("https://host/a/b%20c.json?download=1#x") == "b c.json");
  CHECK(common::url_file_name("file:///data/shard_00.jsonl.zst") == "shard_00.jsonl.zst");
  CHECK(common::url_file_name("https://host/") == "");
  CHECK(common::url_file_name("https://host") == "");
  CHECK(common::url_file_name("https://host/a/..") == "");
  CHECK(common::url_file_name("https://host/a%2Fb") == "");
}
