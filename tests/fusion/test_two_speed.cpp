// The two-speed sync: gradients averaged inside each node every step
// (reducer_options::node_local) and parameters averaged across nodes every k
// steps (periodic_model_averager, torch's PeriodicModelAverager schedule),
// on inproc worlds of 2 virtual nodes (2x2, 2x3): SGD with momentum on a
// model whose gradients depend on the parameters, against a sequential
// reference of the same schedule that does the same float operations in the
// same order (node sums in local rank order, the two nodes' sums added,
// divided by the world size), bitwise, for k = 1, 2, 4 and a warm-up; that
// nodes really drift apart between averagings; and the errors.
#include "fusion_test_util.hpp"

#include <dpkit/fusion/model_averager.hpp>
#include <dpkit/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

namespace {

constexpr float lr = 0.05f, momentum = 0.9f;

// A deterministic value in [-1, 1) for (rank, step, element).
float noise(int rank, int step, std::size_t i) {
  std::uint64_t x = static_cast<std::uint64_t>(rank) * 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(step) * 0xbf58476d1ce4e5b9ull ^
                    i * 0x94d049bb133111ebull;
  x ^= x >> 31;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1ull << 23) - 1.0f;
}

// Rank r's gradient at step s for parameters w: depends on w (so a drift
// between nodes changes the gradients) and on the rank's "data".
void gradient(const std::vector<float>& w, int r, int s, std::vector<float>& g) {
  for (std::size_t i = 0; i < w.size(); ++i) g[i] = 0.25f * w[i] * static_cast<float>(1 + r % 3) + noise(r, s, i);
}

struct run_result {
  std::vector<std::vector<float>> params; // per rank, all parameters concatenated
  int averagings = 0;
  bool drifted = false; // nodes' parameters differed before some averaging
};

// Training on the inproc world: sizes of the parameter tensors, steps, period.
run_result train(const dpkit::node_layout& layout, const std::vector<std::size_t>& sizes, int steps, int period,
                 int warmup) {
  const int n = layout.size();
  dpkit::inproc_world world(layout, nullptr, 4096);
  run_result res;
  res.params.resize(static_cast<std::size_t>(n));
  std::mutex mu;
  std::vector<std::string> bad;
  std::atomic<bool> drifted{false};
  world.run([&](dpkit::inproc& comm) {
    const int r = comm.rank();
    std::vector<std::vector<float>> w, g, v;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      w.emplace_back(sizes[k]);
      for (std::size_t i = 0; i < sizes[k]; ++i) w[k][i] = noise(1000 + static_cast<int>(k), 0, i); // same on every rank
      g.emplace_back(sizes[k], 0.f);
      v.emplace_back(sizes[k], 0.f);
    }
    std::vector<dpkit::gradient_ref> grefs, wrefs;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      grefs.push_back(dpkit::gradient_ref::of(g[k]));
      wrefs.push_back(dpkit::gradient_ref::of(w[k]));
    }
    dpkit::reducer_options o;
    o.buckets.first_bucket_bytes = 512; // several buckets
    o.buckets.bucket_cap_bytes = 1024;
    o.node_local = true;
    dpkit::gradient_reducer<dpkit::inproc> reducer(comm, grefs, o);
    dpkit::periodic_model_averager<dpkit::inproc> averager(comm, period, warmup);
    for (int s = 0; s < steps; ++s) {
      for (std::size_t k = 0; k < sizes.size(); ++k) gradient(w[k], r, s * 100 + static_cast<int>(k), g[k]);
      for (std::size_t k = sizes.size(); k-- > 0;) reducer.mark_ready(k);
      (void)reducer.finish();
      for (std::size_t k = 0; k < sizes.size(); ++k)
        for (std::size_t i = 0; i < sizes[k]; ++i) {
          v[k][i] = momentum * v[k][i] + g[k][i];
          w[k][i] -= lr * v[k][i];
        }
      if (averager.due()) { // before averaging: do the ranks' parameters differ?
        std::vector<float> mine(w[0].begin(), w[0].end()), all(w[0].size() * static_cast<std::size_t>(n));
        dpkit::allgather(comm, mine, all);
        for (int p = 0; p < n; ++p)
          if (std::memcmp(all.data() + static_cast<std::size_t>(p) * mine.size(), mine.data(), mine.size() * 4) != 0)
            drifted = true;
      }
      averager.average_parameters(wrefs);
    }
    std::vector<float> flat;
    for (auto& x : w) flat.insert(flat.end(), x.begin(), x.end());
    std::lock_guard lk(mu);
    res.params[static_cast<std::size_t>(r)] = std::move(flat);
    if (r == 0) res.averagings = static_cast<int>(averager.averaged());
  });
  res.drifted = drifted;
  return res;
}

