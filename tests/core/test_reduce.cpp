// reduce_host / divide_host for every op and element type against a scalar
// reference written independently of the library's loops.
#include <dpkit/core/copy_nontemporal.hpp>
#include <dpkit/core/reduce_op.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <type_traits>
#include <vector>

using dpkit::bf16;
using dpkit::f16;
using dpkit::reduce_op;

namespace {

template <class T>
constexpr bool is16 = std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

// Random values that cannot overflow the op in T (signed overflow is UB).
template <class T>
T random_value(std::mt19937_64& rng, reduce_op op) {
  if constexpr (is16<T>) {
    std::uniform_real_distribution<float> d(-100.0f, 100.0f);
    return T(d(rng));
  } else if constexpr (std::is_floating_point_v<T>) {
    std::uniform_real_distribution<T> d(-1e3, 1e3);
    return d(rng);
  } else if constexpr (sizeof(T) == 1) {
    return static_cast<T>(rng()); // promoted to int: wraps by the C++20 conversion rule
  } else if constexpr (std::is_unsigned_v<T>) {
    return static_cast<T>(rng()); // unsigned wraps
  } else {
    const std::int64_t lim = op == reduce_op::prod ? 40000 : (std::int64_t{1} << (sizeof(T) * 8 - 3));
    std::uniform_int_distribution<std::int64_t> d(-lim, lim);
    return static_cast<T>(d(rng));
  }
}

// Scalar reference: f16/bf16 computed in float and rounded once; 8-bit ints
// computed in int and converted (modular); others in T.
template <class T>
T ref_combine(T a, T b, reduce_op op) {
  if constexpr (is16<T>) {
    const float x = static_cast<float>(a), y = static_cast<float>(b);
    float r = 0;
    switch (op) {
    case reduce_op::sum: case reduce_op::avg: r = x + y; break;
    case reduce_op::prod: r = x * y; break;
    case reduce_op::min: r = std::fmin(x, y); break;
    case reduce_op::max: r = std::fmax(x, y); break;
    }
    return T(r);
  } else {
    using W = std::conditional_t<(sizeof(T) < 4), int, T>;
    const W x = a, y = b;
    switch (op) {
    case reduce_op::sum: case reduce_op::avg: return static_cast<T>(x + y);
    case reduce_op::prod: return static_cast<T>(x * y);
    case reduce_op::min: return x < y ? a : b;
    case reduce_op::max: return x < y ? b : a;
    }
    return T{};
  }
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
double as_double(T v) {
  if constexpr (is16<T>) return static_cast<float>(v);
  else return static_cast<double>(v);
}

} // namespace

#define DPKIT_ELEMENT_TYPES float, double, f16, bf16, std::int8_t, std::uint8_t, std::int32_t, std::uint32_t, \
                            std::int64_t, std::uint64_t

TEST_CASE_TEMPLATE("reduce_host: every op, out of place and both in-place aliasings", T, DPKIT_ELEMENT_TYPES) {
  std::mt19937_64 rng(7);
  for (reduce_op op : {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::avg}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{17}, std::size_t{1000},
                          std::size_t{4099}}) {
      CAPTURE(op);
      CAPTURE(n);
      std::vector<T> a(n), b(n), want(n);
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = random_value<T>(rng, op);
        b[i] = random_value<T>(rng, op);
        want[i] = ref_combine(a[i], b[i], op);
      }
      auto check = [&](const std::vector<T>& got, const char* how) {
        std::size_t bad = 0;
        for (std::size_t i = 0; i < n; ++i)
          if (!same_bits(got[i], want[i]) && bad++ < 3)
            FAIL_CHECK(how << ": [" << i << "] " << as_double(a[i]) << " " << op << " " << as_double(b[i])
                           << " = " << as_double(got[i]) << ", want " << as_double(want[i]));
        CHECK(bad == 0);
      };
      std::vector<T> out(n, T{});
      dpkit::reduce_host(out.data(), a.data(), b.data(), n, op);
      check(out, "out of place");
      std::vector<T> x = a;
      dpkit::reduce_host(x.data(), x.data(), b.data(), n, op);
      check(x, "dst == a");
      std::vector<T> y = b;
      dpkit::reduce_host(y.data(), a.data(), y.data(), n, op);
      check(y, "dst == b");
      // n counts elements: nothing past n is touched.
      if (n > 1) {
        std::vector<T> z(n, T{});
        const T sentinel = z[n - 1] = random_value<T>(rng, op);
        dpkit::reduce_host(z.data(), a.data(), b.data(), n - 1, op);
        CHECK(same_bits(z[n - 1], sentinel));
      }
    }
  }
}

