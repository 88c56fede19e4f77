// dpkit benchmarks: command-line options, parsed with CLI11 and spelled as
// nccl-tests spells them (single-dash short options with a value: -b 8 -e 256M
// -f 2, -I 1 -K 2 -J out.json), plus dpkit's own (-A, -R, -S, --depth, --csv).
// See docs/benchmarks.md.
#pragma once

#include "bench_main.hpp"

#include <dpkit/dpkit.hpp>

#include <CLI/CLI.hpp>

#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dpkit_bench {

/// The transport a run measures: MPI ranks (under mpirun), ranks as
/// threads of one process (-t N, or a build without MPI), or processes
/// launched without mpirun that meet through a Gloo store (--rendezvous or
/// torch's env:// variables; transport/launch.hpp).
enum class transport_kind { mpi, inproc, gloo };

/// "mpi", "inproc" or "gloo" (the header and the CSV / JSON files print this).
inline constexpr std::string_view transport_name(transport_kind t) noexcept {
  return t == transport_kind::mpi ? "mpi" : t == transport_kind::inproc ? "inproc" : "gloo";
}

/// nccl-tests' order of -d all: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16.
inline const std::vector<dpkit::element_type>& all_types() {
  using E = dpkit::element_type;
  static const std::vector<E> v{E::i8, E::u8, E::i32, E::u32, E::i64, E::u64, E::f16, E::f32, E::f64, E::bf16};
  return v;
}
/// nccl-tests' order of -o all: sum prod max min avg.
inline const std::vector<dpkit::reduce_op>& all_ops() {
  using R = dpkit::reduce_op;
  static const std::vector<R> v{R::sum, R::prod, R::max, R::min, R::avg};
  return v;
}

/// Parses a size as nccl-tests does: a number, optionally fractional, with an
/// optional K/M/G suffix (powers of 1024, either case). Throws on anything else.
inline std::size_t parse_size(const std::string& s) {
  const char* p = s.c_str();
  char* end = nullptr;
  const double v = std::strtod(p, &end);
  if (end == p || !std::isfinite(v) || v < 0) throw std::invalid_argument("invalid size '" + s + "'");
  while (*end == ' ') ++end;
  double unit = 1;
  if (*end) {
    switch (*end) {
    case 'k': case 'K': unit = 1024.0; break;
    case 'm': case 'M': unit = 1024.0 * 1024.0; break;
    case 'g': case 'G': unit = 1024.0 * 1024.0 * 1024.0; break;
    default: throw std::invalid_argument("invalid size '" + s + "' (suffix must be K, M or G)");
    }
    ++end;
    if (*end == 'B' || *end == 'b') ++end; // tolerate "256MB"
    if (*end) throw std::invalid_argument("invalid size '" + s + "'");
  }
  const double bytes = v * unit;
  if (bytes > 1.8e19) throw std::invalid_argument("size '" + s + "' is too large");
  return static_cast<std::size_t>(bytes);
}

/// Parses "float", "half", ... (nccl-tests names) or throws.
inline dpkit::element_type parse_type(std::string_view s) {
  for (auto t : all_types())
    if (dpkit::element_type_name(t) == s) return t;
  throw std::invalid_argument("unknown data type '" + std::string(s) +
                              "' (expected int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 or all)");
}

