// DPKIT_TIMEOUT and DPKIT_CHECK as the library reads them (once per process,
// through env_default_timeout and env_check): run by meson once per value
// with the variable set. With DPKIT_TEST_EXPECT set, constructing
// collective_options (whose defaults read both) must throw
// dpkit::invalid_argument containing that text, at every construction, never
// fall back silently; with DPKIT_TEST_TIMEOUT_MS / DPKIT_TEST_CHECK set, the
// defaults must be those values.
#include <dpkit/dpkit.hpp>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

TEST_CASE("collective_options: DPKIT_TIMEOUT / DPKIT_CHECK from the environment") {
  if (const char* expect = std::getenv("DPKIT_TEST_EXPECT")) {
    for (int i = 0; i < 2; ++i) { // the failed read is not cached as a default
      CAPTURE(i);
      CHECK_THROWS_WITH_AS(dpkit::collective_options{}, doctest::Contains(expect), dpkit::invalid_argument);
    }
    return;
  }
  const dpkit::collective_options o;
  if (const char* ms = std::getenv("DPKIT_TEST_TIMEOUT_MS")) CHECK(o.timeout.count() == std::atoll(ms));
  if (const char* level = std::getenv("DPKIT_TEST_CHECK")) CHECK(o.check == std::atoi(level));
}
