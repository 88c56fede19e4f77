// dpkit internals: what ranks that meet through a key-value store (no MPI)
// need beyond their connections: which node each rank is on, and the node's
// shared segment. Used by gloo_transport (and so by the torch backend
// "dpkit" when it meets through torch's store, and by elastic_group). The
// keys live under a prefix of the group's own, so two groups (two jobs, two
// generations, a split) never read each other's. Not for users.
//
// Nodes: a rank's node is its identity, the host name plus the kernel's
// boot id plus the device of /dev/shm (two processes can share a
// POSIX shared-memory object exactly when they see the same /dev/shm on the
// same boot; separate host names keep the emulated cluster's nodes apart),
// subdivided by DPKIT_RANKS_PER_NODE as dpkit::mpi does. Every rank writes
// "<prefix>/rank/<r>" and reads everyone's, which also checks that the
// ranks agree on the world size, DPKIT_RANKS_PER_NODE and DPKIT_SHM_BYTES
// (an error on every rank that sees a difference, naming both values).
//
// Segment: the node's lowest rank creates a POSIX shared-memory object
// (shm_mapping.hpp) under a fresh name and publishes the name; the others
// map it, set up their control lines and acknowledge; the creator then
// unlinks the name (a kill -9 afterwards leaves nothing in /dev/shm) and
// publishes the outcome, which every rank waits for: so nobody uses the
// segment before every control line is set up, and a rank that cannot map
// it, or never arrives (killed during the rendezvous), fails every rank of
// the node within the deadline with a message naming it. Before creating,
// the creator removes this user's dpkit segments whose creating process no
// longer exists (a job killed inside that short window).
#pragma once

#include "../../core/errors.hpp"
#include "../../core/options.hpp"
#include "../topology.hpp"
#include "gloo_store.hpp"
#include "shm_mapping.hpp"
#include "shm_p2p.hpp"
#include "shm_segment.hpp"
#include "tcp_p2p.hpp"

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dpkit::detail {

/// This process's node identity (see the file comment): "host|boot id|dev".
inline std::string node_identity() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string boot;
  if (std::ifstream f("/proc/sys/kernel/random/boot_id"); f) std::getline(f, boot);
  struct stat st {};
  const unsigned long long dev = ::stat("/dev/shm", &st) == 0 ? static_cast<unsigned long long>(st.st_dev) : 0;
  return std::string(host) + "|" + boot + "|" + std::to_string(dev);
}

/// The value under `key`, waited for until `due`.
/// @throws dpkit::timeout_error naming the store, the key and `what` (who
///         did not write it).
inline std::string store_get_until(kv_store& store, const std::string& key, deadline due, const std::string& where,
                                   const std::string& what) {
  // rounded up: a wait of whole milliseconds never ends before `due`
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(due - clock::now());
  try {
    store.wait({key}, std::max(left, std::chrono::milliseconds(0)));
  } catch (const timeout_error&) {
    throw timeout_error(where + ": " + what + " did not arrive through " + store.where() + " within the deadline (key '" +
                        key + "')");
  }
  auto v = store.try_get(key);
  if (!v) throw error(where + ": key '" + key + "' of " + store.where() + " vanished");
  return std::string(v->begin(), v->end());
}

/// Writes `value` under `key` (once).
/// @throws dpkit::error when the key exists (an earlier group's keys under
///         the same prefix) or the store fails.
inline void store_set(kv_store& store, const std::string& key, const std::string& value, const std::string& where) {
  if (!store.create(key, std::vector<char>(value.begin(), value.end())))
    throw error(where + ": key '" + key + "' of " + store.where() +
                " exists already (keys of an earlier group with the same prefix? use a fresh store or prefix)");
}

