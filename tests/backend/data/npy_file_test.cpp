// The .npy writer gives numpy.save's bytes and the reader refuses damaged files by name.
#include "backend/data/npy_file.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "test_files.hpp"
#include "tests/backend/data/numpy_reference.hpp"
#include "tests/temporary_directory.hpp"

using namespace backend;

namespace {

std::string error_of(const std::filesystem::path& path) {
  try {
    NpyArray array(path);
  } catch (const common::Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("headers are numpy.save's: version 1.0, dict repr padded to 64 bytes") {
  // numpy 1.24's numpy.save of arange(10, dtype=int32), zeros((5, 2), int64), zeros(0, uint32)
  const std::vector<int64_t> ten = {10}, five_by_two = {5, 2}, none = {0};
  const std::string int32_header = npy_header(NpyElement::int32, ten);
  REQUIRE(int32_header.size() == 128);
  CHECK(int32_header.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  CHECK(static_cast<unsigned char>(int32_header[8]) == 118);
  CHECK(int32_header[9] == 0);
  const std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (10,), }";
  CHECK(int32_header.substr(10, dict.size()) == dict);
  CHECK(int32_header.substr(10 + dict.size()) == std::string(117 - dict.size(), ' ') + "\n");
  CHECK(npy_header(NpyElement::int64, five_by_two).find("{'descr': '<i8', 'fortran_order': False, "
                                                        "'shape': (5, 2), }") == 10);
  CHECK(npy_header(NpyElement::uint32, none).find("'descr': '<u4'") != std::string::npos);
  CHECK(npy_header(NpyElement::uint32, none).find("'shape': (0,)") != std::string::npos);
  CHECK(npy_header(NpyElement::int16, ten).find("'descr': '<i2'") != std::string::npos);
}

TEST_CASE("written arrays read back through the memory map") {
  test_support::TemporaryDirectory directory;
  const auto path = directory.path / "rows.npy";
  const std::vector<int64_t> values = {0, 0, 3, 7, -1, 1LL << 40};
  const std::vector<int64_t> shape = {3, 2};
  write_npy<int64_t>(path, values, shape);
  CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp-" + std::to_string(::getpid())));
  NpyArray array(path);
  CHECK(array.element() == NpyElement::int64);
  CHECK(array.shape() == shape);
  REQUIRE(array.size() == 6);
  for (int64_t i = 0; i < 6; ++i) CHECK(array[i] == values[static_cast<size_t>(i)]);

  const std::vector<uint32_t> unsigned_values = {4000000000u, 1};
  const std::vector<int64_t> two = {2};
  write_npy<uint32_t>(directory.path / "u.npy", unsigned_values, two);
  CHECK(NpyArray(directory.path / "u.npy")[0] == 4000000000LL);

  NpyArray moved = std::move(array);
  CHECK(moved[3] == 7);
  CHECK_THROWS_WITH_AS(write_npy<int64_t>(directory.path / "bad.npy", values, two),
                       doctest::Contains("48 bytes of data for shape (2,)"), common::Error);
}

TEST_CASE("damaged .npy files are refused naming the file") {
  test_support::TemporaryDirectory directory;
  const auto good = directory.path / "good.npy";
  const std::vector<int32_t> values = {1, 2, 3, 4};
  const std::vector<int64_t> shape = {4};
  write_npy<int32_t>(good, values, shape);
  const std::string bytes = test_support::read_file(good);
  const auto bad = directory.path / "bad.npy";

  CHECK(error_of(directory.path / "missing.npy").find("cannot read .npy file") !=
        std::string::npos);
  test_support::write_file(bad, "PK\x03\x04 not numpy");
  CHECK(error_of(bad).find("bad.npy: not a .npy file") != std::string::npos);
  test_support::write_file(bad, bytes.substr(0, bytes.size() - 2));
  CHECK(error_of(bad).find("14 bytes of data, but its header's shape (4,) of '<i4' needs 16") != std::string::npos);
  std::string float_array = bytes;
  float_array.replace(float_array.find("<i4"), 3, "<f8");
  test_support::write_file(bad, float_array);
  CHECK(error_of(bad).find("element type '<f8' is not one of the index types") != std::string::npos);
  std::string version = bytes;
  version[6] = 7;
  test_support::write_file(bad, version);
  CHECK(error_of(bad).find("format version 7 is unknown") != std::string::npos);
  std::string fortran = npy_header(NpyElement::int32, std::vector<int64_t>{2, 2});
  fortran.replace(fortran.find("False"), 5, "True ");
  test_support::write_file(bad, fortran + bytes.substr(128));
  CHECK(error_of(bad).find("Fortran-ordered") != std::string::npos);
}

TEST_CASE("a shape whose element count wraps is refused, and a refused file leaves no mapping") {
  test_support::TemporaryDirectory directory;
  const auto bad = directory.path / "bad.npy";
  // 2^40 × 2^40 int32 elements wrapped to 0, the bytes of data the file has: it was accepted.
  const std::vector<int64_t> wrapping = {int64_t{1} << 40, int64_t{1} << 40};
  test_support::write_file(bad, npy_header(NpyElement::int32, wrapping));
  CHECK(error_of(bad).find("bad.npy: its header's shape (1099511627776, 1099511627776) of "
                           "'<i4' needs more than the 0 bytes of data it holds") !=
        std::string::npos);
  // Empty fields are Python's only after the last comma (the reader took "(2,,3)" as (2, 3)).
  for (const std::string tuple : {"(2,,3)", "(,)", "(,4)"}) {
    std::string header = npy_header(NpyElement::int32, std::vector<int64_t>{6});
    header.replace(header.find("(6,)"), 4, tuple);
    test_support::write_file(bad, header + std::string(24, '\0'));
    CHECK(error_of(bad).find("the .npy shape " + tuple + " is not a tuple of sizes") !=
          std::string::npos);
  }
  std::string trailing = npy_header(NpyElement::int32, std::vector<int64_t>{6});
  trailing.replace(trailing.find("(6,), }"), 7, "(6, ),}");  // the header's length kept
  test_support::write_file(bad, trailing + std::string(24, '\0'));
  CHECK(error_of(bad).empty());
  // A file refused after it was mapped unmaps it: the constructor's throw skips the destructor.
  const auto mappings = [] {
    return std::count(std::istreambuf_iterator<char>(std::ifstream("/proc/self/maps").rdbuf()),
                      std::istreambuf_iterator<char>(), '\n');
  };
  std::string version = npy_header(NpyElement::int32, std::vector<int64_t>{1}) + "abcd";
  version[6] = 7;
  test_support::write_file(bad, version);
  REQUIRE(error_of(bad).find("format version 7 is unknown") != std::string::npos);
  const auto before = mappings();
  for (int i = 0; i < 20; ++i) CHECK_FALSE(error_of(bad).empty());
  CHECK(mappings() < before + 20);
}

TEST_CASE("numpy loads our files and writes the same bytes") {
  if (!test_support::numpy_available()) return;
  test_support::TemporaryDirectory directory;
  const std::vector<int32_t> values = {5, -3, 2147483647, 0, 9, 1};
  const std::vector<int64_t> shape = {3, 2};
  write_npy<int32_t>(directory.path / "ours.npy", values, shape);
  const auto result = test_support::run_command(
      std::string(test_support::kPython) +
      " -c 'import numpy, sys; a = numpy.load(sys.argv[1], mmap_mode=\"r\"); "
      "e = numpy.array([[5, -3], [2147483647, 0], [9, 1]], dtype=numpy.int32); "
      "assert a.dtype == e.dtype and (a == e).all(); numpy.save(sys.argv[2], e); "
      "sys.exit(0 if open(sys.argv[1], \"rb\").read() == open(sys.argv[2], \"rb\").read() else 1)' " +
      (directory.path / "ours.npy").string() + " " + (directory.path / "numpys.npy").string());
  CAPTURE(result.output);
  CHECK(result.exit_status == 0);
}
