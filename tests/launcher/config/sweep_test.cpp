// Multirun sweeps: Hydra's sweep syntax (a=1,2  choice()  range()) expanded into plain
// overrides, the cartesian product in BasicSweeper's order, and the sweep runner's
// continue-on-error behaviour.
#include "launcher/config/sweep.hpp"

#include <doctest/doctest.h>

#include <sstream>

#include "backend/common/error.hpp"
#include "launcher/config/overrides.hpp"

using Strings = std::vector<std::string>;

TEST_CASE("sweep_choices expands Hydra's simple sweeps into one plain override per value") {
  const std::vector<std::pair<std::string, Strings>> cases = {
      {"a=1,2,3", {"a=1", "a=2", "a=3"}},
      {"a=1, 2 ,3", {"a=1", "a=2", "a=3"}},
      {"training=gpt3/126m,gpt3/400m", {"training=gpt3/126m", "training=gpt3/400m"}},
      {"+a.b=x,y", {"+a.b=x", "+a.b=y"}},
      {"++a=x,y", {"++a=x", "++a=y"}},
      {"~a=1,2", {"~a=1", "~a=2"}},
      {"db@backup=mysql,pg", {"db@backup=mysql", "db@backup=pg"}},
      {"a='x,y',z", {"a='x,y'", "a=z"}},
      {"a=[1,2],[3]", {"a=[1,2]", "a=[3]"}},
      {"a={x:1,y:2},{}", {"a={x:1,y:2}", "a={}"}},
      {"a=${b},c", {"a=${b}", "a=c"}},
      {"a=p\\,q,r", {"a=p\\,q", "a=r"}},
      // Not sweeps: one override, unchanged.
      {"a=1", {"a=1"}},
      {"a=[1,2]", {"a=[1,2]"}},
      {"a='x,y'", {"a='x,y'"}},
      {"a=", {"a="}},
      {"~a", {"~a"}},
  };
  for (const auto& [text, expected] : cases) {
    const auto& override_text = text;  // clang 14 cannot capture a structured binding (CAPTURE)
    CAPTURE(override_text);
    CHECK(launcher::sweep_choices(text) == expected);
  }
  // The expanded overrides mean what the sweep items meant.
  CHECK(launcher::parse_override(launcher::sweep_choices("a='x,y',z")[0]).value->as_string() ==
        "x,y");
  CHECK(launcher::parse_override(launcher::sweep_choices("a=p\\,q,r")[0]).value->as_string() ==
        "p,q");
  CHECK(launcher::parse_override(launcher::sweep_choices("a=[1,2],[3]")[0]).value->size() == 2);
}

TEST_CASE("choice() and range() sweep as Hydra's grammar functions do") {
  const std::vector<std::pair<std::string, Strings>> cases = {
      {"a=choice(1,2)", {"a=1", "a=2"}},
      {"a=choice( x , 'y,z' , [1] )", {"a=x", "a='y,z'", "a=[1]"}},
      {"a=choice(only)", {"a=only"}},
      {"a=range(1,4)", {"a=1", "a=2", "a=3"}},
      {"a=range(3)", {"a=0", "a=1", "a=2"}},
      {"a=range(0,10,4)", {"a=0", "a=4", "a=8"}},
      {"a=range(5,0,-2)", {"a=5", "a=3", "a=1"}},
      {"a=range(start=1, stop=3)", {"a=1", "a=2"}},
      {"a=range(1, step=2, stop=6)", {"a=1", "a=3", "a=5"}},
      {"a=range(0,1,0.25)", {"a=0.0", "a=0.25", "a=0.5", "a=0.75"}},
      {"a=range(1.0,3)", {"a=1.0", "a=2.0"}},
      {"a=range(-9223372036854775807,-9223372036854775805)",
       {"a=-9223372036854775807", "a=-9223372036854775806"}},
      {"a=range(9223372036854775806,9223372036854775807,1000000000000000000)",
       {"a=9223372036854775806"}},
  };
  for (const auto& [text, expected] : cases) {
    const auto& override_text = text;  // clang 14 cannot capture a structured binding (CAPTURE)
    CAPTURE(override_text);
    CHECK(launcher::sweep_choices(text) == expected);
  }
  CHECK(
      launcher::parse_override(launcher::sweep_choices("a=range(0,1,0.25)")[1]).value->is_float());
  CHECK(launcher::parse_override(launcher::sweep_choices("a=range(3)")[1]).value->is_int());
}

