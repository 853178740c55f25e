// safetensors: files built byte by byte from the format's description (so the reader is not
// only checked against our own writer), the writer's layout (header length, JSON, space
// padding to 8 bytes, little-endian F32 data), F16/BF16/F64 widening with bit patterns whose
// values IEEE 754 fixes, and one corrupt file per check the reader makes.
#include "backend/ckpt/safetensors.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "backend/common/error.hpp"
#include "test_files.hpp"
#include "tests/temporary_directory.hpp"

namespace {

using backend::NamedTensor;
using backend::read_safetensors;
using backend::write_safetensors;
using test_support::TemporaryDirectory;

std::string little_endian_u64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

template <typename T>
std::string raw_bytes(std::initializer_list<T> values) {
  std::string bytes;
  for (const T value : values) {
    char buffer[sizeof(T)];
    std::memcpy(buffer, &value, sizeof(T));
    bytes.append(buffer, sizeof(T));
  }
  return bytes;
}

// A file with the given header text (unpadded) and data bytes, as the format lays it out.
std::filesystem::path write_raw(const std::filesystem::path& path, const std::string& header,
                                const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out << little_endian_u64(header.size()) << header << data;
  return path;
}

}  // namespace

TEST_CASE("safetensors: reads a file laid out by hand from the format description") {
  TemporaryDirectory directory;
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"F32","shape":[3],"data_offsets":[8,20]},)"
      R"("a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}})";
  const auto path = write_raw(directory.path / "hand.safetensors", header,
                              raw_bytes<float>({1.5f, -2.0f, 3.0f, 4.0f, 5.25f}));
  const auto file = read_safetensors(path);
  REQUIRE(file.tensors.size() == 2);
  // Ordered by data offset, whatever the JSON order.
  CHECK(file.tensors[0].name == "a");
  CHECK(file.tensors[0].shape == std::vector<int64_t>{1, 2});
  CHECK(file.tensors[0].values == std::vector<float>{1.5f, -2.0f});
  CHECK(file.tensors[1].name == "b");
  CHECK(file.tensors[1].values == std::vector<float>{3.0f, 4.0f, 5.25f});
  CHECK(file.metadata == std::map<std::string, std::string>{{"format", "pt"}});
}

TEST_CASE("safetensors: F16, BF16 and F64 are widened to float exactly") {
  TemporaryDirectory directory;
  // binary16: 1.0, -2.0, 65504 (largest finite), 2^-24 (smallest subnormal), 2^-14 (smallest
  // normal), +inf. bfloat16: 1.0, 3.140625 (0x4049), -0.0. F64: 0.1 rounds to float(0.1).
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[6],"data_offsets":[0,12]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[12,18]},)"
      R"("d":{"dtype":"F64","shape":[1],"data_offsets":[18,26]}})";
  const std::string data = raw_bytes<uint16_t>({0x3c00, 0xc000, 0x7bff, 0x0001, 0x0400, 0x7c00}) +
                           raw_bytes<uint16_t>({0x3f80, 0x4049, 0x8000}) + raw_bytes<double>({0.1});
  const auto file = read_safetensors(write_raw(directory.path / "mixed.safetensors", header, data));
  REQUIRE(file.tensors.size() == 3);
  const auto& half = file.tensors[0].values;
  CHECK(half[0] == 1.0f);
  CHECK(half[1] == -2.0f);
  CHECK(half[2] == 65504.0f);
  CHECK(half[3] == std::ldexp(1.0f, -24));
  CHECK(half[4] == std::ldexp(1.0f, -14));
  CHECK(std::isinf(half[5]));
  const auto& bfloat = file.tensors[1].values;
  CHECK(bfloat[0] == 1.0f);
  CHECK(bfloat[1] == 3.140625f);
  CHECK(std::signbit(bfloat[2]));
  CHECK(file.tensors[2].values[0] == static_cast<float>(0.1));
}

