// Helpers shared by the fusion tests: model files, typed gradient buffers with
// integer-valued contents, and the per-tensor all-reduce reference.
#pragma once

#include <dpkit/collectives.hpp>
#include <dpkit/fusion/gradient_reducer.hpp>
#include <dpkit/fusion/model_spec.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace fusion_test {

// Model files relative to the test's working directory (the source root).
inline std::string model_path(const std::string& name) { return "data/models/" + name + ".tsv"; }

// The model with every tensor's element count divided by `div`, rounded up.
inline dpkit::model_spec scaled(dpkit::model_spec s, std::size_t div) {
  for (auto& p : s.params) {
    p.numel = (p.numel + div - 1) / div;
    p.bytes = p.numel * dpkit::element_size(p.type);
  }
  return s;
}

// One gradient tensor of a runtime element type (8-byte aligned storage).
struct typed_buffer {
  dpkit::element_type type = dpkit::element_type::f32;
  std::size_t count = 0;
  std::vector<std::uint64_t> store;
  typed_buffer(dpkit::element_type t, std::size_t n)
      : type(t), count(n), store((n * dpkit::element_size(t) + 7) / 8 + 1, 0) {}
  void* data() { return store.data(); }
  std::size_t bytes() const { return count * dpkit::element_size(type); }
  dpkit::gradient_ref ref() { return {data(), count, type, dpkit::memory_space::host}; }
  // Sets element k to the (exactly representable) value v.
  void set(std::size_t k, float v) {
    dpkit::visit_element_type(type, [&](auto z) {
      using T = decltype(z);
      static_cast<T*>(data())[k] = static_cast<T>(v);
    });
  }
  float get(std::size_t k) {
    float out = 0;
    dpkit::visit_element_type(type, [&](auto z) {
      using T = decltype(z);
      out = static_cast<float>(static_cast<T*>(data())[k]);
    });
    return out;
  }
  bool same_bytes(const typed_buffer& o) const {
    return count == o.count && type == o.type && std::memcmp(store.data(), o.store.data(), bytes()) == 0;
  }
};

inline std::vector<typed_buffer> make_grads(const dpkit::model_spec& s) {
  std::vector<typed_buffer> v;
  v.reserve(s.params.size());
  for (const auto& p : s.params) v.emplace_back(p.type, p.numel);
  return v;
}

inline std::vector<dpkit::gradient_ref> refs(std::vector<typed_buffer>& g) {
  std::vector<dpkit::gradient_ref> r;
  for (auto& b : g) r.push_back(b.ref());
  return r;
}

// Small integer in [-4, 4] (exact in every float type, sums exact).
inline float int_value(int rank, int step, std::size_t param, std::size_t k) {
  return static_cast<float>(static_cast<int>((static_cast<std::size_t>(rank) * 7 + static_cast<std::size_t>(step) * 3 +
                                              param * 5 + k * 11 + (k >> 3)) % 9) - 4);
}

inline void fill(std::vector<typed_buffer>& g, int rank, int step) {
  for (std::size_t i = 0; i < g.size(); ++i)
    for (std::size_t k = 0; k < g[i].count; ++k) g[i].set(k, int_value(rank, step, i, k));
}

// Plain per-tensor all-reduce of every gradient (the reference).
template <class C>
void per_tensor_allreduce(C& comm, std::vector<typed_buffer>& g, dpkit::reduce_op op) {
  for (auto& b : g)
    dpkit::visit_element_type(b.type, [&](auto z) {
      using T = decltype(z);
      dpkit::tensor_view<T> v{static_cast<T*>(b.data()), b.count, dpkit::memory_space::host};
      dpkit::allreduce(comm, v, v, op);
    });
}

// Index of the first differing tensor, or -1.
inline long first_mismatch(const std::vector<typed_buffer>& a, const std::vector<typed_buffer>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!a[i].same_bytes(b[i])) return static_cast<long>(i);
  return -1;
}

// Small caps so the scaled-down models still span many buckets.
inline dpkit::reducer_options small_opts() {
  dpkit::reducer_options o;
  o.buckets = {1024, 25 * 1024};
  return o;
}

// A random permutation of 0..n-1 (a rank's local gradient-ready order).
inline std::vector<std::size_t> random_order(std::size_t n, unsigned seed) {
  std::vector<std::size_t> v(n);
  std::iota(v.begin(), v.end(), std::size_t{0});
  std::mt19937 g(seed);
  std::shuffle(v.begin(), v.end(), g);
  return v;
}

} // namespace fusion_test
