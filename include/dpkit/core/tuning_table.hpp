/// @file tuning_table.hpp
/// @brief The all-reduce tuning table: which algorithm `algorithm::automatic`
/// runs for a message size on a given shape of transport (ranks, nodes,
/// ranks per node). `allreduce_perf --tune FILE` measures every algorithm
/// per size on the machine or cluster at hand and writes a table;
/// DPKIT_TUNING_FILE names the table `automatic` reads; rules it lacks fall
/// back to dpkit's built-in ones (the thresholds measured on the reference
/// machine, docs/tuning.md). The role of NCCL's tuner plugin and of Open
/// MPI's coll_tuned_dynamic_rules_filename. In core because both layers read
/// it: the collectives (which algorithm `automatic` runs: collectives/tuning.hpp
/// chooses from it) and dpkit::mpi (its `fragment inter` line).
///
/// File format (text, one rule per line, the first matching rule wins):
/// @code
/// dpkit-tuning 1
/// # collective ranks nodes local from_bytes to_bytes algorithm  # comment
/// allreduce 4 2 2 0 64K hier      # us: hier 41.2 ring 88.0 tree 63.1 native 52.9
/// allreduce * 1 3- 64K inf shm2
/// link inter 21.5 0.512           # alpha us, beta ns per byte (cost model)
/// reduce 0.11                      # ns per byte of a local reduction (cost model)
/// @endcode
/// ranks, nodes and local (the largest node's rank count) are `*`, `N`,
/// `N-` or `N-M`; sizes are bytes with an optional K, M or G suffix (powers
/// of 1024), `inf` for no bound; a rule covers [from_bytes, to_bytes). The
/// algorithms: ring, tree, shm1 (one-shot), shm2 (two-shot), shm (one- or
/// two-shot by the built-in threshold), hier, native. A rule whose
/// algorithm the transport cannot run (no shared segment, one node, no
/// native collectives) is passed over. `link intra|inter ALPHA_US BETA_NS`
/// lines hold the measured link costs of the cost model (cost_model.hpp).
/// `fragment inter BYTES` (0: off) is the size dpkit::mpi splits messages
/// to ranks on other nodes into (see inter_fragment_bytes); the tuner writes
/// it when fragments were measured faster than whole messages.
#pragma once

#include "algorithm.hpp"
#include "errors.hpp"

#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dpkit {

/// The shape of a transport a tuning rule applies to.
struct tuning_key {
  int ranks = 1;     ///< world size
  int nodes = 1;     ///< number of nodes
  int max_local = 1; ///< ranks on the largest node
  friend bool operator==(const tuning_key&, const tuning_key&) = default;
};

/// What the transport can run now (a rule naming something else is passed over).
struct tuning_availability {
  bool shm = false;          ///< a shared segment (one node, host tensors)
  bool hierarchical = false; ///< several nodes, some with several ranks (node_topology::hierarchical)
  bool native = false;       ///< native collectives (MPI_Allreduce)
};

/// Measured cost of one link class: a message of b bytes takes alpha + b x beta.
struct link_cost {
  double alpha_us = 0;          ///< latency, microseconds
  double beta_ns_per_byte = 0;  ///< inverse bandwidth, nanoseconds per byte
  bool valid = false;
  friend bool operator==(const link_cost&, const link_cost&) = default;
};

/// One rule of a tuning table.
struct tuning_rule {
  int ranks_min = 1, ranks_max = INT_MAX;
  int nodes_min = 1, nodes_max = INT_MAX;
  int local_min = 1, local_max = INT_MAX;
  std::size_t min_bytes = 0;                                  ///< inclusive
  std::size_t max_bytes = std::numeric_limits<std::size_t>::max(); ///< exclusive (max: no bound)
  algorithm algo = algorithm::ring;
  bool shm_by_size = false; ///< "shm": one- or two-shot by the built-in threshold
  int line = 0;             ///< line in its file (0: made in code)
  std::string comment;      ///< what follows '#' (the tuner writes its measurements there)
  /// True when the rule applies to key k and a message of `bytes` bytes.
  bool matches(const tuning_key& k, std::size_t bytes) const noexcept {
    return k.ranks >= ranks_min && k.ranks <= ranks_max && k.nodes >= nodes_min && k.nodes <= nodes_max &&
           k.max_local >= local_min && k.max_local <= local_max && bytes >= min_bytes && bytes < max_bytes;
  }
};

