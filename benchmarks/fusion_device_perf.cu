// fusion_device_perf: fusion_perf's comparison for gradients in CUDA device
// memory, on one GPU without MPI: per-tensor vs one flat vs bucketed
// all-reduces of a real model's gradients (default data/models/gpt2-124m.tsv,
// 148 tensors, 474.7 MiB of f32), and what dpkit's DDP does with CUDA
// gradients today (host-staged buckets).
//
//   fusion_device_perf [--model FILE] [--ranks 1] [-A native|ring|tree|automatic] [--cap 25]
//                      [--first 1] [-n 10] [-w 2] [-g device]
//
// Transport: --ranks 1 (default) the NCCL transport on one rank
// (dpkit::nccl::single, with dpkit's kernels; -A native = ncclAllReduce, the
// default); --ranks N > 1 the inproc transport with the CUDA device_ops
// table, N ranks as threads on the one GPU (ring/tree with dpkit's
// reduction kernels; -A native is refused there).
//
// Per step, the median over -n iterations (after -w warm-up ones) of the
// slowest rank's time, each step ending when the results are in the
// gradients:
//   (a) per-tensor: one all-reduce (avg) per gradient, reverse registration
//       order (what a naive trainer does);
//   (b) flat: one all-reduce of one device buffer holding every gradient (per
//       element type): the lower bound, no copies;
//   (c) bucketed on the device: dpkit's bucket plan (plan_buckets: --first
//       MiB first bucket, --cap MiB the rest, as DDP), each gradient copied
//       into its bucket's device buffer (cudaMemcpyAsync device to device),
//       one all-reduce per bucket, the results copied back: what a
//       device-resident reducer would do (dpkit's gradient_reducer holds its
//       buckets in host memory);
//   (d) host-staged: dpkit::gradient_reducer (host buckets, over an inproc
//       world of the same number of ranks) fed by a device-to-host copy of
//       every gradient and written back host to device: what
//       dpkit::distributed_data_parallel does for CUDA parameters with
//       pinned_buckets = false. "copies" is the part of (d) spent in those
//       copies;
//   (e) host-staged, pinned: (d) with the reducer's buckets in page-locked
//       memory (a host_allocator over cudaHostAlloc) and the copies back
//       enqueued together with one synchronize: what distributed_data_parallel
//       does for CUDA parameters by default.
// Every rank's f32 gradients start as 0.25 x (rank + 1) (other element types
// as 0); afterwards every element must be their mean, exact in float: the
// program says how many are not and fails if any.
//
// Exit status: 0; 1 on a wrong element or an error; 2 for a usage error; 77
// when no CUDA device is visible. The last line "# key: ..." gives the
// figures scripts/device_check.sh puts into its summary.
#include <dpkit/collectives.hpp>
#include <dpkit/cuda/device_ops.cuh>
#include <dpkit/fusion/bucket_plan.hpp>
#include <dpkit/fusion/gradient_reducer.hpp>
#include <dpkit/fusion/model_spec.hpp>
#include <dpkit/transport/inproc.hpp>
#include <dpkit/transport/nccl.hpp>

#include "device_bench_kernels.cuh"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;

using dpkit_device_bench::count_wrong_kernel;
using dpkit_device_bench::fill_kernel;

// Adds to *wrong the number of nonzero bytes of p[0, n).
__global__ void count_nonzero_kernel(const unsigned char* p, std::size_t n, unsigned long long* wrong) {
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    local += p[i] != 0;
  if (local) atomicAdd(wrong, local);
}

unsigned grid_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>(std::max<std::size_t>((n + 255) / 256, 1), 4096));
}

struct config {
  std::string model = "data/models/gpt2-124m.tsv";
  int ranks = 1, iters = 10, warmup = 2, device = 0;
  std::string algo = "native";
  double cap_mib = 25, first_mib = 1;
};

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--model FILE=data/models/gpt2-124m.tsv] [--ranks N=1] [-A native|ring|tree|automatic]\n"
               "          [--cap MiB=25] [--first MiB=1] [-n iters=10] [-w warmup=2] [-g device=0]\n",
               argv0);
  std::exit(2);
}

