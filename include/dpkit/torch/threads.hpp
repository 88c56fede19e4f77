/// @file threads.hpp
/// @brief `size_torch_threads`: libtorch's intra-op and inter-op thread pools
/// sized to the CPUs this process may run on, shared among the processes of
/// the node that run on the same CPUs, with a warning when they are
/// oversubscribed. Needs libtorch (Meson feature `torch`); never included by
/// dpkit/dpkit.hpp.
///
/// libtorch sizes its intra-op pool to the machine's cores (OpenMP's
/// default, or OMP_NUM_THREADS), whatever CPUs the process is allowed. Under
/// `mpirun`, which binds each of 2 ranks to one core by default, or with
/// several unbound ranks on one node, that puts several compute threads on
/// each CPU, and every parallel kernel then waits for threads that are not
/// running: steps several times slower, with no error. A program should not
/// depend on its user knowing `--bind-to none` or OMP_NUM_THREADS, so:
///
/// @code
/// MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
/// dpkit::mpi comm(MPI_COMM_WORLD);
/// auto t = dpkit::size_torch_threads(comm);   // collective; before any torch work
/// // t.intra_op threads per rank; one warning line on stderr if oversubscribed
/// @endcode
///
/// The rule: a process that is not asked for a number of threads (by the
/// options or by OMP_NUM_THREADS) gets max(1, c / k) intra-op threads, c the
/// CPUs of its affinity mask (dpkit::usable_cpus), k the processes of its
/// node whose masks overlap its own (itself included; from an exchange over
/// the transport, or given). Two ranks bound to a core each: 1 thread each;
/// two unbound ranks on 16 cores: 8 each. It is oversubscribed when the
/// intra-op threads of the processes sharing its CPUs exceed the CPUs of
/// their masks together; that happens only when threads were asked for, or
/// when there are more processes than CPUs. Threads dpkit starts itself (a
/// transport's communication thread) are not counted: they mostly wait.
#pragma once

#include "../collectives/allgather.hpp"
#include "../core/cpus.hpp"
#include "../core/errors.hpp"
#include "../transport/concept.hpp"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace dpkit {

/// Options of size_torch_threads (a regular aggregate).
struct torch_threads_options {
  /// Intra-op threads this process asks for. 0 (default): OMP_NUM_THREADS
  /// when the environment sets it to a positive integer, else the rule above
  /// (the affinity mask's CPUs divided among the processes sharing them).
  int intra_op_threads = 0;
  /// For the overload without a transport: the processes (this one
  /// included) that run on this process's CPUs; 0 or 1: this one alone. The
  /// overload with a transport counts them and ignores this.
  int ranks_sharing_cpus = 0;
  /// Also set the inter-op pool to the intra-op size. libtorch allows that
  /// once per process, before the pool has started; later calls leave it as
  /// it is (torch_threads_result::inter_op_set is then false).
  bool inter_op = true;
  /// Where the warning line goes; nullptr: nowhere (the result carries it
  /// either way). With a transport, of the ranks sharing some CPUs only the
  /// lowest oversubscribed one writes it: one line per group, not per rank.
  std::FILE* warn = stderr;
  bool operator==(const torch_threads_options&) const = default;
};

/// What size_torch_threads found and did.
struct torch_threads_result {
  std::vector<int> cpus;       ///< this process's affinity mask, CPU numbers
  int ranks_sharing = 1;       ///< processes of this node whose masks overlap this one's, itself included
  int requested = 0;           ///< intra-op threads asked for (options, else OMP_NUM_THREADS); 0: none
  int intra_op = 0;            ///< at::get_num_threads() afterwards
  int inter_op = 0;            ///< at::get_num_interop_threads() afterwards
  bool inter_op_set = false;   ///< the inter-op pool was sized here (false: libtorch refused, or options.inter_op off)
  int threads_on_cpus = 0;     ///< intra-op threads of all processes sharing this one's CPUs
  int cpus_shared = 0;         ///< CPUs of those processes' masks together
  bool oversubscribed = false; ///< threads_on_cpus > cpus_shared
  std::string warning;         ///< the warning line (no newline); empty unless oversubscribed
};