namespace detail {
inline std::string tuning_range_str(int lo, int hi) {
  if (lo <= 1 && hi == INT_MAX) return "*";
  if (hi == INT_MAX) return std::to_string(lo) + "-";
  if (lo == hi) return std::to_string(lo);
  return std::to_string(lo) + "-" + std::to_string(hi);
}
inline std::string tuning_bytes_str(std::size_t b) {
  if (b == std::numeric_limits<std::size_t>::max()) return "inf";
  if (b >= (std::size_t{1} << 30) && b % (std::size_t{1} << 30) == 0) return std::to_string(b >> 30) + "G";
  if (b >= (std::size_t{1} << 20) && b % (std::size_t{1} << 20) == 0) return std::to_string(b >> 20) + "M";
  if (b >= (std::size_t{1} << 10) && b % (std::size_t{1} << 10) == 0) return std::to_string(b >> 10) + "K";
  return std::to_string(b);
}
inline std::string tuning_algo_str(const tuning_rule& r) {
  if (r.algo == algorithm::shm && r.shm_by_size) return "shm";
  switch (r.algo) {
  case algorithm::shm_one_shot: return "shm1";
  case algorithm::shm_two_shot: return "shm2";
  default: return std::string(algorithm_name(r.algo));
  }
}
} // namespace detail

/// A tuning table (regular value type): rules in order, the first matching
/// one wins; link costs for the cost model.
class tuning_table {
public:
  std::vector<tuning_rule> rules; ///< in order of precedence
  link_cost intra, inter;         ///< link costs, when measured
  double reduce_ns_per_byte = 0;  ///< measured local reduction cost (0: not measured)
  /// Fragment size in bytes of dpkit::mpi's messages to ranks on other nodes
  /// (`fragment inter BYTES`): a message longer than this goes as several
  /// MPI messages of at most this size, all posted at once. nullopt: the
  /// file does not say (dpkit::mpi then sends whole messages); 0: whole
  /// messages. Measured by allreduce_perf --tune: on Open MPI's tcp btl a
  /// message above its eager limit (64 KiB) takes the rendezvous protocol,
  /// and two such messages crossing one link in opposite directions moved at
  /// half the rate of one direction on the emulated cluster, where messages
  /// below the limit kept both directions at full rate
  /// (benchmarks/results/2026-11-26-cluster-fragments.md).
  std::optional<std::size_t> inter_fragment_bytes;
  std::string origin = "(in memory)"; ///< the file it came from, or "built-in"
  std::vector<std::string> header; ///< the file's comment lines before the first rule (how it was made)

