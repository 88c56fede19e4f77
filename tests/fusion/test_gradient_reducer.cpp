// gradient_reducer over the inproc transport, world sizes 1-5: equality with a
// plain per-tensor all-reduce on the real models' shapes (scaled down), any
// local ready order, in-order launches, no_sync accumulation, rebuild agreement,
// compression error bounds, finite flag and norm, and every error case.
#include "fusion_test_util.hpp"
#include "../test_sizes.hpp"

#include <dpkit/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <new>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <tuple>
#include <array>

using dpkit::element_type;
using dpkit::gradient_reducer;
using dpkit::inproc;
using dpkit::param_info;
namespace ft = fusion_test;
using fusion_test::random_order;
using fusion_test::small_opts;

namespace {


// Collects per-rank failure messages from rank threads; checked on the main thread.
struct failures {
  std::mutex mu;
  std::vector<std::string> msgs;
  void add(std::string s) {
    std::lock_guard lk(mu);
    msgs.push_back(std::move(s));
  }
  std::string all() {
    std::string s;
    for (auto& m : msgs) s += m + "\n";
    return s;
  }
};

} // namespace

TEST_CASE("gradient_reducer equals per-tensor all-reduce on the real models, any ready order, world 1-5") {
  for (const std::string name : {"gpt2-124m", "bert-base-uncased", "llama-2-7b"}) {
    const auto spec = ft::scaled(dpkit::load_model_spec(ft::model_path(name)), 1000);
    for (int world : test_sizes::worlds({1, 2, 3, 4, 5}, 3))
    for (bool comm_thread : {true, false}) { // false: each bucket all-reduced inside mark_ready
      CAPTURE(name);
      CAPTURE(world);
      CAPTURE(comm_thread);
      auto opts = small_opts();
      opts.comm_thread = comm_thread;
      failures f;
      std::vector<std::size_t> nbuckets(static_cast<std::size_t>(world));
      dpkit::inproc_world w(world);
      w.run([&](inproc& c) {
        auto grads = ft::make_grads(spec);
        auto ref = ft::make_grads(spec);
        gradient_reducer<inproc> red(c, ft::refs(grads), opts, spec.names());
        nbuckets[static_cast<std::size_t>(c.rank())] = red.plan().size();
        for (int step = 0; step < 3; ++step) {
          ft::fill(grads, c.rank(), step);
          ft::fill(ref, c.rank(), step);
          // step 0: reverse registration order; later: a random order per rank.
          std::vector<std::size_t> order(spec.params.size());
          std::iota(order.rbegin(), order.rend(), std::size_t{0});
          if (step > 0) order = random_order(order.size(), static_cast<unsigned>(c.rank() * 100 + step));
          for (auto i : order) red.mark_ready(i);
          const auto r = red.finish();
          if (!r.synchronized) f.add("not synchronized");
          ft::per_tensor_allreduce(c, ref, dpkit::reduce_op::avg);
          const long bad = ft::first_mismatch(grads, ref);
          if (bad >= 0)
            f.add("rank " + std::to_string(c.rank()) + " step " + std::to_string(step) + ": tensor " +
                  std::to_string(bad) + " differs");
          if (step == 1) red.rebuild_buckets();
        }
      });
      CHECK_MESSAGE(f.msgs.empty(), f.all());
      CHECK(nbuckets[0] > 3);
    }
  }
}