// The same schedule computed in one thread: per node one copy of the
// parameters and momentum.
std::vector<std::vector<float>> reference(const dpkit::node_layout& layout, const std::vector<std::size_t>& sizes, int steps,
                                          int period, int warmup) {
  const int nodes = layout.nodes();
  const int n = layout.size();
  std::vector<std::vector<std::vector<float>>> w(static_cast<std::size_t>(nodes)), v(static_cast<std::size_t>(nodes));
  for (int node = 0; node < nodes; ++node)
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> x(sizes[k]);
      for (std::size_t i = 0; i < sizes[k]; ++i) x[i] = noise(1000 + static_cast<int>(k), 0, i);
      w[static_cast<std::size_t>(node)].push_back(x);
      v[static_cast<std::size_t>(node)].emplace_back(sizes[k], 0.f);
    }
  for (int s = 0; s < steps; ++s) {
    for (int node = 0; node < nodes; ++node) {
      const auto ranks = layout.ranks_of(node);
      auto& W = w[static_cast<std::size_t>(node)];
      auto& V = v[static_cast<std::size_t>(node)];
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        std::vector<float> sum(sizes[k]), g(sizes[k]);
        for (std::size_t j = 0; j < ranks.size(); ++j) {
          gradient(W[k], ranks[j], s * 100 + static_cast<int>(k), g);
          for (std::size_t i = 0; i < sizes[k]; ++i) sum[i] = j == 0 ? g[i] : sum[i] + g[i];
        }
        for (std::size_t i = 0; i < sizes[k]; ++i) {
          const float gi = sum[i] / static_cast<float>(ranks.size());
          V[k][i] = momentum * V[k][i] + gi;
          W[k][i] -= lr * V[k][i];
        }
      }
    }
    if (s >= warmup && (s - warmup) % period == 0) {
      // every rank's copy summed: inside each node in local rank order,
      // then the nodes' sums, divided by the world size
      for (std::size_t k = 0; k < sizes.size(); ++k)
        for (std::size_t i = 0; i < sizes[k]; ++i) {
          float total = 0;
          for (int node = 0; node < nodes; ++node) {
            const float p = w[static_cast<std::size_t>(node)][k][i];
            float node_sum = p;
            for (std::size_t j = 1; j < layout.ranks_of(node).size(); ++j) node_sum += p;
            total = node == 0 ? node_sum : total + node_sum;
          }
          const float avg = total / static_cast<float>(n);
          for (int node = 0; node < nodes; ++node) w[static_cast<std::size_t>(node)][k][i] = avg;
        }
    }
  }
  std::vector<std::vector<float>> per_rank(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    for (auto& x : w[static_cast<std::size_t>(layout.node_of[static_cast<std::size_t>(r)])])
      per_rank[static_cast<std::size_t>(r)].insert(per_rank[static_cast<std::size_t>(r)].end(), x.begin(), x.end());
  return per_rank;
}

} // namespace

TEST_CASE("two-speed sync: node-local gradients and periodic averaging equal the sequential schedule, bitwise") {
  const std::vector<std::size_t> sizes = {300, 77, 1500}; // 1500 floats: several shared-memory chunks of 4 KiB
  for (const auto& layout : {dpkit::node_layout::blocks(2, 2), dpkit::node_layout::blocks(2, 3)})
    for (const auto& pw : {std::pair{1, 0}, std::pair{2, 0}, std::pair{4, 0}, std::pair{3, 2}}) {
      const int period = pw.first, warmup = pw.second; // no structured binding: clang 14 cannot capture one
      CAPTURE(layout.str());
      CAPTURE(period);
      CAPTURE(warmup);
      const int steps = 9;
      const auto got = train(layout, sizes, steps, period, warmup);
      const auto want = reference(layout, sizes, steps, period, warmup);
      int expected_avg = 0;
      for (int s = 0; s < steps; ++s) expected_avg += s >= warmup && (s - warmup) % period == 0;
      CHECK(got.averagings == expected_avg);
      CHECK(got.drifted); // the nodes did train apart between averagings
      for (int r = 0; r < layout.size(); ++r) {
        const auto& g = got.params[static_cast<std::size_t>(r)];
        const auto& w = want[static_cast<std::size_t>(r)];
        REQUIRE(g.size() == w.size());
        std::size_t first = g.size();
        for (std::size_t i = 0; i < g.size() && first == g.size(); ++i)
          if (std::memcmp(&g[i], &w[i], sizeof(float)) != 0) first = i;
        CAPTURE(r);
        CAPTURE(first);
        CHECK(first == g.size());
      }
    }
}

TEST_CASE("two-speed sync: with one node, node_local is the world; errors are typed") {
  // one node: node_local reduces over every rank (plain DDP)
  dpkit::inproc_world world(3);
  world.run([](dpkit::inproc& comm) {
    std::vector<float> g(10, static_cast<float>(comm.rank()));
    dpkit::reducer_options o;
    o.node_local = true;
    dpkit::gradient_reducer<dpkit::inproc> red(comm, std::vector<dpkit::gradient_ref>{dpkit::gradient_ref::of(g)}, o);
    red.mark_ready(0);
    (void)red.finish();
    CHECK(g[0] == doctest::Approx(1.0));
    CHECK_THROWS_AS(dpkit::periodic_model_averager<dpkit::inproc>(comm, 0), dpkit::invalid_argument);
    CHECK_THROWS_AS(dpkit::periodic_model_averager<dpkit::inproc>(comm, 2, -1), dpkit::invalid_argument);
  });
  // a transport that does not know its nodes refuses node_local, on every rank
  struct flat {
    dpkit::inproc* c;
    int rank() const { return c->rank(); }
    int size() const { return c->size(); }
    static constexpr bool accepts(dpkit::memory_space s) { return s == dpkit::memory_space::host; }
    auto isend(std::span<const std::byte> b, int p, int t) { return c->isend(b, p, t); }
    auto irecv(std::span<std::byte> b, int p, int t) { return c->irecv(b, p, t); }
    dpkit::progress_thread& progress() { return c->progress(); }
  };
  static_assert(dpkit::async_transport<flat> && !dpkit::hierarchical_transport<flat>);
  dpkit::inproc_world w2(2);
  w2.run([](dpkit::inproc& comm) {
    flat f{&comm};
    std::vector<float> g(4, 1.f);
    dpkit::reducer_options o;
    o.node_local = true;
    CHECK_THROWS_WITH_AS(dpkit::gradient_reducer<flat>(f, std::vector<dpkit::gradient_ref>{dpkit::gradient_ref::of(g)}, o),
                         doctest::Contains("node_local needs a transport that knows its nodes"),
                         dpkit::invalid_argument);
  });
}
