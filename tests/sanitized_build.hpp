// Whether this test executable is built with AddressSanitizer (the asan preset). The few tests
// that take minutes under the sanitizers, for code the sanitized suite reaches elsewhere, are
// left to the release build with `* test_support::release_only()`: doctest's skip decorator,
// which also leaves them out of `--list-test-cases`, so the sanitized build never registers
// them with CTest. (A doctest test suite turned into a CTest label did the same, but labels
// cost one run of the test executable per test case at build time: minutes in CI.)
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace test_support {

// The tests' own files are compiled without the sanitizers (CMakeLists.txt), so the build
// says which one this is.
#if defined(TEST_SANITIZED_BUILD)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif

inline doctest::skip release_only() { return doctest::skip(kSanitizedBuild); }

// The model styles a long multi-rank e2e test trains: both in the release build; in the
// sanitized build only "llama" (the style with more switches on: RMSNorm, SwiGLU, RoPE, grouped
// attention), since there each run costs several times more and the collectives, the code the
// sanitizers watch there, are the same for both styles.
inline std::vector<std::string> model_styles() {
  if (kSanitizedBuild) return {"llama"};
  return {"gpt2", "llama"};
}

}  // namespace test_support
