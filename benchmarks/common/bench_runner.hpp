// dpkit benchmarks: the shared nccl-tests-style driver. A *_perf program
// describes its collective with a small struct (see allreduce_perf.cpp) and
// calls dpkit_bench::bench_main<Coll>(argc, argv).
//
// A collective description provides:
//   static constexpr collective kind;              // buffer layout and data check
//   static constexpr std::string_view name;        // "allreduce"
//   static constexpr std::string_view busbw_formula; // "2(n-1)/n", for the header
//   static double busbw_factor(int nranks);
//   static std::vector<dpkit::algorithm> algorithms(); // dpkit algorithms it has, -A all order
//   template <class C, class T> static void run(C&, dpkit::algorithm, const op_args<T>&);
//   optionally: static std::size_t inplace_result_offset(dpkit::algorithm, int rank, std::size_t count);
//
// Timing follows nccl-tests' BenchTime: one untimed collective, a barrier,
// then n iterations (x agg iters) timed with steady_clock; time per op = wall
// time / (n x agg), then reduced across ranks with -a (default here: max, the
// slowest rank). Buffers are allocated once, at the largest size.
#pragma once

#include "bench_data.hpp"
#include "bench_device.hpp"
#include "bench_options.hpp"
#include "bench_report.hpp"

#include <dpkit/dpkit.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#if defined(DPKIT_WITH_MPI)
#include <mpi.h>
#endif

namespace dpkit_bench {

/// A command-line combination this collective or transport cannot run; thrown
/// identically on every rank before any communication, printed once.
class usage_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// What one collective call gets. Spans point into buffers allocated once.
template <class T>
struct op_args {
  std::span<T> in;   ///< out-of-place input (send count elements)
  std::span<T> out;  ///< out-of-place output (receive count elements)
  std::span<T> buf;  ///< in-place buffer (the larger of the two counts)
  std::size_t count; ///< the per-rank count the collective's API takes (nccl-tests' count column)
  dpkit::reduce_op op;
  int root;                      ///< -1 for rootless collectives
  dpkit::collective_options opts;
  bool in_place;
};

/// Calls f(comm) when the transport has native collectives (MPI), otherwise
/// throws (the driver never selects native on such transports).
template <class C, class F>
void with_native(C& comm, F&& f) {
  if constexpr (dpkit::native_collectives<C>) f(comm);
  else throw usage_error("this transport has no native collectives");
}

/// Element counts of a collective at total element count `total` (size / typesize), as nccl-tests' getCollByteCount.
struct coll_counts {
  std::size_t send, recv, param;
};
inline coll_counts counts_for(collective k, std::size_t total, int n) {
  const std::size_t nn = static_cast<std::size_t>(n);
  switch (k) {
  case collective::reduce_scatter: return {(total / nn) * nn, total / nn, total / nn};
  case collective::allgather: return {total / nn, (total / nn) * nn, total / nn};
  case collective::allreduce: case collective::broadcast: case collective::reduce: break;
  }
  return {total, total, total};
}

namespace detail {

struct aligned_free {
  void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t{4096}); }
};
using buffer = std::unique_ptr<std::byte[], aligned_free>;
inline buffer allocate(std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, 64);
  buffer b(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{4096})));
  std::memset(b.get(), 0, bytes); // touch every page now, not in a timed loop
  return b;
}

inline std::string hostname() {
  char h[256] = {};
  if (gethostname(h, sizeof h - 1) != 0) return "unknown";
  return h;
}

inline const char* average_name(int a) {
  switch (a) {
  case 0: return "rank 0";
  case 1: return "average over ranks";
  case 2: return "min over ranks (the fastest rank)";
  default: return "max over ranks (the slowest rank)";
  }
}
inline const char* average_short(int a) {
  switch (a) {
  case 0: return "rank0";
  case 1: return "avg";
  case 2: return "min";
  default: return "max";
  }
}

} // namespace detail

/// One rank's run of a benchmark over transport C.
template <class Coll, class C>
class runner {
public:
  runner(C& comm, const options& o, std::string transport)
      : comm_(comm), o_(o), transport_(std::move(transport)), rank_(comm.rank()), n_(comm.size()),
        out_(comm.rank() == 0 ? stdout : nullptr) {
    hopts_.tag = 0x7100; // harness messages (stats, header) never share tags with the measured collective
    hopts_.timeout = o.copts.timeout;
  }

