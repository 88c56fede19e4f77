// dpkit benchmarks: everything a run prints or writes: nccl-tests' text
// output (header, table, footer; the same printf widths), the -I iteration
// statistics, the -A summary, and the CSV / JSON files. The runner
// (bench_runner.hpp) measures and hands over rows; nothing here communicates.
//
// Formats follow nccl-tests' src/common.cu:
//   "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg iters: %d validation: %d graph: %d"
//   "#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s"
//   row preamble "%12li  %12li  %8s  %6s  %6s" (root formatted "%6i" first),
//   each half "  %7s  %6.2f  %6.2f  %5g" (or "%5s" with "N/A" under -c 0),
//   time "%7.2f" below 100 us, "%7.1f" below 10000 us, "%7.0f" above;
//   "# Out of bounds values : %d %s" and "# Avg bus bandwidth    : %g %s".
#pragma once

#include "bench_options.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

extern char** environ; // POSIX: the environment the JSON "env" records

namespace dpkit_bench {

/// The -I summary of one half's per-iteration times (microseconds per op).
struct iteration_stats {
  double min = 0, max = 0;
  double p99 = 0; ///< nearest-rank 99th percentile: the ceil(0.99 n)-th smallest sample
  double cv = 0;  ///< coefficient of variation in percent: population standard deviation / mean x 100
  std::size_t samples = 0; ///< samples summarised (after -K)
};

/// Summarises `samples` (microseconds) after skipping the first `skip`
/// (nccl-tests' -K). With no sample left, every field is 0. A mean of 0 gives
/// cv 0.
inline iteration_stats summarize_iterations(std::span<const double> samples, std::size_t skip) {
  iteration_stats s;
  if (skip >= samples.size()) return s;
  std::vector<double> v(samples.begin() + static_cast<std::ptrdiff_t>(skip), samples.end());
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  s.samples = n;
  s.min = v.front();
  s.max = v.back();
  std::size_t rank = static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(n)));
  rank = std::clamp<std::size_t>(rank, 1, n);
  s.p99 = v[rank - 1];
  double sum = 0;
  for (double x : v) sum += x;
  const double mean = sum / static_cast<double>(n);
  double sq = 0;
  for (double x : v) sq += (x - mean) * (x - mean);
  const double sd = std::sqrt(sq / static_cast<double>(n));
  s.cv = mean > 0 ? sd / mean * 100.0 : 0.0;
  return s;
}

/// One half (out-of-place or in-place) of a table row.
struct half_result {
  double time_us = 0;      ///< per op, reduced across ranks with -a
  double algbw = 0;        ///< GB/s (1e9 B/s)
  double busbw = 0;        ///< GB/s
  std::int64_t wrong = -1; ///< summed over ranks; -1: not checked (-c 0)
  bool has_stats = false;  ///< -I: `stats` holds the per-iteration summary
  iteration_stats stats;
};

/// One table row: a (algorithm, size, type, op, root) point.
struct row_result {
  std::string algorithm;
  std::size_t bytes = 0; ///< the size column
  std::size_t count = 0; ///< the count column (elements per rank's buffer as nccl-tests)
  std::string type, redop;
  int root = -1;
  half_result oop, ip;
  /// allreduce_perf --floor (bench_floor.hpp): this size's memory floor in
  /// microseconds (every rank reads its input and writes its output once at
  /// the stream rate; NaN: not measured), the stream rate (GB/s per rank, all
  /// ranks at once), and the model's times if nothing stayed in the caches:
  /// direct, and the best without direct reads of the peers' buffers.
  double floor_us = std::numeric_limits<double>::quiet_NaN();
  double stream_gbps = 0;
  double uncached_direct_us = 0, uncached_segment_us = 0;
  std::string uncached_segment_algo;
};

/// Formats a time in microseconds as nccl-tests does (7 wide).
inline std::string format_time(double us) {
  char buf[64];
  if (us != us) std::snprintf(buf, sizeof buf, "%7s", "N/A"); // not measured (--skip-in-place)
  else if (us >= 10000.0) std::snprintf(buf, sizeof buf, "%7.0f", us);
  else if (us >= 100.0) std::snprintf(buf, sizeof buf, "%7.1f", us);
  else std::snprintf(buf, sizeof buf, "%7.2f", us);
  return buf;
}

