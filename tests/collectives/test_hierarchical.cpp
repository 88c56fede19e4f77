// Topology, split and the hierarchical (node-aware) collectives on inproc
// worlds with declared virtual nodes: node_layout / node_topology against
// hand-computed values; split against MPI_Comm_split's rules (colors, keys,
// ties, a world of its own, failures crossing between the worlds, a rank
// that never splits); hierarchical all-reduce and broadcast of every element
// type and op against the sequential reference, bitwise identical on every
// rank, on uniform layouts (2x2, 3x2, 2x3, interleaved), uneven ones (2+3,
// 3+1+2), one rank per node (4x1) and one node (1x4), counts 0, 1, < ranks,
// not divisible, larger than a node's shared buffer (chunked); the
// automatic policy choosing it across nodes; and the unhappy path (a
// mismatch in one node stops every rank at once, the transport refuses
// reuse, transports without nodes refuse algorithm::hierarchical).
#include "common.hpp"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

using namespace std::chrono_literals;

namespace {

using dpkit::node_layout;

struct named_layout {
  const char* name;
  node_layout layout;
};

std::vector<named_layout> layouts() {
  std::vector<named_layout> v = {
      {"2x2", node_layout::blocks(2, 2)},
      {"3x2", node_layout::blocks(3, 2)},
      {"2x3", node_layout::blocks(2, 3)},
      {"interleaved 0,1,0,1,1,0", node_layout{{0, 1, 0, 1, 1, 0}}},
      {"2+3", node_layout::sizes({2, 3})},
      {"3+1+2", node_layout::sizes({3, 1, 2})},
      {"4x1", node_layout::blocks(4, 1)},
      {"1x4", node_layout::blocks(1, 4)},
  };
  if (!test_sizes::quick()) v.push_back({"3x3", node_layout::blocks(3, 3)});
  return v;
}

// Runs all-reduce (algorithm::hierarchical and automatic, in and out of
// place) and broadcast (every root) for every op and count on one world;
// returns the failures.
template <class T>
int check_layout(const named_layout& nl, std::size_t shm_bytes) {
  const int n = nl.layout.size();
  const std::size_t nn = static_cast<std::size_t>(n);
  const std::size_t chunk = shm_bytes / sizeof(T);
  const std::vector<std::size_t> counts = {0, 1, nn > 1 ? nn - 1 : 1, 2 * nn + 1, 1000, 3 * chunk + 7};
  dpkit::inproc_world world(nl.layout, nullptr, shm_bytes);
  std::mutex mu;
  std::vector<std::string> bad;
  // results[config][rank]
  std::vector<std::vector<std::vector<T>>> results;
  struct cfg {
    dpkit::reduce_op op;
    std::size_t count;
    bool in_place, automatic;
    int root; // >= 0: broadcast
  };
  std::vector<cfg> cfgs;
  for (auto op : dpt::all_ops)
    for (std::size_t c : counts)
      for (bool ip : {false, true}) cfgs.push_back({op, c, ip, !ip, -1});
  for (int root = 0; root < n; ++root) cfgs.push_back({dpkit::reduce_op::sum, 2 * chunk + 3, root % 2 == 0, root % 3 == 0, root});
  results.assign(cfgs.size(), std::vector<std::vector<T>>(nn));
  dpkit::collective_options o;
  o.timeout = 60s;
  world.run([&](dpkit::inproc& comm) {
    const int r = comm.rank();
    for (std::size_t k = 0; k < cfgs.size(); ++k) {
      const cfg& c = cfgs[k];
      auto in = dpt::make_input<T>(c.op, r, c.count, 0, k);
      std::vector<T> out;
      if (c.root >= 0) {
        const auto a = c.automatic ? dpkit::algorithm::automatic : dpkit::algorithm::hierarchical;
        if (c.in_place) {
          dpkit::broadcast(comm, in, c.root, a, o);
          out = in;
        } else {
          out.assign(c.count, dpt::sentinel<T>());
          if (r == c.root) dpkit::broadcast(comm, in, out, c.root, a, o);
          else dpkit::broadcast(comm, std::vector<T>{}, out, c.root, a, o);
        }
      } else {
        dpkit::allreduce_policy p;
        if (!c.automatic) p.algo = dpkit::algorithm::hierarchical;
        if (c.in_place) {
          dpkit::allreduce(comm, in, c.op, p, o);
          out = in;
        } else {
          out.assign(c.count, dpt::sentinel<T>());
          const auto saved = in;
          dpkit::allreduce(comm, in, out, c.op, p, o);
          if (in != saved) {
            std::lock_guard lk(mu);
            bad.push_back("rank " + std::to_string(r) + ": out-of-place input modified");
          }
        }
      }
      results[k][static_cast<std::size_t>(r)] = std::move(out);
    }
  });
  int failures = 0;
  for (std::size_t k = 0; k < cfgs.size(); ++k) {
    const cfg& c = cfgs[k];
    std::vector<T> e(c.count);
    for (std::size_t i = 0; i < c.count; ++i)
      e[i] = c.root >= 0 ? dpt::to_T<T>(dpt::gen(c.op, dpt::is_signed_elem<T>, c.root, i, k))
                         : dpt::reference<T>(c.op, n, i, k);
    for (int r = 0; r < n; ++r) {
      const auto& g = results[k][static_cast<std::size_t>(r)];
      const bool same = g.size() == e.size() && (e.empty() || std::memcmp(g.data(), e.data(), e.size() * sizeof(T)) == 0);
      if (!same) {
        std::size_t i = 0;
        while (i < std::min(g.size(), e.size()) && std::memcmp(&g[i], &e[i], sizeof(T)) == 0) ++i;
        const std::string what =
            std::string(nl.name) + (c.root >= 0 ? " broadcast root " + std::to_string(c.root) : " allreduce") +
            " op " + std::string(dpkit::reduce_op_name(c.op)) + " count " + std::to_string(c.count) +
            (c.in_place ? " in place" : " out of place") + (c.automatic ? " automatic" : " hierarchical") + ": rank " +
            std::to_string(r) + " differs at [" + std::to_string(i) + "]" +
            (i < g.size() && i < e.size()
                 ? ": " + std::to_string(dpt::to_double(g[i])) + " vs " + std::to_string(dpt::to_double(e[i]))
                 : std::string());
        FAIL_CHECK(what);
        if (++failures > 10) return failures;
      }
    }
  }
  for (const auto& b : bad) FAIL_CHECK(nl.name << ": " << b);
  return failures + static_cast<int>(bad.size());
}

} // namespace

