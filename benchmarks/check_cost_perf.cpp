// What checking adds to one collective call, in nanoseconds, measured without
// the network's noise: a 1-rank inproc world runs allreduce_ring of a few
// floats in a tight loop (the call then does everything but send: validation,
// the collective scope, the local copy), through
//   - an unchecked wrapper of the transport (no health(): what v0.1 did),
//   - the checked transport with DPKIT_CHECK level 0 (sequence numbers and
//     health, plain tags), and level 1 (the default: fingerprint in the tags).
// The difference is the per-call cost of checking; docs/tuning.md puts it next
// to the 8-byte all-reduce time.   build/benchmarks/check_cost_perf [calls]
#include <dpkit/dpkit.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

// Forwards the transport concept's members only: not a checked_transport.
struct unchecked {
  dpkit::inproc* c;
  int rank() const { return c->rank(); }
  int size() const { return c->size(); }
  bool accepts(dpkit::memory_space s) const { return c->accepts(s); }
  auto isend(std::span<const std::byte> b, int p, int t) { return c->isend(b, p, t); }
  auto irecv(std::span<std::byte> b, int p, int t) { return c->irecv(b, p, t); }
  dpkit::detail::scratch_arena& scratch() { return c->scratch(); }
};

template <class C>
double ns_per_call(C& comm, long calls, int level) {
  std::vector<float> in(2, 1.0f), out(2);
  dpkit::collective_options o;
  o.check = level;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i) dpkit::allreduce_ring(comm, in, out, dpkit::reduce_op::sum, o);
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / calls;
}

} // namespace

int main(int argc, char** argv) {
  const long calls = argc > 1 ? std::atol(argv[1]) : 1000000;
  dpkit::inproc_world world(1);
  world.run([&](dpkit::inproc& comm) {
    unchecked u{&comm};
    double base = 1e30, l0 = 1e30, l1 = 1e30;
    for (int round = 0; round < 7; ++round) { // interleaved, best of 7 each: the machine is shared
      base = std::min(base, ns_per_call(u, calls, 1));
      l0 = std::min(l0, ns_per_call(comm, calls, 0));
      l1 = std::min(l1, ns_per_call(comm, calls, 1));
    }
    std::printf("# check_cost_perf: allreduce_ring of 2 floats on a 1-rank inproc world, %ld calls, best of 7 interleaved rounds\n", calls);
    std::printf("unchecked transport (v0.1 path)   %8.1f ns/call\n", base);
    std::printf("checked, DPKIT_CHECK=0            %8.1f ns/call  (+%.1f ns)\n", l0, l0 - base);
    std::printf("checked, DPKIT_CHECK=1 (default)  %8.1f ns/call  (+%.1f ns)\n", l1, l1 - base);
  });
}
