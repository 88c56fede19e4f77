/// @file element.hpp
/// @brief Element types dpkit reduces: f32 f64 f16 bf16 i8 u8 i32 u32 i64 u64,
/// with dpkit's own 16-bit float storage types.
///
/// f16 is IEEE 754 binary16, bf16 is bfloat16 (the high half of a binary32).
/// Conversions from float round to nearest, ties to even, as CUDA's
/// __float2half_rn / __float2bfloat16_rn do; NaN stays NaN (quiet), overflow
/// becomes infinity.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

namespace dpkit {

/// IEEE 754 binary16 storage type (1 sign, 5 exponent, 10 mantissa bits).
/// Arithmetic is done by converting to float; dpkit's reductions accumulate
/// f16 in f32 within a chunk reduction. Trivially copyable, 2 bytes.
struct f16 {
  std::uint16_t bits = 0;

  f16() = default;
  /// Converts from float, round to nearest even (matches __float2half_rn).
  explicit f16(float v) noexcept : bits(from_float(v)) {}
  /// Converts to float exactly.
  explicit operator float() const noexcept { return to_float(bits); }
  /// Builds a value from its raw bit pattern.
  static constexpr f16 from_bits(std::uint16_t b) noexcept { f16 h; h.bits = b; return h; }
  friend constexpr bool operator==(f16 a, f16 b) noexcept { return a.bits == b.bits; }

  /// Raw float -> binary16 bits, round to nearest, ties to even; overflow
  /// to infinity, NaN to a quiet NaN. Branch-free (selects only) so loops
  /// over it vectorize (F. Giesen's float_to_half_fast3_rtne).
  static constexpr std::uint16_t from_float(float v) noexcept {
    constexpr std::uint32_t f32_inf = 255u << 23, f16_max = (127u + 16u) << 23;
    constexpr std::uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    std::uint32_t x = std::bit_cast<std::uint32_t>(v);
    const std::uint32_t sign = x & 0x80000000u;
    x ^= sign;
    // overflow / inf / nan
    const std::uint32_t big = 0x7c00u | (static_cast<std::uint32_t>(x > f32_inf) << 9);
    // subnormal half: let the FPU round by adding a magic number
    const float sub_f = std::bit_cast<float>(x) + std::bit_cast<float>(denorm_magic);
    const std::uint32_t sub = std::bit_cast<std::uint32_t>(sub_f) - denorm_magic;
    // normal half: rebias and round to nearest even
    const std::uint32_t mant_odd = (x >> 13) & 1u;
    const std::uint32_t norm = (x + (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd) >> 13;
    const std::uint32_t m_big = 0u - static_cast<std::uint32_t>(x >= f16_max);
    const std::uint32_t m_sub = 0u - static_cast<std::uint32_t>(x < (113u << 23));
    const std::uint32_t o = (big & m_big) | (~m_big & ((sub & m_sub) | (norm & ~m_sub)));
    return static_cast<std::uint16_t>(o | (sign >> 16));
  }
  /// Raw binary16 bits -> float (exact). Branch-free (selects only).
  static constexpr float to_float(std::uint16_t h) noexcept {
    constexpr std::uint32_t shifted_exp = 0x7c00u << 13;
    std::uint32_t o = (static_cast<std::uint32_t>(h) & 0x7fffu) << 13;
    const std::uint32_t exp = o & shifted_exp;
    o += (127u - 15u) << 23;
    const std::uint32_t inf_nan = o + ((128u - 16u) << 23);
    // subnormal: renormalize through the FPU
    const float sub_f = std::bit_cast<float>(o + (1u << 23)) - std::bit_cast<float>(113u << 23);
    const std::uint32_t sub = std::bit_cast<std::uint32_t>(sub_f);
    const std::uint32_t m_inf = 0u - static_cast<std::uint32_t>(exp == shifted_exp);
    const std::uint32_t m_sub = 0u - static_cast<std::uint32_t>(exp == 0);
    o = (inf_nan & m_inf) | (~m_inf & ((sub & m_sub) | (o & ~m_sub)));
    return std::bit_cast<float>(o | ((static_cast<std::uint32_t>(h) & 0x8000u) << 16));
  }
};

/// bfloat16 storage type (1 sign, 8 exponent, 7 mantissa bits): the high 16
/// bits of a binary32. Trivially copyable, 2 bytes.
struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  /// Converts from float, round to nearest even (matches __float2bfloat16_rn).
  explicit bf16(float v) noexcept : bits(from_float(v)) {}
  /// Converts to float exactly.
  explicit operator float() const noexcept { return to_float(bits); }
  /// Builds a value from its raw bit pattern.
  static constexpr bf16 from_bits(std::uint16_t b) noexcept { bf16 h; h.bits = b; return h; }
  friend constexpr bool operator==(bf16 a, bf16 b) noexcept { return a.bits == b.bits; }