TEST_CASE("node_layout and node_topology: node, local rank, sizes, uniformity, canonical labels") {
  const auto l = node_layout::canonicalize({7, 7, 3, 9, 3});
  CHECK(l.node_of == std::vector<int>{0, 0, 1, 2, 1});
  CHECK(l.nodes() == 3);
  CHECK(l.str() == "2+2+1");
  CHECK(node_layout::blocks(3, 2).str() == "3x2");
  CHECK(node_layout::sizes({2, 3}).node_of == std::vector<int>{0, 0, 1, 1, 1});
  const dpkit::node_topology t(l, 4);
  CHECK(t.nodes() == 3);
  CHECK(t.node() == 1);
  CHECK(t.local_rank() == 1);
  CHECK(t.local_size() == 2);
  CHECK(t.node_size(2) == 1);
  CHECK(t.max_local_size() == 2);
  CHECK_FALSE(t.uniform());
  CHECK(t.hierarchical());
  CHECK(dpkit::node_topology(node_layout::blocks(2, 3), 5).local_rank() == 2);
  CHECK(dpkit::node_topology(node_layout::blocks(2, 3), 5).uniform());
  CHECK_FALSE(dpkit::node_topology(node_layout::blocks(4, 1), 0).hierarchical());
  CHECK_FALSE(dpkit::node_topology(node_layout::blocks(1, 4), 0).hierarchical());
  CHECK_THROWS_AS(dpkit::node_topology(node_layout{{1, 0}}, 0), dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::node_topology(node_layout::blocks(2, 2), 4), dpkit::invalid_argument);
  CHECK_THROWS_AS(node_layout::blocks(0, 2), dpkit::invalid_argument);
  CHECK_THROWS_AS(node_layout::sizes({2, 0}), dpkit::invalid_argument);
}

