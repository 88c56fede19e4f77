// Shared-memory all-reduce (one-shot, two-shot, by size, and the automatic
// policy's choice) on the inproc transport: every element type and op against
// the sequential reference, counts 0, 1, < n, not divisible by n, larger than
// one buffer (chunked), in and out of place, world sizes 1-9 and 13, all calls
// of a world back to back with no barrier between them; float data where the
// order matters, bitwise identical across ranks and equal to the rank-order
// sum; and the unhappy path (a peer that never joins, a peer that throws,
// mismatched calls, no segment).
#include "common.hpp"
#include "fault_util.hpp"
#include "../file_size_limit.hpp"

#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <numeric>
#include <span>
#include <random>
#include <set>
#include <thread>

#include <sys/mman.h>

using namespace std::chrono_literals;

namespace {

enum class shm_kind { one_shot, two_shot, by_size, automatic };
const char* name(shm_kind k) {
  switch (k) {
  case shm_kind::one_shot: return "one_shot";
  case shm_kind::two_shot: return "two_shot";
  case shm_kind::by_size: return "by_size";
  case shm_kind::automatic: return "automatic";
  }
  return "?";
}

template <class In, class Out>
void call(dpkit::inproc& comm, shm_kind k, In& in, Out& out, dpkit::reduce_op op, const dpkit::collective_options& o) {
  switch (k) {
  case shm_kind::one_shot: dpkit::allreduce_shm_one_shot(comm, in, out, op, o); break;
  case shm_kind::two_shot: dpkit::allreduce_shm_two_shot(comm, in, out, op, o); break;
  case shm_kind::by_size: dpkit::allreduce_shm(comm, in, out, op, o, 512); break;
  case shm_kind::automatic: dpkit::allreduce(comm, in, out, op, dpkit::allreduce_policy{}, o); break;
  }
}

// Runs every (kind, op, count, in-place) configuration back to back on an
// n-rank world whose buffers hold shm_bytes; returns the failures.
template <class T>
std::vector<std::string> run_all(int n, std::size_t shm_bytes) {
  dpkit::inproc_world world(n, nullptr, shm_bytes);
  const std::size_t nn = static_cast<std::size_t>(n);
  const std::size_t chunk = shm_bytes / sizeof(T);
  const std::vector<std::size_t> counts = {0, 1, nn > 1 ? nn - 1 : 1, nn + 1, 3 * nn + 2, 1000, 3 * chunk + 7};
  std::mutex mu;
  std::vector<std::string> bad;
  dpkit::collective_options o;
  o.timeout = 60s;
  world.run([&](dpkit::inproc& comm) {
    const int r = comm.rank();
    std::uint64_t salt = 0;
    for (auto k : {shm_kind::one_shot, shm_kind::two_shot, shm_kind::by_size, shm_kind::automatic})
      for (auto op : dpt::all_ops)
        for (auto count : counts)
          for (bool in_place : {false, true}) {
            ++salt;
            auto in = dpt::make_input<T>(op, r, count, 0, salt);
            const auto saved = in;
            std::vector<T> out(count, dpt::sentinel<T>());
            if (in_place) {
              call(comm, k, in, in, op, o);
              out = in;
            } else {
              call(comm, k, in, out, op, o);
              if (count && std::memcmp(saved.data(), in.data(), count * sizeof(T)) != 0) {
                std::lock_guard lk(mu);
                bad.push_back(std::string(name(k)) + ": out-of-place input modified");
              }
            }
            for (std::size_t i = 0; i < count; ++i) {
              const T e = dpt::reference<T>(op, n, i, salt);
              if (std::memcmp(&e, &out[i], sizeof(T)) != 0) {
                std::lock_guard lk(mu);
                bad.push_back(std::string(name(k)) + " n=" + std::to_string(n) + " rank " + std::to_string(r) +
                              " op " + std::string(dpkit::reduce_op_name(op)) + " count " + std::to_string(count) +
                              (in_place ? " in-place" : "") + ": element " + std::to_string(i) + " is " +
                              std::to_string(dpt::to_double(out[i])) + ", expected " + std::to_string(dpt::to_double(e)));
                break;
              }
            }
          }
  });
  return bad;
}

using faults::outcome;
using faults::since;
std::vector<outcome> run_world(dpkit::inproc_world& world, const std::function<void(dpkit::inproc&)>& body) {
  return faults::run_world(world, body, true);
}

} // namespace

TEST_CASE_TEMPLATE("shm all-reduce equals the sequential reference on every rank", T, DPKIT_ELEMENT_TYPES) {
  for (int n : test_sizes::worlds({1, 2, 3, 4, 5, 6, 7, 8, 9, 13})) {
    for (std::size_t shm_bytes : {std::size_t{256}, std::size_t{64} << 10}) {
      if (shm_bytes > 256 && n > 3) continue; // chunking is covered by the small buffers
      CAPTURE(n);
      CAPTURE(shm_bytes);
      const auto bad = run_all<T>(n, shm_bytes);
      for (std::size_t i = 0; i < std::min<std::size_t>(bad.size(), 5); ++i) FAIL_CHECK(bad[i]);
      CHECK(bad.empty());
    }
  }
}

TEST_CASE_TEMPLATE("shm reduce-scatter, all-gather, broadcast and reduce equal the sequential reference", T, DPKIT_ELEMENT_TYPES) {
  // through the dispatchers with algorithm::shm; NCCL's in-place conventions;
  // roots 0, 1, n/2, n-1; small buffers for many chunks per call
  using dpt::config;
  using dpt::kind;
  for (int n : test_sizes::worlds(dpt::world_sizes)) {
    for (std::size_t shm_bytes : {std::size_t{256}, std::size_t{64} << 10}) {
      if (shm_bytes == 256 && n > 4) continue;
      const std::size_t chunk = shm_bytes / sizeof(T);
      std::vector<std::size_t> counts = dpt::counts_for(n);
      if (shm_bytes == 256) counts.push_back(3 * chunk + 7); // several chunks per call
      const std::set<int> roots{0, n - 1, n / 2, n > 1 ? 1 : 0};
      std::vector<config> cfgs;
      for (std::size_t count : counts)
        for (bool in_place : {false, true}) {
          for (auto op : dpt::all_ops) {
            config rs{kind::reduce_scatter, count, op, in_place};
            rs.shm = true;
            cfgs.push_back(rs);
          }
          config ag{kind::allgather, count, dpkit::reduce_op::max, in_place, {}, 0, count};
          ag.shm = true;
          cfgs.push_back(ag);
          for (int root : roots) {
            config bc{kind::broadcast, count, dpkit::reduce_op::min, in_place, {}, root};
            bc.shm = true;
            cfgs.push_back(bc);
            if (in_place) continue;
            for (auto op : dpt::all_ops) {
              config rd{kind::reduce, count, op, false, {}, root};
              rd.shm = true;
              cfgs.push_back(rd);
            }
          }
        }
      CAPTURE(n);
      CAPTURE(shm_bytes);
      CHECK(dpt::run_and_check<T>(n, cfgs, shm_bytes) == 0);
    }
  }
}

