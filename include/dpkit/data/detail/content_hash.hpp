/// @file content_hash.hpp
/// @brief Internal: the JSONL index's source content hash (format version 2,
/// docs/jsonl-index-format.md "Content hash"): eight 64-bit accumulators over
/// 64-byte stripes, XXH3-style (acc[j ^ 1] += d[j]; acc[j] += lo32(k) * hi32(k)
/// with k = d[j] ^ key[j] ^ stripe * P1), so it vectorizes (AVX2 where the CPU
/// has it) and costs little next to the index build's newline scan. Not
/// cryptographic: it detects changed bytes, not an adversary. Never include
/// directly.
#pragma once

#include <dpkit/data/detail/hash.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define DPKIT_CONTENT_HASH_X86 1
#endif

namespace dpkit::detail {

/// The eight lane keys: splitmix64 from 0x64706b6974636e74.
inline constexpr std::array<std::uint64_t, 8> content_keys = [] {
  std::array<std::uint64_t, 8> k{};
  std::uint64_t s = 0x6470'6b69'7463'6e74ULL;
  for (auto& v : k) v = splitmix64(s);
  return k;
}();

/// Accumulates whole 64-byte stripes: portable version.
inline void content_stripes_scalar(std::uint64_t* acc, const unsigned char* p, std::size_t stripes, std::uint64_t first) noexcept {
  for (std::size_t s = 0; s < stripes; ++s, p += 64) {
    const std::uint64_t salt = (first + s) * hash_prime1;
    for (unsigned j = 0; j < 8; ++j) {
      const std::uint64_t d = load_u64_le(p + 8 * j);
      const std::uint64_t k = d ^ content_keys[j] ^ salt;
      acc[j ^ 1] += d;
      acc[j] += (k & 0xffffffffULL) * (k >> 32);
    }
  }
}

#ifdef DPKIT_CONTENT_HASH_X86
/// Accumulates whole 64-byte stripes: AVX2 (same result as the scalar version).
[[gnu::target("avx2")]] inline void content_stripes_avx2(std::uint64_t* acc, const unsigned char* p, std::size_t stripes,
                                                          std::uint64_t first) noexcept {
  __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc));
  __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + 4));
  const __m256i k0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(content_keys.data()));
  const __m256i k1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(content_keys.data() + 4));
  __m256i salt = _mm256_set1_epi64x(static_cast<long long>(first * hash_prime1));
  const __m256i step = _mm256_set1_epi64x(static_cast<long long>(hash_prime1));
  for (std::size_t s = 0; s < stripes; ++s, p += 64) {
    const __m256i d0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i d1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
    const __m256i x0 = _mm256_xor_si256(_mm256_xor_si256(d0, k0), salt);
    const __m256i x1 = _mm256_xor_si256(_mm256_xor_si256(d1, k1), salt);
    a0 = _mm256_add_epi64(a0, _mm256_mul_epu32(x0, _mm256_srli_epi64(x0, 32)));
    a1 = _mm256_add_epi64(a1, _mm256_mul_epu32(x1, _mm256_srli_epi64(x1, 32)));
    a0 = _mm256_add_epi64(a0, _mm256_shuffle_epi32(d0, 0x4E)); // acc[j ^ 1] += d[j]
    a1 = _mm256_add_epi64(a1, _mm256_shuffle_epi32(d1, 0x4E));
    salt = _mm256_add_epi64(salt, step);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc), a0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + 4), a1);
}
#endif

/// Running content hash of one chunk (chunk `index` of a source), fed in whole
/// 64-byte stripes (blocks()), then finished with the < 64-byte tail.
class content_hasher {
public:
  explicit content_hasher(std::uint64_t index) noexcept : index_(index) {
    for (unsigned j = 0; j < 8; ++j) acc_[j] = content_keys[j] ^ index;
  }

  /// Feeds `stripes` whole 64-byte stripes at p.
  void blocks(const unsigned char* p, std::size_t stripes) noexcept {
#ifdef DPKIT_CONTENT_HASH_X86
    static const bool avx2 = [] {
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") != 0;
    }();
    if (avx2) {
      content_stripes_avx2(acc_.data(), p, stripes, done_);
      done_ += stripes;
      return;
    }
#endif
    content_stripes_scalar(acc_.data(), p, stripes, done_);
    done_ += stripes;
  }

  /// Feeds the last `tail` (< 64) bytes and returns the chunk's hash:
  /// hash_bytes(acc as 64 LE bytes, seed = hash_bytes(tail, index) ^ length).
  [[nodiscard]] std::uint64_t finish(const unsigned char* p, std::size_t tail) const noexcept {
    const std::uint64_t length = done_ * 64 + tail;
    return hash_bytes(acc_.data(), sizeof acc_, hash_bytes(p, tail, index_) ^ length);
  }

private:
  std::array<std::uint64_t, 8> acc_{};
  std::uint64_t done_ = 0; // stripes fed
  std::uint64_t index_;
};

/// Content hash of one whole chunk [p, p + n) with chunk number `index`.
inline std::uint64_t content_chunk_hash(const char* p, std::size_t n, std::uint64_t index) noexcept {
  return hash_whole<64>(content_hasher(index), reinterpret_cast<const unsigned char*>(p), n);
}

} // namespace dpkit::detail
