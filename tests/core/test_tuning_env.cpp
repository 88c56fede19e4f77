// DPKIT_TUNING_FILE read by algorithm::automatic (run by meson with the
// variable set): with tests/core/tuning/ring_everywhere.txt a 3-rank
// all-reduce on one node runs ring where the built-in rules pick shm; with
// tests/core/tuning/damaged.txt every automatic all-reduce throws
// format_error naming the file and line, never a silent fallback.
#include <dpkit/dpkit.hpp>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

TEST_CASE("automatic all-reduce follows DPKIT_TUNING_FILE, and refuses a damaged one") {
  const std::string file = std::getenv("DPKIT_TUNING_FILE") ? std::getenv("DPKIT_TUNING_FILE") : "";
  REQUIRE(!file.empty());
  const bool damaged = file.find("damaged") != std::string::npos;
  dpkit::inproc_world world(3, nullptr, 4096);
  world.run([&](dpkit::inproc& comm) {
    std::vector<float> v(100, 1.f);
    if (damaged) {
      CHECK_THROWS_WITH_AS(dpkit::allreduce(comm, v), doctest::Contains("damaged.txt:3: from_bytes '64X'"),
                           dpkit::format_error);
      // an explicit algorithm does not read the file
      dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::ring});
      CHECK(v[0] == 3.f);
      return;
    }
    dpkit::allreduce(comm, v);
    CHECK(v[0] == 3.f);
    CHECK(std::string(comm.health().current().algo) == "ring");
    const std::string e = dpkit::explain_tuned({3, 1, 3}, 400, {true, false, false});
    CHECK(e.find("ring_everywhere.txt:3") != std::string::npos);
    // an explicit table in the policy comes first
    const auto t = dpkit::tuning_table::parse("dpkit-tuning 1\nallreduce 3 1 3 0 inf tree\n", "mine");
    dpkit::allreduce_policy p;
    p.tuning = &t;
    dpkit::allreduce(comm, v, dpkit::reduce_op::sum, p);
    CHECK(std::string(comm.health().current().algo) == "tree");
  });
}
