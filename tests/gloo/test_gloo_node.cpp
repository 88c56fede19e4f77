// The store bootstrap of gloo_transport (transport/detail/store_bootstrap.hpp):
// ranks that meet through a store without MPI find their node, map the
// node's shared segment (nothing left in /dev/shm once every rank has it)
// and, across nodes, build the hierarchy; dpkit's shm and hierarchical
// collectives then run on it, checked against a sequential reduction. The
// unhappy path: ranks that disagree on the world size, a rank that never
// maps the segment, a stale segment of a killed job, two jobs on one host,
// a rank whose process dies during a shared-memory collective, two ranks
// calling different collectives. Ranks are threads of this process (one
// node) or copies of this executable (`--worker ...`).
#define DOCTEST_CONFIG_IMPLEMENT
#include <dpkit/collectives.hpp>
#include <dpkit/transport/gloo.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using namespace std::chrono_literals;

struct temp_dir {
  std::string path;
  temp_dir() {
    std::string t = (std::filesystem::temp_directory_path() / "dpkit-gloo-node-XXXXXX").string();
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

template <class F>
std::vector<std::string> run_world(const std::string& url, int n, F&& f, const dpkit::gloo_options& o = local_options(),
                                   std::vector<int> sizes = {}) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        dpkit::gloo_transport comm(url, r, sizes.empty() ? n : sizes[static_cast<std::size_t>(r)], o);
        f(comm);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
        if (errors[static_cast<std::size_t>(r)].empty()) errors[static_cast<std::size_t>(r)] = "(empty what())";
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// The entries of /dev/shm whose name starts with `head`.
std::vector<std::string> shm_entries(const std::string& head) {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (const dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(head, 0) == 0) out.emplace_back(e->d_name);
    closedir(d);
  }
  return out;
}

// x[i] on rank r: exact in float for the sizes used
float value(int rank, std::size_t i, int salt) { return static_cast<float>((rank + 1) * static_cast<int>(i % 251) + salt); }

// Checks a sum all-reduce of every size against the sequential sum; returns
// a description of the first wrong element, or "".
template <class C>
std::string check_sums(C& comm, dpkit::algorithm a, int salt) {
  const int n = comm.size();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{300000}}) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = value(comm.rank(), i, salt);
    dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{a});
    for (std::size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += value(r, i, salt);
      if (v[i] != want)
        return "rank " + std::to_string(comm.rank()) + ": count " + std::to_string(count) + " element " +
               std::to_string(i) + " is " + std::to_string(v[i]) + ", expected " + std::to_string(want);
    }
  }
  return "";
}

