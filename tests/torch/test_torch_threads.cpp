// dpkit/torch/threads.hpp: libtorch's thread pools sized to the CPUs of the
// calling thread's affinity mask (restricted here with sched_setaffinity,
// as mpirun's binding restricts a rank), shared among the processes on the
// same CPUs; the warning when the threads exceed the CPUs. The independent
// reference is the mask the test itself set and libtorch's own
// at::get_num_threads().
#include <dpkit/core/cpus.hpp>
#include <dpkit/torch/threads.hpp>
#include <dpkit/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <ATen/Parallel.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace {

// Sets the calling thread's affinity mask to `cpus`; returns false if the
// kernel refused.
bool set_cpus(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return ::sched_setaffinity(0, sizeof set, &set) == 0;
}

// Restores the calling thread's mask and OMP_NUM_THREADS at scope exit.
struct restore_env_and_mask {
  std::vector<int> cpus = dpkit::usable_cpus();
  std::optional<std::string> omp;
  restore_env_and_mask() {
    if (const char* s = std::getenv("OMP_NUM_THREADS")) omp = s;
    ::unsetenv("OMP_NUM_THREADS");
  }
  ~restore_env_and_mask() {
    set_cpus(cpus);
    if (omp) ::setenv("OMP_NUM_THREADS", omp->c_str(), 1);
    else ::unsetenv("OMP_NUM_THREADS");
  }
};

// What a FILE* received.
std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[512];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

int calls = 0; // size_torch_threads calls in this process (the inter-op pool is sized by the first)

dpkit::torch_threads_result sized(const dpkit::torch_threads_options& o) {
  ++calls;
  return dpkit::size_torch_threads(o);
}

} // namespace