TEST_CASE("inproc virtual nodes: topology per rank, node worlds with a segment, cross worlds by local rank or leader") {
  for (const auto& nl : {named_layout{"2x3", node_layout::blocks(2, 3)}, named_layout{"2+3", node_layout::sizes({2, 3})}}) {
    dpkit::inproc_world world(nl.layout);
    std::mutex mu;
    std::vector<std::string> bad;
    world.run([&](dpkit::inproc& comm) {
      const auto& t = comm.topology();
      auto* node = comm.node_transport();
      auto* cross = comm.cross_transport();
      auto fail = [&](const std::string& s) {
        std::lock_guard lk(mu);
        bad.push_back(std::string(nl.name) + " rank " + std::to_string(comm.rank()) + ": " + s);
      };
      if (comm.shm() != nullptr) fail("a world spanning nodes has a segment");
      if (!node || node->size() != t.local_size() || node->rank() != t.local_rank() || !node->shm()) fail("node world");
      if (t.uniform()) {
        if (!cross || cross->size() != t.nodes() || cross->rank() != t.node()) fail("cross world (uniform)");
      } else if (t.local_rank() == 0) {
        if (!cross || cross->size() != t.nodes() || cross->rank() != t.node()) fail("leaders' world");
      } else if (cross) {
        fail("a non-leader has a cross world on an uneven layout");
      }
      // the node world sums its members' ranks: the node's rank sum
      std::vector<int> v{comm.rank()};
      dpkit::allreduce(*node, v);
      int want = 0;
      for (int p : t.layout().ranks_of(t.node())) want += p;
      if (v[0] != want) fail("node all-reduce " + std::to_string(v[0]) + " != " + std::to_string(want));
    });
    for (const auto& b : bad) FAIL_CHECK(b);
  }
  dpkit::inproc_world one(4);
  one.run([](dpkit::inproc& comm) {
    CHECK(comm.topology().nodes() == 1);
    CHECK(comm.node_transport() == nullptr);
    CHECK(comm.cross_transport() == nullptr);
  });
}

TEST_CASE("inproc split: colors and keys as MPI_Comm_split, a world of its own, its own segment and nodes") {
  dpkit::inproc_world world(node_layout::blocks(2, 3));
  std::mutex mu;
  std::vector<std::string> bad;
  world.run([&](dpkit::inproc& comm) {
    const int r = comm.rank();
    auto fail = [&](const std::string& s) {
      std::lock_guard lk(mu);
      bad.push_back("rank " + std::to_string(r) + ": " + s);
    };
    // colors r % 2, keys descending (ties broken by rank: key 0 for ranks 4, 5)
    const int key = r >= 4 ? 0 : -r;
    auto sub = comm.split(r % 2, key);
    std::vector<int> members;
    for (int p = 0; p < 6; ++p)
      if (p % 2 == r % 2) members.push_back(p);
    std::stable_sort(members.begin(), members.end(), [](int a, int b) { return (a >= 4 ? 0 : -a) < (b >= 4 ? 0 : -b); });
    const int want_rank = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    if (sub.size() != 3 || sub.rank() != want_rank)
      fail("split rank " + std::to_string(sub.rank()) + "/" + std::to_string(sub.size()) + ", want " +
           std::to_string(want_rank) + "/3");
    // its nodes are the parent's restricted to it: {0,2,4} -> nodes 0,0,1
    if (sub.topology().nodes() != 2) fail("split world should span 2 nodes");
    std::vector<int> v{r};
    dpkit::allreduce(sub, v);
    const int want = r % 2 ? 1 + 3 + 5 : 0 + 2 + 4;
    if (v[0] != want) fail("sum over the split world " + std::to_string(v[0]) + " != " + std::to_string(want));
    // a node-local split has a segment (one node); the parent world does not
    auto local = comm.split(comm.topology().node(), comm.rank());
    if (!local.shm() || local.topology().nodes() != 1) fail("node-local split should have a segment");
    // messages of the split world never match the parent's: rank 0 sends
    // 100 to rank 2 in the parent and 200 in the split world, both with tag
    // 77; rank 2 receives in the split world first (sub ranks of color 0 by
    // key: 2 -> 0, 0 -> 1, 4 -> 2)
    if (r == 0) {
      const int p100 = 100, p200 = 200;
      auto s1 = comm.isend(dpkit::detail::bytes_of(&p100, 1), 2, 77);
      auto s2 = sub.isend(dpkit::detail::bytes_of(&p200, 1), 0, 77);
      s1.wait(dpkit::deadline_after(10s));
      s2.wait(dpkit::deadline_after(10s));
    } else if (r == 2) {
      int from_sub = 0, from_parent = 0;
      auto r2 = sub.irecv(dpkit::detail::bytes_of(&from_sub, 1), 1, 77);
      r2.wait(dpkit::deadline_after(10s));
      auto r1 = comm.irecv(dpkit::detail::bytes_of(&from_parent, 1), 0, 77);
      r1.wait(dpkit::deadline_after(10s));
      if (from_sub != 200 || from_parent != 100)
        fail("messages crossed worlds: split got " + std::to_string(from_sub) + ", parent got " + std::to_string(from_parent));
    }
  });
  for (const auto& b : bad) FAIL_CHECK(b);
}