TEST_CASE("gradient_reducer: mark_ready(i, grad) with any tensor type, sum without division") {
  for (int world : {2, 3}) {
    failures f;
    dpkit::inproc_world w(world);
    w.run([&](inproc& c) {
      std::vector<param_info> ps{{40, element_type::f32}, {16, element_type::f64}, {6, element_type::bf16},
                                 {12, element_type::i32}};
      auto o = small_opts();
      o.divide_by_world_size = false;
      o.buckets = {8, 16};
      gradient_reducer<inproc> red(c, ps, o);
      const float r = static_cast<float>(c.rank() + 1);
      std::vector<float> a(10, r);
      std::array<double, 2> b{r, -r};
      std::vector<dpkit::bf16> h(3, dpkit::bf16(r));
      std::vector<std::int32_t> in{1, 2, c.rank()};
      red.mark_ready(2, h);
      red.mark_ready(0, a);
      red.mark_ready(3, in);
      red.mark_ready(1, b);
      std::vector<float> oa(10);
      std::vector<double> ob(2);
      std::vector<dpkit::bf16> oh(3);
      std::vector<std::int32_t> oi(3);
      std::vector<dpkit::gradient_ref> outs{dpkit::gradient_ref::of(oa), dpkit::gradient_ref::of(ob),
                                            dpkit::gradient_ref::of(oh), dpkit::gradient_ref::of(oi)};
      red.finish(outs);
      const double s = world * (world + 1) / 2.0;
      const int ranks = world * (world - 1) / 2;
      if (oa != std::vector<float>(10, static_cast<float>(s))) f.add("f32 sum wrong");
      if (ob != std::vector<double>{s, -s}) f.add("f64 sum wrong");
      if (static_cast<float>(oh[2]) != static_cast<float>(s)) f.add("bf16 sum wrong");
      if (oi != std::vector<std::int32_t>{world, 2 * world, ranks}) f.add("i32 sum wrong");
    });
    CHECK_MESSAGE(f.msgs.empty(), f.all());
  }
}

TEST_CASE("gradient_reducer launches buckets in index order whatever the local ready order") {
  dpkit::inproc_world w(2);
  failures f;
  w.run([&](inproc& c) {
    // 6 params of 40 bytes, policy {100, 100}: buckets {5,4,3}, {2,1,0}.
    std::vector<param_info> ps(6, param_info{40, element_type::f32});
    auto o = small_opts();
    o.buckets = {100, 100};
    gradient_reducer<inproc> red(c, ps, o);
    if (red.plan().size() != 2) f.add("expected 2 buckets");
    std::vector<float> g(10, 1.0f);
    if (c.rank() == 0) {
      // Complete bucket 1 first: nothing may be launched until bucket 0 is complete.
      for (std::size_t i : {0, 1, 2}) red.mark_ready(i, g);
      if (red.buckets_launched() != 0) f.add("bucket 1 launched before bucket 0");
      for (std::size_t i : {3, 4}) red.mark_ready(i, g);
      if (red.buckets_launched() != 0) f.add("incomplete bucket launched");
      red.mark_ready(5, g);
      if (red.buckets_launched() != 2) f.add("buckets 0 and 1 not launched together");
    } else {
      for (std::size_t i : {5, 4, 3}) red.mark_ready(i, g);
      if (red.buckets_launched() != 1) f.add("bucket 0 not launched when complete");
      for (std::size_t i : {2, 1, 0}) red.mark_ready(i, g);
      if (red.buckets_launched() != 2) f.add("bucket 1 not launched");
    }
    red.finish(std::vector<dpkit::gradient_ref>(6, dpkit::gradient_ref::of(g)));
    if (g != std::vector<float>(10, 1.0f)) f.add("average of ones is not one");
  });
  CHECK_MESSAGE(f.msgs.empty(), f.all());
}

