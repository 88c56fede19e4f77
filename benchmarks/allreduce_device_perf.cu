// allreduce_device_perf: all-reduce of CUDA device buffers on one GPU, without
// MPI: NCCL's ncclAllReduce next to dpkit's paths, in one nccl-tests-style
// table (float sum, out of place, sizes -b..-e stepping by -f).
//
//   allreduce_device_perf [-b 8] [-e 1G] [-f 2] [-n 20] [-w 5] [-g device] [-r ranks] [-c 0|1]
//   allreduce_device_perf --probe      # the device, driver, runtime and NCCL; exit 0, or 77 without a device
//
// Columns (time per call in microseconds, algbw = size / time in GB/s):
//   nccl    ncclAllReduce on a one-rank communicator (dpkit::nccl::single):
//           the -n calls enqueued back to back on the stream and timed with
//           CUDA events, as nccl-tests times them. On one rank it is NCCL's
//           device copy.
//   native  dpkit::allreduce(..., algorithm::native) on the same
//           communicator: the same ncclAllReduce plus dpkit's wait for its
//           completion in every call (host clock): what a dpkit caller pays.
//   ring1   dpkit::allreduce_ring over the NCCL transport with dpkit's
//           kernels (nccl_options::kernels), one rank: a copy on the
//           transport's stream, waited for.
//   ringN   dpkit::allreduce_ring over the inproc transport with the CUDA
//           device_ops table: -r ranks (default 2) as threads of this process
//           on the one GPU, each with its own stream; the reduction kernels
//           (reduce_device, divide_device) and device-to-device copies
//           between the ranks' buffers. busbw = algbw x 2(n-1)/n. It has no
//           NCCL counterpart here: NCCL refuses two ranks of one
//           communicator on one GPU, and comparing with ncclAllReduce over
//           several ranks needs one GPU per rank (tests/gpu/test_nccl_mpi.cu,
//           under mpirun).
// #wrong: elements that differ from the expected sum after one more call
// (the output cleared first), over all columns; -c 0 skips the check. Every
// rank's input is rank + 1, so the expected sum is exact in float.
//
// Exit status: 0, 1 when an element was wrong or a call failed, 2 for a usage
// error, 77 when no CUDA device is visible (nothing is measured).
// A line "# key: ..." at the end gives the figures scripts/device_check.sh
// puts into its summary.
#include <dpkit/collectives.hpp>
#include <dpkit/cuda/device_ops.cuh>
#include <dpkit/transport/inproc.hpp>
#include <dpkit/transport/nccl.hpp>

#include "device_bench_kernels.cuh"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;

using dpkit_device_bench::count_wrong_kernel;
using dpkit_device_bench::fill_kernel;

unsigned grid_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>(std::max<std::size_t>((n + 255) / 256, 1), 4096));
}

void fill(float* p, std::size_t n, float v, cudaStream_t s) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), 256, 0, s>>>(p, n, v);
  DPKIT_CUDA_CHECK(cudaGetLastError());
  DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
}

// Elements of p[0, n) that are not `want` (synchronous on stream s).
unsigned long long count_wrong(const float* p, std::size_t n, float want, cudaStream_t s) {
  if (n == 0) return 0;
  unsigned long long* d = nullptr;
  DPKIT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof *d, s));
  DPKIT_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof *d, s));
  count_wrong_kernel<<<grid_for(n), 256, 0, s>>>(p, n, want, d);
  DPKIT_CUDA_CHECK(cudaGetLastError());
  unsigned long long h = 0;
  DPKIT_CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s));
  DPKIT_CUDA_CHECK(cudaFreeAsync(d, s));
  DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

std::size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (end && *end ? *end : ' ') {
  case 'K': case 'k': v *= 1024.0; break;
  case 'M': case 'm': v *= 1024.0 * 1024.0; break;
  case 'G': case 'g': v *= 1024.0 * 1024.0 * 1024.0; break;
  default: break;
  }
  return static_cast<std::size_t>(v);
}

