/// @file permutation.hpp
/// @brief Permutation engines for the samplers: `torch_randperm` (bit-exact
/// with torch.randperm on CPU) and `feistel` (a keyed bijection with O(1)
/// memory and O(1) expected random access).
///
/// An engine is reset to (n, seed) and then answers perm[k] for k < n. The
/// distributed sampler calls reset(n, seed + epoch), as torch does.
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/detail/hash.hpp>

#include <array>
#include <bit>
#include <concepts>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

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

namespace detail::data {

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

} // namespace detail::data

/// Fills `out` (size n) with torch.randperm(n, generator=torch.Generator().
/// manual_seed(seed)) on CPU, bit for bit. Index is any integer type that holds
/// n - 1. O(n) time.
template <std::integral Index>
void torch_randperm_fill(std::span<Index> out, std::uint64_t seed, torch_compat compat = torch_compat::since_2_7) {
  std::mt19937 gen = detail::data::torch_cpu_generator(seed);
  if (detail::data::torch_randperm_uses_random64(out.size(), compat))
    detail::data::randperm_inside_out64(out, gen);
  else
    detail::data::randperm_swap32(out, gen);
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

/// Permutation engine: a keyed Feistel network over [0, 2^b) with cycle
/// walking onto [0, n).
///
/// b = max(2, ceil(log2 n)) bits are split into halves of floor(b/2) and
/// ceil(b/2) bits (unbalanced when b is odd); each round replaces one half by
/// itself XOR F(other half, round key) and swaps, so every round is a bijection.
/// Values >= n are encrypted again until they land in [0, n) (cycle walking;
/// 2^b < 2n, so under 2 steps are expected). Round keys come from splitmix64 of
/// the seed. O(1) memory, O(1) expected time per lookup, reset is O(1); good
/// for billions of samples and for resuming anywhere. Not torch-compatible.
class feistel {
public:
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
    hi_bits_ = bits - lo_bits_;
    std::uint64_t state = seed ^ 0x6a09e667f3bcc908ULL;
    for (auto& k : keys_) k = detail::data::splitmix64(state);
  }

  /// Image of k. Precondition: k < size().
  [[nodiscard]] std::uint64_t operator[](std::uint64_t k) const noexcept {
    if (n_ <= 1) return k;
    std::uint64_t x = encrypt(k);
    while (x >= n_) x = encrypt(x);
    return x;
  }

  /// n of the last reset.
  [[nodiscard]] std::uint64_t size() const noexcept { return n_; }

private:
  static constexpr unsigned max_rounds = 16;

  static constexpr std::uint64_t mask(unsigned w) noexcept { return w >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << w) - 1; }

  [[nodiscard]] std::uint64_t encrypt(std::uint64_t x) const noexcept {
    unsigned lo_w = lo_bits_, hi_w = hi_bits_;
    for (unsigned r = 0; r < rounds_; ++r) {
      const std::uint64_t lo = x & mask(lo_w);
      const std::uint64_t hi = x >> lo_w;
      const std::uint64_t f = detail::data::mix64(lo ^ keys_[r]) & mask(hi_w);
      x = (lo << hi_w) | (hi ^ f); // (lo, hi ^ F(lo)): the halves swap widths
      std::swap(lo_w, hi_w);
    }
    return x;
  }

  unsigned rounds_;
  std::uint64_t n_ = 0;
  unsigned lo_bits_ = 1, hi_bits_ = 1;
  std::array<std::uint64_t, max_rounds> keys_{};
};

static_assert(permutation_engine<torch_randperm>);
static_assert(permutation_engine<feistel>);

} // namespace dpkit