TEST_CASE("inproc split: bad color is invalid_argument; a rank that never splits is timeout_error, not a hang") {
  dpkit::inproc_world world(3);
  CHECK_THROWS_AS(world.run([](dpkit::inproc& comm) { (void)comm.split(-1, 0); }), dpkit::invalid_argument);
  dpkit::inproc_world w2(3);
  std::atomic<int> timeouts{0}, peer_errors{0};
  const auto t0 = std::chrono::steady_clock::now();
  // the first rank to time out fails the world: the other one then stops
  // with peer_error (a consequence); run() rethrows the cause
  CHECK_THROWS_AS(w2.run([&](dpkit::inproc& comm) {
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(400ms); // never splits, then returns
      return;
    }
    try {
      (void)comm.split(0, 0, 200ms);
    } catch (const dpkit::timeout_error& e) {
      ++timeouts;
      CHECK(std::string(e.what()).find("rank(s) 2") != std::string::npos);
      throw;
    } catch (const dpkit::peer_error&) {
      ++peer_errors;
      throw;
    }
  }), dpkit::timeout_error);
  CHECK(timeouts >= 1);
  CHECK(timeouts + peer_errors == 2);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("inproc split: a failure in the split world stops waits in the parent, and the reverse, at once") {
  for (bool fail_in_child : {true, false}) {
    dpkit::inproc_world world(4);
    const auto t0 = std::chrono::steady_clock::now();
    std::atomic<int> peer_errors{0};
    try {
      world.run([&](dpkit::inproc& comm) {
        auto sub = comm.split(comm.rank() < 2 ? 0 : 1, 0);
        dpkit::collective_options o;
        o.timeout = 30s;
        std::vector<float> v(100, 1.f);
        if (comm.rank() == 0) {
          // fails its transport (child or parent) while the others wait
          std::this_thread::sleep_for(50ms);
          if (fail_in_child) sub.report_failure("injected");
          else comm.report_failure("injected");
          throw std::runtime_error("rank 0 failed");
        }
        try {
          if (comm.rank() == 1) dpkit::allreduce(sub, v, dpkit::reduce_op::sum, {}, o);  // waits for rank 0 in the child
          else dpkit::allreduce(comm, v, dpkit::reduce_op::sum, {}, o);                // waits for rank 0 in the parent
        } catch (const dpkit::peer_error&) {
          ++peer_errors;
          throw;
        }
      });
    } catch (const std::runtime_error&) {
    }
    CHECK(peer_errors == 3);
    CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  }
}

