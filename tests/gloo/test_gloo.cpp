// The Gloo transport (dpkit/transport/gloo.hpp): dpkit's own algorithms over
// Gloo's TCP pairs, checked against the sequential reference of
// tests/collectives/common.hpp; store URLs; the deadline and the failure
// propagation when a peer never joins, closes its transport or its process
// dies mid-collective. Ranks are threads of this process (each with its own
// Gloo device and context, meeting through a file store in a temporary
// directory) or, for the process tests, copies of this executable started
// in worker mode (`--worker ...`). `--redis` is a separate meson test: the
// Redis store against a redis-server this program starts (exit 77, skipped,
// when redis-server is not installed).
#define DOCTEST_CONFIG_IMPLEMENT
#include "../collectives/common.hpp"

#include <dpkit/elastic/group.hpp>
#include <dpkit/transport/gloo.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <numeric>
#include <thread>
#include <tuple>
#include <vector>

extern char** environ;

namespace {

using namespace std::chrono_literals;
using dpt::config;
using dpt::kind;

// A fresh directory for one test's file stores, removed at the end.
struct temp_dir {
  std::string path;
  temp_dir() {
    std::string t = (std::filesystem::temp_directory_path() / "dpkit-gloo-XXXXXX").string();
    if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
    path = t;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string url(const std::string& sub) const { return "file://" + path + "/" + sub; }
};

dpkit::gloo_options local_options(std::chrono::milliseconds timeout = 20s) {
  dpkit::gloo_options o;
  o.hostname = "127.0.0.1";
  o.timeout = timeout;
  return o;
}

// Runs f(comm) on n threads, one gloo_transport each (all through `url`);
// returns each rank's exception text ("" when it returned).
template <class F>
std::vector<std::string> run_world(const std::string& url, int n, F&& f,
                                   const dpkit::gloo_options& o = local_options()) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        dpkit::gloo_transport comm(url, r, n, o);
        f(comm);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
        if (errors[static_cast<std::size_t>(r)].empty()) errors[static_cast<std::size_t>(r)] = "(empty what())";
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// One all-reduce configuration of tests/collectives/common.hpp on this rank
// (the all-reduce branch of dpt::run_on_rank, without instantiating the
// other collectives for every element type).
template <class T, class C>
std::vector<T> run_allreduce(C& comm, const config& c) {
  auto in = dpt::make_input<T>(c.op, comm.rank(), c.count, 0, c.salt);
  const bool ring = c.k == kind::ar_ring;
  if (c.in_place) {
    if (ring) dpkit::allreduce_ring(comm, in, c.op, c.o);
    else dpkit::allreduce_tree(comm, in, c.op, c.o);
    return in;
  }
  std::vector<T> out(c.count, dpt::sentinel<T>());
  if (ring) dpkit::allreduce_ring(comm, in, out, c.op, c.o);
  else dpkit::allreduce_tree(comm, in, out, c.op, c.o);
  return out;
}

// Ring and tree, every op, counts 0, 1, < n, n, not divisible, and one
// count pipelined in many small segments; in place and out of place.
std::vector<config> allreduce_configs(int n) {
  std::vector<config> cfgs;
  auto counts = dpt::counts_for(n, false);
  counts.push_back(1000);
  for (kind k : {kind::ar_ring, kind::ar_tree})
    for (auto op : dpt::all_ops)
      for (std::size_t i = 0; i < counts.size(); ++i) {
        config c{k, counts[i], op};
        c.in_place = i % 2 == 1;
        c.o.timeout = 20s;
        if (counts[i] == 1000) {
          c.o.segment_bytes = 256; // many segments in flight: posting order matters
          c.o.pipeline_depth = 3;
        }
        c.salt = static_cast<std::uint64_t>(i);
        cfgs.push_back(c);
      }
  return cfgs;
}

template <class T>
using per_rank = std::vector<std::vector<std::vector<T>>>; // [rank][config]

template <class... Ts>
void check_allreduce_all_types(const temp_dir& dir, int n) {
  const auto cfgs = allreduce_configs(n);
  std::tuple<per_rank<Ts>...> got;
  (std::get<per_rank<Ts>>(got).resize(static_cast<std::size_t>(n)), ...);
  const auto errors = run_world(dir.url("allreduce-n" + std::to_string(n)), n, [&](dpkit::gloo_transport& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    auto one_type = [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      for (const auto& c : cfgs) std::get<per_rank<T>>(got)[r].push_back(run_allreduce<T>(comm, c));
    };
    (one_type(static_cast<Ts*>(nullptr)), ...);
  });
  for (int r = 0; r < n; ++r) REQUIRE_MESSAGE(errors[static_cast<std::size_t>(r)].empty(), "rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
  int failures = 0;
  ((failures += dpt::check_results<Ts>(n, cfgs, std::get<per_rank<Ts>>(got))), ...);
  CHECK(failures == 0);
}

// ---- worker mode: one rank of a multi-process test ----
// --worker URL RANK SIZE DIE_RANK: DIE_RANK < 0: ring and tree all-reduces
// of float and int32 checked against the reference (exit 0, or 1 on a wrong
// result); DIE_RANK >= 0: all-reduces in a loop until rank DIE_RANK's
// process ends itself with _exit(3) 300 ms in, mid-collective; a survivor
// exits 0 when its failing call threw a dpkit error within the collective's
// 8 s deadline (almost always within milliseconds), 2 when it took longer, 4 when nothing
// failed within 20 s. Every rank exits 6 if SIGPIPE is not ignored once its
// transport exists.
int worker(const std::string& url, int rank, int size, int die_rank) {
  try {
    dpkit::gloo_transport comm(url, rank, size, local_options());
    // Gloo writes with writev: with SIGPIPE's default action a write to a
    // peer that just died would end this process instead of failing.
    struct sigaction sa{};
    if (sigaction(SIGPIPE, nullptr, &sa) != 0 || sa.sa_handler != SIG_IGN) {
      std::cerr << "worker rank " << rank << ": SIGPIPE is not ignored\n";
      return 6;
    }
    if (die_rank < 0) {
      int bad = 0;
      for (kind k : {kind::ar_ring, kind::ar_tree})
        for (auto op : dpt::all_ops)
          for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t(size - 1), std::size_t(2 * size + 1), std::size_t{4099}}) {
            config c{k, count, op};
            c.o.timeout = 20s;
            c.o.segment_bytes = 1024;
            const auto f = run_allreduce<float>(comm, c);
            const auto i = run_allreduce<std::int32_t>(comm, c);
            for (std::size_t e = 0; e < count; ++e) {
              const float rf = dpt::reference<float>(op, size, e);
              const std::int32_t ri = dpt::reference<std::int32_t>(op, size, e);
              if (std::memcmp(&f[e], &rf, sizeof rf) != 0 || i[e] != ri) {
                std::cerr << "worker rank " << rank << ": " << c.describe(size) << " [" << e << "] wrong\n";
                ++bad;
                break;
              }
            }
          }
      return bad == 0 ? 0 : 1;
    }
    if (rank == die_rank)
      std::thread([] {
        std::this_thread::sleep_for(300ms);
        std::_Exit(3);
      }).detach();
    std::vector<float> g(1 << 16, 1.0f);
    dpkit::collective_options o;
    // Most survivors learn from the broken connections within
    // milliseconds; one whose only pending operation is a send to the dead
    // rank is not told by Gloo (it reports a broken pair only to what is
    // pending on it, once it reads) and learns at this deadline (the
    // elastic group's heartbeat check ends such a wait sooner). 8 s keeps
    // that case short; the test checks that every survivor throws, never
    // hangs.
    o.timeout = 8s;
    o.segment_bytes = 4096;
    const auto start = dpkit::clock::now();
    while (dpkit::clock::now() - start < 20s) {
      const auto t0 = dpkit::clock::now();
      try {
        dpkit::allreduce_ring(comm, g, dpkit::reduce_op::avg, o);
      } catch (const dpkit::error& e) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(dpkit::clock::now() - t0).count();
        std::cerr << "worker rank " << rank << ": threw after " << ms << " ms: " << e.what() << "\n";
        return ms < 9000 ? 0 : 2; // within the deadline (8 s), not a hang
      }
    }
    return 4;
  } catch (const std::exception& e) {
    std::cerr << "worker rank " << rank << ": " << e.what() << "\n";
    return 5;
  }
}