// ---- worker mode ----
// --worker URL RANK SIZE MODE: MODE "sums" checks all-reduces (shm and
// automatic on one node, hierarchical across virtual nodes) and that rank
// 0's segment name is gone from /dev/shm; "die-K" runs shm all-reduces, rank
// K _exits in the middle of the third, the others must throw peer_error
// within 5 s (exit 0), not at the 60 s deadline.
int worker(const std::string& url, int rank, int size, const std::string& mode) {
  try {
    dpkit::gloo_transport comm(url, rank, size, local_options(60s));
    if (mode == "sums") {
      if (comm.topology().hierarchical()) {
        if (!comm.node_transport() || (comm.node_transport()->size() > 1 && !comm.node_transport()->shm())) {
          std::cerr << "worker rank " << rank << ": hierarchical, but the node transport has no segment\n";
          return 1;
        }
        // within a node messages go through its segment, across nodes over TCP
        // (dpkit's own TCP connections, not Gloo's pairs)
        if (comm.shm_messages() || (comm.node_transport()->size() > 1) != comm.node_transport()->shm_messages() ||
            !comm.tcp_messages() || (comm.cross_transport() && !comm.cross_transport()->tcp_messages())) {
          std::cerr << "worker rank " << rank << ": messages take the wrong way (top level shm "
                    << comm.shm_messages() << " tcp " << comm.tcp_messages() << ", node shm "
                    << comm.node_transport()->shm_messages() << ")\n";
          return 1;
        }
        for (auto a : {dpkit::algorithm::hierarchical, dpkit::algorithm::automatic})
          if (auto e = check_sums(comm, a, 3); !e.empty()) {
            std::cerr << "worker " << e << "\n";
            return 1;
          }
        return 0;
      }
      if (!comm.shm() || !comm.shm_messages()) {
        std::cerr << "worker rank " << rank << ": one node, but no shared segment or messages over TCP\n";
        return 1;
      }
      const int pid0 = comm.shm()->control(0).pid.load();
      if (!shm_entries("dpkit-gloo-" + std::to_string(pid0) + "-").empty()) {
        std::cerr << "worker rank " << rank << ": the segment's name is still in /dev/shm\n";
        return 1;
      }
      for (auto a : {dpkit::algorithm::shm_two_shot, dpkit::algorithm::shm_one_shot, dpkit::algorithm::automatic,
                     dpkit::algorithm::ring, dpkit::algorithm::tree})
        if (auto e = check_sums(comm, a, 5); !e.empty()) {
          std::cerr << "worker " << e << "\n";
          return 1;
        }
      return 0;
    }
    if (mode == "tcp" || mode == "gloo-pairs") { // DPKIT_SHM_BYTES=0: no segment, messages over TCP
      if (comm.shm() || comm.shm_messages()) {
        std::cerr << "worker rank " << rank << ": DPKIT_SHM_BYTES=0, but a segment or shared-memory messages\n";
        return 1;
      }
      // dpkit's own connections, or Gloo's pairs with DPKIT_TCP_P2P=0
      if (comm.tcp_messages() != (mode == "tcp")) {
        std::cerr << "worker rank " << rank << ": mode " << mode << ", but tcp_messages() is " << comm.tcp_messages() << "\n";
        return 1;
      }
      for (auto a : {dpkit::algorithm::ring, dpkit::algorithm::tree, dpkit::algorithm::automatic})
        if (auto e = check_sums(comm, a, 7); !e.empty()) {
          std::cerr << "worker " << e << "\n";
          return 1;
        }
      return 0;
    }
    if (mode.rfind("die-", 0) == 0 || mode.rfind("ringdie-", 0) == 0) {
      const bool ring = mode[0] == 'r';
      const int die = std::atoi(mode.c_str() + (ring ? 8 : 4));
      std::vector<float> v(1 << 16, 1.0f);
      const auto start = std::chrono::steady_clock::now();
      try {
        for (int i = 0; i < 50; ++i) {
          if (rank == die && i == 2) _exit(3);
          dpkit::collective_options o;
          o.timeout = 30s;
          dpkit::allreduce(comm, v, dpkit::reduce_op::sum,
                           dpkit::allreduce_policy{ring ? dpkit::algorithm::ring : dpkit::algorithm::shm_two_shot}, o);
        }
      } catch (const dpkit::peer_error& e) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
        std::cerr << "worker rank " << rank << ": peer_error after " << ms << " ms: " << e.what() << "\n";
        return ms < 5000 ? 0 : 1;
      }
      std::cerr << "worker rank " << rank << ": no error\n";
      return 1;
    }
    if (mode == "third-closes") {
      // 3 ranks: rank 2 closes its transport cleanly (it finished) while
      // rank 0 still waits for a message of rank 1, which rank 1 sends only
      // after it saw rank 2 leave: the wait completes, the bytes are right.
      // The close sets the node's abort words; only waits on rank 2 may
      // fail for it (test_gloo_node "sums" failed so once in about 15 runs
      // on a loaded machine: rank 0's send to rank 1 of the last tree).
      std::vector<float> v(1000, 1.0f);
      dpkit::allreduce(comm, v); // every rank mapped and connected
      if (rank == 2) return 0;   // comm closes here (a clean close), the process ends
      auto until = std::chrono::steady_clock::now() + 20s;
      while (!comm.shm()->left(2) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(1ms);
      if (!comm.shm()->left(2) || !comm.shm()->aborted()) {
        std::cerr << "worker rank " << rank << ": rank 2 never closed\n";
        return 1;
      }
      std::vector<std::byte> msg(256, std::byte{rank == 1 ? std::uint8_t{42} : std::uint8_t{0}});
      if (rank == 1) {
        std::this_thread::sleep_for(300ms); // rank 0's wait runs its checks meanwhile
        comm.isend(msg, 0, 77).wait(dpkit::clock::now() + 20s);
        return 0;
      }
      comm.irecv(msg, 1, 77).wait(dpkit::clock::now() + 20s);
      for (std::byte x : msg)
        if (x != std::byte{42}) {
          std::cerr << "worker rank 0: received " << static_cast<int>(x) << ", expected 42\n";
          return 1;
        }
      return 0;
    }
    if (mode.rfind("stuck-", 0) == 0) {
      // rank K stops taking part (its process lives, as a stuck elastic
      // member's does) and the peer check says so: across virtual nodes
      // (DPKIT_RANKS_PER_NODE=2) the hierarchy's parts must run the check
      // too, so every other rank throws peer_error at once, not when K exits
      const int stuck = std::atoi(mode.c_str() + 6);
      comm.set_peer_check([stuck](int r) { return r != stuck; }, 100ms, 50ms);
      std::vector<float> v(1 << 16, 1.0f);
      dpkit::collective_options o;
      o.timeout = 30s;
      dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::hierarchical}, o);
      if (rank == stuck) {
        std::this_thread::sleep_for(8s);
        _exit(3);
      }
      const auto start = std::chrono::steady_clock::now();
      try {
        dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::hierarchical}, o);
      } catch (const dpkit::error& e) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
        std::cerr << "worker rank " << rank << ": error after " << ms << " ms: " << e.what() << "\n";
        return ms < 4000 ? 0 : 1;
      }
      std::cerr << "worker rank " << rank << ": no error\n";
      return 1;
    }
    std::cerr << "worker: unknown mode " << mode << "\n";
    return 2;
  } catch (const dpkit::invalid_argument& e) {
    std::cerr << "worker rank " << rank << ": invalid_argument: " << e.what() << "\n";
    return std::string(e.what()).find("DPKIT_TCP_P2P: expected 0") != std::string::npos ? 4 : 1;
  } catch (const std::exception& e) {
    std::cerr << "worker rank " << rank << ": " << e.what() << "\n";
    return 1;
  }
}