namespace {
// Throws unless f() throws dpkit::invalid_argument (checked on every rank's thread).
template <class F>
void expect_invalid(const char* what, F&& f) {
  try {
    f();
  } catch (const dpkit::invalid_argument&) {
    return;
  }
  throw std::runtime_error(std::string(what) + ": no invalid_argument");
}
} // namespace

TEST_CASE("shm reduce-scatter, all-gather, broadcast, reduce: no segment or too-small buffers are invalid_argument") {
  {
    dpkit::inproc_world world(2, nullptr, 0); // no segment
    const auto res = run_world(world, [](dpkit::inproc& comm) {
      std::vector<float> v(4, 1.0f), w(2);
      expect_invalid("broadcast", [&] { dpkit::broadcast(comm, v, 0, dpkit::algorithm::shm); });
      expect_invalid("reduce", [&] { dpkit::reduce(comm, v, w, dpkit::reduce_op::sum, 0, dpkit::algorithm::shm); });
      expect_invalid("allgather", [&] { dpkit::allgather(comm, v, dpkit::algorithm::shm); });
      expect_invalid("reduce_scatter", [&] { dpkit::reduce_scatter(comm, v, w, dpkit::reduce_op::sum, dpkit::algorithm::shm); });
    });
    for (const auto& r : res) CHECK_MESSAGE(r.type == "ok", r.what);
  }
  {
    // 64-byte buffers hold 8 doubles: a reduce-scatter chunk needs one per rank
    dpkit::inproc_world world(9, nullptr, 64);
    const auto res = run_world(world, [](dpkit::inproc& comm) {
      std::vector<double> v(18, 1.0), w(2);
      expect_invalid("reduce_scatter_shm", [&] { dpkit::reduce_scatter_shm(comm, v, w); });
      std::vector<double> mine(100, 2.0), all(100 * 9);
      dpkit::allgather_shm(comm, mine, all); // fine: all-gather chunks are whole buffers (8 elements)
      if (!std::all_of(all.begin(), all.end(), [](double x) { return x == 2.0; })) throw std::runtime_error("all-gather");
    });
    for (const auto& r : res) CHECK_MESSAGE(r.type == "ok", r.what);
  }
}

TEST_CASE("shm broadcast: ranks naming different roots get mismatch_error naming both, not a wrong result") {
  dpkit::inproc_world world(2, nullptr, 4096);
  dpkit::collective_options o;
  o.timeout = 20s;
  const auto res = run_world(world, [&](dpkit::inproc& comm) {
    std::vector<float> v(100, static_cast<float>(comm.rank()));
    dpkit::broadcast_shm(comm, v, comm.rank(), o); // each rank names itself root
  });
  for (const auto& r : res) {
    CHECK(r.type == "mismatch");
    CHECK_MESSAGE(r.what.find("root") != std::string::npos, r.what);
  }
}

