// Shared driver for the collective tests: deterministic integer-valued inputs
// (so every op is exact in every element type), an independent sequential
// reference, and checks that results equal it bit for bit on every rank and
// are bitwise identical across ranks.
#pragma once

#include <dpkit/dpkit.hpp>

#include "../test_sizes.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <stdexcept>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

// The element types the typed collective tests run. Every type in the release
// build (GCC, the README's test command). The sanitizer builds compile the
// same tests again and pay for each type in compile time, so scripts/test.sh
// narrows them; the reduction kernels themselves run every type under
// ASan/UBSan in tests/core/test_reduce.cpp, which keeps its own list:
// - DPKIT_TEST_TYPES_BY_SIZE (ASan/UBSan): one type of each element size,
//   1, 2, 4 and 8 bytes (a memory error depends on the element's size, which
//   every type of that size shares with the algorithms' code);
// - DPKIT_TEST_TYPES_THREADS (TSan): float and int8: which thread touches
//   what, and when, does not depend on the element type.
// DPT_FOR_EACH_ELEMENT_TYPE(X) expands X(T) for each of those types.
#if defined(DPKIT_TEST_TYPES_THREADS)
#define DPKIT_ELEMENT_TYPES float, std::int8_t
#define DPT_FOR_EACH_ELEMENT_TYPE(X) X(float) X(std::int8_t)
#elif defined(DPKIT_TEST_TYPES_BY_SIZE)
#define DPKIT_ELEMENT_TYPES float, double, dpkit::bf16, std::int8_t
#define DPT_FOR_EACH_ELEMENT_TYPE(X) X(float) X(double) X(dpkit::bf16) X(std::int8_t)
#else
#define DPKIT_ELEMENT_TYPES float, double, dpkit::f16, dpkit::bf16, std::int8_t, std::uint8_t, std::int32_t, \
                            std::uint32_t, std::int64_t, std::uint64_t
#define DPT_FOR_EACH_ELEMENT_TYPE(X)                                                                               \
  X(float) X(double) X(dpkit::f16) X(dpkit::bf16) X(std::int8_t) X(std::uint8_t) X(std::int32_t) X(std::uint32_t)   \
      X(std::int64_t) X(std::uint64_t)
#endif

namespace dpt {

using dpkit::reduce_op;
inline constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max,
                                        reduce_op::avg};
inline constexpr int world_sizes[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16};

template <class T>
constexpr bool is16 = std::is_same_v<T, dpkit::f16> || std::is_same_v<T, dpkit::bf16>;
template <class T>
constexpr bool is_signed_elem = is16<T> || std::is_signed_v<T>;

