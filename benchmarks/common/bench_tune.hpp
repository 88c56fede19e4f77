// dpkit benchmarks: allreduce_perf's tuner and its cost-model reports.
//   --tune FILE    measures every all-reduce algorithm this transport can run
//                  at each size of -b/-e/-f (in place, up to -n iterations
//                  per round (about 50 ms of calls), 5 rounds with the
//                  algorithms' order rotated, the
//                  median round of the slowest rank), the link costs of the
//                  cost model (inside a node: one shared-memory step's
//                  latency and a ping-pong's bandwidth; between two nodes: a
//                  ping-pong; a local reduction), and writes the tuning file
//                  (collectives/tuning.hpp) that `auto` reads through
//                  DPKIT_TUNING_FILE; prints it, and the model's prediction
//                  beside each measurement.
//   --explain SIZE what `auto` runs for SIZE bytes on this transport and why
//                  (which rule of which file), with the model's predictions.
//   --predict NxL  the model's busbw table for N nodes of L ranks over -b/-e/-f,
//                  from the link costs of DPKIT_TUNING_FILE (no run needed).
#pragma once

#include "bench_collectives.hpp"
#include "bench_options.hpp"
#include "bench_report.hpp"

#include <dpkit/dpkit.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace dpkit_bench {

namespace tune_detail {

/// The shape and abilities of a transport, as the tuning table sees it.
template <class C>
std::pair<dpkit::tuning_key, dpkit::tuning_availability> shape_of(C& comm) {
  const int n = comm.size();
  dpkit::tuning_key k{n, 1, n};
  dpkit::tuning_availability a{dpkit::detail::shm_available(comm) && n > 1, false, dpkit::native_collectives<C>};
  if constexpr (dpkit::hierarchical_transport<C>) {
    const auto& t = comm.topology();
    k = {n, t.nodes(), t.max_local_size()};
    a.hierarchical = t.hierarchical();
  }
  return {k, a};
}

inline std::string us(double v) {
  char b[32];
  std::snprintf(b, sizeof b, v < 10 ? "%.2f" : v < 1000 ? "%.1f" : "%.0f", v);
  return b;
}

/// The harness's own collectives (never the measured ones).
template <class C>
struct harness {
  C& comm;
  dpkit::collective_options o;
  explicit harness(C& c) : comm(c) {
    o.tag = 0x7300;
    o.check = 0;
  }
  void barrier() {
    if constexpr (dpkit::native_collectives<C>) comm.native_barrier();
    else dpkit::barrier(comm, o);
  }
  double max(double v) {
    std::array<double, 1> a{v};
    if constexpr (dpkit::native_collectives<C>) comm.native_allreduce(a.data(), a.data(), 1, dpkit::element_type::f64, dpkit::reduce_op::max);
    else dpkit::allreduce_tree(comm, a, dpkit::reduce_op::max, o);
    return a[0];
  }
  double from(double v, int root) {
    std::array<double, 1> a{v};
    if constexpr (dpkit::native_collectives<C>) comm.native_broadcast(a.data(), a.data(), 1, dpkit::element_type::f64, root);
    else dpkit::broadcast_tree(comm, a, root, o);
    return a[0];
  }
};

/// Half the median round trip of `bytes` between ranks a and b (the others
/// wait), microseconds, seen by every rank.
template <class C>
double pingpong_us(C& comm, harness<C>& h, int a, int b, std::size_t bytes, int reps) {
  std::vector<std::byte> buf(std::max<std::size_t>(bytes, 1));
  std::span<std::byte> s(buf.data(), bytes);
  const int me = comm.rank();
  const auto far = dpkit::deadline_after(std::chrono::seconds(600));
  std::vector<double> rt;
  h.barrier();
  if (me == a || me == b) {
    const int peer = me == a ? b : a;
    for (int i = 0; i < reps + 2; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      if (me == a) {
        auto r1 = comm.isend(s, peer, 0x7310);
        r1.wait(far);
        auto r2 = comm.irecv(s, peer, 0x7311);
        r2.wait(far);
      } else {
        auto r2 = comm.irecv(s, peer, 0x7310);
        r2.wait(far);
        auto r1 = comm.isend(s, peer, 0x7311);
        r1.wait(far);
      }
      if (i >= 2) rt.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  double half = 0;
  if (!rt.empty()) {
    std::sort(rt.begin(), rt.end());
    half = rt[rt.size() / 2] / 2;
  }
  return h.from(half, a);
}

/// Link cost of messages between ranks a and b: alpha from 8-byte
/// ping-pongs, beta from 4 MiB ones (minus alpha).
template <class C>
dpkit::link_cost measure_link(C& comm, harness<C>& h, int a, int b) {
  const double small = pingpong_us(comm, h, a, b, 8, 50);
  const std::size_t big = std::size_t{4} << 20;
  const double large = pingpong_us(comm, h, a, b, big, 6);
  return {small, std::max(0.0, (large - small) * 1e3 / static_cast<double>(big)), true};
}

/// Local reduction cost (gamma), ns per byte of result: float sums of 4 MiB.
inline double measure_reduce_ns_per_byte() {
  const std::size_t n = std::size_t{1} << 20;
  std::vector<float> a(n, 1.f), b(n, 2.f), d(n);
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    dpkit::reduce_host(d.data(), a.data(), b.data(), n, dpkit::reduce_op::sum);
    t.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] / static_cast<double>(n * sizeof(float));
}

/// The fragment size of messages between nodes (dpkit::mpi's
/// inter_fragment_bytes) that moves a 16 MiB all-reduce fastest on this
/// cluster: whole messages (0) against fragments of 32 KiB and 60 KiB (below
/// Open MPI's tcp eager limit of 64 KiB), each by the hierarchical (else the
/// ring) all-reduce, 3 rounds in rotated order, the median round of the
/// slowest rank. Fragments are taken only when at least 5% faster. Sets the
/// choice on comm and returns it, with each candidate's time (us) in `why`;
/// nullopt when the transport has no such setting or one node.
template <class C>
std::optional<std::size_t> tune_inter_fragment(C& comm, harness<C>& h, const dpkit::collective_options& co,
                                               std::string& why) {
  if constexpr (requires { comm.set_inter_fragment_bytes(std::size_t{}); } && dpkit::hierarchical_transport<C>) {
    const auto& topo = comm.topology();
    if (topo.nodes() < 2) return std::nullopt;
    const dpkit::algorithm a = topo.hierarchical() ? dpkit::algorithm::hierarchical : dpkit::algorithm::ring;
    const std::vector<std::size_t> cands{0, 32768, 61440};
    std::vector<float> buf(std::size_t{4} << 20); // 16 MiB
    std::vector<std::vector<double>> per(cands.size());
    for (int round = 0; round < 3; ++round)
      for (std::size_t j = 0; j < cands.size(); ++j) {
        const std::size_t c = (j + static_cast<std::size_t>(round)) % cands.size();
        comm.set_inter_fragment_bytes(cands[c]);
        dpkit::allreduce(comm, buf, dpkit::reduce_op::sum, dpkit::allreduce_policy{a}, co); // warm-up
        h.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 3; ++i) dpkit::allreduce(comm, buf, dpkit::reduce_op::sum, dpkit::allreduce_policy{a}, co);
        per[c].push_back(h.max(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 3));
      }
    std::vector<double> med;
    for (auto& x : per) {
      std::sort(x.begin(), x.end());
      med.push_back(x[x.size() / 2]);
    }
    std::size_t best = 0;
    for (std::size_t c = 1; c < cands.size(); ++c)
      if (med[c] < med[best]) best = c;
    if (best != 0 && med[best] > 0.95 * med[0]) best = 0;
    why = "16 MiB " + std::string(dpkit::algorithm_name(a)) + " all-reduce, us:";
    for (std::size_t c = 0; c < cands.size(); ++c)
      why += (c == 0 ? std::string(" whole ") : " " + std::to_string(cands[c]) + " ") + us(med[c]);
    comm.set_inter_fragment_bytes(cands[best]);
    return cands[best];
  } else {
    (void)comm, (void)h, (void)co, (void)why;
    return std::nullopt;
  }
}

inline std::string label(dpkit::algorithm a) {
  if (a == dpkit::algorithm::shm_one_shot) return "shm1";
  if (a == dpkit::algorithm::shm_two_shot) return "shm2";
  return std::string(dpkit::algorithm_name(a));
}

} // namespace tune_detail

