/// @file copy_nontemporal.hpp
/// @brief Internal: a host copy with non-temporal (streaming) stores, for
/// outputs larger than the caches that are not read again soon (the shm
/// all-reduce's output of a large message; benchmarks/common/bench_floor.hpp's
/// stream rate). Such stores do not read the destination's lines for
/// ownership first (memcpy's ordinary stores do: a third of its memory
/// traffic) and do not evict what the caches hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace dpkit::detail {

/// dst = src for `bytes` bytes (the ranges must not overlap) with 16-byte
/// non-temporal stores where the target has them (SSE2: every x86-64),
/// memcpy elsewhere. Ends with a store fence unless `fence` is false, so a
/// later release store (a published shm step) orders after the data as it
/// does after memcpy; a caller that copies many small blocks passes false and
/// calls store_fence() once after the last (a fence drains the write-combining
/// buffers: one per 16 KiB block stalls the loop).
inline void copy_nontemporal(void* dst, const void* src, std::size_t bytes, bool fence = true) noexcept {
  if (bytes == 0) return; // (memcpy takes no null pointer, even for 0 bytes)
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  std::size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  if (fence) _mm_sfence();
  std::memcpy(d + i, s + i, bytes - i);
#else
  (void)fence;
  std::memcpy(dst, src, bytes);
#endif
}