/// The three column-header lines of the table; with `stats` (-I) each half
/// gains i_min i_max i_p99 (us) and i_cv% after #wrong.
inline void print_table_header(std::FILE* f, bool stats = false) {
  if (!stats) {
    std::fprintf(f, "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "",
                 "", "", "", "");
    std::fprintf(f, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type",
                 "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    std::fprintf(f, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "",
                 "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    return;
  }
  // A half is 32 columns wide, 67 with the statistics; the labels are centred.
  std::fprintf(f, "# %10s  %12s  %8s  %6s  %6s%27s%-40s%29s%-38s\n", "", "", "", "", "", "", "out-of-place", "",
               "in-place");
  for (int line = 0; line < 2; ++line) {
    const bool names = line == 0;
    std::fprintf(f, "# %10s  %12s  %8s  %6s  %6s", names ? "size" : "(B)", names ? "count" : "(elements)",
                 names ? "type" : "", names ? "redop" : "", names ? "root" : "");
    for (int half = 0; half < 2; ++half) {
      if (names)
        std::fprintf(f, "  %7s  %6s  %6s %6s  %7s  %7s  %7s  %6s", "time", "algbw", "busbw", "#wrong", "i_min", "i_max",
                     "i_p99", "i_cv%");
      else
        std::fprintf(f, "  %7s  %6s  %6s  %5s  %7s  %7s  %7s  %6s", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)",
                     "(us)", "(%)");
    }
    std::fprintf(f, "\n");
  }
}

/// allreduce_perf --floor: a comment line under row `r` (nccl-tests' table
/// stays as it is): the size's memory floor and the rate it came from, the
/// model's times if nothing stayed in the caches, and the row's times as
/// multiples of the floor. Nothing when the floor was not measured.
inline void print_floor_line(std::FILE* f, const row_result& r) {
  if (r.floor_us != r.floor_us) return;
  std::fprintf(f, "#  floor %12zu B: %9.1f us (in and out once at %.2f GB/s per rank); uncached: direct %.1f us, "
                  "%s %.1f us; time/floor: oop %.2f, ip %.2f\n",
               r.bytes, r.floor_us, r.stream_gbps, r.uncached_direct_us, r.uncached_segment_algo.c_str(),
               r.uncached_segment_us, r.oop.time_us / r.floor_us, r.ip.time_us / r.floor_us);
}

/// The row preamble: size, count, type, redop, root.
inline void print_row_preamble(std::FILE* f, const row_result& r) {
  char root[32];
  std::snprintf(root, sizeof root, "%6i", r.root);
  std::fprintf(f, "%12li  %12li  %8s  %6s  %6s", static_cast<long>(r.bytes), static_cast<long>(r.count), r.type.c_str(),
               r.redop.c_str(), root);
}

/// One half of a row (with its -I statistics when it has them).
inline void print_half(std::FILE* f, const half_result& h) {
  const std::string t = format_time(h.time_us);
  if (h.wrong >= 0) std::fprintf(f, "  %7s  %6.2f  %6.2f  %5g", t.c_str(), h.algbw, h.busbw, static_cast<double>(h.wrong));
  else std::fprintf(f, "  %7s  %6.2f  %6.2f  %5s", t.c_str(), h.algbw, h.busbw, "N/A");
  if (h.has_stats)
    std::fprintf(f, "  %7s  %7s  %7s  %6.2f", format_time(h.stats.min).c_str(), format_time(h.stats.max).c_str(),
                 format_time(h.stats.p99).c_str(), h.stats.cv);
}

/// The footer of one table.
inline void print_footer(std::FILE* f, int errors, double avg_busbw) {
  std::fprintf(f, "# Out of bounds values : %d %s\n", errors, errors ? "FAILED" : "OK");
  std::fprintf(f, "# Avg bus bandwidth    : %g %s\n", avg_busbw, "");
  std::fprintf(f, "#\n");
}