TEST_CASE_TEMPLATE("divide_host: avg finalization (integers truncate toward zero)", T, DPKIT_ELEMENT_TYPES) {
  std::mt19937_64 rng(11);
  for (std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7},
                        std::size_t{16}}) {
    const std::size_t n = 257;
    std::vector<T> v(n), want(n);
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = random_value<T>(rng, reduce_op::sum);
      if (d <= 1) want[i] = v[i];
      else if constexpr (is16<T>) want[i] = T(static_cast<float>(v[i]) / static_cast<float>(d));
      else if constexpr (std::is_floating_point_v<T>) want[i] = v[i] / static_cast<T>(d);
      else if constexpr (std::is_signed_v<T>) {
        // truncation toward zero computed without C++ division semantics
        const auto x = static_cast<std::int64_t>(v[i]);
        const auto q = static_cast<std::int64_t>(std::llabs(x)) / static_cast<std::int64_t>(d);
        want[i] = static_cast<T>(x < 0 ? -q : q);
      } else want[i] = static_cast<T>(static_cast<std::uint64_t>(v[i]) / d);
    }
    dpkit::divide_host(v.data(), n, d);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (!same_bits(v[i], want[i]) && bad++ < 3) FAIL_CHECK("d=" << d << " [" << i << "] got " << as_double(v[i]) << " want " << as_double(want[i]));
    CHECK(bad == 0);
  }
  if constexpr (std::is_signed_v<T> && std::is_integral_v<T>) {
    T v[4] = {static_cast<T>(-7), static_cast<T>(7), static_cast<T>(-1), static_cast<T>(-8)};
    dpkit::divide_host(v, 4, 2);
    CHECK(v[0] == -3);
    CHECK(v[1] == 3);
    CHECK(v[2] == 0);
    CHECK(v[3] == -4);
  }
}

// The F16C loops (detail/reduce_f16c.hpp) against the portable loops, bit for
// bit: every f16 pattern against specials (0, -0, subnormals, the largest
// finite values, infinities, NaNs) and random pairs, for sum prod min max and
// the avg division. A NaN result must be the canonical quiet NaN 0x7e00 on
// both paths; its sign is compared unless both inputs are NaN (which NaN x86
// returns then depends on the compiler's operand order).
namespace {

bool f16_is_nan(std::uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }

// Portable results through the loops reduce_host used before F16C: out of
// place, and in place (dst = dst op src), which is also the dst == b case's
// order (min and max with a NaN return their first operand).
template <reduce_op Op, class H>
void portable_reduce(H* dst, const H* a, const H* b, std::size_t n) {
  dpkit::detail::reduce_loop<Op>(dst, a, b, n);
}
template <reduce_op Op, class H>
void portable_reduce_inplace(H* dst, const H* src, std::size_t n) {
  dpkit::detail::reduce_inplace_loop<Op>(dst, src, n);
}

std::size_t f16_mismatches(const std::vector<f16>& got, const std::vector<f16>& want, const std::vector<f16>& a,
                           const std::vector<f16>& b, const char* what) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::uint16_t g = got[i].bits, w = want[i].bits;
    bool ok = g == w;
    if (!ok && f16_is_nan(g) && f16_is_nan(w) && (g & 0x7fffu) == 0x7e00u && (w & 0x7fffu) == 0x7e00u &&
        f16_is_nan(a[i].bits) && f16_is_nan(b[i].bits))
      ok = true; // both inputs NaN: either sign
    if (!ok && bad++ < 5) {
      std::ostringstream os;
      os << what << ": [" << i << "] 0x" << std::hex << unsigned{a[i].bits} << ", 0x" << unsigned{b[i].bits}
         << " -> 0x" << unsigned{g} << ", portable loop 0x" << unsigned{w};
      FAIL_CHECK(os.str());
    }
  }
  return bad;
}