TEST_CASE("gradient_reducer: no_sync accumulates exactly, copy mode and bucket-view mode") {
  for (bool view : {false, true}) {
    for (int world : {1, 2, 3, 4}) {
      CAPTURE(view);
      CAPTURE(world);
      failures f;
      dpkit::inproc_world w(world);
      w.run([&](inproc& c) {
        const auto spec = ft::scaled(dpkit::load_model_spec(ft::model_path("gpt2-124m")), 2000);
        auto grads = ft::make_grads(spec);
        auto o = small_opts();
        o.divide_by_world_size = false;
        o.gradient_as_bucket_view = view;
        gradient_reducer<inproc> red(c, ft::refs(grads), o);
        auto micro = ft::make_grads(spec);
        auto expect = ft::make_grads(spec); // sum over micro-steps and ranks, computed locally
        const int steps = 4;                // 3 under no_sync + 1 synchronized
        for (std::size_t i = 0; i < expect.size(); ++i)
          for (std::size_t k = 0; k < expect[i].count; ++k) {
            float s = 0;
            for (int r = 0; r < world; ++r)
              for (int st = 0; st < steps; ++st) s += ft::int_value(r, st, i, k);
            expect[i].set(k, s);
          }
        for (int st = 0; st < steps; ++st) {
          ft::fill(micro, c.rank(), st);
          auto order = random_order(micro.size(), static_cast<unsigned>(c.rank() * 10 + st));
          auto run_step = [&] {
            for (auto i : order) {
              if (view) {
                auto bytes = red.bucket_bytes(i);
                // accumulate into the view (the caller's job with bucket views), overwrite on the first micro-step
                dpkit::visit_element_type(micro[i].type, [&](auto z) {
                  using T = decltype(z);
                  auto* d = reinterpret_cast<T*>(bytes.data());
                  const auto* s = static_cast<const T*>(micro[i].data());
                  for (std::size_t k = 0; k < micro[i].count; ++k)
                    d[k] = st == 0 ? s[k] : static_cast<T>(static_cast<float>(d[k]) + static_cast<float>(s[k]));
                });
                red.mark_ready(i);
              } else {
                red.mark_ready(i, std::span<const float>(static_cast<const float*>(micro[i].data()), micro[i].count));
              }
            }
          };
          if (st < steps - 1) {
            auto guard = red.no_sync();
            run_step();
            const auto r = red.finish();
            if (r.synchronized) f.add("finish inside no_sync communicated");
            if (red.buckets_launched() != 0) f.add("no_sync launched a bucket");
          } else {
            run_step();
            red.finish();
          }
        }
        const long bad = ft::first_mismatch(grads, expect);
        if (bad >= 0) f.add("rank " + std::to_string(c.rank()) + ": tensor " + std::to_string(bad) + " differs");
        // The next step starts fresh (no leftover accumulation).
        ft::fill(micro, c.rank(), 9);
        for (std::size_t i = micro.size(); i-- > 0;) {
          if (view) std::memcpy(red.bucket_bytes(i).data(), micro[i].data(), micro[i].bytes());
          red.mark_ready(i, std::span<const float>(static_cast<const float*>(micro[i].data()), micro[i].count));
        }
        red.finish();
        auto ref = ft::make_grads(spec);
        ft::fill(ref, c.rank(), 9);
        ft::per_tensor_allreduce(c, ref, dpkit::reduce_op::sum);
        if (ft::first_mismatch(grads, ref) >= 0) f.add("step after accumulation is not a fresh sum");
      });
      CHECK_MESSAGE(f.msgs.empty(), f.all());
    }
  }
}

TEST_CASE("gradient_reducer: rebuild_buckets gives identical plans on all ranks from rank 0's order") {
  for (int world : {2, 3, 5}) {
    CAPTURE(world);
    failures f;
    std::vector<dpkit::bucket_plan> plans(static_cast<std::size_t>(world)), before(plans.size());
    std::vector<std::vector<std::size_t>> orders(plans.size());
    dpkit::inproc_world w(world);
    w.run([&](inproc& c) {
      const auto spec = ft::scaled(dpkit::load_model_spec(ft::model_path("bert-base-uncased")), 1000);
      auto grads = ft::make_grads(spec);
      gradient_reducer<inproc> red(c, ft::refs(grads), small_opts(), spec.names());
      const auto rk = static_cast<std::size_t>(c.rank());
      before[rk] = red.plan();
      if (red.rebuild_buckets()) f.add("rebuild before any step must return false");
      ft::fill(grads, c.rank(), 0);
      auto order = random_order(grads.size(), static_cast<unsigned>(c.rank() + 1));
      orders[rk] = order;
      for (auto i : order) red.mark_ready(i);
      red.finish();
      if (red.observed_order() != order) f.add("observed order differs from the marking order");
      if (!red.rebuild_buckets()) f.add("rebuild returned false");
      plans[rk] = red.plan();
      // The rebuilt plan still reduces correctly.
      auto ref = ft::make_grads(spec);
      ft::fill(grads, c.rank(), 1);
      ft::fill(ref, c.rank(), 1);
      for (auto i : random_order(grads.size(), static_cast<unsigned>(c.rank() + 77))) red.mark_ready(i);
      red.finish();
      ft::per_tensor_allreduce(c, ref, dpkit::reduce_op::avg);
      if (ft::first_mismatch(grads, ref) >= 0) f.add("wrong result after rebuild");
    });
    CHECK_MESSAGE(f.msgs.empty(), f.all());
    const auto spec = ft::scaled(dpkit::load_model_spec(ft::model_path("bert-base-uncased")), 1000);
    const auto expect = dpkit::plan_buckets_from_order(spec.param_infos(), orders[0], small_opts().buckets);
    for (int r = 0; r < world; ++r) {
      CHECK(plans[static_cast<std::size_t>(r)] == expect);
      CHECK(plans[static_cast<std::size_t>(r)] != before[static_cast<std::size_t>(r)]);
    }
    CHECK(orders[0] != orders[1]); // local orders really differed
  }
}

