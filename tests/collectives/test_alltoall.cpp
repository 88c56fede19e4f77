// Gather, scatter and all-to-all (even and uneven) on the inproc transport:
// every world size, counts from 0, several roots and element types, against
// a sequential reference built from each rank's input; the unhappy path
// (ranks that call different collectives, disagree on split sizes or roots,
// bad arguments).
#include "common.hpp"

#include <numeric>

namespace {

using dpkit::inproc;

// Input element i of rank r, distinct per (rank, i) within the type's range.
template <class T>
T value(int r, std::size_t i) {
  return dpt::to_T<T>(static_cast<long long>((static_cast<std::size_t>(r) * 31 + i * 7) % 97));
}

// Splits of the uneven all-to-all: rank r sends (r + 2p) % 5 * scale elements to rank p.
std::size_t split(int from, int to, std::size_t scale) {
  return static_cast<std::size_t>((from + 2 * to) % 5) * scale;
}

} // namespace

TEST_CASE_TEMPLATE("gather and scatter: rank order on root, every root", T, float, dpkit::bf16, std::uint8_t,
                   std::int64_t) {
  // shm buffers of 256 KiB (blocks up to 16 KiB through the segment, 5000
  // elements linear), none (linear at every count), 64 bytes (the segment's
  // path in many chunks)
  for (std::size_t shm : {std::size_t{256} << 10, std::size_t{0}, std::size_t{64}})
  for (int n : test_sizes::worlds({1, 2, 3, 4, 5, 8, 9, 13})) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{40}, std::size_t{1000}, std::size_t{5000}}) {
      if ((shm == 64) != (count == 40) && count > 3) continue; // 64-byte buffers: 40 elements take several chunks
      CAPTURE(shm);
      CAPTURE(n);
      CAPTURE(count);
      const auto un = static_cast<std::size_t>(n);
      std::vector<int> wrong(un, 0);
      dpkit::inproc_world world(n, nullptr, shm);
      world.run([&](inproc& comm) {
        const int r = comm.rank();
        for (int root : {0, n - 1, n / 2}) {
          std::vector<T> in(count), out(r == root ? un * count : 0);
          for (std::size_t i = 0; i < count; ++i) in[i] = value<T>(r, i);
          dpkit::gather(comm, in, out, root);
          if (r == root)
            for (int p = 0; p < n; ++p)
              for (std::size_t i = 0; i < count; ++i) {
                const T want = value<T>(p, i);
                wrong[static_cast<std::size_t>(r)] +=
                    std::memcmp(&out[static_cast<std::size_t>(p) * count + i], &want, sizeof(T)) != 0;
              }
          // scatter back what root gathered: rank p gets its own input again
          std::vector<T> back(count, dpt::to_T<T>(99));
          dpkit::scatter(comm, out, back, root);
          for (std::size_t i = 0; i < count; ++i)
            wrong[static_cast<std::size_t>(r)] += std::memcmp(&back[i], &in[i], sizeof(T)) != 0;
          // the list forms (torch's gather_list / scatter_list): the same
          // blocks, each in its own tensor; a mixed call (list on root,
          // contiguous elsewhere) is the same collective
          std::vector<std::vector<T>> list(r == root ? un : 0, std::vector<T>(count, dpt::to_T<T>(98)));
          if (r == root || r % 2 == 0) dpkit::gather(comm, in, list, root);
          else dpkit::gather(comm, in, std::vector<T>{}, root);
          if (r == root && count > 0) // (memcmp takes no null pointer, even for 0 bytes)
            for (int p = 0; p < n; ++p)
              wrong[static_cast<std::size_t>(r)] +=
                  std::memcmp(list[static_cast<std::size_t>(p)].data(), out.data() + static_cast<std::size_t>(p) * count,
                              count * sizeof(T)) != 0;
          std::vector<T> back2(count, dpt::to_T<T>(97));
          std::vector<dpkit::tensor_view<T>> views;
          for (auto& b : list) views.push_back({b.data(), b.size()});
          dpkit::scatter(comm, views, back2, root);
          for (std::size_t i = 0; i < count; ++i)
            wrong[static_cast<std::size_t>(r)] += std::memcmp(&back2[i], &in[i], sizeof(T)) != 0;
          // in place on root: its block of the output is its input
          if (r == root) {
            std::vector<T> all(un * count);
            for (std::size_t i = 0; i < count; ++i) all[static_cast<std::size_t>(root) * count + i] = in[i];
            std::span<const T> mine(all.data() + static_cast<std::size_t>(root) * count, count);
            dpkit::gather(comm, mine, all, root);
            wrong[static_cast<std::size_t>(r)] += all != out;
          } else {
            std::vector<T> none;
            dpkit::gather(comm, in, none, root);
          }
        }
      });
      CHECK(std::accumulate(wrong.begin(), wrong.end(), 0) == 0);
    }
  }
}