// reduce_host out of place, with dst == a and with dst == b, for sum prod min
// max, and divide_host by 2, 3, 7 and 1000, on the pairs (a[i], b[i]),
// against the portable loops; `mismatches(got, want, a, b, what)` counts the
// differences the type's NaN rule does not allow (and reports the first).
template <class H, class Mismatches>
void check_vector_loop_bits(const std::vector<H>& a, const std::vector<H>& b, Mismatches&& mismatches) {
  const std::size_t n = a.size();
  auto one = [&]<reduce_op Op>() {
    CAPTURE(Op);
    std::vector<H> want(n), got(n);
    portable_reduce<Op>(want.data(), a.data(), b.data(), n);
    dpkit::reduce_host(got.data(), a.data(), b.data(), n, Op);
    CHECK(mismatches(got, want, a, b, "out of place") == 0);
    std::vector<H> x = a, want_x = a;
    portable_reduce_inplace<Op>(want_x.data(), b.data(), n);
    dpkit::reduce_host(x.data(), x.data(), b.data(), n, Op);
    CHECK(mismatches(x, want_x, a, b, "dst == a") == 0);
    std::vector<H> y = b, want_y = b;
    portable_reduce_inplace<Op>(want_y.data(), a.data(), n);
    dpkit::reduce_host(y.data(), a.data(), y.data(), n, Op);
    CHECK(mismatches(y, want_y, a, b, "dst == b") == 0);
  };
  one.template operator()<reduce_op::sum>();
  one.template operator()<reduce_op::prod>();
  one.template operator()<reduce_op::min>();
  one.template operator()<reduce_op::max>();
  for (std::size_t d : {std::size_t{2}, std::size_t{3}, std::size_t{7}, std::size_t{1000}}) {
    CAPTURE(d);
    std::vector<H> got = a, want(n);
    for (std::size_t i = 0; i < n; ++i)
      want[i] = H::from_bits(H::from_float(H::to_float(a[i].bits) / static_cast<float>(d)));
    dpkit::divide_host(got.data(), n, d);
    CHECK(mismatches(got, want, a, a, "divide") == 0);
  }
}

} // namespace

