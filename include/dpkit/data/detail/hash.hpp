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

/// Running state of hash_bytes over data fed in pieces (used to hash a chunk
/// while it is scanned). Feed whole 32-byte blocks with blocks(), then the
/// remaining < 32 bytes with finish(); the result equals hash_bytes over the
/// concatenation.
struct hash_state {
  std::uint64_t a, b, c, d;
  std::uint64_t n = 0; // bytes fed so far

  explicit hash_state(std::uint64_t seed) noexcept
      : a(seed + hash_prime1 + hash_prime2), b(seed + hash_prime2), c(seed), d(seed - hash_prime1) {}

  static std::uint64_t round(std::uint64_t acc, std::uint64_t w) noexcept { return std::rotl(acc + w * hash_prime2, 31) * hash_prime1; }

  /// Feeds `nblocks` whole 32-byte blocks at p.
  void blocks(const unsigned char* p, std::size_t nblocks) noexcept {
    std::uint64_t la = a, lb = b, lc = c, ld = d;
    for (std::size_t k = 0; k < nblocks; ++k, p += 32) {
      la = round(la, load_u64_le(p));
      lb = round(lb, load_u64_le(p + 8));
      lc = round(lc, load_u64_le(p + 16));
      ld = round(ld, load_u64_le(p + 24));
    }
    a = la, b = lb, c = lc, d = ld;
    n += nblocks * 32;
  }

  /// Feeds the last `tail` (< 32) bytes at p and returns the hash.
  [[nodiscard]] std::uint64_t finish(const unsigned char* p, std::size_t tail) const noexcept {
    std::uint64_t h = std::rotl(a, 1) + std::rotl(b, 7) + std::rotl(c, 12) + std::rotl(d, 18) + (n + tail);
    std::size_t i = 0;
    for (; i + 8 <= tail; i += 8) h = std::rotl(h ^ round(0, load_u64_le(p + i)), 27) * hash_prime1 + hash_prime2;
    for (; i < tail; ++i) h = std::rotl(h ^ (p[i] * hash_prime2), 11) * hash_prime1;
    return mix64(h);
  }
};

/// Runs a block hasher (hash_state, content_hasher) over all of [p, p + n):
/// the whole `Block`-byte blocks, then finish() with the rest.
template <std::size_t Block, class State>
std::uint64_t hash_whole(State st, const unsigned char* p, std::size_t n) noexcept {
  st.blocks(p, n / Block);
  return st.finish(p + n / Block * Block, n % Block);
}

/// hash_bytes over data fed in pieces of any size (buffers a partial 32-byte
/// block): the index writer checksums the body while writing it.
struct hash_stream {
  hash_state st;
  unsigned char buf[32] = {};
  std::size_t nbuf = 0;

  explicit hash_stream(std::uint64_t seed) noexcept : st(seed) {}

  void update(const void* data, std::size_t n) noexcept {
    if (n == 0) return; // data may be null (an empty vector)
    const auto* p = static_cast<const unsigned char*>(data);
    if (nbuf) {
      const std::size_t take = n < 32 - nbuf ? n : 32 - nbuf;
      std::memcpy(buf + nbuf, p, take);
      nbuf += take, p += take, n -= take;
      if (nbuf < 32) return;
      st.blocks(buf, 1);
      nbuf = 0;
    }
    st.blocks(p, n / 32);
    nbuf = n % 32;
    if (nbuf) std::memcpy(buf, p + n / 32 * 32, nbuf);
  }
  [[nodiscard]] std::uint64_t finish() const noexcept { return st.finish(buf, nbuf); }
};

/// Hash of bytes [p, p + n) with `seed`: four independent xxHash64-style lanes
/// over 32-byte blocks (several GB/s), then the tail, then mix64. The exact
/// function is part of the index file format (docs/jsonl-index-format.md).
inline std::uint64_t hash_bytes(const void* data, std::size_t n, std::uint64_t seed) noexcept {
  return hash_whole<32>(hash_state(seed), static_cast<const unsigned char*>(data), n);
}

} // namespace dpkit::detail