namespace detail {

/// One process's claim on the CPUs of its node.
struct thread_claim {
  std::vector<int> cpus; ///< affinity mask, CPU numbers in increasing order
  int requested = 0;     ///< intra-op threads asked for; 0: none
};

/// Process `self`'s share of its node (`node`: every process of the node,
/// `self` among them): the processes whose masks overlap its own, the
/// threads it gets, and the threads and CPUs of those processes together.
struct thread_share {
  int sharers = 1, threads = 1, load = 1, capacity = 1;
};

inline bool cpus_overlap(const std::vector<int>& a, const std::vector<int>& b) {
  auto i = a.begin();
  auto j = b.begin();
  while (i != a.end() && j != b.end()) {
    if (*i == *j) return true;
    if (*i < *j) ++i;
    else ++j;
  }
  return false;
}

inline int sharers_of(const std::vector<thread_claim>& node, std::size_t p) {
  int k = 0;
  for (const auto& q : node) k += cpus_overlap(node[p].cpus, q.cpus) ? 1 : 0;
  return std::max(k, 1);
}

inline int threads_of(const std::vector<thread_claim>& node, std::size_t p) {
  if (node[p].requested > 0) return node[p].requested;
  return std::max(1, static_cast<int>(node[p].cpus.size()) / sharers_of(node, p));
}

inline thread_share plan_thread_share(const std::vector<thread_claim>& node, std::size_t self) {
  thread_share s;
  s.sharers = sharers_of(node, self);
  s.threads = threads_of(node, self);
  s.load = 0;
  std::vector<int> all;
  for (std::size_t p = 0; p < node.size(); ++p) {
    if (!cpus_overlap(node[self].cpus, node[p].cpus)) continue;
    s.load += threads_of(node, p);
    all.insert(all.end(), node[p].cpus.begin(), node[p].cpus.end());
  }
  std::sort(all.begin(), all.end());
  s.capacity = std::max(1, static_cast<int>(std::unique(all.begin(), all.end()) - all.begin()));
  s.load = std::max(s.load, s.threads);
  return s;
}

/// A positive integer from OMP_NUM_THREADS (its first list element), else 0.
inline int omp_num_threads_env() {
  const char* s = std::getenv("OMP_NUM_THREADS");
  if (!s || !*s) return 0;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || (*end != '\0' && *end != ',') || v <= 0 || v > 1 << 20) return 0;
  return static_cast<int>(v);
}

/// 64-bit FNV-1a of the host name and the kernel's boot id: equal for the
/// processes of one node (one kernel), different across nodes.
inline std::uint64_t node_id() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string key(host);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (boot) std::getline(boot, id);
  key += '\n' + id;
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  return h;
}

/// Applies `share` to libtorch and fills the result; the warning is written
/// when `write_warning`.
inline torch_threads_result apply_torch_threads(const thread_claim& self, const thread_share& share,
                                                const torch_threads_options& o, bool write_warning) {
  torch_threads_result r;
  r.cpus = self.cpus;
  r.ranks_sharing = share.sharers;
  r.requested = self.requested;
  r.threads_on_cpus = share.load;
  r.cpus_shared = share.capacity;
  at::set_num_threads(share.threads);
  if (o.inter_op) {
    try {
      at::set_num_interop_threads(share.threads);
      r.inter_op_set = true;
    } catch (const c10::Error&) {
      r.inter_op_set = false; // started already, or set before: libtorch keeps its size
    }
  }
  r.intra_op = at::get_num_threads();
  r.inter_op = at::get_num_interop_threads();
  r.oversubscribed = share.load > share.capacity;
  if (r.oversubscribed) {
    r.warning = "dpkit: torch threads oversubscribed: " + std::to_string(share.sharers) +
                (share.sharers == 1 ? " process runs " : " processes run ") + std::to_string(share.load) +
                " intra-op threads on " + std::to_string(share.capacity) + " CPU" + (share.capacity == 1 ? "" : "s") +
                " (this process: " + std::to_string(r.intra_op) + " on CPU" + (self.cpus.size() == 1 ? " " : "s ") +
                cpu_list_string(self.cpus) +
                (self.requested > 0 ? ", asked for " + std::to_string(self.requested) : std::string()) +
                "); parallel work will wait for descheduled threads: run fewer threads (OMP_NUM_THREADS) or "
                "ranks per node, or give each process more CPUs";
    if (write_warning && o.warn) {
      std::fprintf(o.warn, "%s\n", r.warning.c_str());
      std::fflush(o.warn);
    }
  }
  return r;
}

inline thread_claim own_claim(const torch_threads_options& o) {
  thread_claim c;
  c.cpus = usable_cpus();
  if (c.cpus.empty()) // mask unreadable: the machine's CPUs
    for (unsigned i = 0; i < usable_cpu_count(); ++i) c.cpus.push_back(static_cast<int>(i));
  c.requested = o.intra_op_threads > 0 ? o.intra_op_threads : omp_num_threads_env();
  return c;
}

} // namespace detail