config parse(int argc, char** argv) {
  config c;
  bool algo_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help" || i + 1 >= argc) usage(argv[0]);
    const char* v = argv[++i];
    if (a == "-m" || a == "--model") c.model = v;
    else if (a == "-r" || a == "--ranks") c.ranks = std::atoi(v);
    else if (a == "-A" || a == "--algo") c.algo = v, algo_given = true;
    else if (a == "--cap") c.cap_mib = std::atof(v);
    else if (a == "--first") c.first_mib = std::atof(v);
    else if (a == "-n" || a == "--iters") c.iters = std::atoi(v);
    else if (a == "-w" || a == "--warmup") c.warmup = std::atoi(v);
    else if (a == "-g" || a == "--device") c.device = std::atoi(v);
    else usage(argv[0]);
  }
  if (c.ranks < 1 || c.iters < 1 || c.warmup < 0 || !(c.cap_mib > 0) || !(c.first_mib > 0)) usage(argv[0]);
  if (c.ranks > 1 && !algo_given) c.algo = "ring";
  return c;
}

// One rank's device memory: a buffer per gradient, a flat buffer per element
// type, a buffer per bucket of the device plan.
struct rank_state {
  std::vector<dpkit::device_buffer<std::uint8_t>> grads;
  std::vector<dpkit::device_buffer<std::uint8_t>> flats;
  std::vector<dpkit::element_type> flat_types;
  std::vector<dpkit::device_buffer<std::uint8_t>> buckets;
};

// The initial value of rank r's f32 gradients, and their mean over n ranks.
float start_value(int r) { return 0.25f * static_cast<float>(r + 1); }
float mean_value(int n) { return 0.25f * static_cast<float>(n + 1) / 2.0f; }

// Sets a buffer of `bytes` bytes of type t: f32 to v, other types to zero bytes.
void init_buffer(void* p, std::size_t bytes, dpkit::element_type t, float v, cudaStream_t s) {
  if (bytes == 0) return;
  if (t == dpkit::element_type::f32) {
    fill_kernel<<<grid_for(bytes / 4), 256, 0, s>>>(static_cast<float*>(p), bytes / 4, v);
    DPKIT_CUDA_CHECK(cudaGetLastError());
  } else {
    DPKIT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
  }
}

// Elements of a buffer of type t that are not as expected (f32: `want`; other types: zero).
unsigned long long count_wrong(const void* p, std::size_t bytes, dpkit::element_type t, float want, cudaStream_t s) {
  if (bytes == 0) return 0;
  unsigned long long* d = nullptr;
  DPKIT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof *d, s));
  DPKIT_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof *d, s));
  if (t == dpkit::element_type::f32)
    count_wrong_kernel<<<grid_for(bytes / 4), 256, 0, s>>>(static_cast<const float*>(p), bytes / 4, want, d);
  else
    count_nonzero_kernel<<<grid_for(bytes), 256, 0, s>>>(static_cast<const unsigned char*>(p), bytes, d);
  DPKIT_CUDA_CHECK(cudaGetLastError());
  unsigned long long h = 0;
  DPKIT_CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s));
  DPKIT_CUDA_CHECK(cudaFreeAsync(d, s));
  DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

// In-place average all-reduce of `count` elements of type t at device pointer p.
template <class C>
void allreduce_raw(C& comm, void* p, std::size_t count, dpkit::element_type t, const dpkit::allreduce_policy& pol) {
  dpkit::visit_element_type(t, [&](auto zero) {
    using T = decltype(zero);
    dpkit::tensor_view<T> v{static_cast<T*>(p), count, dpkit::memory_space::device};
    dpkit::allreduce(comm, v, v, dpkit::reduce_op::avg, pol);
  });
}

enum mode { m_per_tensor, m_flat, m_bucketed, m_staged, m_staged_copies, m_pinned, m_pinned_copies, nmodes };

// times[rank][mode][timed iteration], seconds
using time_table = std::vector<std::vector<std::vector<double>>>;

