// dpkit benchmarks: the nccl-tests-style driver. A *_perf program is
//   int main(int argc, char** argv) { return dpkit_bench::bench_main<dpkit_bench::collective::allreduce>(argc, argv); }
// and everything else follows from the collective: its algorithms
// (bench_collectives.hpp), its data check (bench_data.hpp), its output
// (bench_report.hpp).
//
// The runner selects (algorithms, roots, sizes), times and checks; it prints
// nothing itself but the rows it streams. Timing follows nccl-tests'
// BenchTime: one untimed collective, a barrier, then n iterations (x agg
// iters) timed with steady_clock; time per op = wall time / (n x agg), then
// reduced across ranks with -a (default here: max, the slowest rank). With
// -I every iteration is also timed on its own and the per-iteration maxima
// over ranks are summarised. Buffers are allocated once (bench_buffers.hpp),
// at the largest size, times -R's sets.
#pragma once

#include "bench_buffers.hpp"
#include "bench_collectives.hpp"
#include "bench_data.hpp"
#include "bench_floor.hpp"
#include "bench_options.hpp"
#include "bench_report.hpp"
#include "bench_tune.hpp"

#include <dpkit/dpkit.hpp>

#include "run_main.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#if defined(DPKIT_WITH_MPI)
#include <mpi.h>
#endif
#if defined(DPKIT_WITH_GLOO)
#include <dpkit/transport/launch.hpp>
#endif

namespace dpkit_bench {

/// A command-line combination this collective or transport cannot run; thrown
/// identically on every rank before any communication, printed once.
class usage_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// The sizes of a run, as nccl-tests steps them: from -b to -e, multiplying by
/// -f when it is > 1 (from 0 the next size is 1), else adding -i.
inline std::vector<std::size_t> sizes_of(const options& o) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    std::size_t next;
    if (o.step_factor > 1) {
      if (s == 0) next = 1; // nccl-tests would loop forever at 0
      else if (s > o.max_bytes / o.step_factor) break;
      else next = s * o.step_factor;
    } else {
      if (o.step_bytes == 0 || s > o.max_bytes - o.step_bytes) break;
      next = s + o.step_bytes;
    }
    s = next;
  }
  return sizes;
}

/// One rank's run of collective K over transport C.
template <class C, collective K>
class runner {
public:
  runner(C& comm, const options& o, transport_kind t)
      : comm_(comm), o_(o), transport_(t), rank_(comm.rank()), n_(comm.size()),
        out_(comm.rank() == 0 ? stdout : nullptr) {
    hopts_.tag = 0x7100; // harness messages (stats, header) never share tags with the measured collective
    hopts_.timeout = o.copts.timeout;
  }

  /// Runs every table; returns the number of failed checks (summed over ranks and tables).
  int run() {
    info_.start_time = utc_now();
    select_algorithms();
    select_roots();
    sizes_ = sizes_of(o_);
    llc_ = last_level_cache_bytes();
    const std::size_t pool = pool_bytes(o_.max_bytes, static_cast<std::size_t>(o_.rotate), o_.rotate_auto, llc_);
    if (o_.symmetric) {
      // (collective: every rank computed the same pool size from the same options)
      sym_send_ = dpkit::allocate_symmetric(comm_, pool, hopts_);
      sym_recv_ = dpkit::allocate_symmetric(comm_, pool, hopts_);
      send_base_ = sym_send_.data();
      recv_base_ = sym_recv_.data();
    } else {
      send_ = allocate(pool);
      recv_ = allocate(pool);
      send_base_ = send_.get();
      recv_base_ = recv_.get();
      if (o_.registered) { // (collective, as above)
        reg_send_ = dpkit::register_memory(comm_, send_base_, pool, hopts_);
        reg_recv_ = dpkit::register_memory(comm_, recv_base_, pool, hopts_);
      }
    }
    if (o_.check) expect_ = allocate(o_.max_bytes);
    info_.memory_shared = o_.registered  ? reg_send_.shared() && reg_recv_.shared()
                          : o_.symmetric ? sym_send_.shared() && sym_recv_.shared()
                                         : true;

    fill_info();
    if (out_) {
      print_run_header(out_, info_);
      std::fflush(out_);
    }
    // With several algorithms (-A all), every size is measured for all of
    // them back to back, so each comparison is taken in the same machine
    // state (a shared, noisy machine drifts over a long sweep); the tables
    // are printed afterwards, one per algorithm, in nccl-tests' format. A
    // single algorithm streams its rows as they are measured.
    tables_.assign(algos_.size(), table_state{});
    stream_ = algos_.size() == 1;
    if (stream_ && out_) {
      std::fprintf(out_, "# Algorithm: %s\n", std::string(algorithm_label(algos_[0])).c_str());
      print_table_header(out_, o_.iter_stats);
    }
    for (auto t : o_.types)
      dpkit::visit_element_type(t, [&](auto zero) { run_type<decltype(zero)>(); });
    int failed = 0;
    std::vector<std::string> names;
    std::vector<table_summary> summaries;
    std::vector<row_result> rows;
    for (std::size_t i = 0; i < algos_.size(); ++i) {
      const std::string an(algorithm_label(algos_[i]));
      names.push_back(an);
      auto& st = tables_[i];
      if (out_ && !stream_) {
        std::fprintf(out_, "# Algorithm: %s\n", an.c_str());
        print_table_header(out_, o_.iter_stats);
        for (const auto& row : st.rows) print_row(row);
      }
      const auto errs = static_cast<int>(sum_i64(st.errors));
      failed += errs;
      const double avg = st.bw_count ? st.bw_sum / st.bw_count : 0.0;
      if (out_) print_footer(out_, errs, avg);
      summaries.push_back({an, errs, avg});
      for (auto& row : st.rows) rows.push_back(std::move(row));
    }
    if (out_) {
      print_summary(out_, rows, names);
      info_.end_time = utc_now();
      write_result_files(out_, info_, rows, summaries);
      std::fflush(out_);
    }
    return failed;
  }

private:
  /// The figures one table accumulates.
  struct table_state {
    std::int64_t errors = 0; ///< this rank's failed checks
    double bw_sum = 0;
    int bw_count = 0;
    std::vector<row_result> rows;
  };

