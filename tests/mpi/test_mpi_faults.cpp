// The unhappy path over MPI (docs/reliability.md), run under mpiexec with 2
// and 3 ranks: mismatched calls throw on every rank in well under a second
// with a 30-second deadline, a failed transport refuses reuse until it is
// replaced, native collectives honour the deadline. Each of these returned a
// silently wrong result, hung, or aborted the job in dpkit v0.1.
#include <doctest/doctest.h>

#include <dpkit/dpkit.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct result {
  std::string type = "ok";
  std::string what;
  double seconds = 0;
};

result run_case(const std::function<void(dpkit::mpi&, const dpkit::collective_options&)>& body, bool check = false) {
  result res;
  {
    dpkit::mpi comm(MPI_COMM_WORLD);
    dpkit::collective_options o;
    o.timeout = 30s;
    o.check = check ? 2 : 1;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      body(comm, o);
    } catch (const dpkit::mismatch_error& e) {
      res = {"mismatch", e.what(), 0};
    } catch (const dpkit::peer_error& e) {
      res = {"peer", e.what(), 0};
    } catch (const std::exception& e) {
      res = {"other", e.what(), 0};
    }
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return res;
}

// True on every rank when any rank's message names both `a` and `b`.
bool someone_names(const result& r, const std::string& a, const std::string& b) {
  int mine = contains(r.what, a) && contains(r.what, b) ? 1 : 0, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any == 1;
}

void check_thrown_fast(const result& r) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CAPTURE(rank);
  CAPTURE(r.what);
  CHECK((r.type == "mismatch" || r.type == "peer"));
  CHECK(r.seconds < 1.0);
}

} // namespace

TEST_CASE("mpi mismatch: op, type, count, kind and root disagreements throw on every rank in < 1 s (30 s deadline)") {
  int n, me;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (n < 2) return;
  SUBCASE("op: max on rank 1, sum elsewhere (ring)") {
    const auto r = run_case([](dpkit::mpi& c, const dpkit::collective_options& o) {
      std::vector<float> v(1000, 1.0f);
      dpkit::allreduce_ring(c, v, c.rank() == 1 ? dpkit::reduce_op::max : dpkit::reduce_op::sum, o);
    });
    check_thrown_fast(r);
    CHECK(someone_names(r, "allreduce(float, 1000, max, ring, seq 0)", "allreduce(float, 1000, sum, ring, seq 0)"));
  }
  SUBCASE("type: int32 on rank 1, float elsewhere (tree)") {
    const auto r = run_case([](dpkit::mpi& c, const dpkit::collective_options& o) {
      if (c.rank() == 1) {
        std::vector<std::int32_t> v(64, 1);
        dpkit::allreduce_tree(c, v, dpkit::reduce_op::sum, o);
      } else {
        std::vector<float> v(64, 1.0f);
        dpkit::allreduce_tree(c, v, dpkit::reduce_op::sum, o);
      }
    });
    check_thrown_fast(r);
    CHECK(someone_names(r, "allreduce(int32, 64", "allreduce(float, 64"));
  }
  SUBCASE("count: 2000 on the last rank, 1000 elsewhere") {
    const auto r = run_case([n](dpkit::mpi& c, const dpkit::collective_options& o) {
      std::vector<float> v(c.rank() == n - 1 ? 2000 : 1000, 1.0f);
      dpkit::allreduce(c, v, dpkit::reduce_op::sum, {}, o);
    });
    check_thrown_fast(r);
    CHECK(someone_names(r, "allreduce(float, 2000", "allreduce(float, 1000"));
  }
  SUBCASE("kind: broadcast on rank 0, all-reduce elsewhere") {
    const auto r = run_case([](dpkit::mpi& c, const dpkit::collective_options& o) {
      std::vector<float> v(100, 1.0f);
      // tree: the root only sends and returns (automatic would run shm,
      // where the root waits at the step like everyone)
      if (c.rank() == 0) dpkit::broadcast(c, v, 0, dpkit::algorithm::tree, o);
      else dpkit::allreduce(c, v, dpkit::reduce_op::sum, {}, o);
      dpkit::barrier(c, o); // the root's sends completed: it learns at its next call
    });
    check_thrown_fast(r);
    CAPTURE(r.what); CHECK(someone_names(r, "broadcast(float, 100, root 0, tree, seq 0)", "allreduce(float, 100"));
  }
  SUBCASE("broadcast: ranks name different roots (checking on: each rank only sends, so only agreement sees it)") {
    const auto r = run_case(
        [](dpkit::mpi& c, const dpkit::collective_options& o) {
          std::vector<float> v(100, static_cast<float>(c.rank()));
          dpkit::broadcast_tree(c, v, c.rank() == 0 ? 0 : 1, o);
          dpkit::barrier(c, o);
        },
        true);
    check_thrown_fast(r);
    CHECK(someone_names(r, "root 0", "root 1"));
  }
  SUBCASE("native with checking on: op and kind") {
    auto r = run_case(
        [](dpkit::mpi& c, const dpkit::collective_options& o) {
          std::vector<float> v(1000, 1.0f);
          dpkit::allreduce(c, v, c.rank() == 1 ? dpkit::reduce_op::max : dpkit::reduce_op::sum,
                           dpkit::allreduce_policy{dpkit::algorithm::native}, o);
        },
        true);
    check_thrown_fast(r);
    CHECK(someone_names(r, "max, native", "sum, native"));
    r = run_case(
        [](dpkit::mpi& c, const dpkit::collective_options& o) {
          std::vector<float> v(100, 1.0f);
          if (c.rank() == 0) dpkit::broadcast(c, v, 0, dpkit::algorithm::native, o);
          else dpkit::allreduce(c, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::native}, o);
        },
        true);
    check_thrown_fast(r);
    CHECK(someone_names(r, "broadcast(float, 100, root 0, native", "allreduce(float, 100, sum, native"));
  }
}

