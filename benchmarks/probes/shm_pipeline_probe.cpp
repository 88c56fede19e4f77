// shm_pipeline_probe: the pipelined two-shot all-reduce that was tried and
// not adopted (docs/tuning.md "Pipelined two-shot"; the runs:
// benchmarks/results/2026-11-24-shm-pipelined-two-shot.md), measured
// against dpkit's chunked two-shot in one process: float sum, np ranks of one
// node, out of place and in place, 512 KiB .. 128 MiB. Each iteration runs
// the three variants once, in rotating order, each on its own buffers of a
// rotation of at least 256 MiB (no variant gets another's warm buffers);
// prints per variant the median over iterations of the slowest rank's time,
// its ratio to the chunked two-shot and in how many iterations it was at
// least as fast (paired, so the VM's drift cancels out).
//
//   mpirun -np 2 build/benchmarks/probes/shm_pipeline_probe [iterations, default 24]
//
// The variants: "chunked" (allreduce_shm_two_shot: per chunk of one buffer
// copy in, step, reduce, step, copy out: 2K steps), "pipe buf" (pipelined
// over chunks of one buffer: between two steps chunk t-1's copy-out, chunk
// t's reduction and chunk t+1's copy-in: K + 1 steps), "pipe 512K" (the same
// in chunks of 512 KiB).
#include <dpkit/dpkit.hpp>

#include <mpi.h>

#include "run_main.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace probe {
using namespace dpkit;         // the probe reuses dpkit's internals
using namespace dpkit::detail; // (shm_steps, chunk_range, shm_reduce_ranks)

/// The two-shot all-reduce of `count` host elements from `in` to `out`
/// (in == out: in place) in chunks of `cap` elements, pipelined: between two
/// steps a rank copies chunk t - 1's reduced slices of its peers out (the
/// all-gather), reduces its own slice of chunk t (the reduce-scatter: its own
/// input and the peers' copies, rank order, so every rank gets the same bits)
/// and copies in chunk t + 1's slices for its peers. K chunks take K + 1 steps
/// instead of 2K (one chunk: copy in, step, reduce, step, copy out), and a
/// rank that is ahead goes on with the next chunk while a peer still copies
/// the previous one out. Rank p's slice of every chunk lives at a fixed place
/// of a buffer (region p, where a full chunk puts it): in the buffer of step
/// t + 1 a rank's regions q != r hold its copies of chunk t + 1's slices for
/// rank q and region r its reduced slice of chunk t. Every write before a step
/// goes to that step's buffer, as the step protocol requires (collectives/shm/steps.hpp),
/// so back-to-back collectives stay safe.
template <class C, element T>
void pipelined_two_shot(shm_steps<C>& st, const T* in, T* out, std::size_t count, std::size_t cap, int n, int r,
                        reduce_op op) {
  const std::size_t chunks = (count + cap - 1) / cap;
  auto len_of = [&](std::size_t t) { return std::min(cap, count - t * cap); };
  auto region = [&](int p) { return chunk_range(cap, n, p).first; };
  auto copy_in = [&](std::size_t t, int b) {
    const std::size_t off = t * cap, m = len_of(t);
    T* buf = reinterpret_cast<T*>(st.mine(b));
    for (int p = 0; p < n; ++p) {
      const auto [pb, pe] = chunk_range(m, n, p);
      if (p != r && pe > pb)
        std::memcpy(static_cast<void*>(buf + region(p)), static_cast<const void*>(in + off + pb), (pe - pb) * sizeof(T));
    }
  };
  int b = st.next_buffer();
  copy_in(0, b);
  st.step();
  const std::size_t mine_at = region(r);
  for (std::size_t t = 0; t < chunks; ++t) {
    const std::size_t off = t * cap, m = len_of(t);
    const int bn = st.next_buffer();
    // Slice r of chunk t: own input (private) and every peer's copy, in rank
    // order, into region r of the next step's buffer, in blocks small enough
    // to stay in L1 so the copy to out reads no memory.
    const auto own = chunk_range(m, n, r); // no structured binding: clang 14 cannot capture one
    const std::size_t sb = own.first, se = own.second;
    T* red = reinterpret_cast<T*>(st.mine(bn)) + mine_at;
    constexpr std::size_t block = std::max<std::size_t>(1, (std::size_t{16} << 10) / sizeof(T));
    for (std::size_t q = sb; q < se; q += block) {
      const std::size_t len = std::min(block, se - q);
      shm_reduce_ranks<T>(
          red + (q - sb),
          [&](int p) { return p == r ? in + off + q : reinterpret_cast<const T*>(st.of(p, b)) + mine_at + (q - sb); }, n,
          len, op);
      std::memcpy(static_cast<void*>(out + off + q), static_cast<const void*>(red + (q - sb)), len * sizeof(T));
    }
    if (t + 1 < chunks) copy_in(t + 1, bn);
    st.step();
    for (int p = 0; p < n; ++p) {
      const auto [pb, pe] = chunk_range(m, n, p);
      if (p != r && pe > pb)
        std::memcpy(static_cast<void*>(out + off + pb),
                    static_cast<const void*>(reinterpret_cast<const T*>(st.of(p, bn)) + region(p)), (pe - pb) * sizeof(T));
    }
    b = bn;
  }
}

} // namespace probe