TEST_CASE_TEMPLATE("alltoall and alltoallv: block p of rank r lands at block r of rank p", T, float, dpkit::f16,
                   std::int32_t, std::uint64_t) {
  for (int n : test_sizes::worlds({1, 2, 3, 4, 5, 7, 8, 9, 13})) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{777}}) {
      CAPTURE(n);
      CAPTURE(count);
      const auto un = static_cast<std::size_t>(n);
      std::vector<int> wrong(un, 0);
      dpkit::inproc_world world(n);
      world.run([&](inproc& comm) {
        const int r = comm.rank();
        // even: element i of block p is value(r, p * count + i)
        std::vector<T> in(un * count), out(un * count);
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = value<T>(r, i);
        dpkit::alltoall(comm, in, out);
        for (int p = 0; p < n; ++p)
          for (std::size_t i = 0; i < count; ++i) {
            const T want = value<T>(p, static_cast<std::size_t>(r) * count + i);
            wrong[static_cast<std::size_t>(r)] += std::memcmp(&out[static_cast<std::size_t>(p) * count + i], &want, sizeof(T)) != 0;
          }
        // uneven: rank r sends split(r, p) elements to p (zeros among them)
        std::vector<std::size_t> sc(un), rc(un);
        for (int p = 0; p < n; ++p) {
          sc[static_cast<std::size_t>(p)] = split(r, p, count);
          rc[static_cast<std::size_t>(p)] = split(p, r, count);
        }
        std::vector<T> vin(std::accumulate(sc.begin(), sc.end(), std::size_t{0}));
        std::vector<T> vout(std::accumulate(rc.begin(), rc.end(), std::size_t{0}));
        for (std::size_t i = 0; i < vin.size(); ++i) vin[i] = value<T>(r, i);
        dpkit::alltoallv(comm, vin, sc, vout, rc);
        std::size_t at = 0;
        for (int p = 0; p < n; ++p) {
          // where rank p's block for r starts in p's input
          std::size_t from = 0;
          for (int q = 0; q < r; ++q) from += split(p, q, count);
          for (std::size_t i = 0; i < rc[static_cast<std::size_t>(p)]; ++i) {
            const T want = value<T>(p, from + i);
            wrong[static_cast<std::size_t>(r)] += std::memcmp(&vout[at + i], &want, sizeof(T)) != 0;
          }
          at += rc[static_cast<std::size_t>(p)];
        }
      });
      CHECK(std::accumulate(wrong.begin(), wrong.end(), 0) == 0);
    }
  }
}

