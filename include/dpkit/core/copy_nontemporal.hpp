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

/// The message size (bytes) from which the shared-memory two-shot all-reduce
/// writes its output (out of place) with non-temporal stores:
/// DPKIT_SHM_NT_BYTES if set to a byte count (0: never), else `fallback`
/// (core/algorithm.hpp: 8 MiB). Read once per process; a malformed value is
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

} // namespace dpkit::detail