  /// Runs every table; returns the number of failed checks (summed over ranks and tables).
  int run() {
    select_algorithms();
    select_roots();
    build_sizes();
    if (const std::string err = device_support_error(o_, n_); !err.empty()) throw usage_error(err);

    send_ = detail::allocate(o_.max_bytes);
    recv_ = detail::allocate(o_.max_bytes);
    if (o_.check) expect_ = detail::allocate(o_.max_bytes);

    print_header();
    // With several algorithms (-A all), every size is measured for all of
    // them back to back, so each comparison is taken in the same machine
    // state (a shared, noisy machine drifts over a long sweep); the tables
    // are printed afterwards, one per algorithm, in nccl-tests' format. A
    // single algorithm streams its rows as they are measured.
    tables_state_.assign(algos_.size(), table_state{});
    stream_ = algos_.size() == 1;
    if (stream_ && out_) {
      std::fprintf(out_, "# Algorithm: %s\n", std::string(algorithm_label(algos_[0])).c_str());
      print_table_header(out_);
    }
    for (auto t : o_.types)
      dpkit::visit_element_type(t, [&](auto zero) { run_type<decltype(zero)>(); });
    int failed = 0;
    std::vector<std::string> names;
    for (std::size_t i = 0; i < algos_.size(); ++i) {
      const std::string an(algorithm_label(algos_[i]));
      names.push_back(an);
      auto& st = tables_state_[i];
      if (out_ && !stream_) {
        std::fprintf(out_, "# Algorithm: %s\n", an.c_str());
        print_table_header(out_);
        for (const auto& row : st.rows) print_row(row);
      }
      const auto errs = static_cast<int>(sum_i64(st.errors));
      failed += errs;
      const double avg = st.bw_count ? st.bw_sum / st.bw_count : 0.0;
      if (out_) print_footer(out_, errs, avg);
      tables_.push_back({an, {errs, avg}});
      for (auto& row : st.rows) rows_.push_back(std::move(row));
    }
    if (out_) {
      print_summary(out_, rows_, names);
      write_files();
      std::fflush(out_);
    }
    return failed;
  }

private:
  static std::string_view algorithm_label(dpkit::algorithm a) {
    return a == dpkit::algorithm::automatic ? std::string_view("auto") : dpkit::algorithm_name(a);
  }

  void select_algorithms() {
    const auto have = Coll::algorithms();
    auto list = [&] {
      std::string s;
      for (auto a : have)
        if (a != dpkit::algorithm::native || dpkit::native_collectives<C>) s += std::string(algorithm_label(a)) + " ";
      return s + "auto";
    };
    if (o_.algo_all) {
      for (auto a : have) {
        if (a == dpkit::algorithm::native && !dpkit::native_collectives<C>) {
          skipped_native_ = true;
          continue;
        }
        algos_.push_back(a);
      }
      return;
    }
    for (auto a : o_.algorithms) {
      if (a != dpkit::algorithm::automatic && std::find(have.begin(), have.end(), a) == have.end())
        throw usage_error("-A " + std::string(algorithm_label(a)) + ": dpkit has no " +
                          std::string(algorithm_label(a)) + " " + std::string(Coll::name) + " (available: " + list() +
                          ")");
      if (a == dpkit::algorithm::native && !dpkit::native_collectives<C>)
        throw usage_error("-A native: the " + transport_ +
                          " transport has no native collectives (run under mpirun without -t for MPI's)");
      algos_.push_back(a);
    }
  }

  void select_roots() {
    const bool rooted = Coll::kind == collective::broadcast || Coll::kind == collective::reduce;
    if (!rooted) {
      roots_ = {-1};
    } else if (o_.root == -1) {
      for (int r = 0; r < n_; ++r) roots_.push_back(r);
    } else {
      if (o_.root < 0 || o_.root >= n_)
        throw usage_error("-r " + std::to_string(o_.root) + ": root out of range for " + std::to_string(n_) + " ranks");
      roots_ = {o_.root};
    }
  }

