// Ranks launched with different DPKIT_MPI_INTER_FRAGMENT values (an MPMD
// mpiexec line): constructing dpkit::mpi must throw invalid_argument on
// every rank, naming both values, instead of sending fragments that a peer
// receives as whole messages. Exits 0 when this rank threw as expected, 1
// otherwise (meson runs it under mpiexec; any rank's 1 fails the test).
#include <dpkit/dpkit.hpp>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 1;
  try {
    dpkit::mpi comm(MPI_COMM_WORLD);
    std::fprintf(stderr, "rank %d: dpkit::mpi accepted disagreeing fragment settings\n", comm.rank());
  } catch (const dpkit::invalid_argument& e) {
    const bool named = std::strstr(e.what(), "disagree") && std::strstr(e.what(), "8192") &&
                       std::strstr(e.what(), "DPKIT_MPI_INTER_FRAGMENT");
    std::fprintf(stderr, "%s: %s\n", named ? "expected" : "unexpected text", e.what());
    rc = named ? 0 : 1;
  }
  MPI_Finalize();
  return rc;
}