/// Sizes libtorch's thread pools for this process alone (or with
/// `o.ranks_sharing_cpus` processes on the same CPUs): intra-op threads =
/// the request (o.intra_op_threads, else OMP_NUM_THREADS), else max(1, the
/// CPUs of the calling thread's affinity mask / ranks_sharing_cpus); the
/// inter-op pool the same when libtorch still allows it. Writes one warning
/// line to `o.warn` when the threads exceed the CPUs (see the file comment).
/// at::set_num_threads is process-wide, but with OpenMP a thread that has
/// already run torch work keeps its old team size: call it on the thread
/// that runs the model, before its first torch operation.
/// @returns what it found and set (every count in threads or in CPUs).
/// @throws dpkit::invalid_argument for a negative o.intra_op_threads or
///         o.ranks_sharing_cpus.
inline torch_threads_result size_torch_threads(const torch_threads_options& o = {}) {
  if (o.intra_op_threads < 0 || o.ranks_sharing_cpus < 0)
    throw invalid_argument("size_torch_threads: intra_op_threads " + std::to_string(o.intra_op_threads) +
                           " and ranks_sharing_cpus " + std::to_string(o.ranks_sharing_cpus) +
                           " must not be negative");
  const detail::thread_claim self = detail::own_claim(o);
  const std::vector<detail::thread_claim> node(static_cast<std::size_t>(std::max(1, o.ranks_sharing_cpus)), self);
  return detail::apply_torch_threads(self, detail::plan_thread_share(node, 0), o, true);
}

/// As above, for every rank of `comm` at once (a collective: every rank
/// calls it, before its first torch operation): the ranks exchange their
/// node (host name and kernel boot id), affinity mask (CPUs below 4096) and
/// request over `comm` (one all-gather of 528 bytes per rank), so each rank
/// counts the ranks of its node whose masks overlap its own, whatever
/// binding the launcher used. The warning is written once per group of
/// ranks sharing CPUs, by the lowest oversubscribed rank among them;
/// o.ranks_sharing_cpus is ignored. Call it with the same options on every
/// rank: a rank that throws before the exchange leaves the others to their
/// deadline.
/// @throws dpkit::invalid_argument (negative o.intra_op_threads), and what
///         dpkit::allgather throws (dpkit::timeout_error, ...).
template <transport C>
torch_threads_result size_torch_threads(C& comm, const torch_threads_options& o = {}) {
  if (o.intra_op_threads < 0)
    throw invalid_argument("size_torch_threads: intra_op_threads " + std::to_string(o.intra_op_threads) +
                           " must not be negative");
  constexpr std::size_t mask_bytes = 512, record = 16 + mask_bytes; // node id, request, mask
  const detail::thread_claim self = detail::own_claim(o);
  std::vector<std::uint8_t> mine(record, 0), all(record * static_cast<std::size_t>(comm.size()), 0);
  const std::uint64_t node = detail::node_id();
  const std::int64_t req = self.requested;
  std::memcpy(mine.data(), &node, 8);
  std::memcpy(mine.data() + 8, &req, 8);
  for (int c : self.cpus)
    if (c >= 0 && static_cast<std::size_t>(c) < mask_bytes * 8)
      mine[16 + static_cast<std::size_t>(c) / 8] |= static_cast<std::uint8_t>(1u << (c % 8));
  allgather(comm, mine, all);

  std::vector<detail::thread_claim> claims;
  std::vector<int> ranks; // comm rank of each claim
  std::size_t self_index = 0;
  for (int r = 0; r < comm.size(); ++r) {
    const std::uint8_t* p = all.data() + record * static_cast<std::size_t>(r);
    std::uint64_t id = 0;
    std::int64_t q = 0;
    std::memcpy(&id, p, 8);
    std::memcpy(&q, p + 8, 8);
    if (id != node) continue;
    detail::thread_claim c;
    c.requested = static_cast<int>(q);
    for (std::size_t b = 0; b < mask_bytes * 8; ++b)
      if (p[16 + b / 8] & (1u << (b % 8))) c.cpus.push_back(static_cast<int>(b));
    if (r == comm.rank()) {
      self_index = claims.size();
      c.cpus = self.cpus; // exact, CPUs above 4095 included
    }
    claims.push_back(std::move(c));
    ranks.push_back(r);
  }
  const detail::thread_share share = detail::plan_thread_share(claims, self_index);
  // The warning is written by the lowest oversubscribed rank among those
  // sharing this rank's CPUs (every rank sees every claim of its node).
  bool first = true;
  for (std::size_t i = 0; i < claims.size(); ++i) {
    if (ranks[i] >= comm.rank() || !detail::cpus_overlap(claims[i].cpus, claims[self_index].cpus)) continue;
    const detail::thread_share other = detail::plan_thread_share(claims, i);
    if (other.load > other.capacity) first = false;
  }
  return detail::apply_torch_threads(self, share, o, first);
}

} // namespace dpkit