TEST_CASE_TEMPLATE("hierarchical all-reduce and broadcast equal the sequential reference, bitwise on every rank", T,
                   DPKIT_ELEMENT_TYPES) {
  for (const auto& nl : layouts()) {
    CAPTURE(nl.name);
    CHECK(check_layout<T>(nl, 4096) == 0);
  }
}

TEST_CASE("hierarchical all-reduce of float data is bitwise identical on every rank, and near the double sum") {
  for (const auto& nl : layouts()) {
    const int n = nl.layout.size();
    const std::size_t count = 5000;
    dpkit::inproc_world world(nl.layout, nullptr, 4096);
    std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
    world.run([&](dpkit::inproc& comm) {
      std::vector<float> v(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = 1.0f / static_cast<float>(1 + (comm.rank() * 31 + i) % 97);
      dpkit::allreduce(comm, v, dpkit::reduce_op::avg, dpkit::allreduce_policy{dpkit::algorithm::hierarchical});
      got[static_cast<std::size_t>(comm.rank())] = v;
    });
    for (int r = 1; r < n; ++r)
      CHECK_MESSAGE(std::memcmp(got[0].data(), got[static_cast<std::size_t>(r)].data(), count * sizeof(float)) == 0,
                    nl.name << " rank " << r);
    for (std::size_t i = 0; i < count; i += 97) {
      double ref = 0;
      for (int r = 0; r < n; ++r) ref += 1.0f / static_cast<float>(1 + (r * 31 + i) % 97);
      CHECK(got[0][i] == doctest::Approx(ref / n).epsilon(1e-6));
    }
  }
}

TEST_CASE("automatic all-reduce and broadcast pick hierarchical across nodes, the flat ones on one node") {
  dpkit::inproc_world world(node_layout::blocks(2, 2));
  world.run([](dpkit::inproc& comm) {
    std::vector<float> v(10, 1.f);
    dpkit::allreduce(comm, v);
    CHECK(v[0] == 4.f);
    CHECK(std::string(comm.health().current().algo) == "hier");
    dpkit::broadcast(comm, v, 3);
    CHECK(std::string(comm.health().current().algo) == "hier");
    dpkit::allreduce_policy flat;
    flat.use_hierarchical = false;
    dpkit::allreduce(comm, v, dpkit::reduce_op::sum, flat);
    CHECK(std::string(comm.health().current().algo) == "tree");
  });
  dpkit::inproc_world one(4);
  one.run([](dpkit::inproc& comm) {
    std::vector<float> v(10, 1.f);
    dpkit::allreduce(comm, v);
    CHECK(std::string(comm.health().current().algo) != "hier");
  });
}

TEST_CASE("hierarchical all-reduce: a mismatch in one node stops every rank of every node at once; reuse is refused") {
  dpkit::inproc_world world(node_layout::blocks(2, 2), nullptr, 4096);
  std::atomic<int> errors{0}, reuse_refused{0};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    world.run([&](dpkit::inproc& comm) {
      dpkit::collective_options o;
      o.timeout = 60s;
      // rank 3 passes another count: its node (ranks 2, 3) sees the mismatch
      std::vector<float> v(comm.rank() == 3 ? 2000 : 3000, 1.f);
      try {
        dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::hierarchical}, o);
      } catch (const dpkit::error&) {
        ++errors;
        try {
          dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::hierarchical}, o);
        } catch (const dpkit::communicator_error&) {
          ++reuse_refused;
        } catch (const dpkit::peer_error&) {
          ++reuse_refused;
        }
        throw;
      }
    });
  } catch (const dpkit::error&) {
  }
  CHECK(errors == 4);
  CHECK(reuse_refused == 4);
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
}

