// quickstart: average a gradient across ranks with every all-reduce algorithm
// and check it against the sequential answer.
//   mpirun -np 4 build/examples/quickstart        (MPI build: one process per rank)
//   build/examples/quickstart 4                    (any build: 4 ranks as threads)
// Without mpirun (Gloo build): one process per rank, met through rank 0's store
//   build/examples/quickstart --rendezvous tcp://127.0.0.1:29500 --rank 0 --world-size 2 &
//   build/examples/quickstart --rendezvous tcp://127.0.0.1:29500 --rank 1 --world-size 2
//   (or MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=r WORLD_SIZE=2, as torchrun sets them)
#include <dpkit/dpkit.hpp>

#include "launch_main.hpp"
#include "run_main.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// Runs on every rank; returns the number of wrong elements.
template <dpkit::transport C>
int step(C& comm) {
  const std::size_t count = 1'000'003; // prime: chunks are not equal
  std::vector<float> grad(count);
  int wrong = 0;
  for (auto algo : {dpkit::algorithm::ring, dpkit::algorithm::tree, dpkit::algorithm::automatic}) {
    for (std::size_t i = 0; i < count; ++i) grad[i] = static_cast<float>(comm.rank() + static_cast<int>(i % 7));
    dpkit::allreduce(comm, grad, dpkit::reduce_op::sum, {algo});
    const int n = comm.size();
    for (std::size_t i = 0; i < count; ++i)
      wrong += grad[i] != static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i % 7));
    if (comm.rank() == 0) std::printf("%-9s all-reduce of %zu floats on %d ranks: %s\n",
                                      std::string(dpkit::algorithm_name(algo)).c_str(), count, n, wrong ? "WRONG" : "ok");
  }
  return wrong;
}

} // namespace

int main(int argc, char** argv) {
  // run_main: an error on any rank prints "quickstart: rank R: ..." and ends
  // the whole job (examples/run_main.hpp), never a hang.
  return dpkit_programs::run_main("quickstart", [&] {
    const auto flags = dpkit_programs::take_launch_flags(argc, argv);
    if (argc < 2) {
      // mpirun, a launch without it (flags or env:// variables), or a plain
      // run: one rank over MPI (an MPI build) or 4 threads
      const auto body = [](auto& comm) { return step(comm) ? 1 : 0; };
#ifdef DPKIT_WITH_MPI
      return dpkit_programs::run_on_transport(argc, argv, flags, dpkit_programs::mpi_threads::serialized, body);
#else
      if (auto rc = dpkit_programs::run_if_launched(flags, body)) return *rc;
#endif
    } else if (flags.any()) {
      throw dpkit::invalid_argument(std::string("quickstart ") + argv[1] +
                                    " runs the ranks as threads of this process: it takes no --rendezvous, --rank "
                                    "or --world-size");
    }
    const int ranks = argc > 1 ? std::atoi(argv[1]) : 4;
    dpkit::inproc_world world(ranks);
    std::vector<int> wrong(static_cast<std::size_t>(ranks));
    world.run([&](dpkit::inproc& comm) { wrong[static_cast<std::size_t>(comm.rank())] = step(comm); });
    for (int w : wrong)
      if (w) return 1;
    return 0;
  });
}
