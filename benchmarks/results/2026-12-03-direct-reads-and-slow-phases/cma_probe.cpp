// cma_probe: how fast one process reads (process_vm_readv) and writes
// (process_vm_writev) another's memory, against memcpy over the same bytes,
// in blocks of -B KiB. The question (issue 53): can an all-reduce reduce
// straight from a peer's buffer through Linux cross-memory attach (the
// "direct" row of benchmarks/common/bench_floor.hpp) faster than through the
// shared segment? No MPI, no dpkit: a forked child allocates and touches
// 256 MiB of private memory (as a rank's tensor is) that the parent reads
// and writes.
//
//   g++ -std=c++20 -O2 -o cma_probe cma_probe.cpp && ./cma_probe 64 && ./cma_probe 256 && ./cma_probe 1024
//
// Prints, for each of 4 repetitions, GB/s of payload: readv (child -> a
// block of the parent), memcpy reading the same pattern from the parent's
// own 256 MiB, writev (a block -> the child), memcpy writing the same
// pattern into the parent's own 256 MiB.
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  const std::size_t S = std::size_t{256} << 20;
  const std::size_t B = (argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256) << 10;
  if (B == 0 || S % B != 0) {
    std::fprintf(stderr, "cma_probe: the block (KiB) must divide 256 MiB\n");
    return 2;
  }
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) { // allocates and touches its memory, sends its address, holds it until the parent is done
    auto* mem = static_cast<char*>(mmap(nullptr, S, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (mem == MAP_FAILED) _exit(1);
    std::memset(mem, 1, S);
    (void)!write(to_parent[1], &mem, sizeof mem);
    char c;
    (void)!read(to_child[0], &c, 1);
    _exit(0);
  }
  char* remote = nullptr;
  if (read(to_parent[0], &remote, sizeof remote) != static_cast<ssize_t>(sizeof remote)) return 1;
  std::vector<char> block(B);
  std::vector<char> local(S, 2);
  auto rate = [&](auto a, auto b) { return S / std::chrono::duration<double>(b - a).count() / 1e9; };
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t o = 0; o < S; o += B) {
      iovec l{block.data(), B}, r{remote + o, B};
      if (process_vm_readv(child, &l, 1, &r, 1, 0) != static_cast<ssize_t>(B)) return perror("readv"), 1;
    }
    const auto t1 = std::chrono::steady_clock::now();
    for (std::size_t o = 0; o < S; o += B) std::memcpy(block.data(), local.data() + o, B);
    const auto t2 = std::chrono::steady_clock::now();
    for (std::size_t o = 0; o < S; o += B) {
      iovec l{block.data(), B}, r{remote + o, B};
      if (process_vm_writev(child, &l, 1, &r, 1, 0) != static_cast<ssize_t>(B)) return perror("writev"), 1;
    }
    const auto t3 = std::chrono::steady_clock::now();
    for (std::size_t o = 0; o < S; o += B) std::memcpy(local.data() + o, block.data(), B);
    const auto t4 = std::chrono::steady_clock::now();
    std::printf("block %5zu KiB  readv %6.2f GB/s  memcpy read %6.2f  |  writev %6.2f  memcpy write %6.2f\n", B >> 10,
                rate(t0, t1), rate(t1, t2), rate(t2, t3), rate(t3, t4));
  }
  (void)!write(to_child[1], "x", 1);
  waitpid(child, nullptr, 0);
}
