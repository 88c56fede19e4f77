// Topology, split and the hierarchical collectives over the MPI transport,
// run by meson under mpiexec on one host divided into virtual nodes by
// DPKIT_RANKS_PER_NODE (2x2, 2+2+1, 2x3, 3x1), and by tests/cluster on the
// emulated cluster's hosts (tcp between them): the topology against rank / k;
// split against MPI_Comm_split itself; hierarchical all-reduce against
// MPI_Allreduce (integers: exact) and bitwise identical on every rank
// (floats), counts 0, 1, < ranks and larger than a node's shared buffer;
// broadcast from every root against MPI_Bcast, all-gather and reduce-scatter
// against MPI_Allgather and MPI_Reduce_scatter_block; and the unhappy path: a
// mismatch inside one node stops the ranks of every node within seconds, a
// rank that never joins gives timeout_error within the deadline.
#include <doctest/doctest.h>

#include <dpkit/dpkit.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

// Ranks per node of the run: DPKIT_RANKS_PER_NODE (virtual nodes on one
// host), else DPKIT_TEST_RANKS_PER_HOST (the emulated cluster's real hosts,
// ranks mapped by slot), else 0 (one node).
int per_node() {
  for (const char* v : {"DPKIT_RANKS_PER_NODE", "DPKIT_TEST_RANKS_PER_HOST"})
    if (const char* s = std::getenv(v); s && *s) return std::atoi(s);
  return 0;
}

template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  else return MPI_FLOAT;
}
MPI_Op mpi_op(dpkit::reduce_op op) {
  switch (op) {
  case dpkit::reduce_op::prod: return MPI_PROD;
  case dpkit::reduce_op::min: return MPI_MIN;
  case dpkit::reduce_op::max: return MPI_MAX;
  default: return MPI_SUM;
  }
}

template <class T>
void check_integers(dpkit::mpi& comm) {
  const int r = comm.rank();
  std::mt19937_64 g(static_cast<unsigned>(r) * 7919u + 3);
  const std::size_t n = static_cast<std::size_t>(comm.size());
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, n - 1, 2 * n + 1, std::size_t{100003},
                            (std::size_t{9} << 20) / sizeof(T) + 5}) // > two 4 MiB buffers: chunked
    for (auto op : {dpkit::reduce_op::sum, dpkit::reduce_op::prod, dpkit::reduce_op::min, dpkit::reduce_op::max})
      for (bool in_place : {false, true}) {
        CAPTURE(count);
        CAPTURE(in_place);
        CAPTURE(static_cast<int>(op));
        std::vector<T> in(count), out(count, T(0x5a)), ref(count);
        for (auto& x : in) x = static_cast<T>(op == dpkit::reduce_op::prod ? 1 + g() % 2 : g() % 50);
        if (count)
          MPI_Allreduce(in.data(), ref.data(), static_cast<int>(count), mpi_type<T>(), mpi_op(op), MPI_COMM_WORLD);
        auto& res = in_place ? in : out;
        dpkit::allreduce_policy p;
        if (in_place) p.algo = dpkit::algorithm::hierarchical; // out of place: automatic
        dpkit::allreduce(comm, in, res, op, p);
        std::size_t first = count;
        for (std::size_t i = 0; i < count && first == count; ++i)
          if (res[i] != ref[i]) first = i;
        CHECK(first == count);
      }
}

} // namespace

TEST_CASE("mpi topology: virtual nodes of DPKIT_RANKS_PER_NODE ranks, node transports with a segment") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const int k = per_node(), r = comm.rank(), n = comm.size();
  const auto& t = comm.topology();
  const int want_nodes = k > 0 ? (n + k - 1) / k : 1;
  CHECK(t.nodes() == want_nodes);
  CHECK(t.node() == (k > 0 ? r / k : 0));
  CHECK(t.local_rank() == (k > 0 ? r % k : r));
  CHECK(t.size() == n);
  if (t.nodes() > 1) CHECK(comm.shm() == nullptr);
  else CHECK(comm.shm() != nullptr);
  if (t.hierarchical()) {
    REQUIRE(comm.node_transport() != nullptr);
    CHECK(comm.node_transport()->size() == t.local_size());
    CHECK(comm.node_transport()->rank() == t.local_rank());
    CHECK(comm.node_transport()->shm() != nullptr);
    if (t.uniform() || t.local_rank() == 0) {
      REQUIRE(comm.cross_transport() != nullptr);
      CHECK(comm.cross_transport()->size() == t.nodes());
      CHECK(comm.cross_transport()->rank() == t.node());
    } else {
      CHECK(comm.cross_transport() == nullptr);
    }
  } else {
    CHECK(comm.node_transport() == nullptr);
    CHECK(comm.cross_transport() == nullptr);
  }
}