TEST_CASE("gather, scatter, all-to-all: the unhappy path") {
  SUBCASE("bad arguments name the value and the rank") {
    dpkit::inproc_world world(1);
    world.run([](inproc& comm) {
      std::vector<float> a(4), b(4), c(3);
      CHECK_THROWS_WITH_AS(dpkit::gather(comm, a, b, 1), doctest::Contains("root rank 1 out of range"), dpkit::invalid_argument);
      CHECK_THROWS_WITH_AS(dpkit::gather(comm, a, c, 0), doctest::Contains("rank 0"), dpkit::invalid_argument);
      CHECK_THROWS_WITH_AS(dpkit::scatter(comm, c, a, 0), doctest::Contains("input has 3 elements"), dpkit::invalid_argument);
      std::vector<std::vector<float>> two(2, a), short_block{c};
      CHECK_THROWS_WITH_AS(dpkit::gather(comm, a, two, 0), doctest::Contains("output list has 2 tensors, expected one per rank (1)"),
                           dpkit::invalid_argument);
      CHECK_THROWS_WITH_AS(dpkit::scatter(comm, short_block, a, 0),
                           doctest::Contains("input block 0 has 3 elements, expected 4"), dpkit::invalid_argument);
      CHECK_THROWS_WITH_AS(dpkit::gather(comm, a, short_block, 0), doctest::Contains("rank 0"), dpkit::invalid_argument);
      CHECK_THROWS_WITH_AS(dpkit::alltoall(comm, a, a), doctest::Contains("overlap"), dpkit::invalid_argument);
      CHECK_THROWS_WITH_AS(dpkit::alltoallv(comm, a, {4, 1}, b, {4}), doctest::Contains("2 entries"), dpkit::invalid_argument);
      CHECK_THROWS_WITH_AS(dpkit::alltoallv(comm, a, {3}, b, {4}), doctest::Contains("sum to 3"), dpkit::invalid_argument);
    });
  }
  SUBCASE("rank 0 gathers while rank 1 scatters: mismatch_error on both, naming both calls") {
    dpkit::inproc_world world(2);
    std::vector<std::string> what(2);
    world.run([&](inproc& comm) {
      std::vector<float> one(8, 1.0f), two(16, 2.0f);
      dpkit::collective_options o;
      o.timeout = std::chrono::seconds(10);
      try {
        if (comm.rank() == 0) dpkit::gather(comm, one, two, 0, o);
        else dpkit::scatter(comm, two, one, 0, o);
      } catch (const dpkit::error& e) {
        what[static_cast<std::size_t>(comm.rank())] = std::string(typeid(e).name()) + " " + e.what();
      }
    });
    for (const auto& w : what) {
      CAPTURE(w);
      CHECK(w.find("mismatch") != std::string::npos);
    }
    CHECK((what[0].find("gather") != std::string::npos && what[0].find("scatter") != std::string::npos));
  }
  SUBCASE("gather roots differ: mismatch_error, not a hang") {
    dpkit::inproc_world world(3);
    std::vector<int> errors(3, 0);
    world.run([&](inproc& comm) {
      std::vector<float> in(4, 1.0f), out(12);
      dpkit::collective_options o;
      o.timeout = std::chrono::seconds(10);
      try {
        dpkit::gather(comm, in, out, comm.rank() == 2 ? 1 : 0, o);
      } catch (const dpkit::mismatch_error&) {
        errors[static_cast<std::size_t>(comm.rank())] = 1;
      } catch (const dpkit::peer_error&) {
        errors[static_cast<std::size_t>(comm.rank())] = 2;
      }
    });
    CHECK(errors[0] + errors[1] + errors[2] >= 3); // every rank threw, at least one a mismatch_error
    CHECK(std::count(errors.begin(), errors.end(), 1) >= 1);
  }
  SUBCASE("alltoallv: a rank sends another count than its peer expects: mismatch_error on both, naming both counts") {
    dpkit::inproc_world world(2);
    std::vector<std::string> what(2);
    world.run([&](inproc& comm) {
      const int r = comm.rank();
      // rank 0 sends 3 elements to rank 1, which expects 4
      std::vector<std::size_t> sc = {2, r == 0 ? std::size_t{3} : std::size_t{2}}, rc = {2, 2};
      if (r == 1) sc = {2, 2}, rc = {4, 2};
      std::vector<float> in(sc[0] + sc[1]), out(rc[0] + rc[1]);
      dpkit::collective_options o;
      o.timeout = std::chrono::seconds(10);
      try {
        dpkit::alltoallv(comm, in, sc, out, rc, o);
      } catch (const dpkit::error& e) {
        what[static_cast<std::size_t>(r)] = e.what();
      }
    });
    CAPTURE(what[0]);
    CAPTURE(what[1]);
    // both ranks, before any data moves (inproc is checked: the counts are compared first)
    for (const auto& w : what) CHECK(w.find("rank 0 sends 3 elements to rank 1, which expects 4") != std::string::npos);
  }
}