struct config {
  std::size_t min_bytes = 8, max_bytes = std::size_t{1} << 30, factor = 2;
  int iters = 20, warmup = 5, device = 0, ranks = 2;
  bool check = true, probe = false;
};

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [-b minbytes=8] [-e maxbytes=1G] [-f factor=2] [-n iters=20] [-w warmup=5]\n"
               "          [-g device=0] [-r inproc_ranks=2] [-c check=1] | --probe\n",
               argv0);
  std::exit(2);
}

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(argv[0]);
    if (a == "--probe") {
      c.probe = true;
      continue;
    }
    if (i + 1 >= argc) usage(argv[0]);
    const char* v = argv[++i];
    if (a == "-b" || a == "--minbytes") c.min_bytes = parse_size(v);
    else if (a == "-e" || a == "--maxbytes") c.max_bytes = parse_size(v);
    else if (a == "-f" || a == "--stepfactor") c.factor = static_cast<std::size_t>(std::atol(v));
    else if (a == "-n" || a == "--iters") c.iters = std::atoi(v);
    else if (a == "-w" || a == "--warmup_iters") c.warmup = std::atoi(v);
    else if (a == "-g" || a == "--device") c.device = std::atoi(v);
    else if (a == "-r" || a == "--ranks") c.ranks = std::atoi(v);
    else if (a == "-c" || a == "--check") c.check = std::atoi(v) != 0;
    else usage(argv[0]);
  }
  if (c.factor < 2) c.factor = 2;
  if (c.iters < 1) c.iters = 1;
  if (c.warmup < 0) c.warmup = 0;
  if (c.min_bytes < 4) c.min_bytes = 4;
  if (c.ranks < 2) c.ranks = 2;
  return c;
}

// The sizes of the run, as nccl-tests steps them (multiples of 4 bytes).
std::vector<std::size_t> sizes_of(const config& c) {
  std::vector<std::size_t> v;
  for (std::size_t b = c.min_bytes; b <= c.max_bytes; b *= c.factor) {
    v.push_back(b / 4 * 4);
    if (b > c.max_bytes / c.factor) break;
  }
  return v;
}

// Prints the device, driver, runtime and NCCL versions.
void print_probe(int device) {
  cudaDeviceProp prop{};
  DPKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int drv = 0, rt = 0, nv = 0;
  DPKIT_CUDA_CHECK(cudaDriverGetVersion(&drv));
  DPKIT_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
  dpkit::nccl_check(ncclGetVersion(&nv), "ncclGetVersion");
  std::printf("# device %d: %s, sm_%d%d, %.1f GiB, %d SMs; CUDA driver %d.%d, runtime %d.%d; NCCL %d.%d.%d "
              "(%d devices visible)\n",
              device, prop.name, prop.major, prop.minor, static_cast<double>(prop.totalGlobalMem) / (1u << 30),
              prop.multiProcessorCount, drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10, nv / 10000,
              nv % 10000 / 100, nv % 100, dpkit::cuda_device_count());
}

enum column { col_nccl, col_native, col_ring1, col_ringn, ncols };

struct results {
  std::vector<std::size_t> sizes;
  std::vector<std::vector<double>> us;         // [column][size]: microseconds per call
  std::vector<unsigned long long> wrong;       // [size], over all columns
};

// The three one-rank columns on the NCCL transport.
void run_nccl(const config& c, results& res) {
  dpkit::nccl_options o;
  o.kernels = dpkit::cuda_kernels();
  auto comm = dpkit::nccl::single(c.device, o);
  const cudaStream_t s = comm.stream();
  const std::size_t max_count = res.sizes.empty() ? 0 : res.sizes.back() / 4;
  dpkit::device_buffer<float> in(std::max<std::size_t>(max_count, 1), c.device),
      out(std::max<std::size_t>(max_count, 1), c.device);
  fill(in.data(), max_count, 1.0f, s);
  cudaEvent_t e0{}, e1{};
  DPKIT_CUDA_CHECK(cudaEventCreate(&e0));
  DPKIT_CUDA_CHECK(cudaEventCreate(&e1));
  for (std::size_t k = 0; k < res.sizes.size(); ++k) {
    const std::size_t count = res.sizes[k] / 4;
    dpkit::tensor_view<float> iv{in.data(), count, dpkit::memory_space::device};
    dpkit::tensor_view<float> ov{out.data(), count, dpkit::memory_space::device};
    auto raw = [&] {
      dpkit::nccl_check(ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, comm.comm(), s),
                        "ncclAllReduce");
    };
    auto native = [&] { dpkit::allreduce(comm, iv, ov, dpkit::reduce_op::sum, {dpkit::algorithm::native}); };
    auto ring = [&] { dpkit::allreduce_ring(comm, iv, ov, dpkit::reduce_op::sum); };
    // nccl-tests' timing: enqueue every call, one event pair around them
    for (int i = 0; i < c.warmup; ++i) raw();
    DPKIT_CUDA_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < c.iters; ++i) raw();
    DPKIT_CUDA_CHECK(cudaEventRecord(e1, s));
    DPKIT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    DPKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    res.us[col_nccl][k] = 1e3 * static_cast<double>(ms) / c.iters;
    // dpkit's calls return when complete: host clock
    auto host_time = [&](auto&& f) {
      for (int i = 0; i < c.warmup; ++i) f();
      DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
      const auto t0 = clk::now();
      for (int i = 0; i < c.iters; ++i) f();
      DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
      return 1e6 * std::chrono::duration<double>(clk::now() - t0).count() / c.iters;
    };
    res.us[col_native][k] = host_time(native);
    res.us[col_ring1][k] = host_time(ring);
    if (c.check) {
      const auto check_one = [&](auto&& f) {
        fill(out.data(), count, 0.0f, s);
        f();
        DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
        return count_wrong(out.data(), count, 1.0f, s);
      };
      res.wrong[k] += check_one(raw) + check_one(native) + check_one(ring);
    }
  }
  DPKIT_CUDA_CHECK(cudaEventDestroy(e0));
  DPKIT_CUDA_CHECK(cudaEventDestroy(e1));
}