  void select_algorithms() {
    const auto offered = [&](const algorithm_entry& e) { return (e.collectives & bit(kind_)) != 0; };
    const std::string cname(collective_name(kind_));
    const std::string tname(transport_name(transport_));
    if (o_.algo_all) {
      for (const auto& e : algorithm_table) {
        if (!offered(e) || !e.in_all) continue;
        if (!transport_ready(comm_, e.need)) {
          if (e.need == transport_need::native_collectives) skipped_native_ = true;
          continue;
        }
        algos_.push_back(e.algo);
      }
      return;
    }
    for (auto a : o_.algorithms) {
      const auto e = find_algorithm(a);
      const std::string label(algorithm_label(a));
      if (!e || !offered(*e)) {
        std::string list;
        for (const auto& x : algorithm_table)
          if (offered(x) && transport_ready(comm_, x.need)) list += (list.empty() ? "" : " ") + std::string(x.label);
        throw usage_error("-A " + label + ": dpkit has no " + label + " " + cname + " (available: " + list + ")");
      }
      if (!transport_ready(comm_, e->need))
        throw usage_error("-A " + label + ": the " + tname + " transport has no " +
                          (e->need == transport_need::shared_memory ? std::string("shared segment (ranks on several nodes?)")
                           : e->need == transport_need::several_nodes
                               ? std::string("ranks on several nodes (run across hosts, or set DPKIT_RANKS_PER_NODE)")
                           : transport_ == transport_kind::gloo
                               ? std::string("native collectives: MPI's need mpirun (launched without mpirun, -A all "
                                             "measures dpkit's algorithms only)")
                               : std::string("native collectives (run under mpirun without -t for MPI's)")));
      algos_.push_back(a);
    }
  }

  void select_roots() {
    if (!rooted(kind_)) {
      roots_ = {-1};
    } else if (o_.root == -1) {
      for (int r = 0; r < n_; ++r) roots_.push_back(r);
    } else {
      if (o_.root < 0 || o_.root >= n_)
        throw usage_error("-r " + std::to_string(o_.root) + ": root out of range for " + std::to_string(n_) + " ranks");
      roots_ = {o_.root};
    }
  }

