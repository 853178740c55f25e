// doctest's main for every test executable, with one addition: a run given a test-case filter
// (as CTest runs each TEST_CASE that doctest_discover_tests registered) that matches no test case
// fails. CTest cuts a test name at a ';' (its list separator), and the cut name then matched
// nothing and "passed" without running; now such a registration is a failure, not a silent skip.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string_view>

namespace {

unsigned test_cases_matching_filters = 0;

// A listener that records how many test cases passed the filters.
struct FilterCounter final : doctest::IReporter {
  explicit FilterCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    test_cases_matching_filters = stats.numTestCasesPassingFilters;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("filter_counter", 1, FilterCounter);

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit() || result != 0) return result;
  bool filtered = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument = argv[i];
    filtered = filtered || argument.starts_with("--test-case=") || argument.starts_with("-tc=");
  }
  if (filtered && test_cases_matching_filters == 0) {
    std::fprintf(stderr, "no test case matches the --test-case filter: nothing ran (a name that "
                         "CTest cut at a ';'?)\n");
    return 1;
  }
  return result;
}