TEST_CASE("mpi split equals MPI_Comm_split: ranks, sizes, and its all-reduce equals MPI_Allreduce on the split") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const int r = comm.rank();
  for (int colors : {1, 2, 3}) {
    const int color = r % colors, key = (r * 5) % 3; // ties broken by rank
    auto sub = comm.split(color, key);
    MPI_Comm ref;
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &ref);
    int rr = 0, rs = 0;
    MPI_Comm_rank(ref, &rr);
    MPI_Comm_size(ref, &rs);
    CHECK(sub.rank() == rr);
    CHECK(sub.size() == rs);
    std::vector<std::int64_t> v(1000), w(1000);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>((r + 1) * (i % 13));
    MPI_Allreduce(v.data(), w.data(), 1000, MPI_INT64_T, MPI_SUM, ref);
    dpkit::allreduce(sub, v);
    CHECK(v == w);
    MPI_Comm_free(&ref);
  }
  CHECK_THROWS_AS((void)comm.split(-1, 0), dpkit::invalid_argument);
}

TEST_CASE("mpi hierarchical all-reduce equals MPI_Allreduce for integer types") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  check_integers<std::int32_t>(comm);
  check_integers<std::int64_t>(comm);
}

TEST_CASE("mpi hierarchical all-reduce of floats is bitwise identical on every rank, near the double sum") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const int n = comm.size();
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{5000}, std::size_t{3} << 20})
    for (auto op : {dpkit::reduce_op::sum, dpkit::reduce_op::avg}) {
      CAPTURE(count);
      std::vector<float> all(count * static_cast<std::size_t>(n)), v(count);
      std::mt19937 g(static_cast<unsigned>(count));
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (auto& x : all) x = u(g);
      std::memcpy(v.data(), all.data() + static_cast<std::size_t>(comm.rank()) * count, count * sizeof(float));
      dpkit::allreduce(comm, v, op, dpkit::allreduce_policy{dpkit::algorithm::hierarchical});
      std::vector<float> r0 = v;
      MPI_Bcast(r0.data(), static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD);
      CHECK(std::memcmp(v.data(), r0.data(), count * sizeof(float)) == 0);
      for (std::size_t i = 0; i < count; i += 997) {
        double ref = 0;
        for (int p = 0; p < n; ++p) ref += all[static_cast<std::size_t>(p) * count + i];
        if (op == dpkit::reduce_op::avg) ref /= n;
        CHECK(v[i] == doctest::Approx(ref).epsilon(1e-5).scale(1.0));
      }
    }
}

TEST_CASE("mpi hierarchical broadcast from every root equals MPI_Bcast") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const int n = comm.size(), r = comm.rank();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3000}, (std::size_t{5} << 20) + 3})
    for (int root = 0; root < n; ++root) {
      CAPTURE(count);
      CAPTURE(root);
      std::vector<std::int32_t> v(count), ref(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<std::int32_t>(r * 1000003 + static_cast<int>(i));
      ref = v;
      if (count) MPI_Bcast(ref.data(), static_cast<int>(count), MPI_INT32_T, root, MPI_COMM_WORLD);
      dpkit::broadcast(comm, v, root, root % 2 ? dpkit::algorithm::automatic : dpkit::algorithm::hierarchical);
      CHECK(v == ref);
    }
}

TEST_CASE("mpi hierarchical all-gather and reduce-scatter equal MPI_Allgather and MPI_Reduce_scatter_block") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const int n = comm.size(), r = comm.rank();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{300001}})
    for (auto a : {dpkit::algorithm::hierarchical, dpkit::algorithm::automatic}) {
      CAPTURE(count);
      std::vector<std::int32_t> part(count), out(count * static_cast<std::size_t>(n), -1), ref(out.size());
      for (std::size_t i = 0; i < count; ++i) part[i] = static_cast<std::int32_t>(r * 7919 + static_cast<int>(i));
      if (count) MPI_Allgather(part.data(), static_cast<int>(count), MPI_INT32_T, ref.data(), static_cast<int>(count), MPI_INT32_T, MPI_COMM_WORLD);
      dpkit::allgather(comm, part, out, a);
      CHECK(out == ref);
      std::vector<std::int64_t> in(count * static_cast<std::size_t>(n)), res(count, -1), rref(count);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::int64_t>((r + 1) * (i % 1009));
      if (count) MPI_Reduce_scatter_block(in.data(), rref.data(), static_cast<int>(count), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
      dpkit::reduce_scatter(comm, in, res, dpkit::reduce_op::sum, a);
      CHECK(res == rref);
    }
}

