// General (non-integer) floating-point inputs: results within a stated error
// bound of an exact-as-possible sequential reference (long double), and
// bitwise identical on every rank.
#include "common.hpp"

#include <cmath>
#include <random>

using namespace dpt;

namespace {

template <class T>
double unit_roundoff() {
  if constexpr (std::is_same_v<T, float>) return std::ldexp(1.0, -24);
  else if constexpr (std::is_same_v<T, double>) return std::ldexp(1.0, -53);
  else if constexpr (std::is_same_v<T, dpkit::f16>) return std::ldexp(1.0, -11);
  else return std::ldexp(1.0, -8);
}
// Smallest positive subnormal (bounds absolute rounding error near zero).
template <class T>
long double tiny() {
  if constexpr (std::is_same_v<T, dpkit::f16>) return std::ldexp(1.0L, -24);
  else return 0.0L;
}

template <class T>
T random_input(int rank, std::size_t i) {
  // Values in [-1, 1] with varied magnitudes, exactly representable in T.
  const std::uint64_t h = mix(static_cast<std::uint64_t>(rank) << 40 ^ i);
  const double u = static_cast<double>(h >> 11) * std::ldexp(1.0, -53) * 2.0 - 1.0;
  const double scale = std::ldexp(1.0, -static_cast<int>((h >> 3) % 6));
  if constexpr (is16<T>) return T(static_cast<float>(u * scale));
  else return static_cast<T>(u * scale);
}

} // namespace

TEST_CASE_TEMPLATE("floating-point sum/avg: within (n-1)*u*sum|x| of the exact sum, identical on all ranks", T,
                   float, double, dpkit::f16, dpkit::bf16) {
  const double u = unit_roundoff<T>();
  for (int n : test_sizes::worlds({2, 3, 5, 8, 13, 16})) {
    for (std::size_t count : {std::size_t{1}, static_cast<std::size_t>(2 * n + 1), std::size_t{10007}}) {
      for (reduce_op op : {reduce_op::sum, reduce_op::avg}) {
        for (kind k : {kind::ar_ring, kind::ar_tree, kind::ar_auto, kind::reduce_scatter, kind::reduce}) {
          dpkit::collective_options o;
          o.segment_bytes = 256;
          const std::size_t nn = static_cast<std::size_t>(n);
          const std::size_t total = k == kind::reduce_scatter ? count * nn : count;
          dpkit::inproc_world world(n);
          std::vector<std::vector<T>> got(nn);
          world.run([&](dpkit::inproc& comm) {
            std::vector<T> in(total);
            for (std::size_t i = 0; i < total; ++i) in[i] = random_input<T>(comm.rank(), i);
            std::vector<T> out(k == kind::reduce_scatter ? count : total);
            if (k == kind::ar_ring) dpkit::allreduce_ring(comm, in, out, op, o);
            else if (k == kind::ar_tree) dpkit::allreduce_tree(comm, in, out, op, o);
            else if (k == kind::ar_auto) dpkit::allreduce(comm, in, out, op, {}, o);
            else if (k == kind::reduce_scatter) dpkit::reduce_scatter_ring(comm, in, out, op, o);
            else dpkit::reduce_tree(comm, in, out, op, 1 % n, o);
            got[static_cast<std::size_t>(comm.rank())] = std::move(out);
          });
          int bad = 0;
          for (int r = 0; r < n && bad < 3; ++r) {
            if (k == kind::reduce && r != 1 % n) continue;
            const auto& g = got[static_cast<std::size_t>(r)];
            const std::size_t base = k == kind::reduce_scatter ? static_cast<std::size_t>(r) * count : 0;
            for (std::size_t i = 0; i < g.size() && bad < 3; ++i) {
              long double exact = 0, mag = 0;
              for (int q = 0; q < n; ++q) {
                const long double x = to_double(random_input<T>(q, base + i));
                exact += x; // exact: <= 16 terms of <= 24 significant bits fit in 64
                mag += std::fabs(x);
              }
              long double bound = (n - 1) * u * mag * (1 + 1e-6L) + (n - 1) * tiny<T>();
              if (op == reduce_op::avg) {
                exact /= n;
                bound = bound / n + u * std::fabs(exact) * 1.000001L + tiny<T>() + u * u * mag;
              }
              const long double err = std::fabs(static_cast<long double>(to_double(g[i])) - exact);
              if (!(err <= bound)) {
                ++bad;
                FAIL_CHECK(kind_name(k) << " n=" << n << " count=" << count << " op=" << op << " rank " << r << " ["
                                        << i << "] = " << to_double(g[i]) << ", exact " << static_cast<double>(exact)
                                        << ", |err| " << static_cast<double>(err) << " > bound "
                                        << static_cast<double>(bound));
              }
            }
            if (replicated(k) && r > 0 &&
                std::memcmp(got[0].data(), g.data(), g.size() * sizeof(T)) != 0) {
              ++bad;
              FAIL_CHECK(kind_name(k) << " n=" << n << " count=" << count << ": rank " << r
                                      << " differs bitwise from rank 0");
            }
          }
          CHECK(bad == 0);
        }
      }
    }
  }
}
