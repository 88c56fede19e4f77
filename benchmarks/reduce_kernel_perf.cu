// reduce_kernel_perf: bandwidth of dpkit's CUDA reduction kernel
// (dst = a op b, in place: dst == a) next to a device-to-device cudaMemcpy of
// the same buffers, on one GPU. GB/s counts bytes read + written: 3 x size for
// the reduction (read a, read b, write dst), 2 x size for the copy; the
// "ratio" column is kernel GB/s / memcpy GB/s (1.0 = the kernel moves bytes as
// fast as the copy engine path).
//
//   reduce_kernel_perf [-b minbytes] [-e maxbytes] [-f factor] [-d type|all]
//                      [-o op|all] [-n iters] [-w warmup] [-g device] [-u offset]
// Sizes accept K/M/G suffixes (nccl-tests style). -u offsets the pointers by
// that many elements to measure the unaligned (scalar) path. Exits 77 when no
// CUDA device is present.
#include <dpkit/cuda/device_ops.cuh>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

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

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [-b minbytes=8M] [-e maxbytes=1G] [-f factor=2] [-d type|all=float] [-o op|all=sum]\n"
               "          [-n iters=20] [-w warmup=5] [-g device=0] [-u offset_elems=0]\n"
               "types: float double half bfloat16 int8 uint8 int32 uint32 int64 uint64; ops: sum prod min max avg\n",
               argv0);
  std::exit(2);
}

struct config {
  std::size_t min_bytes = 8u << 20, max_bytes = std::size_t{1} << 30, factor = 2;
  std::vector<dpkit::element_type> types{dpkit::element_type::f32};
  std::vector<dpkit::reduce_op> ops{dpkit::reduce_op::sum};
  int iters = 20, warmup = 5, device = 0;
  std::size_t offset = 0;
};

config parse(int argc, char** argv) {
  config c;
  const std::vector<dpkit::element_type> all_types{
      dpkit::element_type::f32, dpkit::element_type::f64, dpkit::element_type::f16, dpkit::element_type::bf16,
      dpkit::element_type::i8,  dpkit::element_type::u8,  dpkit::element_type::i32, dpkit::element_type::u32,
      dpkit::element_type::i64, dpkit::element_type::u64};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(argv[0]);
    if (i + 1 >= argc) usage(argv[0]);
    const char* v = argv[++i];
    if (a == "-b" || a == "--minbytes") c.min_bytes = parse_size(v);
    else if (a == "-e" || a == "--maxbytes") c.max_bytes = parse_size(v);
    else if (a == "-f" || a == "--stepfactor") c.factor = static_cast<std::size_t>(std::atol(v));
    else if (a == "-n" || a == "--iters") c.iters = std::atoi(v);
    else if (a == "-w" || a == "--warmup_iters") c.warmup = std::atoi(v);
    else if (a == "-g" || a == "--device") c.device = std::atoi(v);
    else if (a == "-u" || a == "--offset") c.offset = static_cast<std::size_t>(std::atol(v));
    else if (a == "-d" || a == "--datatype") {
      if (std::string(v) == "all") c.types = all_types;
      else {
        c.types.clear();
        for (auto t : all_types)
          if (dpkit::element_type_name(t) == v) c.types.push_back(t);
        if (c.types.empty()) usage(argv[0]);
      }
    } else if (a == "-o" || a == "--op") {
      if (std::string(v) == "all")
        c.ops = {dpkit::reduce_op::sum, dpkit::reduce_op::prod, dpkit::reduce_op::min, dpkit::reduce_op::max,
                 dpkit::reduce_op::avg};
      else c.ops = {dpkit::parse_reduce_op(v)};
    } else usage(argv[0]);
  }
  if (c.factor < 2) c.factor = 2;
  if (c.iters < 1) c.iters = 1;
  if (c.min_bytes < 1) c.min_bytes = 1;
  return c;
}

} // namespace

int main(int argc, char** argv) {
  const config c = parse(argc, argv);
  if (dpkit::cuda_device_count() == 0) {
    std::printf("# no CUDA device: nothing to measure\n");
    return 77;
  }
  try {
    DPKIT_CUDA_CHECK(cudaSetDevice(c.device));
    cudaDeviceProp prop{};
    DPKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, c.device));
    std::printf("# dpkit reduce_kernel_perf: device %d %s, iters %d, warmup %d, offset %zu elements\n", c.device,
                prop.name, c.iters, c.warmup, c.offset);
    std::printf("# GB/s = bytes read + written / time (reduce: 3 x size, memcpy: 2 x size)\n");
    std::printf("#%12s %12s %9s %6s %11s %10s %11s %10s %7s\n", "size(B)", "count", "type", "redop", "reduce(us)",
                "GB/s", "memcpy(us)", "GB/s", "ratio");
    cudaStream_t s{};
    DPKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0{}, e1{};
    DPKIT_CUDA_CHECK(cudaEventCreate(&e0));
    DPKIT_CUDA_CHECK(cudaEventCreate(&e1));
    for (auto t : c.types) {
      const std::size_t es = dpkit::element_size(t);
      const std::size_t pad = c.offset * es;
      dpkit::device_buffer<std::uint8_t> a(c.max_bytes + pad), b(c.max_bytes + pad);
      a.fill_bytes(0);
      b.fill_bytes(0); // zeros: finite in every type and op
      for (std::size_t bytes = c.min_bytes; bytes <= c.max_bytes; bytes *= c.factor) {
        const std::size_t count = bytes / es;
        if (count == 0) continue;
        for (auto op : c.ops) {
          void* pa = a.data() + pad;
          const void* pb = b.data() + pad;
          auto time_us = [&](auto&& fn) {
            for (int i = 0; i < c.warmup; ++i) fn();
            DPKIT_CUDA_CHECK(cudaEventRecord(e0, s));
            for (int i = 0; i < c.iters; ++i) fn();
            DPKIT_CUDA_CHECK(cudaEventRecord(e1, s));
            DPKIT_CUDA_CHECK(cudaEventSynchronize(e1));
            float ms = 0;
            DPKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            return 1000.0 * static_cast<double>(ms) / c.iters;
          };
          const double tr = time_us([&] { dpkit::reduce_device(pa, pa, pb, count, t, op, s); });
          const double tc = time_us([&] {
            DPKIT_CUDA_CHECK(cudaMemcpyAsync(pa, pb, count * es, cudaMemcpyDeviceToDevice, s));
          });
          const double moved = static_cast<double>(count * es);
          const double gr = 3.0 * moved / (tr * 1e3), gc = 2.0 * moved / (tc * 1e3);
          std::printf(" %12zu %12zu %9s %6s %11.2f %10.1f %11.2f %10.1f %7.2f\n", count * es, count,
                      std::string(dpkit::element_type_name(t)).c_str(), std::string(dpkit::reduce_op_name(op)).c_str(),
                      tr, gr, tc, gc, gr / gc);
        }
        if (bytes > c.max_bytes / c.factor) break;
      }
    }
    DPKIT_CUDA_CHECK(cudaEventDestroy(e0));
    DPKIT_CUDA_CHECK(cudaEventDestroy(e1));
    DPKIT_CUDA_CHECK(cudaStreamDestroy(s));
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "reduce_kernel_perf: %s\n", ex.what());
    return 1;
  }
  return 0;
}
