// ddp_step: one data-parallel training step's gradient reduction, DDP style.
//
// Reads a model's parameter list (models/*.tsv), allocates its gradients, and
// runs a simulated backward pass that produces the gradients layer by layer in
// reverse registration order, with compute time proportional to each layer's
// parameter count (real arithmetic on the gradient). Every gradient is handed
// to a dpkit::gradient_reducer as soon as it is ready, so bucket all-reduces
// overlap the rest of backward. The result is checked against a plain
// per-tensor all-reduce of the same gradients.
//
//   mpirun -np 2 build/examples/ddp_step data/models/gpt2-124m.tsv
//   build/examples/ddp_step data/models/gpt2-124m.tsv -t 4     # 4 threads as ranks
// Without mpirun (Gloo build), one process per rank (launch_main.hpp):
//   build/examples/ddp_step data/models/gpt2-124m.tsv --rendezvous tcp://127.0.0.1:29500 --rank 0 --world-size 2 &
//   build/examples/ddp_step data/models/gpt2-124m.tsv --rendezvous tcp://127.0.0.1:29500 --rank 1 --world-size 2
//   (or MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE in the environment, as torchrun sets them)
//
// Options: -t N (inproc transport with N ranks instead of MPI),
// --rendezvous URL --rank R --world-size W (a launch without mpirun), --steps S
// (default 2; buckets are rebuilt from the observed order after step 0),
// --work W (arithmetic passes per gradient element, default 8),
// --bucket-view (write gradients straight into the buckets).
// Prints "match" and exits 0 when every rank's reduced gradients equal the
// per-tensor reference (within float rounding of a different summation
// order), otherwise a mismatch report and exit 1.
#include <dpkit/collectives.hpp>
#include <dpkit/fusion/gradient_reducer.hpp>
#include <dpkit/fusion/model_spec.hpp>
#include <dpkit/transport/inproc.hpp>
#if defined(DPKIT_WITH_MPI) && __has_include(<dpkit/transport/mpi.hpp>)
#include <dpkit/transport/mpi.hpp>
#define DDP_STEP_HAVE_MPI 1
#endif

#include "launch_main.hpp"
#include "run_main.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct args {
  std::string model;
  int threads = 0; // 0: MPI
  int steps = 2;
  int work = 8;
  bool bucket_view = false;
};

// Deterministic gradient value in [-1, 1) for (rank, step, tensor, element),
// refined by `work` rounds of arithmetic: the simulated backward's compute.
inline float grad_value(int rank, int step, std::size_t tensor, std::size_t k, int work) {
  std::uint64_t z = (static_cast<std::uint64_t>(rank) << 48) ^ (static_cast<std::uint64_t>(step) << 40) ^
                    (static_cast<std::uint64_t>(tensor) << 28) ^ k;
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  float x = static_cast<float>(z >> 40) * 0x1p-24f * 2.0f - 1.0f;
  for (int w = 0; w < work; ++w) x = x * 0.999f + 0.0001f * static_cast<float>(w & 3); // "compute"
  return x;
}

// A gradient tensor of the model's element type (f32, bf16, ...).
struct grad_buffer {
  dpkit::element_type type;
  std::size_t count;
  std::vector<std::uint64_t> store;
  grad_buffer(dpkit::element_type t, std::size_t n) : type(t), count(n), store((n * dpkit::element_size(t) + 7) / 8) {}
  dpkit::gradient_ref ref() { return {store.data(), count, type, dpkit::memory_space::host}; }
};

// Writes the simulated gradient of tensor i into dst (type t, n elements).
void compute_gradient(void* dst, dpkit::element_type t, std::size_t n, int rank, int step, std::size_t i, int work) {
  dpkit::visit_element_type(t, [&](auto zero) {
    using T = decltype(zero);
    T* p = static_cast<T*>(dst);
    for (std::size_t k = 0; k < n; ++k) p[k] = static_cast<T>(grad_value(rank, step, i, k, work));
  });
}

double to_double(const void* p, dpkit::element_type t, std::size_t k) {
  double v = 0;
  dpkit::visit_element_type(t, [&](auto zero) {
    using T = decltype(zero);
    v = static_cast<double>(static_cast<float>(static_cast<const T*>(p)[k]));
  });
  return v;
}

std::mutex print_mu;

