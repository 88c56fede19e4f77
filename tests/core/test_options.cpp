// collective_options, allreduce_policy, algorithm parsing, error hierarchy,
// collective_handle basics.
#include <dpkit/dpkit.hpp>

#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <type_traits>

template <class T>
std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

TEST_CASE("collective_options: defaults, equality, printing, deadline") {
  dpkit::collective_options o;
  CHECK(o.segment_bytes == (1u << 20));
  CHECK(o.pipeline_depth == 2);
  CHECK(o.timeout == std::chrono::minutes(30));
  CHECK(o.tag == 0x6470);
  CHECK(o.check == 1);          // DPKIT_CHECK unset: tags carry the fingerprint
  CHECK(o.native_deadline);     // native collectives waited against the deadline
  CHECK(str(o) == "segment_bytes=1048576 pipeline_depth=2 timeout_ms=1800000 tag=25712 check=1 native_deadline=1");
  dpkit::collective_options p{64, 4, std::chrono::milliseconds(200), 7};
  CHECK(str(p) == "segment_bytes=64 pipeline_depth=4 timeout_ms=200 tag=7 check=1 native_deadline=1");
  CHECK(o == dpkit::collective_options{});
  CHECK_FALSE(o == p);
  auto q = o;
  q.tag = 1;
  CHECK_FALSE(o == q);
  const auto before = dpkit::clock::now();
  const auto d = dpkit::deadline_after(std::chrono::milliseconds(500));
  CHECK(d - before >= std::chrono::milliseconds(500));
  CHECK(d - dpkit::clock::now() <= std::chrono::milliseconds(500));
}

TEST_CASE("DPKIT_TIMEOUT parser: seconds > 0 and >= 1 ms; anything else is an error naming the variable and the value") {
  using namespace std::chrono_literals;
  using dpkit::detail::parse_timeout_seconds;
  const auto fallback = dpkit::default_timeout;
  CHECK(parse_timeout_seconds("30", fallback) == 30000ms);
  CHECK(parse_timeout_seconds("0.25", fallback) == 250ms);
  CHECK(parse_timeout_seconds("1e3", fallback) == 1000000ms);
  CHECK(parse_timeout_seconds("0.001", fallback) == 1ms);  // the minimum
  CHECK(parse_timeout_seconds("0.0015", fallback) == 2ms); // rounded to the nearest ms
  CHECK(parse_timeout_seconds("1e9", fallback) == std::chrono::milliseconds(1'000'000'000'000LL)); // the maximum
  CHECK(parse_timeout_seconds(nullptr, fallback) == fallback); // unset
  CHECK(parse_timeout_seconds("", fallback) == fallback);      // set to nothing
  CHECK(dpkit::default_timeout == 1800000ms);
  // Never a silent fallback: each was 30 minutes (or a 0 ms deadline) before.
  for (const char* bad : {"abc", "-1", "-5", "0", "0.0", "nan", "NaN", "inf", "-inf", "10s", "30 ", " 30", "1,5", "0x10",
                          "1e400", "--1"}) {
    const std::string value = bad;
    CAPTURE(value);
    CHECK_THROWS_WITH_AS(parse_timeout_seconds(bad, fallback),
                         doctest::Contains(("DPKIT_TIMEOUT: expected seconds > 0, got '" + std::string(bad) + "'").c_str()),
                         dpkit::invalid_argument);
  }
  for (const char* tiny : {"1e-9", "0.0009", "0.0004"}) {
    const std::string value = tiny;
    CAPTURE(value);
    CHECK_THROWS_WITH_AS(parse_timeout_seconds(tiny, fallback),
                         doctest::Contains(("DPKIT_TIMEOUT: '" + std::string(tiny) + "' seconds is below the minimum of 0.001 s").c_str()),
                         dpkit::invalid_argument);
  }
  for (const char* huge : {"1e10", "1e300"}) {
    const std::string value = huge;
    CAPTURE(value);
    CHECK_THROWS_WITH_AS(parse_timeout_seconds(huge, fallback), doctest::Contains("is above the maximum of 1e9 s"),
                         dpkit::invalid_argument);
  }
  // the variable's name is the caller's
  CHECK_THROWS_WITH_AS(parse_timeout_seconds("x", fallback, "MY_TIMEOUT"), "MY_TIMEOUT: expected seconds > 0, got 'x'",
                       dpkit::invalid_argument);
}

TEST_CASE("DPKIT_CHECK parser: exactly 0, 1 or 2; anything else is an error naming the variable and the value") {
  using dpkit::detail::parse_check_level;
  CHECK(parse_check_level("0", 1) == 0);
  CHECK(parse_check_level("1", 0) == 1);
  CHECK(parse_check_level("2", 1) == 2);
  CHECK(parse_check_level(nullptr, 1) == 1);
  CHECK(parse_check_level("", 1) == 1);
  for (const char* bad : {"3", "-1", "yes", "on", "full", "10", "1 ", " 1", "01"}) {
    const std::string value = bad;
    CAPTURE(value);
    CHECK_THROWS_WITH_AS(parse_check_level(bad, 1),
                         doctest::Contains(("DPKIT_CHECK: expected 0 (off), 1 (tags) or 2 (full), got '" + std::string(bad) + "'").c_str()),
                         dpkit::invalid_argument);
  }
}