/// What one rank declares about itself in the node rendezvous.
struct store_rank_info {
  int size = 0;
  int per_node = 0;
  unsigned long long shm_bytes = 0;
  std::string node;
  std::string encode() const {
    return std::to_string(size) + " " + std::to_string(per_node) + " " + std::to_string(shm_bytes) + " " + node;
  }
  static bool decode(const std::string& s, store_rank_info& out) {
    char* end = nullptr;
    const char* p = s.c_str();
    out.size = static_cast<int>(std::strtol(p, &end, 10));
    if (end == p || *end != ' ') return false;
    p = end + 1;
    out.per_node = static_cast<int>(std::strtol(p, &end, 10));
    if (end == p || *end != ' ') return false;
    p = end + 1;
    out.shm_bytes = std::strtoull(p, &end, 10);
    if (end == p || *end != ' ') return false;
    out.node = std::string(end + 1);
    return true;
  }
};

/// Every rank's node label (node_layout::canonicalize's input), agreed
/// through the store under `prefix` (collective over the `size` ranks).
/// Rank r reads rank 0's declaration first, so a rank that got another world
/// size fails at once with a message naming both sizes.
/// @throws dpkit::invalid_argument when the ranks disagree on the world
///         size, DPKIT_RANKS_PER_NODE or DPKIT_SHM_BYTES (naming both
///         ranks and values) or one of these is malformed;
///         dpkit::timeout_error when a rank does not arrive by `due`.
inline std::vector<long long> store_node_labels(kv_store& store, const std::string& prefix, int rank, int size,
                                                std::size_t shm_bytes, deadline due, const std::string& where) {
  store_rank_info mine{size, ranks_per_node_from_env(), shm_bytes, node_identity()};
  store_set(store, prefix + "/rank/" + std::to_string(rank), mine.encode(), where);
  std::vector<store_rank_info> all(static_cast<std::size_t>(size));
  all[static_cast<std::size_t>(rank)] = mine;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const std::string v = store_get_until(store, prefix + "/rank/" + std::to_string(p), due, where,
                                          "rank " + std::to_string(p) + "'s node declaration");
    store_rank_info& i = all[static_cast<std::size_t>(p)];
    if (!store_rank_info::decode(v, i))
      throw error(where + ": rank " + std::to_string(p) + "'s node declaration in " + store.where() + " is malformed: '" +
                  v + "' (another program's keys under the same prefix?)");
    auto differ = [&](const char* what, auto a, auto b) {
      throw invalid_argument(where + ": the ranks disagree on " + what + ": rank " + std::to_string(rank) + " has " +
                             std::to_string(a) + ", rank " + std::to_string(p) + " has " + std::to_string(b) +
                             "; every rank must use the same");
    };
    if (i.size != size) differ("the world size", size, i.size);
    if (i.per_node != mine.per_node) differ("DPKIT_RANKS_PER_NODE", mine.per_node, i.per_node);
    if (i.shm_bytes != mine.shm_bytes) differ("DPKIT_SHM_BYTES", mine.shm_bytes, i.shm_bytes);
  }
  // label: the lowest rank of the same identity (the host's leader), then the
  // virtual node inside the host
  std::vector<long long> labels(static_cast<std::size_t>(size));
  for (int p = 0; p < size; ++p) {
    int leader = p, local = 0;
    for (int q = 0; q < p; ++q)
      if (all[static_cast<std::size_t>(q)].node == all[static_cast<std::size_t>(p)].node) {
        if (leader == p) leader = q;
        ++local;
      }
    labels[static_cast<std::size_t>(p)] = static_cast<long long>(leader) * (static_cast<long long>(size) + 1) +
                                          (mine.per_node > 0 ? local / mine.per_node : 0);
  }
  return labels;
}

