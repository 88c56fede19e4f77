// f16 / bf16 conversions: exhaustive round trips, and float -> 16-bit rounding
// compared against an independent reference (exact midpoint comparison in
// double against the sorted table of representable values).
#include <dpkit/core/element.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

namespace {

// Independent decoding of a 16-bit IEEE-style float from its fields: sign,
// `eb` exponent bits (bias 2^(eb-1) - 1), 15 - eb mantissa bits.
double decode16(std::uint16_t h, int eb) {
  const int mb = 15 - eb, emax = (1 << eb) - 1, bias = emax / 2;
  const int s = h >> 15, e = (h >> mb) & emax, m = h & ((1 << mb) - 1);
  double v;
  if (e == emax) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0) v = std::ldexp(static_cast<double>(m), 1 - bias - mb);
  else v = std::ldexp(static_cast<double>((1 << mb) + m), e - bias - mb);
  return s ? -v : v;
}
// binary16: 5 exponent bits; bfloat16: 8.
double f16_value(std::uint16_t h) { return decode16(h, 5); }
double bf16_value(std::uint16_t h) { return decode16(h, 8); }

// Reference round-to-nearest-even of float x onto a 16-bit format whose
// positive finite values are `table` (indexed by bit pattern, increasing) and
// whose "next value after the largest" (where overflow rounds) is `beyond`.
// Midpoints of adjacent 16-bit values have at most 13 significant bits, so
// comparing x (exact in double) with them is exact.
std::uint16_t ref_round(float x, const std::vector<double>& table, double beyond, std::uint16_t inf_bits,
                        std::uint16_t sign_bit) {
  const std::uint16_t sign = std::signbit(x) ? sign_bit : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return static_cast<std::uint16_t>(sign | inf_bits);
  // lo = largest representable <= a.
  const auto it = std::upper_bound(table.begin(), table.end(), a);
  const std::size_t lo = static_cast<std::size_t>(it - table.begin()) - 1;
  if (table[lo] == a) return static_cast<std::uint16_t>(sign | lo);
  const double hi_v = lo + 1 < table.size() ? table[lo + 1] : beyond;
  const double mid = (table[lo] + hi_v) / 2;
  std::size_t r;
  if (a < mid) r = lo;
  else if (a > mid) r = lo + 1;
  else r = (lo % 2 == 0) ? lo : lo + 1;
  if (r >= table.size()) return static_cast<std::uint16_t>(sign | inf_bits);
  return static_cast<std::uint16_t>(sign | r);
}

struct fmt16 {
  std::vector<double> table; // positive finite values by bit pattern
  double beyond;
  std::uint16_t inf_bits;
};

const fmt16& f16_fmt() {
  static const fmt16 f = [] {
    fmt16 r;
    for (std::uint32_t b = 0; b < 0x7c00u; ++b) r.table.push_back(f16_value(static_cast<std::uint16_t>(b)));
    r.beyond = 65536.0;
    r.inf_bits = 0x7c00;
    return r;
  }();
  return f;
}
const fmt16& bf16_fmt() {
  static const fmt16 f = [] {
    fmt16 r;
    for (std::uint32_t b = 0; b < 0x7f80u; ++b) r.table.push_back(bf16_value(static_cast<std::uint16_t>(b)));
    r.beyond = std::ldexp(1.0, 128);
    r.inf_bits = 0x7f80;
    return r;
  }();
  return f;
}

template <class H>
bool is_nan16(std::uint16_t b) {
  if constexpr (std::is_same_v<H, dpkit::f16>) return (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0;
  else return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0;
}

template <class H>
const fmt16& fmt_of() {
  if constexpr (std::is_same_v<H, dpkit::f16>) return f16_fmt();
  else return bf16_fmt();
}

template <class H>
std::uint16_t reference(float x) {
  const auto& f = fmt_of<H>();
  return ref_round(x, f.table, f.beyond, f.inf_bits, 0x8000);
}

// Checks from_float(x) against the reference; returns true on match.
template <class H>
bool check_one(float x) {
  const std::uint16_t got = H::from_float(x);
  if (std::isnan(x)) {
    if (!is_nan16<H>(got)) {
      FAIL_CHECK("NaN input " << std::bit_cast<std::uint32_t>(x) << " gave non-NaN bits " << got);
      return false;
    }
    return true;
  }
  const std::uint16_t want = reference<H>(x);
  if (got != want) {
    FAIL_CHECK("from_float(" << std::hexfloat << x << " = 0x" << std::hex << std::bit_cast<std::uint32_t>(x)
                             << ") = 0x" << got << ", reference 0x" << want);
    return false;
  }
  return true;
}

} // namespace

