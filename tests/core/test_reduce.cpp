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
      for (std::size_t len : {0u, 1u, 15u, 16u, 63u, 64u, 65u, 127u, 200u, 900u}) {
        CAPTURE(from);
        CAPTURE(off);
        CAPTURE(len);
        std::fill(dst.begin(), dst.end(), static_cast<unsigned char>(0xAB));
        ref = dst;
        dpkit::detail::copy_nontemporal(dst.data() + off, src.data() + from, len);
        std::memcpy(ref.data() + off, src.data() + from, len);
        CHECK(dst == ref); // and nothing written outside [off, off + len)
      }
}