/// -A with several algorithms: busbw of each algorithm relative to a baseline
/// (native when measured, else the first algorithm), per (size, type, op, root).
inline void print_summary(std::FILE* f, const std::vector<row_result>& rows, const std::vector<std::string>& algos) {
  if (algos.size() < 2) return;
  std::string base = algos.front();
  for (const auto& a : algos)
    if (a == "native") base = a;
  std::vector<std::string> others;
  for (const auto& a : algos)
    if (a != base) others.push_back(a);
  using key = std::tuple<std::string, std::string, int, std::size_t>;
  std::map<std::pair<std::string, key>, const row_result*> by;
  std::vector<key> order;
  for (const auto& r : rows) {
    key k{r.type, r.redop, r.root, r.bytes};
    if (r.algorithm == base) order.push_back(k);
    by[{r.algorithm, k}] = &r;
  }
  std::fprintf(f, "# Summary: busbw ratio to %s (out-of-place / in-place); > 1 means faster than %s\n", base.c_str(),
               base.c_str());
  std::fprintf(f, "# %10s  %8s  %6s  %6s", "size", "type", "redop", "root");
  for (const auto& a : others) std::fprintf(f, "  %17s", (a + "/" + base).c_str());
  std::fprintf(f, "\n");
  auto ratio = [](double a, double b, char* out, std::size_t n) {
    if (b > 0 && a >= 0) std::snprintf(out, n, "%7.2f", a / b);
    else std::snprintf(out, n, "%7s", "n/a");
  };
  for (const auto& k : order) {
    const row_result* b = by[{base, k}];
    std::fprintf(f, "# %10li  %8s  %6s  %6i", static_cast<long>(std::get<3>(k)), std::get<0>(k).c_str(),
                 std::get<1>(k).c_str(), std::get<2>(k));
    for (const auto& a : others) {
      auto it = by.find({a, k});
      char x[32], y[32];
      if (it == by.end()) {
        std::snprintf(x, sizeof x, "%7s", "n/a");
        std::snprintf(y, sizeof y, "%7s", "n/a");
      } else {
        ratio(it->second->oop.busbw, b->oop.busbw, x, sizeof x);
        ratio(it->second->ip.busbw, b->ip.busbw, y, sizeof y);
      }
      std::fprintf(f, "  %7s / %7s", x, y);
    }
    std::fprintf(f, "\n");
  }
  std::fprintf(f, "#\n");
}

/// One rank's "#  Rank" facts (gathered from every rank by the runner).
struct rank_record {
  int rank = 0;
  int pid = 0;
  std::string hostname;
};

/// Run-wide facts the header and the CSV / JSON files record.
struct run_info {
  std::string program;    ///< e.g. "allreduce_perf"
  std::string collective; ///< e.g. "allreduce"
  transport_kind transport = transport_kind::mpi;
  int nranks = 1;
  std::string busbw_formula; ///< "2(n-1)/n" ...
  double busbw_factor = 1;
  bool skipped_native = false;  ///< -A all on a transport without native collectives
  std::size_t llc_bytes = 0;    ///< the last-level cache -R auto sized its sets for
  bool memory_shared = true;    ///< --memory symmetric/registered: the node's ranks map the buffers
  std::vector<rank_record> ranks;
  std::string start_time, end_time; ///< ISO 8601 UTC
  const options* opts = nullptr;
};

/// One table's footer figures (for the JSON "tables" list).
struct table_summary {
  std::string algorithm;
  int out_of_bounds = 0;
  double avg_bus_bw = 0;
};

/// The current time as ISO 8601 UTC ("2026-11-23T04:44:29Z").
inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

/// The device text of a rank's "#  Rank" line and JSON "device_info".
inline std::string device_info(transport_kind t, int rank) {
  if (t == transport_kind::mpi) return "host memory (MPI rank)";
  if (t == transport_kind::gloo) return "host memory (Gloo rank)";
  return "host memory (inproc thread " + std::to_string(rank) + ")";
}

/// nccl-tests' "#  Rank" line (device -1: host memory), newline included.
inline std::string format_rank_line(const rank_record& r, transport_kind t) {
  char b[512];
  std::snprintf(b, sizeof b, "#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s\n", r.rank, 0, r.pid,
                r.hostname.c_str(), -1, 0u, device_info(t, r.rank).c_str());
  return b;
}

namespace detail {
inline const char* average_name(int a) {
  switch (a) {
  case 0: return "rank 0";
  case 1: return "average over ranks";
  case 2: return "min over ranks (the fastest rank)";
  default: return "max over ranks (the slowest rank)";
  }
}
} // namespace detail

/// -a as a word: "rank0", "avg", "min" or "max".
inline const char* average_short(int a) {
  switch (a) {
  case 0: return "rank0";
  case 1: return "avg";
  case 2: return "min";
  default: return "max";
  }
}