  void build_sizes() {
    for (std::size_t s = o_.min_bytes; s <= o_.max_bytes;) {
      sizes_.push_back(s);
      std::size_t next;
      if (o_.step_factor > 1) {
        if (s == 0) next = 1; // nccl-tests would loop forever at 0
        else if (s > o_.max_bytes / o_.step_factor) break;
        else next = s * o_.step_factor;
      } else {
        if (o_.step_bytes == 0 || s > o_.max_bytes - o_.step_bytes) break;
        next = s + o_.step_bytes;
      }
      s = next;
    }
  }

  // ---- small collectives of the harness itself ----
  void barrier() {
    if constexpr (dpkit::native_collectives<C>) comm_.native_barrier();
    else dpkit::barrier(comm_, hopts_);
  }
  double allreduce_f64(double v, dpkit::reduce_op op) {
    std::array<double, 1> a{v};
    if constexpr (dpkit::native_collectives<C>)
      comm_.native_allreduce(a.data(), a.data(), 1, dpkit::element_type::f64, op);
    else dpkit::allreduce_tree(comm_, a, op, hopts_);
    return a[0];
  }
  std::int64_t sum_i64(std::int64_t v) {
    std::array<std::int64_t, 1> a{v};
    if constexpr (dpkit::native_collectives<C>)
      comm_.native_allreduce(a.data(), a.data(), 1, dpkit::element_type::i64, dpkit::reduce_op::sum);
    else dpkit::allreduce_tree(comm_, a, dpkit::reduce_op::sum, hopts_);
    return a[0];
  }
  double reduce_time(double t) {
    switch (o_.average) {
    case 0: {
      std::array<double, 1> a{t};
      if constexpr (dpkit::native_collectives<C>) comm_.native_broadcast(a.data(), a.data(), 1, dpkit::element_type::f64, 0);
      else dpkit::broadcast_tree(comm_, a, 0, hopts_);
      return a[0];
    }
    case 1: return allreduce_f64(t, dpkit::reduce_op::sum) / n_;
    case 2: return allreduce_f64(t, dpkit::reduce_op::min);
    default: return allreduce_f64(t, dpkit::reduce_op::max);
    }
  }

  void print_header() {
    // Every rank's "#  Rank" line, gathered to all (fixed 256-byte records).
    constexpr std::size_t L = 256;
    std::vector<std::uint8_t> mine(L, 0), all(L * static_cast<std::size_t>(n_), 0);
    const rank_device dev;
    const std::string what = transport_ == "mpi" ? "host memory (MPI rank)"
                                                 : "host memory (inproc thread " + std::to_string(rank_) + ")";
    std::snprintf(reinterpret_cast<char*>(mine.data()), L, "#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s\n",
                  rank_, 0, static_cast<int>(getpid()), detail::hostname().c_str(), dev.index, dev.pci_bus,
                  dev.name == "host" ? what.c_str() : dev.name.c_str());
    mine[L - 1] = 0;
    if constexpr (dpkit::native_collectives<C>)
      comm_.native_allgather(mine.data(), all.data(), L, dpkit::element_type::u8);
    else dpkit::allgather_ring(comm_, mine, all, hopts_);
    if (!out_) return;
    const bool factor = o_.step_factor > 1;
    std::fprintf(out_,
                 "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg iters: %d "
                 "validation: %d graph: %d\n",
                 transport_ == "inproc" ? n_ : 1, o_.ngpus, static_cast<long>(o_.min_bytes),
                 static_cast<long>(o_.max_bytes), static_cast<long>(factor ? o_.step_factor : o_.step_bytes),
                 factor ? "factor" : "bytes", o_.warmup, o_.iters, o_.agg_iters, o_.check, o_.graph);
    if (o_.blocking) std::fprintf(out_, "# Blocking Enabled: wait for completion and barrier after each collective \n");
    if (o_.graph > 0) std::fprintf(out_, "# Option -G (CUDA graph) ignored: host transports have no CUDA graphs\n");
    std::fprintf(out_, "#\n");
    std::fprintf(out_, "# dpkit %s_perf: %s over %s, %d ranks; busbw = algbw x %s = %.4g\n", std::string(Coll::name).c_str(),
                 std::string(Coll::name).c_str(), transport_.c_str(), n_, std::string(Coll::busbw_formula).c_str(),
                 Coll::busbw_factor(n_));
    std::fprintf(out_, "# Time per op: %s (-a %d; 0 rank 0, 1 avg, 2 min, 3 max)\n", detail::average_name(o_.average),
                 o_.average);
    std::fprintf(out_, "# Collective options: segment_bytes %zu pipeline_depth %d\n", o_.copts.segment_bytes,
                 o_.copts.pipeline_depth);
    if (skipped_native_)
      std::fprintf(out_, "# Algorithm native skipped: the %s transport has no native collectives\n", transport_.c_str());
    std::fprintf(out_, "#\n# Using devices\n");
    for (int r = 0; r < n_; ++r) std::fputs(reinterpret_cast<const char*>(all.data() + L * static_cast<std::size_t>(r)), out_);
    std::fprintf(out_, "#\n");
    std::fflush(out_);
  }