TEST_CASE("mpi mismatch: a zero-element call against a non-zero one throws on every rank, on every algorithm") {
  // Before: the zero-count rank returned at once and fell one call behind;
  // on shm (and automatic) its next calls paired with its peers' calls
  // before and every rank got sums of the wrong calls (9 and 15 for 6 and
  // 12) without an error.
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n < 2) return;
  for (auto a : {dpkit::algorithm::ring, dpkit::algorithm::tree, dpkit::algorithm::shm, dpkit::algorithm::automatic,
                 dpkit::algorithm::native}) {
    CAPTURE(dpkit::algorithm_name(a));
    std::vector<float> got;
    const auto r = run_case([&](dpkit::mpi& c, const dpkit::collective_options& o) {
      const dpkit::allreduce_policy pol{a};
      std::vector<float> v(c.rank() == n - 1 ? 0 : 1000, 1.0f);
      dpkit::allreduce(c, v, dpkit::reduce_op::sum, pol, o);
      for (int k = 0; k < 2; ++k) {
        std::vector<float> w(1000, static_cast<float>(k + 2));
        dpkit::allreduce(c, w, dpkit::reduce_op::sum, pol, o);
        got.push_back(w[0]);
      }
    });
    CAPTURE(got.size());
    CAPTURE(r.what);
    check_thrown_fast(r);
    CHECK(someone_names(r, "allreduce(float, 0,", "allreduce(float, 1000,"));
  }
  // every rank passes 0: still a collective that completes
  dpkit::mpi comm(MPI_COMM_WORLD);
  for (auto a : {dpkit::algorithm::ring, dpkit::algorithm::tree, dpkit::algorithm::shm, dpkit::algorithm::native}) {
    std::vector<float> none;
    dpkit::allreduce(comm, none, dpkit::reduce_op::sum, dpkit::allreduce_policy{a});
    std::vector<float> w(10, 1.0f);
    dpkit::allreduce(comm, w, dpkit::reduce_op::sum, dpkit::allreduce_policy{a});
    CHECK(w[0] == static_cast<float>(n));
  }
}

TEST_CASE("mpi mismatch: kinds differ where neither side sends (all-reduce on rank 0, broadcast elsewhere) in < 1 s") {
  // Before: a tree all-reduce's root waits for its child and the child, in a
  // tree broadcast, for the root: no message, so both waited out the whole
  // deadline (30 s) and threw timeout_error.
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n < 2) return;
  for (auto a : {dpkit::algorithm::ring, dpkit::algorithm::tree, dpkit::algorithm::shm, dpkit::algorithm::automatic}) {
    CAPTURE(dpkit::algorithm_name(a));
    const auto r = run_case([&](dpkit::mpi& c, const dpkit::collective_options& o) {
      std::vector<float> v(1000, 1.0f);
      if (c.rank() == 0) dpkit::allreduce(c, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{a}, o);
      else dpkit::broadcast(c, v, 0, a == dpkit::algorithm::ring ? dpkit::algorithm::tree : a, o);
      dpkit::barrier(c, o);
    });
    check_thrown_fast(r);
    CHECK(someone_names(r, "allreduce(float, 1000", "broadcast(float, 1000, root 0"));
  }
}