// Starts this executable in worker mode for ranks 0..n-1 (env additions in
// `env`) and returns every exit status.
std::vector<int> run_workers(const std::string& url, int n, const std::string& mode,
                             const std::vector<std::string>& env = {}, bool reap_in_order = false) {
  std::vector<std::string> envs(env);
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> args{"test_gloo_node", "--worker", url, std::to_string(r), std::to_string(n), mode};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) pid = -1;
    pids.push_back(pid);
  }
  std::vector<int> status(pids.size(), -1);
  if (reap_in_order) { // a slow launcher: a rank that died early stays a zombie until its turn
    for (std::size_t r = 0; r < pids.size(); ++r) {
      int st = 0;
      if (pids[r] > 0 && waitpid(pids[r], &st, 0) == pids[r])
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    return status;
  }
  // reaped as they end, in any order, as mpirun does
  for (std::size_t left = pids.size(); left > 0; --left) {
    int st = 0;
    const pid_t p = waitpid(-1, &st, 0);
    if (p <= 0) break;
    for (std::size_t r = 0; r < pids.size(); ++r)
      if (pids[r] == p) status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  return status;
}

} // namespace

TEST_CASE("gloo node: ranks as processes on one node map one segment, gone from /dev/shm; shm all-reduces are exact") {
  temp_dir dir;
  for (int n : {2, 3}) {
    CAPTURE(n);
    const auto st = run_workers(dir.url("sums" + std::to_string(n)), n, "sums");
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(st[static_cast<std::size_t>(r)] == 0, "rank " << r);
  }
  CHECK(shm_entries("dpkit-gloo-").empty());
}

TEST_CASE("gloo node: across virtual nodes (DPKIT_RANKS_PER_NODE) the hierarchy runs, each node on its segment") {
  temp_dir dir;
  // 2x2 and an uneven 3 ranks as nodes of 2 and 1
  for (int n : {4, 3}) {
    CAPTURE(n);
    const auto st = run_workers(dir.url("hier" + std::to_string(n)), n, "sums", {"DPKIT_RANKS_PER_NODE=2"});
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(st[static_cast<std::size_t>(r)] == 0, "rank " << r);
  }
}

TEST_CASE("gloo node: across virtual nodes, a rank the peer check fails ends every wait, not only the top level's") {
  temp_dir dir;
  const auto st = run_workers(dir.url("stuck"), 4, "stuck-3", {"DPKIT_RANKS_PER_NODE=2"});
  CHECK(st[0] == 0);
  CHECK(st[1] == 0);
  CHECK(st[2] == 0);
  CHECK(st[3] == 3);
}

