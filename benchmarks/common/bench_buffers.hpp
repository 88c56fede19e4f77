// dpkit benchmarks: the buffers a run measures on, and their rotation (-R).
//
// Without -R every iteration of a size reuses one send and one receive buffer,
// as nccl-tests does. On a host transport that lets small and mid sizes run
// from a warm cache (the warning Open MPI's coll/xhc docs give about OSU-style
// benchmarks). With -R N, buffers hold N sets of the message size and
// iteration i of a measurement uses set (c + i) mod N, c a cursor that keeps
// advancing over the whole run, so no two back-to-back measurements start on
// the same set; -R auto picks N per size so that one buffer's N sets span at
// least twice the last-level cache (rotation_sets below).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <string>

#include <unistd.h>

namespace dpkit_bench {

/// Alignment of one buffer set: 4096 from 4 KiB up (pages), else one 64-byte
/// cache line, so sets of small messages do not share lines.
inline constexpr std::size_t set_stride(std::size_t bytes) noexcept {
  const std::size_t a = bytes >= 4096 ? 4096 : 64;
  return std::max<std::size_t>((bytes + a - 1) / a * a, 64);
}

/// Number of buffer sets for a message of `bytes` bytes: 1 without rotation
/// (fixed <= 1 and not automatic), `fixed` with -R N, and with -R auto the
/// smallest count whose sets span at least 2 x `llc_bytes` (at least 1).
inline constexpr std::size_t rotation_sets(std::size_t bytes, std::size_t fixed, bool automatic,
                                           std::size_t llc_bytes) noexcept {
  if (!automatic) return fixed > 1 ? fixed : 1;
  const std::size_t stride = set_stride(bytes);
  return std::max<std::size_t>(1, (2 * llc_bytes + stride - 1) / stride);
}

/// Bytes of the largest cache the kernel reports for cpu0
/// (/sys/devices/system/cpu/cpu0/cache/index*/size of the highest level),
/// else sysconf(_SC_LEVEL3_CACHE_SIZE), else 32 MiB.
inline std::size_t last_level_cache_bytes() {
  std::size_t best = 0;
  int best_level = -1;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lf(dir + "level"), sf(dir + "size");
    int level = 0;
    std::string size;
    if (!(lf >> level) || !(sf >> size) || size.empty()) continue;
    std::size_t v = std::strtoull(size.c_str(), nullptr, 10);
    const char unit = size.back();
    if (unit == 'K') v <<= 10;
    else if (unit == 'M') v <<= 20;
    else if (unit == 'G') v <<= 30;
    if (level > best_level || (level == best_level && v > best)) {
      best_level = level;
      best = v;
    }
  }
  if (best > 0) return best;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  if (const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE); l3 > 0) return static_cast<std::size_t>(l3);
#endif
  return std::size_t{32} << 20;
}

namespace detail {
struct aligned_free {
  void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t{4096}); }
};
} // namespace detail

/// A page-aligned, zeroed byte buffer (every page touched at allocation, not
/// in a timed loop).
using buffer = std::unique_ptr<std::byte[], detail::aligned_free>;

/// Allocates a buffer of at least `bytes` (>= 64) bytes. Throws std::bad_alloc.
inline buffer allocate(std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, 64);
  buffer b(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{4096})));
  std::memset(b.get(), 0, bytes);
  return b;
}

/// Bytes one pool (send or receive) needs so every size in [min, max] of the
/// run fits its sets: max over those sizes of rotation_sets x set_stride,
/// which is at most that of `max_bytes` plus 2 x llc with -R auto.
inline std::size_t pool_bytes(std::size_t max_bytes, std::size_t fixed, bool automatic, std::size_t llc) noexcept {
  if (!automatic && fixed <= 1) return max_bytes;
  const std::size_t big = rotation_sets(max_bytes, fixed, automatic, llc) * set_stride(max_bytes);
  return automatic ? std::max(big, 2 * llc + set_stride(max_bytes)) : big;
}

} // namespace dpkit_bench