TEST_CASE("mpi native at the default checking level: count, op, type and root disagreements throw on every rank") {
  // Before: a count mismatch aborted the job inside Open MPI's non-blocking
  // collectives (double free, rc 134); op, type and root mismatches returned
  // disagreeing data.
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n < 2) return;
  const dpkit::allreduce_policy native{dpkit::algorithm::native};
  SUBCASE("count (small and large)") {
    for (std::size_t base : {std::size_t{2}, std::size_t{100000}}) {
      const auto r = run_case([&](dpkit::mpi& c, const dpkit::collective_options& o) {
        std::vector<float> v(c.rank() == n - 1 ? 2 * base : base, 1.0f);
        dpkit::allreduce(c, v, dpkit::reduce_op::sum, native, o);
      });
      check_thrown_fast(r);
      CHECK(someone_names(r, "allreduce(float, " + std::to_string(2 * base), "allreduce(float, " + std::to_string(base)));
    }
  }
  SUBCASE("op") {
    const auto r = run_case([&](dpkit::mpi& c, const dpkit::collective_options& o) {
      std::vector<float> v(4, 1.0f);
      dpkit::allreduce(c, v, c.rank() == 1 ? dpkit::reduce_op::max : dpkit::reduce_op::sum, native, o);
    });
    check_thrown_fast(r);
    CHECK(someone_names(r, "max, native", "sum, native"));
  }
  SUBCASE("type") {
    const auto r = run_case([&](dpkit::mpi& c, const dpkit::collective_options& o) {
      if (c.rank() == 1) {
        std::vector<std::int32_t> v(2, 1);
        dpkit::allreduce(c, v, dpkit::reduce_op::sum, native, o);
      } else {
        std::vector<float> v(2, 1.0f);
        dpkit::allreduce(c, v, dpkit::reduce_op::sum, native, o);
      }
    });
    check_thrown_fast(r);
    CHECK(someone_names(r, "allreduce(int32, 2", "allreduce(float, 2"));
  }
  SUBCASE("broadcast root") {
    const auto r = run_case([&](dpkit::mpi& c, const dpkit::collective_options& o) {
      std::vector<float> v(100, static_cast<float>(c.rank()));
      dpkit::broadcast(c, v, c.rank() == 0 ? 0 : 1, dpkit::algorithm::native, o);
    });
    check_thrown_fast(r);
    CHECK(someone_names(r, "root 0", "root 1"));
  }
}

TEST_CASE("mpi health: reuse after a failure throws communicator_error; a fresh dpkit::mpi recovers with correct results") {
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n < 2) return;
  std::string later;
  {
    dpkit::mpi comm(MPI_COMM_WORLD);
    dpkit::collective_options o;
    o.timeout = 30s;
    std::vector<float> v(1000, 1.0f);
    try {
      dpkit::allreduce_ring(comm, v, comm.rank() == 1 ? dpkit::reduce_op::max : dpkit::reduce_op::sum, o);
    } catch (const dpkit::error&) {
    }
    try { // catch and carry on, as users will
      dpkit::allreduce(comm, v, dpkit::reduce_op::sum, {}, o);
      later = "returned";
    } catch (const dpkit::communicator_error& e) {
      later = e.what();
    } catch (const std::exception& e) {
      later = std::string("wrong type: ") + e.what();
    }
  }
  CAPTURE(later);
  CHECK(contains(later, "failed earlier"));
  CHECK(contains(later, "seq 0"));
  MPI_Barrier(MPI_COMM_WORLD);
  dpkit::mpi fresh(MPI_COMM_WORLD);
  std::vector<float> v(1000, static_cast<float>(fresh.rank() + 1));
  dpkit::allreduce(fresh, v);
  CHECK(v == std::vector<float>(1000, static_cast<float>(n * (n + 1) / 2)));
}

TEST_CASE("mpi native: a rank that never joins makes MPI's non-blocking collective throw at the deadline, not hang") {
  int n, r;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (n < 2) return;
  {
    dpkit::mpi comm(MPI_COMM_WORLD);
    if (r != n - 1) {
      dpkit::collective_options o;
      o.timeout = 300ms;
      std::vector<float> v(16, 1.0f);
      const auto t0 = std::chrono::steady_clock::now();
      std::string type = "none";
      try {
        dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::native}, o);
      } catch (const dpkit::timeout_error&) {
        type = "timeout";
      } catch (const dpkit::peer_error&) {
        type = "peer";
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      CHECK((type == "timeout" || type == "peer"));
      CHECK(s >= 0.25);
      CHECK(s < 5.0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
