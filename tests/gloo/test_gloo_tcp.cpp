// Launching without mpirun: the tcp://host:port store (rank 0 serves it from
// a thread of its own process; transport/detail/gloo_store.hpp) and the
// launch description from flags or the torch.distributed env:// variables
// (transport/launch.hpp). Processes are copies of this executable started in
// worker mode (`--tcp-worker ...`), meeting through a tcp:// store on a free
// loopback port and checking ring and tree all-reduces against a sequential
// reduction.
#define DOCTEST_CONFIG_IMPLEMENT
#include <dpkit/collectives/allreduce_ring.hpp>
#include <dpkit/collectives/allreduce_tree.hpp>
#include <dpkit/transport/launch.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using namespace std::chrono_literals;

// A loopback port nobody listens on now (bound, read, closed).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("bind failed");
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::string tcp_url(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- worker mode: one rank of a job launched without mpirun ----
// --tcp-worker [FLAGS...]: the launch from these flags (--rendezvous,
// --rank, --world-size) and the environment; ring and tree all-reduces of
// float sums and int32 maxima at several counts, compared with the
// sequential reduction of every rank's input. Exit 0: all right; 1: a
// wrong element; 2: not launched; 5: an exception.
float input_f(int rank, std::size_t e) { return static_cast<float>((rank + 1) * static_cast<int>(e % 13 + 1)); }
std::int32_t input_i(int rank, std::size_t e) { return static_cast<std::int32_t>((rank * 7919 + e * 31) % 1000) - 500; }

int tcp_worker(int argc, char** argv) {
  dpkit::launch_flags flags;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--rendezvous") flags.rendezvous = argv[i + 1];
    else if (f == "--rank") flags.rank = argv[i + 1];
    else if (f == "--world-size") flags.world_size = argv[i + 1];
  }
  try {
    const auto job = dpkit::resolve_launch(flags);
    if (!job) return 2;
    dpkit::gloo_options o;
    o.timeout = 20s;
    dpkit::gloo_transport comm = dpkit::connect_launch(*job, o);
    const int n = comm.size(), r = comm.rank();
    if (n != job->world_size || r != job->rank) return 1;
    dpkit::collective_options co;
    co.timeout = 20s;
    co.segment_bytes = 1024;
    int bad = 0;
    for (bool tree : {false, true})
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t(n + 1), std::size_t{4099}}) {
        std::vector<float> f(count);
        std::vector<std::int32_t> in(count);
        for (std::size_t e = 0; e < count; ++e) {
          f[e] = input_f(r, e);
          in[e] = input_i(r, e);
        }
        if (tree) {
          dpkit::allreduce_tree(comm, f, dpkit::reduce_op::sum, co);
          dpkit::allreduce_tree(comm, in, dpkit::reduce_op::max, co);
        } else {
          dpkit::allreduce_ring(comm, f, dpkit::reduce_op::sum, co);
          dpkit::allreduce_ring(comm, in, dpkit::reduce_op::max, co);
        }
        for (std::size_t e = 0; e < count; ++e) {
          float sf = 0;
          std::int32_t mi = input_i(0, e);
          for (int q = 0; q < n; ++q) {
            sf += input_f(q, e);
            mi = std::max(mi, input_i(q, e));
          }
          if (f[e] != sf || in[e] != mi) {
            std::cerr << "tcp worker rank " << r << ": " << (tree ? "tree" : "ring") << " count " << count << " ["
                      << e << "]: got " << f[e] << "/" << in[e] << ", expected " << sf << "/" << mi << "\n";
            ++bad;
            break;
          }
        }
      }
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "tcp worker: " << e.what() << "\n";
    return 5;
  }
}