template <class T>
T to_T(long long v) {
  if constexpr (is16<T>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}
template <class T>
double to_double(T v) {
  if constexpr (is16<T>) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Small integer input of `rank` at element i, chosen so that every partial
// result of op over <= 16 ranks is exact in every element type (|sum| <= 48,
// |prod| <= 64, min/max in [-100, 100]).
inline long long gen(reduce_op op, bool sgn, int rank, std::size_t i, std::uint64_t salt = 0) {
  const std::uint64_t h = mix(static_cast<std::uint64_t>(rank) * 0x100000001b3ull ^ (i * 0x9e37ull + salt));
  switch (op) {
  case reduce_op::sum: case reduce_op::avg: return sgn ? static_cast<long long>(h % 7) - 3 : static_cast<long long>(h % 7);
  case reduce_op::prod: {
    const auto m = h % 16;
    if (m == 0 && rank < 6) return 2;
    if (m == 1 && sgn) return -1;
    return 1;
  }
  case reduce_op::min: case reduce_op::max:
    return sgn ? static_cast<long long>(h % 201) - 100 : static_cast<long long>(h % 201);
  }
  return 0;
}

template <class T>
std::vector<T> make_input(reduce_op op, int rank, std::size_t count, std::size_t offset = 0, std::uint64_t salt = 0) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = to_T<T>(gen(op, is_signed_elem<T>, rank, offset + i, salt));
  return v;
}

// Sequential reference: op over ranks 0..n-1 of element i, in exact integer
// arithmetic, then converted to T (avg: divided as the documented semantics:
// integers truncate, floats divide in their own precision, f16/bf16 in f32).
template <class T>
T reference(reduce_op op, int n, std::size_t i, std::uint64_t salt = 0) {
  const bool sgn = is_signed_elem<T>;
  long long acc = gen(op, sgn, 0, i, salt);
  for (int r = 1; r < n; ++r) {
    const long long x = gen(op, sgn, r, i, salt);
    switch (op) {
    case reduce_op::sum: case reduce_op::avg: acc += x; break;
    case reduce_op::prod: acc *= x; break;
    case reduce_op::min: acc = x < acc ? x : acc; break;
    case reduce_op::max: acc = x > acc ? x : acc; break;
    }
  }
  if (op != reduce_op::avg || n == 1) return to_T<T>(acc);
  if constexpr (is16<T>) return T(static_cast<float>(acc) / static_cast<float>(n));
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(static_cast<T>(acc) / static_cast<T>(n));
  else return static_cast<T>(acc / n);
}

// A sentinel value (a byte pattern no reference produces).
template <class T>
T sentinel() {
  T v;
  std::memset(static_cast<void*>(&v), 0x5a, sizeof(T));
  return v;
}

enum class kind { ar_ring, ar_tree, ar_auto, reduce_scatter, allgather, broadcast, reduce };
inline const char* kind_name(kind k) {
  switch (k) {
  case kind::ar_ring: return "allreduce_ring";
  case kind::ar_tree: return "allreduce_tree";
  case kind::ar_auto: return "allreduce(automatic)";
  case kind::reduce_scatter: return "reduce_scatter_ring";
  case kind::allgather: return "allgather_ring";
  case kind::broadcast: return "broadcast_tree";
  case kind::reduce: return "reduce_tree";
  }
  return "?";
}

struct config {
  kind k;
  std::size_t count; // all-reduce/bcast/reduce: elements; reduce-scatter: per-rank output; all-gather: per-rank input
  reduce_op op = reduce_op::sum;
  bool in_place = false;
  dpkit::collective_options o{};
  int root = 0;
  std::uint64_t salt = 0;
  bool shm = false; // reduce_scatter, allgather, broadcast, reduce: algorithm::shm instead of ring/tree
  std::string describe(int n) const {
    std::ostringstream os;
    os << kind_name(k) << (shm ? "(shm)" : "") << " n=" << n << " count=" << count << " op=" << op << (in_place ? " in-place" : " out-of-place")
       << " segment_bytes=" << o.segment_bytes << " depth=" << o.pipeline_depth << " root=" << root;
    return os.str();
  }
};

// Runs one configuration on this rank of any transport (inproc here; the
// Gloo suite runs the same configurations); returns the whole output buffer.
template <class T, class C>
std::vector<T> run_on_rank(C& comm, const config& cfg) {
  // A hang (deadlock) must fail the test, not stall it for the default 30 min.
  config c = cfg;
  c.o.timeout = std::min(c.o.timeout, std::chrono::milliseconds(60000));
  const int r = comm.rank(), n = comm.size();
  const std::size_t nn = static_cast<std::size_t>(n);
  switch (c.k) {
  case kind::ar_ring: case kind::ar_tree: case kind::ar_auto: {
    auto in = make_input<T>(c.op, r, c.count, 0, c.salt);
    auto run = [&](auto& i, auto& o) {
      if (c.k == kind::ar_ring) dpkit::allreduce_ring(comm, i, o, c.op, c.o);
      else if (c.k == kind::ar_tree) dpkit::allreduce_tree(comm, i, o, c.op, c.o);
      else dpkit::allreduce(comm, i, o, c.op, dpkit::allreduce_policy{}, c.o);
    };
    if (c.in_place) {
      if (c.k == kind::ar_ring) dpkit::allreduce_ring(comm, in, c.op, c.o);
      else if (c.k == kind::ar_tree) dpkit::allreduce_tree(comm, in, c.op, c.o);
      else dpkit::allreduce(comm, in, c.op, dpkit::allreduce_policy{}, c.o);
      return in;
    }
    std::vector<T> out(c.count, sentinel<T>());
    const std::vector<T> saved = in;
    run(in, out);
    if (!in.empty() && std::memcmp(saved.data(), in.data(), in.size() * sizeof(T)) != 0)
      throw std::runtime_error(c.describe(n) + ": rank " + std::to_string(r) + ": out-of-place input was modified");
    return out;
  }
  case kind::reduce_scatter: {
    // Global input index of rank r element j is j (the same index space on every rank).
    auto in = make_input<T>(c.op, r, c.count * nn, 0, c.salt);
    if (c.in_place) {
      if (c.shm) dpkit::reduce_scatter(comm, in, c.op, dpkit::algorithm::shm, c.o);
      else dpkit::reduce_scatter_ring(comm, in, c.op, c.o);
      return in;
    }
    std::vector<T> out(c.count, sentinel<T>());
    if (c.shm) dpkit::reduce_scatter(comm, in, out, c.op, dpkit::algorithm::shm, c.o);
    else dpkit::reduce_scatter_ring(comm, in, out, c.op, c.o);
    return out;
  }
  case kind::allgather: {
    auto in = make_input<T>(c.op, r, c.count, 0, c.salt);
    std::vector<T> out(c.count * nn, sentinel<T>());
    if (c.in_place) {
      std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * c.count));
      if (c.shm) dpkit::allgather(comm, out, dpkit::algorithm::shm, c.o);
      else dpkit::allgather_ring(comm, out, c.o);
    } else {
      if (c.shm) dpkit::allgather(comm, in, out, dpkit::algorithm::shm, c.o);
      else dpkit::allgather_ring(comm, in, out, c.o);
    }
    return out;
  }
  case kind::broadcast: {
    // Non-root ranks hold different data that must be overwritten.
    auto buf = make_input<T>(c.op, r, c.count, 0, c.salt);
    const auto a = c.shm ? dpkit::algorithm::shm : dpkit::algorithm::tree;
    if (c.in_place) {
      dpkit::broadcast(comm, buf, c.root, a, c.o);
      return buf;
    }
    std::vector<T> out(c.count, sentinel<T>());
    if (r == c.root) dpkit::broadcast(comm, buf, out, c.root, a, c.o);
    else dpkit::broadcast(comm, std::vector<T>{}, out, c.root, a, c.o); // input ignored off root
    return out;
  }
  case kind::reduce: {
    auto in = make_input<T>(c.op, r, c.count, 0, c.salt);
    std::vector<T> out(c.count, sentinel<T>());
    if (c.shm) dpkit::reduce(comm, in, out, c.op, c.root, dpkit::algorithm::shm, c.o);
    else dpkit::reduce_tree(comm, in, out, c.op, c.root, c.o);
    return out;
  }
  }
  return {};
}