// Starts this executable once per argument list (the arguments after the
// program name); returns each exit code (-1: killed after the 90 s limit, or
// not started).
std::vector<int> spawn_all(const std::vector<std::vector<std::string>>& arg_lists) {
  std::vector<pid_t> pids;
  for (const auto& list : arg_lists) {
    std::vector<std::string> args = {"/proc/self/exe"};
    args.insert(args.end(), list.begin(), list.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) pid = -1;
    pids.push_back(pid);
  }
  std::vector<int> codes(pids.size(), -1);
  const auto until = std::chrono::steady_clock::now() + 90s;
  for (std::size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] <= 0) continue;
    for (;;) {
      int st = 0;
      const pid_t w = waitpid(pids[i], &st, WNOHANG);
      if (w == pids[i]) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (std::chrono::steady_clock::now() > until) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &st, 0);
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
  }
  return codes;
}

// Starts this executable in worker mode for ranks 0..n-1.
std::vector<int> run_processes(const std::string& url, int n, int die_rank) {
  std::vector<std::vector<std::string>> lists;
  for (int r = 0; r < n; ++r)
    lists.push_back({"--worker", url, std::to_string(r), std::to_string(n), std::to_string(die_rank)});
  return spawn_all(lists);
}

// ---- redis mode: the Redis store against a redis-server started here ----
std::string find_redis_server() {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/usr/sbin:/bin";
  p += ":/usr/bin:/usr/sbin";
  std::size_t start = 0;
  while (start <= p.size()) {
    const auto end = p.find(':', start);
    const std::string dir = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!dir.empty() && access((dir + "/redis-server").c_str(), X_OK) == 0) return dir + "/redis-server";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return {};
}

