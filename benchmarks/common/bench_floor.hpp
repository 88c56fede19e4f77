// dpkit benchmarks: the memory floor of an all-reduce on one node (issue 53;
// docs/benchmarks.md "The memory floor"). On one node a large all-reduce is
// bound by what the cores can move through memory, not by a link.
//
// The floor. However it is done, each rank must read its input once and
// write its output once: S bytes in, S bytes out, a streaming copy's worth
// of memory traffic (with non-temporal stores the output costs no read for
// ownership). Everything else (a staging copy, a peer's slice, a partial
// sum) can stay in the caches when the algorithm works in chunks smaller
// than them. So the node's floor for S bytes is S / stream rate, where the
// stream rate is the faster of memcpy and a copy with non-temporal stores,
// measured while every rank of the node does the same (the slowest rank's).
//
// The algorithms, if nothing stayed in the caches. The per-algorithm table
// counts, per rank and payload S on n ranks (a slice is S/n), the bytes
// each must copy (read one buffer, write one) and reduce (read two, write
// one) through memory; at copy and reduce rates measured the same way it
// gives each algorithm's time when its staging spills out of the caches
// (messages chunked larger than the last-level cache, or caches another
// job thrashes):
//
//   one-shot     copy S into the segment; n-1 reductions of S (every rank
//                reduces the whole message from the n copies)
//                  copy S, reduce (n-1) S
//   two-shot     copy the n-1 slices the peers reduce into the segment,
//                reduce one slice (n-1 times), write it to the output and
//                copy the n-1 peers' slices out of the segment
//                  copy 2(n-1)/n S + S/n, reduce (n-1)/n S
//   direct       reduce one slice reading the peers' inputs where they lie
//                (a mapping of the peer's buffer: XPMEM, or buffers the
//                library owns in the segment), then copy the n-1 peers'
//                reduced slices straight from their outputs
//                  copy (n-1)/n S, reduce (n-1)/n S
//   ring         n-1 reduce-scatter steps and n-1 all-gather steps of one
//                slice each, every step a message that a single-copy
//                transport (CMA, 64 KiB and up) moves with one copy
//                  copy 2(n-1)/n S, reduce (n-1)/n S
//
// (In place or out of place moves the same bytes in each.) Latency and
// synchronisation are not in the model: it is for large messages.
#pragma once

#include <dpkit/core/copy_nontemporal.hpp>
#include <dpkit/core/reduce_op.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string_view>
#include <vector>

