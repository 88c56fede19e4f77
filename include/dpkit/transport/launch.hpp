/// @file launch.hpp
/// @brief Launching without mpirun: where and as whom this process joins its
/// job, from command-line flags or from the environment that torchrun,
/// accelerate, Slurm scripts and Kubernetes operators set for
/// torch.distributed's env:// init method, and a gloo_transport built from
/// it. Meson feature `gloo` (Debian libgloo-dev); never included by the
/// umbrella header dpkit.hpp.
///
/// @code
/// // RANK=1 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 ./train
/// if (auto job = dpkit::launch_from_env()) {
///   dpkit::gloo_transport comm = dpkit::connect_launch(*job);
///   dpkit::allreduce(comm, grads, dpkit::reduce_op::avg);
/// }
/// @endcode
///
/// The contract (torch.distributed env:// init method): MASTER_ADDR and
/// MASTER_PORT name the rendezvous `tcp://MASTER_ADDR:MASTER_PORT`, a store
/// that rank 0 serves from a thread of its own process (as torch's TCPStore
/// with is_master; detail/gloo_store.hpp); RANK and WORLD_SIZE say who this
/// process is; LOCAL_RANK and LOCAL_WORLD_SIZE (optional) its place on its
/// machine. dpkit's own DPKIT_RENDEZVOUS (any store URL: tcp://, file://,
/// redis://), DPKIT_RANK and DPKIT_WORLD_SIZE take precedence over them, and
/// the flags (--rendezvous, --rank, --world-size) over both, each value on
/// its own: under torchrun, whose launcher holds MASTER_PORT for its own
/// store, DPKIT_RENDEZVOUS=tcp://$MASTER_ADDR:OTHER_PORT keeps RANK and
/// WORLD_SIZE from torchrun.
#pragma once

#include "../core/errors.hpp"
#include "gloo.hpp"

#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace dpkit {

/// Where and as whom this process joins its job (a regular aggregate).
struct launch_info {
  /// The store URL of the rendezvous: tcp://host:port (served by rank 0),
  /// file:///dir or redis://host:port/job (see gloo_transport).
  std::string rendezvous;
  /// This process's rank, in [0, world_size).
  int rank = 0;
  /// Number of processes of the job, >= 1.
  int world_size = 1;
  /// This process's rank among those on its machine, in
  /// [0, local_world_size) when both are known; -1: not given.
  int local_rank = -1;
  /// Number of the job's processes on this machine, in [1, world_size];
  /// -1: not given.
  int local_world_size = -1;
  friend bool operator==(const launch_info&, const launch_info&) = default;
  friend std::ostream& operator<<(std::ostream& os, const launch_info& l) {
    return os << "launch_info{rendezvous=" << l.rendezvous << ", rank=" << l.rank << ", world_size=" << l.world_size
              << ", local_rank=" << l.local_rank << ", local_world_size=" << l.local_world_size << "}";
  }
};

/// Launch values given on the command line (nullopt: not given). Strings,
/// so that a malformed value is reported as it was typed.
struct launch_flags {
  std::optional<std::string> rendezvous; ///< --rendezvous URL
  std::optional<std::string> rank;       ///< --rank R
  std::optional<std::string> world_size; ///< --world-size W
  /// Whether any flag was given.
  bool any() const noexcept { return rendezvous || rank || world_size; }
  friend bool operator==(const launch_flags&, const launch_flags&) = default;
};

/// Reads one environment variable: its value, or nullptr when unset.
using env_lookup = std::function<const char*(const char* name)>;

/// The process's environment (std::getenv).
inline const char* process_env(const char* name) { return std::getenv(name); }

namespace detail {

// A non-negative decimal integer below 2^31 (digits only), or nullopt.
inline std::optional<int> parse_launch_int(std::string_view s) {
  if (s.empty() || s.size() > 10) return std::nullopt;
  long long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v > 0x7fffffff) return std::nullopt;
  return static_cast<int>(v);
}

// One launch value: its text and the name of the flag or variable it came from.
struct launch_value {
  std::string text;
  std::string name; // "--rank", "DPKIT_RANK", "RANK"
};

inline std::optional<launch_value> launch_pick(const std::optional<std::string>& flag, const char* flag_name,
                                               std::initializer_list<const char*> vars, const env_lookup& env) {
  if (flag) return launch_value{*flag, flag_name};
  for (const char* v : vars)
    if (const char* s = env(v)) return launch_value{s, v};
  return std::nullopt;
}