TEST_CASE("algorithm::hierarchical on a transport without nodes is invalid_argument naming it") {
  struct plain {
    dpkit::inproc* c;
    int rank() const { return c->rank(); }
    int size() const { return c->size(); }
    static constexpr bool accepts(dpkit::memory_space s) { return s == dpkit::memory_space::host; }
    auto isend(std::span<const std::byte> b, int p, int t) { return c->isend(b, p, t); }
    auto irecv(std::span<std::byte> b, int p, int t) { return c->irecv(b, p, t); }
  };
  static_assert(dpkit::transport<plain>);
  static_assert(!dpkit::hierarchical_transport<plain>);
  dpkit::inproc_world world(2);
  world.run([](dpkit::inproc& comm) {
    plain p{&comm};
    std::vector<float> v(4, 1.f);
    CHECK_THROWS_WITH_AS(dpkit::allreduce(p, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::hierarchical}),
                         doctest::Contains("not a hierarchical_transport"), dpkit::invalid_argument);
  });
}

TEST_CASE_TEMPLATE("hierarchical all-gather and reduce-scatter equal the sequential reference on every rank", T, float,
                   std::int32_t, dpkit::bf16, std::uint8_t) {
  for (const auto& nl : layouts()) {
    CAPTURE(nl.name);
    const int n = nl.layout.size();
    const std::size_t nn = static_cast<std::size_t>(n);
    dpkit::inproc_world world(nl.layout, nullptr, 4096);
    std::mutex mu;
    std::vector<std::string> bad;
    world.run([&](dpkit::inproc& comm) {
      const int r = comm.rank();
      auto fail = [&](const std::string& s) {
        std::lock_guard lk(mu);
        bad.push_back(std::string(nl.name) + " rank " + std::to_string(r) + ": " + s);
      };
      dpkit::collective_options o;
      o.timeout = 60s;
      std::uint64_t salt = 0;
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{3000}})
        for (bool in_place : {false, true})
          for (auto a : {dpkit::algorithm::hierarchical, dpkit::algorithm::automatic}) {
            ++salt;
            // all-gather
            auto part = dpt::make_input<T>(dpkit::reduce_op::sum, r, count, 0, salt);
            std::vector<T> out(count * nn, dpt::sentinel<T>());
            if (in_place) {
              std::copy(part.begin(), part.end(), out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * count));
              dpkit::allgather(comm, out, a, o);
            } else {
              dpkit::allgather(comm, part, out, a, o);
            }
            for (int p = 0; p < n; ++p) {
              const auto want = dpt::make_input<T>(dpkit::reduce_op::sum, p, count, 0, salt);
              if (count && std::memcmp(out.data() + static_cast<std::size_t>(p) * count, want.data(), count * sizeof(T)) != 0)
                fail("all-gather count " + std::to_string(count) + ": part of rank " + std::to_string(p) + " wrong");
            }
            // reduce-scatter (sum and avg)
            for (auto op : {dpkit::reduce_op::sum, dpkit::reduce_op::max, dpkit::reduce_op::avg}) {
              ++salt;
              auto in = dpt::make_input<T>(op, r, count * nn, 0, salt);
              std::vector<T> res;
              if (in_place) {
                dpkit::reduce_scatter(comm, in, op, a, o);
                res.assign(in.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * count),
                           in.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * count));
              } else {
                res.assign(count, dpt::sentinel<T>());
                dpkit::reduce_scatter(comm, in, res, op, a, o);
              }
              for (std::size_t i = 0; i < count; ++i) {
                const T want = dpt::reference<T>(op, n, static_cast<std::size_t>(r) * count + i, salt);
                if (std::memcmp(&res[i], &want, sizeof(T)) != 0) {
                  fail("reduce-scatter count " + std::to_string(count) + " op " + std::string(dpkit::reduce_op_name(op)) +
                       (in_place ? " in place" : "") + " [" + std::to_string(i) + "]: " + std::to_string(dpt::to_double(res[i])) +
                       " vs " + std::to_string(dpt::to_double(want)));
                  break;
                }
              }
            }
          }
      if (comm.topology().hierarchical() && comm.topology().uniform()) {
        std::vector<T> v(nn);
        dpkit::allgather(comm, v, dpkit::algorithm::automatic, o);
        if (std::string(comm.health().current().algo) != "hier") fail("automatic all-gather did not pick hier");
      }
    });
    for (const auto& b : bad) FAIL_CHECK(b);
  }
}