  template <class T>
  op_args<T> make_args(std::size_t bytes, dpkit::reduce_op op, int root, bool in_place, coll_counts& c) {
    c = counts_for(Coll::kind, bytes / sizeof(T), n_);
    T* s = reinterpret_cast<T*>(send_.get());
    T* r = reinterpret_cast<T*>(recv_.get());
    return op_args<T>{std::span<T>(s, c.send), std::span<T>(r, c.recv), std::span<T>(r, std::max(c.send, c.recv)),
                      c.param, op, root, o_.copts, in_place};
  }

  static constexpr bool reduces() {
    return Coll::kind == collective::allreduce || Coll::kind == collective::reduce_scatter ||
           Coll::kind == collective::reduce;
  }

  std::size_t result_offset(dpkit::algorithm a, std::size_t count) const {
    if constexpr (requires { Coll::inplace_result_offset(a, 0, count); }) return Coll::inplace_result_offset(a, rank_, count);
    else if (Coll::kind == collective::reduce_scatter) return static_cast<std::size_t>(rank_) * count;
    else return 0;
  }

  /// Writes this rank's input (and, with sentinel, poisons what must be written).
  template <class T>
  void prepare(const op_args<T>& x, const value_gen& g, bool sentinel) {
    const std::size_t cnt = x.count;
    switch (Coll::kind) {
    case collective::allreduce:
    case collective::reduce:
    case collective::reduce_scatter:
      if (x.in_place) {
        fill_input(x.buf, g, rank_);
      } else {
        fill_input(x.in, g, rank_);
        if (sentinel) fill_sentinel(x.out);
      }
      break;
    case collective::allgather:
      if (x.in_place) {
        if (sentinel) fill_sentinel(x.buf);
        fill_input(x.buf.subspan(static_cast<std::size_t>(rank_) * cnt, cnt), g, rank_);
      } else {
        fill_input(x.in, g, rank_);
        if (sentinel) fill_sentinel(x.out);
      }
      break;
    case collective::broadcast: {
      auto dst = x.in_place ? x.buf : x.in;
      if (rank_ == x.root) fill_input(dst, g, x.root);
      else if (sentinel) fill_sentinel(dst);
      if (!x.in_place && sentinel) fill_sentinel(x.out);
      break;
    }
    }
  }

  /// Fills expect_ with this rank's expected result; returns its length (0: nothing to check here).
  template <class T>
  std::size_t expected(const op_args<T>& x, const value_gen& g) {
    T* e = reinterpret_cast<T*>(expect_.get());
    const std::size_t cnt = x.count;
    switch (Coll::kind) {
    case collective::allreduce: fill_reduced(std::span<T>(e, cnt), g); return cnt;
    case collective::reduce:
      if (rank_ != x.root) return 0;
      fill_reduced(std::span<T>(e, cnt), g);
      return cnt;
    case collective::reduce_scatter:
      fill_reduced(std::span<T>(e, cnt), g, static_cast<std::size_t>(rank_) * cnt);
      return cnt;
    case collective::allgather:
      for (int k = 0; k < n_; ++k) fill_input(std::span<T>(e + static_cast<std::size_t>(k) * cnt, cnt), g, k);
      return cnt * static_cast<std::size_t>(n_);
    case collective::broadcast: fill_input(std::span<T>(e, cnt), g, x.root); return cnt;
    }
    return 0;
  }

  template <class T>
  std::span<const T> result(dpkit::algorithm a, const op_args<T>& x, std::size_t len) const {
    if (!x.in_place) return std::span<const T>(x.out.data(), len);
    return std::span<const T>(x.buf.data() + result_offset(a, x.count), len);
  }