double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Modes (a), (b), (c) on rank `rank` of transport comm (device tensors);
// s is the stream the transport works on for this rank.
template <class C, class Barrier>
void measure_device(C& comm, int rank, rank_state& st, const dpkit::model_spec& spec, const dpkit::bucket_plan& plan,
                    const config& c, const dpkit::allreduce_policy& pol, cudaStream_t s, Barrier&& barrier,
                    time_table& times) {
  const std::size_t n = spec.params.size();
  auto& tt = times[static_cast<std::size_t>(rank)];
  const auto timed = [&](mode m, auto&& body) {
    for (int it = 0; it < c.warmup + c.iters; ++it) {
      barrier();
      const auto t0 = clk::now();
      body();
      DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
      if (it >= c.warmup) tt[m].push_back(secs(t0, clk::now()));
    }
  };
  timed(m_per_tensor, [&] {
    for (std::size_t i = n; i-- > 0;)
      allreduce_raw(comm, st.grads[i].data(), spec.params[i].numel, spec.params[i].type, pol);
  });
  timed(m_flat, [&] {
    for (std::size_t k = 0; k < st.flats.size(); ++k)
      allreduce_raw(comm, st.flats[k].data(), st.flats[k].size() / dpkit::element_size(st.flat_types[k]),
                    st.flat_types[k], pol);
  });
  timed(m_bucketed, [&] {
    for (std::size_t b = 0; b < plan.size(); ++b) {
      const auto& bk = plan.buckets[b];
      std::size_t off = 0;
      for (std::size_t i : bk.params) {
        DPKIT_CUDA_CHECK(cudaMemcpyAsync(st.buckets[b].data() + off, st.grads[i].data(), spec.params[i].bytes,
                                         cudaMemcpyDeviceToDevice, s));
        off += spec.params[i].bytes;
      }
      // the bucket is complete before any rank's transfer reads it (a
      // reducer would record an event here and have the transport wait on it)
      DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
      allreduce_raw(comm, st.buckets[b].data(), bk.bytes / dpkit::element_size(bk.type), bk.type, pol);
    }
    for (std::size_t b = 0; b < plan.size(); ++b) {
      std::size_t off = 0;
      for (std::size_t i : plan.buckets[b].params) {
        DPKIT_CUDA_CHECK(cudaMemcpyAsync(st.grads[i].data(), st.buckets[b].data() + off, spec.params[i].bytes,
                                         cudaMemcpyDeviceToDevice, s));
        off += spec.params[i].bytes;
      }
    }
  });
}

// Modes (d) and (e) on rank `rank` of a host inproc world: gradient_reducer
// with host buckets, device gradients copied in and out as
// distributed_data_parallel does for CUDA parameters: one synchronous copy
// per gradient into the buckets; back, one synchronous copy per gradient
// from pageable buckets (d), or all enqueued and one synchronize from pinned
// ones (e).
void measure_staged(dpkit::inproc& comm, rank_state& st, const dpkit::model_spec& spec, const config& c,
                    time_table& times, bool pinned) {
  const int rank = comm.rank();
  const std::size_t n = spec.params.size();
  const cudaStream_t s = cudaStreamPerThread;
  dpkit::reducer_options ro; // as distributed_data_parallel sets it up
  ro.buckets.first_bucket_bytes = static_cast<std::size_t>(c.first_mib * (1 << 20));
  ro.buckets.bucket_cap_bytes = static_cast<std::size_t>(c.cap_mib * (1 << 20));
  ro.gradient_as_bucket_view = true;
  ro.compute_stats = true;
  dpkit::host_allocator buffers;
  if (pinned)
    buffers = {[](std::size_t bytes) -> void* {
                 void* p = nullptr;
                 DPKIT_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
                 return p;
               },
               [](void* p, std::size_t) { (void)cudaFreeHost(p); }};
  dpkit::gradient_reducer<dpkit::inproc> red(comm, spec.param_infos(), ro, spec.names(), std::move(buffers));
  auto& tt = times[static_cast<std::size_t>(rank)];
  for (int it = 0; it < c.warmup + c.iters; ++it) {
    dpkit::barrier(comm);
    const auto t0 = clk::now();
    double copies = 0;
    for (std::size_t i = n; i-- > 0;) {
      auto b = red.bucket_bytes(i);
      const auto c0 = clk::now();
      DPKIT_CUDA_CHECK(cudaMemcpyAsync(b.data(), st.grads[i].data(), b.size(), cudaMemcpyDeviceToHost, s));
      DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
      copies += secs(c0, clk::now());
      red.mark_ready(i);
    }
    (void)red.finish();
    const auto c1 = clk::now();
    for (std::size_t i = 0; i < n; ++i) {
      auto b = red.bucket_bytes(i);
      DPKIT_CUDA_CHECK(cudaMemcpyAsync(st.grads[i].data(), b.data(), b.size(), cudaMemcpyHostToDevice, s));
      if (!pinned) DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    DPKIT_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto t1 = clk::now();
    copies += secs(c1, t1);
    if (it >= c.warmup) {
      tt[pinned ? m_pinned : m_staged].push_back(secs(t0, t1));
      tt[pinned ? m_pinned_copies : m_staged_copies].push_back(copies);
    }
  }
}

// Median over iterations of the slowest rank's time, milliseconds.
double median_ms(const time_table& times, mode m) {
  const std::size_t iters = times.empty() ? 0 : times[0][m].size();
  std::vector<double> v(iters, 0.0);
  for (const auto& r : times)
    for (std::size_t i = 0; i < iters && i < r[m].size(); ++i) v[i] = std::max(v[i], r[m][i]);
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return 1e3 * (v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]));
}