TEST_CASE("f16 reduce_host and divide_host on F16C give the portable loops' bits, specials included") {
#ifndef DPKIT_REDUCE_F16C
  MESSAGE("not an x86-64 GCC/Clang build: the F16C loops are not compiled");
#else
  const bool cpu = dpkit::detail::cpu_has_f16c_avx();
  if (!cpu) {
    MESSAGE("this CPU has no F16C/AVX: only the portable loop runs");
    CHECK_FALSE(dpkit::detail::f16c_enabled());
    return;
  }
  CHECK(dpkit::detail::f16c_enabled()); // the test's environment leaves DPKIT_F16C unset
  const std::uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x3555,
                                    0x7bff, 0xfbff, 0x7bfe, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7fff,
                                    0x7d55, 0x5bff, 0x1400, 0x0200, 0x3c01, 0xc000};
  std::mt19937_64 rng(2026);
  std::vector<f16> a, b;
  for (std::uint16_t s : specials)
    for (std::uint32_t x = 0; x < 0x10000u; ++x) {
      a.push_back(f16::from_bits(static_cast<std::uint16_t>(x)));
      b.push_back(f16::from_bits(s));
    }
  for (int k = 0; k < (1 << 20); ++k) {
    a.push_back(f16::from_bits(static_cast<std::uint16_t>(rng())));
    b.push_back(f16::from_bits(static_cast<std::uint16_t>(rng())));
  }
  // Ties: a + b exactly halfway between two f16 (1 + 2^-11 and its odd neighbours), both signs.
  for (std::uint16_t m = 0; m < 0x400; ++m) {
    a.push_back(f16::from_bits(static_cast<std::uint16_t>(0x3c00 | m)));
    b.push_back(f16::from_bits(0x1000)); // 2^-11
    a.push_back(f16::from_bits(static_cast<std::uint16_t>(0xbc00 | m)));
    b.push_back(f16::from_bits(0x9000));
  }
  a.push_back(f16::from_bits(0x0001)); // a tail shorter than one 8-lane block
  b.push_back(f16::from_bits(0x7e00));
  REQUIRE(a.size() % 8 != 0);
  check_vector_loop_bits(a, b, f16_mismatches);
  // A result that overflows (65504 + 16 rounds to infinity, 65504 + 15 does not) and a sum of
  // subnormals, named.
  {
    std::vector<f16> p(8, f16::from_bits(0x7bff)), q(8, f16(16.0f)), r(8);
    q[1] = f16(15.0f);
    p[2] = f16::from_bits(0x0001);
    q[2] = f16::from_bits(0x0001);
    dpkit::reduce_host(r.data(), p.data(), q.data(), 8, reduce_op::sum);
    CHECK(r[0].bits == 0x7c00);
    CHECK(r[1].bits == 0x7bff);
    CHECK(r[2].bits == 0x0002);
  }
#endif
}

// The AVX2 bf16 loops (detail/reduce_bf16_avx2.hpp) against the portable
// loops, bit for bit: every bf16 pattern against specials (0, -0,
// subnormals, the largest finite values, infinities, quiet and signalling
// NaNs with payloads) and random pairs, ties both ways, for sum prod min max
// and the avg division. A NaN result keeps the high half of the f32 NaN with
// the quiet bit set (bf16::from_float); where both inputs are NaN, x86
// returns one operand's payload and the portable loop's operand order is the
// compiler's, so the result must be one of the two inputs, quieted.
namespace {

bool bf16_is_nan(std::uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

std::size_t bf16_mismatches(const std::vector<bf16>& got, const std::vector<bf16>& want, const std::vector<bf16>& a,
                            const std::vector<bf16>& b, const char* what) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::uint16_t g = got[i].bits, w = want[i].bits;
    bool ok = g == w;
    if (!ok && bf16_is_nan(a[i].bits) && bf16_is_nan(b[i].bits) && bf16_is_nan(w))
      ok = g == (a[i].bits | 0x40u) || g == (b[i].bits | 0x40u); // both inputs NaN: either one, quieted
    if (!ok && bad++ < 5) {
      std::ostringstream os;
      os << what << ": [" << i << "] 0x" << std::hex << unsigned{a[i].bits} << ", 0x" << unsigned{b[i].bits}
         << " -> 0x" << unsigned{g} << ", portable loop 0x" << unsigned{w};
      FAIL_CHECK(os.str());
    }
  }
  return bad;
}

} // namespace