TEST_SUITE("torch") {

TEST_CASE("size_torch_threads: intra-op threads follow the affinity mask, not the machine") {
  restore_env_and_mask guard;
  const std::vector<int> all = guard.cpus;
  REQUIRE(!all.empty());
  REQUIRE(set_cpus({all.front()})); // as `mpirun` binding a rank to one core
  dpkit::torch_threads_options o;
  o.warn = nullptr;
  const bool first = calls == 0;
  const auto r = sized(o);
  CHECK(r.cpus == std::vector<int>{all.front()});
  CHECK(r.ranks_sharing == 1);
  CHECK(r.requested == 0);
  CHECK(r.intra_op == 1);
  CHECK(at::get_num_threads() == 1);
  CHECK_FALSE(r.oversubscribed);
  CHECK(r.warning.empty());
  if (first) { // a fresh process: libtorch lets the inter-op pool be sized once
    CHECK(r.inter_op_set);
    CHECK(r.inter_op == 1);
  }

  REQUIRE(set_cpus(all));
  const auto w = sized(o);
  CHECK(w.cpus == all);
  CHECK(w.intra_op == static_cast<int>(all.size()));
  CHECK(at::get_num_threads() == static_cast<int>(all.size()));
  CHECK_FALSE(w.inter_op_set); // sized already: left as it is, no exception
  CHECK(w.inter_op == r.inter_op);
  if (all.size() < 2) MESSAGE("one CPU only: the mask restriction above could not differ from the machine");

  // Two processes sharing these CPUs (e.g. two unbound ranks): half each.
  o.ranks_sharing_cpus = 2;
  const auto h = sized(o);
  CHECK(h.ranks_sharing == 2);
  CHECK(h.intra_op == std::max(1, static_cast<int>(all.size()) / 2));
  CHECK(h.oversubscribed == (all.size() < 2));
}

TEST_CASE("size_torch_threads: one warning line when the threads exceed the CPUs") {
  restore_env_and_mask guard;
  REQUIRE(set_cpus({guard.cpus.front()}));
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  dpkit::torch_threads_options o;
  o.warn = f;

  SUBCASE("asked for 2 threads on 1 CPU") {
    o.intra_op_threads = 2;
    const auto r = sized(o);
    CHECK(r.requested == 2);
    CHECK(r.intra_op == 2);
    CHECK(r.oversubscribed);
    CHECK(r.threads_on_cpus == 2);
    CHECK(r.cpus_shared == 1);
    CHECK(r.warning.find("oversubscribed: 1 process runs 2 intra-op threads on 1 CPU") != std::string::npos);
    CHECK(r.warning.find("asked for 2") != std::string::npos);
    CHECK(contents(f) == r.warning + "\n");
  }
  SUBCASE("OMP_NUM_THREADS=3 on 1 CPU") {
    ::setenv("OMP_NUM_THREADS", "3", 1);
    const auto r = sized(o);
    CHECK(r.requested == 3);
    CHECK(r.intra_op == 3);
    CHECK(r.oversubscribed);
    CHECK(contents(f) == r.warning + "\n");
  }
  SUBCASE("3 processes on 1 CPU") {
    o.ranks_sharing_cpus = 3;
    const auto r = sized(o);
    CHECK(r.intra_op == 1);
    CHECK(r.threads_on_cpus == 3);
    CHECK(r.oversubscribed);
    CHECK(r.warning.find("3 processes run 3 intra-op threads on 1 CPU") != std::string::npos);
    CHECK(contents(f) == r.warning + "\n");
  }
  SUBCASE("1 thread on 1 CPU: no warning") {
    o.intra_op_threads = 1;
    const auto r = sized(o);
    CHECK_FALSE(r.oversubscribed);
    CHECK(r.warning.empty());
    CHECK(contents(f).empty());
  }
  SUBCASE("negative requests are refused") {
    o.intra_op_threads = -1;
    CHECK_THROWS_AS(sized(o), dpkit::invalid_argument);
  }
  std::fclose(f);
}

TEST_CASE("thread shares of a node's processes: bound, unbound, oversubscribed, partly overlapping") {
  using dpkit::detail::plan_thread_share;
  using dpkit::detail::thread_claim;
  auto range = [](int a, int b) {
    std::vector<int> v;
    for (int i = a; i < b; ++i) v.push_back(i);
    return v;
  };
  // mpirun's default for 2 ranks: one core each
  std::vector<thread_claim> bound{{{0}, 0}, {{1}, 0}};
  auto s = plan_thread_share(bound, 1);
  CHECK(s.sharers == 1);
  CHECK(s.threads == 1);
  CHECK(s.load == 1);
  CHECK(s.capacity == 1);
  // --bind-to none: both on both cores, one thread each
  std::vector<thread_claim> unbound{{range(0, 2), 0}, {range(0, 2), 0}};
  s = plan_thread_share(unbound, 0);
  CHECK(s.sharers == 2);
  CHECK(s.threads == 1);
  CHECK(s.load == 2);
  CHECK(s.capacity == 2);
  // 2 unbound ranks on 16 cores: 8 each
  std::vector<thread_claim> wide{{range(0, 16), 0}, {range(0, 16), 0}};
  CHECK(plan_thread_share(wide, 1).threads == 8);
  // bound to sockets of 8: 8 each
  std::vector<thread_claim> sockets{{range(0, 8), 0}, {range(8, 16), 0}};
  CHECK(plan_thread_share(sockets, 0).threads == 8);
  CHECK(plan_thread_share(sockets, 0).sharers == 1);
  // 3 unbound ranks on 2 cores: 1 thread each, 3 threads on 2 CPUs
  std::vector<thread_claim> three{{range(0, 2), 0}, {range(0, 2), 0}, {range(0, 2), 0}};
  s = plan_thread_share(three, 2);
  CHECK(s.threads == 1);
  CHECK(s.load == 3);
  CHECK(s.capacity == 2);
  // a request is kept and counted
  std::vector<thread_claim> asked{{{0}, 4}, {{1}, 0}};
  s = plan_thread_share(asked, 0);
  CHECK(s.threads == 4);
  CHECK(s.load == 4);
  CHECK(s.capacity == 1);
  CHECK(plan_thread_share(asked, 1).load == 1);
  // partial overlap: {0}, {0,1}, {1}
  std::vector<thread_claim> chain{{{0}, 0}, {range(0, 2), 0}, {{1}, 0}};
  s = plan_thread_share(chain, 1);
  CHECK(s.sharers == 3);
  CHECK(s.threads == 1);
  CHECK(s.load == 3);
  CHECK(s.capacity == 2);
  s = plan_thread_share(chain, 0);
  CHECK(s.sharers == 2);
  CHECK(s.load == 2);
  CHECK(s.capacity == 2);
}

TEST_CASE("size_torch_threads over a transport: ranks count who shares their CPUs; one rank warns") {
  restore_env_and_mask guard;
  const std::vector<int> all = guard.cpus;
  REQUIRE(!all.empty());
  auto run = [&](const std::vector<std::vector<int>>& masks) {
    std::vector<dpkit::torch_threads_result> out(masks.size());
    std::vector<std::string> written(masks.size());
    dpkit::inproc_world w(static_cast<int>(masks.size()));
    w.run([&](dpkit::inproc& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      REQUIRE(set_cpus(masks[r])); // this rank's thread only
      std::FILE* f = std::tmpfile();
      REQUIRE(f);
      dpkit::torch_threads_options o;
      o.warn = f;
      out[r] = dpkit::size_torch_threads(comm, o);
      written[r] = contents(f);
      std::fclose(f);
    });
    return std::make_pair(out, written);
  };

  SUBCASE("both ranks on one CPU: 1 thread each, oversubscribed, rank 0 writes the line") {
    const auto [r, written] = run({{all.front()}, {all.front()}});
    for (const auto& x : r) {
      CHECK(x.ranks_sharing == 2);
      CHECK(x.intra_op == 1);
      CHECK(x.threads_on_cpus == 2);
      CHECK(x.cpus_shared == 1);
      CHECK(x.oversubscribed);
    }
    CHECK(written[0] == r[0].warning + "\n");
    CHECK(written[1].empty());
    CHECK(r[0].warning.find("2 processes run 2 intra-op threads on 1 CPU") != std::string::npos);
  }
  if (all.size() >= 2) {
    SUBCASE("one CPU each (mpirun's default binding): 1 thread each, no warning") {
      const auto [r, written] = run({{all[0]}, {all[1]}});
      for (std::size_t i = 0; i < r.size(); ++i) {
        CHECK(r[i].ranks_sharing == 1);
        CHECK(r[i].intra_op == 1);
        CHECK_FALSE(r[i].oversubscribed);
        CHECK(written[i].empty());
      }
    }
    SUBCASE("both on every CPU (--bind-to none): the CPUs split between them, no warning") {
      const auto [r, written] = run({all, all});
      for (std::size_t i = 0; i < r.size(); ++i) {
        CHECK(r[i].ranks_sharing == 2);
        CHECK(r[i].intra_op == static_cast<int>(all.size()) / 2);
        CHECK_FALSE(r[i].oversubscribed);
        CHECK(written[i].empty());
      }
    }
  }
}

} // TEST_SUITE