// A host_allocator that records what it hands out (the bucket buffers must
// come from it, stay inside its blocks, and all go back to it).
struct recording_allocator {
  std::mutex mu;
  std::map<std::uintptr_t, std::size_t> live; // address -> bytes
  std::size_t allocations = 0, frees = 0, bad_frees = 0;
  dpkit::host_allocator make() {
    return {[this](std::size_t n) -> void* {
              void* p = ::operator new(n, std::align_val_t{64});
              std::lock_guard lk(mu);
              live[reinterpret_cast<std::uintptr_t>(p)] = n;
              ++allocations;
              return p;
            },
            [this](void* p, std::size_t n) {
              {
                std::lock_guard lk(mu);
                auto it = live.find(reinterpret_cast<std::uintptr_t>(p));
                if (it == live.end() || it->second != n) ++bad_frees;
                else live.erase(it);
                ++frees;
              }
              ::operator delete(p, std::align_val_t{64});
            }};
  }
  bool owns(const std::byte* p, std::size_t n) {
    std::lock_guard lk(mu);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = live.upper_bound(a);
    if (it == live.begin()) return false;
    --it;
    return a >= it->first && a + n <= it->first + it->second;
  }
};

TEST_CASE("gradient_reducer: symmetric_bucket_allocator puts every bucket in symmetric memory, before and after a "
          "rebuild; results equal a per-tensor all-reduce") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    failures f;
    dpkit::inproc_world w(world);
    w.run([&](inproc& c) {
      // buckets of up to 25 MiB over a 1/100 BERT: most above the two-shot's size, so they run direct
      const auto spec = ft::scaled(dpkit::load_model_spec(ft::model_path("bert-base-uncased")), 100);
      auto grads = ft::make_grads(spec), ref = ft::make_grads(spec);
      auto in_window = [&](gradient_reducer<inproc>& red) {
        for (std::size_t i = 0; i < grads.size(); ++i) {
          auto b = red.bucket_bytes(i);
          if (c.shm()->windows()->find(b.data(), b.size(), c.rank()).first == 0) return false;
        }
        return true;
      };
      auto opts = dpkit::reducer_options{};
      opts.comm_thread = world == 3;
      gradient_reducer<inproc> red(c, ft::refs(grads), opts, spec.names(), dpkit::symmetric_bucket_allocator(c));
      if (!in_window(red)) f.add("a bucket is not in symmetric memory at construction");
      const auto windows = c.shm()->windows()->created();
      if (windows != red.plan().size()) f.add("windows != buckets at construction");
      for (int step = 0; step < 3; ++step) {
        ft::fill(grads, c.rank(), step);
        ft::fill(ref, c.rank(), step);
        for (auto i : random_order(grads.size(), static_cast<unsigned>(c.rank() + 5 + step))) red.mark_ready(i);
        red.finish();
        ft::per_tensor_allreduce(c, ref, dpkit::reduce_op::avg);
        if (ft::first_mismatch(grads, ref) >= 0) f.add("wrong result, step " + std::to_string(step));
        if (step == 0) {
          if (!red.rebuild_buckets()) f.add("rebuild returned false");
          if (!in_window(red)) f.add("after rebuild, a bucket is not in symmetric memory");
          if (c.shm()->windows()->created() != windows + red.plan().size()) f.add("a rebuild did not allocate");
        }
      }
    });
    CHECK_MESSAGE(f.msgs.empty(), f.all());
  }
}

