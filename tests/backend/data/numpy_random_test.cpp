// numpy's legacy RandomState, reproduced: the raw MT19937 stream, random_interval (32- and
// 64-bit) and shuffle, against values numpy 1.24 produced (and, with numpy installed, against
// numpy itself on a large array).
#include <doctest/doctest.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "backend/data/npy_file.hpp"
#include "backend/data/numpy_random.hpp"
#include "tests/backend/data/numpy_reference.hpp"
#include "tests/temporary_directory.hpp"

using backend::NumpyRandomState;

TEST_CASE("RandomState(seed) is MT19937 seeded as numpy seeds it") {
  // numpy.random.RandomState(1234)._bit_generator.random_raw(3)
  NumpyRandomState random(1234);
  CHECK(random.next_uint32() == 822569775u);
  CHECK(random.next_uint32() == 2137449171u);
  CHECK(random.next_uint32() == 2671936806u);
}

TEST_CASE("shuffle reproduces RandomState.shuffle, stream continuing across calls") {
  // rs = numpy.random.RandomState(5); rs.shuffle(arange(7)); rs.shuffle(arange(9))
  NumpyRandomState random(5);
  std::vector<uint32_t> first(7), second(9);
  std::iota(first.begin(), first.end(), 0u);
  std::iota(second.begin(), second.end(), 0u);
  random.shuffle(std::span<uint32_t>(first));
  random.shuffle(std::span<uint32_t>(second));
  CHECK(first == std::vector<uint32_t>{6, 2, 4, 1, 0, 5, 3});
  CHECK(second == std::vector<uint32_t>{2, 1, 4, 8, 5, 0, 3, 6, 7});

  std::vector<int32_t> single = {42}, empty;
  random.shuffle(std::span<int32_t>(single));
  random.shuffle(std::span<int32_t>(empty));
  CHECK(single == std::vector<int32_t>{42});
}

TEST_CASE("interval above 2^32 draws 64-bit values, high word first") {
  // numpy.random.RandomState(1234).randint(0, 2**40 + 5, size=4, dtype=numpy.int64): legacy
  // randint draws masked 64-bit values and rejects those above 2^40 + 4, as random_interval.
  NumpyRandomState random(1234);
  const uint64_t max = (uint64_t{1} << 40) + 4;
  CHECK(random.interval(max) == 878802328948ULL);
  CHECK(random.interval(max) == 656147994617ULL);
  CHECK(random.interval(max) == 617876871857ULL);
  CHECK(random.interval(max) == 662277595166ULL);
  CHECK(random.interval(0) == 0);
}

TEST_CASE("a large shuffle equals numpy's, element for element") {
  if (!test_support::numpy_available()) return;
  test_support::TemporaryDirectory directory;
  for (const auto& [seed, count] : {std::pair<uint32_t, int>{1234, 100000}, {0, 4097}, {4294967295u, 65537}}) {
    std::vector<int32_t> values(static_cast<size_t>(count));
    std::iota(values.begin(), values.end(), 0);
    NumpyRandomState random(seed);
    random.shuffle(std::span<int32_t>(values));
    const auto path = directory.path / "ours.npy";
    std::filesystem::remove(path);
    const std::vector<int64_t> shape = {count};
    backend::write_npy<int32_t>(path, values, shape);
    const auto result = test_support::run_command(
        std::string(test_support::kPython) +
        " -c 'import numpy, sys; a = numpy.arange(" + std::to_string(count) +
        ", dtype=numpy.int32); numpy.random.RandomState(" + std::to_string(seed) +
        ").shuffle(a); sys.exit(0 if (numpy.load(sys.argv[1]) == a).all() else 1)' " + path.string());
    const uint32_t seed_value = seed;  // clang 14 cannot capture a structured binding (CAPTURE)
    CAPTURE(seed_value);
    CAPTURE(result.output);
    CHECK(result.exit_status == 0);
  }
}