  /// Parses the text of a tuning file; `origin` names it in errors.
  /// @throws dpkit::format_error "origin:line: ..." naming the bad field, for
  ///         a missing or unknown version line, an unknown collective or
  ///         algorithm, a malformed range or size, from >= to.
  static tuning_table parse(std::string_view text, const std::string& origin) {
    tuning_table t;
    t.origin = origin;
    std::size_t pos = 0;
    int line_no = 0;
    bool version_seen = false;
    while (pos <= text.size()) {
      std::size_t eol = text.find('\n', pos);
      if (eol == std::string_view::npos) eol = text.size();
      std::string_view line = text.substr(pos, eol - pos);
      pos = eol + 1;
      ++line_no;
      std::string comment;
      if (const auto h = line.find('#'); h != std::string_view::npos) {
        comment = trim(line.substr(h + 1));
        line = line.substr(0, h);
      }
      std::vector<std::string_view> f = split(line);
      auto bad = [&](const std::string& what) -> format_error {
        return format_error("tuning file " + origin + ":" + std::to_string(line_no) + ": " + what);
      };
      if (f.empty()) {
        if (!comment.empty() && t.rules.empty()) t.header.push_back(comment);
        if (eol == text.size()) break;
        continue;
      }
      if (!version_seen) {
        if (f.size() != 2 || f[0] != "dpkit-tuning")
          throw bad("expected the version line 'dpkit-tuning 1' first, got '" + std::string(line) + "'");
        if (f[1] != "1") throw bad("version " + std::string(f[1]) + " is not supported (this dpkit reads version 1)");
        version_seen = true;
        continue;
      }
      if (f[0] == "reduce") {
        if (f.size() != 2) throw bad("expected 'reduce NS_PER_BYTE', got '" + std::string(line) + "'");
        t.reduce_ns_per_byte = number(f[1], bad, "reduce");
        continue;
      }
      if (f[0] == "fragment") {
        if (f.size() != 3 || f[1] != "inter")
          throw bad("expected 'fragment inter BYTES', got '" + std::string(line) + "'");
        const std::size_t b = bytes(f[2], bad, "fragment");
        if (b != 0 && (b < 4096 || b > (std::size_t{1} << 30)))
          throw bad("fragment '" + std::string(f[2]) + "' is out of range (0 for whole messages, or 4K to 1G)");
        t.inter_fragment_bytes = b;
        continue;
      }
      if (f[0] == "link") {
        if (f.size() != 4 || (f[1] != "intra" && f[1] != "inter"))
          throw bad("expected 'link intra|inter ALPHA_US BETA_NS_PER_BYTE', got '" + std::string(line) + "'");
        link_cost c{number(f[2], bad, "alpha"), number(f[3], bad, "beta"), true};
        (f[1] == "intra" ? t.intra : t.inter) = c;
        continue;
      }
      if (f[0] != "allreduce") throw bad("unknown collective '" + std::string(f[0]) + "' (this dpkit tunes allreduce)");
      if (f.size() != 7)
        throw bad("expected 'allreduce RANKS NODES LOCAL FROM_BYTES TO_BYTES ALGORITHM', got " +
                  std::to_string(f.size()) + " fields");
      tuning_rule r;
      r.line = line_no;
      r.comment = comment;
      range(f[1], r.ranks_min, r.ranks_max, bad, "ranks");
      range(f[2], r.nodes_min, r.nodes_max, bad, "nodes");
      range(f[3], r.local_min, r.local_max, bad, "local");
      r.min_bytes = bytes(f[4], bad, "from_bytes");
      r.max_bytes = bytes(f[5], bad, "to_bytes");
      if (r.min_bytes >= r.max_bytes)
        throw bad("from_bytes " + std::string(f[4]) + " is not below to_bytes " + std::string(f[5]));
      const std::string a(f[6]);
      if (a == "shm1") r.algo = algorithm::shm_one_shot;
      else if (a == "shm2") r.algo = algorithm::shm_two_shot;
      else if (a == "shm") {
        r.algo = algorithm::shm;
        r.shm_by_size = true;
      } else {
        try {
          r.algo = parse_algorithm(a);
        } catch (const invalid_argument&) {
          throw bad("unknown algorithm '" + a + "' (ring, tree, shm, shm1, shm2, hier, native)");
        }
        if (r.algo == algorithm::automatic) throw bad("a rule must name an algorithm, not automatic");
      }
      t.rules.push_back(std::move(r));
    }
    if (!version_seen) throw format_error("tuning file " + origin + ": empty (no 'dpkit-tuning 1' line)");
    return t;
  }