TEST_CASE("gradient_reducer: host_allocator supplies every bucket buffer, before and after a rebuild") {
  for (int world : {1, 3}) {
    CAPTURE(world);
    failures f;
    std::vector<recording_allocator> allocs(static_cast<std::size_t>(world));
    std::vector<std::size_t> buckets_before(allocs.size()), buckets_after(allocs.size());
    dpkit::inproc_world w(world);
    w.run([&](inproc& c) {
      const auto rk = static_cast<std::size_t>(c.rank());
      auto& a = allocs[rk];
      const auto spec = ft::scaled(dpkit::load_model_spec(ft::model_path("bert-base-uncased")), 1000);
      auto grads = ft::make_grads(spec), ref = ft::make_grads(spec);
      {
        gradient_reducer<inproc> red(c, ft::refs(grads), small_opts(), spec.names(), a.make());
        buckets_before[rk] = red.plan().size();
        if (a.allocations != red.plan().size()) f.add("allocations != buckets at construction");
        for (std::size_t i = 0; i < grads.size(); ++i) {
          auto b = red.bucket_bytes(i);
          if (!a.owns(b.data(), b.size())) f.add("parameter " + std::to_string(i) + "'s slot is not in an allocation");
        }
        for (int step = 0; step < 2; ++step) {
          ft::fill(grads, c.rank(), step);
          ft::fill(ref, c.rank(), step);
          for (auto i : random_order(grads.size(), static_cast<unsigned>(c.rank() + 5 + step))) red.mark_ready(i);
          red.finish();
          ft::per_tensor_allreduce(c, ref, dpkit::reduce_op::avg);
          if (ft::first_mismatch(grads, ref) >= 0) f.add("wrong result, step " + std::to_string(step));
          if (step == 0) {
            const std::size_t before = a.allocations;
            if (!red.rebuild_buckets()) f.add("rebuild returned false");
            buckets_after[rk] = red.plan().size();
            if (a.allocations != before + red.plan().size()) f.add("a rebuild did not allocate its buckets");
            if (a.frees != before) f.add("a rebuild did not free the old buckets");
            for (std::size_t i = 0; i < grads.size(); ++i) {
              auto b = red.bucket_bytes(i);
              if (!a.owns(b.data(), b.size())) f.add("after rebuild, a slot is not in an allocation");
            }
          }
        }
      }
      if (!a.live.empty() || a.bad_frees || a.frees != a.allocations)
        f.add("not every buffer went back: " + std::to_string(a.live.size()) + " live, " +
              std::to_string(a.bad_frees) + " bad frees");
    });
    CHECK_MESSAGE(f.msgs.empty(), f.all());
    CHECK(buckets_before[0] > 1);
    CHECK(buckets_after[0] > 1);
  }
}

TEST_CASE("gradient_reducer: a host_allocator's null or misaligned block is an invalid_argument") {
  const std::vector<param_info> params{{4096, element_type::f32, dpkit::memory_space::host}};
  std::size_t freed = 0;
  alignas(64) static std::byte arena[4096 + 64];
  dpkit::host_allocator null_alloc{[](std::size_t) -> void* { return nullptr; }, [](void*, std::size_t) {}};
  dpkit::host_allocator odd_alloc{[](std::size_t) -> void* { return arena + 8; },
                                  [&freed](void* p, std::size_t) { freed += p == arena + 8; }};
  dpkit::inproc_world w(1);
  w.run([&](inproc& c) {
    CHECK_THROWS_WITH_AS((gradient_reducer<inproc>(c, params, {}, {}, null_alloc)),
                         doctest::Contains("host_allocator returned null for 4096 bytes"), dpkit::invalid_argument);
    CHECK_THROWS_WITH_AS((gradient_reducer<inproc>(c, params, {}, {}, odd_alloc)),
                         doctest::Contains("not 64-byte aligned (8 bytes past)"), dpkit::invalid_argument);
  });
  CHECK(freed == 1); // the misaligned block went back to its allocator
}