// The ringN column: c.ranks threads on the one GPU over inproc with device ops.
void run_inproc(const config& c, results& res) {
  DPKIT_CUDA_CHECK(cudaSetDevice(c.device));
  auto ops = dpkit::make_cuda_device_ops(cudaStreamPerThread, c.device);
  const int n = c.ranks;
  std::vector<std::vector<double>> us(static_cast<std::size_t>(n), std::vector<double>(res.sizes.size(), 0.0));
  std::vector<std::vector<unsigned long long>> wrong(static_cast<std::size_t>(n),
                                                     std::vector<unsigned long long>(res.sizes.size(), 0));
  const std::size_t max_count = res.sizes.empty() ? 0 : res.sizes.back() / 4;
  const float want = static_cast<float>(n) * static_cast<float>(n + 1) / 2.0f; // sum of rank + 1
  dpkit::inproc_world world(n, ops.get());
  world.run([&](dpkit::inproc& comm) {
    DPKIT_CUDA_CHECK(cudaSetDevice(c.device));
    const int r = comm.rank();
    const cudaStream_t s = cudaStreamPerThread;
    dpkit::device_buffer<float> in(std::max<std::size_t>(max_count, 1), c.device),
        out(std::max<std::size_t>(max_count, 1), c.device);
    fill(in.data(), max_count, static_cast<float>(r + 1), s);
    for (std::size_t k = 0; k < res.sizes.size(); ++k) {
      const std::size_t count = res.sizes[k] / 4;
      dpkit::tensor_view<float> iv{in.data(), count, dpkit::memory_space::device};
      dpkit::tensor_view<float> ov{out.data(), count, dpkit::memory_space::device};
      for (int i = 0; i < c.warmup; ++i) dpkit::allreduce_ring(comm, iv, ov, dpkit::reduce_op::sum);
      dpkit::barrier(comm);
      const auto t0 = clk::now();
      for (int i = 0; i < c.iters; ++i) dpkit::allreduce_ring(comm, iv, ov, dpkit::reduce_op::sum);
      DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
      us[static_cast<std::size_t>(r)][k] = 1e6 * std::chrono::duration<double>(clk::now() - t0).count() / c.iters;
      if (c.check) {
        fill(out.data(), count, 0.0f, s);
        dpkit::barrier(comm); // no rank's ring reads a peer's output while it is being cleared
        dpkit::allreduce_ring(comm, iv, ov, dpkit::reduce_op::sum);
        DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
        wrong[static_cast<std::size_t>(r)][k] = count_wrong(out.data(), count, want, s);
      }
    }
  });
  for (std::size_t k = 0; k < res.sizes.size(); ++k)
    for (int r = 0; r < n; ++r) {
      res.us[col_ringn][k] = std::max(res.us[col_ringn][k], us[static_cast<std::size_t>(r)][k]); // slowest rank
      res.wrong[k] += wrong[static_cast<std::size_t>(r)][k];
    }
}

double gbps(std::size_t bytes, double us) { return us > 0 ? static_cast<double>(bytes) / (us * 1e3) : 0.0; }