TEST_CASE("mpi hierarchical all-reduce: a mismatch inside one node stops every rank of every node within seconds") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  if (!comm.topology().hierarchical()) return;
  dpkit::collective_options o;
  o.timeout = 60s;
  // the last rank passes another count: its node sees the mismatch
  std::vector<float> v(comm.rank() == comm.size() - 1 ? 3000 : 4000, 1.f);
  const auto t0 = std::chrono::steady_clock::now();
  std::string kind = "none";
  try {
    dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::hierarchical}, o);
  } catch (const dpkit::mismatch_error&) {
    kind = "mismatch";
  } catch (const dpkit::peer_error&) {
    kind = "peer";
  } catch (const dpkit::error& e) {
    kind = std::string("other: ") + e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CAPTURE(kind);
  CHECK((kind == "mismatch" || kind == "peer"));
  CHECK(s < 10.0);
  // the transport refuses reuse
  CHECK_THROWS_AS(dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::hierarchical}, o),
                  dpkit::error);
  int mm = kind == "mismatch" ? 1 : 0, any = 0;
  MPI_Allreduce(&mm, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(any == 1);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("mpi hierarchical all-reduce: a rank that never joins gives timeout_error within the deadline") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  if (comm.size() < 2) return;
  std::string kind;
  if (comm.rank() != comm.size() - 1) {
    dpkit::collective_options o;
    o.timeout = 500ms;
    std::vector<float> v(100000, 1.f);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::hierarchical}, o);
      kind = "ok";
    } catch (const dpkit::timeout_error&) {
      kind = "timeout";
    } catch (const dpkit::peer_error&) {
      kind = "peer";
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK((kind == "timeout" || kind == "peer"));
    CHECK(s < 5.0);
  }
  int timed_out = kind == "timeout" ? 1 : 0, any = 0;
  MPI_Allreduce(&timed_out, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(any == 1);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("mpi fragments between nodes: messages to another node go as fragments; results equal MPI's") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const auto& t = comm.topology();
  const int r = comm.rank(), n = comm.size();
  if (t.nodes() < 2) return;
  const std::size_t before = comm.inter_fragment_bytes();
  comm.set_inter_fragment_bytes(4096);
  CHECK(comm.inter_fragment_bytes() == 4096);
  if (comm.cross_transport()) CHECK(comm.cross_transport()->inter_fragment_bytes() == 4096);
  // The wire: rank 0 sends 10000 bytes to the first rank of another node and
  // to a rank of its own node; the receivers read them with plain MPI on
  // dpkit's communicator: three messages (4096, 4096, 1808) across nodes,
  // one of 10000 within.
  int remote = -1, local = -1;
  for (int p = 1; p < n; ++p) {
    if (remote < 0 && t.node_of(p) != t.node_of(0)) remote = p;
    if (local < 0 && t.node_of(p) == t.node_of(0)) local = p;
  }
  std::vector<std::byte> msg(10000);
  for (std::size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<std::byte>(i * 7 % 251);
  const auto far = dpkit::deadline_after(30s);
  if (r == 0) {
    auto a = comm.isend(msg, remote, 77);
    a.wait(far);
    if (local > 0) {
      auto b = comm.isend(msg, local, 78);
      b.wait(far);
    }
  } else if (r == remote || r == local) {
    std::vector<int> sizes;
    std::vector<std::byte> got;
    const int tag = r == remote ? 77 : 78;
    while (got.size() < msg.size()) {
      MPI_Status st;
      MPI_Probe(0, tag, comm.native_handle(), &st);
      int c = 0;
      MPI_Get_count(&st, MPI_BYTE, &c);
      sizes.push_back(c);
      const std::size_t at = got.size();
      got.resize(at + static_cast<std::size_t>(c));
      MPI_Recv(got.data() + at, c, MPI_BYTE, 0, tag, comm.native_handle(), MPI_STATUS_IGNORE);
    }
    CHECK(got == msg);
    if (r == remote) CHECK(sizes == std::vector<int>{4096, 4096, 1808});
    else CHECK(sizes == std::vector<int>{10000});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Collectives over fragments equal MPI's (ring, tree, hierarchical; counts
  // around the fragment size).
  for (auto a : {dpkit::algorithm::ring, dpkit::algorithm::tree, dpkit::algorithm::hierarchical})
    for (std::size_t count : {std::size_t{1}, std::size_t{1023}, std::size_t{1024}, std::size_t{1025}, std::size_t{300007}}) {
      CAPTURE(dpkit::algorithm_name(a));
      CAPTURE(count);
      std::vector<std::int64_t> v(count), ref(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<std::int64_t>((r + 3) * (i % 1009));
      MPI_Allreduce(v.data(), ref.data(), static_cast<int>(count), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
      dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{a});
      CHECK(v == ref);
    }
  std::vector<std::int32_t> b(50001, r == n - 1 ? 9 : 0), bref(50001, 9);
  dpkit::broadcast(comm, b, n - 1);
  CHECK(b == bref);
  CHECK_THROWS_AS(comm.set_inter_fragment_bytes(100), dpkit::invalid_argument);
  CHECK(comm.inter_fragment_bytes() == 4096);
  comm.set_inter_fragment_bytes(before);
}
