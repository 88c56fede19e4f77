/// @file hash.hpp
/// @brief Internal: 64-bit mixing and a fast non-cryptographic byte hash used by
/// the JSONL index (source fingerprint, header and body checksums) and by the
/// Feistel permutation (key schedule). Never include directly.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dpkit::detail {

/// splitmix64's finalizer (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
inline constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// One splitmix64 step: advances `state` by the golden gamma and returns the
/// mixed value.
inline constexpr std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  state += 0x9e3779b97f4a7c15ULL;
  return mix64(state);
}

inline constexpr std::uint64_t hash_prime1 = 0x9E3779B185EBCA87ULL;
inline constexpr std::uint64_t hash_prime2 = 0xC2B2AE3D27D4EB4FULL;

/// Reads a little-endian u64 from unaligned memory.
inline std::uint64_t load_u64_le(const unsigned char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

/// Hash of bytes [p, p + n) with `seed`: four independent xxHash64-style lanes
/// over 32-byte blocks (several GB/s), then the tail, then mix64. The exact
/// function is part of the index file format (docs/jsonl-index-format.md).
inline std::uint64_t hash_bytes(const void* data, std::size_t n, std::uint64_t seed) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t a = seed + hash_prime1 + hash_prime2, b = seed + hash_prime2, c = seed, d = seed - hash_prime1;
  auto round = [](std::uint64_t acc, std::uint64_t w) noexcept {
    return std::rotl(acc + w * hash_prime2, 31) * hash_prime1;
  };
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = round(a, load_u64_le(p + i));
    b = round(b, load_u64_le(p + i + 8));
    c = round(c, load_u64_le(p + i + 16));
    d = round(d, load_u64_le(p + i + 24));
  }
  std::uint64_t h = std::rotl(a, 1) + std::rotl(b, 7) + std::rotl(c, 12) + std::rotl(d, 18) + static_cast<std::uint64_t>(n);
  for (; i + 8 <= n; i += 8) h = std::rotl(h ^ round(0, load_u64_le(p + i)), 27) * hash_prime1 + hash_prime2;
  for (; i < n; ++i) h = std::rotl(h ^ (p[i] * hash_prime2), 11) * hash_prime1;
  return mix64(h);
}

} // namespace dpkit::detail

namespace dpkit::detail::data {
// Transitional spellings for sampler headers that still say detail::data::
// (permutation.hpp, token_budget_sampler.hpp); remove once they use dpkit::detail.
using dpkit::detail::hash_bytes;
using dpkit::detail::mix64;
using dpkit::detail::splitmix64;
} // namespace dpkit::detail::data
