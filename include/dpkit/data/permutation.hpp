/// @file permutation.hpp
/// @brief Permutation engines for the samplers: `torch_randperm` (bit-exact
/// with torch.randperm on CPU) and `feistel` (a keyed bijection with O(1)
/// memory and O(1) expected random access).
///
/// An engine is reset to (n, seed) and then answers perm[k] for k < n. The
/// distributed sampler calls reset(n, seed + epoch), as torch does.
#pragma once

#include <dpkit/core/errors.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define DPKIT_FEISTEL_X86 1
#endif

namespace dpkit {

/// A permutation engine: `reset(n, seed)` makes the engine a bijection of
/// [0, n); `e[k]` is the image of k (k < n); `size()` is n.
template <class E>
concept permutation_engine = std::movable<E> && requires(E& e, const E& ce, std::uint64_t v) {
  e.reset(v, v);
  { ce[v] } -> std::convertible_to<std::uint64_t>;
  { ce.size() } -> std::convertible_to<std::uint64_t>;
};

/// Which torch.randperm to reproduce for n >= torch_randperm_random64_threshold.
enum class torch_compat {
  since_2_7,  ///< torch >= 2.7: inside-out Fisher-Yates with random64() (default).
  before_2_7, ///< torch < 2.7 (e.g. 1.13): the 32-bit swap loop for every n.
};

/// n from which torch >= 2.7 switches randperm to the random64 inside-out loop:
/// std::numeric_limits<uint32_t>::max() / 20 = 214,748,364
/// (aten/src/ATen/native/TensorFactories.cpp, randperm_cpu).
inline constexpr std::uint64_t torch_randperm_random64_threshold = std::numeric_limits<std::uint32_t>::max() / 20;

namespace detail {

/// splitmix64's finalizer (Steele, Lea, Flood 2014), a bijective 64-bit mixer;
/// the samplers derive their keys with it (seed + epoch -> key).
inline constexpr std::uint64_t sampler_mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// True if torch.randperm(n) uses the random64 inside-out branch.
inline constexpr bool torch_randperm_uses_random64(std::uint64_t n, torch_compat compat) noexcept {
  return compat == torch_compat::since_2_7 && n >= torch_randperm_random64_threshold;
}

/// torch's CPU generator: std::mt19937 seeded with the low 32 bits of the seed
/// (CPUGeneratorImpl; at::mt19937 equals std::mt19937 bit for bit).
inline std::mt19937 torch_cpu_generator(std::uint64_t seed) {
  return std::mt19937(static_cast<std::uint32_t>(seed & 0xffffffffULL));
}

/// torch's small-n branch: r = 0..n-1; for i in 0..n-2: z = random() % (n-i);
/// swap(r[i], r[i+z]).
template <class Index>
void randperm_swap32(std::span<Index> r, std::mt19937& gen) {
  const std::uint64_t n = r.size();
  for (std::uint64_t i = 0; i < n; ++i) r[i] = static_cast<Index>(i);
  for (std::uint64_t i = 0; i + 1 < n; ++i) {
    const std::uint64_t z = static_cast<std::uint64_t>(gen()) % (n - i);
    std::swap(r[i], r[i + z]);
  }
}

/// torch >= 2.7's large-n branch: for i in 0..n-1: z = random64() % (i+1);
/// r[i] = r[z]; r[z] = i, with random64() = (first draw << 32) | second draw.
/// The first m steps do not depend on n: they produce exactly the permutation
/// this function gives for n = m.
template <class Index>
void randperm_inside_out64(std::span<Index> r, std::mt19937& gen) {
  const std::uint64_t n = r.size();
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t hi = gen();
    const std::uint64_t lo = gen();
    const std::uint64_t z = ((hi << 32) | lo) % (i + 1);
    r[i] = static_cast<Index>(i);
    r[i] = r[z];
    r[z] = static_cast<Index>(i);
  }
}

} // namespace detail

/// Fills `out` (size n) with torch.randperm(n, generator=torch.Generator().
/// manual_seed(seed)) on CPU, bit for bit. Index is any integer type that holds
/// n - 1. O(n) time.
template <std::integral Index>
void torch_randperm_fill(std::span<Index> out, std::uint64_t seed, torch_compat compat = torch_compat::since_2_7) {
  std::mt19937 gen = detail::torch_cpu_generator(seed);
  if (detail::torch_randperm_uses_random64(out.size(), compat))
    detail::randperm_inside_out64(out, gen);
  else
    detail::randperm_swap32(out, gen);
}