/// All options of one run.
struct options {
  int nthreads = 1;                       ///< -t: ranks as threads of this process (inproc transport)
  int ngpus = 1;                          ///< -g: GPUs per thread (CUDA build only)
  std::size_t min_bytes = 32u << 20;      ///< -b
  std::size_t max_bytes = 32u << 20;      ///< -e
  std::size_t step_bytes = 1u << 20;      ///< -i
  std::size_t step_factor = 1;            ///< -f (> 1: multiply; else add step_bytes)
  int iters = 20;                         ///< -n
  int agg_iters = 1;                      ///< -m
  int warmup = 1;                         ///< -w
  int check = 1;                          ///< -c: check iterations (0: no check, #wrong is N/A)
  std::vector<dpkit::reduce_op> ops;      ///< -o
  std::vector<dpkit::element_type> types; ///< -d
  int root = 0;                           ///< -r (-1: every root in turn)
  int blocking = 0;                       ///< -z: barrier after every collective
  int graph = 0;                          ///< -G: CUDA graph launches (CUDA build only; ignored otherwise)
  int average = 3;                        ///< -a: 0 rank 0, 1 average, 2 min, 3 max (default: slowest rank)
  std::string json_file;                  ///< -J
  std::string csv_file;                   ///< --csv
  std::string algo_arg = "auto";          ///< -A as given
  bool algo_all = false;                  ///< -A all
  std::vector<dpkit::algorithm> algorithms; ///< -A parsed (empty with all)
  int rotate = 0;                         ///< -R: buffer sets rotated over iterations (0/1: off)
  bool rotate_auto = false;               ///< -R auto: enough sets to exceed the last-level cache (see bench_buffers.hpp)
  int iter_stats = 0;                     ///< -I: 1 adds per-iteration i_min i_max i_p99 i_cv% columns
  int iter_skip = 0;                      ///< -K: samples skipped at the start of the -I summary
  dpkit::collective_options copts;        ///< -S, --depth, -T
  std::string op_arg = "sum", type_arg = "float";
  std::vector<std::string> argv;          ///< the command line, for JSON
  bool skip_in_place = false;             ///< --skip-in-place: in-place halves print N/A
  std::string tune_file;                  ///< --tune FILE (allreduce_perf)
  std::string explain_arg;                ///< --explain SIZE (allreduce_perf)
  std::size_t explain_bytes = 0;
  std::string predict_shape;              ///< --predict NxL (allreduce_perf)
  bool floor = false;                     ///< --floor: the memory floor under each row (allreduce_perf, host)
  bool symmetric = false;                 ///< --memory symmetric: buffers from dpkit::allocate_symmetric
  bool registered = false;                ///< --memory registered: host buffers passed to dpkit::register_memory
  /// --rendezvous URL, --rank R, --world-size W as typed (nullopt: not
  /// given): a launch without mpirun, resolved with the environment by
  /// dpkit::resolve_launch (transport/launch.hpp) in bench_main.
  std::optional<std::string> rendezvous, launch_rank, launch_world_size;
  /// Whether any of the three launch flags was given.
  bool launch_flags_given() const noexcept { return rendezvous || launch_rank || launch_world_size; }
};

namespace detail {
/// True on the process that should print usage errors: rank 0 of an mpirun
/// job (read from the launcher's environment, before MPI_Init), rank 0 of a
/// launch without mpirun (DPKIT_RANK, else torch's RANK), or a plain run.
inline bool launcher_rank0() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "DPKIT_RANK",
                          "RANK"}) {
    if (const char* v = std::getenv(var)) return std::string_view(v) == "0";
  }
  return true;
}
/// True when an MPI launcher (mpirun, mpiexec, srun with PMI) started this
/// process: its ranks are MPI's, and MPI_Init must run.
inline bool started_by_mpi_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"})
    if (std::getenv(var)) return true;
  return false;
}
} // namespace detail