  template <class T>
  half_result bench(dpkit::algorithm a, const op_args<T>& x, std::size_t bytes, dpkit::reduce_op op) {
    value_gen g{op, reduces(), n_, 0};
    prepare(x, g, false);
    Coll::run(comm_, a, x); // untimed: the sync op of nccl-tests' BenchTime
    barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i)
      for (int j = 0; j < o_.agg_iters; ++j) {
        Coll::run(comm_, a, x);
        if (o_.blocking) barrier();
      }
    const auto t1 = std::chrono::steady_clock::now();
    const double local = std::chrono::duration<double>(t1 - t0).count() / (static_cast<double>(o_.iters) * o_.agg_iters);
    const double sec = reduce_time(local);
    half_result h;
    h.time_us = sec * 1e6;
    h.algbw = sec > 0 ? static_cast<double>(bytes) / 1.0e9 / sec : 0.0;
    h.busbw = h.algbw * Coll::busbw_factor(n_);
    if (o_.check > 0) {
      std::int64_t total = 0;
      for (int c = 0; c < o_.check; ++c) {
        g.seed = static_cast<std::uint64_t>(c) + 1;
        prepare(x, g, true);
        // The expected result depends on (type, op, root, count, seed) only:
        // computed once for the out-of-place and in-place halves.
        const expect_key key{static_cast<int>(dpkit::element_type_of_v<T>), static_cast<int>(op), x.root, x.count, g.seed};
        if (!expect_valid_ || !(key == expect_key_)) {
          expect_len_ = expected(x, g);
          expect_key_ = key;
          expect_valid_ = true;
        }
        const std::size_t len = expect_len_;
        Coll::run(comm_, a, x);
        std::int64_t wrong = 0;
        if (len) wrong = count_wrong<T>(result(a, x, len), std::span<const T>(reinterpret_cast<const T*>(expect_.get()), len));
        if (wrong) ++errors_;
        total = sum_i64(wrong);
        if (total) break;
      }
      h.wrong = total;
    }
    bw_sum_ += h.busbw;
    ++bw_count_;
    return h;
  }

  struct table_state {
    std::int64_t errors = 0;
    double bw_sum = 0;
    int bw_count = 0;
    std::vector<row_result> rows;
  };

  void print_row(const row_result& row) {
    print_row_preamble(out_, row);
    print_half(out_, row.oop);
    print_half(out_, row.ip);
    std::fprintf(out_, "\n");
  }

  // bench() accumulates into errors_/bw_sum_/bw_count_: point them at table i.
  template <class F>
  auto with_table(std::size_t i, F&& f) {
    auto& st = tables_state_[i];
    errors_ = st.errors;
    bw_sum_ = st.bw_sum;
    bw_count_ = st.bw_count;
    auto r = f();
    st.errors = errors_;
    st.bw_sum = bw_sum_;
    st.bw_count = bw_count_;
    return r;
  }

  template <class T>
  void run_type() {
    const std::string tname(dpkit::element_type_name(dpkit::element_type_of_v<T>));
    for (auto op : o_.ops) {
      const std::string oname = reduces() ? std::string(dpkit::reduce_op_name(op)) : std::string("none");
      for (int root : roots_) {
        coll_counts c{};
        // Warm-up at the largest, then the smallest size (out of place), as nccl-tests.
        for (auto a : algos_)
          for (std::size_t s : {sizes_.back(), sizes_.front()}) {
            const auto x = make_args<T>(s, op, root, false, c);
            for (int w = 0; w < o_.warmup; ++w) Coll::run(comm_, a, x);
          }
        for (std::size_t s : sizes_) {
          for (std::size_t i = 0; i < algos_.size(); ++i) {
            const auto a = algos_[i];
            const auto oop = make_args<T>(s, op, root, false, c);
            const auto ip = make_args<T>(s, op, root, true, c);
            row_result row;
            row.algorithm = std::string(algorithm_label(a));
            row.bytes = std::max(c.send, c.recv) * sizeof(T);
            row.count = c.param;
            row.type = tname;
            row.redop = oname;
            row.root = root;
            if (stream_ && out_) {
              print_row_preamble(out_, row);
              std::fflush(out_);
            }
            row.oop = with_table(i, [&] { return bench(a, oop, row.bytes, op); });
            if (stream_ && out_) print_half(out_, row.oop);
            row.ip = with_table(i, [&] { return bench(a, ip, row.bytes, op); });
            if (stream_ && out_) {
              print_half(out_, row.ip);
              std::fprintf(out_, "\n");
              std::fflush(out_);
            }
            if (out_) tables_state_[i].rows.push_back(std::move(row));
          }
        }
      }
    }
  }

  void write_files() {
    run_info info;
    const std::string prog = o_.argv.empty() ? std::string(Coll::name) + "_perf" : o_.argv[0];
    info.program = prog.substr(prog.find_last_of('/') == std::string::npos ? 0 : prog.find_last_of('/') + 1);
    info.collective = std::string(Coll::name);
    info.transport = transport_;
    info.nranks = n_;
    info.busbw_factor = Coll::busbw_factor(n_);
    info.time_reduction = detail::average_short(o_.average);
    info.opts = &o_;
    if (!o_.csv_file.empty()) {
      if (write_csv(o_.csv_file, info, rows_)) std::fprintf(out_, "# Wrote CSV results to %s\n", o_.csv_file.c_str());
      else std::fprintf(out_, "# Could not write CSV results to %s\n", o_.csv_file.c_str());
    }
    if (!o_.json_file.empty()) {
      if (write_json(o_.json_file, info, rows_, tables_))
        std::fprintf(out_, "# Wrote JSON results to %s\n", o_.json_file.c_str());
      else std::fprintf(out_, "# Could not write JSON results to %s\n", o_.json_file.c_str());
    }
  }

  C& comm_;
  const options& o_;
  std::string transport_;
  int rank_, n_;
  std::FILE* out_;
  dpkit::collective_options hopts_;
  std::vector<dpkit::algorithm> algos_;
  bool skipped_native_ = false;
  std::vector<int> roots_;
  std::vector<std::size_t> sizes_;
  detail::buffer send_, recv_, expect_;
  struct expect_key {
    int type, op, root;
    std::size_t count;
    std::uint64_t seed;
    friend bool operator==(const expect_key&, const expect_key&) = default;
  };
  expect_key expect_key_{};
  bool expect_valid_ = false;
  std::size_t expect_len_ = 0;
  std::int64_t errors_ = 0;
  double bw_sum_ = 0;
  int bw_count_ = 0;
  std::vector<row_result> rows_;
  std::vector<std::pair<std::string, std::pair<int, double>>> tables_;
  std::vector<table_state> tables_state_;
  bool stream_ = true;
};