TEST_CASE("gradient_reducer: f16/bf16 compression error within the 16-bit type's bound") {
  for (auto comp : {dpkit::gradient_compression::f16, dpkit::gradient_compression::bf16}) {
    for (int world : {1, 2, 3, 5}) {
      CAPTURE(comp);
      CAPTURE(world);
      failures f;
      dpkit::inproc_world w(world);
      const std::size_t n0 = 3000, n1 = 1234;
      auto value = [](int rank, std::size_t p, std::size_t k) {
        // splitmix64 of (rank, p, k) -> uniform in [-1, 1), every 17th value scaled by 100
        std::uint64_t z = (static_cast<std::uint64_t>(rank) << 40) ^ (static_cast<std::uint64_t>(p) << 32) ^ k;
        z += 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float u = static_cast<float>(z >> 40) * 0x1p-24f * 2.0f - 1.0f;
        return u * (k % 17 == 0 ? 100.0f : 1.0f);
      };
      std::vector<double> max_rel(static_cast<std::size_t>(world));
      std::vector<int> differs(static_cast<std::size_t>(world));
      w.run([&](inproc& c) {
        std::vector<float> a(n0), b(n1);
        for (std::size_t k = 0; k < n0; ++k) a[k] = value(c.rank(), 0, k);
        for (std::size_t k = 0; k < n1; ++k) b[k] = value(c.rank(), 1, k);
        auto o = small_opts();
        o.compression = comp;
        o.buckets = {4096, 4096};
        gradient_reducer<inproc> red(c, std::vector<dpkit::gradient_ref>{dpkit::gradient_ref::of(a), dpkit::gradient_ref::of(b)}, o);
        red.mark_ready(1);
        red.mark_ready(0);
        red.finish();
        const double u = comp == dpkit::gradient_compression::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
        double worst = 0;
        int diff = 0;
        auto check = [&](const std::vector<float>& got, std::size_t p) {
          for (std::size_t k = 0; k < got.size(); ++k) {
            double exact = 0, mag = 0;
            for (int r = 0; r < world; ++r) {
              exact += value(r, p, k);
              mag += std::fabs(value(r, p, k));
            }
            exact /= world;
            mag /= world;
            // one rounding per rank on compression plus one per pairwise step of the reduction
            const double bound = (world + 1) * u * mag + 1e-7;
            const double err = std::fabs(got[k] - exact);
            worst = std::max(worst, err / bound);
            if (static_cast<float>(exact) != got[k]) ++diff;
          }
        };
        check(a, 0);
        check(b, 1);
        max_rel[static_cast<std::size_t>(c.rank())] = worst;
        differs[static_cast<std::size_t>(c.rank())] = diff;
      });
      CHECK_MESSAGE(f.msgs.empty(), f.all());
      for (int r = 0; r < world; ++r) {
        CHECK(max_rel[static_cast<std::size_t>(r)] <= 1.0);
        CHECK(differs[static_cast<std::size_t>(r)] > 0); // really reduced in 16 bits
      }
    }
  }
}

TEST_CASE("gradient_reducer: all-finite flag on every rank and global norm of the averaged gradient") {
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    failures f;
    std::vector<dpkit::reduce_result> res(static_cast<std::size_t>(4 * world));
    dpkit::inproc_world w(world);
    w.run([&](inproc& c) {
      const auto spec = ft::scaled(dpkit::load_model_spec(ft::model_path("gpt2-124m")), 1000);
      auto grads = ft::make_grads(spec);
      auto o = small_opts();
      o.compute_stats = true;
      gradient_reducer<inproc> red(c, ft::refs(grads), o);
      auto run = [&](int step, std::size_t slot) {
        for (auto i : random_order(grads.size(), static_cast<unsigned>(c.rank() + step))) red.mark_ready(i);
        res[slot * static_cast<std::size_t>(world) + static_cast<std::size_t>(c.rank())] = red.finish();
      };
      ft::fill(grads, c.rank(), 0);
      run(0, 0);
      // expected norm of the averaged gradient, from the known inputs
      double ss = 0;
      for (std::size_t i = 0; i < grads.size(); ++i)
        for (std::size_t k = 0; k < grads[i].count; ++k) {
          double s = 0;
          for (int r = 0; r < world; ++r) s += ft::int_value(r, 0, i, k);
          const double a = static_cast<double>(static_cast<float>(s / world));
          ss += a * a;
        }
      const double want = std::sqrt(ss);
      const double got = res[static_cast<std::size_t>(c.rank())].grad_norm;
      if (!(std::fabs(got - want) <= 1e-9 * want)) f.add("norm " + std::to_string(got) + " want " + std::to_string(want));
      // NaN on the last rank only, in one element of one tensor.
      ft::fill(grads, c.rank(), 1);
      if (c.rank() == world - 1) grads[1].set(3, std::numeric_limits<float>::quiet_NaN());
      run(1, 1);
      // +Inf on rank 0 only.
      ft::fill(grads, c.rank(), 2);
      if (c.rank() == 0) grads[0].set(0, std::numeric_limits<float>::infinity());
      run(2, 2);
      // finite again
      ft::fill(grads, c.rank(), 3);
      run(3, 3);
    });
    CHECK_MESSAGE(f.msgs.empty(), f.all());
    for (int r = 0; r < world; ++r) {
      const auto rr = static_cast<std::size_t>(r), W = static_cast<std::size_t>(world);
      CHECK(res[rr].all_finite);
      CHECK(res[rr].grad_norm == res[0].grad_norm); // identical on every rank
      CHECK_FALSE(res[W + rr].all_finite);
      CHECK(std::isnan(res[W + rr].grad_norm));
      CHECK_FALSE(res[2 * W + rr].all_finite);
      CHECK(res[3 * W + rr].all_finite);
      CHECK(res[3 * W + rr].grad_norm > 0);
    }
  }
}