  /// Reads and parses the tuning file at `path`.
  /// @throws dpkit::error if it cannot be read; dpkit::format_error if damaged.
  static tuning_table load(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw error("tuning file " + path + ": cannot be read: " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw error("tuning file " + path + ": read failed");
    const std::string text = ss.str();
    if (text.find('\0') != std::string::npos) throw format_error("tuning file " + path + ": binary data (not a tuning file)");
    return parse(text, path);
  }

  /// dpkit's built-in rules: the hand thresholds measured on the reference
  /// machine (docs/tuning.md, benchmarks/results/): one node: the shared-
  /// memory one-shot up to 256 KiB on two ranks and 64 KiB on three or more,
  /// two-shot above; across nodes: hierarchical; otherwise tree below 4 KiB
  /// (below 64 KiB from four ranks), ring above.
  static const tuning_table& builtin() {
    static const tuning_table t = parse(builtin_text(), "built-in");
    return t;
  }
  /// The built-in rules as a tuning file.
  static std::string_view builtin_text() noexcept {
    return "dpkit-tuning 1\n"
           "allreduce * 1 2 0 256K shm1    # one node, 2 ranks: one-shot to 256 KiB\n"
           "allreduce * 1 2 256K inf shm2\n"
           "allreduce * 1 3- 0 64K shm1    # one node, 3+ ranks: one-shot to 64 KiB\n"
           "allreduce * 1 3- 64K inf shm2\n"
           "allreduce * 2- 2- 0 inf hier   # several nodes, some with several ranks\n"
           "allreduce * * * 0 4K tree\n"
           "allreduce 4- * * 4K 64K tree\n"
           "allreduce * * * 0 inf ring\n";
  }

  /// The table in the file format (parse(str()) gives an equal table).
  std::string str() const {
    std::string s = "dpkit-tuning 1\n";
    for (const auto& h : header) s += "# " + h + "\n";
    s += "# collective ranks nodes local from_bytes to_bytes algorithm\n";
    for (const auto& r : rules) {
      s += "allreduce " + detail::tuning_range_str(r.ranks_min, r.ranks_max) + " " +
           detail::tuning_range_str(r.nodes_min, r.nodes_max) + " " +
           detail::tuning_range_str(r.local_min, r.local_max) + " " + detail::tuning_bytes_str(r.min_bytes) + " " +
           detail::tuning_bytes_str(r.max_bytes) + " " + detail::tuning_algo_str(r);
      if (!r.comment.empty()) s += "  # " + r.comment;
      s += "\n";
    }
    auto link = [&](const char* name, const link_cost& c) {
      if (!c.valid) return;
      std::ostringstream os;
      os.precision(6);
      os << "link " << name << " " << c.alpha_us << " " << c.beta_ns_per_byte
         << "  # alpha us, beta ns per byte\n";
      s += os.str();
    };
    link("intra", intra);
    link("inter", inter);
    if (inter_fragment_bytes)
      s += "fragment inter " + std::to_string(*inter_fragment_bytes) +
           "  # bytes per message to another node (0: whole messages)\n";
    if (reduce_ns_per_byte > 0) {
      std::ostringstream os;
      os.precision(6);
      os << "reduce " << reduce_ns_per_byte << "  # ns per byte of a local float sum\n";
      s += os.str();
    }
    return s;
  }

  /// Writes the table to `path` atomically: a temporary file beside it,
  /// fsynced, renamed over it (never a half-written file). An existing file
  /// is replaced only if it is a tuning file (starts with "dpkit-tuning").
  /// @throws dpkit::error naming the path (cannot write, or it exists and is
  ///         not a tuning file).
  void save(const std::string& path) const {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      std::ifstream in(path, std::ios::binary);
      std::string first(12, '\0');
      in.read(first.data(), 12);
      if (!S_ISREG(st.st_mode) || first != "dpkit-tuning")
        throw error("tuning file " + path + ": exists and is not a dpkit tuning file; not overwriting it");
    }
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) throw error("tuning file " + path + ": cannot create " + tmp + ": " + std::strerror(errno));
    const std::string text = str();
    std::size_t done = 0;
    bool ok = true;
    while (done < text.size()) {
      const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        ok = false;
        break;
      }
      done += static_cast<std::size_t>(w);
    }
    const int err = errno;
    ok = ok && ::fsync(fd) == 0;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
      const int e = ok ? errno : err;
      ::unlink(tmp.c_str());
      throw error("tuning file " + path + ": cannot write: " + std::strerror(e));
    }
  }

  /// The first rule of this table that matches key k and `bytes` and whose
  /// algorithm `avail` allows, or nullptr.
  const tuning_rule* find(const tuning_key& k, std::size_t bytes, const tuning_availability& avail) const noexcept {
    for (const auto& r : rules)
      if (r.matches(k, bytes) && allowed(r.algo, avail)) return &r;
    return nullptr;
  }
  /// True when a transport with `avail` can run algorithm a.
  static bool allowed(algorithm a, const tuning_availability& avail) noexcept {
    switch (a) {
    case algorithm::shm: case algorithm::shm_one_shot: case algorithm::shm_two_shot: return avail.shm;
    case algorithm::hierarchical: return avail.hierarchical;
    case algorithm::native: return avail.native;
    case algorithm::automatic: return false;
    default: return true;
    }
  }
  friend bool operator==(const tuning_table& a, const tuning_table& b) {
    if (a.rules.size() != b.rules.size() || !(a.intra == b.intra) || !(a.inter == b.inter) ||
        a.reduce_ns_per_byte != b.reduce_ns_per_byte || a.inter_fragment_bytes != b.inter_fragment_bytes)
      return false;
    for (std::size_t i = 0; i < a.rules.size(); ++i) {
      const auto &x = a.rules[i], &y = b.rules[i];
      if (x.ranks_min != y.ranks_min || x.ranks_max != y.ranks_max || x.nodes_min != y.nodes_min ||
          x.nodes_max != y.nodes_max || x.local_min != y.local_min || x.local_max != y.local_max ||
          x.min_bytes != y.min_bytes || x.max_bytes != y.max_bytes || x.algo != y.algo ||
          x.shm_by_size != y.shm_by_size)
        return false;
    }
    return true;
  }

