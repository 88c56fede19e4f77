// dpkit benchmarks: nccl-tests' text output (header, table, footer; the same
// printf widths), plus the -A all summary and the CSV / JSON files.
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

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace dpkit_bench {

/// One half (out-of-place or in-place) of a table row.
struct half_result {
  double time_us = 0;      ///< per op, reduced across ranks with -a
  double algbw = 0;        ///< GB/s (1e9 B/s)
  double busbw = 0;        ///< GB/s
  std::int64_t wrong = -1; ///< summed over ranks; -1: not checked (-c 0)
};

/// One table row: a (algorithm, size, type, op, root) point.
struct row_result {
  std::string algorithm;
  std::size_t bytes = 0; ///< the size column
  std::size_t count = 0; ///< the count column (elements per rank's buffer as nccl-tests)
  std::string type, redop;
  int root = -1;
  half_result oop, ip;
};

/// Formats a time in microseconds as nccl-tests does (7 wide).
inline std::string format_time(double us) {
  char buf[64];
  if (us >= 10000.0) std::snprintf(buf, sizeof buf, "%7.0f", us);
  else if (us >= 100.0) std::snprintf(buf, sizeof buf, "%7.1f", us);
  else std::snprintf(buf, sizeof buf, "%7.2f", us);
  return buf;
}

/// The three column-header lines of the table.
inline void print_table_header(std::FILE* f) {
  std::fprintf(f, "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
               "", "", "");
  std::fprintf(f, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type", "redop",
               "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  std::fprintf(f, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "", "",
               "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

/// The row preamble: size, count, type, redop, root.
inline void print_row_preamble(std::FILE* f, const row_result& r) {
  char root[32];
  std::snprintf(root, sizeof root, "%6i", r.root);
  std::fprintf(f, "%12li  %12li  %8s  %6s  %6s", static_cast<long>(r.bytes), static_cast<long>(r.count), r.type.c_str(),
               r.redop.c_str(), root);
}

/// One half of a row.
inline void print_half(std::FILE* f, const half_result& h) {
  const std::string t = format_time(h.time_us);
  if (h.wrong >= 0) std::fprintf(f, "  %7s  %6.2f  %6.2f  %5g", t.c_str(), h.algbw, h.busbw, static_cast<double>(h.wrong));
  else std::fprintf(f, "  %7s  %6.2f  %6.2f  %5s", t.c_str(), h.algbw, h.busbw, "N/A");
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

namespace detail {
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
inline std::string json_num(double v) {
  if (v != v) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}
inline std::string json_half(const half_result& h) {
  return "{\"time\":" + json_num(h.time_us) + ",\"alg_bw\":" + json_num(h.algbw) + ",\"bus_bw\":" + json_num(h.busbw) +
         ",\"nwrong\":" + (h.wrong >= 0 ? std::to_string(h.wrong) : std::string("null")) + "}";
}
} // namespace detail

/// Run-wide facts the CSV / JSON files record.
struct run_info {
  std::string program;    ///< e.g. "allreduce_perf"
  std::string collective; ///< e.g. "allreduce"
  std::string transport;  ///< "mpi" or "inproc"
  int nranks = 1;
  double busbw_factor = 1;
  std::string time_reduction; ///< "max" ...
  const options* opts = nullptr;
};

/// CSV: a header line, then one line per row_result (see docs/benchmarks.md).
inline bool write_csv(const std::string& path, const run_info& info, const std::vector<row_result>& rows) {
  std::ofstream f(path);
  if (!f) return false;
  f << "collective,algorithm,transport,nranks,size,count,type,redop,root,"
       "oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong\n";
  auto half = [](const half_result& h) {
    char b[160];
    std::snprintf(b, sizeof b, "%.4f,%.6f,%.6f,", h.time_us, h.algbw, h.busbw);
    return std::string(b) + (h.wrong >= 0 ? std::to_string(h.wrong) : std::string());
  };
  for (const auto& r : rows) {
    f << info.collective << ',' << r.algorithm << ',' << info.transport << ',' << info.nranks << ',' << r.bytes << ','
      << r.count << ',' << r.type << ',' << r.redop << ',' << r.root << ',' << half(r.oop) << ',' << half(r.ip) << '\n';
  }
  return static_cast<bool>(f);
}

/// JSON: one object with the run's configuration and a "results" list whose
/// records use nccl-tests' JSON keys (size, count, type, redop, root,
/// out_of_place / in_place {time, alg_bw, bus_bw, nwrong}) plus "algorithm".
inline bool write_json(const std::string& path, const run_info& info, const std::vector<row_result>& rows,
                       const std::vector<std::pair<std::string, std::pair<int, double>>>& tables) {
  std::ofstream f(path);
  if (!f) return false;
  const options& o = *info.opts;
  using detail::json_escape;
  using detail::json_num;
  f << "{\"version\":1,\"program\":" << json_escape(info.program) << ",\"collective\":" << json_escape(info.collective)
    << ",\"transport\":" << json_escape(info.transport) << ",\"nranks\":" << info.nranks
    << ",\"busbw_factor\":" << json_num(info.busbw_factor) << ",\"args\":[";
  for (std::size_t i = 0; i < o.argv.size(); ++i) f << (i ? "," : "") << json_escape(o.argv[i]);
  f << "],\"config\":{\"nthreads\":" << o.nthreads << ",\"ngpus\":" << o.ngpus << ",\"minbytes\":" << o.min_bytes
    << ",\"maxbytes\":" << o.max_bytes << ",\"stepbytes\":" << o.step_bytes << ",\"stepfactor\":" << o.step_factor
    << ",\"warmup_iters\":" << o.warmup << ",\"iters\":" << o.iters << ",\"agg_iters\":" << o.agg_iters
    << ",\"check\":" << o.check << ",\"blocking\":" << o.blocking << ",\"time_reduction\":"
    << json_escape(info.time_reduction) << ",\"average\":" << o.average
    << ",\"segment_bytes\":" << o.copts.segment_bytes << ",\"pipeline_depth\":" << o.copts.pipeline_depth << "}";
  f << ",\"tables\":[";
  for (std::size_t i = 0; i < tables.size(); ++i)
    f << (i ? "," : "") << "{\"algorithm\":" << json_escape(tables[i].first)
      << ",\"out_of_bounds\":" << tables[i].second.first << ",\"avg_bus_bw\":" << json_num(tables[i].second.second)
      << "}";
  f << "],\"results\":[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    f << (i ? ",\n" : "\n") << "{\"algorithm\":" << json_escape(r.algorithm) << ",\"size\":" << r.bytes
      << ",\"count\":" << r.count << ",\"type\":" << json_escape(r.type) << ",\"redop\":" << json_escape(r.redop)
      << ",\"root\":" << r.root << ",\"out_of_place\":" << detail::json_half(r.oop)
      << ",\"in_place\":" << detail::json_half(r.ip) << "}";
  }
  f << "\n]}\n";
  return static_cast<bool>(f);
}

} // namespace dpkit_bench