  /// Gathers every rank's "#  Rank" facts and fills the run-wide info.
  void fill_info() {
    // Fixed records: int32 rank, int32 pid, 248 bytes of host name.
    constexpr std::size_t L = 256;
    std::vector<std::uint8_t> mine(L, 0), all(L * static_cast<std::size_t>(n_), 0);
    const std::int32_t ids[2] = {rank_, static_cast<std::int32_t>(getpid())};
    std::memcpy(mine.data(), ids, sizeof ids);
    char host[L - sizeof ids] = {};
    if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
    std::memcpy(mine.data() + sizeof ids, host, sizeof host - 1);
    if constexpr (dpkit::native_collectives<C>)
      comm_.native_allgather(mine.data(), all.data(), L, dpkit::element_type::u8);
    else dpkit::allgather_ring(comm_, mine, all, hopts_);
    for (int r = 0; r < n_; ++r) {
      const std::uint8_t* p = all.data() + L * static_cast<std::size_t>(r);
      std::int32_t got[2];
      std::memcpy(got, p, sizeof got);
      const char* h = reinterpret_cast<const char*>(p + sizeof got);
      info_.ranks.push_back({got[0], got[1], std::string(h, strnlen(h, L - sizeof got))});
    }
    const std::string prog = o_.argv.empty() ? std::string(collective_name(kind_)) + "_perf" : o_.argv[0];
    info_.program = prog.substr(prog.find_last_of('/') == std::string::npos ? 0 : prog.find_last_of('/') + 1);
    info_.collective = std::string(collective_name(kind_));
    info_.transport = transport_;
    info_.nranks = n_;
    info_.busbw_formula = std::string(busbw_formula(kind_));
    info_.busbw_factor = busbw_factor(kind_, n_);
    info_.skipped_native = skipped_native_;
    info_.llc_bytes = llc_;
    info_.opts = &o_;
  }