/// --tune FILE on transport comm (every rank calls it). Returns the exit code.
template <class C>
int tune_allreduce(C& comm, const options& o, const std::string& file) {
  using namespace tune_detail;
  harness<C> h(comm);
  const int rank = comm.rank(), n = comm.size();
  std::FILE* out = rank == 0 ? stdout : nullptr;
  const auto [key, avail] = shape_of(comm);
  std::vector<dpkit::algorithm> cands{dpkit::algorithm::ring, dpkit::algorithm::tree};
  if (avail.shm) {
    cands.push_back(dpkit::algorithm::shm_one_shot);
    cands.push_back(dpkit::algorithm::shm_two_shot);
  }
  if (avail.hierarchical) cands.push_back(dpkit::algorithm::hierarchical);
  if (avail.native) cands.push_back(dpkit::algorithm::native);
  const std::vector<std::size_t> sizes = [&] {
    std::vector<std::size_t> v;
    for (std::size_t s = std::max<std::size_t>(o.min_bytes, 4); s <= o.max_bytes; s = o.step_factor > 1 ? s * o.step_factor : s + std::max<std::size_t>(o.step_bytes, 4))
      v.push_back(s / 4 * 4);
    return v;
  }();
  if (out) {
    std::fprintf(out, "# dpkit tuner: allreduce on %d ranks, %d node(s), up to %d per node; candidates:", n, key.nodes,
                 key.max_local);
    for (auto a : cands) std::fprintf(out, " %s", label(a).c_str());
    std::fprintf(out, "\n# in place, float sum, up to %d iterations (about 50 ms of calls) x 5 rounds per size and "
                      "algorithm (order rotated), median round of the slowest rank\n", o.iters);
  }
  std::vector<float> buf(sizes.empty() ? 0 : sizes.back() / 4);
  dpkit::collective_options co = o.copts;
  co.native_deadline = true; // native as `auto` would run it (with the deadline)
  // First the fragment size between nodes, which every algorithm's messages
  // across nodes then use.
  std::string fragment_why;
  const std::optional<std::size_t> fragment = tune_inter_fragment(comm, h, co, fragment_why);
  if (out && fragment)
    std::fprintf(out, "# fragment inter %zu (%s)\n", *fragment, fragment_why.c_str());
  constexpr int rounds = 5;
  struct result {
    std::size_t bytes;
    std::vector<double> us; // per candidate
  };
  std::vector<result> results;
  for (std::size_t bytes : sizes) {
    std::span<float> v(buf.data(), bytes / 4);
    std::vector<std::vector<double>> per(cands.size());
    // iterations per round: -n, fewer where one call is long (about 50 ms
    // of calls per round and algorithm, at least one), from a timed call of
    // every candidate (the same count on every rank)
    int iters = o.iters;
    {
      double slowest = 0;
      for (auto a : cands) {
        dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{a}, co);
        h.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        dpkit::allreduce(comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{a}, co);
        slowest = std::max(slowest, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      slowest = h.max(slowest);
      iters = std::clamp(static_cast<int>(0.05 / std::max(slowest, 1e-9)), 1, o.iters);
    }
    for (int round = 0; round < rounds; ++round)
      for (std::size_t j = 0; j < cands.size(); ++j) {
        const std::size_t c = (j + static_cast<std::size_t>(round)) % cands.size();
        const dpkit::allreduce_policy p{cands[c]};
        dpkit::allreduce(comm, v, dpkit::reduce_op::sum, p, co); // warm-up
        h.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) dpkit::allreduce(comm, v, dpkit::reduce_op::sum, p, co);
        const double t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
        per[c].push_back(h.max(t));
      }
    result r{bytes, {}};
    for (auto& x : per) {
      std::sort(x.begin(), x.end());
      r.us.push_back(x[x.size() / 2]);
    }
    results.push_back(r);
    if (out) {
      std::fprintf(out, "#  %10zu B:", bytes);
      for (std::size_t c = 0; c < cands.size(); ++c) std::fprintf(out, " %s %s", label(cands[c]).c_str(), us(r.us[c]).c_str());
      std::fprintf(out, "\n");
      std::fflush(out);
    }
  }
  // Link costs: within a node (ranks 0 and 1 when they share one) and
  // between two nodes (rank 0 and the first rank of another node).
  dpkit::tuning_table t;
  int other_node = -1, same_node = -1;
  if constexpr (dpkit::hierarchical_transport<C>) {
    const auto& topo = comm.topology();
    for (int p = 1; p < n; ++p) {
      if (other_node < 0 && topo.node_of(p) != topo.node_of(0)) other_node = p;
      if (same_node < 0 && topo.node_of(p) == topo.node_of(0)) same_node = p;
    }
  } else if (n > 1) {
    same_node = 1;
  }
  if (same_node > 0) t.intra = measure_link(comm, h, 0, same_node);
  // dpkit's collectives inside a node synchronize through the shared
  // segment, not messages: the intra-node latency is one shared-memory step
  // (an 8-byte one-shot all-reduce on the node), where the node has one
  if (t.intra.valid) {
    double step_us = -1;
    auto shm_step = [&](auto& node) {
      if (!dpkit::detail::shm_available(node) || node.size() < 2) return;
      std::array<float, 2> x{};
      for (int i = 0; i < 20; ++i) dpkit::allreduce_shm_one_shot(node, x);
      std::vector<double> ts;
      for (int i = 0; i < 200; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        dpkit::allreduce_shm_one_shot(node, x);
        ts.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ts.begin(), ts.end());
      step_us = ts[ts.size() / 2];
    };
    h.barrier();
    if constexpr (dpkit::hierarchical_transport<C>) {
      if (auto* node = comm.node_transport()) shm_step(*node);
      else shm_step(comm);
    } else {
      shm_step(comm);
    }
    step_us = h.max(step_us);
    if (step_us > 0) t.intra.alpha_us = step_us;
  }
  if (other_node > 0) t.inter = measure_link(comm, h, 0, other_node);
  const double gamma = h.from(measure_reduce_ns_per_byte(), 0);
  // Rules: the winner at each measured size covers up to the next size.
  std::size_t lo = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    const std::size_t best = static_cast<std::size_t>(std::min_element(r.us.begin(), r.us.end()) - r.us.begin());
    const std::size_t hi = i + 1 < results.size() ? results[i + 1].bytes : std::numeric_limits<std::size_t>::max();
    std::string comment = "at " + std::to_string(r.bytes) + " B, us:";
    for (std::size_t c = 0; c < cands.size(); ++c) comment += " " + label(cands[c]) + " " + us(r.us[c]);
    dpkit::tuning_rule rule;
    rule.ranks_min = rule.ranks_max = key.ranks;
    rule.nodes_min = rule.nodes_max = key.nodes;
    rule.local_min = rule.local_max = key.max_local;
    rule.min_bytes = lo;
    rule.max_bytes = hi;
    rule.algo = cands[best];
    rule.comment = comment;
    t.rules.push_back(rule); // one rule per measured size, with its measurements
    lo = hi;
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string cmd;
  for (const auto& a : o.argv) cmd += (cmd.empty() ? "" : " ") + a;
  t.header = {"made by: " + cmd, "on " + std::string(host) + " (rank 0), " + utc_now() + ", " + std::to_string(n) +
                                     " ranks on " + std::to_string(key.nodes) + " node(s)"};
  t.reduce_ns_per_byte = gamma;
  t.inter_fragment_bytes = fragment;
  if (fragment) t.header.push_back("fragment inter: " + fragment_why);
  int rc = 0;
  if (rank == 0) {
    try {
      t.save(file);
      std::fprintf(out, "# wrote %s\n", file.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "allreduce_perf --tune: %s\n", e.what());
      rc = 1;
    }
    std::fprintf(out, "%s", t.str().c_str());
    // The model beside the measurements.
    const dpkit::cost_model m = dpkit::cost_model::from(t);
    const int per_node = key.max_local;
    std::fprintf(out, "# cost model (links above, reduce %s ns/B) against the measurements, %d node(s) x %d:\n",
                 us(gamma).c_str(), key.nodes, per_node);
    std::fprintf(out, "#  %10s %6s %12s %12s %7s\n", "bytes", "algo", "measured us", "model us", "model/m");
    for (const auto& r : results)
      for (std::size_t c = 0; c < cands.size(); ++c) {
        const auto pred = key.nodes * per_node == n ? m.allreduce_us(cands[c], r.bytes, key.nodes, per_node) : std::nullopt;
        if (!pred) continue;
        std::fprintf(out, "#  %10zu %6s %12s %12s %7.2f\n", r.bytes, label(cands[c]).c_str(), us(r.us[c]).c_str(),
                     us(*pred).c_str(), *pred / r.us[c]);
      }
  }
  return static_cast<int>(h.max(rc));
}

