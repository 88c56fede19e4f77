// dpkit/core/cpus.hpp: the CPUs of the calling thread's affinity mask
// (restricted here with sched_setaffinity, as mpirun's binding restricts a
// rank), against the mask the test set itself.
#include <dpkit/core/cpus.hpp>

#include <doctest/doctest.h>

#include <sched.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace {
bool set_cpus(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return ::sched_setaffinity(0, sizeof set, &set) == 0;
}
} // namespace

TEST_CASE("usable_cpus: the calling thread's affinity mask, not the machine's CPUs") {
  const std::vector<int> all = dpkit::usable_cpus();
  REQUIRE(!all.empty());
  CHECK(std::is_sorted(all.begin(), all.end()));
  CHECK(dpkit::usable_cpu_count() == all.size());
  CHECK(all.size() <= std::max(1u, std::thread::hardware_concurrency()));

  REQUIRE(set_cpus({all.back()})); // as mpirun binding a rank to one core
  CHECK(dpkit::usable_cpus() == std::vector<int>{all.back()});
  CHECK(dpkit::usable_cpu_count() == 1u);
  std::vector<int> seen;
  std::thread([&] { seen = dpkit::usable_cpus(); }).join(); // a new thread inherits the mask
  CHECK(seen == std::vector<int>{all.back()});

  REQUIRE(set_cpus(all));
  CHECK(dpkit::usable_cpus() == all);
}

TEST_CASE("cpu_list_string: ranges for messages") {
  CHECK(dpkit::cpu_list_string({}) == "none");
  CHECK(dpkit::cpu_list_string({3}) == "3");
  CHECK(dpkit::cpu_list_string({0, 1, 2, 3}) == "0-3");
  CHECK(dpkit::cpu_list_string({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
}
