// DPKIT_TIMEOUT and DPKIT_CHECK as the library reads them (once per process,
// through env_default_timeout and env_check): run by meson once per value
// with the variable set. With DPKIT_TEST_EXPECT set, constructing
// collective_options (whose defaults read both) must throw
// dpkit::invalid_argument containing that text, at every construction, never
// fall back silently; with DPKIT_TEST_TIMEOUT_MS / DPKIT_TEST_CHECK set, the
// defaults must be those values.
#include <dpkit/dpkit.hpp>
#include <dpkit/transport/detail/shm_p2p.hpp>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>
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

TEST_CASE("shm p2p: the single-copy threshold parses DPKIT_SHM_CMA and DPKIT_SHM_CMA_BYTES strictly") {
  namespace dd = dpkit::detail;
  CHECK(dd::parse_shm_cma_bytes(nullptr, nullptr) == std::size_t{64} << 10);
  CHECK(dd::parse_shm_cma_bytes("", "") == std::size_t{64} << 10);
  CHECK(dd::parse_shm_cma_bytes("0", "4096") == SIZE_MAX);
  CHECK(dd::parse_shm_cma_bytes("1", "4096") == 4096);
  CHECK(dd::parse_shm_cma_bytes(nullptr, "0") == 0);
  for (const char* off : {"no", "2", "off", " 0"}) {
    CAPTURE(off);
    CHECK_THROWS_WITH_AS(dd::parse_shm_cma_bytes(off, nullptr), doctest::Contains("DPKIT_SHM_CMA: expected 0 (off) or 1 (on), got '"),
                         dpkit::invalid_argument);
  }
  for (const char* bytes : {"1M", "-1", "+5", "12 ", "abc", "99999999999999999999999"}) {
    CAPTURE(bytes);
    const std::string expect = std::string("DPKIT_SHM_CMA_BYTES: expected a byte count, got '") + bytes + "'";
    CHECK_THROWS_WITH_AS(dd::parse_shm_cma_bytes(nullptr, bytes), doctest::Contains(expect.c_str()), dpkit::invalid_argument);
  }
  // as the transport reads them, from this run's environment
  if (const char* expect = std::getenv("DPKIT_TEST_CMA_EXPECT")) {
    for (int i = 0; i < 2; ++i) { // the failed read is not cached
      CAPTURE(i);
      CHECK_THROWS_WITH_AS((void)dd::shm_p2p_cma_bytes(), doctest::Contains(expect), dpkit::invalid_argument);
    }
  } else if (const char* bytes = std::getenv("DPKIT_TEST_CMA_BYTES")) {
    CHECK(dd::shm_p2p_cma_bytes() == std::strtoull(bytes, nullptr, 10));
  }
}