inline int launch_int(const launch_value& v) {
  if (auto n = parse_launch_int(v.text)) return *n;
  throw invalid_argument("launch: " + v.name + "='" + v.text + "' is not a non-negative integer");
}

} // namespace detail

/// Resolves where and as whom this process joins its job, each value from
/// the first source that has it: the flag, then dpkit's variable, then the
/// torch.distributed env:// variable:
///   rendezvous: --rendezvous, DPKIT_RENDEZVOUS, tcp://MASTER_ADDR:MASTER_PORT
///               (MASTER_ADDR may be a host name or an IPv4/IPv6 address);
///   rank:       --rank, DPKIT_RANK, RANK;
///   world size: --world-size, DPKIT_WORLD_SIZE, WORLD_SIZE;
///   LOCAL_RANK, LOCAL_WORLD_SIZE: optional, from the environment only.
/// A process is launched this way when any flag is given or any of
/// DPKIT_RENDEZVOUS, DPKIT_RANK, DPKIT_WORLD_SIZE, RANK, WORLD_SIZE is set;
/// MASTER_ADDR and MASTER_PORT alone (a shell's defaults) are not a launch.
/// The URL is checked as gloo_transport checks it (parse_gloo_store_url).
/// @param env how variables are read (default: the process's environment).
/// @returns the launch, or nullopt when this process was not launched so.
/// @throws dpkit::invalid_argument naming the flag or variable and its value
///         when a value is missing (e.g. RANK set, WORLD_SIZE not; MASTER_ADDR
///         without MASTER_PORT), not a non-negative integer, a world size
///         < 1, a rank outside [0, world size), a local rank outside
///         [0, local world size), a local world size above the world size,
///         or a malformed store URL.
inline std::optional<launch_info> resolve_launch(const launch_flags& flags, const env_lookup& env = process_env) {
  using detail::launch_pick;
  const auto url = launch_pick(flags.rendezvous, "--rendezvous", {"DPKIT_RENDEZVOUS"}, env);
  const auto rank = launch_pick(flags.rank, "--rank", {"DPKIT_RANK", "RANK"}, env);
  const auto world = launch_pick(flags.world_size, "--world-size", {"DPKIT_WORLD_SIZE", "WORLD_SIZE"}, env);
  if (!url && !rank && !world) return std::nullopt;
  const std::string contract =
      " (flags --rendezvous URL --rank R --world-size W, or the torch.distributed env:// variables MASTER_ADDR, "
      "MASTER_PORT, RANK, WORLD_SIZE)";
  const char* addr = env("MASTER_ADDR");
  const char* port = env("MASTER_PORT");
  launch_info l;
  if (url) {
    l.rendezvous = url->text;
  } else if (addr && port) {
    const std::string a = addr;
    const auto p = detail::parse_launch_int(port);
    if (a.empty()) throw invalid_argument("launch: MASTER_ADDR is empty" + contract);
    if (!p || *p < 1 || *p > 65535)
      throw invalid_argument("launch: MASTER_PORT='" + std::string(port) + "' is not a port number in 1-65535");
    const bool v6 = a.find(':') != std::string::npos && a.front() != '[';
    l.rendezvous = "tcp://" + (v6 ? "[" + a + "]" : a) + ":" + std::to_string(*p);
  } else {
    const std::string have = rank ? rank->name + "='" + rank->text + "'" : world->name + "='" + world->text + "'";
    throw invalid_argument("launch: " + have + " is given but no rendezvous: " +
                           (addr ? std::string("MASTER_PORT is not set")
                            : port ? std::string("MASTER_ADDR is not set")
                                   : std::string("neither --rendezvous nor DPKIT_RENDEZVOUS nor MASTER_ADDR and "
                                                 "MASTER_PORT")) +
                           contract);
  }
  const std::string via = url ? url->name + "='" + url->text + "'" : "MASTER_ADDR/MASTER_PORT";
  if (!rank) throw invalid_argument("launch: " + via + " is given but no rank (--rank, DPKIT_RANK or RANK)" + contract);
  if (!world)
    throw invalid_argument("launch: " + via + " is given but no world size (--world-size, DPKIT_WORLD_SIZE or "
                           "WORLD_SIZE)" + contract);
  try {
    (void)detail::parse_gloo_store_url(l.rendezvous);
  } catch (const invalid_argument& e) {
    throw invalid_argument("launch: " + via + ": " + e.what());
  }
  l.world_size = detail::launch_int(*world);
  if (l.world_size < 1) throw invalid_argument("launch: " + world->name + "='" + world->text + "': the world size must be >= 1");
  l.rank = detail::launch_int(*rank);
  if (l.rank >= l.world_size)
    throw invalid_argument("launch: " + rank->name + "='" + rank->text + "' is out of range for world size " +
                           std::to_string(l.world_size) + " (" + world->name + "; ranks are 0.." +
                           std::to_string(l.world_size - 1) + ")");
  const char* lr = env("LOCAL_RANK");
  const char* lw = env("LOCAL_WORLD_SIZE");
  if (lw) {
    l.local_world_size = detail::launch_int({lw, "LOCAL_WORLD_SIZE"});
    if (l.local_world_size < 1 || l.local_world_size > l.world_size)
      throw invalid_argument("launch: LOCAL_WORLD_SIZE='" + std::string(lw) + "' is out of range 1.." +
                             std::to_string(l.world_size) + " (the world size) on rank " + std::to_string(l.rank));
  }
  if (lr) {
    l.local_rank = detail::launch_int({lr, "LOCAL_RANK"});
    const int bound = l.local_world_size > 0 ? l.local_world_size : l.world_size;
    if (l.local_rank >= bound)
      throw invalid_argument("launch: LOCAL_RANK='" + std::string(lr) + "' is out of range for " +
                             (l.local_world_size > 0 ? "LOCAL_WORLD_SIZE " : "world size ") + std::to_string(bound) +
                             " on rank " + std::to_string(l.rank));
  }
  return l;
}