/// The run header: nccl-tests' first line, dpkit's comment lines (with -R and
/// -I, one line each saying so), then "# Using devices" and every rank's line.
inline void print_run_header(std::FILE* f, const run_info& info) {
  const options& o = *info.opts;
  const bool factor = o.step_factor > 1;
  std::fprintf(f,
               "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg iters: %d "
               "validation: %d graph: %d\n",
               info.transport == transport_kind::inproc ? info.nranks : 1, o.ngpus, static_cast<long>(o.min_bytes),
               static_cast<long>(o.max_bytes), static_cast<long>(factor ? o.step_factor : o.step_bytes),
               factor ? "factor" : "bytes", o.warmup, o.iters, o.agg_iters, o.check, o.graph);
  if (o.blocking) std::fprintf(f, "# Blocking Enabled: wait for completion and barrier after each collective \n");
  if (o.graph > 0) std::fprintf(f, "# Option -G (CUDA graph) ignored: host transports have no CUDA graphs\n");
  std::fprintf(f, "#\n");
  const std::string tname(transport_name(info.transport));
  std::fprintf(f, "# dpkit %s: %s over %s, %d ranks; busbw = algbw x %s = %.4g\n", info.program.c_str(),
               info.collective.c_str(), tname.c_str(), info.nranks, info.busbw_formula.c_str(), info.busbw_factor);
  std::fprintf(f, "# Time per op: %s (-a %d; 0 rank 0, 1 avg, 2 min, 3 max)\n", detail::average_name(o.average),
               o.average);
  std::fprintf(f, "# Collective options: segment_bytes %zu pipeline_depth %d\n", o.copts.segment_bytes,
               o.copts.pipeline_depth);
  std::fprintf(f, "# Deadline: %.3f s per collective (-T, else DPKIT_TIMEOUT, else 1800); checking level %d (DPKIT_CHECK); native: %s\n",
               static_cast<double>(o.copts.timeout.count()) / 1000.0, o.copts.check,
               o.copts.native_deadline ? "non-blocking, waited against the deadline" : "blocking MPI call (no deadline)");
  if (o.symmetric)
    std::fprintf(f, "# Memory: symmetric (dpkit::allocate_symmetric; %s)\n",
                 "on one node every rank maps the others' buffers and the shm all-reduce runs direct");
  if (o.registered)
    std::fprintf(f, "# Memory: registered (host buffers passed to dpkit::register_memory; %s)\n",
                 "on one node their pages are remapped onto memory every rank maps, and the shm all-reduce runs direct");
  if ((o.symmetric || o.registered) && !info.memory_shared)
    std::fprintf(f, "# Memory: NOT shared by the ranks (no shared segment: ranks on several nodes or DPKIT_SHM_BYTES=0; "
                    "or /dev/shm could not hold it): the collectives run as on host memory\n");
  if (o.rotate_auto)
    std::fprintf(f,
                 "# Buffer rotation: auto, per size enough sets to span 2 x the last-level cache (%zu bytes); "
                 "iteration i uses set i mod N\n",
                 info.llc_bytes);
  else if (o.rotate > 1)
    std::fprintf(f, "# Buffer rotation: %d sets of each buffer; iteration i uses set i mod %d\n", o.rotate, o.rotate);
  if (o.iter_stats)
    std::fprintf(f,
                 "# Iteration statistics: i_min i_max i_p99 (us per op) and i_cv%% over iterations %d..%d, each the "
                 "slowest rank's time\n",
                 o.iter_skip, o.iters - 1);
  if (info.skipped_native)
    std::fprintf(f, "# Algorithm native skipped: the %s transport has no native collectives\n", tname.c_str());
  std::fprintf(f, "#\n# Using devices\n");
  for (const auto& r : info.ranks) std::fputs(format_rank_line(r, info.transport).c_str(), f);
  std::fprintf(f, "#\n");
}

