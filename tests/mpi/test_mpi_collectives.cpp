// Collectives over the MPI transport, run by meson under mpiexec with 1-5
// ranks. Inputs are a deterministic function of (rank, index), so every rank
// computes the sequential reference for all ranks locally; results are also
// compared bytewise across ranks.
#include <doctest/doctest.h>

#include <dpkit/dpkit.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Small values so sums/products of up to 5 ranks are exact in every type.
template <class T>
T input(int rank, std::size_t i, dpkit::reduce_op op) {
  int v;
  if (op == dpkit::reduce_op::prod) v = 1 + static_cast<int>((i + static_cast<std::size_t>(rank)) % 2); // 1 or 2
  else v = static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11);
  if constexpr (std::is_same_v<T, dpkit::f16> || std::is_same_v<T, dpkit::bf16>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <class T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, dpkit::f16> || std::is_same_v<T, dpkit::bf16>) return static_cast<float>(v);
  else return static_cast<double>(v);
}

template <class T>
double reference(std::size_t i, dpkit::reduce_op op, int n) {
  double acc = as_double(input<T>(0, i, op));
  for (int r = 1; r < n; ++r) {
    const double x = as_double(input<T>(r, i, op));
    switch (op) {
    case dpkit::reduce_op::sum: case dpkit::reduce_op::avg: acc += x; break;
    case dpkit::reduce_op::prod: acc *= x; break;
    case dpkit::reduce_op::min: acc = std::min(acc, x); break;
    case dpkit::reduce_op::max: acc = std::max(acc, x); break;
    }
  }
  if (op == dpkit::reduce_op::avg) {
    if constexpr (std::is_integral_v<T>) acc = std::trunc(acc / n);
    else acc = acc / n;
  }
  return acc;
}

// Bytewise equality of `v` across ranks (allgather of a 64-bit FNV-1a hash).
template <class T>
bool identical_on_all_ranks(const std::vector<T>& v) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t k = 0; k < v.size() * sizeof(T); ++k) h = (h ^ p[k]) * 1099511628211ull;
  std::vector<std::uint64_t> all(static_cast<std::size_t>(world_size()));
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (auto x : all)
    if (x != h) return false;
  return true;
}

const std::vector<std::size_t> counts = {0, 1, 3, 7, 10007, (1u << 20) + 3};

} // namespace

TEST_CASE_TEMPLATE("mpi allreduce: every algorithm and op equals the sequential reference", T, float, double,
                   dpkit::f16, dpkit::bf16, std::int8_t, std::uint8_t, std::int32_t, std::uint32_t, std::int64_t,
                   std::uint64_t) {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const int n = comm.size(), r = comm.rank();
  for (auto algo : {dpkit::algorithm::ring, dpkit::algorithm::tree, dpkit::algorithm::native, dpkit::algorithm::automatic})
    for (auto op : {dpkit::reduce_op::sum, dpkit::reduce_op::prod, dpkit::reduce_op::min, dpkit::reduce_op::max,
                    dpkit::reduce_op::avg})
      for (std::size_t count : counts) {
        if (count > 100000 && !(std::is_same_v<T, float> || std::is_same_v<T, dpkit::bf16>)) continue;
        CAPTURE(algo);
        CAPTURE(op);
        CAPTURE(count);
        std::vector<T> in(count), out(count);
        for (std::size_t i = 0; i < count; ++i) in[i] = input<T>(r, i, op);
        dpkit::collective_options o;
        o.segment_bytes = 4096; // several segments per chunk even at small counts
        dpkit::allreduce(comm, in, out, op, {algo}, o);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const double ref = reference<T>(i, op, n);
          T want;
          if constexpr (std::is_same_v<T, dpkit::f16> || std::is_same_v<T, dpkit::bf16>) want = T(static_cast<float>(ref));
          else want = static_cast<T>(ref);
          if (std::memcmp(&want, &out[i], sizeof(T)) != 0) ++wrong;
        }
        CHECK(wrong == 0);
        CHECK(identical_on_all_ranks(out));
        // in place gives the same bytes
        dpkit::allreduce(comm, in, op, {algo}, o);
        CHECK((count == 0 || std::memcmp(in.data(), out.data(), count * sizeof(T)) == 0));
      }
}

