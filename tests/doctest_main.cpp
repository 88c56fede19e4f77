// doctest's main(), compiled once into a static library shared by the test
// executables. One addition to doctest's own main: a run in which no test case
// passes the filters fails. Several meson tests run one executable with a
// filter (tests/collectives: -sf=*test_shm.cpp, -tc=...); a filter that no
// longer matches anything (a renamed file or test case) would otherwise pass
// with nothing tested.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

/// What the last test run reported (written by run_count_listener).
struct run_count {
  static inline bool ended = false;
  static inline unsigned passing_filters = 0;
};

/// A doctest listener that records how many test cases passed the filters.
struct run_count_listener : doctest::IReporter {
  explicit run_count_listener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override {
    run_count::ended = true;
    run_count::passing_filters = s.numTestCasesPassingFilters;
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

} // namespace

DOCTEST_REGISTER_LISTENER("dpkit_run_count", 1, run_count_listener);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc; // --help, --list-test-cases, --count, ...
  if (rc == 0 && run_count::ended && run_count::passing_filters == 0) {
    std::fprintf(stderr, "%s: no test case passed the filters: nothing was tested\n", argc > 0 ? argv[0] : "test");
    return 1;
  }
  return rc;
}