bool port_open(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

TEST_CASE("gloo: store URLs") {
  using dpkit::detail::parse_gloo_store_url;
  auto f = parse_gloo_store_url("file:///tmp/x/y");
  CHECK(!f.redis);
  CHECK(f.path == "/tmp/x/y");
  auto r = parse_gloo_store_url("redis://10.0.0.5:7000/train-3");
  CHECK(r.redis);
  CHECK(r.host == "10.0.0.5");
  CHECK(r.port == 7000);
  CHECK(r.job == "train-3");
  CHECK(parse_gloo_store_url("redis://head/job").port == 6379);
  auto v6 = parse_gloo_store_url("redis://[::1]:6380/j");
  CHECK(v6.host == "::1");
  CHECK(v6.port == 6380);
  for (const char* bad : {"", "file:/tmp/x", "file://host/tmp/x", "file://", "file:///", "redis://host", "redis://host/",
                          "redis://:6379/j", "redis://h:0/j", "redis://h:65536/j", "redis://h:12a/j", "redis://h:/j",
                          "redis://[::1/j", "tcp://h:1/j", "/tmp/x"}) {
    CAPTURE(bad);
    try {
      dpkit::gloo_transport comm(bad, 0, 1, local_options());
      FAIL("no exception for a bad URL");
    } catch (const dpkit::invalid_argument& e) {
      CHECK(std::string(e.what()).find(std::string("'") + bad + "'") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(dpkit::gloo_transport("file:///tmp/dpkit-never", 2, 2, local_options()), dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::gloo_transport("file:///tmp/dpkit-never", 0, 0, local_options()), dpkit::invalid_argument);
  // A Redis server that is not there: an error naming the URL, at once.
  try {
    dpkit::gloo_transport comm("redis://127.0.0.1:1/job", 0, 2, local_options(2s));
    FAIL("no exception without a Redis server");
  } catch (const dpkit::invalid_argument&) {
    CHECK(!DPKIT_GLOO_REDIS); // only when this Gloo has no Redis store
  } catch (const dpkit::error& e) {
    CHECK(std::string(e.what()).find("redis://127.0.0.1:1/job") != std::string::npos);
  }
}

TEST_CASE("gloo: the file store: of racing creators exactly one wins; put overwrites") {
  // Membership decides a generation's members by creating one key: two
  // winners would be two groups (Gloo's own file store can have two).
  temp_dir dir;
  std::string prefix;
  auto store = dpkit::detail::open_kv_store(dir.url("kv"), "test", 2s, prefix);
  CHECK(prefix == "dpkit");
  const int threads = 8, keys = 50;
  std::vector<int> wins(keys, 0);
  std::vector<std::string> winner(keys);
  std::mutex mu;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (int k = 0; k < keys; ++k) {
        const std::string v = "writer " + std::to_string(t);
        if (store->create("race/" + std::to_string(k), {v.begin(), v.end()})) {
          std::lock_guard lk(mu);
          ++wins[static_cast<std::size_t>(k)];
          winner[static_cast<std::size_t>(k)] = v;
        }
      }
    });
  for (auto& t : ts) t.join();
  for (int k = 0; k < keys; ++k) {
    CAPTURE(k);
    CHECK(wins[static_cast<std::size_t>(k)] == 1);
    const auto v = store->try_get("race/" + std::to_string(k));
    REQUIRE(v.has_value());
    CHECK(std::string(v->begin(), v->end()) == winner[static_cast<std::size_t>(k)]);
  }
  store->put("hb", {'1'});
  store->put("hb", {'2', '2'});
  CHECK(*store->try_get("hb") == std::vector<char>{'2', '2'});
  CHECK(!store->try_get("absent").has_value());
  CHECK(!store->exists("absent"));
  CHECK_THROWS_AS(store->set("hb", {'3'}), dpkit::error); // Gloo's set: create once
  const auto t0 = dpkit::clock::now();
  CHECK_THROWS_AS(store->wait({"absent"}, std::chrono::milliseconds(50)), dpkit::timeout_error);
  CHECK(dpkit::clock::now() - t0 < 2s);
}

TEST_CASE("gloo: a rendezvous that a rank never reaches ends with timeout_error") {
  temp_dir dir;
  const auto t0 = dpkit::clock::now();
  try {
    dpkit::gloo_transport comm(dir.url("alone"), 0, 2, local_options(1s));
    FAIL("the rendezvous completed without rank 1");
  } catch (const dpkit::timeout_error& e) {
    CHECK(std::string(e.what()).find("rank 0 of 2") != std::string::npos);
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(dpkit::clock::now() - t0).count();
  CHECK(ms >= 1000);
  CHECK(ms < 3000);
}

TEST_CASE("gloo: all-reduce ring and tree, every op and element type, world sizes 1-5 (threads)") {
  temp_dir dir;
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    check_allreduce_all_types<DPKIT_ELEMENT_TYPES>(dir, n);
  }
}

TEST_CASE("gloo: the other collectives, automatic all-reduce, barrier and async run unchanged") {
  temp_dir dir;
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    std::vector<config> cfgs;
    for (std::size_t count : dpt::counts_for(n, false)) {
      for (kind k : {kind::ar_auto, kind::reduce_scatter, kind::allgather, kind::broadcast, kind::reduce}) {
        config c{k, count, dpkit::reduce_op::sum};
        c.root = n - 1;
        c.o.timeout = 20s;
        c.in_place = count % 2 == 1 && k != kind::reduce;
        cfgs.push_back(c);
      }
    }
    per_rank<float> got(static_cast<std::size_t>(n));
    std::vector<float> async_sum(static_cast<std::size_t>(n));
    const auto errors = run_world(dir.url("other-n" + std::to_string(n)), n, [&](dpkit::gloo_transport& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      for (const auto& c : cfgs) got[r].push_back(dpt::run_on_rank<float>(comm, c));
      dpkit::barrier(comm, dpkit::algorithm::automatic);
      std::vector<float> v(333, float(comm.rank() + 1));
      auto h = dpkit::allreduce_async(comm, v, dpkit::reduce_op::sum);
      h.wait();
      async_sum[r] = v[332];
    });
    for (int r = 0; r < n; ++r) REQUIRE_MESSAGE(errors[static_cast<std::size_t>(r)].empty(), "rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
    CHECK(dpt::check_results<float>(n, cfgs, got) == 0);
    for (int r = 0; r < n; ++r) CHECK(async_sum[static_cast<std::size_t>(r)] == float(n * (n + 1) / 2));
  }
}

TEST_CASE("gloo: gather, scatter, all-to-all (even, uneven) and receives from any rank") {
  temp_dir dir;
  const bool gloo_pairs = [] {
    const char* e = std::getenv("DPKIT_TCP_P2P");
    return e && std::string(e) == "0";
  }();
  for (int n : {2, 3}) {
    CAPTURE(n);
    const auto un = static_cast<std::size_t>(n);
    const auto errors = run_world(dir.url("a2a-n" + std::to_string(n)), n, [&](dpkit::gloo_transport& comm) {
      const int r = comm.rank();
      const auto ur = static_cast<std::size_t>(r);
      // gather to the last rank, then scatter it back: 1001 elements through
      // the node's segment, 5000 (20 KB) linear
      for (std::size_t c : {std::size_t{1001}, std::size_t{5000}}) {
        std::vector<std::int32_t> mine(c, r * 10), all(r == n - 1 ? c * un : 0), back(c, -1);
        dpkit::gather(comm, mine, all, n - 1);
        if (r == n - 1)
          for (std::size_t i = 0; i < all.size(); ++i) REQUIRE(all[i] == static_cast<std::int32_t>(i / c * 10));
        dpkit::scatter(comm, all, back, n - 1);
        REQUIRE(back == mine);
      }
      // even all-to-all: block p of rank r holds r * 100 + p
      std::vector<double> in(3 * un), out(3 * un);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<double>(r * 100) + static_cast<double>(i / 3);
      dpkit::alltoall(comm, in, out);
      for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == static_cast<double>(i / 3 * 100 + ur));
      // uneven: rank r sends r + p + 1 elements to rank p
      std::vector<std::size_t> sc(un), rc(un);
      for (std::size_t p = 0; p < un; ++p) sc[p] = ur + p + 1, rc[p] = p + ur + 1;
      std::vector<float> vin(std::accumulate(sc.begin(), sc.end(), std::size_t{0}), static_cast<float>(r));
      std::vector<float> vout(std::accumulate(rc.begin(), rc.end(), std::size_t{0}), -1.0f);
      dpkit::alltoallv(comm, vin, sc, vout, rc);
      std::size_t at = 0;
      for (std::size_t p = 0; p < un; ++p)
        for (std::size_t i = 0; i < rc[p]; ++i) REQUIRE(vout[at++] == static_cast<float>(p));
      // receives from any rank: every other rank sends its rank to rank 0
      std::int32_t word = r;
      if (gloo_pairs) {
        if (r == 0)
          REQUIRE_THROWS_AS(comm.irecv_any(std::as_writable_bytes(std::span(&word, 1)), 105), dpkit::invalid_argument);
        return;
      }
      if (r == 0) {
        std::vector<int> sources;
        for (int k = 1; k < n; ++k) {
          std::int32_t got = -1;
          auto q = comm.irecv_any(std::as_writable_bytes(std::span(&got, 1)), 105);
          q.wait(dpkit::deadline_after(std::chrono::seconds(20)));
          REQUIRE(q.source() == got);
          sources.push_back(q.source());
        }
        std::sort(sources.begin(), sources.end());
        for (int k = 1; k < n; ++k) REQUIRE(sources[static_cast<std::size_t>(k - 1)] == k);
        // two messages of one sender and tag arrive in order
        std::int32_t a = 0, b = 0;
        auto qa = comm.irecv_any(std::as_writable_bytes(std::span(&a, 1)), 106);
        qa.wait(dpkit::deadline_after(std::chrono::seconds(20)));
        auto qb = comm.irecv_any(std::as_writable_bytes(std::span(&b, 1)), 106);
        qb.wait(dpkit::deadline_after(std::chrono::seconds(20)));
        REQUIRE(a == 1);
        REQUIRE(b == 2);
      } else {
        auto s = comm.isend(std::as_bytes(std::span(&word, 1)), 0, 105);
        s.wait(dpkit::deadline_after(std::chrono::seconds(20)));
        if (r == 1) {
          const std::int32_t one = 1, two = 2;
          auto s1 = comm.isend(std::as_bytes(std::span(&one, 1)), 0, 106);
          auto s2 = comm.isend(std::as_bytes(std::span(&two, 1)), 0, 106);
          s1.wait(dpkit::deadline_after(std::chrono::seconds(20)));
          s2.wait(dpkit::deadline_after(std::chrono::seconds(20)));
        }
      }
      dpkit::barrier(comm);
    });
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(errors[static_cast<std::size_t>(r)].empty(), "rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("gloo: split by color and key, as MPI_Comm_split") {
  static_assert(dpkit::splittable_transport<dpkit::gloo_transport>);
  static_assert(dpkit::checked_transport<dpkit::gloo_transport>);
  static_assert(dpkit::async_transport<dpkit::gloo_transport>);
  static_assert(dpkit::scratch_transport<dpkit::gloo_transport>);
  temp_dir dir;
  const int n = 5;
  std::vector<int> sub_rank(n, -1), sub_size(n, -1);
  std::vector<double> sums(n), parent_sum(n);
  const auto errors = run_world(dir.url("split"), n, [&](dpkit::gloo_transport& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    // even ranks, odd ranks; keys reverse the order
    auto sub = comm.split(comm.rank() % 2, -comm.rank(), 20s);
    sub_rank[r] = sub.rank();
    sub_size[r] = sub.size();
    std::vector<double> v(100, double(comm.rank()));
    dpkit::allreduce_ring(sub, v, dpkit::reduce_op::sum);
    sums[r] = v[99];
    std::vector<double> w(10, 1.0); // the parent still works beside its sub-group
    dpkit::allreduce_tree(comm, w, dpkit::reduce_op::sum);
    parent_sum[r] = w[9];
    if (comm.rank() == 0) CHECK_THROWS_AS(comm.split(-1, 0), dpkit::invalid_argument);
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(errors[static_cast<std::size_t>(r)].empty());
    const bool even = r % 2 == 0;
    CHECK(sub_size[static_cast<std::size_t>(r)] == (even ? 3 : 2));
    // ranks by key = -rank: even {4, 2, 0} -> 0, 1, 2; odd {3, 1} -> 0, 1
    const int want = even ? (4 - r) / 2 : (3 - r) / 2;
    CHECK(sub_rank[static_cast<std::size_t>(r)] == want);
    CHECK(sums[static_cast<std::size_t>(r)] == (even ? 6.0 : 4.0));
    CHECK(parent_sum[static_cast<std::size_t>(r)] == double(n));
  }
}

TEST_CASE("gloo: a rank that never joins the collective: the others throw by the deadline, not hang") {
  // Rank 2 connects, then does not call the all-reduce until the others are
  // done. Without the deadline the others would wait in Gloo forever (its
  // waits are untimed in this transport); with it, every waiting rank
  // throws timeout_error (the rank whose wait expires first) or peer_error
  // (a rank told by the first one's closed connections) close to 500 ms.
  temp_dir dir;
  const int n = 3;
  std::atomic<int> done{0};
  std::vector<long long> ms(n, -1);
  std::vector<std::string> kinds(n);
  const auto errors = run_world(dir.url("late"), n, [&](dpkit::gloo_transport& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    if (comm.rank() == 2) {
      while (done.load() < 2) std::this_thread::sleep_for(1ms);
      return;
    }
    std::vector<float> g(4096, 1.0f);
    dpkit::collective_options o;
    o.timeout = 500ms;
    const auto t0 = dpkit::clock::now();
    try {
      if (comm.rank() == 0) dpkit::allreduce_ring(comm, g, dpkit::reduce_op::sum, o);
      else dpkit::allreduce_ring(comm, g, dpkit::reduce_op::sum, o);
    } catch (const dpkit::timeout_error&) {
      kinds[r] = "timeout_error";
    } catch (const dpkit::peer_error&) {
      kinds[r] = "peer_error";
    }
    ms[r] = std::chrono::duration_cast<std::chrono::milliseconds>(dpkit::clock::now() - t0).count();
    ++done;
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CAPTURE(errors[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)].empty());
    CHECK(!kinds[static_cast<std::size_t>(r)].empty());
    CHECK(ms[static_cast<std::size_t>(r)] >= 0);
    CHECK(ms[static_cast<std::size_t>(r)] < 5000);
    MESSAGE("rank " << r << ": " << kinds[static_cast<std::size_t>(r)] << " after " << ms[static_cast<std::size_t>(r)] << " ms");
  }
  // At least one rank's own deadline expired.
  CHECK((kinds[0] == "timeout_error" || kinds[1] == "timeout_error"));
}

TEST_CASE("gloo: TCP point-to-point: a wait blocked in Gloo's wait ends at its deadline and can wait again; test() "
          "without a wait; destroying a pending request fails the transport, a completed one does not") {
  // A wait blocks in Gloo's untimed wait in the caller's thread and the
  // transport's watchdog aborts it at the deadline; a request nobody waits
  // for goes to a waiter thread when it is tested or destroyed.
  // DPKIT_SHM_BYTES=0: messages go over TCP even between threads of one node.
  const char* old = std::getenv("DPKIT_SHM_BYTES");
  const std::string saved = old ? old : "";
  ::setenv("DPKIT_SHM_BYTES", "0", 1);
  temp_dir dir;
  std::atomic<int> step{0};
  auto until = [&](int s) {
    while (step.load() < s) std::this_thread::sleep_for(1ms);
  };
  std::string timeout_what;
  long long timeout_ms = -1;
  bool rewait_ok = false, tested_ok = false, healthy_after_completed = false, failed_after_pending = false;
  const auto errors = run_world(dir.url("p2p"), 2, [&](dpkit::gloo_transport& comm) {
    std::vector<std::byte> a(64), b(64), c(64), d(64);
    if (comm.rank() == 0) {
      auto r = comm.irecv(a, 1, 7);
      const auto t0 = dpkit::clock::now();
      try {
        r.wait(t0 + 200ms);
      } catch (const dpkit::timeout_error& e) {
        timeout_what = e.what();
      }
      timeout_ms = std::chrono::duration_cast<std::chrono::milliseconds>(dpkit::clock::now() - t0).count();
      step = 1; // rank 1 sends now: the timed-out request is still pending and completes
      r.wait(dpkit::clock::now() + 20s);
      rewait_ok = true;
      auto t = comm.irecv(b, 1, 8);
      const bool early = t.test(); // rank 1 sends only after step 2
      step = 2;
      const auto t1 = dpkit::clock::now() + 20s;
      while (!t.test() && dpkit::clock::now() < t1) std::this_thread::sleep_for(1ms);
      tested_ok = !early && t.test();
      t.wait(dpkit::clock::now() + 20s);
      {
        auto s = comm.isend(c, 1, 9); // rank 1 receives it; this request is never waited or tested
        until(3);
      }
      healthy_after_completed = !comm.health().failed();
      step = 4;
      {
        auto p = comm.irecv(d, 1, 10); // never sent: destroying it fails the transport
      }
      failed_after_pending = comm.health().failed();
      step = 5;
    } else {
      until(1);
      comm.isend(a, 0, 7).wait(dpkit::clock::now() + 20s);
      until(2);
      comm.isend(b, 0, 8).wait(dpkit::clock::now() + 20s);
      comm.irecv(c, 0, 9).wait(dpkit::clock::now() + 20s);
      std::this_thread::sleep_for(50ms); // rank 0's send has completed (its pair saw it)
      step = 3;
      until(5);
    }
  });
  if (old) ::setenv("DPKIT_SHM_BYTES", saved.c_str(), 1);
  else ::unsetenv("DPKIT_SHM_BYTES");
  CAPTURE(errors[0]);
  CAPTURE(errors[1]);
  CHECK(errors[0].empty());
  CAPTURE(timeout_what);
  CHECK(timeout_what.find("rank 0") != std::string::npos);
  CHECK(timeout_what.find("receive from rank 1") != std::string::npos);
  CHECK(timeout_what.find("tag 7") != std::string::npos);
  CHECK(timeout_what.find("64 bytes") != std::string::npos);
  CHECK(timeout_ms >= 200);
  CHECK(timeout_ms < 2000);
  CHECK(rewait_ok);
  CHECK(tested_ok);
  CHECK(healthy_after_completed);
  CHECK(failed_after_pending);
}

TEST_CASE("gloo: a rank that closes its transport mid-collective: the others throw peer_error at once") {
  // The deadline is 60 s: the survivors must learn from the broken
  // connections, within milliseconds, not from the deadline. Ranks 0 and 2
  // are rank 1's ring neighbours; rank 3 is not connected to it in the ring
  // and learns only because the failing ranks close all their connections
  // (each survivor keeps its transport open until all three threw, so no
  // destructor closes them for it).
  temp_dir dir;
  const int n = 4;
  std::vector<long long> ms(n, -1);
  std::vector<std::string> what(n);
  std::atomic<bool> go{false};
  std::atomic<int> threw{0};
  const auto errors = run_world(dir.url("close"), n, [&](dpkit::gloo_transport& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    if (comm.rank() == 1) {
      // Post the first receive of the ring (from rank 0), then leave: the
      // transport's destructor closes the connections mid-collective.
      std::vector<std::byte> b(64);
      auto req = comm.irecv(b, 0, 12345);
      (void)req;
      go = true;
      std::this_thread::sleep_for(50ms);
      return; // ~gloo_request (abandoned), ~gloo_transport
    }
    while (!go) std::this_thread::sleep_for(1ms);
    std::vector<float> g(1 << 15, 1.0f);
    dpkit::collective_options o;
    o.timeout = 60s;
    const auto t0 = dpkit::clock::now();
    try {
      dpkit::allreduce_ring(comm, g, dpkit::reduce_op::sum, o);
    } catch (const dpkit::peer_error& e) {
      what[r] = e.what();
    }
    ms[r] = std::chrono::duration_cast<std::chrono::milliseconds>(dpkit::clock::now() - t0).count();
    // The transport stays failed: reuse is a communicator_error.
    std::vector<float> h(8, 1.0f);
    try {
      dpkit::allreduce_ring(comm, h, dpkit::reduce_op::sum, o);
      what[r] += " | reuse did not throw";
    } catch (const dpkit::communicator_error&) {
    } catch (const dpkit::peer_error&) {
    }
    ++threw;
    const auto until = dpkit::clock::now() + 20s;
    while (threw.load() < 3 && dpkit::clock::now() < until) std::this_thread::sleep_for(1ms);
  });
  for (int r : {0, 2, 3}) {
    CAPTURE(r);
    CAPTURE(what[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)].empty());
    CHECK(!what[static_cast<std::size_t>(r)].empty());
    CHECK(what[static_cast<std::size_t>(r)].find("reuse did not throw") == std::string::npos);
    CHECK(ms[static_cast<std::size_t>(r)] >= 0);
    CHECK(ms[static_cast<std::size_t>(r)] < 5000);
  }
  MESSAGE("survivors threw after " << ms[0] << ", " << ms[2] << ", " << ms[3] << " ms; rank 0: " << what[0]);
}

TEST_CASE("gloo: a rank that closes its transport between collectives: peers waiting for it in shared memory "
          "throw peer_error at once") {
  // Ranks are threads of one process (one node): ring messages go through
  // the segment. Rank 1 takes part in one all-reduce, then destroys its
  // transport without a pending request; the others' next all-reduce waits
  // for its messages, which never come. Its destructor aborts the segment,
  // as closing its TCP pairs ends waits over TCP (60 s deadline).
  temp_dir dir;
  const int n = 3;
  std::vector<long long> ms(n, -1);
  std::vector<std::string> what(n);
  std::atomic<int> first_done{0};
  std::atomic<bool> no_shm{false};
  const auto errors = run_world(dir.url("close-between"), n, [&](dpkit::gloo_transport& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    if (!comm.shm_messages()) { // DPKIT_SHM_BYTES=0 (the gloo_tcp_pairs run): TCP's case is the test above
      no_shm = true;
      return;
    }
    std::vector<float> g(1 << 12, 1.0f);
    dpkit::collective_options o;
    o.timeout = 60s;
    dpkit::allreduce_ring(comm, g, dpkit::reduce_op::sum, o);
    ++first_done;
    if (comm.rank() == 1) {
      while (first_done.load() < n) std::this_thread::sleep_for(1ms);
      return; // ~gloo_transport, nothing pending
    }
    const auto t0 = dpkit::clock::now();
    try {
      dpkit::allreduce_ring(comm, g, dpkit::reduce_op::sum, o);
      what[r] = "no error";
    } catch (const dpkit::peer_error& e) {
      what[r] = e.what();
    }
    ms[r] = std::chrono::duration_cast<std::chrono::milliseconds>(dpkit::clock::now() - t0).count();
  });
  if (no_shm) {
    MESSAGE("no shared-memory messages (DPKIT_SHM_BYTES=0): nothing to check");
    return;
  }
  for (int r : {0, 2}) {
    CAPTURE(r);
    CAPTURE(what[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)].empty());
    CHECK(what[static_cast<std::size_t>(r)].find("closed its transport") != std::string::npos);
    CHECK(ms[static_cast<std::size_t>(r)] >= 0);
    CHECK(ms[static_cast<std::size_t>(r)] < 5000);
  }
  CHECK(what[1].empty());
}

TEST_CASE("gloo: ranks as processes: correct all-reduces, and a process that dies mid-collective") {
  temp_dir dir;
  {
    const auto codes = run_processes(dir.url("procs"), 3, -1);
    for (std::size_t r = 0; r < codes.size(); ++r) {
      CAPTURE(r);
      CHECK(codes[r] == 0);
    }
  }
  {
    const int n = 4, die = 2;
    const auto codes = run_processes(dir.url("die"), n, die);
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(codes[static_cast<std::size_t>(r)] == (r == die ? 3 : 0));
    }
  }
}

// ---- elastic membership (dpkit/elastic/group.hpp) ----

dpkit::elastic_options elastic_test_options(int first_size) {
  dpkit::elastic_options o;
  o.transport.hostname = "127.0.0.1";
  o.heartbeat_interval = 20ms;
  o.dead_after = 300ms;
  o.announce_wait = 5s;
  o.connect_timeout = 2s;
  o.timeout = 20s;
  o.first_size = first_size;
  return o;
}

// An all-reduce (ring, then tree) of every member's id pattern, checked on
// the spot: element i of id q is q + i, so the sum is the sum of the
// members' ids plus size * i. Throws std::runtime_error on a wrong value.
void checked_allreduce(dpkit::elastic_group& g) {
  const std::size_t count = 1000;
  long long ids = 0;
  for (auto q : g.members()) ids += q;
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<double> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = double(g.id()) + double(i);
    dpkit::collective_options o;
    o.timeout = 20s;
    if (pass == 0) dpkit::allreduce_ring(g.transport(), v, dpkit::reduce_op::sum, o);
    else dpkit::allreduce_tree(g.transport(), v, dpkit::reduce_op::sum, o);
    for (std::size_t i = 0; i < count; ++i)
      if (v[i] != double(ids) + double(g.size()) * double(i))
        throw std::runtime_error("id " + std::to_string(g.id()) + ": all-reduce [" + std::to_string(i) + "] = " +
                                 std::to_string(v[i]) + " in generation " + std::to_string(g.generation()));
  }
}