/// Runs n ranks as threads over the inproc transport. Returns the exit code.
template <class Coll>
int run_inproc(const options& o) {
  dpkit::inproc_world world(o.nthreads);
  std::atomic<int> failed{0};
  try {
    world.run([&](dpkit::inproc& comm) {
      runner<Coll, dpkit::inproc> r(comm, o, "inproc");
      const int f = r.run();
      if (comm.rank() == 0) failed = f;
    });
  } catch (const usage_error& e) {
    std::fprintf(stderr, "%s: %s\n", o.argv.empty() ? "bench" : o.argv[0].c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", o.argv.empty() ? "bench" : o.argv[0].c_str(), e.what());
    return 1;
  }
  return failed.load() ? 1 : 0;
}

/// The main() of a *_perf program.
template <class Coll>
int bench_main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int code = 0;
  const auto o = parse_options(argc, argv, Coll::kind, code);
  if (!o) return code;
#if defined(DPKIT_WITH_MPI)
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = 0;
  if (o->nthreads > 1) {
    if (size > 1) {
      if (rank == 0)
        std::fprintf(stderr,
                     "%s: -t %d runs ranks as threads over the inproc transport; it cannot be combined with mpirun -np %d "
                     "(use one or the other)\n",
                     argv[0], o->nthreads, size);
      rc = 1;
    } else {
      rc = run_inproc<Coll>(*o);
    }
  } else {
    try {
      dpkit::mpi comm(MPI_COMM_WORLD);
      runner<Coll, dpkit::mpi> r(comm, *o, "mpi");
      rc = r.run() ? 1 : 0;
    } catch (const usage_error& e) {
      if (rank == 0) std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
      rc = 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: rank %d: error: %s\n", argv[0], rank, e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return rc;
#else
  return run_inproc<Coll>(*o);
#endif
}

} // namespace dpkit_bench
