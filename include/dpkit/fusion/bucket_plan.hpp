/// @file bucket_plan.hpp
/// @brief Bucket assignment for gradient fusion: `plan_buckets` groups
/// parameters into buckets the way torch DDP's Reducer does
/// (`compute_bucket_assignment_by_size` in
/// torch/csrc/distributed/c10d/reducer.cpp), and `plan_buckets_from_order`
/// rebuilds the assignment from an observed gradient-ready order (DDP's
/// `rebuild_buckets` after the first iteration).
///
/// Semantics (see docs/fusion.md for the exact differences from torch):
/// - parameters are visited in *reverse registration order* (the order in
///   which backward produces their gradients), or in the given ready order;
/// - a bucket holds one element type and one memory space (torch's BucketKey
///   of dtype and device); each (type, space) key has its own open bucket;
/// - each key walks the size limits `[first_bucket_bytes, bucket_cap_bytes]`:
///   its first bucket closes at `first_bucket_bytes` (1 MiB default, torch's
///   `_DEFAULT_FIRST_BUCKET_BYTES`), every later one at `bucket_cap_bytes`
///   (25 MiB default, DDP's `bucket_cap_mb=25`);
/// - a bucket closes as soon as its size is `>=` its limit *after* adding the
///   parameter (as torch), so a bucket may exceed its limit by at most one
///   parameter and a parameter larger than the limit sits alone in its bucket;
/// - buckets are numbered in the order they become complete in the visiting
///   order (the position of their last parameter), which is the order every
///   rank launches their all-reduces in.
#pragma once

#include "../core/element.hpp"
#include "../core/errors.hpp"
#include "../core/tensor.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <ostream>
#include <span>
#include <string>
#include <vector>

namespace dpkit {

/// One parameter as the planner sees it: the size of its gradient in bytes,
/// its element type and memory space. `bytes` must be a multiple of
/// element_size(type).
struct param_info {
  std::size_t bytes = 0;                      ///< gradient size in bytes
  element_type type = element_type::f32;      ///< gradient element type
  memory_space space = memory_space::host;    ///< where the gradient lives
  friend bool operator==(const param_info&, const param_info&) = default;
};

/// Bucket size limits (bytes), a regular aggregate that compares and prints.
/// Defaults are torch DDP's: first bucket 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`),
/// the rest 25 MiB (`bucket_cap_mb=25`).
struct bucket_policy {
  std::size_t first_bucket_bytes = std::size_t{1} << 20; ///< limit of each key's first bucket, bytes
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;  ///< limit of every later bucket, bytes
  friend bool operator==(const bucket_policy&, const bucket_policy&) = default;
};

/// Prints "bucket_policy{first_bucket_bytes=..., bucket_cap_bytes=...}".
inline std::ostream& operator<<(std::ostream& os, const bucket_policy& p) {
  return os << "bucket_policy{first_bucket_bytes=" << p.first_bucket_bytes
            << ", bucket_cap_bytes=" << p.bucket_cap_bytes << "}";
}

/// One bucket: parameter indices (registration indices, in the order they
/// were visited, which is also their order inside the flat buffer), the
/// common element type and memory space, the total size in bytes and the
/// limit that was in force when the bucket was filled.
struct bucket {
  std::vector<std::size_t> params;           ///< parameter indices, buffer order
  element_type type = element_type::f32;     ///< element type of every parameter
  memory_space space = memory_space::host;   ///< memory space of every parameter
  std::size_t bytes = 0;                     ///< sum of the parameters' bytes
  std::size_t limit_bytes = 0;               ///< size limit used for this bucket, bytes
  friend bool operator==(const bucket&, const bucket&) = default;
};

/// A bucket assignment: buckets in launch order (bucket 0 is all-reduced
/// first on every rank). Compares equal member-wise; prints one bucket a line.
struct bucket_plan {
  std::vector<bucket> buckets; ///< in launch order