/// --explain SIZE on transport comm. Returns the exit code.
template <class C>
int explain_allreduce(C& comm, std::size_t bytes) {
  const auto [key, avail] = tune_detail::shape_of(comm);
  if (comm.rank() != 0) return 0;
  try {
    std::printf("%s\n", dpkit::explain_tuned(key, bytes, avail).c_str());
    const dpkit::tuning_table* t = dpkit::detail::env_tuning();
    if constexpr (requires { comm.inter_fragment_bytes(); }) {
      if (key.nodes > 1) {
        const std::size_t f = comm.inter_fragment_bytes();
        const char* src = std::getenv("DPKIT_MPI_INTER_FRAGMENT");
        std::printf("messages between nodes: %s (%s)\n",
                    f ? ("fragments of " + std::to_string(f) + " bytes").c_str() : "whole",
                    src && *src ? "DPKIT_MPI_INTER_FRAGMENT"
                    : t && t->inter_fragment_bytes ? ("'fragment inter' of " + t->origin).c_str()
                                                   : "default");
      }
    }
    if (t && (t->intra.valid || t->inter.valid)) {
      dpkit::cost_model m = dpkit::cost_model::from(*t);
      std::printf("cost model (link costs of %s):", t->origin.c_str());
      for (auto a : {dpkit::algorithm::ring, dpkit::algorithm::tree, dpkit::algorithm::shm_one_shot,
                     dpkit::algorithm::shm_two_shot, dpkit::algorithm::hierarchical})
        if (dpkit::tuning_table::allowed(a, avail))
          if (auto p = m.allreduce_us(a, bytes, key.nodes, key.max_local))
            std::printf(" %s %s us", tune_detail::label(a).c_str(), tune_detail::us(*p).c_str());
      std::printf("\n");
    } else {
      std::printf("cost model: no link costs (DPKIT_TUNING_FILE %s; allreduce_perf --tune measures them)\n",
                  t ? "has none" : "is unset");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_perf --explain: %s\n", e.what());
    return 1;
  }
  return 0;
}

/// --predict NxL: the model's busbw table (no communication). Returns the exit code.
inline int predict_allreduce(const options& o, const std::string& shape) {
  int nodes = 0, per = 0;
  if (std::sscanf(shape.c_str(), "%dx%d", &nodes, &per) != 2 || nodes < 1 || per < 1) {
    std::fprintf(stderr, "allreduce_perf --predict: expected NODESxRANKS (e.g. 64x8), got '%s'\n", shape.c_str());
    return 1;
  }
  const dpkit::tuning_table* t = nullptr;
  try {
    t = dpkit::detail::env_tuning();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_perf --predict: %s\n", e.what());
    return 1;
  }
  // the links the layout uses: between nodes with N > 1, inside one with L > 1
  if (!t || (nodes > 1 && !t->inter.valid) || (per > 1 && !t->intra.valid)) {
    std::fprintf(stderr, "allreduce_perf --predict %s: DPKIT_TUNING_FILE must hold measured 'link intra' (for L > 1) and "
                         "'link inter' (for N > 1) lines (allreduce_perf --tune on a cluster of two or more nodes of "
                         "two or more ranks writes both)\n", shape.c_str());
    return 1;
  }
  const dpkit::cost_model m = dpkit::cost_model::from(*t);
  const int p = nodes * per;
  std::printf("# cost model: %d nodes x %d ranks = %d, links of %s: intra %.2f us + %.4f ns/B, inter %.2f us + %.4f "
              "ns/B, reduce %.3f ns/B\n",
              nodes, per, p, t->origin.c_str(), m.intra.alpha_us, m.intra.beta_ns_per_byte, m.inter.alpha_us,
              m.inter.beta_ns_per_byte, m.reduce_ns_per_byte);
  std::vector<dpkit::algorithm> algos{dpkit::algorithm::ring, dpkit::algorithm::tree};
  if (nodes > 1) algos.push_back(dpkit::algorithm::hierarchical);
  else algos.push_back(dpkit::algorithm::shm);
  std::printf("# predicted time (us) and busbw (GB/s, = algbw x 2(p-1)/p)\n#%12s", "size (B)");
  for (auto a : algos) std::printf(" %10s %7s", (tune_detail::label(a) + " us").c_str(), "busbw");
  std::printf("   best\n");
  for (std::size_t s = std::max<std::size_t>(o.min_bytes, 8); s <= o.max_bytes;
       s = o.step_factor > 1 ? s * o.step_factor : s + std::max<std::size_t>(o.step_bytes, 1)) {
    std::printf(" %12zu", s);
    double best = 1e300;
    std::string best_name;
    for (auto a : algos) {
      const auto u = m.allreduce_us(a, s, nodes, per);
      if (!u) {
        std::printf(" %10s %7s", "-", "-");
        continue;
      }
      const double busbw = static_cast<double>(s) / (*u * 1e-6) / 1e9 * 2.0 * (p - 1) / p;
      std::printf(" %10s %7.2f", tune_detail::us(*u).c_str(), busbw);
      if (*u < best) {
        best = *u;
        best_name = tune_detail::label(a);
      }
    }
    std::printf("   %s\n", best_name.c_str());
  }
  return 0;
}

} // namespace dpkit_bench