TEST_CASE("bad sweeps are common::Errors naming the override, with a caret") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a=1,,2", "expected a value after ','"},
      {"a=1,", "expected a value after ','"},
      {"a=choice()", "choice() needs at least one value"},
      {"a=choice(x=1)", "choice() takes values only"},
      {"a=choice(1,2", "missing ')'"},
      {"a=choice(1)x", "unexpected 'x'"},
      {"a=choice(choice(1))", "function calls are not supported here"},
      {"a=range(1,2,0)", "step must not be zero"},
      {"a=range(x,3)", "range() start must be a finite number, not 'x'"},
      {"a=range(1,'3')", "range() stop must be a finite number"},
      {"a=range(0,inf)", "must be a finite number"},
      {"a=range(true)", "must be a finite number"},
      {"a=range(1,2,3,4)", "at most 3 arguments"},
      {"a=range(begin=1)", "no argument 'begin'"},
      {"a=range(start=1,start=2)", "given twice"},
      {"a=range(start=1,2)", "positional argument follows a named one"},
      {"a=range(step=2)", "needs at least a stop value"},
      {"a=range(3,1)", "the range is empty"},
      {"a=range(0,10001)", "more than 10000 values"},
      {"a=range(0,1,1e-9)", "more than 10000 values"},
      {"a=interval(0,1)", "interval() needs a sampling sweeper"},
      {"a=glob(*)", "function 'glob' is not supported in sweeps (supported: choice, range)"},
      {"a..b=1,2", "empty name in the key"},
      {"a b=1,2", "unexpected character ' ' in the key"},
      {"a=1=2,3", "'=' in a value must be quoted"},
  };
  for (const auto& [text, message] : cases) {
    const auto& override_text = text;  // clang 14 cannot capture a structured binding (CAPTURE)
    CAPTURE(override_text);
    CHECK_THROWS_WITH_AS(launcher::sweep_choices(text), doctest::Contains(message.c_str()),
                         common::Error);
  }
  CHECK_THROWS_WITH_AS(launcher::sweep_choices("a=range(1,2,0)"),
                       "bad override 'a=range(1,2,0)': range() step must not be zero at column 3\n"
                       "  a=range(1,2,0)\n"
                       "    ^",
                       common::Error);
}

TEST_CASE("without -m a sweep is refused by parse_override, which says to add -m") {
  CHECK_THROWS_WITH_AS(launcher::parse_override("a=1,2"), doctest::Contains("add -m (--multirun)"),
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::parse_override("a=range(1,3)"),
                       doctest::Contains("with -m (--multirun)"), common::Error);
}

TEST_CASE("expand_sweeps is the cartesian product with the first override varying slowest") {
  const auto jobs = launcher::expand_sweeps({"a=1,2", "b=x", "c=range(3)"});
  const std::vector<Strings> expected = {
      {"a=1", "b=x", "c=0"}, {"a=1", "b=x", "c=1"}, {"a=1", "b=x", "c=2"},
      {"a=2", "b=x", "c=0"}, {"a=2", "b=x", "c=1"}, {"a=2", "b=x", "c=2"},
  };
  CHECK(jobs == expected);
  CHECK(launcher::expand_sweeps({}) == std::vector<Strings>{Strings{}});
  CHECK(launcher::expand_sweeps({"a=1", "b=2"}) == std::vector<Strings>{Strings{"a=1", "b=2"}});
  CHECK_THROWS_WITH_AS(launcher::expand_sweeps({"a=1,2", "b=range(5001)"}),
                       "the multirun has more than 10000 jobs (2 x 5001 values); sweep over "
                       "fewer values",
                       common::Error);
  CHECK(launcher::expand_sweeps({"a=range(100)", "b=range(100)"}).size() == 10000);
  CHECK_THROWS_AS(launcher::expand_sweeps({"a=1,2", "b..c=3"}), common::Error);
}

TEST_CASE("run_sweep launches every job in order, reports failures and goes on") {
  const std::vector<Strings> jobs = {
      {"a=1", "hydra.job.chdir=true"}, {"a=2", "hydra.job.chdir=true"}, {"a=3"}, {"a=4"}, {}};
  std::vector<std::pair<Strings, std::size_t>> calls;
  std::ostringstream terminal;
  const int status = launcher::run_sweep(
      jobs,
      [&calls](const Strings& overrides, std::size_t number) {
        calls.emplace_back(overrides, number);
        if (number == 1) common::fail("job one is broken");
        return number == 3 ? 7 : 0;
      },
      terminal);
  REQUIRE(calls.size() == 5);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    CHECK(calls[i].first == jobs[i]);
    CHECK(calls[i].second == i);
  }
  CHECK(terminal.str() == "Launching 5 jobs\n#0 : a=1\n#1 : a=2\n#2 : a=3\n#3 : a=4\n#4 :\n");
  CHECK(status == 2);  // the first failure: job 1's common::Error

  std::ostringstream quiet;
  CHECK(launcher::run_sweep(
            {{"a=1"}, {"a=2"}}, [](const Strings&, std::size_t n) { return n == 1 ? 5 : 0; },
            quiet) == 5);
  CHECK(launcher::run_sweep(
            {{"a=1"}}, [](const Strings&, std::size_t) { return 0; }, quiet) == 0);
  // Internal errors are not a job's failure: they stop the sweep.
  CHECK_THROWS_AS(
      launcher::run_sweep(
          {{"a=1"}, {"a=2"}},
          [](const Strings&, std::size_t) -> int { throw std::logic_error("bug"); }, quiet),
      std::logic_error);
}