struct member_view {
  std::uint64_t generation = 0;
  int rank = -1;
  std::vector<std::int64_t> members;
  std::string error;        // what a collective threw (the failure)
  long long failed_ms = -1; // how long the failing collective took
  long long rebuild_ms = -1; // how long rebuild() took
  std::string fatal;        // an exception that ended the thread
};

// Runs body(id, view) on one thread per id; returns the views by id order.
template <class F>
std::vector<member_view> run_members(const std::vector<std::int64_t>& ids, F&& body) {
  std::vector<member_view> views(ids.size());
  std::vector<std::thread> ts;
  for (std::size_t i = 0; i < ids.size(); ++i)
    ts.emplace_back([&, i] {
      try {
        body(ids[i], views[i]);
      } catch (const std::exception& e) {
        views[i].fatal = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return views;
}

void record(const dpkit::elastic_group& g, member_view& v) {
  v.generation = g.generation();
  v.rank = g.rank();
  v.members = g.members();
}

// Member `die` leaves (closes its transport, stops its heartbeat) while the
// others are in an all-reduce (mid == true: they are blocked on it in their
// 4th collective) or between two all-reduces (mid == false); the survivors'
// collective throws a dpkit::error, they rebuild, and check an all-reduce in
// the new generation.
std::vector<member_view> fail_and_rebuild(const temp_dir& dir, const std::string& sub,
                                          const std::vector<std::int64_t>& ids, std::int64_t die, bool mid) {
  return run_members(ids, [&](std::int64_t id, member_view& v) {
    dpkit::elastic_group g(dir.url(sub), id, elastic_test_options(static_cast<int>(ids.size())));
    if (g.generation() != 0 || g.size() != static_cast<int>(ids.size())) throw std::runtime_error("generation 0 is wrong");
    std::vector<double> big(1 << 15, 1.0);
    dpkit::collective_options o;
    o.timeout = 20s;
    for (int k = 0; k < 3; ++k) dpkit::allreduce_ring(g.transport(), big, dpkit::reduce_op::sum, o);
    if (id == die) {
      std::this_thread::sleep_for(mid ? 100ms : 0ms);
      return; // ~elastic_group: the others see a failure
    }
    if (!mid) std::this_thread::sleep_for(200ms); // the failure happens between collectives
    const auto t0 = dpkit::clock::now();
    try {
      dpkit::allreduce_ring(g.transport(), big, dpkit::reduce_op::sum, o);
      throw std::runtime_error("the collective after the failure did not throw");
    } catch (const dpkit::error& e) {
      v.error = e.what();
      v.failed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(dpkit::clock::now() - t0).count();
    }
    const auto t1 = dpkit::clock::now();
    g.rebuild();
    v.rebuild_ms = std::chrono::duration_cast<std::chrono::milliseconds>(dpkit::clock::now() - t1).count();
    record(g, v);
    checked_allreduce(g);
  });
}

void check_rebuilt(const std::vector<member_view>& views, const std::vector<std::int64_t>& ids, std::int64_t die) {
  std::vector<std::int64_t> survivors;
  for (auto q : ids)
    if (q != die) survivors.push_back(q);
  std::sort(survivors.begin(), survivors.end());
  std::uint64_t gen = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& v = views[i];
    CAPTURE(ids[i]);
    CAPTURE(v.fatal);
    CHECK(v.fatal.empty());
    if (ids[i] == die) continue;
    CAPTURE(v.error);
    CHECK(!v.error.empty());
    CHECK(v.failed_ms >= 0);
    CHECK(v.failed_ms < 10000); // half the collective's 20 s deadline (a loaded 2-core machine once took 5 s)
    // The dead member is known dead by its heartbeat (300 ms; measured
    // rebuilds take about 320 ms), not waited for until announce_wait (5 s).
    CHECK(v.rebuild_ms >= 0);
    CHECK(v.rebuild_ms < 2500);
    CHECK(v.generation >= 1);
    if (gen == 0) gen = v.generation;
    CHECK(v.generation == gen); // one generation for all
    CHECK(v.members == survivors);
    const auto pos = std::find(survivors.begin(), survivors.end(), ids[i]) - survivors.begin();
    CHECK(v.rank == pos); // dense ranks by id
    MESSAGE("id " << ids[i] << ": collective threw after " << v.failed_ms << " ms, rebuild took " << v.rebuild_ms
                  << " ms, generation " << v.generation << ", rank " << v.rank);
  }
}

int redis_main() {
  if (!DPKIT_GLOO_REDIS) {
    std::cout << "this build has no Redis store (no hiredis headers, or Gloo without Redis): skipped\n";
    return 77;
  }
  const std::string server = find_redis_server();
  if (server.empty()) {
    std::cout << "redis-server not installed: skipped\n";
    return 77;
  }
  // A port the kernel just handed out (bound, then released); another
  // program can take it before redis-server binds it, so a server that
  // exits at once is started again on another.
  int port = 0;
  pid_t pid = -1;
  for (int attempt = 0; attempt < 5 && pid < 0; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      close(fd);
      continue;
    }
    port = ntohs(a.sin_port);
    close(fd);
    std::vector<std::string> args = {server, "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "",
                                     "--appendonly", "no", "--loglevel", "warning"};
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t quiet; // the server's start-up banner is noise in the test log
    posix_spawn_file_actions_init(&quiet);
    posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
    const int spawned = posix_spawn(&pid, server.c_str(), &quiet, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&quiet);
    if (spawned != 0) {
      std::cerr << "cannot start " << server << "\n";
      return 1;
    }
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!port_open(port) && std::chrono::steady_clock::now() < until) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) { // exited: the port was taken
        pid = -1;
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    if (pid > 0 && !port_open(port)) {
      kill(pid, SIGKILL);
      int st = 0;
      waitpid(pid, &st, 0);
      std::cerr << "redis-server did not listen on port " << port << " within 10 s\n";
      return 1;
    }
  }
  if (pid < 0) {
    std::cerr << "redis-server could not start on a free port (5 attempts)\n";
    return 1;
  }
  int rc = 0;
  {
    const std::string url = "redis://127.0.0.1:" + std::to_string(port) + "/dpkit-test-" + std::to_string(getpid());
    // Two groups through one job: the second under a new prefix (the keys
    // of a rendezvous are written once).
    for (const char* prefix : {"g0", "g1"}) {
      auto o = local_options();
      o.prefix = prefix;
      const int n = 3;
      std::vector<std::vector<float>> got(n);
      const auto errors = run_world(url, n, [&](dpkit::gloo_transport& comm) {
        config c{kind::ar_ring, 1001, dpkit::reduce_op::sum};
        c.o.timeout = 20s;
        got[static_cast<std::size_t>(comm.rank())] = run_allreduce<float>(comm, c);
        c.k = kind::ar_tree;
        const auto t = run_allreduce<float>(comm, c);
        if (t != got[static_cast<std::size_t>(comm.rank())]) throw std::runtime_error("tree differs from ring");
      }, o);
      for (int r = 0; r < n; ++r) {
        if (!errors[static_cast<std::size_t>(r)].empty()) {
          std::cerr << "redis " << prefix << ": rank " << r << ": " << errors[static_cast<std::size_t>(r)] << "\n";
          rc = 1;
          continue;
        }
        for (std::size_t e = 0; e < 1001; ++e)
          if (got[static_cast<std::size_t>(r)][e] != dpt::reference<float>(dpkit::reduce_op::sum, n, e)) {
            std::cerr << "redis " << prefix << ": rank " << r << " [" << e << "] wrong\n";
            rc = 1;
            break;
          }
      }
    }
    // The same prefix again: the keys exist, so the rendezvous fails with a
    // dpkit::error that says so (never a hang, never a wrong peer).
    auto o = local_options(3s);
    o.prefix = "g0";
    const auto errors = run_world(url, 2, [](dpkit::gloo_transport&) {}, o);
    if (errors[0].empty() && errors[1].empty()) {
      std::cerr << "redis: a rendezvous over stale keys succeeded\n";
      rc = 1;
    } else {
      std::cout << "redis: stale keys: " << (errors[0].empty() ? errors[1] : errors[0]) << "\n";
    }
    // Membership through Redis (SET NX decides each generation): three
    // processes form generation 0, one leaves, the two others rebuild.
    const std::string job2 = "redis://127.0.0.1:" + std::to_string(port) + "/dpkit-elastic-" + std::to_string(getpid());
    const auto views = run_members({1, 2, 3}, [&](std::int64_t id, member_view& v) {
      dpkit::elastic_group g(job2, id, elastic_test_options(3));
      checked_allreduce(g);
      if (id == 2) return;
      try {
        checked_allreduce(g);
        throw std::runtime_error("the collective after id 2 left did not throw");
      } catch (const dpkit::error& e) {
        v.error = e.what();
      }
      g.rebuild();
      record(g, v);
      checked_allreduce(g);
    });
    for (std::size_t i = 0; i < 3; ++i) {
      if (!views[i].fatal.empty()) {
        std::cerr << "redis elastic: id " << i + 1 << ": " << views[i].fatal << "\n";
        rc = 1;
      } else if (i != 1 && (views[i].members != std::vector<std::int64_t>{1, 3} || views[i].generation < 1)) {
        std::cerr << "redis elastic: id " << i + 1 << ": wrong generation after the rebuild\n";
        rc = 1;
      }
    }
    if (rc == 0) std::cout << "redis: ring and tree all-reduce over " << url << " correct; elastic rebuild correct\n";
  }
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  return rc;
}