TEST_CASE("bf16 reduce_host and divide_host on AVX2 give the portable loops' bits, specials included") {
#ifndef DPKIT_REDUCE_BF16_AVX2
  MESSAGE("not an x86-64 GCC/Clang build: the AVX2 bf16 loops are not compiled");
#else
  if (!dpkit::detail::cpu_has_avx2()) {
    MESSAGE("this CPU has no AVX2: only the portable loop runs");
    CHECK_FALSE(dpkit::detail::bf16_avx2_enabled());
    return;
  }
  CHECK(dpkit::detail::bf16_avx2_enabled()); // the test's environment leaves DPKIT_BF16_AVX2 unset
  const std::uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x3f80, 0xbf80, 0x3eab,
                                    0x7f7f, 0xff7f, 0x7f7e, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fff,
                                    0x7fa5, 0xffbf, 0x5f7f, 0x0040, 0x3f81, 0xc000};
  std::mt19937_64 rng(2026);
  std::vector<bf16> a, b;
  for (std::uint16_t s : specials)
    for (std::uint32_t x = 0; x < 0x10000u; ++x) {
      a.push_back(bf16::from_bits(static_cast<std::uint16_t>(x)));
      b.push_back(bf16::from_bits(s));
    }
  for (int k = 0; k < (1 << 20); ++k) {
    a.push_back(bf16::from_bits(static_cast<std::uint16_t>(rng())));
    b.push_back(bf16::from_bits(static_cast<std::uint16_t>(rng())));
  }
  // Ties: a + b exactly halfway between two bf16 (1 + 2^-8 with 1's odd and even neighbours), both signs.
  for (std::uint16_t m = 0; m < 0x80; ++m) {
    a.push_back(bf16::from_bits(static_cast<std::uint16_t>(0x3f80 | m)));
    b.push_back(bf16::from_bits(0x3b80)); // 2^-8
    a.push_back(bf16::from_bits(static_cast<std::uint16_t>(0xbf80 | m)));
    b.push_back(bf16::from_bits(0xbb80));
  }
  a.push_back(bf16::from_bits(0x0001)); // a tail shorter than one 16-lane block
  b.push_back(bf16::from_bits(0x7fc0));
  REQUIRE(a.size() % 16 != 0);
  check_vector_loop_bits(a, b, bf16_mismatches);
  // Named cases, 16 lanes: overflow to infinity (the largest finite value plus half its last place rounds
  // up, ties to even), a tie that rounds down to even, subnormals, a signalling NaN made quiet.
  {
    std::vector<bf16> p(16, bf16::from_bits(0x7f7f)), q(16, bf16::from_bits(0x7b00)), r(16); // 0x7b00: 2^119
    q[1] = bf16::from_bits(0x7a80);                                                          // 2^118
    p[2] = bf16::from_bits(0x3f80);
    q[2] = bf16::from_bits(0x3b80); // 1 + 2^-8: a tie, rounds to even 1.0
    p[3] = bf16::from_bits(0x0001);
    q[3] = bf16::from_bits(0x0001);
    p[4] = bf16::from_bits(0x7f81); // signalling NaN
    q[4] = bf16::from_bits(0x3f80);
    dpkit::reduce_host(r.data(), p.data(), q.data(), 16, reduce_op::sum);
    CHECK(r[0].bits == 0x7f80);
    CHECK(r[1].bits == 0x7f7f);
    CHECK(r[2].bits == 0x3f80);
    CHECK(r[3].bits == 0x0002);
    CHECK(r[4].bits == 0x7fc1);
  }
#endif
}

TEST_CASE("reduce_op: names, printing, parsing") {
  const reduce_op ops[] = {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::avg};
  const char* names[] = {"sum", "prod", "min", "max", "avg"};
  for (int i = 0; i < 5; ++i) {
    CHECK(dpkit::reduce_op_name(ops[i]) == names[i]);
    CHECK(dpkit::parse_reduce_op(names[i]) == ops[i]);
    std::ostringstream os;
    os << ops[i];
    CHECK(os.str() == names[i]);
  }
  for (const char* bad : {"", "SUM", "sump", "mean", "sum "}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(dpkit::parse_reduce_op(bad), dpkit::invalid_argument);
    try {
      dpkit::parse_reduce_op(bad);
    } catch (const std::invalid_argument& e) { // also catchable as the standard type
      CHECK(std::string(e.what()).find(std::string("'") + bad + "'") != std::string::npos);
    }
  }
}

