// Test support: Megatron's iteration log lines of the launcher's three-iteration tiny run
// (launcher_main_test.cpp, slurm_launch_test.cpp), counted in a log.
#pragma once

#include <iterator>
#include <regex>
#include <string>

namespace test_support {

inline int count_matches(const std::string& text, const std::regex& pattern) {
  return static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), pattern),
                                        std::sregex_iterator()));
}

inline const std::regex kIterationLine(
    R"( \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration +\d+/ +3 \| consumed samples: +\d+ \| elapsed time per iteration \(ms\): [0-9.]+ \| learning rate: \d\.\d{6}E[-+]\d\d \| global batch size: +4 \| lm loss: \d\.\d{6}E[-+]\d\d \| loss scale: 1\.0 \| grad norm: [0-9.]+ \| number of skipped iterations: +0 \| number of nan iterations: +0 \|)");

}  // namespace test_support