// --elastic-worker URL ID N DIE_ID: one of N processes of an elastic group
// (first_size N); all run checked all-reduces in a loop; process DIE_ID ends
// itself with _exit(3) 300 ms after generation 0 formed, mid-collective (no
// destructor runs: its connections are reset by the kernel and its
// heartbeat stops). A survivor exits 0 once its collective threw a
// dpkit::error within 10 s (half the deadline), it rebuilt into a generation of the N-1 others
// with dense ranks by id and its all-reduces there are correct; 2 when the
// failure took longer, 4 when nothing failed within 20 s, 5 on any other
// error.
int elastic_worker(const std::string& url, std::int64_t id, int n, std::int64_t die) {
  try {
    dpkit::elastic_group g(url, id, elastic_test_options(n));
    if (g.size() != n) throw std::runtime_error("generation 0 has " + std::to_string(g.size()) + " members");
    if (id == die)
      std::thread([] {
        std::this_thread::sleep_for(300ms);
        std::_Exit(3);
      }).detach();
    const auto start = dpkit::clock::now();
    for (;;) {
      if (dpkit::clock::now() - start > 20s) return 4;
      const auto t0 = dpkit::clock::now();
      try {
        checked_allreduce(g);
      } catch (const dpkit::error& e) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(dpkit::clock::now() - t0).count();
        std::cerr << "elastic worker id " << id << ": collective threw after " << ms << " ms: " << e.what() << "\n";
        if (ms >= 10000) return 2; // half the 20 s deadline: 4 processes on a loaded 2-core machine once took 5 s
        break;
      }
    }
    g.rebuild();
    std::vector<std::int64_t> want;
    for (std::int64_t q = 0; q < n; ++q)
      if (q != die) want.push_back(q);
    if (g.members() != want) throw std::runtime_error("the rebuilt generation has other members");
    if (g.rank() != static_cast<int>(std::find(want.begin(), want.end(), id) - want.begin()))
      throw std::runtime_error("rank is not the id's position");
    for (int k = 0; k < 3; ++k) checked_allreduce(g);
    std::cerr << "elastic worker id " << id << ": generation " << g.generation() << ", rank " << g.rank() << " of "
              << g.size() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "elastic worker id " << id << ": " << e.what() << "\n";
    return 5;
  }
}

} // namespace