/// Orders every earlier non-temporal store of this thread before its later
/// stores (sfence on x86; nothing elsewhere, where copy_nontemporal is
/// memcpy): after copy_nontemporal(..., false), before the data is published.
inline void store_fence() noexcept {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

/// The message size (bytes) from which the shared-memory all-reduce (the
/// two-shot, or the direct path) writes its output (out of place) with
/// non-temporal stores: DPKIT_SHM_NT_BYTES if set to a byte count (0:
/// never), else `fallback` (core/algorithm.hpp: 8 MiB for the two-shot, 16
/// MiB for the direct path). Read once per process; a malformed value is
/// ignored.
inline std::size_t shm_nontemporal_min_bytes(std::size_t fallback) noexcept {
  static const long long from_env = [] {
    const char* s = std::getenv("DPKIT_SHM_NT_BYTES");
    if (!s || !*s) return -1LL;
    char* end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    return end && *end == '\0' && v >= 0 ? v : -1LL;
  }();
  if (from_env < 0) return fallback;
  return from_env == 0 ? static_cast<std::size_t>(-1) : static_cast<std::size_t>(from_env);
}

/// How the shared-memory two-shot all-reduce writes what its peers read from
/// the segment (the copies of their slices and the reduced slice): chosen
/// per chunk (automatic), or always with ordinary or non-temporal stores.
enum class segment_stores : std::uint8_t { automatic, ordinary, nontemporal };

/// DPKIT_SHM_SEG_NT: "0" ordinary stores, "1" non-temporal, unset or anything
/// else automatic (segment_store_tuner). Read once per process.
inline segment_stores segment_stores_from_env() noexcept {
  static const segment_stores v = [] {
    const char* s = std::getenv("DPKIT_SHM_SEG_NT");
    if (s && std::strcmp(s, "0") == 0) return segment_stores::ordinary;
    if (s && std::strcmp(s, "1") == 0) return segment_stores::nontemporal;
    return segment_stores::automatic;
  }();
  return v;
}

/// Chooses, chunk by chunk, whether the shm two-shot all-reduce writes the
/// segment with non-temporal stores, from the time chunks took with each.
///
/// Why: the peers read what a rank writes into the segment. With ordinary
/// stores the lines come from the writer's cache, the fast way while the two
/// cores pass lines between their caches quickly; on this project's VM the
/// host moves the vCPUs into phases of seconds to minutes where that
/// transfer is 3-5x slower, and then non-temporal stores (the reader gets the
/// lines from memory) are faster per chunk, while they are 1.5-2x slower in
/// the fast phase (benchmarks/results/2026-12-03-direct-reads-and-slow-phases.md,
/// 2026-12-03-segment-stores-by-phase.md). Neither is right all the time.
///
/// How: rank 0's tuner decides for every rank (the all-reduce publishes its
/// decision in rank 0's control line, so all ranks write the same way in a
/// chunk); chunks of at least min_bytes are timed from the first write to
/// the last read, both steps included. A kind's estimate is the fastest of
/// its last `window` chunks that are at most 2 x explore_period chunks old
/// (else its newest): interference only ever makes a chunk slower, and the
/// first chunks run cold. Ordinary stores run until two chunks are timed,
/// then one chunk tries non-temporal ones; after that every
/// explore_period-th chunk uses the kind not chosen (a phase change is seen
/// within explore_period chunks: twice per 256 MiB all-reduce of 4 MiB
/// chunks), the others the faster kind, where non-temporal stores must be
/// faster by a margin (nontemporal_margin). force() or DPKIT_SHM_SEG_NT (on
/// rank 0) fixes the kind (measurement, tests). Not thread-safe: one shm
/// collective at a time uses a segment.
class segment_store_tuner {
public:
  /// Chunks smaller than this (bytes of one rank's buffer) are not tuned:
  /// ordinary stores.
  static constexpr std::size_t min_bytes = std::size_t{1} << 20;
  /// One chunk in this many uses the kind not chosen.
  static constexpr std::uint64_t explore_period = 32;
  /// Samples kept per kind.
  static constexpr int window = 4;
  /// Non-temporal stores are chosen when their estimate is below this
  /// fraction of the ordinary stores' (noise does not flip the choice).
  static constexpr double nontemporal_margin = 0.9;

  /// Fixes the kind (automatic: DPKIT_SHM_SEG_NT, else tuned).
  void force(segment_stores s) noexcept { forced_ = s; }
  /// Whether the next tuned chunk should use non-temporal stores (rank 0
  /// calls it once per chunk of at least min_bytes and publishes the answer).
  bool choose() noexcept {
    const segment_stores s = forced_ != segment_stores::automatic ? forced_ : segment_stores_from_env();
    if (s != segment_stores::automatic) return s == segment_stores::nontemporal;
    const std::uint64_t k = chunks_++;
    if (kinds_[0].count < 2) return false;
    if (kinds_[1].count == 0) return true;
    const bool nt = seconds_per_byte(true) < nontemporal_margin * seconds_per_byte(false);
    return k % explore_period == explore_period - 1 ? !nt : nt;
  }
  /// A chunk of `chunk_bytes` bytes written as `nontemporal` says took
  /// `seconds` (chunks under min_bytes and non-positive times are ignored).
  void record(bool nontemporal, std::size_t chunk_bytes, double seconds) noexcept {
    if (chunk_bytes < min_bytes || !(seconds > 0)) return;
    kind& kd = kinds_[nontemporal ? 1 : 0];
    kd.per_byte[kd.next] = seconds / static_cast<double>(chunk_bytes);
    kd.at[kd.next] = chunks_;
    kd.newest = kd.next;
    kd.next = (kd.next + 1) % window;
    if (kd.count < window) ++kd.count;
  }
  /// A kind's estimate in seconds per byte (0: never timed).
  double seconds_per_byte(bool nontemporal) const noexcept {
    const kind& kd = kinds_[nontemporal ? 1 : 0];
    if (kd.count == 0) return 0;
    double best = kd.per_byte[kd.newest];
    for (int i = 0; i < kd.count; ++i)
      if (chunks_ - kd.at[i] <= 2 * explore_period && kd.per_byte[i] < best) best = kd.per_byte[i];
    return best;
  }

private:
  struct kind {
    double per_byte[window] = {};
    std::uint64_t at[window] = {}; ///< chunks_ when timed
    int count = 0, next = 0, newest = 0;
  };
  segment_stores forced_ = segment_stores::automatic;
  kind kinds_[2];
  std::uint64_t chunks_ = 0; ///< tuned chunks so far
};

} // namespace dpkit::detail
