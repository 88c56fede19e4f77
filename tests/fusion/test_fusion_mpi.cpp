// gradient_reducer over the MPI transport (run by meson test through mpiexec
// with 2 and 3 ranks): equality with a per-tensor all-reduce on the real
// models' shapes (scaled down) with a different random ready order per rank,
// no_sync accumulation, rebuild agreement, finite flag and norm, plan mismatch.
// Every rank runs the same test cases in the same order; a failure on any rank
// fails the program on every rank.
#define DOCTEST_CONFIG_IMPLEMENT
#include "fusion_test_util.hpp"

#include <dpkit/transport/mpi.hpp>

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace ft = fusion_test;
using dpkit::gradient_reducer;

using fusion_test::random_order;
using fusion_test::small_opts;

TEST_CASE("mpi: reducer equals per-tensor all-reduce on the real models, random local orders, rebuild") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  for (const std::string name : {"gpt2-124m", "bert-base-uncased", "llama-2-7b"}) {
    CAPTURE(name);
    const auto spec = ft::scaled(dpkit::load_model_spec(ft::model_path(name)), 1000);
    auto grads = ft::make_grads(spec);
    auto ref = ft::make_grads(spec);
    gradient_reducer<dpkit::mpi> red(comm, ft::refs(grads), small_opts(), spec.names());
    for (int step = 0; step < 3; ++step) {
      ft::fill(grads, comm.rank(), step);
      ft::fill(ref, comm.rank(), step);
      for (auto i : random_order(grads.size(), static_cast<unsigned>(comm.rank() * 31 + step))) red.mark_ready(i);
      red.finish();
      ft::per_tensor_allreduce(comm, ref, dpkit::reduce_op::avg);
      CHECK(ft::first_mismatch(grads, ref) == -1);
      if (step == 0) {
        const auto before = red.plan();
        CHECK(red.rebuild_buckets());
        // every rank holds rank 0's plan: compare fingerprints
        unsigned long long fp = red.plan().fingerprint(), mx = 0, mn = 0;
        MPI_Allreduce(&fp, &mx, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&fp, &mn, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
        CHECK(mx == mn);
        CHECK(red.plan() != before);
      }
    }
  }
}

TEST_CASE("mpi: no_sync accumulates exactly") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const auto spec = ft::scaled(dpkit::load_model_spec(ft::model_path("gpt2-124m")), 1000);
  auto grads = ft::make_grads(spec);
  auto micro = ft::make_grads(spec);
  auto o = small_opts();
  o.divide_by_world_size = false;
  gradient_reducer<dpkit::mpi> red(comm, ft::refs(grads), o);
  for (int st = 0; st < 3; ++st) {
    ft::fill(micro, comm.rank(), st);
    auto order = random_order(micro.size(), static_cast<unsigned>(comm.rank() + st));
    if (st < 2) {
      auto g = red.no_sync();
      for (auto i : order) red.mark_ready(i, std::span<const float>(static_cast<const float*>(micro[i].data()), micro[i].count));
    } else {
      for (auto i : order) red.mark_ready(i, std::span<const float>(static_cast<const float*>(micro[i].data()), micro[i].count));
      red.finish();
    }
  }
  bool ok = true;
  for (std::size_t i = 0; i < grads.size(); ++i)
    for (std::size_t k = 0; k < grads[i].count; ++k) {
      float s = 0;
      for (int r = 0; r < comm.size(); ++r)
        for (int st = 0; st < 3; ++st) s += ft::int_value(r, st, i, k);
      ok = ok && grads[i].get(k) == s;
    }
  CHECK(ok);
}

TEST_CASE("mpi: NaN on the last rank only flags every rank; norm identical everywhere") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  const auto spec = ft::scaled(dpkit::load_model_spec(ft::model_path("bert-base-uncased")), 1000);
  auto grads = ft::make_grads(spec);
  auto o = small_opts();
  o.compute_stats = true;
  gradient_reducer<dpkit::mpi> red(comm, ft::refs(grads), o);
  ft::fill(grads, comm.rank(), 0);
  for (auto i : random_order(grads.size(), static_cast<unsigned>(comm.rank()))) red.mark_ready(i);
  auto r = red.finish();
  CHECK(r.all_finite);
  double mx = 0, mn = 0;
  MPI_Allreduce(&r.grad_norm, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&r.grad_norm, &mn, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  CHECK(mx == mn);
  CHECK(mx > 0);
  ft::fill(grads, comm.rank(), 1);
  if (comm.rank() == comm.size() - 1) grads[5].set(0, std::numeric_limits<float>::quiet_NaN());
  for (auto i : random_order(grads.size(), static_cast<unsigned>(comm.rank() + 5))) red.mark_ready(i);
  r = red.finish();
  CHECK_FALSE(r.all_finite);
}

TEST_CASE("mpi: mismatched parameter on one rank is an invalid_argument on every rank") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  std::vector<dpkit::param_info> ps{{40, dpkit::element_type::f32}, {40, dpkit::element_type::f32}};
  if (comm.rank() == 1) ps[0].bytes = 80;
  CHECK_THROWS_WITH_AS(gradient_reducer<dpkit::mpi>(comm, ps), doctest::Contains("parameter 0"), dpkit::invalid_argument);
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "test_fusion_mpi: MPI_THREAD_MULTIPLE not provided\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context ctx(argc, argv);
  if (rank != 0) ctx.setOption("minimal", true);
  int failed = ctx.run() != 0 ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