TEST_CASE("gloo node: a rank whose process dies in a shm all-reduce: the others throw peer_error at once") {
  temp_dir dir;
  const auto st = run_workers(dir.url("die"), 3, "die-1");
  CHECK(st[0] == 0);
  CHECK(st[1] == 3);
  CHECK(st[2] == 0);
  CHECK(shm_entries("dpkit-gloo-").empty());
}

TEST_CASE("gloo node: a rank whose process dies in a ring all-reduce (messages in shared memory): peer_error at once") {
  temp_dir dir;
  for (bool reap_in_order : {false, true}) { // reaped at once, or left a zombie
    CAPTURE(reap_in_order);
    const auto st = run_workers(dir.url(reap_in_order ? "ringdie-z" : "ringdie"), 3, "ringdie-1", {}, reap_in_order);
    CHECK(st[0] == 0);
    CHECK(st[1] == 3);
    CHECK(st[2] == 0);
  }
  CHECK(shm_entries("dpkit-gloo-").empty());
}

TEST_CASE("gloo node: a rank that closes cleanly does not fail two others still exchanging a message") {
  temp_dir dir;
  const auto st = run_workers(dir.url("third"), 3, "third-closes");
  for (int r = 0; r < 3; ++r) CHECK_MESSAGE(st[static_cast<std::size_t>(r)] == 0, "rank " << r);
  CHECK(shm_entries("dpkit-gloo-").empty());
}

TEST_CASE("gloo node: with DPKIT_SHM_BYTES=0 there is no segment and messages go over TCP, exactly") {
  temp_dir dir;
  const auto st = run_workers(dir.url("tcp"), 3, "tcp", {"DPKIT_SHM_BYTES=0"});
  for (int r = 0; r < 3; ++r) CHECK_MESSAGE(st[static_cast<std::size_t>(r)] == 0, "rank " << r);
  // and over Gloo's pairs
  const auto sg = run_workers(dir.url("gloo-pairs"), 3, "gloo-pairs", {"DPKIT_SHM_BYTES=0", "DPKIT_TCP_P2P=0"});
  for (int r = 0; r < 3; ++r) CHECK_MESSAGE(sg[static_cast<std::size_t>(r)] == 0, "rank " << r);
}

TEST_CASE("gloo node: a malformed DPKIT_TCP_P2P is an invalid_argument naming it, before any rendezvous") {
  temp_dir dir;
  const auto st = run_workers(dir.url("badp2p"), 2, "tcp", {"DPKIT_SHM_BYTES=0", "DPKIT_TCP_P2P=yes"});
  for (int r = 0; r < 2; ++r) CHECK_MESSAGE(st[static_cast<std::size_t>(r)] == 4, "rank " << r);
}

TEST_CASE("gloo node: a dead rank its launcher has not reaped yet (a zombie) is dead too") {
  temp_dir dir;
  // rank 1 dies; ranks 0 and 2 are waited for first, so rank 1 stays a
  // zombie while they wait for it in the all-reduce
  const auto st = run_workers(dir.url("zombie"), 3, "die-1", {}, true);
  CHECK(st[0] == 0);
  CHECK(st[1] == 3);
  CHECK(st[2] == 0);
}