TEST_CASE("mpi reduce_scatter, allgather, broadcast, reduce, barrier: dpkit's algorithm, shm and native, both placements") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const int n = comm.size(), r = comm.rank();
  const auto un = static_cast<std::size_t>(n);
  // automatic (shm when the ranks share a node), ring/tree over messages,
  // native, shm, native with a 4 KiB staging limit (each call in pieces:
  // 4099 elements cross several, with a short last one)
  for (int variant = 0; variant < 5; ++variant)
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{4099}}) {
    const dpkit::algorithm a = variant == 0   ? dpkit::algorithm::automatic
                               : variant == 1 ? dpkit::algorithm::ring
                               : variant == 2 || variant == 4 ? dpkit::algorithm::native
                                              : dpkit::algorithm::shm;
    if (variant == 4) comm.set_stage_limit(4096);
    const dpkit::algorithm rooted = variant == 1 ? dpkit::algorithm::tree : a; // broadcast, reduce
    CAPTURE(a);
    CAPTURE(count);
    dpkit::collective_options o;
    o.segment_bytes = 1024;
    // reduce-scatter: out[i] = sum_k in_k[r * count + i]
    std::vector<std::int32_t> in(count * un), out(count);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::int32_t>(i * 3 + static_cast<std::size_t>(r));
    auto expect_rs = [&](std::size_t i) {
      const std::size_t gi = static_cast<std::size_t>(r) * count + i;
      return static_cast<std::int32_t>(gi * 3 * un + un * (un - 1) / 2);
    };
    dpkit::reduce_scatter(comm, in, out, dpkit::reduce_op::sum, a, o);
    bool ok = true;
    for (std::size_t i = 0; i < count; ++i) ok &= out[i] == expect_rs(i);
    CHECK(ok);
    dpkit::reduce_scatter(comm, in, dpkit::reduce_op::sum, a, o); // in place: chunk r of in
    ok = true;
    for (std::size_t i = 0; i < count; ++i) ok &= in[static_cast<std::size_t>(r) * count + i] == expect_rs(i);
    CHECK(ok);
    // all-gather: out[k * count + i] = k * 1000 + i
    std::vector<std::int64_t> mine(count), all(count * un), all_inplace(count * un, -1);
    for (std::size_t i = 0; i < count; ++i) {
      mine[i] = r * 1000 + static_cast<std::int64_t>(i);
      all_inplace[static_cast<std::size_t>(r) * count + i] = mine[i];
    }
    dpkit::allgather(comm, mine, all, a, o);
    dpkit::allgather(comm, all_inplace, a, o);
    ok = true;
    for (std::size_t k = 0; k < un; ++k)
      for (std::size_t i = 0; i < count; ++i)
        ok &= all[k * count + i] == static_cast<std::int64_t>(k * 1000 + i) && all_inplace[k * count + i] == all[k * count + i];
    CHECK(ok);
    for (int root = 0; root < n; ++root) {
      CAPTURE(root);
      std::vector<double> b(count, r == root ? 42.5 : -1.0);
      dpkit::broadcast(comm, b, root, rooted, o);
      ok = true;
      for (double x : b) ok &= x == 42.5;
      CHECK(ok);
      std::vector<float> src(count, static_cast<float>(r + 1)), dst(r == root ? count : 0);
      dpkit::reduce(comm, src, dst, dpkit::reduce_op::max, root, rooted, o);
      ok = true;
      for (float x : dst) ok &= x == static_cast<float>(n);
      CHECK(ok);
    }
  }
  dpkit::barrier(comm);
  dpkit::barrier(comm, dpkit::algorithm::native);
  std::vector<float> t(4);
  CHECK_THROWS_AS(dpkit::reduce_scatter(comm, t, dpkit::reduce_op::sum, dpkit::algorithm::tree), dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::broadcast(comm, t, 0, dpkit::algorithm::ring), dpkit::invalid_argument);
}

