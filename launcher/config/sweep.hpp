// Multirun (`launcher main -m ...`) as Hydra 1.3's BasicSweeper and basic launcher do it:
// every override may be a sweep, and one job runs per element of the cartesian product of
// the sweeps, in itertools.product order (the first override varies slowest), one after the
// other, job k numbered k from 0.
//
// Reference: https://hydra.cc/docs/1.3/tutorials/basic/running_your_app/multi-run/ ,
// https://hydra.cc/docs/1.3/advanced/override_grammar/extended/ and
// hydra/_internal/core_plugins/basic_sweeper.py. Sweeps understood:
//   a=1,2,3                  simple choice sweep (items are any override values: 'x,y', [1,2])
//   a=choice(1,2,3)          the same, written as a function
//   a=range(1,4)             1, 2, 3; range(stop), range(start, stop, step), named arguments
//                            start/stop/step; floats when start or step is a float
//   training=gpt3/126m,gpt3/400m, +group=a,b, ~key=a,b   sweeps of any override kind
// Not understood (a clear error): interval() (needs a sampling sweeper), glob(), sort(),
// shuffle(), tag() and the cast functions (int(), str(), ...).
#pragma once

#include <cstddef>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace launcher {

// A sweep larger than this is refused (common::Error) rather than launched: Hydra has no such
// limit, but a range() typo should not start a million jobs or exhaust memory.
inline constexpr std::size_t kMaxSweepJobs = 10000;

// The overrides that one override stands for in a multirun, each a plain override text:
// "a=1,2" -> {"a=1", "a=2"}, "a=range(0,6,2)" -> {"a=0", "a=2", "a=4"}, "a=[1,2]" -> itself.
// Each result is checked with parse_override; errors are common::Error with a caret.
std::vector<std::string> sweep_choices(std::string_view override_text);

// The jobs of a multirun: the cartesian product of every override's sweep_choices, the first
// override varying slowest. Every job lists all overrides, in command-line order. No
// overrides is one job with none.
std::vector<std::vector<std::string>> expand_sweeps(const std::vector<std::string>& overrides);

// Launches one job per element of `jobs` by calling launch(overrides, k) for k = 0, 1, ...
// Writes "Launching N jobs" and then, per job, "#k : <overrides>" (Hydra's job lines; hydra.*
// overrides are left out of them as Hydra does) to `terminal`. A job that throws
// common::Error is reported (spdlog error, "#k: <message>") and the sweep goes on with the
// next one. Returns 0 when every job returned 0, else the status of the first failed job, 2
// for a job that ended in common::Error; a summary names the failed jobs. Other exceptions
// propagate (they are internal errors).
int run_sweep(const std::vector<std::vector<std::string>>& jobs,
              const std::function<int(const std::vector<std::string>& overrides,
                                      std::size_t job_number)>& launch,
              std::ostream& terminal);

}  // namespace launcher
