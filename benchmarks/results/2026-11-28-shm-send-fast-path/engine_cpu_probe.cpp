// The shared-memory engine's CPU per message: a round trip between two engines over one area, driven from one
// thread on one core (no cache line moves between cores), and the four copies alone. Build:
//   g++ -std=c++20 -O3 -DNDEBUG -Iinclude -pthread benchmarks/results/2026-11-28-shm-send-fast-path/engine_cpu_probe.cpp -o probe
//   taskset -c 0 ./probe 8     (argument: message bytes, default 2048)
#include <dpkit/core/errors.hpp>
#include <dpkit/transport/detail/shm_segment.hpp>
#include <dpkit/transport/detail/shm_p2p.hpp>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
using namespace dpkit::detail;
using clk = std::chrono::steady_clock;
int main(int argc, char** argv) {
  const int iters = 1000000; const std::size_t n = argc > 1 ? std::atoi(argv[1]) / 4 : 512;
  auto* area = static_cast<std::byte*>(mmap(nullptr, shm_p2p_area_bytes(2, shm_p2p_ring_bytes(2, true)), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  shm_p2p::init_area(area, 2, shm_p2p_ring_bytes(2, true)); // 256 KiB rings, as when this was recorded
  shm_p2p e0(0, 2, area, shm_p2p_ring_bytes(2, true)), e1(1, 2, area, shm_p2p_ring_bytes(2, true));
  std::vector<float> a(n, 1.f), b(n), c(n);
  auto once = [&] {
    auto q = e0.post_recv(reinterpret_cast<std::byte*>(b.data()), n * 4, 1, 7);
    auto s = e1.post_send(reinterpret_cast<const std::byte*>(a.data()), n * 4, 0, 7);
    while (q->state.load() == p2p_op::pending) e0.progress();
    auto q2 = e1.post_recv(reinterpret_cast<std::byte*>(c.data()), n * 4, 0, 8);
    auto s2 = e0.post_send(reinterpret_cast<const std::byte*>(b.data()), n * 4, 1, 8);
    while (q2->state.load() == p2p_op::pending) e1.progress();
    e0.withdraw(*q); e1.withdraw(*s); e1.withdraw(*q2); e0.withdraw(*s2);
  };
  std::vector<std::byte> ring(256 << 10); std::size_t pos = 0;
  auto copies = [&] {
    for (int k = 0; k < 2; ++k) {
      std::memcpy(ring.data() + pos, a.data(), n * 4); std::memcpy(b.data(), ring.data() + pos, n * 4);
      pos = (pos + n * 4 + 16) % ((256 << 10) - 8192);
    }
  };
  for (int round = 0; round < 3; ++round) {
    auto t0 = clk::now(); for (int i = 0; i < iters; ++i) once();
    double us = std::chrono::duration<double, std::nano>(clk::now() - t0).count() / iters;
    t0 = clk::now(); for (int i = 0; i < iters; ++i) copies();
    double cp = std::chrono::duration<double, std::nano>(clk::now() - t0).count() / iters;
    std::printf("local engine round trip %.1f ns, its 4 copies alone %.1f ns\n", us, cp);
  }
}