TEST_CASE("gradient_reducer errors: typed, naming the parameter, no hang") {
  const std::vector<param_info> ps{{40, element_type::f32}, {40, element_type::f32}, {8, element_type::f32}};
  const std::vector<std::string> names{"wte.weight", "h.0.attn.bias", "ln_f.bias"};

  SUBCASE("mark_ready twice in a step") {
    dpkit::inproc_world w(2);
    CHECK_THROWS_WITH_AS(w.run([&](inproc& c) {
      gradient_reducer<inproc> red(c, ps, {}, names);
      std::vector<float> g(10);
      red.mark_ready(1, g);
      red.mark_ready(1, g);
    }),
                         doctest::Contains("parameter 1 ('h.0.attn.bias') marked ready twice"),
                         dpkit::invalid_argument);
  }
  SUBCASE("comm_thread = false: a bucket whose all-reduce fails inside mark_ready is reported by finish") {
    dpkit::inproc_world w(2);
    failures f;
    w.run([&](inproc& c) {
      auto o = small_opts();
      o.comm_thread = false;
      o.collective.timeout = std::chrono::milliseconds(500);
      gradient_reducer<inproc> red(c, ps, o, names); // both ranks agree on the plan
      if (c.rank() == 1) return; // then rank 1 never joins the buckets' all-reduces
      std::vector<float> g(10, 1.0f), h(2, 1.0f);
      try {
        for (std::size_t i : {2, 1, 0}) red.mark_ready(i, i == 2 ? h : g);
      } catch (const std::exception& e) {
        f.add(std::string("mark_ready threw: ") + e.what());
        return;
      }
      try {
        red.finish();
        f.add("finish did not throw");
      } catch (const dpkit::error&) {
      }
    });
    CHECK_MESSAGE(f.msgs.empty(), f.all());
  }
  SUBCASE("missing parameter at finish, then the reducer is usable again") {
    dpkit::inproc_world w(3);
    failures f;
    w.run([&](inproc& c) {
      gradient_reducer<inproc> red(c, ps, small_opts(), names);
      std::vector<float> g(10, 1.0f), h(2, 1.0f);
      red.mark_ready(0, g);
      red.mark_ready(2, h);
      try {
        red.finish(std::vector<dpkit::gradient_ref>{dpkit::gradient_ref::of(g), dpkit::gradient_ref::of(g),
                                                    dpkit::gradient_ref::of(h)});
        f.add("no error");
      } catch (const dpkit::error& e) {
        const std::string m = e.what();
        if (m.find("Expected to have finished reduction") == std::string::npos ||
            m.find("1 ('h.0.attn.bias')") == std::string::npos || m.find("rank " + std::to_string(c.rank())) == std::string::npos)
          f.add("bad message: " + m);
      }
      for (std::size_t i : {2, 1, 0}) red.mark_ready(i, i == 2 ? h : g);
      red.finish(std::vector<dpkit::gradient_ref>{dpkit::gradient_ref::of(g), dpkit::gradient_ref::of(g),
                                                  dpkit::gradient_ref::of(h)});
      if (g[0] != 1.0f) f.add("wrong result after recovering");
    });
    CHECK_MESSAGE(f.msgs.empty(), f.all());
  }
  SUBCASE("mismatched parameter size on one rank: every rank throws naming the parameter") {
    dpkit::inproc_world w(3);
    std::vector<std::string> errs(3);
    w.run([&](inproc& c) {
      auto mine = ps;
      if (c.rank() == 1) mine[1].bytes = 44;
      try {
        gradient_reducer<inproc> red(c, mine, {}, names);
      } catch (const dpkit::invalid_argument& e) {
        errs[static_cast<std::size_t>(c.rank())] = e.what();
      }
    });
    for (const auto& e : errs) {
      CHECK(e.find("parameter 1 ('h.0.attn.bias')") != std::string::npos);
      CHECK(e.find("40 bytes") != std::string::npos);
      CHECK(e.find("44 bytes") != std::string::npos);
    }
  }
  SUBCASE("mismatched parameter count and bucket policy") {
    dpkit::inproc_world w(2);
    std::vector<std::string> errs(2), errs2(2), errs3(2);
    w.run([&](inproc& c) {
      auto mine = ps;
      if (c.rank() == 0) mine.push_back({4, element_type::f32});
      try {
        gradient_reducer<inproc> red(c, mine);
      } catch (const dpkit::invalid_argument& e) {
        errs[static_cast<std::size_t>(c.rank())] = e.what();
      }
      dpkit::reducer_options o;
      if (c.rank() == 1) o.buckets.first_bucket_bytes = 48;
      try {
        gradient_reducer<inproc> red(c, ps, o);
      } catch (const dpkit::invalid_argument& e) {
        errs2[static_cast<std::size_t>(c.rank())] = e.what();
      }
      auto other = ps;
      if (c.rank() == 1) other[2].type = element_type::i32;
      try {
        gradient_reducer<inproc> red(c, other, {}, names);
      } catch (const dpkit::invalid_argument& e) {
        errs3[static_cast<std::size_t>(c.rank())] = e.what();
      }
    });
    for (const auto& e : errs) CHECK(e.find("number of parameters") != std::string::npos);
    for (const auto& e : errs2) CHECK(e.find("bucket policy") != std::string::npos);
    for (const auto& e : errs3) CHECK(e.find("parameter 2 ('ln_f.bias')") != std::string::npos);
  }
  SUBCASE("argument errors") {
    dpkit::inproc_world w(1);
    w.run([&](inproc& c) {
      gradient_reducer<inproc> red(c, ps, {}, names);
      std::vector<float> g(10);
      std::vector<double> d(5);
      std::vector<float> wrong(9);
      CHECK_THROWS_WITH_AS(red.mark_ready(3, g), doctest::Contains("parameter index 3 out of range"), dpkit::invalid_argument);
      CHECK_THROWS_WITH_AS(red.mark_ready(0, d), doctest::Contains("parameter 0 ('wte.weight') expects 10 float"),
                           dpkit::invalid_argument);
      CHECK_THROWS_AS(red.mark_ready(0, wrong), dpkit::invalid_argument);
      CHECK_THROWS_WITH_AS(red.mark_ready(0), doctest::Contains("no gradient registered"), dpkit::invalid_argument);
      CHECK_THROWS_AS(red.bucket_view<double>(0), dpkit::invalid_argument);
      CHECK(red.bucket_view<float>(0).size() == 10);
      CHECK_THROWS_AS(red.finish(std::vector<dpkit::gradient_ref>{dpkit::gradient_ref::of(g)}), dpkit::invalid_argument);
      {
        auto guard = red.no_sync();
        CHECK_THROWS_AS(std::ignore = red.no_sync(), dpkit::invalid_argument);
        CHECK_THROWS_AS(red.rebuild_buckets(), dpkit::invalid_argument);
      }
      CHECK_FALSE(red.in_no_sync());
      red.mark_ready(0, g);
      CHECK_THROWS_AS(std::ignore = red.no_sync(), dpkit::invalid_argument);
      CHECK_THROWS_AS(red.rebuild_buckets(), dpkit::invalid_argument);
      std::vector<param_info> dev{{4, element_type::f32, dpkit::memory_space::device}};
      CHECK_THROWS_WITH_AS(gradient_reducer<inproc>(c, dev), doctest::Contains("device memory"), dpkit::invalid_argument);
      CHECK_THROWS_AS(gradient_reducer<inproc>(c, ps, {}, {"a"}), dpkit::invalid_argument);
    });
  }
}

TEST_CASE("reducer_options compare and print") {
  dpkit::reducer_options a, b;
  CHECK(a == b);
  b.compression = dpkit::gradient_compression::bf16;
  CHECK(a != b);
  std::ostringstream os;
  os << b;
  CHECK(os.str().find("compression=bf16") != std::string::npos);
  CHECK(os.str().find("bucket_cap_bytes=26214400") != std::string::npos);
}