TEST_CASE("safetensors: the writer's layout is the format's") {
  TemporaryDirectory directory;
  const auto path = directory.path / "written.safetensors";
  write_safetensors(path,
                    {{"first", {2, 2}, {1, 2, 3, 4}}, {"scalar", {}, {7}}, {"empty", {0, 3}, {}}},
                    {{"tokenizer_vocab_size", "100"}});
  const std::string bytes = test_support::read_file(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  CHECK(header_length % 8 == 0);
  REQUIRE(8 + header_length + 5 * sizeof(float) == bytes.size());
  const std::string header_text = bytes.substr(8, header_length);
  // Padding is spaces after the JSON object.
  const auto closing = header_text.find_last_of('}');
  CHECK(header_text.find_first_not_of(' ', closing + 1) == std::string::npos);
  const auto header = nlohmann::json::parse(header_text);
  CHECK(header["__metadata__"]["tokenizer_vocab_size"] == "100");
  CHECK(header["first"]["dtype"] == "F32");
  CHECK(header["first"]["shape"] == nlohmann::json::array({2, 2}));
  CHECK(header["first"]["data_offsets"] == nlohmann::json::array({0, 16}));
  CHECK(header["scalar"]["shape"] == nlohmann::json::array());
  CHECK(header["scalar"]["data_offsets"] == nlohmann::json::array({16, 20}));
  CHECK(header["empty"]["data_offsets"] == nlohmann::json::array({20, 20}));
  float data[5];
  std::memcpy(data, bytes.data() + 8 + header_length, sizeof(data));
  CHECK(data[0] == 1.0f);
  CHECK(data[3] == 4.0f);
  CHECK(data[4] == 7.0f);

  const auto file = read_safetensors(path);
  REQUIRE(file.tensors.size() == 3);
  CHECK(file.tensors[0].values == std::vector<float>{1, 2, 3, 4});
  CHECK(file.tensors[1].shape.empty());
  CHECK(file.tensors[1].values == std::vector<float>{7});
  CHECK(file.tensors[2].shape == std::vector<int64_t>{0, 3});
  CHECK(file.tensors[2].values.empty());
  CHECK(file.metadata.at("tokenizer_vocab_size") == "100");
  CHECK_FALSE(std::filesystem::exists(directory.path / "written.safetensors.partial"));
}

TEST_CASE("safetensors: the writer refuses inconsistent tensors") {
  TemporaryDirectory directory;
  const auto path = directory.path / "bad.safetensors";
  CHECK_THROWS_WITH_AS(write_safetensors(path, {{"x", {2, 3}, {1, 2, 3}}}),
                       doctest::Contains("tensor 'x' has 3 values but its shape holds 6"),
                       common::Error);
  CHECK_THROWS_WITH_AS(write_safetensors(path, {{"x", {1}, {1}}, {"x", {1}, {2}}}),
                       doctest::Contains("tensor 'x' is given twice"), common::Error);
  CHECK_THROWS_WITH_AS(write_safetensors(path, {{"__metadata__", {1}, {1}}}),
                       doctest::Contains("may not be named '__metadata__'"), common::Error);
  CHECK_THROWS_WITH_AS(write_safetensors(directory.path / "missing" / "x.safetensors", {}),
                       doctest::Contains("cannot write"), common::Error);
}

TEST_CASE("safetensors: corrupt files are refused naming the file and the tensor") {
  TemporaryDirectory directory;
  const auto path = directory.path / "corrupt.safetensors";
  const std::string eight_bytes = raw_bytes<float>({1.0f, 2.0f});
  auto refused = [&](const std::string& header, const std::string& data, const std::string& why) {
    CAPTURE(header);
    write_raw(path, header, data);
    CHECK_THROWS_WITH_AS(read_safetensors(path), doctest::Contains(why.c_str()), common::Error);
    CHECK_THROWS_WITH_AS(read_safetensors(path), doctest::Contains(path.string().c_str()),
                         common::Error);
  };
  const std::string valid_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

  SUBCASE("too short, header length past the end, header length over the limit") {
    {
      std::ofstream out(path, std::ios::binary);
      out << "abc";
    }
    CHECK_THROWS_WITH_AS(read_safetensors(path), doctest::Contains("shorter than the 8-byte"),
                         common::Error);
    {
      std::ofstream out(path, std::ios::binary);
      out << little_endian_u64(1000) << "{}";
    }
    CHECK_THROWS_WITH_AS(read_safetensors(path),
                         doctest::Contains("header length 1000 runs past the end of the 10-byte file"),
                         common::Error);
    {
      std::ofstream out(path, std::ios::binary);
      out << little_endian_u64(std::numeric_limits<uint64_t>::max()) << "{}";
    }
    CHECK_THROWS_WITH_AS(read_safetensors(path), doctest::Contains("exceeds the format's limit"),
                         common::Error);
    CHECK_THROWS_WITH_AS(read_safetensors(directory.path / "absent.safetensors"),
                         doctest::Contains("cannot read the safetensors file"), common::Error);
  }
  SUBCASE("JSON") {
    refused(R"({"t":{"dtype":"F32",)", eight_bytes, "the header is not valid JSON");
    refused(R"([1, 2])", "", "the header must be a JSON object");
    refused(R"({"__metadata__":{"k":5},)" + valid_entry + "}", eight_bytes,
            "__metadata__ value 'k' must be a string");
    refused(R"({"t":{"dtype":"F32","shape":[2]}})", eight_bytes,
            "tensor 't' must be an object with dtype, shape and data_offsets");
    refused(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight_bytes,
            "tensor 't' shape entry must be a non-negative integer");
    refused(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", eight_bytes,
            "tensor 't': data_offsets must be [begin, end]");
  }
  SUBCASE("dtypes") {
    refused(R"({"t":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}})", eight_bytes,
            "tensor 't': 'F17' is not a safetensors dtype");
    refused(R"({"t":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", eight_bytes,
            "tensor 't': dtype I32 is not supported here (valid: F32, F64, F16, BF16)");
  }
  SUBCASE("shape against byte count") {
    refused(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight_bytes,
            "tensor 't': shape [3] of F32 needs 12 bytes, but data_offsets [0, 8] span 8");
    refused(R"({"t":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", eight_bytes,
            "needs 4 bytes");
    refused(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight_bytes,
            "end before they begin");
  }
  SUBCASE("offsets outside the data region, overlapping, leaving gaps") {
    refused(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight_bytes,
            "tensor 't' at bytes [0, 16) runs past the 8-byte data region");
    refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            eight_bytes, "tensor 'b' at bytes [4, 8) overlaps tensor 'a'");
    refused(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight_bytes,
            "4 unaccounted bytes before tensor 't'");
    refused(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight_bytes,
            "the tensors cover 4 bytes of the 8-byte data region (4 trailing bytes)");
  }
  SUBCASE("a valid file cut short") {
    write_safetensors(path, {{"weights", {4, 4}, std::vector<float>(16, 0.5f)}});
    const std::string bytes = test_support::read_file(path);
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << bytes.substr(0, bytes.size() - 4);
    }
    CHECK_THROWS_WITH_AS(read_safetensors(path),
                         doctest::Contains("tensor 'weights' at bytes [0, 64) runs past the 60-byte "
                                           "data region (truncated file?)"),
                         common::Error);
  }
}