/// Returns torch.randperm(n, generator=torch.Generator().manual_seed(seed)) as
/// int64 values, bit-exact (see torch_randperm_fill). O(n) time and memory.
inline std::vector<std::int64_t> torch_randperm_vector(std::uint64_t n, std::uint64_t seed,
                                                       torch_compat compat = torch_compat::since_2_7) {
  std::vector<std::int64_t> r(n);
  torch_randperm_fill(std::span<std::int64_t>(r), seed, compat);
  return r;
}

/// Permutation engine bit-exact with torch.randperm(n, generator) on CPU.
///
/// reset() materializes the whole permutation: O(n) time and memory (4 bytes
/// per element for n <= 2^32, else 8), once per epoch; lookups are O(1).
/// Semantics: torch/aten/src/ATen/native/TensorFactories.cpp randperm_cpu,
/// with the n >= 214,748,364 branch selected by `compat` (default torch >= 2.7).
class torch_randperm {
public:
  /// Engine reproducing the torch version chosen by `compat`.
  explicit torch_randperm(torch_compat compat = torch_compat::since_2_7) noexcept : compat_(compat) {}

  /// Computes torch.randperm(n) with manual_seed(seed).
  void reset(std::uint64_t n, std::uint64_t seed) {
    n_ = n;
    if (n <= (std::uint64_t{1} << 32)) {
      wide_.clear();
      wide_.shrink_to_fit();
      narrow_.resize(n);
      torch_randperm_fill(std::span<std::uint32_t>(narrow_), seed, compat_);
    } else {
      narrow_.clear();
      narrow_.shrink_to_fit();
      wide_.resize(n);
      torch_randperm_fill(std::span<std::uint64_t>(wide_), seed, compat_);
    }
  }

  /// Image of k. Precondition: k < size().
  [[nodiscard]] std::uint64_t operator[](std::uint64_t k) const noexcept { return wide_.empty() ? narrow_[k] : wide_[k]; }
  /// n of the last reset.
  [[nodiscard]] std::uint64_t size() const noexcept { return n_; }
  /// Which torch branch is reproduced.
  [[nodiscard]] torch_compat compat() const noexcept { return compat_; }

private:
  torch_compat compat_;
  std::uint64_t n_ = 0;
  std::vector<std::uint32_t> narrow_;
  std::vector<std::uint64_t> wide_;
};

/// Permutation engine: a keyed Feistel network over a mixed-radix domain
/// [0, B * 2^p) just above n, with cycle walking onto [0, n).
///
/// With b = max(2, ceil(log2 n)) bits, p = floor(b / 2) and B = ceil(n / 2^p),
/// x = hi * 2^p + lo with lo < 2^p and hi < B. Even rounds set
/// lo ^= F(hi) (the top p bits of a keyed multiply), odd rounds set
/// hi = (hi + F'(lo)) mod B (F' reduced into [0, B) by a multiply-shift); each
/// round is a bijection, so the network is one. The domain exceeds n by less
/// than 2^p, about sqrt(n), so values >= n (re-encrypted until they land in
/// [0, n): cycle walking) are rare and lookups almost never branch. O(1) memory
/// and expected time per lookup, reset is O(1): good for billions of samples and
/// for resuming anywhere. Not torch-compatible.
///
/// Version 2 (feistel::version, dpkit 0.2): the construction above, round keys
/// and odd multipliers from splitmix64 of the seed. Version 1 (dpkit 0.1) was a
/// power-of-two Feistel with splitmix64's finalizer as round function (up to 2
/// encryptions per lookup, 3-5e7 lookups/s); it gives a different permutation
/// for the same (n, seed).
#ifdef DPKIT_FEISTEL_X86
namespace detail {
/// 1 when feistel::fill may use AVX-512F/DQ (runtime check; DPKIT_FEISTEL_SIMD=0
/// turns it off for tests and benchmarks), else 0.
inline int feistel_simd_level() noexcept {
  static const int level = [] {
    if (const char* env = std::getenv("DPKIT_FEISTEL_SIMD")) return std::atoi(env) > 0 ? 1 : 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") ? 1 : 0;
  }();
  return level;
}
} // namespace detail
#endif