  // ---- small collectives of the harness itself ----
  void barrier() {
    if constexpr (dpkit::native_collectives<C>) comm_.native_barrier();
    else dpkit::barrier(comm_, hopts_);
  }
  template <class T>
  void allreduce_harness(std::span<T> v, dpkit::reduce_op op) {
    if constexpr (dpkit::native_collectives<C>)
      comm_.native_allreduce(v.data(), v.data(), v.size(), dpkit::element_type_of_v<T>, op);
    else dpkit::allreduce_tree(comm_, v, op, hopts_);
  }
  double allreduce_f64(double v, dpkit::reduce_op op) {
    std::array<double, 1> a{v};
    allreduce_harness(std::span<double>(a), op);
    return a[0];
  }
  std::int64_t sum_i64(std::int64_t v) {
    std::array<std::int64_t, 1> a{v};
    allreduce_harness(std::span<std::int64_t>(a), dpkit::reduce_op::sum);
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

  /// The arguments of one call at size `bytes` on buffer set `set` (-R).
  template <class T>
  op_args<T> make_args(std::size_t bytes, dpkit::reduce_op op, int root, bool in_place, std::size_t set,
                       coll_counts& c) const {
    c = counts_for(kind_, bytes / sizeof(T), n_);
    const std::size_t off = set * set_stride(bytes);
    T* s = reinterpret_cast<T*>(send_base_ + off);
    T* r = reinterpret_cast<T*>(recv_base_ + off);
    return op_args<T>{std::span<T>(s, c.send), std::span<T>(r, c.recv), std::span<T>(r, std::max(c.send, c.recv)),
                      c.param, op, root, o_.copts, in_place};
  }

  /// Times and checks one half (one algorithm, size, in-place or not).
  template <class T>
  half_result bench(dpkit::algorithm a, std::size_t size, dpkit::reduce_op op, int root, bool in_place,
                    std::size_t row_bytes, table_state& st) {
    coll_counts c{};
    const auto x0 = make_args<T>(size, op, root, in_place, 0, c);
    const std::size_t nsets = rotation_sets(size, static_cast<std::size_t>(o_.rotate), o_.rotate_auto, llc_);
    // Call k of this measurement runs on set (cursor + k) mod nsets; the
    // cursor keeps moving across measurements (see bench_buffers.hpp).
    auto call = [&](std::size_t k) {
      if (nsets == 1) {
        run_collective<K>(comm_, a, x0);
      } else {
        coll_counts unused{};
        run_collective<K>(comm_, a, make_args<T>(size, op, root, in_place, (cursor_ + k) % nsets, unused));
      }
    };
    value_gen g{op, reduces(kind_), n_, 0};
    prepare_inputs(kind_, x0, g, rank_, false);
    std::size_t k = 0;
    call(k++); // untimed: the sync op of nccl-tests' BenchTime
    barrier();
    std::vector<double> samples;
    if (o_.iter_stats) samples.resize(static_cast<std::size_t>(o_.iters));
    const auto t0 = std::chrono::steady_clock::now();
    auto ti = t0;
    for (int i = 0; i < o_.iters; ++i) {
      for (int j = 0; j < o_.agg_iters; ++j) {
        call(k++);
        if (o_.blocking) barrier();
      }
      if (o_.iter_stats) {
        const auto now = std::chrono::steady_clock::now();
        samples[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::micro>(now - ti).count() / o_.agg_iters;
        ti = now;
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    cursor_ += k;
    const double local = std::chrono::duration<double>(t1 - t0).count() / (static_cast<double>(o_.iters) * o_.agg_iters);
    const double sec = reduce_time(local);
    half_result h;
    h.time_us = sec * 1e6;
    h.algbw = sec > 0 ? static_cast<double>(row_bytes) / 1.0e9 / sec : 0.0;
    h.busbw = h.algbw * busbw_factor(kind_, n_);
    if (o_.iter_stats) {
      allreduce_harness(std::span<double>(samples), dpkit::reduce_op::max); // the slowest rank, per iteration
      h.has_stats = true;
      h.stats = summarize_iterations(samples, static_cast<std::size_t>(o_.iter_skip));
    }
    if (o_.check > 0) h.wrong = check<T>(a, x0, g, st);
    st.bw_sum += h.busbw;
    ++st.bw_count;
    return h;
  }

  /// -c check iterations on buffer set 0; returns #wrong summed over ranks.
  template <class T>
  std::int64_t check(dpkit::algorithm a, const op_args<T>& x, value_gen g, table_state& st) {
    std::int64_t total = 0;
    for (int c = 0; c < o_.check; ++c) {
      g.seed = static_cast<std::uint64_t>(c) + 1;
      prepare_inputs(kind_, x, g, rank_, true);
      // The expected result depends on (type, op, root, count, seed) only:
      // computed once for the out-of-place and in-place halves.
      const expect_key key{static_cast<int>(dpkit::element_type_of_v<T>), static_cast<int>(g.op), x.root, x.count,
                           g.seed};
      if (!expect_valid_ || !(key == expect_key_)) {
        expect_len_ = expected_result(kind_, reinterpret_cast<T*>(expect_.get()), x.count, x.root, g, rank_);
        expect_key_ = key;
        expect_valid_ = true;
      }
      run_collective<K>(comm_, a, x);
      std::int64_t wrong = 0;
      if (expect_len_)
        wrong = count_wrong<T>(result_span(kind_, x, rank_, expect_len_),
                               std::span<const T>(reinterpret_cast<const T*>(expect_.get()), expect_len_));
      if (wrong) ++st.errors;
      total = sum_i64(wrong);
      if (total) break;
    }
    return total;
  }

  void print_row(const row_result& row) {
    print_row_preamble(out_, row);
    print_half(out_, row.oop);
    print_half(out_, row.ip);
    std::fprintf(out_, "\n");
    print_floor_line(out_, row);
  }

  /// --floor asked for and meaningful (the all-reduce's model).
  bool floor_on() const noexcept { return o_.floor && kind_ == collective::allreduce; }

  /// --floor: the node's rates for `bytes` (every rank measures at once, the
  /// slowest rank's) and the floor they give, into `row`.
  void measure_floor(std::size_t bytes, row_result& row) {
    const auto r = measure_rates(bytes, 5, [&] { barrier(); });
    double rates[3] = {r.copy_bytes_per_s, r.reduce_bytes_per_s, r.stream_bytes_per_s};
    allreduce_harness(std::span<double>(rates), dpkit::reduce_op::min);
    const memory_rates slowest{rates[0], rates[1], rates[2]};
    const double b = static_cast<double>(bytes);
    row.floor_us = stream_floor_seconds(b, slowest) * 1e6;
    row.stream_gbps = slowest.stream_bytes_per_s / 1e9;
    row.uncached_direct_us = uncached_seconds(floor_algo::direct, n_, b, slowest) * 1e6;
    const auto seg = best_uncached(n_, b, slowest, false);
    row.uncached_segment_us = seg.seconds * 1e6;
    row.uncached_segment_algo = std::string(floor_algo_name(seg.algo));
  }

  template <class T>
  void run_type() {
    const std::string tname(dpkit::element_type_name(dpkit::element_type_of_v<T>));
    for (auto op : o_.ops) {
      const std::string oname = reduces(kind_) ? std::string(dpkit::reduce_op_name(op)) : std::string("none");
      for (int root : roots_) {
        coll_counts c{};
        // Warm-up at the largest, then the smallest size (out of place), as nccl-tests.
        for (auto a : algos_)
          for (std::size_t s : {sizes_.back(), sizes_.front()}) {
            const auto x = make_args<T>(s, op, root, false, 0, c);
            for (int w = 0; w < o_.warmup; ++w) run_collective<K>(comm_, a, x);
          }
        for (std::size_t s : sizes_) {
          row_result floor_row; // --floor: measured once per size, before its rows
          if (floor_on()) {
            make_args<T>(s, op, root, false, 0, c);
            measure_floor(std::max(c.send, c.recv) * sizeof(T), floor_row);
          }
          for (std::size_t i = 0; i < algos_.size(); ++i) {
            const auto a = algos_[i];
            make_args<T>(s, op, root, false, 0, c);
            row_result row = floor_row;
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
            row.oop = bench<T>(a, s, op, root, false, row.bytes, tables_[i]);
            if (stream_ && out_) print_half(out_, row.oop);
            if (o_.skip_in_place) {
              row.ip.time_us = std::numeric_limits<double>::quiet_NaN();
              row.ip.wrong = -1;
            } else {
              row.ip = bench<T>(a, s, op, root, true, row.bytes, tables_[i]);
            }
            if (stream_ && out_) {
              print_half(out_, row.ip);
              std::fprintf(out_, "\n");
              print_floor_line(out_, row);
              std::fflush(out_);
            }
            if (out_) tables_[i].rows.push_back(std::move(row));
          }
        }
      }
    }
  }

  static constexpr collective kind_ = K;
  C& comm_;
  const options& o_;
  transport_kind transport_;
  int rank_, n_;
  std::FILE* out_;
  dpkit::collective_options hopts_;
  std::vector<dpkit::algorithm> algos_;
  bool skipped_native_ = false;
  std::vector<int> roots_;
  std::vector<std::size_t> sizes_;
  std::size_t llc_ = 0;
  std::size_t cursor_ = 0; ///< -R: the next buffer set
  buffer send_, recv_, expect_;
  dpkit::symmetric_memory sym_send_, sym_recv_; // --memory symmetric
  dpkit::registered_memory reg_send_, reg_recv_; // --memory registered: released before send_ and recv_ are freed
  std::byte* send_base_ = nullptr;               // send_'s or sym_send_'s bytes
  std::byte* recv_base_ = nullptr;
  struct expect_key {
    int type, op, root;
    std::size_t count;
    std::uint64_t seed;
    friend bool operator==(const expect_key&, const expect_key&) = default;
  };
  expect_key expect_key_{};
  bool expect_valid_ = false;
  std::size_t expect_len_ = 0;
  std::vector<table_state> tables_;
  run_info info_;
  bool stream_ = true;
};

/// allreduce_perf's --tune and --explain (parse_options takes them for the
/// all-reduce only): run on `comm` and return the exit code, or -1 when
/// neither was asked for (or K is another collective: nothing of theirs is
/// compiled into the other programs).
template <collective K, class C>
int tune_or_explain(C& comm, const options& o) {
  if constexpr (K == collective::allreduce) {
    if (!o.tune_file.empty()) return tune_allreduce(comm, o, o.tune_file);
    if (!o.explain_arg.empty()) return explain_allreduce(comm, o.explain_bytes);
  } else {
    (void)comm, (void)o;
  }
  return -1;
}

/// Runs o.nthreads ranks as threads over the inproc transport. Returns the exit code.
template <collective K>
int run_inproc(const options& o) {
  dpkit::inproc_world world(o.nthreads);
  std::atomic<int> failed{0};
  try {
    world.run([&](dpkit::inproc& comm) {
      int f = tune_or_explain<K>(comm, o);
      if (f < 0) {
        runner<dpkit::inproc, K> r(comm, o, transport_kind::inproc);
        f = r.run();
      }
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

#if defined(DPKIT_WITH_GLOO)
/// Runs this process as rank job.rank of job.world_size over a
/// gloo_transport built from the launch (--rendezvous/--rank/--world-size
/// or torch's env:// variables), without MPI. Returns the exit code. An
/// error other than a usage error is not caught (run_main reports it; the
/// peers' waits fail when this process's connections close).
template <collective K>
int run_gloo(const options& o, const dpkit::launch_info& job) {
  const char* prog = o.argv.empty() ? "bench" : o.argv[0].c_str();
  // Refused before connecting: a rank started alone must not wait for its
  // peers to learn that its command line cannot run.
  for (auto a : o.algorithms)
    if (a == dpkit::algorithm::native) {
      if (job.rank == 0)
        std::fprintf(stderr,
                     "%s: -A native: the gloo transport has no native collectives: MPI's need mpirun (launched "
                     "without mpirun, -A all measures dpkit's algorithms only)\n",
                     prog);
      return 1;
    }
  dpkit::gloo_options go;
  go.timeout = o.copts.timeout; // -T, else DPKIT_TIMEOUT, else 30 min: the rendezvous too
  dpkit::gloo_transport comm = dpkit::connect_launch(job, go);
  int rc = 0;
  try {
    rc = tune_or_explain<K>(comm, o);
    if (rc < 0) {
      runner<dpkit::gloo_transport, K> r(comm, o, transport_kind::gloo);
      rc = r.run() ? 1 : 0;
    }
  } catch (const usage_error& e) {
    if (comm.rank() == 0) std::fprintf(stderr, "%s: %s\n", prog, e.what());
    rc = 1;
  }
  return rc;
}
#endif

/// The launch without mpirun this process was given (flags, else
/// DPKIT_RENDEZVOUS / DPKIT_RANK / DPKIT_WORLD_SIZE, else torch's env://
/// variables), when no MPI launcher started it: runs it and returns true
/// with the exit code in `rc`; false when there is none (run as before).
template <collective K>
bool run_launched(const options& o, int& rc) {
  const char* prog = o.argv.empty() ? "bench" : o.argv[0].c_str();
  if (detail::started_by_mpi_launcher()) return false; // parse_options refused the flags under mpirun
#if defined(DPKIT_WITH_GLOO)
  std::optional<dpkit::launch_info> job;
  try {
    job = dpkit::resolve_launch({o.rendezvous, o.launch_rank, o.launch_world_size});
  } catch (const dpkit::invalid_argument& e) {
    std::fprintf(stderr, "%s: %s\n", prog, e.what()); // every process: each names its own value
    rc = 1;
    return true;
  }
  if (!job) return false;
  if (o.nthreads > 1) {
    if (job->rank == 0)
      std::fprintf(stderr,
                   "%s: -t %d runs ranks as threads of one process; it cannot be combined with a launch of %d "
                   "processes (--rendezvous or the env:// variables)\n",
                   prog, o.nthreads, job->world_size);
    rc = 1;
    return true;
  }
  rc = run_gloo<K>(o, *job);
  return true;
#else
  if (!o.launch_flags_given() && !std::getenv("DPKIT_RENDEZVOUS")) return false;
  std::fprintf(stderr,
               "%s: --rendezvous/--rank/--world-size (or DPKIT_RENDEZVOUS) launch without mpirun over the Gloo "
               "transport, and this build has none (Meson feature gloo, Debian libgloo-dev): run under mpirun\n",
               prog);
  rc = 1;
  return true;
#endif
}

/// The body of bench_main (below).
template <collective K>
int bench_main_body(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int code = 0;
  const auto o = parse_options(argc, argv, K, code);
  if (!o) return code;
  if (!o->predict_shape.empty()) return predict_allreduce(*o, o->predict_shape);
  // Launched without mpirun (flags or env://): Gloo ranks, no MPI_Init.
  if (int rc = 0; run_launched<K>(*o, rc)) return rc;
#if defined(DPKIT_WITH_MPI)
  int provided = 0;
  // MPI_THREAD_MULTIPLE: the hierarchical all-reduce runs its stage between
  // nodes on the cross transport's communication thread (native is timed
  // under the same thread level)
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
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
      rc = run_inproc<K>(*o);
    }
  } else {
    // A usage error is thrown alike on every rank before any communication;
    // any other error is not caught: run_main ends the whole job with it,
    // without unwinding through comm while other ranks wait in a collective.
    try {
      dpkit::mpi comm(MPI_COMM_WORLD);
      rc = tune_or_explain<K>(comm, *o);
      if (rc < 0) {
        runner<dpkit::mpi, K> r(comm, *o, transport_kind::mpi);
        rc = r.run() ? 1 : 0;
      }
    } catch (const usage_error& e) {
      if (rank == 0) std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
#else
  return run_inproc<K>(*o);
#endif
}

/// The main() of a *_perf program measuring collective K: an error on any
/// rank prints "<program>: rank R: <what>" and ends the whole job
/// (examples/run_main.hpp), never a hang.
template <collective K>
int bench_main(int argc, char** argv) {
  const char* slash = argc > 0 ? std::strrchr(argv[0], '/') : nullptr;
  const char* program = argc > 0 ? (slash ? slash + 1 : argv[0]) : "bench";
  return dpkit_programs::run_main(program, [&] { return bench_main_body<K>(argc, argv); });
}

} // namespace dpkit_bench