TEST_CASE("elastic: generation 0 ranks processes densely by id; the lowest id is rank 0") {
  temp_dir dir;
  const std::vector<std::int64_t> ids = {10, 3, 7, 5};
  const auto views = run_members(ids, [&](std::int64_t id, member_view& v) {
    dpkit::elastic_group g(dir.url("form"), id, elastic_test_options(4));
    record(g, v);
    checked_allreduce(g);
  });
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CAPTURE(views[i].fatal);
    CHECK(views[i].fatal.empty());
    CHECK(views[i].generation == 0);
    CHECK(views[i].members == std::vector<std::int64_t>{3, 5, 7, 10});
  }
  CHECK(views[0].rank == 3);
  CHECK(views[1].rank == 0);
  CHECK(views[2].rank == 2);
  CHECK(views[3].rank == 1);
  CHECK_THROWS_AS(dpkit::elastic_group("file:///tmp/x", -1), dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::elastic_group("nfs://x", 1), dpkit::invalid_argument);
  // A protocol key that holds garbage: format_error naming it, no hang.
  std::string prefix;
  auto store = dpkit::detail::open_kv_store(dir.url("damaged"), "test", 2s, prefix);
  store->put(prefix + "/elastic/latest", {'x', '1'});
  try {
    dpkit::elastic_group g(dir.url("damaged"), 1, elastic_test_options(1));
    FAIL("a damaged 'latest' key was accepted");
  } catch (const dpkit::format_error& e) {
    CHECK(std::string(e.what()).find("latest") != std::string::npos);
  }
}