TEST_CASE("shm all-reduce of float data is the rank-order sum, bitwise identical on every rank") {
  // Values of many magnitudes: a different summation order gives different bits.
  for (int n : test_sizes::worlds({2, 3, 4, 5, 7, 9})) {
    for (auto k : {shm_kind::one_shot, shm_kind::two_shot}) {
      CAPTURE(n);
      CAPTURE(name(k));
      const std::size_t count = 5000;
      std::vector<std::vector<float>> inputs(static_cast<std::size_t>(n)), outputs(static_cast<std::size_t>(n));
      std::mt19937 g(static_cast<unsigned>(n));
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (auto& v : inputs) {
        v.resize(count);
        for (std::size_t i = 0; i < count; ++i) v[i] = u(g) * std::pow(10.f, static_cast<float>(i % 9) - 4.f);
      }
      dpkit::inproc_world world(n, nullptr, 1024);
      for (auto op : {dpkit::reduce_op::sum, dpkit::reduce_op::avg}) {
        world.run([&](dpkit::inproc& comm) {
          auto& out = outputs[static_cast<std::size_t>(comm.rank())];
          out.assign(count, 0.f);
          call(comm, k, inputs[static_cast<std::size_t>(comm.rank())], out, op, {});
        });
        std::vector<float> ref(count);
        for (std::size_t i = 0; i < count; ++i) {
          float acc = inputs[0][i];
          for (int p = 1; p < n; ++p) acc += inputs[static_cast<std::size_t>(p)][i];
          ref[i] = op == dpkit::reduce_op::avg ? acc / static_cast<float>(n) : acc;
        }
        for (int p = 0; p < n; ++p)
          CHECK(std::memcmp(outputs[static_cast<std::size_t>(p)].data(), ref.data(), count * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("shm two-shot with non-temporal, ordinary and tuned segment stores: the rank-order sum, on every rank") {
  // 1 MiB buffers: chunks of segment_store_tuner::min_bytes are tuned; rank
  // 0's kind (forced here) is followed by every rank from the next chunk
  using dpkit::detail::segment_stores;
  constexpr std::size_t buf = dpkit::detail::segment_store_tuner::min_bytes;
  const std::size_t count = (5 * buf / 2) / sizeof(float) + 3; // two tuned chunks and an untuned tail
  for (int n : {2, 3}) {
    for (auto kind : {segment_stores::nontemporal, segment_stores::ordinary, segment_stores::automatic}) {
      CAPTURE(n);
      CAPTURE(static_cast<int>(kind));
      std::vector<std::vector<float>> inputs(static_cast<std::size_t>(n));
      std::mt19937 g(static_cast<unsigned>(n) + 7);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (auto& v : inputs) {
        v.resize(count);
        for (std::size_t i = 0; i < count; ++i) v[i] = u(g) * std::pow(10.f, static_cast<float>(i % 9) - 4.f);
      }
      std::vector<float> ref(count);
      for (std::size_t i = 0; i < count; ++i) {
        float acc = inputs[0][i];
        for (int p = 1; p < n; ++p) acc += inputs[static_cast<std::size_t>(p)][i];
        ref[i] = acc;
      }
      dpkit::inproc_world world(n, nullptr, buf);
      std::vector<int> wrong(static_cast<std::size_t>(n), -1), mode(static_cast<std::size_t>(n), -1);
      world.run([&](dpkit::inproc& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        if (r == 0) comm.shm()->store_tuner().force(kind);
        int bad = 0;
        for (int round = 0; round < 3; ++round) {
          std::vector<float> out(count, -7.f), inout = inputs[r];
          dpkit::allreduce_shm_two_shot(comm, inputs[r], out);
          dpkit::allreduce_shm_two_shot(comm, inout);
          bad += std::memcmp(out.data(), ref.data(), count * sizeof(float)) != 0;
          bad += std::memcmp(inout.data(), ref.data(), count * sizeof(float)) != 0;
        }
        wrong[r] = bad;
        mode[r] = static_cast<int>(comm.shm()->control(0).store_mode.load());
      });
      for (int p = 0; p < n; ++p) CHECK(wrong[static_cast<std::size_t>(p)] == 0);
      // the forced kinds really ran: rank 0 published them
      if (kind == segment_stores::nontemporal) CHECK(mode[0] == 1);
      if (kind == segment_stores::ordinary) CHECK(mode[0] == 0);
    }
  }
}

TEST_CASE("automatic all-reduce picks shm when the transport has a segment, and falls back without one") {
  for (std::size_t shm_bytes : {std::size_t{0}, std::size_t{4096}}) {
    dpkit::inproc_world world(3, nullptr, shm_bytes);
    std::vector<std::string> algos(3);
    world.run([&](dpkit::inproc& comm) {
      std::vector<std::int32_t> v(100, comm.rank() + 1);
      dpkit::allreduce(comm, v);
      for (auto x : v) CHECK(x == 6);
      const auto fp = comm.health().current();
      algos[static_cast<std::size_t>(comm.rank())] = std::string(fp.algo, strnlen(fp.algo, sizeof fp.algo));
      if (shm_bytes == 0) CHECK_THROWS_AS(dpkit::allreduce_shm(comm, v), dpkit::invalid_argument);
    });
    for (auto& a : algos) CHECK(a == (shm_bytes ? "shm1" : "tree"));
  }
}

TEST_CASE("automatic all-reduce on one node: one-shot below the threshold of the world size, two-shot from it") {
  // Two ranks: one-shot below 256 KiB; three or more: below 64 KiB (the
  // built-in tuning rules, docs/tuning.md). The fingerprint names the
  // algorithm that ran; the result is checked against the exact sum.
  for (int n : {2, 3}) {
    const std::size_t limit = n == 2 ? dpkit::shm_one_shot_max_bytes_two_ranks_default
                                     : dpkit::shm_one_shot_max_bytes_default;
    for (std::size_t bytes : {limit - 4, limit}) {
      CAPTURE(n);
      CAPTURE(bytes);
      dpkit::inproc_world world(n, nullptr, std::size_t{1} << 20);
      std::vector<std::string> algos(static_cast<std::size_t>(n));
      world.run([&](dpkit::inproc& comm) {
        std::vector<std::int32_t> v(bytes / 4);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>(i % 7) + comm.rank();
        dpkit::allreduce(comm, v);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < v.size(); ++i)
          bad += v[i] != static_cast<std::int32_t>(n * static_cast<int>(i % 7) + n * (n - 1) / 2);
        CHECK(bad == 0);
        const auto fp = comm.health().current();
        algos[static_cast<std::size_t>(comm.rank())] = std::string(fp.algo, strnlen(fp.algo, sizeof fp.algo));
      });
      for (auto& a : algos) CHECK(a == (bytes < limit ? "shm1" : "shm2"));
    }
  }
}

TEST_CASE("automatic broadcast, reduce, all-gather, reduce-scatter pick shm with a segment, tree or ring without") {
  // 2 ranks: shm for all four with a segment, except all-gather from 16 KiB
  // per rank (ring) and, only with more ranks than cores, broadcasts below
  // 512 B (tree); tree or ring everywhere without a segment.
  const bool oversubscribed = 2u > std::max(1u, std::thread::hardware_concurrency());
  for (std::size_t shm_bytes : {std::size_t{0}, std::size_t{65536}}) {
    CAPTURE(shm_bytes);
    dpkit::inproc_world world(2, nullptr, shm_bytes);
    std::vector<std::vector<std::string>> algos(2);
    world.run([&](dpkit::inproc& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      const auto last = [&] {
        const auto fp = comm.health().current();
        algos[r].emplace_back(fp.algo, strnlen(fp.algo, sizeof fp.algo));
      };
      const std::size_t k = 256, big = 4096; // 1 KiB and 16 KiB of int32
      std::vector<std::int32_t> v(k, comm.rank() + 1), out(k), all(2 * k);
      dpkit::broadcast(comm, v, 1);
      for (auto x : v) CHECK(x == 2);
      last();
      std::vector<std::int32_t> two(2, comm.rank() + 5); // 8 bytes
      dpkit::broadcast(comm, two, 0);
      CHECK(two == std::vector<std::int32_t>{5, 5});
      last();
      std::iota(v.begin(), v.end(), comm.rank());
      dpkit::reduce(comm, v, out, dpkit::reduce_op::sum, 1);
      if (r == 1)
        for (std::size_t i = 0; i < k; ++i) CHECK(out[i] == static_cast<std::int32_t>(2 * i + 1));
      last();
      dpkit::allgather(comm, v, all);
      for (std::size_t i = 0; i < 2 * k; ++i) CHECK(all[i] == static_cast<std::int32_t>(i / k + i % k));
      last();
      std::vector<std::int32_t> w(big, comm.rank()), wall(2 * big);
      dpkit::allgather(comm, w, wall);
      for (std::size_t i = 0; i < 2 * big; ++i) CHECK(wall[i] == static_cast<std::int32_t>(i / big));
      last();
      dpkit::reduce_scatter(comm, all, out, dpkit::reduce_op::sum);
      for (std::size_t i = 0; i < k; ++i) CHECK(out[i] == static_cast<std::int32_t>(2 * (r + i)));
      last();
      std::vector<std::int32_t> mine(k);
      dpkit::reduce_scatter(comm, all, std::span<std::int32_t>(mine), dpkit::reduce_op::sum);
      CHECK(mine == out);
      last();
    });
    const std::vector<std::string> want =
        shm_bytes ? std::vector<std::string>{"shm", oversubscribed ? "tree" : "shm", "shm", "shm", "ring", "shm", "shm"}
                  : std::vector<std::string>{"tree", "tree", "tree", "ring", "ring", "ring", "ring"};
    for (auto& a : algos) CHECK(a == want);
  }
}

TEST_CASE("shm: a peer that never joins gives timeout_error within the deadline, not a hang") {
  for (auto k : {shm_kind::one_shot, shm_kind::two_shot}) {
    dpkit::inproc_world world(2, nullptr, 4096);
    auto res = run_world(world, [&](dpkit::inproc& comm) {
      if (comm.rank() == 1) {
        std::this_thread::sleep_for(1500ms); // never calls; returns long after rank 0's deadline
        return;
      }
      dpkit::collective_options o;
      o.timeout = 200ms;
      std::vector<float> v(10000, 1.f);
      call(comm, k, v, v, dpkit::reduce_op::sum, o);
    });
    CAPTURE(res[0].what);
    CHECK(res[0].type == "timeout");
    CHECK(res[0].seconds >= 0.19);
    CHECK(res[0].seconds < 1.5);
    CHECK(res[0].what.find("deadline") != std::string::npos);
  }
}

TEST_CASE("shm: a peer that throws ends the others' waits at once, and the transport refuses reuse") {
  dpkit::inproc_world world(3, nullptr, 4096);
  std::vector<std::string> second(3);
  auto res = run_world(world, [&](dpkit::inproc& comm) {
    std::vector<float> v(1000, 1.f);
    dpkit::allreduce_shm(comm, v); // one good call first
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(200ms); // the others are waiting in their second call by now
      throw std::runtime_error("rank 2 fails before its second call");
    }
    try {
      dpkit::allreduce_shm(comm, v);
    } catch (const dpkit::peer_error&) {
      try {
        dpkit::allreduce_shm(comm, v);
      } catch (const dpkit::communicator_error&) {
        second[static_cast<std::size_t>(comm.rank())] = "communicator";
      }
      throw;
    }
  });
  for (int r : {0, 1}) {
    CAPTURE(res[static_cast<std::size_t>(r)].what);
    CHECK(res[static_cast<std::size_t>(r)].type == "peer");
    CHECK(res[static_cast<std::size_t>(r)].seconds < 5.0); // default deadline: 30 min
    CHECK(second[static_cast<std::size_t>(r)] == "communicator");
  }
}

TEST_CASE("shm: ranks running different all-reduces get mismatch_error") {
  dpkit::inproc_world world(2, nullptr, 4096);
  auto res = run_world(world, [&](dpkit::inproc& comm) {
    std::vector<float> v(100, 1.f);
    dpkit::allreduce_shm(comm, v, comm.rank() == 0 ? dpkit::reduce_op::sum : dpkit::reduce_op::max);
  });
  for (auto& r : res) {
    CAPTURE(r.what);
    CHECK((r.type == "mismatch" || r.type == "peer"));
    CHECK(r.seconds < 5.0);
  }
  CHECK((res[0].type == "mismatch" || res[1].type == "mismatch"));
  // The fingerprints reach the segment only when a rank waits or sees the
  // mismatch; the error still names both calls.
  bool named = false;
  for (auto& r : res)
    named |= r.what.find("allreduce(float, 100, sum, shm") != std::string::npos &&
             r.what.find("allreduce(float, 100, max, shm") != std::string::npos;
  CHECK(named);
}

TEST_CASE("shm: a rank in a shm all-reduce whose peer runs a ring all-reduce gets mismatch_error naming both") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    dpkit::inproc_world world(n, nullptr, 4096);
    auto res = run_world(world, [&](dpkit::inproc& comm) {
      std::vector<float> v(100, 1.f);
      if (comm.rank() == 0) dpkit::allreduce_ring(comm, v);
      else dpkit::allreduce_shm(comm, v);
    });
    bool named = false;
    for (auto& r : res) {
      CAPTURE(r.what);
      CHECK((r.type == "mismatch" || r.type == "peer"));
      CHECK(r.seconds < 5.0);
      named |= r.what.find("ring") != std::string::npos && r.what.find("shm") != std::string::npos;
    }
    CHECK(named);
  }
}

TEST_CASE("shm: bad sizes are invalid_argument and leave the transport usable") {
  dpkit::inproc_world world(2, nullptr, 4096);
  world.run([&](dpkit::inproc& comm) {
    std::vector<float> a(10, 1.f), b(9);
    CHECK_THROWS_AS(dpkit::allreduce_shm(comm, a, b), dpkit::invalid_argument);
    dpkit::allreduce_shm(comm, a);
    for (auto x : a) CHECK(x == 2.f);
  });
}

TEST_CASE("shm segment: a region that is not 64-byte aligned is refused, naming the rank") {
  // MPI_Win_allocate_shared may hand out a segment at any offset (Open MPI
  // gave 0x...108 under ASan); the control line needs 64-byte alignment.
  alignas(64) static std::byte block[4 * 1024];
  std::vector<std::byte*> good{block, block + 1024};
  CHECK_NOTHROW(dpkit::detail::shm_segment(0, good, 256));
  std::vector<std::byte*> bad{block, block + 1024 + 8};
  try {
    dpkit::detail::shm_segment s(0, bad, 256);
    FAIL("a misaligned region was accepted");
  } catch (const dpkit::error& e) {
    CHECK(std::string(e.what()).find("region of rank 1") != std::string::npos);
  }
}

TEST_CASE("policy: shm is chosen only when available and allowed") {
  dpkit::allreduce_policy p;
  CHECK(p.choose(8, 2, true) == dpkit::algorithm::shm_one_shot);
  CHECK(p.choose(8, 2, false) == dpkit::algorithm::tree);
  CHECK(p.choose(8, 1, true) == dpkit::algorithm::tree);
  CHECK(p.choose(1 << 20, 2, true) == dpkit::algorithm::shm_two_shot);
  p.use_shm = false;
  CHECK(p.choose(8, 2, true) == dpkit::algorithm::tree);
  CHECK(p.choose(1 << 20, 2, true) == dpkit::algorithm::ring);
  CHECK(dpkit::parse_algorithm("shm") == dpkit::algorithm::shm);
  CHECK(dpkit::algorithm_name(dpkit::algorithm::shm) == "shm");
  CHECK(dpkit::parse_algorithm("shm1") == dpkit::algorithm::shm_one_shot);
  CHECK(dpkit::parse_algorithm("shm2") == dpkit::algorithm::shm_two_shot);
}

TEST_CASE("shm wait: a sleeper on a peer's futex is woken by its step and by abort_all, none is lost") {
  // Waits that go to sleep at once (no spins, no yields) with long futex
  // timeouts: each returns in time only if the store (or abort_all) woke it;
  // without the wake every subcase fails (checked by removing it).
  using dpkit::detail::shm_control;
  alignas(64) static shm_control peer, mine;
  peer.step.store(0);
  peer.sleepers.store(0);
  mine.abort.store(0);
  const long sleep_us = 10'000'000;
  const auto t0 = std::chrono::steady_clock::now();

  SUBCASE("2000 ping-pongs between two threads") {
    // a lost wake-up costs a 1 s timeout; the run gives up after 5 s
    alignas(64) static shm_control echo;
    echo.step.store(0);
    echo.sleepers.store(0);
    std::atomic<bool> stop{false};
    constexpr std::uint64_t rounds = 2000;
    std::thread other([&] {
      for (std::uint64_t e = 1; e <= rounds && !stop; ++e) {
        dpkit::detail::shm_wait([&] { return stop || peer.step.load(std::memory_order_acquire) >= e; }, [] {}, 0,
                                &peer, 0, 1'000'000);
        dpkit::detail::shm_publish_step(echo, e);
      }
    });
    for (std::uint64_t e = 1; e <= rounds && !stop; ++e) {
      dpkit::detail::shm_publish_step(peer, e);
      dpkit::detail::shm_wait([&] { return stop || echo.step.load(std::memory_order_acquire) >= e; },
                              [&] {
                                if (std::chrono::steady_clock::now() - t0 > 5s) stop = true;
                              },
                              0, &echo, 0, 1'000'000);
      if (stop) dpkit::detail::shm_publish_step(peer, rounds + 1); // release the other thread
    }
    other.join();
    CHECK_FALSE(stop.load());
    CHECK(echo.step.load() == rounds);
  }
  SUBCASE("abort_all wakes a sleeper, whose check() then throws") {
    alignas(64) static std::byte region[2][dpkit::detail::shm_region_bytes(0) + 64];
    dpkit::detail::shm_segment seg(0, {region[0], region[1]}, 0);
    seg.reset_own();
    dpkit::detail::shm_segment seg1(1, {region[0], region[1]}, 0);
    seg1.reset_own();
    std::atomic<bool> threw{false};
    std::thread waiter([&] {
      try {
        dpkit::detail::shm_wait([&] { return seg.control(1).step.load() != 0; },
                                [&] {
                                  if (seg.aborted()) throw dpkit::peer_error("aborted");
                                },
                                0, &seg.control(1), 0, sleep_us);
      } catch (const dpkit::peer_error&) {
        threw = true;
      }
    });
    while (seg.control(1).sleepers.load() == 0) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(20ms); // inside the futex wait by now
    seg1.abort_all();
    waiter.join();
    CHECK(threw.load());
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  }
  SUBCASE("a step published while the waiter sleeps wakes it") {
    std::thread waiter([&] {
      dpkit::detail::shm_wait([&] { return peer.step.load() >= 7; }, [] {}, 0, &peer, 0, sleep_us);
    });
    while (peer.sleepers.load() == 0) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(20ms);
    dpkit::detail::shm_publish_step(peer, 7);
    waiter.join();
    CHECK(peer.sleepers.load() == 0);
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  }
}

TEST_CASE("shm wait: no pause-spins when the launcher says the ranks share cores (mpi_yield_when_idle)") {
  using dpkit::detail::mca_bool_true;
  // Open MPI's boolean spellings
  for (const char* yes : {"1", "2", "true", "TRUE", "Yes", "on"}) CHECK_MESSAGE(mca_bool_true(yes), yes);
  for (const char* no : {"0", "false", "no", "off", "", "maybe", "1x"}) CHECK_FALSE_MESSAGE(mca_bool_true(no), no);
  CHECK_FALSE(mca_bool_true(nullptr));
  // ranks sharing cores never spin (the awaited rank may need this core); ranks with cores of their own do
  CHECK(dpkit::detail::shm_spins_before_yield(true) == 0);
  CHECK(dpkit::detail::shm_spins_before_yield(false) == 256);
  // more ranks than cores share cores whatever the launcher says
  CHECK(dpkit::detail::shm_spin_count(static_cast<int>(std::thread::hardware_concurrency()) + 1) == 0);
  // what this process's launcher said decides a world that fits the cores
  CHECK(dpkit::detail::shm_spin_count(1) ==
        (mca_bool_true(std::getenv("OMPI_MCA_mpi_yield_when_idle")) ? 0 : 256));
}

namespace {
// Fills rank r's two segment buffers with `pattern`; counts the bytes that
// no longer hold it (what a two-shot copied through them).
std::size_t segment_bytes_changed(dpkit::inproc& comm, unsigned char pattern, bool fill) {
  auto* seg = comm.shm();
  REQUIRE(seg != nullptr);
  std::size_t changed = 0;
  for (int b = 0; b < 2; ++b) {
    std::byte* buf = seg->buffer(comm.rank(), b);
    if (fill) std::memset(buf, pattern, seg->slot_bytes());
    else
      for (std::size_t i = 0; i < seg->slot_bytes(); ++i) changed += buf[i] != std::byte{pattern};
  }
  return changed;
}
} // namespace

TEST_CASE_TEMPLATE("shm all-reduce over symmetric memory reads and writes the peers' buffers directly: the sequential "
                   "reference, nothing through the segment", T, DPKIT_ELEMENT_TYPES) {
  for (int n : test_sizes::worlds({2, 3, 5})) {
    const std::size_t nn = static_cast<std::size_t>(n), shm_bytes = 256, chunk = shm_bytes / sizeof(T);
    dpkit::inproc_world world(n, nullptr, shm_bytes);
    std::mutex mu;
    std::vector<std::string> bad;
    std::barrier sync(n); // the ranks are threads: no peer reads a segment buffer while it is refilled
    world.run([&](dpkit::inproc& comm) {
      const int r = comm.rank();
      const std::size_t max_count = 3 * chunk + 7 + 8;
      // offsets differ by rank: only the window must be the same
      auto win_in = dpkit::allocate_symmetric(comm, (max_count + 16) * sizeof(T));
      auto win_out = dpkit::allocate_symmetric(comm, (max_count + 128) * sizeof(T));
      CHECK(win_in.shared());
      T* const in = win_in.as<T>().data() + static_cast<std::size_t>(r);
      std::uint64_t salt = 100;
      // outputs at different addresses modulo 16 on every rank, and at the
      // same one (16 r + sizeof(T) bytes in: the two-rank non-temporal path's
      // ordinary-store head, lines and tail)
      for (std::size_t out_at : {2 * static_cast<std::size_t>(r), 16 / sizeof(T) * static_cast<std::size_t>(r) + 1})
      for (auto k : {shm_kind::two_shot, shm_kind::by_size})
        for (auto op : dpt::all_ops)
          for (std::size_t count : {std::size_t{1}, nn - 1, nn + 1, 1000 % (max_count - 8), 3 * chunk + 7})
            for (bool in_place : {false, true}) {
              if (count == 0) continue;
              ++salt;
              const auto src = dpt::make_input<T>(op, r, count, 0, salt);
              T* const out = win_out.as<T>().data() + out_at;
              std::memcpy(static_cast<void*>(in), src.data(), count * sizeof(T));
              for (std::size_t i = 0; i < count; ++i) out[i] = dpt::sentinel<T>();
              std::span<T> in_s(in, count), out_s(in_place ? in : out, count);
              sync.arrive_and_wait();
              segment_bytes_changed(comm, 0xa5, true);
              sync.arrive_and_wait();
              call(comm, k, in_s, out_s, op, {});
              const std::size_t through_segment = segment_bytes_changed(comm, 0xa5, false);
              // by_size: one-shot up to 512 bytes, on two ranks up to the default threshold
              const bool two_shot = k == shm_kind::two_shot || (n > 2 && count * sizeof(T) > 512);
              std::lock_guard lk(mu);
              const std::string what = std::string(name(k)) + " n=" + std::to_string(n) + " rank " +
                                       std::to_string(r) + " op " + std::string(dpkit::reduce_op_name(op)) +
                                       " count " + std::to_string(count) + (in_place ? " in-place" : "");
              if (two_shot && through_segment != 0)
                bad.push_back(what + ": " + std::to_string(through_segment) + " segment bytes written");
              for (std::size_t i = 0; i < count; ++i) {
                const T e = dpt::reference<T>(op, n, i, salt);
                if (std::memcmp(&e, &out_s[i], sizeof(T)) != 0) {
                  bad.push_back(what + ": element " + std::to_string(i) + " is " + std::to_string(dpt::to_double(out_s[i])) +
                                ", expected " + std::to_string(dpt::to_double(e)));
                  break;
                }
              }
              if (!in_place && std::memcmp(in, src.data(), count * sizeof(T)) != 0)
                bad.push_back(what + ": out-of-place input modified");
            }
    });
    CAPTURE(n);
    for (std::size_t i = 0; i < std::min<std::size_t>(bad.size(), 5); ++i) FAIL_CHECK(bad[i]);
    CHECK(bad.empty());
  }
}

TEST_CASE("shm all-reduce where one rank's buffer is not in symmetric memory: every rank runs the two-shot, the "
          "rank-order sum") {
  for (int n : test_sizes::worlds({2, 3})) {
    CAPTURE(n);
    dpkit::inproc_world world(n, nullptr, 256);
    std::vector<std::size_t> through(static_cast<std::size_t>(n));
    std::barrier sync(n);
    world.run([&](dpkit::inproc& comm) {
      const int r = comm.rank();
      const std::size_t count = 1000;
      auto win = dpkit::allocate_symmetric(comm, 2 * count * sizeof(float));
      std::vector<float> priv(count);
      for (int odd_one : {n - 1, 0}) {
        // rank odd_one's output is private memory, every other buffer lies in the window
        float* in = win.as<float>().data();
        std::span<float> out = r == odd_one ? std::span<float>(priv) : win.as<float>().subspan(count, count);
        for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(r + 1) * static_cast<float>(i % 7);
        sync.arrive_and_wait();
        segment_bytes_changed(comm, 0x3c, true);
        sync.arrive_and_wait();
        dpkit::allreduce_shm_two_shot(comm, std::span<float>(in, count), out);
        through[static_cast<std::size_t>(r)] = segment_bytes_changed(comm, 0x3c, false);
        const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
        for (std::size_t i = 0; i < count; ++i)
          if (out[i] != ranks_sum * static_cast<float>(i % 7)) {
            FAIL_CHECK("rank " << r << " element " << i << " is " << out[i]);
            break;
          }
      }
    });
    for (auto t : through) CHECK(t > 0); // the two-shot went through the segment on every rank
  }
}

TEST_CASE("allocate_symmetric: 0 bytes, different byte counts and different allocation orders are invalid_argument "
          "on every rank; without a segment it is private memory and all-reduces still agree") {
  SUBCASE("errors") {
    dpkit::inproc_world world(3, nullptr, 4096);
    std::atomic<int> threw{0};
    world.run([&](dpkit::inproc& comm) {
      CHECK_THROWS_AS(dpkit::allocate_symmetric(comm, 0), dpkit::invalid_argument);
      try {
        (void)dpkit::allocate_symmetric(comm, comm.rank() == 1 ? 8192 : 4096);
      } catch (const dpkit::invalid_argument& e) {
        CHECK(std::string(e.what()).find("different byte counts") != std::string::npos);
        ++threw;
      }
      auto a = dpkit::allocate_symmetric(comm, 4096);
      CHECK(a.shared());
      CHECK(a.size() == 4096);
      CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 4096 == 0);
      // an even page count gets one page more: regions never a multiple of 2^16 pages apart
      auto b = dpkit::allocate_symmetric(comm, 8192);
      auto& reg = *comm.shm()->windows();
      const auto id = reg.find(b.data(), b.size(), comm.rank()).first;
      CHECK(id != 0);
      CHECK(reg.address(id, 1, 0, 0) - reg.address(id, 0, 0, 0) == 3 * 4096);
      // from 16 MiB, a page count that is 0x55 modulo 256: never 128 MiB + 4 KiB apart
      auto c = dpkit::allocate_symmetric(comm, std::size_t{16} << 20);
      const auto cid = reg.find(c.data(), c.size(), comm.rank()).first;
      CHECK(reg.address(cid, 1, 0, 0) - reg.address(cid, 0, 0, 0) == (4096 + 0x55) * 4096);
    });
    CHECK(threw == 3);
    // rank 0's registry one window ahead of its peers' (as if it had
    // allocated once more): the next allocation is refused on every rank
    threw = 0;
    world.run([&](dpkit::inproc& comm) {
      auto& reg = *comm.shm()->windows();
      if (comm.rank() == 0) reg.add({reg.next_id(), nullptr, 0, 0});
      try {
        (void)dpkit::allocate_symmetric(comm, 4096);
      } catch (const dpkit::invalid_argument& e) {
        CHECK(std::string(e.what()).find("different allocations") != std::string::npos);
        ++threw;
      }
    });
    CHECK(threw == 3);
  }
  SUBCASE("the node cannot hold it: dpkit::error on every rank, or private memory with symmetric_fallback") {
    dpkit::inproc_world world(2, nullptr, 4096);
    world.run([&](dpkit::inproc& comm) { (void)dpkit::allocate_symmetric(comm, 4096); }); // segment and a window set up
    std::atomic<int> threw{0};
    {
      // objects over 64 KiB cannot be reserved (posix_fallocate: EFBIG), as in a small /dev/shm (ENOSPC)
      test_fs::file_size_limit limit(64 * 1024);
      world.run([&](dpkit::inproc& comm) {
        try {
          (void)dpkit::allocate_symmetric(comm, 1 << 20);
        } catch (const dpkit::error& e) {
          CHECK(std::string(e.what()).find("could not be set up") != std::string::npos);
          ++threw;
        }
        auto a = dpkit::allocate_symmetric(comm, 1 << 20, {}, dpkit::symmetric_fallback::private_memory);
        CHECK_FALSE(a.shared());
        CHECK(a.size() == std::size_t{1} << 20);
        CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 4096 == 0);
        auto v = a.as<float>();
        CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
        std::fill(v.begin(), v.end(), static_cast<float>(comm.rank() + 1));
        dpkit::allreduce(comm, v);
        CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 3.0f; }));
      });
    }
    CHECK(threw == 2);
    // the ranks still agree on the next window: it is shared again once the object fits
    world.run([&](dpkit::inproc& comm) {
      auto a = dpkit::allocate_symmetric(comm, 1 << 20, {}, dpkit::symmetric_fallback::private_memory);
      CHECK(a.shared());
    });
  }
  SUBCASE("no segment") {
    dpkit::inproc_world world(2, nullptr, 0);
    world.run([&](dpkit::inproc& comm) {
      auto a = dpkit::allocate_symmetric(comm, 4000);
      CHECK_FALSE(a.shared());
      auto v = a.as<std::int32_t>();
      CHECK(v.size() == 1000);
      for (auto& x : v) x = comm.rank() + 1;
      dpkit::allreduce(comm, v);
      for (auto x : v) CHECK(x == 3);
    });
  }
}

