/// @file newline_scan.hpp
/// @brief Internal: the JSONL index builder's hot loop. Finds every '\n' in a
/// byte range and appends the offset of the byte after it (the start of the
/// next line) to a growable u64 array. AVX-512BW or AVX2 when the CPU has it
/// (runtime dispatch with GCC/Clang target attributes), memchr otherwise.
/// Never include directly.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define DPKIT_NEWLINE_SCAN_X86 1
#endif

namespace dpkit::detail {

/// A growable array of u64 that does not zero what it reserves (the scanner
/// writes up to one entry per input byte before it knows how many it needs).
/// Move-only.
class u64_buffer {
public:
  u64_buffer() noexcept = default;
  u64_buffer(const u64_buffer&) = delete;
  u64_buffer& operator=(const u64_buffer&) = delete;
  u64_buffer(u64_buffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), cap_(std::exchange(o.cap_, 0)) {}
  u64_buffer& operator=(u64_buffer&& o) noexcept {
    if (this != &o) {
      std::free(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }
  ~u64_buffer() { std::free(p_); }

  /// Makes room for `extra` more entries. @throws std::bad_alloc.
  void reserve_more(std::size_t extra) {
    if (n_ + extra <= cap_) return;
    const std::size_t cap = std::max({n_ + extra, cap_ * 2, std::size_t{4096}});
    void* q = std::realloc(p_, cap * sizeof(std::uint64_t)); // glibc moves large blocks with mremap (no copy)
    if (!q) throw std::bad_alloc();
    p_ = static_cast<std::uint64_t*>(q);
    cap_ = cap;
  }
  void push_back(std::uint64_t v) {
    reserve_more(1);
    p_[n_++] = v;
  }
  /// One past the last entry (valid for reserve_more'd writes).
  [[nodiscard]] std::uint64_t* end_ptr() noexcept { return p_ + n_; }
  /// Sets the end after writing through end_ptr().
  void set_end(std::uint64_t* e) noexcept { n_ = static_cast<std::size_t>(e - p_); }
  [[nodiscard]] std::uint64_t* data() noexcept { return p_; }
  [[nodiscard]] const std::uint64_t* data() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] bool empty() const noexcept { return n_ == 0; }
  /// Removes every entry (keeps the capacity).
  void clear() noexcept { n_ = 0; }

private:
  std::uint64_t* p_ = nullptr;
  std::size_t n_ = 0;
  std::size_t cap_ = 0;
};

/// Portable scan: writes base + i + 1 for every '\n' at p[i], i < n, to out.
/// Returns the new end. `out` must have room for n entries.
inline std::uint64_t* newline_starts_memchr(const char* p, std::size_t n, std::uint64_t base, std::uint64_t* out) noexcept {
  const char* q = p;
  const char* end = p + n;
  while (q < end) {
    const void* nl = std::memchr(q, '\n', static_cast<std::size_t>(end - q));
    if (!nl) break;
    q = static_cast<const char*>(nl) + 1;
    *out++ = base + static_cast<std::uint64_t>(q - p);
  }
  return out;
}

#ifdef DPKIT_NEWLINE_SCAN_X86

/// Emits the set bits of `mask` (64 input bytes at `at` - 1) as offsets.
/// Writes 4 entries unconditionally and more only when needed, so the common
/// case (0 to 4 newlines per 64 bytes) takes no data-dependent branch per line.
[[gnu::target("bmi,bmi2,popcnt")]] inline std::uint64_t* emit_mask(std::uint64_t mask, std::uint64_t at, std::uint64_t* out) noexcept {
  const auto cnt = static_cast<unsigned>(_mm_popcnt_u64(mask));
  out[0] = at + _tzcnt_u64(mask);
  mask = _blsr_u64(mask);
  out[1] = at + _tzcnt_u64(mask);
  mask = _blsr_u64(mask);
  out[2] = at + _tzcnt_u64(mask);
  mask = _blsr_u64(mask);
  out[3] = at + _tzcnt_u64(mask);
  mask = _blsr_u64(mask);
  if (cnt > 4) [[unlikely]] {
    std::uint64_t* o = out + 4;
    while (mask) {
      *o++ = at + _tzcnt_u64(mask);
      mask = _blsr_u64(mask);
    }
  }
  return out + cnt;
}

/// AVX2 scan (two 32-byte compares per 64 bytes). `out` needs room for n + 4.
[[gnu::target("avx2,bmi,bmi2,popcnt")]] inline std::uint64_t* newline_starts_avx2(const char* p, std::size_t n, std::uint64_t base,
                                                                                  std::uint64_t* out) noexcept {
  const __m256i nl = _mm256_set1_epi8('\n');
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32));
    const std::uint64_t lo = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(a, nl)));
    const std::uint64_t hi = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(b, nl)));
    const std::uint64_t mask = lo | (hi << 32);
    if (mask) out = emit_mask(mask, base + i + 1, out);
  }
  return newline_starts_memchr(p + i, n - i, base + i, out);
}

/// AVX-512BW scan (one 64-byte compare into a mask register). `out` needs room for n + 4.
[[gnu::target("avx512f,avx512bw,bmi,bmi2,popcnt")]] inline std::uint64_t* newline_starts_avx512(const char* p, std::size_t n,
                                                                                               std::uint64_t base,
                                                                                               std::uint64_t* out) noexcept {
  const __m512i nl = _mm512_set1_epi8('\n');
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const std::uint64_t mask = _mm512_cmpeq_epi8_mask(_mm512_loadu_si512(p + i), nl);
    if (mask) out = emit_mask(mask, base + i + 1, out);
  }
  return newline_starts_memchr(p + i, n - i, base + i, out);
}

#endif // DPKIT_NEWLINE_SCAN_X86

/// Which scanner newline_starts uses on this CPU: 2 = AVX-512BW, 1 = AVX2, 0 = memchr.
inline int newline_scan_level() noexcept {
#ifdef DPKIT_NEWLINE_SCAN_X86
  static const int level = [] {
    if (const char* env = std::getenv("DPKIT_NEWLINE_SCAN")) return std::clamp(std::atoi(env), 0, 2); // testing/benchmarks
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt")) return 1;
    return 0;
  }();
  return level;
#else
  return 0;
#endif
}

/// Appends base + i + 1 for every '\n' at p[i] (i < n) to `out`, in order:
/// the offsets of the lines that start right after each newline.
inline void newline_starts(const char* p, std::size_t n, std::uint64_t base, u64_buffer& out) {
  out.reserve_more(n + 4);
#ifdef DPKIT_NEWLINE_SCAN_X86
  switch (newline_scan_level()) {
  case 2: out.set_end(newline_starts_avx512(p, n, base, out.end_ptr())); return;
  case 1: out.set_end(newline_starts_avx2(p, n, base, out.end_ptr())); return;
  default: break;
  }
#endif
  out.set_end(newline_starts_memchr(p, n, base, out.end_ptr()));
}

} // namespace dpkit::detail