TEST_CASE("elastic: a member fails during a collective: every survivor throws, then all rebuild under the next generation") {
  temp_dir dir;
  const std::vector<std::int64_t> ids = {3, 5, 7, 10};
  SUBCASE("a middle member") { check_rebuilt(fail_and_rebuild(dir, "mid7", ids, 7, true), ids, 7); }
  SUBCASE("the master (the lowest id)") { check_rebuilt(fail_and_rebuild(dir, "mid3", ids, 3, true), ids, 3); }
}

TEST_CASE("elastic: a member fails between collectives: the next collective throws, then all rebuild") {
  temp_dir dir;
  const std::vector<std::int64_t> ids = {3, 5, 7, 10};
  check_rebuilt(fail_and_rebuild(dir, "between", ids, 10, false), ids, 10);
}

TEST_CASE("elastic: only a strict majority of the last generation forms the next one (no split brain)") {
  // Members leave (as the far side of a partition would vanish from this
  // side's view); the rest rebuild. 5 -> 3 left: a majority, they go on.
  // 3 -> 1 left: the survivor must not train alone; its rebuild throws
  // timeout_error naming the majority. With majority = false it would have
  // formed a generation of one (shown last), which is what the rule prevents.
  temp_dir dir;
  const auto leave_and_rebuild = [&](const std::string& sub, const std::vector<std::int64_t>& ids,
                                     const std::vector<std::int64_t>& leaving, bool majority) {
    return run_members(ids, [&](std::int64_t id, member_view& v) {
      auto o = elastic_test_options(static_cast<int>(ids.size()));
      o.majority = majority;
      o.timeout = 3s;
      dpkit::elastic_group g(dir.url(sub), id, o);
      checked_allreduce(g);
      if (std::find(leaving.begin(), leaving.end(), id) != leaving.end()) return;
      try {
        checked_allreduce(g);
        std::this_thread::sleep_for(100ms);
        checked_allreduce(g); // a peer left: throws
        throw std::runtime_error("no collective failed");
      } catch (const dpkit::error& e) {
        v.error = e.what();
      }
      const auto t0 = dpkit::clock::now();
      try {
        g.rebuild();
        record(g, v);
        checked_allreduce(g);
      } catch (const dpkit::timeout_error& e) {
        v.fatal = e.what();
      }
      v.rebuild_ms = std::chrono::duration_cast<std::chrono::milliseconds>(dpkit::clock::now() - t0).count();
    });
  };
  SUBCASE("3 of 5 go on") {
    const auto views = leave_and_rebuild("maj5", {1, 2, 3, 4, 5}, {2, 4}, true);
    for (std::size_t i : {0u, 2u, 4u}) {
      CAPTURE(views[i].fatal);
      CHECK(views[i].fatal.empty());
      CHECK(views[i].members == std::vector<std::int64_t>{1, 3, 5});
    }
  }
  SUBCASE("1 of 3 waits, then throws") {
    const auto views = leave_and_rebuild("min3", {1, 2, 3}, {1, 3}, true);
    CAPTURE(views[1].fatal);
    CHECK(views[1].members.empty()); // never formed a generation without a majority
    CHECK(views[1].fatal.find("a majority (2) is needed") != std::string::npos);
    CHECK(views[1].rebuild_ms >= 2900);
  }
  SUBCASE("without the rule, 1 of 3 would train alone") {
    const auto views = leave_and_rebuild("nomaj3", {1, 2, 3}, {1, 3}, false);
    CAPTURE(views[1].fatal);
    CHECK(views[1].members == std::vector<std::int64_t>{2});
  }
}