/// resolve_launch without flags: the launch the environment describes
/// (torch.distributed env:// init method, or DPKIT_RENDEZVOUS / DPKIT_RANK /
/// DPKIT_WORLD_SIZE), or nullopt. Throws as resolve_launch.
inline std::optional<launch_info> launch_from_env(const env_lookup& env = process_env) {
  return resolve_launch(launch_flags{}, env);
}

/// Joins the job `l` describes: opens its store (for tcp://, rank 0 starts
/// the server in this process and every rank connects to it, retrying until
/// o.timeout while rank 0 starts) and builds a gloo_transport of
/// l.world_size ranks through it (a collective call of every rank). When
/// the rendezvous is a tcp:// store on a loopback address (127.x, ::1,
/// localhost) and neither o.hostname, o.iface nor GLOO_SOCKET_IFNAME says
/// where to listen, the ranks connect to each other over 127.0.0.1 too
/// (they are all on this machine: they reach rank 0's loopback). The store stays open as long as
/// the transport (rank 0's serves every rank's later splits): rank 0 must
/// not destroy its transport while the others still split theirs.
/// @throws dpkit::invalid_argument for a bad URL, rank or world size;
///         dpkit::timeout_error naming the store when rank 0's server does not
///         answer, or the ranks do not all arrive, within o.timeout;
///         dpkit::error when rank 0 cannot listen on the port, the store or
///         the network cannot be used (as gloo_transport's constructor).
inline gloo_transport connect_launch(const launch_info& l, gloo_options o = {}) {
  if (l.world_size < 1)
    throw invalid_argument("connect_launch: world size must be >= 1, got " + std::to_string(l.world_size));
  if (l.rank < 0 || l.rank >= l.world_size)
    throw invalid_argument("connect_launch: rank " + std::to_string(l.rank) + " out of range for world size " +
                           std::to_string(l.world_size));
  const auto u = detail::parse_gloo_store_url(l.rendezvous);
  if (u.tcp && o.hostname.empty() && o.iface.empty() && !std::getenv("GLOO_SOCKET_IFNAME") &&
      (detail::tcp_store_io::loopback_literal(u.host) || u.host == "localhost"))
    o.hostname = "127.0.0.1";
  std::string prefix;
  std::shared_ptr<detail::kv_store> store = detail::open_kv_store(
      l.rendezvous, "connect_launch: rank " + std::to_string(l.rank) + " of " + std::to_string(l.world_size), o.timeout,
      prefix, l.rank);
  return gloo_transport(std::move(store), prefix, l.rank, l.world_size, o);
}

} // namespace dpkit
