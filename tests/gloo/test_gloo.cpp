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
// exits 0 when its failing call threw a dpkit error within 5 s (the
// collective's deadline is 60 s), 2 when it took longer, 4 when nothing
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
    o.timeout = 60s;
    o.segment_bytes = 4096;
    const auto start = dpkit::clock::now();
    while (dpkit::clock::now() - start < 20s) {
      const auto t0 = dpkit::clock::now();
      try {
        dpkit::allreduce_ring(comm, g, dpkit::reduce_op::avg, o);
      } catch (const dpkit::error& e) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(dpkit::clock::now() - t0).count();
        std::cerr << "worker rank " << rank << ": threw after " << ms << " ms: " << e.what() << "\n";
        return ms < 5000 ? 0 : 2;
      }
    }
    return 4;
  } catch (const std::exception& e) {
    std::cerr << "worker rank " << rank << ": " << e.what() << "\n";
    return 5;
  }
}

// Starts this executable in worker mode for ranks 0..n-1; returns each exit
// code (-1: killed after the 90 s limit, or not started).
std::vector<int> run_processes(const std::string& url, int n, int die_rank) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> args = {"/proc/self/exe", "--worker", url, std::to_string(r), std::to_string(n),
                                     std::to_string(die_rank)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) pid = -1;
    pids.push_back(pid);
  }
  std::vector<int> codes(static_cast<std::size_t>(n), -1);
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

int redis_main() {
  const std::string server = find_redis_server();
  if (server.empty()) {
    std::cout << "redis-server not installed: skipped\n";
    return 77;
  }
  const int port = 20000 + static_cast<int>(getpid() % 20000);
  if (port_open(port)) {
    std::cout << "port " << port << " is in use: skipped\n";
    return 77;
  }
  std::vector<std::string> args = {server, "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--loglevel", "warning"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  posix_spawn_file_actions_t quiet; // the server's start-up banner is noise in the test log
  posix_spawn_file_actions_init(&quiet);
  posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
  const int spawned = posix_spawn(&pid, server.c_str(), &quiet, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&quiet);
  if (spawned != 0) {
    std::cerr << "cannot start " << server << "\n";
    return 1;
  }
  int rc = 0;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!port_open(port) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  if (!port_open(port)) {
    std::cerr << "redis-server did not listen on port " << port << "\n";
    rc = 1;
  } else {
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
    if (rc == 0) std::cout << "redis: ring and tree all-reduce over " << url << " correct\n";
  }
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  return rc;
}

} // namespace

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

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--worker") {
    if (argc != 6) return 64;
    return worker(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  }
  if (argc >= 2 && std::string(argv[1]) == "--redis") return redis_main();
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