TEST_CASE("mpi native with a deadline: the staging stays within its limit, and the sums are right") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const auto un = static_cast<std::size_t>(comm.size());
  CHECK(comm.staging_bytes() == 0);
  CHECK(comm.stage_limit() == std::size_t{64} << 20);
  comm.set_stage_limit(4096);
  const std::size_t count = 100003; // 400 KiB of floats: about 200 pieces
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>(i % 1000) + static_cast<float>(comm.rank());
  dpkit::allreduce(comm, v, dpkit::reduce_op::sum, {dpkit::algorithm::native});
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i)
    wrong += v[i] != static_cast<float>(un * (i % 1000) + un * (un - 1) / 2);
  CHECK(wrong == 0);
  std::vector<float> all(count * un);
  dpkit::allgather(comm, std::span<const float>(v), all, dpkit::algorithm::native);
  wrong = 0;
  for (std::size_t k = 0; k < un; ++k) wrong += std::memcmp(all.data() + k * count, v.data(), count * sizeof(float)) != 0;
  CHECK(wrong == 0);
  CHECK(comm.staging_bytes() > 0);
  CHECK(comm.staging_bytes() <= 4096 + 64);
  CHECK_THROWS_AS(comm.set_stage_limit(0), dpkit::invalid_argument);
}

TEST_CASE("mpi gather, scatter, all-to-all (even, uneven), receives from any rank, and a receive of the wrong length") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const int n = comm.size(), r = comm.rank();
  const auto un = static_cast<std::size_t>(n), ur = static_cast<std::size_t>(r);
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{4099}}) {
    CAPTURE(count);
    for (int root = 0; root < n; ++root) {
      std::vector<std::int64_t> mine(count, r * 7 + 1), all(r == root ? count * un : 0), back(count, -1);
      dpkit::gather(comm, mine, all, root);
      // MPI_Gather is the reference
      std::vector<std::int64_t> ref(r == root ? count * un : 0);
      MPI_Gather(mine.data(), static_cast<int>(count), MPI_INT64_T, ref.data(), static_cast<int>(count), MPI_INT64_T, root,
                 MPI_COMM_WORLD);
      CHECK(all == ref);
      dpkit::scatter(comm, all, back, root);
      CHECK(back == mine);
      // the list forms (one tensor per rank on root), against the same reference
      std::vector<std::vector<std::int64_t>> list(r == root ? un : 0, std::vector<std::int64_t>(count, -1));
      dpkit::gather(comm, mine, list, root);
      for (std::size_t p = 0; p < list.size(); ++p)
        CHECK(std::equal(list[p].begin(), list[p].end(), ref.begin() + static_cast<std::ptrdiff_t>(p * count)));
      std::vector<std::int64_t> back2(count, -1);
      dpkit::scatter(comm, list, back2, root);
      CHECK(back2 == mine);
    }
    std::vector<float> in(count * un), out(count * un), ref(count * un);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(r * 1000) + static_cast<float>(i % 1000);
    dpkit::alltoall(comm, in, out);
    MPI_Alltoall(in.data(), static_cast<int>(count), MPI_FLOAT, ref.data(), static_cast<int>(count), MPI_FLOAT, MPI_COMM_WORLD);
    CHECK(out == ref);
    // uneven: (r + p) % 3 * count elements from r to p, MPI_Alltoallv the reference
    std::vector<std::size_t> sc(un), rc(un);
    std::vector<int> isc(un), irc(un), isd(un), ird(un);
    for (std::size_t p = 0; p < un; ++p) {
      sc[p] = (ur + p) % 3 * count, rc[p] = (p + ur) % 3 * count;
      isc[p] = static_cast<int>(sc[p]), irc[p] = static_cast<int>(rc[p]);
      if (p) isd[p] = isd[p - 1] + isc[p - 1], ird[p] = ird[p - 1] + irc[p - 1];
    }
    std::vector<double> vin(std::accumulate(sc.begin(), sc.end(), std::size_t{0}));
    for (std::size_t i = 0; i < vin.size(); ++i) vin[i] = static_cast<double>(r) + 0.001 * static_cast<double>(i);
    std::vector<double> vout(std::accumulate(rc.begin(), rc.end(), std::size_t{0}), -1), vref(vout.size());
    dpkit::alltoallv(comm, vin, sc, vout, rc);
    MPI_Alltoallv(vin.data(), isc.data(), isd.data(), MPI_DOUBLE, vref.data(), irc.data(), ird.data(), MPI_DOUBLE,
                  MPI_COMM_WORLD);
    CHECK(vout == vref);
  }
  if (n == 1) return;
  // every other rank sends its rank to rank 0 with tag 100; rank 0 takes them from any rank
  std::int32_t word = r;
  const auto due = dpkit::deadline_after(std::chrono::seconds(30));
  if (r == 0) {
    std::vector<int> sources;
    for (int k = 1; k < n; ++k) {
      std::int32_t got = -1;
      auto q = comm.irecv_any(std::as_writable_bytes(std::span(&got, 1)), 100);
      q.wait(due);
      CHECK(q.source() == got);
      sources.push_back(q.source());
    }
    std::sort(sources.begin(), sources.end());
    for (int k = 1; k < n; ++k) CHECK(sources[static_cast<std::size_t>(k - 1)] == k);
  } else {
    auto s = comm.isend(std::as_bytes(std::span(&word, 1)), 0, 100);
    s.wait(due);
  }
  // a receive longer than its send: an error naming both lengths (MPI would complete it silently)
  if (r == 1) {
    std::int64_t big = 0;
    auto q = comm.irecv(std::as_writable_bytes(std::span(&big, 1)), 0, 101);
    CHECK_THROWS_WITH_AS(q.wait(due), doctest::Contains("8 bytes) matched a message of 4 bytes"), dpkit::error);
  } else if (r == 0) {
    auto s = comm.isend(std::as_bytes(std::span(&word, 1)), 1, 101);
    s.wait(due);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("mpi async all-reduces complete in submission order") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const int n = comm.size();
  std::vector<std::vector<float>> bufs;
  for (int k = 0; k < 6; ++k) bufs.emplace_back(static_cast<std::size_t>(1000 * (k + 1)), static_cast<float>(k));
  std::vector<dpkit::collective_handle> hs;
  for (auto& b : bufs) hs.push_back(dpkit::allreduce_async(comm, b, dpkit::reduce_op::sum));
  for (auto& h : hs) h.wait();
  for (int k = 0; k < 6; ++k) {
    bool ok = true;
    for (float x : bufs[static_cast<std::size_t>(k)]) ok &= x == static_cast<float>(k * n);
    CHECK(ok);
  }
}