  /// Number of buckets.
  std::size_t size() const noexcept { return buckets.size(); }
  /// True when there are no buckets (no parameters).
  bool empty() const noexcept { return buckets.empty(); }
  /// Sum of all buckets' bytes.
  std::size_t total_bytes() const noexcept {
    std::size_t s = 0;
    for (const auto& b : buckets) s += b.bytes;
    return s;
  }
  /// A 64-bit FNV-1a hash of the whole assignment (indices, types, spaces,
  /// sizes, limits). Equal plans have equal fingerprints; gradient_reducer
  /// compares fingerprints across ranks to detect mismatched plans.
  std::uint64_t fingerprint() const noexcept {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= 1099511628211ull;
      }
    };
    mix(buckets.size());
    for (const auto& b : buckets) {
      mix(static_cast<std::uint64_t>(b.type));
      mix(static_cast<std::uint64_t>(b.space));
      mix(b.bytes);
      mix(b.limit_bytes);
      mix(b.params.size());
      for (auto p : b.params) mix(p);
    }
    return h;
  }
  friend bool operator==(const bucket_plan&, const bucket_plan&) = default;
};

/// Prints "bucket_plan{N buckets, B bytes" then, one per line, "  [k] TYPE SPACE
/// BYTES bytes (limit L) params {i, j..k, ...}" (runs of consecutive indices,
/// ascending or descending, are written "a..b"), then "}".
inline std::ostream& operator<<(std::ostream& os, const bucket_plan& p) {
  os << "bucket_plan{" << p.size() << " buckets, " << p.total_bytes() << " bytes";
  for (std::size_t k = 0; k < p.buckets.size(); ++k) {
    const auto& b = p.buckets[k];
    os << "\n  [" << k << "] " << b.type << " " << b.space << " " << b.bytes << " bytes (limit " << b.limit_bytes
       << ") params {";
    const auto& v = b.params;
    for (std::size_t i = 0; i < v.size();) {
      std::size_t j = i;
      const bool down = i + 1 < v.size() && v[i + 1] + 1 == v[i];
      while (j + 1 < v.size() && (down ? v[j + 1] + 1 == v[j] : v[j + 1] == v[j] + 1)) ++j;
      if (i) os << ", ";
      os << v[i];
      if (j > i) os << ".." << v[j];
      i = j + 1;
    }
    os << "}";
  }
  return os << (p.empty() ? "}" : "\n}");
}

namespace detail {

inline void check_param_infos(std::span<const param_info> params, const char* who) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto es = element_size(params[i].type);
    if (es == 0 || params[i].bytes % es != 0)
      throw invalid_argument(std::string(who) + ": parameter " + std::to_string(i) + " has " +
                             std::to_string(params[i].bytes) + " bytes, not a multiple of the " +
                             std::string(element_type_name(params[i].type)) + " element size " +
                             std::to_string(es));
  }
}

// The core of torch's compute_bucket_assignment_by_size, visiting `order`.
inline bucket_plan assign_buckets(std::span<const param_info> params, std::span<const std::size_t> order,
                                  const bucket_policy& policy) {
  const std::size_t limits[2] = {policy.first_bucket_bytes, policy.bucket_cap_bytes};
  struct open_bucket {
    element_type type;
    memory_space space;
    int limit_index = 0; // per key, as torch's bucket_size_limit_iterators
    bucket acc;
  };
  struct closed {
    std::size_t last_pos; // position in `order` of the bucket's last parameter
    bucket b;
  };
  std::vector<open_bucket> open;
  std::vector<closed> done;
  for (std::size_t pos = 0; pos < order.size(); ++pos) {
    const std::size_t i = order[pos];
    const param_info& p = params[i];
    auto it = std::find_if(open.begin(), open.end(),
                           [&](const open_bucket& o) { return o.type == p.type && o.space == p.space; });
    if (it == open.end()) {
      open.push_back({p.type, p.space, 0, {}});
      it = std::prev(open.end());
    }
    it->acc.params.push_back(i);
    it->acc.bytes += p.bytes;
    const std::size_t limit = limits[it->limit_index];
    if (it->acc.bytes >= limit) {
      it->acc.type = p.type;
      it->acc.space = p.space;
      it->acc.limit_bytes = limit;
      done.push_back({pos, std::move(it->acc)});
      it->acc = bucket{};
      it->limit_index = 1;
    }
  }
  // Leftover (not full) buckets complete at the position of their last parameter.
  std::vector<std::size_t> pos_of(params.size());
  for (std::size_t pos = 0; pos < order.size(); ++pos) pos_of[order[pos]] = pos;
  for (auto& o : open) {
    if (o.acc.params.empty()) continue;
    o.acc.type = o.type;
    o.acc.space = o.space;
    o.acc.limit_bytes = limits[o.limit_index];
    const std::size_t last = pos_of[o.acc.params.back()];
    done.push_back({last, std::move(o.acc)});
  }
  std::stable_sort(done.begin(), done.end(), [](const closed& a, const closed& b) { return a.last_pos < b.last_pos; });
  bucket_plan plan;
  plan.buckets.reserve(done.size());
  for (auto& c : done) plan.buckets.push_back(std::move(c.b));
  return plan;
}

} // namespace detail