TEST_CASE("gloo node: threads of one process: the segment, the topology and a split") {
  temp_dir dir;
  std::vector<std::string> wrong(3);
  const auto errors = run_world(dir.url("threads"), 3, [&](dpkit::gloo_transport& comm) {
    static_assert(dpkit::shared_memory_transport<dpkit::gloo_transport>);
    static_assert(dpkit::hierarchical_transport<dpkit::gloo_transport>);
    const auto r = static_cast<std::size_t>(comm.rank());
    if (!comm.shm() || comm.topology().nodes() != 1 || comm.topology().hierarchical()) wrong[r] = "no segment";
    else wrong[r] = check_sums(comm, dpkit::algorithm::shm_one_shot, 1);
    // a split's groups meet through the same store and get segments of their own
    auto sub = comm.split(comm.rank() % 2, comm.rank());
    if (wrong[r].empty() && sub.size() > 1 && !sub.shm()) wrong[r] = "split group without a segment";
    if (wrong[r].empty()) wrong[r] = check_sums(sub, dpkit::algorithm::automatic, 2);
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK_MESSAGE(errors[r].empty(), "rank " << r << ": " << errors[r]);
    CHECK_MESSAGE(wrong[r].empty(), wrong[r]);
  }
}

TEST_CASE("gloo node: a tcp:// store served by rank 0 of the URL constructor") {
  // a free port: bound, then released
  int port = 0;
  {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    close(fd);
  }
  std::vector<std::string> wrong(3);
  const auto errors = run_world("tcp://127.0.0.1:" + std::to_string(port), 3, [&](dpkit::gloo_transport& comm) {
    wrong[static_cast<std::size_t>(comm.rank())] = comm.shm() ? check_sums(comm, dpkit::algorithm::automatic, 7) : "no segment";
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK_MESSAGE(errors[r].empty(), "rank " << r << ": " << errors[r]);
    CHECK_MESSAGE(wrong[r].empty(), wrong[r]);
  }
}

TEST_CASE("gloo node: ranks that disagree on the world size fail at once, naming both sizes") {
  temp_dir dir;
  const auto start = std::chrono::steady_clock::now();
  // rank 0 thinks 2 ranks, rank 1 thinks 3: both see the other's declaration
  const auto errors = run_world(dir.url("sizes"), 2, [](dpkit::gloo_transport&) {}, local_options(20s), {2, 3});
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(errors[r]);
    CHECK(errors[r].find("disagree on the world size") != std::string::npos);
    CHECK(errors[r].find("has 2") != std::string::npos);
    CHECK(errors[r].find("has 3") != std::string::npos);
  }
}

TEST_CASE("gloo node: two ranks calling different collectives on the segment: mismatch_error on both") {
  temp_dir dir;
  const auto errors = run_world(dir.url("mismatch"), 2, [](dpkit::gloo_transport& comm) {
    std::vector<float> v(comm.rank() == 0 ? 100 : 200, 1.0f);
    dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::shm_one_shot});
  }, local_options(20s));
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(errors[r]);
    CHECK(errors[r].find("mismatch") != std::string::npos);
  }
}

TEST_CASE("gloo node: two jobs on one host at once do not cross-talk") {
  temp_dir dir;
  std::string bad[2][2];
  std::thread jobs[2];
  for (int j = 0; j < 2; ++j)
    jobs[j] = std::thread([&, j] {
      const auto errors = run_world(dir.url("job" + std::to_string(j)), 2, [&](dpkit::gloo_transport& comm) {
        bad[j][comm.rank()] = check_sums(comm, dpkit::algorithm::automatic, 100 * j);
      });
      for (int r = 0; r < 2; ++r)
        if (!errors[static_cast<std::size_t>(r)].empty()) bad[j][r] = errors[static_cast<std::size_t>(r)];
    });
  for (auto& t : jobs) t.join();
  for (auto& job : bad)
    for (auto& e : job) CHECK_MESSAGE(e.empty(), e);
}