  /// Raw float -> bfloat16 bits, round to nearest, ties to even; NaN stays quiet NaN.
  static constexpr std::uint16_t from_float(float v) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(v);
    const std::uint32_t lsb = (x >> 16) & 1u;
    const std::uint32_t rounded = (x + 0x7fffu + lsb) >> 16;
    const std::uint32_t nan = (x >> 16) | 0x40u;
    return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
  /// Raw bfloat16 bits -> float (exact).
  static constexpr float to_float(std::uint16_t b) noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
  }
};

static_assert(sizeof(f16) == 2 && std::is_trivially_copyable_v<f16>);
static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);

/// Runtime tag of an element type. Names (element_type_name) follow
/// nccl-tests: float double half bfloat16 int8 uint8 int32 uint32 int64 uint64.
enum class element_type : std::uint8_t { f32, f64, f16, bf16, i8, u8, i32, u32, i64, u64 };

/// True for the ten element types dpkit reduces (cv-qualifiers ignored).
template <class T>
inline constexpr bool is_element_v = [] {
  using U = std::remove_cv_t<T>;
  return std::is_same_v<U, float> || std::is_same_v<U, double> || std::is_same_v<U, f16> ||
         std::is_same_v<U, bf16> || std::is_same_v<U, std::int8_t> ||
         std::is_same_v<U, std::uint8_t> || std::is_same_v<U, std::int32_t> ||
         std::is_same_v<U, std::uint32_t> || std::is_same_v<U, std::int64_t> ||
         std::is_same_v<U, std::uint64_t>;
}();

/// Concept: one of dpkit's ten element types.
template <class T>
concept element = is_element_v<T>;

/// The element_type tag of a C++ element type.
template <element T>
inline constexpr element_type element_type_of_v = [] {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return element_type::f32;
  else if constexpr (std::is_same_v<U, double>) return element_type::f64;
  else if constexpr (std::is_same_v<U, f16>) return element_type::f16;
  else if constexpr (std::is_same_v<U, bf16>) return element_type::bf16;
  else if constexpr (std::is_same_v<U, std::int8_t>) return element_type::i8;
  else if constexpr (std::is_same_v<U, std::uint8_t>) return element_type::u8;
  else if constexpr (std::is_same_v<U, std::int32_t>) return element_type::i32;
  else if constexpr (std::is_same_v<U, std::uint32_t>) return element_type::u32;
  else if constexpr (std::is_same_v<U, std::int64_t>) return element_type::i64;
  else return element_type::u64;
}();

/// Size of one element in bytes.
inline constexpr std::size_t element_size(element_type t) noexcept {
  switch (t) {
  case element_type::f64: case element_type::i64: case element_type::u64: return 8;
  case element_type::f32: case element_type::i32: case element_type::u32: return 4;
  case element_type::f16: case element_type::bf16: return 2;
  case element_type::i8: case element_type::u8: return 1;
  }
  return 0;
}

/// nccl-tests' name of an element type ("float", "half", "bfloat16", "int32", ...).
inline constexpr std::string_view element_type_name(element_type t) noexcept {
  switch (t) {
  case element_type::f32: return "float";
  case element_type::f64: return "double";
  case element_type::f16: return "half";
  case element_type::bf16: return "bfloat16";
  case element_type::i8: return "int8";
  case element_type::u8: return "uint8";
  case element_type::i32: return "int32";
  case element_type::u32: return "uint32";
  case element_type::i64: return "int64";
  case element_type::u64: return "uint64";
  }
  return "?";
}

/// Prints element_type_name(t).
inline std::ostream& operator<<(std::ostream& os, element_type t) { return os << element_type_name(t); }

/// Calls f(T{}) with the C++ type of a runtime element_type tag (type dispatch
/// for benchmarks and type-erased callers).
template <class F>
decltype(auto) visit_element_type(element_type t, F&& f) {
  switch (t) {
  case element_type::f32: return f(float{});
  case element_type::f64: return f(double{});
  case element_type::f16: return f(f16{});
  case element_type::bf16: return f(bf16{});
  case element_type::i8: return f(std::int8_t{});
  case element_type::u8: return f(std::uint8_t{});
  case element_type::i32: return f(std::int32_t{});
  case element_type::u32: return f(std::uint32_t{});
  case element_type::i64: return f(std::int64_t{});
  case element_type::u64: break;
  }
  return f(std::uint64_t{});
}

} // namespace dpkit