// Starts this executable once per (arguments, extra environment); returns
// each exit code (-1: killed after 60 s, or not started).
std::vector<int> spawn_all(const std::vector<std::vector<std::string>>& arg_lists,
                           const std::vector<std::vector<std::string>>& env_lists) {
  std::vector<pid_t> pids;
  for (std::size_t k = 0; k < arg_lists.size(); ++k) {
    std::vector<std::string> args = {"/proc/self/exe"};
    args.insert(args.end(), arg_lists[k].begin(), arg_lists[k].end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // The parent's environment without any launch variables, plus this child's.
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      const std::string s = *e;
      const std::string name = s.substr(0, s.find('='));
      if (name == "RANK" || name == "WORLD_SIZE" || name == "MASTER_ADDR" || name == "MASTER_PORT" ||
          name == "LOCAL_RANK" || name == "LOCAL_WORLD_SIZE" || name.rfind("DPKIT_R", 0) == 0 ||
          name == "DPKIT_WORLD_SIZE")
        continue;
      envs.push_back(s);
    }
    if (k < env_lists.size()) envs.insert(envs.end(), env_lists[k].begin(), env_lists[k].end());
    std::vector<char*> envp;
    for (auto& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) pid = -1;
    pids.push_back(pid);
  }
  std::vector<int> codes(pids.size(), -1);
  const auto until = std::chrono::steady_clock::now() + 60s;
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

// An environment for resolve_launch's tests.
struct fake_env {
  std::map<std::string, std::string> vars;
  dpkit::env_lookup lookup() const {
    return [this](const char* n) -> const char* {
      const auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

// The message of the invalid_argument resolve_launch throws ("" if none).
std::string launch_error(const dpkit::launch_flags& f, const fake_env& env) {
  try {
    (void)dpkit::resolve_launch(f, env.lookup());
  } catch (const dpkit::invalid_argument& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

} // namespace

TEST_CASE("tcp store: URLs") {
  using dpkit::detail::parse_gloo_store_url;
  auto u = parse_gloo_store_url("tcp://10.0.0.5:29500");
  CHECK(u.tcp);
  CHECK(!u.redis);
  CHECK(u.host == "10.0.0.5");
  CHECK(u.port == 29500);
  CHECK(parse_gloo_store_url("tcp://head:1/").port == 1);
  auto v6 = parse_gloo_store_url("tcp://[::1]:29501");
  CHECK(v6.host == "::1");
  CHECK(v6.port == 29501);
  for (const char* bad : {"tcp://", "tcp://h", "tcp://h:", "tcp://:29500", "tcp://h:0", "tcp://h:65536", "tcp://h:2x",
                          "tcp://h:1/job", "tcp://[::1:5"}) {
    CAPTURE(bad);
    try {
      (void)parse_gloo_store_url(bad);
      FAIL("no exception for a bad URL");
    } catch (const dpkit::invalid_argument& e) {
      CHECK(contains(e.what(), std::string("'") + bad + "'"));
    }
  }
  // Who serves comes from the rank: a caller without one is refused, naming the store.
  std::string prefix;
  try {
    (void)dpkit::detail::open_kv_store("tcp://127.0.0.1:29500", "test", 1s, prefix);
    FAIL("no exception without a rank");
  } catch (const dpkit::invalid_argument& e) {
    CHECK(contains(e.what(), "store 'tcp://127.0.0.1:29500'"));
    CHECK(contains(e.what(), "rank 0"));
  }
}

TEST_CASE("tcp store: of racing creators exactly one wins; put overwrites; get, exists") {
  const std::string url = tcp_url(free_port());
  std::string prefix;
  auto server = dpkit::detail::open_kv_store(url, "test", 5s, prefix, 0); // rank 0: serves
  CHECK(prefix == "dpkit");
  const int threads = 6, keys = 40;
  std::vector<int> wins(keys, 0);
  std::vector<std::string> winner(keys);
  std::mutex mu;
  std::vector<std::thread> ts;
  std::vector<std::string> errors(threads);
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      try {
        std::string p;
        // every thread a client of its own (ranks 1..6), rank 0's server in this process
        auto store = dpkit::detail::open_kv_store(url, "test", 5s, p, t + 1);
        for (int k = 0; k < keys; ++k) {
          const std::string v = "writer " + std::to_string(t);
          if (store->create("race/" + std::to_string(k), {v.begin(), v.end()})) {
            std::lock_guard lk(mu);
            ++wins[static_cast<std::size_t>(k)];
            winner[static_cast<std::size_t>(k)] = v;
          }
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (const auto& e : errors) CHECK(e == "");
  for (int k = 0; k < keys; ++k) {
    CAPTURE(k);
    CHECK(wins[static_cast<std::size_t>(k)] == 1);
    const auto v = server->try_get("race/" + std::to_string(k));
    REQUIRE(v);
    CHECK(std::string(v->begin(), v->end()) == winner[static_cast<std::size_t>(k)]);
  }
  CHECK(!server->try_get("absent"));
  CHECK(!server->exists("absent"));
  const std::vector<char> empty;
  CHECK(server->create("empty", empty));
  CHECK(server->exists("empty"));
  CHECK(server->try_get("empty")->empty());
  server->put("beat", {'1'});
  server->put("beat", {'2', '2'});
  CHECK(*server->try_get("beat") == std::vector<char>{'2', '2'});
  std::vector<char> big(3u << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  server->put("big", big);
  CHECK(*server->try_get("big") == big);
  // set/get/wait of gloo::rendezvous::Store: set twice throws, get waits for a later writer
  server->set("once", {'x'});
  CHECK_THROWS_AS(server->set("once", {'y'}), dpkit::error);
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    std::string p;
    auto c = dpkit::detail::open_kv_store(url, "test", 5s, p, 1);
    c->set("later", {'z'});
  });
  CHECK(server->get("later") == std::vector<char>{'z'});
  later.join();
  CHECK_THROWS_AS(server->wait({"never"}, 30ms), dpkit::timeout_error);
}

TEST_CASE("tcp store: unreachable, silent, occupied and closed stores fail in bounded time, naming the store") {
  std::string prefix;
  SUBCASE("nobody listens: timeout_error within the timeout + 1 s") {
    const std::string url = tcp_url(free_port());
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)dpkit::detail::open_kv_store(url, "test", 1s, prefix, 1);
      FAIL("no exception without a server");
    } catch (const dpkit::timeout_error& e) {
      CHECK(contains(e.what(), "store '" + url + "'"));
    }
    const double s = seconds_since(t0);
    CHECK(s >= 0.9);
    CHECK(s < 2.0);
  }
  SUBCASE("a listener that never answers the handshake: timeout_error within the timeout + 1 s") {
    const int port = free_port();
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(listen(fd, 8) == 0); // the kernel completes connections; nothing reads or replies
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)dpkit::detail::open_kv_store(tcp_url(port), "test", 1s, prefix, 1);
      FAIL("no exception from a silent listener");
    } catch (const dpkit::timeout_error& e) {
      CHECK(contains(e.what(), "store '" + tcp_url(port) + "'"));
      CHECK(contains(e.what(), "not a dpkit store"));
    }
    CHECK(seconds_since(t0) < 2.0);
    // rank 0 cannot serve on a port another socket holds: an error naming the port
    try {
      (void)dpkit::detail::open_kv_store(tcp_url(port), "test", 1s, prefix, 0);
      FAIL("no exception for a port in use");
    } catch (const dpkit::error& e) {
      CHECK(contains(e.what(), "store '" + tcp_url(port) + "'"));
      CHECK(contains(e.what(), "port " + std::to_string(port)));
    }
    close(fd);
  }
  SUBCASE("rank 0's store closed: clients fail at once, the port is free again") {
    const int port = free_port();
    auto server = dpkit::detail::open_kv_store(tcp_url(port), "test", 5s, prefix, 0);
    auto client = dpkit::detail::open_kv_store(tcp_url(port), "test", 5s, prefix, 1);
    client->put("k", {'v'});
    server.reset(); // stops the server thread and closes its sockets
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)client->exists("k");
      FAIL("no exception after the server closed");
    } catch (const dpkit::timeout_error&) {
      FAIL("a closed server is an error at once, not a timeout");
    } catch (const dpkit::error& e) {
      CHECK(contains(e.what(), "store '" + tcp_url(port) + "'"));
    }
    CHECK_THROWS_AS(client->exists("k"), dpkit::error); // and every later request
    CHECK(seconds_since(t0) < 1.0);
    auto again = dpkit::detail::open_kv_store(tcp_url(port), "test", 5s, prefix, 0);
    CHECK(!again->exists("k")); // a new, empty store on the same port
  }
}

