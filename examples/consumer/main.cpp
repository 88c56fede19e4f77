// A program that uses the *installed* dpkit package: 4 in-process ranks
// average a user tensor type that only has data_ptr()/numel().
#include <dpkit/dpkit.hpp>

#include <cstdio>
#include <vector>

struct grad {                       // the user's own tensor type
  std::vector<float> storage;
  float* data_ptr() { return storage.data(); }
  long numel() const { return static_cast<long>(storage.size()); }
};

template <>
struct dpkit::tensor_traits<grad> {
  using value_type = float;
  static float* data(grad& g) { return g.data_ptr(); }
  static std::size_t size(const grad& g) { return static_cast<std::size_t>(g.numel()); }
};

int main() {
  dpkit::inproc_world world(4);
  std::vector<float> result;
  world.run([&](dpkit::inproc& comm) {
    grad g{std::vector<float>(1000, static_cast<float>(comm.rank()))};
    dpkit::allreduce(comm, g, dpkit::reduce_op::avg);  // (0+1+2+3)/4 = 1.5
    if (comm.rank() == 0) result = g.storage;
  });
  const bool ok = result.size() == 1000 && result.front() == 1.5f && result.back() == 1.5f;
  std::printf("dpkit consumer: %s\n", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