/// CSV: a header line, then one line per row_result (see docs/benchmarks.md);
/// with -I each half adds i_min, i_max, i_p99, i_cv columns at the end.
/// Returns false when the file cannot be written.
inline bool write_csv(const std::string& path, const run_info& info, const std::vector<row_result>& rows) {
  std::ofstream f(path);
  if (!f) return false;
  const bool stats = info.opts && info.opts->iter_stats;
  f << "collective,algorithm,transport,nranks,size,count,type,redop,root,"
       "oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong";
  if (stats) f << ",oop_i_min_us,oop_i_max_us,oop_i_p99_us,oop_i_cv,ip_i_min_us,ip_i_max_us,ip_i_p99_us,ip_i_cv";
  f << '\n';
  auto half = [](const half_result& h) {
    char b[160];
    std::snprintf(b, sizeof b, "%.4f,%.6f,%.6f,", h.time_us, h.algbw, h.busbw);
    return std::string(b) + (h.wrong >= 0 ? std::to_string(h.wrong) : std::string());
  };
  auto st = [](const half_result& h) {
    char b[160];
    std::snprintf(b, sizeof b, "%.4f,%.4f,%.4f,%.4f", h.stats.min, h.stats.max, h.stats.p99, h.stats.cv);
    return std::string(b);
  };
  const std::string tname(transport_name(info.transport));
  for (const auto& r : rows) {
    f << info.collective << ',' << r.algorithm << ',' << tname << ',' << info.nranks << ',' << r.bytes << ','
      << r.count << ',' << r.type << ',' << r.redop << ',' << r.root << ',' << half(r.oop) << ',' << half(r.ip);
    if (stats) f << ',' << st(r.oop) << ',' << st(r.ip);
    f << '\n';
  }
  return static_cast<bool>(f);
}

namespace detail {
/// s as a JSON string literal.
inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
    case '"': o += "\\\""; break;
    case '\\': o += "\\\\"; break;
    case '\n': o += "\\n"; break;
    case '\t': o += "\\t"; break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char b[8];
        std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        o += b;
      } else {
        o += c;
      }
    }
  }
  return "\"" + o + "\"";
}
/// v as a JSON number (6 significant digits); NaN and infinities as null.
inline std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}
/// One half as nccl-tests' {"time", "alg_bw", "bus_bw", "nwrong"} (+ -I's i_* keys).
inline std::string json_half(const half_result& h) {
  std::string s = "{\"time\":" + json_num(h.time_us) + ",\"alg_bw\":" + json_num(h.algbw) +
                  ",\"bus_bw\":" + json_num(h.busbw) +
                  ",\"nwrong\":" + (h.wrong >= 0 ? std::to_string(h.wrong) : std::string("null"));
  if (h.has_stats)
    s += ",\"i_min\":" + json_num(h.stats.min) + ",\"i_max\":" + json_num(h.stats.max) +
         ",\"i_p99\":" + json_num(h.stats.p99) + ",\"i_cv\":" + json_num(h.stats.cv);
  return s + "}";
}
/// The environment variables that change what a run measures (Open MPI's
/// MCA settings, dpkit's and NCCL's variables), as a JSON object.
inline std::string json_env() {
  std::string s = "{";
  bool first = true;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv(*e);
    if (kv.rfind("OMPI_MCA_", 0) != 0 && kv.rfind("DPKIT_", 0) != 0 && kv.rfind("NCCL_", 0) != 0) continue;
    // mpirun's own bookkeeping for the launched job, not settings
    bool launcher = false;
    for (const char* p : {"OMPI_MCA_orte_", "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir",
                          "OMPI_MCA_shmem_RUNTIME_QUERY_hint"})
      launcher = launcher || kv.rfind(p, 0) == 0;
    if (launcher) continue;
    const auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    s += (first ? "" : ",") + json_escape(kv.substr(0, eq)) + ":" + json_escape(kv.substr(eq + 1));
    first = false;
  }
  return s + "}";
}
} // namespace detail