TEST_CASE("tcp store: two processes meet through tcp:// and all-reduce (flags, then env://)") {
  const int port = free_port();
  const std::string url = tcp_url(port);
  // --rendezvous/--rank/--world-size; rank 1 starts first and waits for rank 0's server
  std::vector<std::vector<std::string>> args;
  for (int r : {1, 0})
    args.push_back({"--tcp-worker", "--rendezvous", url, "--rank", std::to_string(r), "--world-size", "2"});
  auto codes = spawn_all(args, {});
  CHECK(codes == std::vector<int>{0, 0});
  // MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (torch's env://), three ranks
  const int port2 = free_port();
  std::vector<std::vector<std::string>> envs;
  args.clear();
  for (int r : {2, 0, 1}) {
    args.push_back({"--tcp-worker"});
    envs.push_back({"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port2), "RANK=" + std::to_string(r),
                    "WORLD_SIZE=3", "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=3"});
  }
  codes = spawn_all(args, envs);
  CHECK(codes == std::vector<int>{0, 0, 0});
}

TEST_CASE("launch: flags and env:// resolve, flags and DPKIT_* first") {
  fake_env env;
  CHECK(!dpkit::resolve_launch({}, env.lookup())); // not launched so
  env.vars = {{"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}};
  CHECK(!dpkit::resolve_launch({}, env.lookup())); // a shell's defaults alone are no launch
  env.vars["RANK"] = "3";
  env.vars["WORLD_SIZE"] = "4";
  auto l = dpkit::resolve_launch({}, env.lookup());
  REQUIRE(l);
  CHECK(*l == dpkit::launch_info{"tcp://10.1.2.3:29500", 3, 4, -1, -1});
  env.vars["LOCAL_RANK"] = "1";
  env.vars["LOCAL_WORLD_SIZE"] = "2";
  CHECK(*dpkit::resolve_launch({}, env.lookup()) == dpkit::launch_info{"tcp://10.1.2.3:29500", 3, 4, 1, 2});
  env.vars["MASTER_ADDR"] = "fd00::1";
  CHECK(dpkit::resolve_launch({}, env.lookup())->rendezvous == "tcp://[fd00::1]:29500");
  env.vars["DPKIT_RENDEZVOUS"] = "tcp://head:29600";
  env.vars["DPKIT_RANK"] = "0";
  CHECK(*dpkit::resolve_launch({}, env.lookup()) == dpkit::launch_info{"tcp://head:29600", 0, 4, 1, 2});
  dpkit::launch_flags f;
  f.rendezvous = "file:///tmp/job";
  f.rank = "2";
  f.world_size = "8";
  CHECK(*dpkit::resolve_launch(f, env.lookup()) == dpkit::launch_info{"file:///tmp/job", 2, 8, 1, 2});
  fake_env none;
  CHECK(*dpkit::resolve_launch(f, none.lookup()) == dpkit::launch_info{"file:///tmp/job", 2, 8, -1, -1});
}

TEST_CASE("launch: each bad or missing value is an invalid_argument naming it") {
  const fake_env good{{{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}}};
  REQUIRE(launch_error({}, good) == "");
  struct bad_case {
    const char* var;
    const char* value; // nullptr: unset
    std::vector<std::string> parts;
  };
  const std::vector<bad_case> cases = {
      {"RANK", "x1", {"RANK='x1'", "non-negative integer"}},
      {"RANK", "-1", {"RANK='-1'"}},
      {"RANK", "", {"RANK=''"}},
      {"RANK", "2", {"RANK='2'", "out of range", "world size 2"}},
      {"RANK", "99999999999", {"RANK='99999999999'"}},
      {"RANK", nullptr, {"no rank"}},
      {"WORLD_SIZE", "0", {"WORLD_SIZE='0'", ">= 1"}},
      {"WORLD_SIZE", "two", {"WORLD_SIZE='two'"}},
      {"WORLD_SIZE", nullptr, {"no world size"}},
      {"MASTER_PORT", "0", {"MASTER_PORT='0'"}},
      {"MASTER_PORT", "70000", {"MASTER_PORT='70000'"}},
      {"MASTER_PORT", "http", {"MASTER_PORT='http'"}},
      {"MASTER_PORT", nullptr, {"MASTER_PORT is not set"}},
      {"MASTER_ADDR", nullptr, {"MASTER_ADDR is not set"}},
      {"MASTER_ADDR", "", {"MASTER_ADDR is empty"}},
      {"LOCAL_RANK", "z", {"LOCAL_RANK='z'"}},
      {"LOCAL_RANK", "2", {"LOCAL_RANK='2'", "out of range"}},
      {"LOCAL_WORLD_SIZE", "0", {"LOCAL_WORLD_SIZE='0'"}},
      {"LOCAL_WORLD_SIZE", "3", {"LOCAL_WORLD_SIZE='3'", "out of range"}},
      {"DPKIT_RENDEZVOUS", "tcp://h", {"DPKIT_RENDEZVOUS='tcp://h'", "no port"}},
      {"DPKIT_RENDEZVOUS", "http://h:1", {"'http://h:1'", "unknown scheme"}},
      {"DPKIT_RANK", "1.0", {"DPKIT_RANK='1.0'"}},
      {"DPKIT_WORLD_SIZE", "1", {"RANK='1'", "out of range", "world size 1"}},
  };
  for (const auto& c : cases) {
    fake_env env = good;
    if (c.value) env.vars[c.var] = c.value;
    else env.vars.erase(c.var);
    CAPTURE(c.var);
    CAPTURE(c.value ? c.value : "(unset)");
    const std::string what = launch_error({}, env);
    CAPTURE(what);
    CHECK(what != "");
    for (const auto& p : c.parts) CHECK(contains(what, p));
  }
  // LOCAL_RANK within LOCAL_WORLD_SIZE
  fake_env env = good;
  env.vars["LOCAL_RANK"] = "1";
  env.vars["LOCAL_WORLD_SIZE"] = "1";
  CHECK(contains(launch_error({}, env), "LOCAL_RANK='1'"));
  // flags: named as flags
  dpkit::launch_flags f;
  f.rendezvous = "tcp://127.0.0.1:29500";
  f.world_size = "2";
  const fake_env none;
  CHECK(contains(launch_error(f, none), "no rank"));
  f.rank = "2";
  CHECK(contains(launch_error(f, none), "--rank='2'"));
  f.rank = "1";
  f.world_size = "-2";
  CHECK(contains(launch_error(f, none), "--world-size='-2'"));
  f.world_size = "2";
  f.rendezvous = "tcp://127.0.0.1";
  CHECK(contains(launch_error(f, none), "--rendezvous='tcp://127.0.0.1'"));
  dpkit::launch_flags only_rank;
  only_rank.rank = "0";
  CHECK(contains(launch_error(only_rank, none), "--rank='0' is given but no rendezvous"));
  // connect_launch checks what it is given
  CHECK_THROWS_AS(dpkit::connect_launch(dpkit::launch_info{"tcp://127.0.0.1:1", 2, 2}), dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::connect_launch(dpkit::launch_info{"tcp://127.0.0.1:1", 0, 0}), dpkit::invalid_argument);
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--tcp-worker") return tcp_worker(argc, argv);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

// A file store in a fresh directory (removed afterwards) and the loopback
// address, for tcp_p2p_connect.
struct p2p_fixture {
  p2p_fixture() {
    REQUIRE(::mkdtemp(dir) != nullptr);
    store = dpkit::detail::open_kv_store(std::string("file://") + dir, "test", 10s, prefix);
    sockaddr_in lo{};
    lo.sin_family = AF_INET;
    lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::memcpy(&addr, &lo, sizeof lo);
  }
  ~p2p_fixture() { std::filesystem::remove_all(dir); }
  char dir[32] = "/tmp/dpkit-tcpp2p-XXXXXX";
  std::string prefix;
  std::shared_ptr<dpkit::detail::kv_store> store;
  sockaddr_storage addr{};
};

TEST_CASE("tcp p2p connections: a stranger that connects first is refused; the ranks connect and exchange messages") {
  // rank 0 listens and publishes its address; a stranger (another job's
  // rank with the wrong group) connects before rank 1 and sends its hello:
  // rank 0 must drop it and take rank 1's connection, and the message
  // between them arrive whole. Without the group check the stranger's
  // socket would stand for rank 1 and the message never arrive.
  p2p_fixture f;
  auto& store = f.store;
  const std::string& prefix = f.prefix;
  const sockaddr_storage& addr = f.addr;
  const auto due = dpkit::deadline_after(10s);
  std::unique_ptr<dpkit::detail::tcp_p2p> e0, e1;
  std::string err0, err1;
  std::thread r0([&] {
    try {
      e0 = dpkit::detail::tcp_p2p_connect(*store, prefix + "/t", 0, 2, addr, sizeof(sockaddr_in), due, "rank 0");
    } catch (const std::exception& e) {
      err0 = e.what();
    }
  });
  // the stranger: rank 1 of another group
  const std::string v = dpkit::detail::store_get_until(*store, prefix + "/t/0", due, "stranger", "rank 0's address");
  sockaddr_storage a0{};
  socklen_t l0 = 0;
  REQUIRE(dpkit::detail::tcp_detail::unhex(v, a0, l0));
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(::connect(s, reinterpret_cast<sockaddr*>(&a0), l0) == 0);
  const dpkit::detail::tcp_detail::hello h{dpkit::detail::tcp_detail::hello_magic, 1, 2, 0, 12345};
  REQUIRE(::send(s, &h, sizeof h, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof h));
  std::this_thread::sleep_for(200ms);
  std::thread r1([&] {
    try {
      e1 = dpkit::detail::tcp_p2p_connect(*store, prefix + "/t", 1, 2, addr, sizeof(sockaddr_in), due, "rank 1");
    } catch (const std::exception& e) {
      err1 = e.what();
    }
  });
  r0.join();
  r1.join();
  ::close(s);
  REQUIRE(err0 == "");
  REQUIRE(err1 == "");
  std::vector<std::byte> msg(100000), got(100000);
  for (std::size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<std::byte>(i * 7);
  auto rv = e1->post_recv(got.data(), got.size(), 0, 5);
  auto sd = e0->post_send(msg.data(), msg.size(), 1, 5);
  const auto until = std::chrono::steady_clock::now() + 10s;
  while ((rv->state.load() == 0 || sd->state.load() == 0) && std::chrono::steady_clock::now() < until) {
    e0->progress();
    e1->progress();
  }
  CHECK(rv->state.load() == dpkit::detail::p2p_op::done);
  CHECK(got == msg);
}

TEST_CASE("tcp p2p connections: a rank that never connects is a timeout_error naming it") {
  p2p_fixture f;
  auto& store = f.store;
  const std::string& prefix = f.prefix;
  const sockaddr_storage& addr = f.addr;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)dpkit::detail::tcp_p2p_connect(*store, prefix + "/t", 0, 3, addr, sizeof(sockaddr_in), dpkit::deadline_after(500ms), "rank 0");
    FAIL("no timeout_error");
  } catch (const dpkit::timeout_error& e) {
    CHECK(std::string(e.what()).find("rank(s) 1, 2 did not connect") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
}

TEST_CASE("tcp p2p connections: the congestion control chosen from DPKIT_TCP_CONGESTION and the system's") {
  using dpkit::detail::tcp_congestion_choice;
  // unset, empty or "auto": BBR is replaced by reno, anything else kept
  CHECK(tcp_congestion_choice(nullptr, "bbr") == "reno");
  CHECK(tcp_congestion_choice("", "bbr") == "reno");
  CHECK(tcp_congestion_choice("auto", "bbr") == "reno");
  CHECK(tcp_congestion_choice(nullptr, "cubic") == "");
  CHECK(tcp_congestion_choice("auto", "reno") == "");
  // "system" keeps the system's, a name is taken as it is
  CHECK(tcp_congestion_choice("system", "bbr") == "");
  CHECK(tcp_congestion_choice("cubic", "bbr") == "cubic");
  CHECK(tcp_congestion_choice("bbr", "cubic") == "bbr");
}

TEST_CASE("tcp p2p connections: DPKIT_TCP_CONGESTION sets both ends' congestion control; an unknown name is an invalid_argument naming it") {
  // The name asked for differs from the system's default, so the check
  // fails unless tcp_p2p_connect sets it (on the connecting socket, and on
  // the listener that the accepted one inherits it from). Unset, the
  // automatic choice (reno where the system's is BBR) is checked too.
  const std::string sys = dpkit::detail::tcp_detail::sysctl_line("/proc/sys/net/ipv4/tcp_congestion_control");
  const std::string want = sys == "reno" ? "cubic" : "reno";
  auto cc_of = [](int fd) {
    char name[16] = {};
    socklen_t len = sizeof name;
    REQUIRE(::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) == 0);
    return std::string(name, ::strnlen(name, sizeof name));
  };
  auto both_ends = [&](const char* env) {
    p2p_fixture f;
    if (env) ::setenv("DPKIT_TCP_CONGESTION", env, 1);
    const auto due = dpkit::deadline_after(10s);
    std::unique_ptr<dpkit::detail::tcp_p2p> e[2];
    std::string err[2];
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        try {
          e[r] = dpkit::detail::tcp_p2p_connect(*f.store, f.prefix + "/t", r, 2, f.addr, sizeof(sockaddr_in), due,
                                                "rank " + std::to_string(r));
        } catch (const std::exception& x) {
          err[r] = x.what();
        }
      });
    for (auto& t : ts) t.join();
    ::unsetenv("DPKIT_TCP_CONGESTION");
    REQUIRE(err[0] == "");
    REQUIRE(err[1] == "");
    return std::vector<std::string>{cc_of(e[0]->socket_of(1)), cc_of(e[1]->socket_of(0))};
  };
  CHECK(both_ends(want.c_str()) == std::vector<std::string>{want, want});
  const std::string automatic = sys == "bbr" ? "reno" : sys;
  CHECK(both_ends(nullptr) == std::vector<std::string>{automatic, automatic});
  CHECK(both_ends("system") == std::vector<std::string>{sys, sys});
  {
    p2p_fixture f;
    ::setenv("DPKIT_TCP_CONGESTION", "dpkit-no-such", 1);
    try {
      (void)dpkit::detail::tcp_p2p_connect(*f.store, f.prefix + "/t", 0, 2, f.addr, sizeof(sockaddr_in),
                                           dpkit::deadline_after(2s), "rank 0");
      FAIL("no invalid_argument");
    } catch (const dpkit::invalid_argument& x) {
      CHECK(std::string(x.what()).find("rank 0") != std::string::npos);
      CHECK(std::string(x.what()).find("DPKIT_TCP_CONGESTION='dpkit-no-such'") != std::string::npos);
    }
    ::unsetenv("DPKIT_TCP_CONGESTION");
  }
}