template <class C>
int run_rank(C& comm, const args& a) {
  using clk = std::chrono::steady_clock;
  const auto spec = dpkit::load_model_spec(a.model);
  const int rank = comm.rank(), world = comm.size();
  std::vector<grad_buffer> grads, ref;
  for (const auto& p : spec.params) {
    grads.emplace_back(p.type, p.numel);
    ref.emplace_back(p.type, p.numel);
  }
  std::vector<dpkit::gradient_ref> grad_refs;
  for (auto& g : grads) grad_refs.push_back(g.ref());

  dpkit::reducer_options opt;
  opt.compute_stats = true;
  opt.gradient_as_bucket_view = a.bucket_view;
  dpkit::gradient_reducer<C> red(comm, grad_refs, opt, spec.names());
  if (rank == 0)
    std::printf("ddp_step: %s: %zu tensors, %zu parameters (%.1f MiB), world size %d, %zu buckets\n",
                spec.source.c_str(), spec.params.size(), spec.total_numel(),
                static_cast<double>(spec.total_bytes()) / (1 << 20), world, red.plan().size());

  std::uint64_t bad_total = 0;
  double worst = 0;
  for (int step = 0; step < a.steps; ++step) {
    dpkit::barrier(comm);
    const auto t0 = clk::now();
    // Simulated backward: last registered layer first.
    for (std::size_t i = spec.params.size(); i-- > 0;) {
      const auto& p = spec.params[i];
      void* dst = a.bucket_view ? static_cast<void*>(red.bucket_bytes(i).data()) : grads[i].ref().data;
      compute_gradient(dst, p.type, p.numel, rank, step, i, a.work);
      red.mark_ready(i);
    }
    const auto t1 = clk::now();
    const auto res = red.finish();
    const auto t2 = clk::now();
    // Reference: the same gradients, one plain all-reduce per tensor.
    for (std::size_t i = 0; i < spec.params.size(); ++i) {
      compute_gradient(ref[i].store.data(), spec.params[i].type, spec.params[i].numel, rank, step, i, a.work);
      dpkit::visit_element_type(spec.params[i].type, [&](auto zero) {
        using T = decltype(zero);
        dpkit::tensor_view<T> v{reinterpret_cast<T*>(ref[i].store.data()), ref[i].count, dpkit::memory_space::host};
        dpkit::allreduce(comm, v, v, dpkit::reduce_op::avg);
      });
    }
    // Compare: values are averages of `world` numbers in [-1, 1]; summation
    // order differs between bucketed and per-tensor reductions.
    const double eps = spec.params.empty() ? 0 : (spec.params[0].type == dpkit::element_type::f32 ? 1.2e-7 : 7.9e-3);
    const double tol = 2.0 * world * eps;
    std::uint64_t bad = 0;
    std::size_t first_bad = spec.params.size(), first_k = 0;
    for (std::size_t i = 0; i < spec.params.size(); ++i) {
      const void* got = a.bucket_view ? static_cast<const void*>(red.bucket_bytes(i).data()) : grads[i].store.data();
      for (std::size_t k = 0; k < ref[i].count; ++k) {
        const double d = std::fabs(to_double(got, ref[i].type, k) - to_double(ref[i].store.data(), ref[i].type, k));
        worst = std::max(worst, d);
        if (!(d <= tol)) {
          if (bad++ == 0) {
            first_bad = i;
            first_k = k;
          }
        }
      }
    }
    if (bad) {
      std::lock_guard lk(print_mu);
      std::printf("rank %d step %d: %llu elements differ from the per-tensor all-reduce; first: tensor %zu (%s) "
                  "element %zu\n",
                  rank, step, static_cast<unsigned long long>(bad), first_bad, spec.params[first_bad].name.c_str(),
                  first_k);
    }
    bad_total += bad;
    std::vector<double> t{std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count()};
    dpkit::allreduce(comm, t, t, dpkit::reduce_op::max);
    if (rank == 0)
      std::printf("step %d: backward %.1f ms, exposed communication after backward %.1f ms, grad norm %.6g, "
                  "all finite %s, %zu buckets\n",
                  step, 1e3 * t[0], 1e3 * t[1], res.grad_norm, res.all_finite ? "yes" : "no", red.plan().size());
    if (step == 0 && red.rebuild_buckets() && rank == 0)
      std::printf("rebuilt buckets from rank 0's observed order: %zu buckets\n", red.plan().size());
  }
  std::vector<std::uint64_t> total{bad_total};
  dpkit::allreduce(comm, total, total, dpkit::reduce_op::sum);
  std::vector<double> w{worst};
  dpkit::allreduce(comm, w, w, dpkit::reduce_op::max);
  if (rank == 0) {
    if (total[0] == 0) std::printf("match (max abs difference %.3g)\n", w[0]);
    else std::printf("MISMATCH: %llu elements differ across all ranks and steps (max abs difference %.3g)\n",
                     static_cast<unsigned long long>(total[0]), w[0]);
  }
  return total[0] == 0 ? 0 : 1;
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s MODEL.tsv [-t THREADS | --rendezvous URL --rank R --world-size W] [--steps S] [--work W] "
               "[--bucket-view]\n",
               argv0);
  return 2;
}

int ddp_step_main(int argc, char** argv) {
  args a;
  const auto launch = dpkit_programs::take_launch_flags(argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : std::string(); };
    try {
      if (s == "-t") a.threads = std::stoi(next());
      else if (s == "--steps") a.steps = std::stoi(next());
      else if (s == "--work") a.work = std::stoi(next());
      else if (s == "--bucket-view") a.bucket_view = true;
      else if (s == "-h" || s == "--help") return usage(argv[0]);
      else if (a.model.empty() && !s.starts_with("-")) a.model = s;
      else return usage(argv[0]);
    } catch (const std::exception&) {
      return usage(argv[0]);
    }
  }
  if (a.model.empty()) return usage(argv[0]);
  if (a.threads > 0) {
    if (launch.any())
      throw dpkit::invalid_argument("-t " + std::to_string(a.threads) +
                                    " runs the ranks as threads of this process: it takes no --rendezvous, --rank or "
                                    "--world-size");
    dpkit::inproc_world world(a.threads);
    std::vector<int> rc(static_cast<std::size_t>(a.threads));
    world.run([&](dpkit::inproc& comm) { rc[static_cast<std::size_t>(comm.rank())] = run_rank(comm, a); });
    return rc[0];
  }
  // mpirun (dpkit::mpi), or a launch without it (dpkit::gloo_transport)
  const auto body = [&](auto& comm) { return run_rank(comm, a); };
#ifdef DDP_STEP_HAVE_MPI
  return dpkit_programs::run_on_transport(argc, argv, launch, dpkit_programs::mpi_threads::multiple, body);
#else
  if (auto rc = dpkit_programs::run_if_launched(launch, body)) return *rc;
  std::fprintf(stderr, "ddp_step: built without MPI; use -t N for N threads as ranks, or --rendezvous URL --rank R "
                       "--world-size W\n");
  return 2;
#endif
}

} // namespace

int main(int argc, char** argv) {
  return dpkit_programs::run_main("ddp_step", [&] { return ddp_step_main(argc, argv); });
}