/// Removes this user's dpkit shared-memory objects in /dev/shm named
/// "dpkit-<tag>-<pid>-<hex>" whose process `pid` no longer exists (left by
/// a job killed between creating its segment and unlinking it). Only
/// regular files owned by this user with that exact name form are touched.
/// Never throws.
inline void shm_remove_stale(const std::string& tag) noexcept {
  DIR* d = ::opendir("/dev/shm");
  if (!d) return;
  const std::string head = "dpkit-" + tag + "-";
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, head.size(), head) != 0) continue;
    const std::string rest = name.substr(head.size());
    char* end = nullptr;
    const long pid = std::strtol(rest.c_str(), &end, 10);
    if (pid <= 0 || !end || *end != '-' || std::string(end + 1).size() != 16) continue;
    struct stat st {};
    if (::lstat(("/dev/shm/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::getuid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) shm_mapping::unlink("/" + name);
  }
  ::closedir(d);
}

/// The node's shared segment for ranks that meet through a store: the
/// mapping and this rank's view.
struct store_segment {
  shm_mapping map;
  std::unique_ptr<shm_segment> view;
  /// The point-to-point area after the ranks' regions (shm_p2p.hpp), or
  /// nullptr when none was asked for.
  std::byte* p2p_area = nullptr;
  /// Bytes of each ring of that area (local rank 0 chose them; 0 without one).
  std::size_t p2p_ring_bytes = 0;
};

/// Maps the shared segment of `size` ranks on one node (see the file
/// comment): `slot_bytes` per buffer, two buffers and a control line per
/// rank, each rank's region on pages of its own; with `with_p2p`, followed
/// by the point-to-point area of shm_p2p.hpp (store_segment::p2p_area),
/// whose ring size local rank 0 chooses (shm_p2p_ring_bytes: small rings
/// unless the node's ranks share cores, shm_oversubscribed) and publishes
/// with the segment's name, so that every rank maps the same layout.
/// Collective over the ranks (every rank passes the same sizes); keys under
/// `prefix`.
/// @throws dpkit::error naming the rank that could not create or map it and
///         why; dpkit::timeout_error naming the rank that did not arrive
///         by `due` (the creator unlinks the object in every case).
inline store_segment store_map_segment(kv_store& store, const std::string& prefix, int rank, int size,
                                       std::size_t slot_bytes, deadline due, const std::string& where,
                                       bool with_p2p = false) {
  const std::size_t stride = (shm_region_bytes(slot_bytes) + 4095) / 4096 * 4096;
  const std::size_t regions = stride * static_cast<std::size_t>(size);
  std::size_t ring = with_p2p && size > 1 ? shm_p2p_ring_bytes(size, shm_oversubscribed(size)) : 0;
  std::size_t total = regions + (ring ? shm_p2p_area_bytes(size, ring) : 0);
  store_segment s;
  auto setup_own = [&] {
    std::vector<std::byte*> bases(static_cast<std::size_t>(size));
    for (int p = 0; p < size; ++p) bases[static_cast<std::size_t>(p)] = s.map.data() + static_cast<std::size_t>(p) * stride;
    auto* c = new (bases[static_cast<std::size_t>(rank)]) shm_control{}; // before any peer reads it
    c->pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
    s.view = std::make_unique<shm_segment>(rank, std::move(bases), slot_bytes);
    s.view->prefault(); // no collective runs on it before every rank has acknowledged
    if (ring) {
      s.p2p_area = s.map.data() + regions;
      s.p2p_ring_bytes = ring;
      shm_p2p::prefault(s.p2p_area, rank, size, ring);
    }
  };
  const std::string name_key = prefix + "/name", done_key = prefix + "/done";
  if (rank == 0) {
    std::string name, why;
    try {
      shm_remove_stale("gloo");
      name = shm_mapping::unique_name("gloo");
      s.map = shm_mapping::create(name, total);
      setup_own();
      if (s.p2p_area) shm_p2p::init_area(s.p2p_area, size, ring); // before any peer maps it
    } catch (const std::exception& e) {
      why = e.what();
    }
    // "NAME RING_BYTES" (the ring size only with an area)
    store_set(store, name_key, why.empty() ? name + (ring ? " " + std::to_string(ring) : "") : "!" + why, where);
    if (!why.empty()) throw error(where + ": the node's shared segment (" + std::to_string(total) + " bytes): " + why);
    std::string outcome;
    try {
      for (int p = 1; p < size && outcome.empty(); ++p) {
        const std::string a = store_get_until(store, prefix + "/ack/" + std::to_string(p), due, where,
                                              "local rank " + std::to_string(p) + "'s mapping of the shared segment");
        if (!a.empty()) outcome = "local rank " + std::to_string(p) + " could not map it: " + a;
      }
    } catch (const timeout_error& e) {
      outcome = e.what();
    } catch (const std::exception& e) {
      outcome = e.what();
    }
    shm_mapping::unlink(name);
    std::string fail_done;
    try {
      store_set(store, done_key, outcome.empty() ? "ok" : "!" + outcome, where);
    } catch (const std::exception& e) {
      fail_done = e.what();
    }
    if (!outcome.empty()) throw timeout_error(where + ": the node's shared segment: " + outcome);
    if (!fail_done.empty()) throw error(fail_done);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return s;
  }
  std::string name = store_get_until(store, name_key, due, where, "local rank 0's shared segment name");
  if (!name.empty() && name[0] == '!')
    throw error(where + ": the node's shared segment: local rank 0 could not create it: " + name.substr(1));
  if (ring) {
    // the ring size local rank 0 chose: this rank's own guess may differ
    // (another environment), the layout must not
    const std::size_t sp = name.rfind(' ');
    char* end = nullptr;
    const unsigned long long v = sp == std::string::npos ? 0 : std::strtoull(name.c_str() + sp + 1, &end, 10);
    if (sp == std::string::npos || !end || *end != '\0' || !shm_p2p_ring_bytes_valid(static_cast<std::size_t>(v)))
      throw error(where + ": the node's shared segment: local rank 0 published '" + name +
                  "', not a segment name and a ring size (a power of two from 4096 to 16777216 bytes)");
    ring = static_cast<std::size_t>(v);
    total = regions + shm_p2p_area_bytes(size, ring);
    name.resize(sp);
  }
  std::string why;
  try {
    s.map = shm_mapping::open(name, total);
    setup_own();
  } catch (const std::exception& e) {
    why = e.what();
    if (why.empty()) why = "unknown error";
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  store_set(store, prefix + "/ack/" + std::to_string(rank), why, where);
  if (!why.empty()) throw error(where + ": the node's shared segment: " + why);
  const std::string done = store_get_until(store, done_key, due, where, "local rank 0's outcome of the shared segment");
  if (done != "ok") throw error(where + ": the node's shared segment: " + (done.empty() ? done : done.substr(1)));
  return s;
}

namespace tcp_detail {
// A socket closed at scope exit unless released.
struct unique_fd {
  int fd = -1;
  explicit unique_fd(int f = -1) : fd(f) {}
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() noexcept { return std::exchange(fd, -1); }
};
inline std::string hex(const void* p, std::size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(p)[i];
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}
inline bool unhex(const std::string& s, sockaddr_storage& a, socklen_t& len) {
  if (s.size() % 2 || s.size() / 2 > sizeof a || s.size() < 4) return false;
  auto v = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  std::memset(&a, 0, sizeof a);
  for (std::size_t i = 0; i < s.size() / 2; ++i) {
    const int hi = v(s[2 * i]), lo = v(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    reinterpret_cast<unsigned char*>(&a)[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  len = static_cast<socklen_t>(s.size() / 2);
  return a.ss_family == AF_INET || a.ss_family == AF_INET6;
}
// The first message on a connection: who connects, to which group.
struct hello {
  std::uint32_t magic;
  std::int32_t rank, size;
  std::uint32_t pad;
  std::uint64_t group; // hash of the store and key prefix
};
inline constexpr std::uint32_t hello_magic = 0x64704831u; // "dpH1"
// The first line of a /proc/sys file ("?" when it cannot be read).
inline std::string sysctl_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  return std::getline(f, s) ? s : std::string("?");
}
// DPKIT_TCP_CONGESTION's value `env` (nullptr when unset) asks for the
// automatic choice: unset, empty or "auto".
inline bool congestion_auto(const char* env) { return env == nullptr || *env == '\0' || std::string(env) == "auto"; }
} // namespace tcp_detail

/// The TCP congestion control dpkit's own connections (tcp_p2p_connect)
/// ask for, from DPKIT_TCP_CONGESTION's value `env` (nullptr when unset)
/// and `system`, the one a new socket gets (net.ipv4.tcp_congestion_control):
/// - unset, "" or "auto": "reno" when `system` is "bbr", else "" (keep it);
/// - "system": "" (keep the system's, whatever it is);
/// - any other value: that name ("cubic", "reno", "bbr", "dctcp", ...).
///
/// Why BBR is replaced: on the emulated cluster (2 Gbit/s links, RTT under
/// 0.1 ms), BBR's bandwidth estimate on dpkit's connections swung between
/// 60 Mbit/s and 35 Gbit/s, and 2x2 hierarchical all-reduces of 128 KiB
/// stalled for 13-110 ms now and then: 4000 calls took a median 2299 ms
/// over 12 runs (a stall in 10), 2199 ms with reno on dpkit's connections
/// alone (a stall in 3), and 2202-2220 ms over Open MPI's tcp BTL on the
/// same BBR (benchmarks/results/2026-11-29-tcp-congestion-control.md).
/// Reno is the one every Linux lets an unprivileged process choose.
inline std::string tcp_congestion_choice(const char* env, const std::string& system) {
  if (tcp_detail::congestion_auto(env)) return system == "bbr" ? "reno" : "";
  if (std::string(env) == "system") return "";
  return env;
}

/// Gives socket `fd` the congestion control DPKIT_TCP_CONGESTION asks for
/// (tcp_congestion_choice of the socket's own). `what` names the rank and
/// the connection for the message.
/// @throws dpkit::invalid_argument naming DPKIT_TCP_CONGESTION's value, the
///         kernel's reason and the names this host allows, when the kernel
///         refuses a name DPKIT_TCP_CONGESTION gave (unknown, or not in
///         net.ipv4.tcp_allowed_congestion_control for an unprivileged
///         process); a refused automatic choice keeps the socket's own.
inline void set_tcp_congestion(int fd, const std::string& what) {
  char cur[16] = {}; // TCP_CA_NAME_MAX
  socklen_t cl = sizeof cur;
  const std::string system = ::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cur, &cl) == 0
                                 ? std::string(cur, ::strnlen(cur, sizeof cur)) : std::string();
  const char* env = std::getenv("DPKIT_TCP_CONGESTION");
  const std::string name = tcp_congestion_choice(env, system);
  if (name.empty() || name == system) return;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0) return;
  const int e = errno;
  if (tcp_detail::congestion_auto(env)) return;
  throw invalid_argument(what + ": DPKIT_TCP_CONGESTION='" + env + "': the kernel refused it (" + std::strerror(e) +
                         "); allowed here: " + tcp_detail::sysctl_line("/proc/sys/net/ipv4/tcp_allowed_congestion_control") +
                         " (net.ipv4.tcp_allowed_congestion_control; available to root: " +
                         tcp_detail::sysctl_line("/proc/sys/net/ipv4/tcp_available_congestion_control") + ")");
}

/// Connects rank `rank` of `size` to every other rank over TCP for the
/// point-to-point engine tcp_p2p (tcp_p2p.hpp): listens on `addr` (the
/// address Gloo's device of this rank uses; any port), publishes it under
/// `prefix`/RANK in `store`, connects to each lower rank's address and
/// accepts a connection from each higher rank. A connection's first bytes
/// name the group (a hash of the store and the key prefix) and the rank: a
/// connection of another job, or of a stale rank, is refused and the wait
/// goes on. Sockets are created close-on-exec, with the congestion control
/// of set_tcp_congestion (reno where the system's is BBR, unless
/// DPKIT_TCP_CONGESTION says otherwise).
/// @throws dpkit::timeout_error when the connections are not all made by
///         `due` (naming the ranks missing); dpkit::error when this rank
///         cannot listen or a published address is malformed;
///         dpkit::invalid_argument when the kernel refuses DPKIT_TCP_CONGESTION.
inline std::unique_ptr<tcp_p2p> tcp_p2p_connect(kv_store& store, const std::string& prefix, int rank, int size,
                                                const sockaddr_storage& addr, socklen_t addr_len, deadline due,
                                                const std::string& where) {
  using namespace tcp_detail;
  const std::string what = where + ": dpkit's TCP connections";
  sockaddr_storage a = addr;
  socklen_t len = addr_len;
  if (a.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(a).sin_port = 0;
  else if (a.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(a).sin6_port = 0;
  else throw error(what + ": the address of this rank has family " + std::to_string(a.ss_family) + ", not IPv4 or IPv6");
  unique_fd lfd(::socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (lfd.fd < 0) throw error(what + ": socket(): " + std::strerror(errno));
  set_tcp_congestion(lfd.fd, what); // the accepted connections inherit the listener's
  if (::bind(lfd.fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(lfd.fd, size) != 0 ||
      ::getsockname(lfd.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw error(what + ": cannot listen on this rank's address: " + std::strerror(errno));
  store_set(store, prefix + "/" + std::to_string(rank), hex(&a, len), where);
  std::uint64_t group = 1469598103934665603ull;
  for (char c : store.where() + "|" + prefix + "|" + std::to_string(size)) group = (group ^ static_cast<unsigned char>(c)) * 1099511628211ull;

  std::vector<unique_fd> fds(static_cast<std::size_t>(size));
  for (int p = 0; p < rank; ++p) {
    const std::string v = store_get_until(store, prefix + "/" + std::to_string(p), due, where,
                                          "rank " + std::to_string(p) + "'s TCP address");
    sockaddr_storage pa{};
    socklen_t plen = 0;
    if (!unhex(v, pa, plen))
      throw error(what + ": rank " + std::to_string(p) + "'s address in " + store.where() + " is malformed: '" + v + "'");
    for (;;) {
      unique_fd fd(::socket(pa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (fd.fd < 0) throw error(what + ": socket(): " + std::strerror(errno));
      set_tcp_congestion(fd.fd, what + " to rank " + std::to_string(p));
      int rc = ::connect(fd.fd, reinterpret_cast<sockaddr*>(&pa), plen);
      int err = rc == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        socklen_t el = sizeof err;
        if (tcp_store_io::wait_fd(fd.fd, POLLOUT, due) != tcp_store_io::result::ok) err = ETIMEDOUT;
        else if (::getsockopt(fd.fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
      }
      hello h{hello_magic, rank, size, 0, group};
      int io_err = 0;
      if (err == 0 && tcp_store_io::send_all(fd.fd, reinterpret_cast<const char*>(&h), sizeof h, due, io_err) ==
                          tcp_store_io::result::ok) {
        fds[static_cast<std::size_t>(p)].fd = fd.release();
        break;
      }
      if (clock::now() >= due || (err != ECONNREFUSED && err != 0 && err != ECONNRESET))
        throw timeout_error(what + ": could not connect to rank " + std::to_string(p) + " at the address it published (" +
                            std::strerror(err ? err : ETIMEDOUT) + ") before the deadline");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  for (int expected = size - 1 - rank; expected > 0;) {
    if (tcp_store_io::wait_fd(lfd.fd, POLLIN, due) != tcp_store_io::result::ok) {
      std::string missing;
      for (int p = rank + 1; p < size; ++p)
        if (fds[static_cast<std::size_t>(p)].fd < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
      throw timeout_error(what + ": rank(s) " + missing + " did not connect to this rank before the deadline");
    }
    unique_fd fd(::accept4(lfd.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd.fd < 0) continue;
    hello h{};
    // a stranger (another job's rank, a port scanner) is dropped; at most 1 s each
    int io_err = 0;
    if (tcp_store_io::recv_all(fd.fd, reinterpret_cast<char*>(&h), sizeof h, std::min(due, clock::now() + std::chrono::seconds(1)),
                               io_err) != tcp_store_io::result::ok)
      continue;
    if (h.magic != hello_magic || h.group != group || h.size != size || h.rank <= rank || h.rank >= size ||
        fds[static_cast<std::size_t>(h.rank)].fd >= 0)
      continue;
    fds[static_cast<std::size_t>(h.rank)].fd = fd.release();
    --expected;
  }
  std::vector<int> raw(static_cast<std::size_t>(size), -1);
  for (int p = 0; p < size; ++p) raw[static_cast<std::size_t>(p)] = fds[static_cast<std::size_t>(p)].release();
  return std::make_unique<tcp_p2p>(rank, size, std::move(raw));
}

} // namespace dpkit::detail