// Inputs tests/fuzz/safetensors_fuzzer.cpp found, reduced by hand.
TEST_CASE("safetensors: fuzz findings: an empty tensor, a number beyond a double's range") {
  TemporaryDirectory directory;
  // Copying an empty tensor's zero bytes passed memcpy a null pointer (undefined; UBSan).
  const auto file = read_safetensors(write_raw(
      directory.path / "empty.safetensors",
      R"({"scalar":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
      R"("empty":{"dtype":"F32","shape":[0,4],"data_offsets":[4,4]}})",
      raw_bytes<float>({7.0f})));
  REQUIRE(file.tensors.size() == 2);
  CHECK(file.tensors[0].values == std::vector<float>{7.0f});
  CHECK(file.tensors[1].name == "empty");
  CHECK(file.tensors[1].values.empty());

  // 1e999 is JSON, but nlohmann refuses it with out_of_range, not parse_error: it escaped as
  // an internal error.
  const auto path = write_raw(directory.path / "huge.safetensors",
                              R"({"a":{"dtype":"F16","shape":[2,21e999],"data_offsets":[0,8]}})",
                              raw_bytes<float>({1.0f, 2.0f}));
  CHECK_THROWS_WITH_AS(read_safetensors(path), doctest::Contains("the header is not valid JSON"),
                       common::Error);
}