TEST_CASE_TEMPLATE("16-bit float: exhaustive bit-pattern round trip and exact decoding", H, dpkit::f16, dpkit::bf16) {
  int failures = 0;
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = H::to_float(bits);
    const double want = std::is_same_v<H, dpkit::f16> ? f16_value(bits) : bf16_value(bits);
    const std::uint16_t back = H::from_float(f);
    if (is_nan16<H>(bits)) {
      if (!std::isnan(f) || !is_nan16<H>(back)) ++failures;
      continue;
    }
    // to_float is exact (including the sign of zero) and from_float inverts it.
    if (static_cast<double>(f) != want || std::signbit(f) != std::signbit(want) || back != bits) {
      if (++failures < 10)
        FAIL_CHECK("bits 0x" << std::hex << b << ": to_float " << std::hexfloat << f << " want " << want
                             << ", back 0x" << back);
    }
    // The struct interface agrees with the static functions.
    if (static_cast<float>(H::from_bits(bits)) != f && !std::isnan(f)) ++failures;
  }
  CHECK(failures == 0);
}

TEST_CASE_TEMPLATE("16-bit float: from_float at every midpoint, its neighbours and the grid", H, dpkit::f16,
                   dpkit::bf16) {
  const auto& fmt = fmt_of<H>();
  int failures = 0;
  for (std::size_t lo = 0; lo < fmt.table.size() && failures < 20; ++lo) {
    const double hi = lo + 1 < fmt.table.size() ? fmt.table[lo + 1] : fmt.beyond;
    const double mid = (fmt.table[lo] + hi) / 2;
    const auto midf = static_cast<float>(mid);
    if (static_cast<double>(midf) != mid) continue; // not representable as float (never for these formats)
    for (float x : {static_cast<float>(fmt.table[lo]), midf, std::nextafter(midf, 0.0f),
                    std::nextafter(midf, std::numeric_limits<float>::infinity())}) {
      if (!check_one<H>(x)) ++failures;
      if (!check_one<H>(-x)) ++failures;
    }
  }
  CHECK(failures == 0);
}

TEST_CASE_TEMPLATE("16-bit float: from_float on random floats of every magnitude", H, dpkit::f16, dpkit::bf16) {
  std::mt19937 rng(12345);
  int failures = 0;
  // Random bit patterns (every exponent, incl. float subnormals, inf, NaN).
  for (int i = 0; i < 400000 && failures < 20; ++i)
    if (!check_one<H>(std::bit_cast<float>(static_cast<std::uint32_t>(rng())))) ++failures;
  // Random values concentrated in the 16-bit format's range, incl. its subnormals.
  std::uniform_real_distribution<double> expo(-30.0, 17.0);
  for (int i = 0; i < 400000 && failures < 20; ++i) {
    const auto x = static_cast<float>(std::exp2(expo(rng)) * ((rng() & 1) ? 1 : -1));
    if (!check_one<H>(x)) ++failures;
  }
  CHECK(failures == 0);
}