/// JSON in nccl-tests 2.19's layout (-J): version, start_time, args, env,
/// nccl_version (null: no NCCL here), ranks[] {rank, group, pid, hostname,
/// device, device_hex, device_info}, results[] {size, count, type, redop,
/// root, actual_iterations, experiment_name (the algorithm), out_of_place /
/// in_place {time, alg_bw, bus_bw, nwrong (+ i_min, i_max, i_p99, i_cv with
/// -I)}, algorithm}, config {nthreads, ngpus, minimum_bytes, maximum_bytes,
/// step_factor | step_bytes, warmup_iters, iterations, aggregated_iterations,
/// validation, graph}, end_time, and dpkit's own facts under "dpkit".
/// Returns false when the file cannot be written.
inline bool write_json(const std::string& path, const run_info& info, const std::vector<row_result>& rows,
                       const std::vector<table_summary>& tables) {
  std::ofstream f(path);
  if (!f) return false;
  const options& o = *info.opts;
  using detail::json_escape;
  using detail::json_num;
  std::string args;
  for (std::size_t i = 0; i < o.argv.size(); ++i) args += (i ? " " : "") + o.argv[i];
  f << "{\"version\":\"dpkit-bench 2 (nccl-tests 2.19 layout)\",\"start_time\":" << json_escape(info.start_time)
    << ",\"args\":" << json_escape(args) << ",\"env\":" << detail::json_env() << ",\"nccl_version\":null,\n\"ranks\":[";
  for (std::size_t i = 0; i < info.ranks.size(); ++i) {
    const auto& r = info.ranks[i];
    f << (i ? "," : "") << "{\"rank\":" << r.rank << ",\"group\":0,\"pid\":" << r.pid
      << ",\"hostname\":" << json_escape(r.hostname) << ",\"device\":-1,\"device_hex\":\"0x00\",\"device_info\":"
      << json_escape(device_info(info.transport, r.rank)) << "}";
  }
  f << "],\n\"results\":[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    f << (i ? ",\n" : "\n") << "{\"size\":" << r.bytes << ",\"count\":" << r.count << ",\"type\":" << json_escape(r.type)
      << ",\"redop\":" << json_escape(r.redop) << ",\"root\":" << r.root
      << ",\"actual_iterations\":" << o.iters << ",\"experiment_name\":" << json_escape(r.algorithm)
      << ",\"out_of_place\":" << detail::json_half(r.oop) << ",\"in_place\":" << detail::json_half(r.ip)
      << ",\"algorithm\":" << json_escape(r.algorithm) << "}";
  }
  const bool factor = o.step_factor > 1;
  f << "\n],\n\"config\":{\"nthreads\":" << (info.transport == transport_kind::inproc ? info.nranks : 1)
    << ",\"ngpus\":" << o.ngpus << ",\"minimum_bytes\":" << o.min_bytes << ",\"maximum_bytes\":" << o.max_bytes
    << (factor ? ",\"step_factor\":" : ",\"step_bytes\":") << (factor ? o.step_factor : o.step_bytes)
    << ",\"warmup_iters\":" << o.warmup << ",\"iterations\":" << o.iters << ",\"aggregated_iterations\":" << o.agg_iters
    << ",\"validation\":" << o.check << ",\"graph\":" << o.graph << "},\n\"end_time\":" << json_escape(info.end_time);
  f << ",\n\"dpkit\":{\"program\":" << json_escape(info.program) << ",\"collective\":" << json_escape(info.collective)
    << ",\"transport\":" << json_escape(std::string(transport_name(info.transport))) << ",\"nranks\":" << info.nranks
    << ",\"busbw_factor\":" << json_num(info.busbw_factor) << ",\"time_reduction\":"
    << json_escape(average_short(o.average)) << ",\"average\":" << o.average << ",\"blocking\":" << o.blocking
    << ",\"segment_bytes\":" << o.copts.segment_bytes << ",\"pipeline_depth\":" << o.copts.pipeline_depth
    << ",\"rotate\":" << (o.rotate_auto ? std::string("\"auto\"") : std::to_string(o.rotate))
    << ",\"llc_bytes\":" << info.llc_bytes << ",\"iteration_stats\":" << o.iter_stats
    << ",\"iteration_skip\":" << o.iter_skip << ",\"tables\":[";
  for (std::size_t i = 0; i < tables.size(); ++i)
    f << (i ? "," : "") << "{\"algorithm\":" << json_escape(tables[i].algorithm)
      << ",\"out_of_bounds\":" << tables[i].out_of_bounds << ",\"avg_bus_bw\":" << json_num(tables[i].avg_bus_bw) << "}";
  f << "]}}\n";
  return static_cast<bool>(f);
}

/// Writes --csv and -J files (when asked) and says so on f, as before.
inline void write_result_files(std::FILE* f, const run_info& info, const std::vector<row_result>& rows,
                               const std::vector<table_summary>& tables) {
  const options& o = *info.opts;
  if (!o.csv_file.empty()) {
    if (write_csv(o.csv_file, info, rows)) std::fprintf(f, "# Wrote CSV results to %s\n", o.csv_file.c_str());
    else std::fprintf(f, "# Could not write CSV results to %s\n", o.csv_file.c_str());
  }
  if (!o.json_file.empty()) {
    if (write_json(o.json_file, info, rows, tables)) std::fprintf(f, "# Wrote JSON results to %s\n", o.json_file.c_str());
    else std::fprintf(f, "# Could not write JSON results to %s\n", o.json_file.c_str());
  }
}

} // namespace dpkit_bench