std::string human(std::size_t b) {
  char buf[32];
  if (b >= (std::size_t{1} << 30) && b % (std::size_t{1} << 30) == 0) std::snprintf(buf, sizeof buf, "%zu GiB", b >> 30);
  else if (b >= (1u << 20) && b % (1u << 20) == 0) std::snprintf(buf, sizeof buf, "%zu MiB", b >> 20);
  else if (b >= (1u << 10) && b % (1u << 10) == 0) std::snprintf(buf, sizeof buf, "%zu KiB", b >> 10);
  else std::snprintf(buf, sizeof buf, "%zu B", b);
  return buf;
}

int run(const config& c) {
  DPKIT_CUDA_CHECK(cudaSetDevice(c.device));
  print_probe(c.device);
  if (c.probe) return 0;
  results res;
  res.sizes = sizes_of(c);
  res.us.assign(ncols, std::vector<double>(res.sizes.size(), 0.0));
  res.wrong.assign(res.sizes.size(), 0);
  std::printf("# dpkit allreduce_device_perf: float sum, out of place, iters %d, warmup %d, check %d\n", c.iters,
              c.warmup, c.check ? 1 : 0);
  std::printf("#  nccl:   ncclAllReduce, 1 rank, calls enqueued back to back, CUDA events (nccl-tests' timing)\n");
  std::printf("#  native: dpkit::allreduce(native) on that communicator: ncclAllReduce + dpkit's wait, per call\n");
  std::printf("#  ring1:  dpkit::allreduce_ring over the NCCL transport with dpkit's kernels, 1 rank (a copy)\n");
  std::printf("#  ring%d:  dpkit::allreduce_ring over inproc, %d ranks as threads on this GPU (reduce kernels + "
              "device copies); busbw = algbw x 2(n-1)/n; no NCCL counterpart on one GPU\n",
              c.ranks, c.ranks);
  std::fflush(stdout);
  const auto t0 = clk::now();
  run_nccl(c, res);
  run_inproc(c, res);
  const double bus = 2.0 * (c.ranks - 1) / c.ranks;
  std::printf("#\n#%12s %11s | %10s %7s | %10s %7s | %10s %7s | %10s %7s %7s | %7s\n", "size(B)", "count", "nccl(us)",
              "algbw", "native(us)", "algbw", "ring1(us)", "algbw", ("ring" + std::to_string(c.ranks) + "(us)").c_str(),
              "algbw", "busbw", "#wrong");
  unsigned long long total_wrong = 0;
  for (std::size_t k = 0; k < res.sizes.size(); ++k) {
    const std::size_t b = res.sizes[k];
    std::printf(" %12zu %11zu | %10.2f %7.2f | %10.2f %7.2f | %10.2f %7.2f | %10.2f %7.2f %7.2f | %7llu\n", b, b / 4,
                res.us[col_nccl][k], gbps(b, res.us[col_nccl][k]), res.us[col_native][k],
                gbps(b, res.us[col_native][k]), res.us[col_ring1][k], gbps(b, res.us[col_ring1][k]),
                res.us[col_ringn][k], gbps(b, res.us[col_ringn][k]), bus * gbps(b, res.us[col_ringn][k]),
                res.wrong[k]);
    total_wrong += res.wrong[k];
  }
  std::printf("# out of bounds values : %llu %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
  std::printf("# run time %.1f s\n", std::chrono::duration<double>(clk::now() - t0).count());
  if (!res.sizes.empty()) {
    const std::size_t lo = 0, hi = res.sizes.size() - 1;
    std::printf("# key: %s: nccl %.0f GB/s, native %.0f, ring1 %.0f, ring%d busbw %.0f; %s: nccl %.1f us, native %.1f, "
                "ring1 %.1f, ring%d %.1f; wrong %llu\n",
                human(res.sizes[hi]).c_str(), gbps(res.sizes[hi], res.us[col_nccl][hi]),
                gbps(res.sizes[hi], res.us[col_native][hi]), gbps(res.sizes[hi], res.us[col_ring1][hi]), c.ranks,
                bus * gbps(res.sizes[hi], res.us[col_ringn][hi]), human(res.sizes[lo]).c_str(), res.us[col_nccl][lo],
                res.us[col_native][lo], res.us[col_ring1][lo], c.ranks, res.us[col_ringn][lo], total_wrong);
  }
  return total_wrong ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
  const config c = parse(argc, argv);
  return dpkit_device_bench::device_main("allreduce_device_perf", [&] { return run(c); });
}