namespace dpkit_bench {

/// The algorithms the floor model knows (see the file's comment).
enum class floor_algo { one_shot, two_shot, direct, ring };

inline constexpr std::array<floor_algo, 4> floor_algos{floor_algo::one_shot, floor_algo::two_shot, floor_algo::direct,
                                                       floor_algo::ring};

/// The algorithm's name as the tables print it.
inline std::string_view floor_algo_name(floor_algo a) noexcept {
  switch (a) {
  case floor_algo::one_shot: return "one-shot";
  case floor_algo::two_shot: return "two-shot";
  case floor_algo::direct: return "direct";
  case floor_algo::ring: return "ring";
  }
  return "?";
}

/// Bytes one rank copies and reduces (output bytes of reductions) for an
/// all-reduce of `bytes` bytes on `n` ranks.
struct floor_traffic {
  double copy_bytes = 0;
  double reduce_bytes = 0;
};

/// What algorithm `a` moves per rank for `bytes` of payload on `n` ranks (the
/// file's table). n = 1: a copy of the message (out of place), no reduction.
inline floor_traffic traffic_of(floor_algo a, int n, double bytes) noexcept {
  if (n <= 1) return {bytes, 0};
  const double dn = n, slice = bytes / dn, others = bytes * (dn - 1) / dn;
  switch (a) {
  case floor_algo::one_shot: return {bytes, (dn - 1) * bytes};
  case floor_algo::two_shot: return {2 * others + slice, others};
  case floor_algo::direct: return {others, others};
  case floor_algo::ring: return {2 * others, others};
  }
  return {};
}

/// How fast one rank copies and reduces while every rank of the node does the
/// same: bytes of payload per second (copy: bytes copied; reduce: bytes of
/// the output of out = a + b).
struct memory_rates {
  double copy_bytes_per_s = 0;   ///< memcpy
  double reduce_bytes_per_s = 0; ///< out = a + b (float sum), bytes of out
  double stream_bytes_per_s = 0; ///< the faster of memcpy and a copy with non-temporal stores
};

/// The node's floor for an all-reduce of `bytes`: every rank reads its input
/// and writes its output once, a streaming copy's traffic (seconds).
inline double stream_floor_seconds(double bytes, const memory_rates& r) noexcept {
  return bytes / r.stream_bytes_per_s;
}

/// Seconds algorithm `a` takes for `bytes` on `n` ranks at rates `r` if
/// nothing it stages stays in the caches (the file's table).
inline double uncached_seconds(floor_algo a, int n, double bytes, const memory_rates& r) noexcept {
  const floor_traffic t = traffic_of(a, n, bytes);
  double s = 0;
  if (t.copy_bytes > 0) s += t.copy_bytes / r.copy_bytes_per_s;
  if (t.reduce_bytes > 0) s += t.reduce_bytes / r.reduce_bytes_per_s;
  return s;
}

/// The smallest time over the algorithms if nothing stays in the caches, and
/// which one it is.
struct uncached_best {
  double seconds = 0;
  floor_algo algo = floor_algo::direct;
};

/// The best of the algorithms' uncached times for `bytes` on `n` ranks
/// (direct when every rank can read its peers' buffers; the best of the
/// others when `direct_possible` is false). Not the floor: that is
/// stream_floor_seconds.
inline uncached_best best_uncached(int n, double bytes, const memory_rates& r, bool direct_possible = true) noexcept {
  uncached_best best{-1, floor_algo::direct};
  for (floor_algo a : floor_algos) {
    if (a == floor_algo::direct && !direct_possible) continue;
    const double s = uncached_seconds(a, n, bytes, r);
    if (best.seconds < 0 || s < best.seconds) best = {s, a};
  }
  return best;
}

/// Measures this thread's copy, reduce and stream rates on buffers of `bytes` bytes
/// (float sum; the buffers are allocated and first touched here), `reps`
/// timed repetitions of each after one untimed, the median. `sync` runs
/// before each repetition (a barrier with the other ranks or threads, so all
/// measure at once).
template <class Sync>
memory_rates measure_rates(std::size_t bytes, int reps, Sync&& sync) {
  const std::size_t count = std::max<std::size_t>(1, bytes / sizeof(float));
  std::vector<float> a(count, 1.0f), b(count, 2.0f), out(count, 0.0f);
  using clk = std::chrono::steady_clock;
  auto median_rate = [&](auto&& op) {
    std::vector<double> sec;
    for (int i = 0; i <= reps; ++i) {
      sync();
      const auto t0 = clk::now();
      op();
      const double s = std::chrono::duration<double>(clk::now() - t0).count();
      if (i > 0) sec.push_back(s); // the first is a warm-up
    }
    std::sort(sec.begin(), sec.end());
    return static_cast<double>(count * sizeof(float)) / sec[sec.size() / 2];
  };
  memory_rates r;
  r.copy_bytes_per_s = median_rate([&] { std::memcpy(out.data(), a.data(), count * sizeof(float)); });
  r.reduce_bytes_per_s =
      median_rate([&] { dpkit::reduce_host(out.data(), a.data(), b.data(), count, dpkit::reduce_op::sum); });
  const double nontemporal =
      median_rate([&] { dpkit::detail::copy_nontemporal(out.data(), a.data(), count * sizeof(float)); });
  r.stream_bytes_per_s = std::max(r.copy_bytes_per_s, nontemporal);
  return r;
}

} // namespace dpkit_bench