namespace {
// `pages` pages of private anonymous memory, unmapped on destruction.
struct anon_pages {
  explicit anon_pages(std::size_t pages) : bytes(pages * 4096) {
    void* q = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(q != MAP_FAILED);
    p = static_cast<std::byte*>(q);
  }
  anon_pages(const anon_pages&) = delete;
  anon_pages& operator=(const anon_pages&) = delete;
  ~anon_pages() { munmap(p, bytes); }
  std::size_t bytes;
  std::byte* p = nullptr;
};
} // namespace

TEST_CASE("register_memory: the caller's buffer keeps its address and contents, its whole pages run direct and its "
          "edges the two-shot (the rank-order sum), and release makes it private again") {
  for (int n : test_sizes::worlds({2, 3})) {
    CAPTURE(n);
    // segment buffers larger than the message: what went through them is
    // what the two-shot moved (all of the message without the direct path)
    dpkit::inproc_world world(n, nullptr, std::size_t{512} << 10);
    std::mutex mu;
    std::vector<std::string> bad;
    std::barrier sync(n);
    world.run([&](dpkit::inproc& comm) {
      const int r = comm.rank();
      const std::size_t count = 64 * 1024 + 37; // floats: 64 pages and a bit
      // buffers at different offsets into their first page on every rank,
      // so each rank's whole pages cover different elements
      anon_pages in_mem(66), out_mem(66);
      float* const in = reinterpret_cast<float*>(in_mem.p + 4 * (3 * r + 1));
      float* const out = reinterpret_cast<float*>(out_mem.p + 4096 - 4 * (5 * r + 2));
      for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(r + 1) * static_cast<float>(i % 7);
      {
        auto reg_in = dpkit::register_memory(comm, in, count * sizeof(float));
        auto reg_out = dpkit::register_memory(comm, out, count * sizeof(float));
        CHECK(reg_in.shared());
        CHECK(reg_out.shared());
        CHECK(reg_in.pages() == in_mem.p + 4096);
        CHECK(reg_in.page_bytes() == 63 * 4096); // from the second page to the last whole one
        // the pages are now a shared object's; the contents stayed
        CHECK(dpkit::detail::mapping_at(reg_in.pages())->inode != 0);
        bool kept = true;
        for (std::size_t i = 0; i < count; ++i) kept &= in[i] == static_cast<float>(r + 1) * static_cast<float>(i % 7);
        CHECK(kept);
        const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
        for (bool in_place : {false, true})
          for (bool two_shot : {true, false}) {
            for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(r + 1) * static_cast<float>(i % 7);
            std::span<float> in_s(in, count), out_s(in_place ? in : out, count);
            sync.arrive_and_wait();
            segment_bytes_changed(comm, 0x3c, true);
            sync.arrive_and_wait();
            if (two_shot) dpkit::allreduce_shm_two_shot(comm, in_s, out_s);
            else dpkit::allreduce(comm, in_s, out_s);
            const std::size_t through = segment_bytes_changed(comm, 0x3c, false);
            sync.arrive_and_wait();
            std::lock_guard lk(mu);
            const std::string what = "rank " + std::to_string(r) + (in_place ? " in place" : " out of place") +
                                     (two_shot ? " two-shot" : " automatic");
            // the edges only (under a page before, under a page after, on
            // the widest rank): the whole message is 256 KiB
            if (through == 0 || through > 4 * 4096)
              bad.push_back(what + ": " + std::to_string(through) + " bytes through the segment");
            for (std::size_t i = 0; i < count; ++i)
              if (out_s[i] != ranks_sum * static_cast<float>(i % 7)) {
                bad.push_back(what + ": element " + std::to_string(i) + " is " + std::to_string(out_s[i]));
                break;
              }
          }
        sync.arrive_and_wait();
      } // released: private memory with the results
      CHECK(dpkit::detail::mapping_at(in_mem.p + 4096)->inode == 0);
      CHECK(dpkit::detail::mapping_at(out_mem.p + 4096)->inode == 0);
      const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
      bool kept = true;
      for (std::size_t i = 0; i < count; ++i) kept &= in[i] == ranks_sum * static_cast<float>(i % 7);
      CHECK(kept);
      // private again: a write here is not seen by a peer's registration of
      // the next window, nor the other way round (the next all-reduce two-shots)
      std::span<float> in_s(in, count);
      for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(r + 1);
      sync.arrive_and_wait();
      segment_bytes_changed(comm, 0x3c, true);
      sync.arrive_and_wait();
      dpkit::allreduce_shm_two_shot(comm, in_s);
      CHECK(segment_bytes_changed(comm, 0x3c, false) > 4 * 4096);
      CHECK(in[count / 2] == ranks_sum);
    });
    for (std::size_t i = 0; i < std::min<std::size_t>(bad.size(), 5); ++i) FAIL_CHECK(bad[i]);
    CHECK(bad.empty());
  }
}