TEST_CASE("mpi bad input raises typed errors naming the value and rank") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  std::vector<float> a(10), b(12);
  CHECK_THROWS_WITH_AS(dpkit::allreduce_ring(comm, a, b), doctest::Contains("has 12 elements, expected 10"),
                       dpkit::invalid_argument);
  CHECK_THROWS_WITH_AS(dpkit::allreduce_ring(comm, a, b), doctest::Contains(("rank " + std::to_string(comm.rank())).c_str()),
                       dpkit::invalid_argument);
  std::vector<std::byte> buf(4);
  CHECK_THROWS_WITH_AS((void)comm.isend(buf, comm.size() + 3, 0), doctest::Contains(std::to_string(comm.size() + 3).c_str()),
                       dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::broadcast_tree(comm, a, comm.size()), dpkit::invalid_argument);
  dpkit::barrier(comm);
}

TEST_CASE("mpi: a rank that never joins makes the others throw timeout_error within the deadline") {
  const int n = world_size(), r = world_rank();
  if (n < 2) return;
  using namespace std::chrono;
  for (auto algo : {dpkit::algorithm::ring, dpkit::algorithm::tree}) {
    CAPTURE(algo);
    {
      // Own communicator: messages left behind by the aborted collective die with it.
      dpkit::mpi comm(MPI_COMM_WORLD);
      if (r != n - 1) {
        std::vector<float> v(16, 1.0f);
        dpkit::collective_options o;
        o.timeout = milliseconds(300);
        const auto t0 = steady_clock::now();
        // A timeout here, or peer_error when another waiting rank timed out
        // first and told this one (docs/reliability.md).
        std::string what = "no exception";
        try {
          dpkit::allreduce(comm, v, dpkit::reduce_op::sum, {algo}, o);
        } catch (const dpkit::timeout_error& e) {
          what = e.what();
          CHECK(contains(what, "deadline"));
        } catch (const dpkit::peer_error& e) {
          what = e.what();
        }
        CAPTURE(what);
        CHECK(contains(what, "rank " + std::to_string(r)));
        const auto waited = duration_cast<milliseconds>(steady_clock::now() - t0).count();
        CHECK(waited >= 250);
        CHECK(waited < 5000);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