class feistel {
public:
  /// Version of the permutation function: the same (version, rounds, n, seed)
  /// gives the same permutation on every platform.
  static constexpr unsigned version = 2;

  /// Engine with `rounds` Feistel rounds (1 to 16; default 4, Luby-Rackoff's
  /// count for a strong pseudorandom permutation).
  /// @throws dpkit::invalid_argument if rounds is 0 or > 16.
  explicit feistel(unsigned rounds = 4) : rounds_(rounds) {
    if (rounds == 0 || rounds > max_rounds)
      throw invalid_argument("feistel: rounds " + std::to_string(rounds) + " not in [1, " + std::to_string(max_rounds) + "]");
  }

  /// Sets the domain [0, n) and derives the round keys from `seed`. O(1).
  void reset(std::uint64_t n, std::uint64_t seed) noexcept {
    n_ = n;
    const unsigned bits = n <= 4 ? 2u : static_cast<unsigned>(std::bit_width(n - 1));
    lo_bits_ = bits / 2;
    lo_mask_ = (std::uint64_t{1} << lo_bits_) - 1;
    hi_range_ = n == 0 ? 1 : ((n - 1) >> lo_bits_) + 1; // ceil(n / 2^p) <= 2^32
    std::uint64_t state = seed ^ 0x6a09e667f3bcc908ULL;
    for (unsigned r = 0; r < max_rounds; ++r) {
      state += 0x9e3779b97f4a7c15ULL;
      keys_[r] = detail::sampler_mix64(state);
      state += 0x9e3779b97f4a7c15ULL;
      mults_[r] = detail::sampler_mix64(state) | 1;
    }
  }

  /// Image of k. Precondition: k < size().
  [[nodiscard]] std::uint64_t operator[](std::uint64_t k) const noexcept {
    if (n_ <= 1) return k;
    std::uint64_t x = encrypt(k);
    while (x >= n_) [[unlikely]] x = encrypt(x);
    return x;
  }

  /// out[j] = (*this)[first + j] for j < out.size().
  /// Precondition: first + out.size() <= size().
  /// With the default 4 rounds on a CPU with AVX-512 (F, DQ), 8 lookups at a
  /// time (the same function; values >= n walk on one by one).
  void fill(std::uint64_t first, std::span<std::uint64_t> out) const noexcept {
#ifdef DPKIT_FEISTEL_X86
    if (rounds_ == 4 && n_ > 1 && detail::feistel_simd_level() == 1) {
      fill_avx512(first, out);
      return;
    }
#endif
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = (*this)[first + j];
  }

  /// n of the last reset.
  [[nodiscard]] std::uint64_t size() const noexcept { return n_; }
  /// Number of rounds.
  [[nodiscard]] unsigned rounds() const noexcept { return rounds_; }

private:
  static constexpr unsigned max_rounds = 16;

  /// Round r on (hi, lo): even r: lo ^= top p bits of (hi ^ key) * mult;
  /// odd r: hi = (hi + ((top 32 bits of (lo ^ key) * mult) * B >> 32)) mod B.
  [[nodiscard]] [[gnu::always_inline]] std::uint64_t round(std::uint64_t x, unsigned r) const noexcept {
    std::uint64_t lo = x & lo_mask_, hi = x >> lo_bits_;
    if ((r & 1) == 0) {
      lo ^= ((hi ^ keys_[r]) * mults_[r]) >> (64 - lo_bits_);
    } else {
      const std::uint64_t f = (((lo ^ keys_[r]) * mults_[r]) >> 32) * hi_range_ >> 32; // < B
      hi += f;
      hi -= hi >= hi_range_ ? hi_range_ : 0;
    }
    return (hi << lo_bits_) | lo;
  }