namespace {

int shm_pipeline_probe_main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  constexpr int variants = 3;
  const char* names[variants] = {"chunked", "pipe buf", "pipe 512K"};
  {
    dpkit::mpi comm(MPI_COMM_WORLD);
    const int r = comm.rank(), n = comm.size();
    const int iters = argc > 1 ? std::max(3, std::atoi(argv[1])) : 24;
    if (!comm.shm()) {
      if (r == 0) std::fprintf(stderr, "shm_pipeline_probe: no shared segment (ranks on one node?)\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (r == 0)
      std::printf("# shm_pipeline_probe: np=%d, float sum, %d iterations (2 warm-up), median us of the slowest rank; "
                  "ratio to chunked (pairs at least as fast)\n",
                  n, iters);
    for (std::size_t bytes = std::size_t{512} << 10; bytes <= (std::size_t{128} << 20); bytes *= 2) {
      const std::size_t count = bytes / sizeof(float);
      const std::size_t k = std::max<std::size_t>(variants + 1, (std::size_t{256} << 20) / bytes);
      std::vector<std::vector<float>> in(k, std::vector<float>(count)), out(k, std::vector<float>(count));
      for (auto& v : in)
        for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((i + static_cast<std::size_t>(r)) % 5);
      for (bool in_place : {false, true}) {
        std::vector<double> t[variants];
        long wrong = 0;
        for (int it = 0; it < iters; ++it)
          for (int v = 0; v < variants; ++v) {
            const int which = (v + it) % variants;
            const std::size_t j = (static_cast<std::size_t>(it) * variants + static_cast<std::size_t>(v)) % k;
            if (in_place) std::memcpy(out[j].data(), in[j].data(), bytes);
            const float* src = in_place ? out[j].data() : in[j].data();
            MPI_Barrier(MPI_COMM_WORLD);
            const auto t0 = std::chrono::steady_clock::now();
            if (which == 0) {
              dpkit::allreduce_shm_two_shot(comm, dpkit::tensor_view<const float>{src, count, dpkit::memory_space::host},
                                            dpkit::tensor_view<float>{out[j].data(), count, dpkit::memory_space::host});
            } else {
              auto ctx = dpkit::detail::make_context(comm, "shm_pipeline_probe");
              auto& seg = *comm.shm();
              const std::size_t buf = dpkit::detail::shm_chunk_elems<float>(seg, ctx);
              const std::size_t cap = which == 1 ? buf : std::min(buf, (std::size_t{512} << 10) / sizeof(float));
              dpkit::detail::shm_claim claim(seg, ctx);
              dpkit::detail::collective_scope<dpkit::mpi> S(comm, ctx, dpkit::detail::coll_kind::allreduce, "shm2p",
                                                            dpkit::element_type::f32, count, dpkit::reduce_op::sum, -1, {});
              dpkit::detail::shm_steps<dpkit::mpi> st(comm, seg, S, ctx);
              probe::pipelined_two_shot<dpkit::mpi, float>(st, src, out[j].data(), count, cap, n, r,
                                                           dpkit::reduce_op::sum);
            }
            const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
            double slowest = 0;
            MPI_Allreduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (it >= 2) t[which].push_back(slowest);
            for (std::size_t i = 0; i < count; i += 61) {
              float e = 0;
              for (int p = 0; p < n; ++p) e += static_cast<float>((i + static_cast<std::size_t>(p)) % 5);
              wrong += out[j][i] != e;
            }
          }
        auto median = [](std::vector<double> v) {
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        long wsum = 0;
        MPI_Allreduce(&wrong, &wsum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (r == 0) {
          std::printf("%10zu %3s %s %9.1f", bytes, in_place ? "in" : "out", names[0], median(t[0]));
          for (int v = 1; v < variants; ++v) {
            int wins = 0;
            for (std::size_t i = 0; i < t[0].size(); ++i) wins += t[v][i] <= t[0][i];
            std::printf(" | %s %9.1f %.3f (%2d/%zu)", names[v], median(t[v]), median(t[v]) / median(t[0]), wins,
                        t[0].size());
          }
          std::printf(" | #wrong %ld\n", wsum);
          std::fflush(stdout);
        }
      }
    }
  }
  MPI_Finalize();
  return 0;
}

} // namespace

// An error prints "shm_pipeline_probe: rank R: <what>" and ends the whole job (examples/run_main.hpp).
int main(int argc, char** argv) {
  return dpkit_programs::run_main("shm_pipeline_probe", [&] { return shm_pipeline_probe_main(argc, argv); });
}