/// Initial bucket assignment: visits the parameters in reverse registration
/// order (index n-1 down to 0) and fills buckets as described in the file
/// comment (matches torch DDP's compute_bucket_assignment_by_size with limits
/// [first_bucket_bytes, bucket_cap_bytes], except that torch fills its initial
/// buckets in registration order and reverses the bucket list; see
/// docs/fusion.md).
///
/// @param params  one entry per parameter, in registration order.
/// @param policy  size limits in bytes.
/// @returns buckets in launch order; every parameter appears in exactly one.
/// @throws dpkit::invalid_argument if a parameter's bytes are not a multiple
///         of its element size (naming the parameter index).
inline bucket_plan plan_buckets(std::span<const param_info> params, const bucket_policy& policy = {}) {
  detail::check_param_infos(params, "plan_buckets");
  std::vector<std::size_t> order(params.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
  return detail::assign_buckets(params, order, policy);
}

/// Rebuilt bucket assignment from an observed gradient-ready order (torch
/// DDP's rebuild_buckets: compute_bucket_assignment_by_size over
/// `rebuilt_param_indices_` with limits [first_bucket_bytes, bucket_cap_bytes]).
///
/// @param params       one entry per parameter, in registration order.
/// @param ready_order  a permutation of [0, params.size()): the order in
///                     which gradients became ready in a previous step.
/// @param policy       size limits in bytes.
/// @returns buckets in launch order (the order they fill in `ready_order`).
/// @throws dpkit::invalid_argument if ready_order is not a permutation of the
///         parameter indices (naming the offending position and index) or a
///         parameter's bytes are not a multiple of its element size.
inline bucket_plan plan_buckets_from_order(std::span<const param_info> params,
                                           std::span<const std::size_t> ready_order,
                                           const bucket_policy& policy = {}) {
  detail::check_param_infos(params, "plan_buckets_from_order");
  if (ready_order.size() != params.size())
    throw invalid_argument("plan_buckets_from_order: ready order has " + std::to_string(ready_order.size()) +
                           " entries, expected one per parameter (" + std::to_string(params.size()) + ")");
  std::vector<bool> seen(params.size(), false);
  for (std::size_t pos = 0; pos < ready_order.size(); ++pos) {
    const std::size_t i = ready_order[pos];
    if (i >= params.size())
      throw invalid_argument("plan_buckets_from_order: ready order position " + std::to_string(pos) +
                             " names parameter " + std::to_string(i) + ", out of range for " +
                             std::to_string(params.size()) + " parameters");
    if (seen[i])
      throw invalid_argument("plan_buckets_from_order: ready order names parameter " + std::to_string(i) +
                             " twice (again at position " + std::to_string(pos) + ")");
    seen[i] = true;
  }
  return detail::assign_buckets(params, ready_order, policy);
}

} // namespace dpkit