  /// One pass of the network over [0, B * 2^p).
  [[nodiscard]] [[gnu::always_inline]] std::uint64_t encrypt(std::uint64_t x) const noexcept {
    if (rounds_ == 4) return round(round(round(round(x, 0), 1), 2), 3); // the default, unrolled
    for (unsigned r = 0; r < rounds_; ++r) x = round(x, r);
    return x;
  }

#ifdef DPKIT_FEISTEL_X86
  /// All 8 lanes (the maskz shifts: GCC 12 warns about the unmasked ones'
  /// undefined pass-through operand).
  static constexpr __mmask8 all8 = 0xFF;
  /// round() on 8 lanes, even r: lo ^ top p bits of (hi ^ key) * mult.
  [[gnu::target("avx512f,avx512dq")]] static __m512i even_avx512(__m512i hi, __m512i lo, __m512i key, __m512i mult,
                                                                   __m128i top_shift) noexcept {
    return _mm512_xor_si512(lo, _mm512_maskz_srl_epi64(all8, _mm512_mullo_epi64(_mm512_xor_si512(hi, key), mult), top_shift));
  }
  /// round() on 8 lanes, odd r: (hi + ((top 32 bits of (lo ^ key) * mult) * B >> 32)) mod B.
  [[gnu::target("avx512f,avx512dq")]] static __m512i odd_avx512(__m512i hi, __m512i lo, __m512i key, __m512i mult,
                                                                  __m512i range) noexcept {
    const __m512i t = _mm512_maskz_srli_epi64(all8, _mm512_mullo_epi64(_mm512_xor_si512(lo, key), mult), 32);
    const __m512i f = _mm512_maskz_srli_epi64(all8, _mm512_mullo_epi64(t, range), 32); // < B (t < 2^32, B <= 2^32)
    hi = _mm512_add_epi64(hi, f);
    return _mm512_mask_sub_epi64(hi, _mm512_cmpge_epu64_mask(hi, range), hi, range);
  }
  /// fill() with the 4-round network on 8 lanes of 64 bits (vpmullq).
  [[gnu::target("avx512f,avx512dq")]] void fill_avx512(std::uint64_t first, std::span<std::uint64_t> out) const noexcept {
    const __m512i lo_mask = _mm512_set1_epi64(static_cast<long long>(lo_mask_));
    const __m512i range = _mm512_set1_epi64(static_cast<long long>(hi_range_));
    const __m128i lo_shift = _mm_cvtsi32_si128(static_cast<int>(lo_bits_));
    const __m128i top_shift = _mm_cvtsi32_si128(static_cast<int>(64 - lo_bits_));
    const __m512i n = _mm512_set1_epi64(static_cast<long long>(n_));
    __m512i key[4], mult[4];
    for (unsigned r = 0; r < 4; ++r) {
      key[r] = _mm512_set1_epi64(static_cast<long long>(keys_[r]));
      mult[r] = _mm512_set1_epi64(static_cast<long long>(mults_[r]));
    }
    const __m512i step = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    std::size_t j = 0;
    for (; j + 8 <= out.size(); j += 8) {
      const __m512i x = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(first + j)), step);
      __m512i lo = _mm512_and_si512(x, lo_mask), hi = _mm512_maskz_srl_epi64(all8, x, lo_shift);
      lo = even_avx512(hi, lo, key[0], mult[0], top_shift);
      hi = odd_avx512(hi, lo, key[1], mult[1], range);
      lo = even_avx512(hi, lo, key[2], mult[2], top_shift);
      hi = odd_avx512(hi, lo, key[3], mult[3], range);
      const __m512i y = _mm512_or_si512(_mm512_maskz_sll_epi64(all8, hi, lo_shift), lo);
      _mm512_storeu_si512(out.data() + j, y);
      if (_mm512_cmpge_epu64_mask(y, n) != 0) [[unlikely]]
        for (std::size_t k = j; k < j + 8; ++k)
          while (out[k] >= n_) out[k] = encrypt(out[k]);
    }
    for (; j < out.size(); ++j) out[j] = (*this)[first + j];
  }
#endif

  unsigned rounds_;
  std::uint64_t n_ = 0;
  unsigned lo_bits_ = 1;
  std::uint64_t lo_mask_ = 1;
  std::uint64_t hi_range_ = 1;
  std::array<std::uint64_t, max_rounds> keys_{};
  std::array<std::uint64_t, max_rounds> mults_{};
};

static_assert(permutation_engine<torch_randperm>);
static_assert(permutation_engine<feistel>);

} // namespace dpkit