private:
  static std::string trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return std::string(s);
  }
  static std::vector<std::string_view> split(std::string_view s) {
    std::vector<std::string_view> f;
    std::size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) ++i;
      const std::size_t b = i;
      while (i < s.size() && s[i] != ' ' && s[i] != '\t' && s[i] != '\r') ++i;
      if (i > b) f.push_back(s.substr(b, i - b));
    }
    return f;
  }
  template <class Bad>
  static long long integer(std::string_view s, Bad& bad, const char* what) {
    if (s.empty() || s.size() > 18) throw bad(std::string(what) + " '" + std::string(s) + "' is not a number");
    long long v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') throw bad(std::string(what) + " '" + std::string(s) + "' is not a number");
      v = v * 10 + (c - '0');
    }
    return v;
  }
  template <class Bad>
  static void range(std::string_view s, int& lo, int& hi, Bad& bad, const char* what) {
    lo = 1;
    hi = INT_MAX;
    if (s == "*") return;
    const auto dash = s.find('-');
    auto one = [&](std::string_view x) {
      const long long v = integer(x, bad, what);
      if (v < 1 || v > INT_MAX) throw bad(std::string(what) + " '" + std::string(x) + "' is out of range (>= 1)");
      return static_cast<int>(v);
    };
    if (dash == std::string_view::npos) {
      lo = hi = one(s);
      return;
    }
    lo = one(s.substr(0, dash));
    if (dash + 1 < s.size()) hi = one(s.substr(dash + 1));
    if (lo > hi) throw bad(std::string(what) + " range '" + std::string(s) + "' is empty");
  }
  template <class Bad>
  static std::size_t bytes(std::string_view s, Bad& bad, const char* what) {
    if (s == "inf") return std::numeric_limits<std::size_t>::max();
    std::size_t mult = 1;
    if (!s.empty()) {
      const char u = s.back();
      if (u == 'K' || u == 'k') mult = std::size_t{1} << 10;
      else if (u == 'M' || u == 'm') mult = std::size_t{1} << 20;
      else if (u == 'G' || u == 'g') mult = std::size_t{1} << 30;
      if (mult != 1) s.remove_suffix(1);
    }
    const long long v = integer(s, bad, what);
    if (static_cast<unsigned long long>(v) > std::numeric_limits<std::size_t>::max() / mult)
      throw bad(std::string(what) + " '" + std::string(s) + "' overflows");
    return static_cast<std::size_t>(v) * mult;
  }
  template <class Bad>
  static double number(std::string_view s, Bad& bad, const char* what) {
    const std::string x(s);
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(x.c_str(), &end);
    if (x.empty() || end != x.c_str() + x.size() || errno != 0 || !(v >= 0) || v > 1e12)
      throw bad(std::string(what) + " '" + x + "' is not a non-negative number");
    return v;
  }
};

namespace detail {
/// The table of DPKIT_TUNING_FILE, loaded at most once per process (the
/// tuning of a job does not change while it runs; every rank must see the
/// same file); nullptr when the variable is unset or empty.
/// @throws dpkit::error / dpkit::format_error when it is set but cannot be
///         read or parsed (at every call: a bad file is never ignored).
inline const tuning_table* env_tuning() {
  struct loaded {
    std::optional<tuning_table> table;
    std::string error;
    bool format = false;
  };
  static const loaded l = [] {
    loaded r;
    const char* p = std::getenv("DPKIT_TUNING_FILE");
    if (!p || !*p) return r;
    try {
      r.table = tuning_table::load(p);
    } catch (const format_error& e) {
      r.error = std::string(e.what()) + " (DPKIT_TUNING_FILE)";
      r.format = true;
    } catch (const std::exception& e) {
      r.error = std::string(e.what()) + " (DPKIT_TUNING_FILE)";
    }
    return r;
  }();
  if (!l.error.empty()) {
    if (l.format) throw format_error(l.error);
    throw error(l.error);
  }
  return l.table ? &*l.table : nullptr;
}
} // namespace detail

} // namespace dpkit