TEST_CASE("algorithm: names and parsing") {
  using dpkit::algorithm;
  CHECK(dpkit::parse_algorithm("auto") == algorithm::automatic);
  for (auto a : {algorithm::automatic, algorithm::ring, algorithm::tree, algorithm::native}) {
    CHECK(dpkit::parse_algorithm(dpkit::algorithm_name(a)) == a);
    CHECK(str(a) == dpkit::algorithm_name(a));
  }
  CHECK(str(algorithm::ring) == "ring");
  for (const char* bad : {"", "Ring", "trees", "nccl"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(dpkit::parse_algorithm(bad), dpkit::invalid_argument);
    try {
      dpkit::parse_algorithm(bad);
    } catch (const dpkit::invalid_argument& e) {
      CHECK(std::string(e.what()).find(std::string("'") + bad + "'") != std::string::npos);
    }
  }
}

TEST_CASE("allreduce_policy: equality, printing, choose by the built-in tuning rules") {
  using dpkit::algorithm;
  dpkit::allreduce_policy p;
  CHECK(p == dpkit::allreduce_policy{});
  CHECK(str(p) == "allreduce_policy{algo=automatic, use_shm=1, use_hierarchical=1, use_native=1, tuning=env}");
  dpkit::allreduce_policy ring{algorithm::ring};
  CHECK_FALSE(p == ring);
  CHECK(str(ring).find("algo=ring") != std::string::npos);
  auto q = p;
  q.use_shm = false;
  CHECK_FALSE(p == q);
  // Explicit algorithms are returned as is.
  for (auto a : {algorithm::ring, algorithm::tree, algorithm::native, algorithm::hierarchical}) {
    dpkit::allreduce_policy e{a};
    CHECK(e.choose(0, 1) == a);
    CHECK(e.choose(1u << 30, 1024) == a);
  }
  // automatic without a segment: tree below 4 KiB ...
  CHECK(p.choose(0, 2) == algorithm::tree);
  CHECK(p.choose(4095, 2) == algorithm::tree);
  CHECK(p.choose(4096, 2) == algorithm::ring);
  CHECK(p.choose(4096, 3) == algorithm::ring);
  // ... and from 4 ranks below 64 KiB
  CHECK(p.choose(4096, 4) == algorithm::tree);
  CHECK(p.choose(65535, 64) == algorithm::tree);
  CHECK(p.choose(65536, 64) == algorithm::ring);
  CHECK(p.choose(1u << 30, 2) == algorithm::ring);
  // with a segment: one-shot to 256 KiB on 2 ranks, 64 KiB on more, two-shot above
  CHECK(p.choose(8, 2, true) == algorithm::shm_one_shot);
  CHECK(p.choose(256u << 10, 2, true) == algorithm::shm_two_shot);
  CHECK(p.choose((256u << 10) - 1, 2, true) == algorithm::shm_one_shot);
  CHECK(p.choose((64u << 10) - 1, 3, true) == algorithm::shm_one_shot);
  CHECK(p.choose(64u << 10, 3, true) == algorithm::shm_two_shot);
  CHECK(p.choose(8, 1, true) == algorithm::tree); // one rank: nothing to share
  CHECK(q.choose(8, 2, true) == algorithm::tree);  // use_shm = false
  // across nodes: hierarchical where some node has several ranks
  const dpkit::tuning_availability across{false, true, true};
  CHECK(p.choose(8, dpkit::tuning_key{4, 2, 2}, across) == algorithm::hierarchical);
  CHECK(p.choose(1u << 26, dpkit::tuning_key{6, 3, 2}, across) == algorithm::hierarchical);
  auto no_hier = p;
  no_hier.use_hierarchical = false;
  CHECK(no_hier.choose(8, dpkit::tuning_key{4, 2, 2}, across) == algorithm::tree);
  CHECK(p.choose(1u << 20, dpkit::tuning_key{4, 4, 1}, {false, false, true}) == algorithm::ring);
  // the built-in rules never pick native
  CHECK(p.choose(8, dpkit::tuning_key{2, 1, 2}, {false, false, true}) == algorithm::tree);
}

TEST_CASE("errors: hierarchy") {
  static_assert(std::is_base_of_v<std::runtime_error, dpkit::error>);
  static_assert(std::is_base_of_v<std::invalid_argument, dpkit::invalid_argument>);
  static_assert(std::is_base_of_v<dpkit::error, dpkit::timeout_error>);
  static_assert(std::is_base_of_v<dpkit::error, dpkit::format_error>);
  CHECK_THROWS_AS(throw dpkit::timeout_error("x"), dpkit::error);
  CHECK_THROWS_WITH(throw dpkit::format_error("bad file f.idx"), "bad file f.idx");
}

TEST_CASE("collective_handle: default is complete; progress_thread runs FIFO and propagates exceptions") {
  dpkit::collective_handle h;
  CHECK_FALSE(h.valid());
  CHECK(h.test());
  h.wait();
  h.wait(dpkit::clock::now());
  std::vector<int> order;
  dpkit::collective_handle a, b, c;
  {
    dpkit::progress_thread t;
    a = t.submit([&] { order.push_back(1); });
    b = t.submit([&] { order.push_back(2); throw dpkit::invalid_argument("task 2 failed"); });
    c = t.submit([&] { order.push_back(3); });
    CHECK(a.valid());
    a.wait();
    CHECK_THROWS_WITH_AS(b.wait(), "task 2 failed", dpkit::invalid_argument);
    b.wait(); // rethrown once only
    c.wait(dpkit::clock::now() + std::chrono::seconds(10));
    CHECK(c.test());
  }
  CHECK(order == std::vector<int>{1, 2, 3});
  // wait(deadline) times out when the task is still running.
  dpkit::progress_thread t;
  std::atomic<bool> release{false};
  auto slow = t.submit([&] { while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1)); });
  const auto t0 = dpkit::clock::now();
  CHECK_THROWS_AS(slow.wait(dpkit::clock::now() + std::chrono::milliseconds(50)), dpkit::timeout_error);
  CHECK(dpkit::clock::now() - t0 >= std::chrono::milliseconds(50));
  CHECK_FALSE(slow.test());
  release = true;
  slow.wait();
  CHECK(slow.test());
}