TEST_CASE("copy_nontemporal equals memcpy at every alignment and length around its 16-byte stores and 64-byte loop") {
  std::vector<unsigned char> src(1000), dst(1100), ref(1100);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  for (std::size_t from : {0u, 1u, 8u})
    for (std::size_t off : {0u, 1u, 15u, 16u, 33u})
      for (std::size_t len : {0u, 1u, 15u, 16u, 63u, 64u, 65u, 127u, 200u, 900u})
        for (bool fence : {true, false}) { // false: the caller fences once after its blocks
          CAPTURE(from);
          CAPTURE(off);
          CAPTURE(len);
          CAPTURE(fence);
          std::fill(dst.begin(), dst.end(), static_cast<unsigned char>(0xAB));
          ref = dst;
          dpkit::detail::copy_nontemporal(dst.data() + off, src.data() + from, len, fence);
          if (!fence) dpkit::detail::store_fence();
          std::memcpy(ref.data() + off, src.data() + from, len);
          CHECK(dst == ref); // and nothing written outside [off, off + len)
        }
}

TEST_CASE("segment_store_tuner: times both kinds, keeps the faster, explores the other, ignores outliers and small chunks") {
  using dpkit::detail::segment_store_tuner;
  using dpkit::detail::segment_stores;
  constexpr std::size_t MiB = std::size_t{1} << 20, chunk = 4 * MiB;
  constexpr std::uint64_t period = segment_store_tuner::explore_period;
  // Feeds one tuned chunk: asks for the kind, records the time that kind
  // takes now (seconds per chunk), returns the kind used.
  auto run = [&](segment_store_tuner& t, double ordinary_s, double nontemporal_s) {
    const bool nt = t.choose();
    t.record(nt, chunk, nt ? nontemporal_s : ordinary_s);
    return nt;
  };
  segment_store_tuner t;
  // ordinary stores until two chunks are timed, then one non-temporal try
  CHECK_FALSE(run(t, 1.0, 2.0));
  CHECK_FALSE(run(t, 1.0, 2.0));
  CHECK(run(t, 1.0, 2.0));
  CHECK(t.seconds_per_byte(false) == doctest::Approx(1.0 / chunk));
  CHECK(t.seconds_per_byte(true) == doctest::Approx(2.0 / chunk));
  // fast phase (ordinary 1.0, non-temporal 2.0): ordinary, but for one
  // chunk in explore_period
  int nt_chunks = 0;
  for (std::uint64_t i = 0; i < 4 * period; ++i) nt_chunks += run(t, 1.0, 2.0);
  CHECK(nt_chunks == 4);
  // slow phase (ordinary 3.0 now): non-temporal from the first explored
  // chunk after the ordinary chunks' window has aged out, at most 2 periods
  std::uint64_t switched_after = 0;
  for (std::uint64_t i = 0; i < 3 * period && !switched_after; ++i)
    if (run(t, 3.0, 2.0) && run(t, 3.0, 2.0)) switched_after = i + 1; // two in a row: not an exploration
  CHECK(switched_after > 0);
  CHECK(switched_after <= 2 * period);
  nt_chunks = 0;
  for (std::uint64_t i = 0; i < 4 * period; ++i) nt_chunks += run(t, 3.0, 2.0);
  CHECK(nt_chunks == static_cast<int>(4 * period - 4)); // the ordinary explorations
  // one slow non-temporal chunk (interference) does not flip the choice
  segment_store_tuner o;
  CHECK_FALSE(run(o, 3.0, 2.0));
  CHECK_FALSE(run(o, 3.0, 2.0));
  CHECK(run(o, 3.0, 2.0));
  CHECK(o.choose());
  o.record(true, chunk, 50.0);
  CHECK(o.choose());
  // within the margin (0.9): ordinary stores are kept
  segment_store_tuner m;
  for (int i = 0; i < 2 * static_cast<int>(period); ++i) run(m, 1.0, 0.95);
  CHECK_FALSE(m.choose());
  // chunks under min_bytes and non-positive times are not recorded
  segment_store_tuner s;
  s.record(false, segment_store_tuner::min_bytes - 1, 1.0);
  s.record(false, chunk, 0.0);
  CHECK(s.seconds_per_byte(false) == 0.0);
  // force() fixes the kind
  s.force(segment_stores::nontemporal);
  CHECK(s.choose());
  s.force(segment_stores::ordinary);
  for (int i = 0; i < 3; ++i) CHECK_FALSE(run(s, 3.0, 1.0));
}