int run(const config& c) {
  DPKIT_CUDA_CHECK(cudaSetDevice(c.device));
  cudaDeviceProp prop{};
  DPKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, c.device));
  const auto spec = dpkit::load_model_spec(c.model);
  const std::size_t n = spec.params.size();
  const int nr = c.ranks;
  dpkit::allreduce_policy pol;
  pol.algo = dpkit::parse_algorithm(c.algo);
  if (nr > 1 && pol.algo == dpkit::algorithm::native)
    throw dpkit::invalid_argument("-A native needs --ranks 1 (NCCL refuses two ranks on one GPU)");

  dpkit::bucket_policy bp;
  bp.first_bucket_bytes = static_cast<std::size_t>(c.first_mib * (1 << 20));
  bp.bucket_cap_bytes = static_cast<std::size_t>(c.cap_mib * (1 << 20));
  std::vector<dpkit::param_info> dev_infos = spec.param_infos();
  for (auto& p : dev_infos) p.space = dpkit::memory_space::device;
  const dpkit::bucket_plan plan = dpkit::plan_buckets(dev_infos, bp);

  std::map<dpkit::element_type, std::size_t> per_type; // bytes
  for (const auto& p : spec.params) per_type[p.type] += p.bytes;

  std::vector<rank_state> st(static_cast<std::size_t>(nr));
  for (int r = 0; r < nr; ++r) {
    auto& s = st[static_cast<std::size_t>(r)];
    for (const auto& p : spec.params) {
      s.grads.emplace_back(p.bytes, c.device);
      init_buffer(s.grads.back().data(), p.bytes, p.type, start_value(r), cudaStreamPerThread);
    }
    for (auto [t, bytes] : per_type) {
      s.flats.emplace_back(bytes, c.device);
      s.flat_types.push_back(t);
      init_buffer(s.flats.back().data(), bytes, t, start_value(r), cudaStreamPerThread);
    }
    for (const auto& b : plan.buckets) s.buckets.emplace_back(b.bytes, c.device);
  }
  DPKIT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));

  std::printf("# fusion_device_perf: %s: %zu tensors, %zu parameters (%.1f MiB), %d rank%s on device %d (%s), %s, "
              "algorithm %s\n",
              spec.source.c_str(), n, spec.total_numel(), static_cast<double>(spec.total_bytes()) / (1 << 20), nr,
              nr == 1 ? "" : "s", c.device, prop.name,
              nr == 1 ? "NCCL transport, 1 rank" : "inproc ranks as threads on this GPU", c.algo.c_str());
  std::printf("# device plan: %zu buckets (first %.3g MiB, cap %.3g MiB), MiB in launch order:", plan.size(),
              c.first_mib, c.cap_mib);
  for (const auto& b : plan.buckets) std::printf(" %.2f", static_cast<double>(b.bytes) / (1 << 20));
  std::printf("\n# times in ms per step: median over %d iterations (after %d warm-up) of the slowest rank\n", c.iters,
              c.warmup);
  std::fflush(stdout);

  time_table times(static_cast<std::size_t>(nr), std::vector<std::vector<double>>(nmodes));
  const auto t_start = clk::now();
  if (nr == 1) {
    dpkit::nccl_options o;
    o.kernels = dpkit::cuda_kernels();
    auto comm = dpkit::nccl::single(c.device, o);
    measure_device(comm, 0, st[0], spec, plan, c, pol, comm.stream(), [] {}, times);
  } else {
    auto ops = dpkit::make_cuda_device_ops(cudaStreamPerThread, c.device);
    dpkit::inproc_world world(nr, ops.get());
    world.run([&](dpkit::inproc& comm) {
      DPKIT_CUDA_CHECK(cudaSetDevice(c.device));
      measure_device(comm, comm.rank(), st[static_cast<std::size_t>(comm.rank())], spec, plan, c, pol,
                     cudaStreamPerThread, [&] { dpkit::barrier(comm); }, times);
    });
  }
  {
    dpkit::inproc_world host(nr); // host memory only: the reducer's buckets
    host.run([&](dpkit::inproc& comm) {
      DPKIT_CUDA_CHECK(cudaSetDevice(c.device));
      measure_staged(comm, st[static_cast<std::size_t>(comm.rank())], spec, c, times, false);
      measure_staged(comm, st[static_cast<std::size_t>(comm.rank())], spec, c, times, true);
    });
  }

  unsigned long long wrong = 0;
  const float want = mean_value(nr);
  for (auto& s : st) {
    for (std::size_t i = 0; i < n; ++i)
      wrong += count_wrong(s.grads[i].data(), spec.params[i].bytes, spec.params[i].type, want, cudaStreamPerThread);
    for (std::size_t k = 0; k < s.flats.size(); ++k)
      wrong += count_wrong(s.flats[k].data(), s.flats[k].size(), s.flat_types[k], want, cudaStreamPerThread);
  }

  const double a = median_ms(times, m_per_tensor), b = median_ms(times, m_flat), cc = median_ms(times, m_bucketed),
               d = median_ms(times, m_staged), dc = median_ms(times, m_staged_copies),
               e = median_ms(times, m_pinned), ec = median_ms(times, m_pinned_copies);
  std::printf("#\n  (a) per-tensor all-reduce (%zu calls)              %10.2f ms\n", n, a);
  std::printf("  (b) one flat all-reduce                            %10.2f ms\n", b);
  std::printf("  (c) bucketed on the device (%zu buckets)            %10.2f ms   c/b %.2f   a/c %.2f\n", plan.size(),
              cc, b > 0 ? cc / b : 0.0, cc > 0 ? a / cc : 0.0);
  std::printf("  (d) host-staged gradient_reducer, pageable         %10.2f ms   d/c %.2f   copies %.2f ms\n", d,
              cc > 0 ? d / cc : 0.0, dc);
  std::printf("  (e) host-staged gradient_reducer, pinned (DDP)     %10.2f ms   e/c %.2f   copies %.2f ms   d/e %.2f\n",
              e, cc > 0 ? e / cc : 0.0, ec, e > 0 ? d / e : 0.0);
  std::printf("# elements not equal to the mean: %llu %s; run time %.1f s\n", wrong, wrong ? "FAILED" : "OK",
              secs(t_start, clk::now()));
  std::printf("# key: %d rank%s %s: per-tensor %.2f ms, flat %.2f, bucketed %.2f, host-staged %.2f (copies %.2f), "
              "pinned %.2f (copies %.2f); wrong %llu\n",
              nr, nr == 1 ? "" : "s", c.algo.c_str(), a, b, cc, d, dc, e, ec, wrong);
  return wrong ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
  const config c = parse(argc, argv);
  return dpkit_device_bench::device_main("fusion_device_perf", [&] { return run(c); });
}
