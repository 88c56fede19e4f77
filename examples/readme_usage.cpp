// The README's usage example, verbatim, so the build proves it compiles
// (README: "Use it"). Build it by hand as the README says:
//   mpicxx -std=c++20 -O2 -I include examples/readme_usage.cpp -o readme_usage
//   mpirun -np 2 ./readme_usage
// or with the Gloo transport too, to run it without mpirun:
//   mpicxx -std=c++20 -O2 -DDPKIT_WITH_GLOO -I include examples/readme_usage.cpp -o readme_usage -lgloo -lhiredis
//   for r in 0 1; do MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=$r WORLD_SIZE=2 ./readme_usage & done; wait
#include <dpkit/dpkit.hpp>
#include <mpi.h>
#ifdef DPKIT_WITH_GLOO
#include <dpkit/transport/launch.hpp>                            // without mpirun (libgloo)
#endif

#include <cstdio>
#include <vector>

struct my_tensor {                                               // your type
  std::vector<float> storage;
  float* data_ptr() { return storage.data(); }
  long numel() const { return static_cast<long>(storage.size()); }
};

template <> struct dpkit::tensor_traits<my_tensor> {            // adapt it once
  using value_type = float;
  static float* data(my_tensor& t) { return t.data_ptr(); }
  static std::size_t size(const my_tensor& t) { return static_cast<std::size_t>(t.numel()); }
};

template <dpkit::transport C>                                    // dpkit::mpi, gloo_transport, inproc
void train(C& comm) {
  my_tensor grad{std::vector<float>(1000, float(comm.rank()))};
  dpkit::allreduce(comm, grad, dpkit::reduce_op::avg);            // ring or tree, by size
  auto h = dpkit::allreduce_async(comm, grad);                    // overlaps with compute
  h.wait();
  if (comm.rank() == 0) std::printf("grad[0] = %g\n", grad.storage[0]);
}

int main(int argc, char** argv) {
#ifdef DPKIT_WITH_GLOO
  if (auto job = dpkit::launch_from_env()) {                      // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    dpkit::gloo_transport comm = dpkit::connect_launch(*job);     // as torchrun sets them
    train(comm);
    return 0;
  }
#endif
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  {
    dpkit::mpi comm(MPI_COMM_WORLD);
    train(comm);
  }
  MPI_Finalize();
}