/// Parses argv. Returns the options, or an exit code when the run should stop
/// (--help: 0, bad arguments: 1). Errors are printed by launcher rank 0 only.
inline std::optional<options> parse_options(int argc, char** argv, collective kind, int& exit_code) {
  options o;
  for (int i = 0; i < argc; ++i) o.argv.emplace_back(argv[i]);
  const bool has_op = kind == collective::allreduce || kind == collective::reduce_scatter || kind == collective::reduce;
  const bool has_root = kind == collective::broadcast || kind == collective::reduce;

  CLI::App app{"dpkit collective benchmark (nccl-tests flags and output; see docs/benchmarks.md)"};
  std::string b = "32M", e = "32M", i = "1M", seg;
  int depth = 0;
  long timeout_s = 0;
  bool native_deadline = false;
  std::string memory = "host", rotate = "0";
  app.add_option("-t,--nthreads", o.nthreads,
                 "ranks run as threads of this process over the inproc transport (dpkit's analogue of nccl-tests' "
                 "threads per process; without MPI this is the only mode)");
  app.add_option("-g,--ngpus", o.ngpus, "GPUs per thread: accepted for nccl-tests compatibility; only 1 (host memory)");
  app.add_option("-b,--minbytes", b, "smallest size in bytes (K/M/G suffixes), default 32M");
  app.add_option("-e,--maxbytes", e, "largest size in bytes (K/M/G suffixes), default 32M");
  app.add_option("-i,--stepbytes", i, "size increment when -f is 1, default 1M");
  app.add_option("-f,--stepfactor", o.step_factor, "size multiplication factor (> 1 overrides -i)");
  app.add_option("-n,--iters", o.iters, "timed iterations per size, default 20");
  app.add_option("-m,--agg_iters", o.agg_iters, "collectives per timed iteration, default 1");
  app.add_option("-w,--warmup_iters", o.warmup, "warmup iterations (at the largest and smallest size), default 1");
  app.add_option("-c,--check", o.check, "check iterations per size (0: no data check, #wrong prints N/A), default 1");
  app.add_option("-o,--op", o.op_arg,
                 has_op ? "sum|prod|min|max|avg|all, default sum" : "accepted for nccl-tests compatibility; ignored");
  app.add_option("-d,--datatype", o.type_arg,
                 "int8|uint8|int32|uint32|int64|uint64|half|float|double|bfloat16|all, default float");
  app.add_option("-r,--root", o.root,
                 has_root ? "root rank (-1: every root in turn), default 0"
                          : "accepted for nccl-tests compatibility; ignored");
  app.add_option("-z,--blocking", o.blocking, "1: barrier after every collective, default 0");
  app.add_option("-G,--cudagraph", o.graph, "CUDA graph launches: accepted for nccl-tests compatibility; ignored (host transports)");
  app.add_option("-a,--average", o.average,
                 "time reduction across ranks: 0 rank 0, 1 average, 2 min, 3 max (default 3: the slowest rank)");
  app.add_option("-J,--json", o.json_file, "write results as JSON to this file (rank 0; nccl-tests 2.19's keys)");
  app.add_option("-I,--iteration_stats", o.iter_stats,
                 "1: time every iteration and add i_min i_max i_p99 i_cv% per half (the slowest rank's), default 0");
  app.add_option("-K,--iteration_skip", o.iter_skip, "samples skipped at the start of the -I summary, default 0");
  app.add_option("-R,--rotate", rotate,
                 "N: rotate over N buffer sets (iteration i uses set i mod N); auto: enough sets to exceed the "
                 "last-level cache; 0: one set (default)");
  app.add_option("--csv", o.csv_file, "write results as CSV to this file (rank 0)");
  app.add_option("-A,--algorithm", o.algo_arg,
                 "ring|tree|shm|shm1|shm2|hier|native|auto|all, or a comma list (dpkit extension), default auto");
  app.add_option("-S,--segment-bytes", seg, "collective_options.segment_bytes (K/M/G suffixes) for tuning sweeps");
  app.add_option("--depth", depth, "collective_options.pipeline_depth (>= 1)");
  app.add_option("-T,--timeout", timeout_s, "collective timeout in seconds (default: DPKIT_TIMEOUT, else 30 min)");
  app.add_flag("--native-deadline", native_deadline,
               "time native as dpkit runs it by default: MPI's non-blocking collective waited against the deadline "
               "(default: the blocking MPI call, the baseline)");
  app.add_option("--memory", memory,
                 "host (default), symmetric (dpkit::allocate_symmetric: every rank of the node maps every "
                 "rank's buffers, and the shm all-reduce reads and writes them directly) or registered (host "
                 "buffers, then dpkit::register_memory on them: the same, for memory the caller allocated); "
                 "device buffers are not supported");
  app.add_flag("--skip-in-place", o.skip_in_place,
               "measure out of place only (in-place columns print N/A): for MPI components whose MPI_IN_PLACE is "
               "broken, e.g. Open MPI 4.1.4's coll/han, which crashes on in-place all-reduces from 256 KiB");
  std::string rendezvous, launch_rank, launch_world;
  auto* rdv_opt = app.add_option(
      "--rendezvous", rendezvous,
      "launch without mpirun: the store the ranks meet through, tcp://HOST:PORT (rank 0 serves it), file:///DIR "
      "or redis://HOST:PORT/JOB; with --rank and --world-size (or DPKIT_RANK/RANK, DPKIT_WORLD_SIZE/WORLD_SIZE). "
      "Without flags, torch's env:// variables MASTER_ADDR MASTER_PORT RANK WORLD_SIZE do the same. Gloo transport: "
      "dpkit's algorithms only (no native)");
  auto* rank_opt = app.add_option("--rank", launch_rank, "launch without mpirun: this process's rank in [0, --world-size)");
  auto* world_opt = app.add_option("--world-size", launch_world, "launch without mpirun: the number of processes, >= 1");
  if (kind == collective::allreduce) {
    app.add_option("--tune", o.tune_file,
                   "measure every algorithm at each size of -b/-e/-f and the link costs; write the tuning file "
                   "that auto reads through DPKIT_TUNING_FILE (docs/tuning.md)");
    app.add_option("--explain", o.explain_arg, "print what auto runs for this many bytes on this transport, and why");
    app.add_option("--predict", o.predict_shape,
                   "NODESxRANKS: the cost model's busbw table over -b/-e/-f from DPKIT_TUNING_FILE's link costs");
    app.add_flag("--floor", o.floor,
                 "measure the node's copy, reduce and stream rates at each size (all ranks at once) and print the all-reduce's "
                 "memory floor under each row, with the row's time / floor (benchmarks/common/bench_floor.hpp)");
  }

  bool print = detail::launcher_rank0();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    if (print) exit_code = app.exit(err);
    else exit_code = err.get_exit_code();
    return std::nullopt;
  }
  if (rdv_opt->count()) o.rendezvous = rendezvous;
  if (rank_opt->count()) {
    o.launch_rank = launch_rank;
    print = launch_rank == "0";
  }
  if (world_opt->count()) o.launch_world_size = launch_world;
  auto fail = [&](const std::string& msg) -> std::optional<options> {
    if (print) std::fprintf(stderr, "%s: %s\n", argv[0], msg.c_str());
    exit_code = 1;
    return std::nullopt;
  };
  try {
    o.min_bytes = parse_size(b);
    o.max_bytes = parse_size(e);
    o.step_bytes = parse_size(i);
    if (!seg.empty()) o.copts.segment_bytes = parse_size(seg);
    if (!o.explain_arg.empty()) o.explain_bytes = parse_size(o.explain_arg);
    if (rotate == "auto") {
      o.rotate_auto = true;
    } else {
      char* end = nullptr;
      const long r = std::strtol(rotate.c_str(), &end, 10);
      if (rotate.empty() || *end != '\0' || r < 0 || r > (1 << 20))
        throw std::invalid_argument("-R " + rotate + ": expected a set count in [0, 1048576] or auto");
      o.rotate = static_cast<int>(r);
    }
    if (o.op_arg == "all") o.ops = all_ops();
    else o.ops = {dpkit::parse_reduce_op(o.op_arg)};
    if (o.type_arg == "all") o.types = all_types();
    else o.types = {parse_type(o.type_arg)};
    if (o.algo_arg == "all") {
      o.algo_all = true;
    } else {
      std::string_view rest = o.algo_arg;
      while (!rest.empty()) {
        const auto comma = rest.find(',');
        const auto tok = rest.substr(0, comma);
        if (!tok.empty()) o.algorithms.push_back(dpkit::parse_algorithm(tok));
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
      if (o.algorithms.empty()) return fail("-A needs ring, tree, shm, shm1, shm2, hier, native, auto or all");
    }
  } catch (const std::exception& ex) {
    return fail(ex.what());
  }
  if (!has_op) o.ops = {dpkit::reduce_op::sum};
  if (!has_root) o.root = -1;
  if (o.min_bytes > o.max_bytes)
    return fail("invalid sizes for 'minbytes' and 'maxbytes': " + std::to_string(o.min_bytes) + " > " +
                std::to_string(o.max_bytes));
  if (o.step_factor <= 1 && o.step_bytes == 0 && o.min_bytes != o.max_bytes)
    return fail("-i 0 with -f 1 would never reach maxbytes");
  if (o.nthreads < 1) return fail("-t must be >= 1");
  if (o.launch_flags_given() && detail::started_by_mpi_launcher())
    return fail("--rendezvous, --rank and --world-size launch without mpirun; under mpirun the ranks are MPI's "
                "(drop the flags, or start the processes without mpirun)");
  if (o.launch_flags_given() && o.nthreads > 1)
    return fail("-t " + std::to_string(o.nthreads) +
                " runs ranks as threads of one process; it cannot be combined with --rendezvous/--rank/--world-size "
                "(use one or the other)");
  if (o.iters < 1) return fail("-n must be >= 1");
  if (o.agg_iters < 1) return fail("-m must be >= 1");
  if (o.warmup < 0) return fail("-w must be >= 0");
  if (o.check < 0) return fail("-c must be >= 0");
  if (o.average < 0 || o.average > 3) return fail("-a must be 0 (rank 0), 1 (avg), 2 (min) or 3 (max)");
  if (depth < 0) return fail("--depth must be >= 1");
  if (depth > 0) o.copts.pipeline_depth = depth;
  if (o.copts.segment_bytes == 0) return fail("-S must be > 0");
  if (timeout_s > 0) o.copts.timeout = std::chrono::milliseconds(timeout_s * 1000);
  // Native is the baseline: the blocking MPI collective (MPI_Allreduce under
  // coll/tuned or coll/sm), not the non-blocking one dpkit waits against the
  // deadline by default (docs/reliability.md).
  o.copts.native_deadline = native_deadline;
  if (o.iter_stats != 0 && o.iter_stats != 1) return fail("-I must be 0 or 1");
  if (o.iter_skip < 0) return fail("-K must be >= 0");
  if (o.iter_stats && o.iter_skip >= o.iters)
    return fail("-K " + std::to_string(o.iter_skip) + " skips every one of the " + std::to_string(o.iters) +
                " iterations (-n)");
  if (memory == "device")
    return fail("--memory device: these benchmarks measure host-memory collectives only (the CUDA reduction "
                "kernels have build/benchmarks/reduce_kernel_perf)");
  if (memory != "host" && memory != "symmetric" && memory != "registered")
    return fail("--memory must be host, symmetric or registered");
  o.symmetric = memory == "symmetric";
  o.registered = memory == "registered";
  if (o.ngpus < 1) return fail("-g must be >= 1");
  if (o.ngpus > 1)
    return fail("-g " + std::to_string(o.ngpus) +
                ": several GPUs per thread are not supported; these benchmarks measure host-memory collectives");
  return o;
}

} // namespace dpkit_bench