TEST_CASE("register_memory: memory freed and mapped again before release is not written; no whole page on a rank "
          "or no segment registers nothing on any rank") {
  SUBCASE("freed first") {
    dpkit::inproc_world world(2, nullptr, 4096);
    world.run([&](dpkit::inproc& comm) {
      anon_pages mem(5);
      auto reg = dpkit::register_memory(comm, mem.p, mem.bytes);
      REQUIRE(reg.shared());
      // the caller frees the pages and someone else maps new ones there
      void* q = mmap(mem.p, mem.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      REQUIRE(q == static_cast<void*>(mem.p));
      std::memset(mem.p, 0x5a, mem.bytes);
      reg.release();
      CHECK_FALSE(reg.shared());
      bool untouched = true;
      for (std::size_t i = 0; i < mem.bytes; ++i) untouched &= mem.p[i] == std::byte{0x5a};
      CHECK(untouched);
    });
  }
  SUBCASE("memory already symmetric on one rank: invalid_argument on every rank, naming it") {
    dpkit::inproc_world world(2, nullptr, 4096);
    std::atomic<int> threw{0};
    world.run([&](dpkit::inproc& comm) {
      anon_pages mem(4), other(4);
      auto reg = dpkit::register_memory(comm, mem.p, mem.bytes);
      REQUIRE(reg.shared());
      // rank 1 registers an overlapping range again, rank 0 fresh memory
      std::byte* p = comm.rank() == 1 ? mem.p + 4096 : other.p;
      try {
        (void)dpkit::register_memory(comm, p, 2 * 4096);
      } catch (const dpkit::invalid_argument& e) {
        CHECK(std::string(e.what()).find("rank 1's buffer lies in symmetric memory already") != std::string::npos);
        ++threw;
      }
      auto sym = dpkit::allocate_symmetric(comm, 3 * 4096);
      CHECK_THROWS_AS(dpkit::register_memory(comm, sym.data(), sym.size()), dpkit::invalid_argument);
      // after the release the same pages register again
      reg.release();
      auto again = dpkit::register_memory(comm, mem.p, mem.bytes);
      CHECK(again.shared());
    });
    CHECK(threw == 2);
  }
  SUBCASE("no whole page on one rank") {
    dpkit::inproc_world world(3, nullptr, 4096);
    world.run([&](dpkit::inproc& comm) {
      anon_pages mem(3);
      // rank 1's 5000 bytes straddle a page boundary without a whole page
      std::byte* p = comm.rank() == 1 ? mem.p + 3000 : mem.p;
      std::memset(p, 7, 5000);
      auto reg = dpkit::register_memory(comm, p, 5000);
      CHECK_FALSE(reg.shared());
      CHECK(dpkit::detail::mapping_at(mem.p)->inode == 0);
      CHECK(p[4999] == std::byte{7});
      CHECK_THROWS_AS(dpkit::register_memory(comm, nullptr, 8), dpkit::invalid_argument);
    });
  }
  SUBCASE("the node cannot hold it: nothing registered on any rank, the buffer untouched") {
    dpkit::inproc_world world(2, nullptr, 4096);
    world.run([&](dpkit::inproc& comm) { (void)dpkit::allocate_symmetric(comm, 4096); }); // segment set up
    test_fs::file_size_limit limit(64 * 1024); // objects over 64 KiB cannot be reserved, as in a small /dev/shm
    world.run([&](dpkit::inproc& comm) {
      anon_pages mem(256);
      std::memset(mem.p, comm.rank() + 1, mem.bytes);
      auto reg = dpkit::register_memory(comm, mem.p, mem.bytes);
      CHECK_FALSE(reg.shared());
      CHECK(dpkit::detail::mapping_at(mem.p)->inode == 0);
      bool untouched = true;
      for (std::size_t i = 0; i < mem.bytes; ++i) untouched &= mem.p[i] == static_cast<std::byte>(comm.rank() + 1);
      CHECK(untouched);
      // the ranks still agree on the next window
      auto small = dpkit::register_memory(comm, mem.p, 4 * 4096);
      CHECK(small.shared());
    });
  }
  SUBCASE("no segment") {
    dpkit::inproc_world world(2, nullptr, 0);
    world.run([&](dpkit::inproc& comm) {
      anon_pages mem(4);
      auto reg = dpkit::register_memory(comm, mem.p, mem.bytes);
      CHECK_FALSE(reg.shared());
    });
  }
}