TEST_CASE("f16: named edge cases (ties, subnormals, overflow at 65520)") {
  using dpkit::f16;
  CHECK(f16::from_float(0.0f) == 0x0000);
  CHECK(f16::from_float(-0.0f) == 0x8000);
  CHECK(f16::from_float(1.0f) == 0x3c00);
  CHECK(f16::from_float(65504.0f) == 0x7bff);                                     // max finite
  CHECK(f16::from_float(std::nextafter(65520.0f, 0.0f)) == 0x7bff);              // just below the tie
  CHECK(f16::from_float(65520.0f) == 0x7c00);                                     // tie -> even (inf)
  CHECK(f16::from_float(-65520.0f) == 0xfc00);
  CHECK(f16::from_float(1e30f) == 0x7c00);
  CHECK(f16::from_float(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(f16::from_float(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(f16::from_float(std::ldexp(1.0f, -24)) == 0x0001);                        // smallest subnormal
  CHECK(f16::from_float(std::ldexp(1.0f, -25)) == 0x0000);                        // tie -> even (0)
  CHECK(f16::from_float(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(f16::from_float(std::ldexp(3.0f, -25)) == 0x0002);                        // 1.5 ulp tie -> 2
  CHECK(f16::from_float(std::ldexp(5.0f, -25)) == 0x0002);                        // 2.5 ulp tie -> 2
  CHECK(f16::from_float(std::ldexp(1.0f, -14)) == 0x0400);                        // smallest normal
  CHECK(f16::from_float(std::ldexp(2047.0f, -25)) == 0x0400);                     // subnormal rounds up to normal
  CHECK(f16::from_float(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);                 // tie -> even (down)
  CHECK(f16::from_float(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);             // tie -> even (up)
  CHECK(f16::from_float(std::numeric_limits<float>::denorm_min()) == 0x0000);
  const auto nan = f16::from_float(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan & 0x7c00) == 0x7c00);
  CHECK((nan & 0x3ff) != 0);
  CHECK(static_cast<float>(f16(2.5f)) == 2.5f);
  CHECK(f16(2.5f) == f16::from_bits(0x4100));
}

TEST_CASE("bf16: named edge cases (ties, overflow, NaN stays NaN)") {
  using dpkit::bf16;
  CHECK(bf16::from_float(1.0f) == 0x3f80);
  CHECK(bf16::from_float(-0.0f) == 0x8000);
  CHECK(bf16::from_float(std::bit_cast<float>(0x3f808000u)) == 0x3f80); // tie -> even (down)
  CHECK(bf16::from_float(std::bit_cast<float>(0x3f818000u)) == 0x3f82); // tie -> even (up)
  CHECK(bf16::from_float(std::bit_cast<float>(0x3f808001u)) == 0x3f81);
  CHECK(bf16::from_float(std::bit_cast<float>(0x7f7f7fffu)) == 0x7f7f); // just below the overflow tie
  CHECK(bf16::from_float(std::bit_cast<float>(0x7f7f8000u)) == 0x7f80); // tie -> inf
  CHECK(bf16::from_float(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(bf16::from_float(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(bf16::from_float(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(bf16::from_float(std::bit_cast<float>(0x00008000u)) == 0x0000); // subnormal tie -> even
  CHECK(bf16::from_float(std::bit_cast<float>(0x00018000u)) == 0x0002);
  for (std::uint32_t nan : {0x7f800001u, 0x7fc00000u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu}) {
    const auto b = bf16::from_float(std::bit_cast<float>(nan));
    CHECK_MESSAGE(((b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0), "NaN 0x" << std::hex << nan << " -> 0x" << b);
    CHECK((b & 0x8000) == ((nan >> 16) & 0x8000));
  }
}

TEST_CASE("element types: tags, sizes, names, dispatch") {
  using dpkit::element_type;
  CHECK(dpkit::element_type_of_v<float> == element_type::f32);
  CHECK(dpkit::element_type_of_v<const double> == element_type::f64);
  CHECK(dpkit::element_type_of_v<dpkit::f16> == element_type::f16);
  CHECK(dpkit::element_type_of_v<dpkit::bf16> == element_type::bf16);
  CHECK(dpkit::element_type_of_v<std::int8_t> == element_type::i8);
  CHECK(dpkit::element_type_of_v<std::uint64_t> == element_type::u64);
  static_assert(!dpkit::element<char16_t>);
  static_assert(!dpkit::element<long double>);
  static_assert(!dpkit::element<bool>);
  const element_type all[] = {element_type::f32, element_type::f64, element_type::f16, element_type::bf16,
                              element_type::i8,  element_type::u8,  element_type::i32, element_type::u32,
                              element_type::i64, element_type::u64};
  const char* names[] = {"float", "double", "half", "bfloat16", "int8", "uint8", "int32", "uint32", "int64", "uint64"};
  const std::size_t sizes[] = {4, 8, 2, 2, 1, 1, 4, 4, 8, 8};
  for (int i = 0; i < 10; ++i) {
    CHECK(dpkit::element_type_name(all[i]) == names[i]);
    CHECK(dpkit::element_size(all[i]) == sizes[i]);
    std::ostringstream os;
    os << all[i];
    CHECK(os.str() == names[i]);
    const auto [tag, sz] = dpkit::visit_element_type(all[i], [](auto v) {
      return std::pair{dpkit::element_type_of_v<decltype(v)>, sizeof(v)};
    });
    CHECK(tag == all[i]);
    CHECK(sz == sizes[i]);
  }
}
