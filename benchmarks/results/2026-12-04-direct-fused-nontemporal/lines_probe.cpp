// lines_probe: T threads at once (T = 1 or 2, one per core), each on its own
// buffers: 256 MiB read and 256 MiB written per thread in the patterns of
// the two-rank direct all-reduce (shm/allreduce.hpp), against the floor's
// copies. Median and minimum of 7 rounds (thread 0's times), and the median
// over A's.
//   A  copy with non-temporal stores (1 read, 1 write stream): the floor
//   H  memcpy (ordinary stores)
//   B  out of place, the old way: reduce an 8 KiB block, copy it out to two
//      outputs with non-temporal stores
//   K  out of place, the new way (reduce_into_two_nontemporal): each 64-byte
//      line of sums in registers, streamed to both outputs
//   J  B with a 64 KiB block (in L2)
//   G  out of place, ordinary stores (read for ownership of both outputs)
//   C  in place (both inputs read, written back)
//   F  (argument "clzero") out of place, each output line first zeroed with
//      AMD's clzero so that ordinary stores need no read for ownership
//
//   g++ -std=c++20 -O2 -I include lines_probe.cpp -o lines_probe -pthread
//   ./lines_probe T [MiB] [clzero]
#include <dpkit/core/copy_nontemporal.hpp>
#include <dpkit/core/reduce_op.hpp>

#include <emmintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

using clk = std::chrono::steady_clock;
namespace dd = dpkit::detail;

// page-aligned buffers, shifted by k pages (no two 2^28 bytes apart)
static float* alloc(std::size_t bytes, int k) {
  void* p = mmap(nullptr, bytes + 4096 * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  std::memset(p, 1, bytes + 4096 * 8);
  return static_cast<float*>(p) + 1024 * k;
}
static inline void clz(void* p) { asm volatile("clzero" ::"a"(p) : "memory"); }

int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1]) : 1;
  const std::size_t S = std::size_t(argc > 2 ? std::atoi(argv[2]) : 256) << 20, H = S / 4 / 2, B = 2048;
  const bool with_clzero = argc > 3 && std::strcmp(argv[3], "clzero") == 0;
  struct buf { float *a, *b, *c, *d; };
  std::vector<buf> bufs;
  for (int t = 0; t < T; ++t) bufs.push_back({alloc(S, 1 + t), alloc(S, 3 + t), alloc(S, 5 + t), alloc(S, 2 + t)});
  const char* names[] = {"A nt copy 1R1W", "H memcpy", "B oop 8K block nt", "K oop lines nt", "J oop 64K block nt",
                         "G oop ordinary", "C in place", "F oop clzero"};
  const int P = with_clzero ? 8 : 7, R = 7;
  std::barrier bar(T);
  std::vector<std::vector<double>> res(P);
  auto body = [&](int t) {
    auto [a, b, c, d] = bufs[static_cast<std::size_t>(t)];
    std::vector<float> tmp(16384);
    for (int k = 0; k < R; ++k)
      for (int p = 0; p < P; ++p) {
        bar.arrive_and_wait();
        const auto s = clk::now();
        switch (p) {
        case 0: dd::copy_nontemporal(c, a, S, false); break;
        case 1: std::memcpy(c, a, S); break;
        case 2:
          for (std::size_t q = 0; q < H; q += B) {
            dpkit::reduce_host(tmp.data(), a + q, b + q, B, dpkit::reduce_op::sum);
            dd::copy_nontemporal(c + q, tmp.data(), B * 4, false);
            dd::copy_nontemporal(d + q, tmp.data(), B * 4, false);
          }
          break;
        case 3:
          for (std::size_t q = 0; q < H; q += 16) {
            alignas(16) float v[16];
            for (int j = 0; j < 16; ++j) v[j] = dd::combine_any<dpkit::reduce_op::sum>(a[q + j], b[q + j]);
            const __m128i v0 = _mm_load_si128(reinterpret_cast<const __m128i*>(v)),
                          v1 = _mm_load_si128(reinterpret_cast<const __m128i*>(v) + 1),
                          v2 = _mm_load_si128(reinterpret_cast<const __m128i*>(v) + 2),
                          v3 = _mm_load_si128(reinterpret_cast<const __m128i*>(v) + 3);
            auto* d0 = reinterpret_cast<__m128i*>(c + q);
            auto* d1 = reinterpret_cast<__m128i*>(d + q);
            _mm_stream_si128(d0, v0), _mm_stream_si128(d0 + 1, v1), _mm_stream_si128(d0 + 2, v2), _mm_stream_si128(d0 + 3, v3);
            _mm_stream_si128(d1, v0), _mm_stream_si128(d1 + 1, v1), _mm_stream_si128(d1 + 2, v2), _mm_stream_si128(d1 + 3, v3);
          }
          break;
        case 4:
          for (std::size_t q = 0; q < H; q += 16384) {
            dpkit::reduce_host(tmp.data(), a + q, b + q, 16384, dpkit::reduce_op::sum);
            dd::copy_nontemporal(c + q, tmp.data(), 16384 * 4, false);
            dd::copy_nontemporal(d + q, tmp.data(), 16384 * 4, false);
          }
          break;
        case 5:
          for (std::size_t q = 0; q < H; ++q) {
            const float v = a[q] + b[q];
            c[q] = v;
            d[q] = v;
          }
          break;
        case 6:
          for (std::size_t q = 0; q < H; ++q) {
            const float v = a[q] + b[q];
            a[q] = v;
            b[q] = v;
          }
          break;
        case 7:
          for (std::size_t q = 0; q < H; q += 16) {
            clz(c + q);
            clz(d + q);
            for (int j = 0; j < 16; ++j) c[q + j] = d[q + j] = a[q + j] + b[q + j];
          }
          break;
        }
        dd::store_fence();
        const double ms = std::chrono::duration<double>(clk::now() - s).count() * 1e3;
        bar.arrive_and_wait();
        if (t == 0) res[static_cast<std::size_t>(p)].push_back(ms);
      }
  };
  std::vector<std::thread> th;
  for (int t = 0; t < T; ++t) th.emplace_back(body, t);
  for (auto& x : th) x.join();
  for (auto& r : res) std::sort(r.begin(), r.end());
  for (int i = 0; i < P; ++i)
    std::printf("T=%d %-20s median %8.2f ms (min %8.2f)  median / A's %.2f\n", T, names[i], res[i][R / 2], res[i][0],
                res[i][R / 2] / res[0][R / 2]);
}