TEST_CASE("gloo node: a local rank that never maps the segment: timeout_error naming it, and nothing left in /dev/shm") {
  temp_dir dir;
  std::string prefix;
  auto store = dpkit::detail::open_kv_store(dir.url("absent"), "test", 5s, prefix);
  const auto start = std::chrono::steady_clock::now();
  std::string what;
  try {
    (void)dpkit::detail::store_map_segment(*store, prefix + "/shm", 0, 2, 4096, dpkit::deadline_after(1500ms), "test");
  } catch (const dpkit::timeout_error& e) {
    what = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  CAPTURE(what);
  CHECK(what.find("local rank 1") != std::string::npos);
  CHECK(took >= 1400ms);
  CHECK(took < 5s);
  CHECK(shm_entries("dpkit-gloo-" + std::to_string(getpid()) + "-").empty());
  // rank 1 arriving late finds the outcome, not a segment
  std::string late;
  try {
    (void)dpkit::detail::store_map_segment(*store, prefix + "/shm", 1, 2, 4096, dpkit::deadline_after(1s), "test");
  } catch (const dpkit::error& e) {
    late = e.what();
  }
  CAPTURE(late);
  CHECK(!late.empty());
}

TEST_CASE("gloo node: the ring size of the point-to-point area is local rank 0's choice, published with the "
          "segment's name; a damaged one is an error naming it") {
  // Local rank 0 sizes the rings (small for ranks with cores of their own,
  // large for ranks that share them: each rank's own guess depends on its
  // environment), so a joiner takes the size rank 0 published. Here "rank 0"
  // is this test: it creates a segment with rings of the other size than
  // this process would choose and publishes it.
  temp_dir dir;
  std::string prefix;
  auto store = dpkit::detail::open_kv_store(dir.url("ring"), "test", 5s, prefix);
  const std::size_t slot = 4096;
  const std::size_t own = dpkit::detail::shm_p2p_ring_bytes(2, dpkit::detail::shm_oversubscribed(2));
  const std::size_t other = own == (8u << 10) ? 256u << 10 : 8u << 10;
  const std::size_t stride = (dpkit::detail::shm_region_bytes(slot) + 4095) / 4096 * 4096;
  const std::string name = dpkit::detail::shm_mapping::unique_name("gloo");
  auto map = dpkit::detail::shm_mapping::create(name, 2 * stride + dpkit::detail::shm_p2p_area_bytes(2, other));
  dpkit::detail::shm_p2p::init_area(map.data() + 2 * stride, 2, other);
  dpkit::detail::store_set(*store, prefix + "/a/name", name + " " + std::to_string(other), "test");
  dpkit::detail::store_set(*store, prefix + "/a/done", "ok", "test");
  std::string what;
  std::size_t got = 0;
  try {
    auto seg = dpkit::detail::store_map_segment(*store, prefix + "/a", 1, 2, slot, dpkit::deadline_after(5s), "test", true);
    got = seg.p2p_ring_bytes;
    CHECK(seg.p2p_area == seg.map.data() + 2 * stride);
  } catch (const std::exception& e) {
    what = e.what();
  }
  dpkit::detail::shm_mapping::unlink(name);
  CAPTURE(what);
  CHECK(what.empty());
  CHECK(got == other);
  // a ring size that is not one: an error naming what was published
  const std::vector<std::string> bads = {" 12345", " 2048", "", " 8192x"};
  for (std::size_t i = 0; i < bads.size(); ++i) {
    const std::string& bad = bads[i];
    CAPTURE(bad);
    const std::string key = prefix + "/b" + std::to_string(i);
    dpkit::detail::store_set(*store, key + "/name", "/dpkit-gloo-1-0000000000000000" + bad, "test");
    std::string err;
    try {
      (void)dpkit::detail::store_map_segment(*store, key, 1, 2, slot, dpkit::deadline_after(5s), "test", true);
    } catch (const dpkit::error& e) {
      err = e.what();
    }
    CAPTURE(err);
    CHECK(err.find("'/dpkit-gloo-1-0000000000000000" + bad + "'") != std::string::npos);
    CHECK(err.find("ring size") != std::string::npos);
  }
}

TEST_CASE("gloo node: a stale segment of a killed job is removed; live and foreign entries are not") {
  // a pid that no longer exists: a child that exited and was reaped
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  REQUIRE(dead > 0);
  waitpid(dead, nullptr, 0);
  auto make = [](const std::string& name) {
    const int fd = open(("/dev/shm/" + name).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    REQUIRE(fd >= 0);
    close(fd);
  };
  const std::string stale = "dpkit-gloo-" + std::to_string(dead) + "-00000000deadbeef";
  const std::string live = "dpkit-gloo-" + std::to_string(getpid()) + "-00000000cafef00d";
  const std::string other = "dpkit-gloo-" + std::to_string(dead) + "-not-ours";
  make(stale);
  make(live);
  make(other);
  temp_dir dir;
  const auto errors = run_world(dir.url("stale"), 2, [](dpkit::gloo_transport& comm) {
    if (!comm.shm()) throw std::runtime_error("no segment");
  });
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
  CHECK(shm_entries(stale).empty());
  CHECK(shm_entries(live).size() == 1);
  CHECK(shm_entries(other).size() == 1);
  unlink(("/dev/shm/" + live).c_str());
  unlink(("/dev/shm/" + other).c_str());
  unlink(("/dev/shm/" + stale).c_str());
}

int main(int argc, char** argv) {
  if (argc >= 6 && std::string(argv[1]) == "--worker") return worker(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), argv[5]);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