TEST_CASE("elastic: ranks as processes: one is killed mid-collective, the others rebuild") {
  temp_dir dir;
  const int n = 4;
  const std::int64_t die = 1;
  std::vector<std::vector<std::string>> lists;
  for (int id = 0; id < n; ++id)
    lists.push_back({"--elastic-worker", dir.url("procs"), std::to_string(id), std::to_string(n), std::to_string(die)});
  const auto codes = spawn_all(lists);
  for (int id = 0; id < n; ++id) {
    CAPTURE(id);
    CHECK(codes[static_cast<std::size_t>(id)] == (id == die ? 3 : 0));
  }
}

TEST_CASE("elastic: a process joins a running group at a step boundary") {
  temp_dir dir;
  const std::vector<std::int64_t> ids = {3, 5, 10, 8};
  std::atomic<int> steps{0};
  const auto views = run_members(ids, [&](std::int64_t id, member_view& v) {
    if (id == 8) {
      while (steps.load() < 3) std::this_thread::sleep_for(1ms); // the group is running
      dpkit::elastic_group g(dir.url("join"), id, elastic_test_options(3));
      record(g, v);
      checked_allreduce(g);
      return;
    }
    dpkit::elastic_group g(dir.url("join"), id, elastic_test_options(3));
    if (g.size() != 3) throw std::runtime_error("generation 0 is not the three first processes");
    for (int step = 0; step < 2000; ++step) {
      checked_allreduce(g);
      if (id == 3) ++steps;
      if (g.admit_joiners()) break;
    }
    record(g, v);
    checked_allreduce(g);
  });
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CAPTURE(ids[i]);
    CAPTURE(views[i].fatal);
    CHECK(views[i].fatal.empty());
    CHECK(views[i].generation == 1);
    CHECK(views[i].members == std::vector<std::int64_t>{3, 5, 8, 10});
  }
  CHECK(views[3].rank == 2); // id 8 between 5 and 10
}

TEST_CASE("elastic: a process that dies while it joins does not stop the group") {
  // Process 99 asks to join and takes part in forming the next generation,
  // then dies (its heartbeat stops) before it connects. If it was chosen,
  // that generation's rendezvous times out (connect_timeout) and the next one
  // forms without it; either way the group goes on with its three members.
  temp_dir dir;
  const std::vector<std::int64_t> ids = {3, 5, 10};
  std::atomic<bool> formed{false};
  std::thread ghost([&] {
    while (!formed.load()) std::this_thread::sleep_for(1ms);
    std::string prefix;
    auto store = dpkit::detail::open_kv_store(dir.url("ghost"), "test", 2s, prefix);
    const std::string p = prefix + "/elastic/";
    std::size_t k = 0;
    while (!store->create(p + "join/" + std::to_string(k), {'9', '9'})) ++k;
    store->put(p + "hb/99", {'0'});
    store->create(p + "g/1/alive/99", {});
  });
  const auto t0 = dpkit::clock::now();
  const auto views = run_members(ids, [&](std::int64_t id, member_view& v) {
    dpkit::elastic_group g(dir.url("ghost"), id, elastic_test_options(3));
    formed = true;
    for (int step = 0; step < 2000; ++step) {
      checked_allreduce(g);
      if (g.admit_joiners()) break;
    }
    record(g, v);
    checked_allreduce(g);
  });
  ghost.join();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CAPTURE(ids[i]);
    CAPTURE(views[i].fatal);
    CHECK(views[i].fatal.empty());
    CHECK(views[i].generation >= 1);
    CHECK(views[i].generation == views[0].generation);
    CHECK(views[i].members == std::vector<std::int64_t>{3, 5, 10});
  }
  CHECK(dpkit::clock::now() - t0 < 15s);
  MESSAGE("the group went on in generation " << views[0].generation);
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--worker") {
    if (argc != 6) return 64;
    return worker(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  }
  if (argc >= 2 && std::string(argv[1]) == "--redis") return redis_main();
  if (argc >= 2 && std::string(argv[1]) == "--elastic-worker") {
    if (argc != 6) return 64;
    return elastic_worker(argv[2], std::atoll(argv[3]), std::atoi(argv[4]), std::atoll(argv[5]));
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