// The expected output buffer of rank r.
template <class T>
std::vector<T> expected(const config& c, int n, int r) {
  const std::size_t nn = static_cast<std::size_t>(n), rr = static_cast<std::size_t>(r);
  std::vector<T> e;
  switch (c.k) {
  case kind::ar_ring: case kind::ar_tree: case kind::ar_auto:
    e.resize(c.count);
    for (std::size_t i = 0; i < c.count; ++i) e[i] = reference<T>(c.op, n, i, c.salt);
    break;
  case kind::reduce_scatter:
    if (c.in_place) {
      e = make_input<T>(c.op, r, c.count * nn, 0, c.salt);
      for (std::size_t i = 0; i < c.count; ++i) e[rr * c.count + i] = reference<T>(c.op, n, rr * c.count + i, c.salt);
    } else {
      e.resize(c.count);
      for (std::size_t i = 0; i < c.count; ++i) e[i] = reference<T>(c.op, n, rr * c.count + i, c.salt);
    }
    break;
  case kind::allgather:
    e.resize(c.count * nn);
    for (int k = 0; k < n; ++k) {
      auto part = make_input<T>(c.op, k, c.count, 0, c.salt);
      std::copy(part.begin(), part.end(), e.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(k) * c.count));
    }
    break;
  case kind::broadcast:
    e = make_input<T>(c.op, c.root, c.count, 0, c.salt);
    break;
  case kind::reduce:
    e.assign(c.count, sentinel<T>());
    if (r == c.root)
      for (std::size_t i = 0; i < c.count; ++i) e[i] = reference<T>(c.op, n, i, c.salt);
    break;
  }
  return e;
}

// True when every rank must end with the same bytes.
inline bool replicated(kind k) {
  return k == kind::ar_ring || k == kind::ar_tree || k == kind::ar_auto || k == kind::allgather ||
         k == kind::broadcast;
}

template <class T>
int check_results(int n, const std::vector<config>& cfgs, const std::vector<std::vector<std::vector<T>>>& got);

// Runs all configurations on a world of n ranks (one world.run, every rank
// executes the same sequence) and checks every result. Returns failures.
template <class T>
int run_and_check(int n, const std::vector<config>& cfgs, std::size_t shm_bytes = std::size_t{256} << 10) {
  dpkit::inproc_world world(n, nullptr, shm_bytes);
  std::vector<std::vector<std::vector<T>>> got(static_cast<std::size_t>(n));
  std::string error;
  try {
    world.run([&](dpkit::inproc& comm) {
      auto& mine = got[static_cast<std::size_t>(comm.rank())];
      for (const auto& c : cfgs) mine.push_back(run_on_rank<T>(comm, c));
    });
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!error.empty()) {
    FAIL_CHECK("n=" << n << ": collective threw: " << error);
    return 1;
  }
  return check_results<T>(n, cfgs, got);
}

// run_and_check<T> (every algorithm of every kind over inproc, for T) is
// compiled once, in run_and_check.cpp, for each type of DPKIT_ELEMENT_TYPES,
// instead of again in each of the five test files that call it: that cut
// the collective tests' build by a third in each of CI's three builds.
// Other types (test_large's int32 in the sanitizer builds) are instantiated
// where they are used, as any template.
#ifndef DPT_RUN_AND_CHECK_INSTANTIATE
#define DPT_RUN_AND_CHECK_EXTERN(T) \
  extern template int run_and_check<T>(int, const std::vector<config>&, std::size_t);
DPT_FOR_EACH_ELEMENT_TYPE(DPT_RUN_AND_CHECK_EXTERN)
#undef DPT_RUN_AND_CHECK_EXTERN
#endif

// Checks got[rank][config] (the outputs of run_on_rank on every rank of a
// world of n) against the sequential reference and, where every rank must
// hold the same bytes, against rank 0. Returns failures.
template <class T>
int check_results(int n, const std::vector<config>& cfgs, const std::vector<std::vector<std::vector<T>>>& got) {
  int failures = 0;
  for (std::size_t ci = 0; ci < cfgs.size(); ++ci) {
    const auto& c = cfgs[ci];
    std::vector<T> e;
    for (int r = 0; r < n; ++r) {
      const auto& g = got[static_cast<std::size_t>(r)][ci];
      if (r == 0 || !replicated(c.k)) e = expected<T>(c, n, r); // replicated: the same for every rank
      if (g.size() != e.size()) {
        FAIL_CHECK(c.describe(n) << ": rank " << r << " output size " << g.size() << ", want " << e.size());
        ++failures;
        continue;
      }
      for (std::size_t i = 0; i < e.size(); ++i)
        if (std::memcmp(&g[i], &e[i], sizeof(T)) != 0) {
          FAIL_CHECK(c.describe(n) << ": rank " << r << " [" << i << "] = " << to_double(g[i]) << ", want "
                                   << to_double(e[i]));
          ++failures;
          break;
        }
      if (replicated(c.k) && r > 0) {
        const auto& g0 = got[0][ci];
        if (g0.size() != g.size() || (!g.empty() && std::memcmp(g0.data(), g.data(), g.size() * sizeof(T)) != 0)) {
          FAIL_CHECK(c.describe(n) << ": rank " << r << " differs bitwise from rank 0");
          ++failures;
        }
      }
      if (failures > 10) return failures;
    }
  }
  return failures;
}

// Element counts for world size n: 0, 1, fewer than ranks, not divisible, a prime.
inline std::vector<std::size_t> counts_for(int n, bool with_prime = true) {
  const std::size_t nn = static_cast<std::size_t>(n);
  std::set<std::size_t> s{0, 1, nn > 1 ? nn - 1 : 1, nn, 2 * nn + 1};
  if (with_prime) s.insert(10007);
  return {s.begin(), s.end()};
}

} // namespace dpt
