// dpkit._dist_ext, shared by every room of the backend: the includes, the
// torch version's base class, the transports a group runs on, reduce ops,
// and the views of a torch tensor that dpkit's collectives take (for
// reductions: the element type, with Gloo's rules for bool and complex; for
// moving data: the element type, or the bytes where dpkit has no such type).
#pragma once

#if DPKIT_DIST_MPI
#include <mpi.h>
#include <dpkit/transport/mpi.hpp>
#endif

#include <dpkit/collectives.hpp>
#include <dpkit/core/errors.hpp>
#include <dpkit/elastic/group.hpp>
#include <dpkit/torch/tensor.hpp>
#include <dpkit/transport/gloo.hpp>

#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <variant>
#include <vector>

namespace py = pybind11;

namespace dpkit_dist {

#if TORCH_VERSION_MAJOR >= 2
using group_base = c10d::Backend; // torch 2.x: a backend under torch's ProcessGroup
#else
using group_base = c10d::ProcessGroup; // torch 1.13: the process group itself
#endif

/// The transport a group's collectives run on.
#if DPKIT_DIST_MPI
using comm_ref = std::variant<dpkit::gloo_transport*, dpkit::mpi*>;
#else
using comm_ref = std::variant<dpkit::gloo_transport*>;
#endif

/// "dpkit backend: rank R: " (the prefix of the backend's own errors).
inline std::string at_rank(int rank) { return "dpkit backend: rank " + std::to_string(rank) + ": "; }

/// A reduce op of torch's as the backend runs it: one of dpkit's, or a
/// bitwise one (BAND, BOR, BXOR on integer and bool tensors, as Gloo), which
/// dpkit's reductions do not have: the backend all-gathers and folds those.
struct reduction {
  dpkit::reduce_op op = dpkit::reduce_op::sum; // when !bitwise
  char bitwise = 0;                             // '&', '|', '^' or 0
  std::string name;                             // torch's name, for messages
};

/// torch's reduce op as a reduction, or an invalid_argument naming it.
inline reduction to_reduction(const c10d::ReduceOp& op, int rank) {
  switch (op.op_) {
  case c10d::ReduceOp::SUM: return {dpkit::reduce_op::sum, 0, "SUM"};
  case c10d::ReduceOp::AVG: return {dpkit::reduce_op::avg, 0, "AVG"};
  case c10d::ReduceOp::PRODUCT: return {dpkit::reduce_op::prod, 0, "PRODUCT"};
  case c10d::ReduceOp::MIN: return {dpkit::reduce_op::min, 0, "MIN"};
  case c10d::ReduceOp::MAX: return {dpkit::reduce_op::max, 0, "MAX"};
  case c10d::ReduceOp::BAND: return {dpkit::reduce_op::sum, '&', "BAND"};
  case c10d::ReduceOp::BOR: return {dpkit::reduce_op::sum, '|', "BOR"};
  case c10d::ReduceOp::BXOR: return {dpkit::reduce_op::sum, '^', "BXOR"};
  default:
    throw dpkit::invalid_argument(at_rank(rank) + "reduce op " + std::to_string(static_cast<int>(op.op_)) +
                                  " not supported (SUM, AVG, PRODUCT, MIN, MAX; BAND, BOR, BXOR on integer tensors)");
  }
}

/// dpkit's reduce op of a torch reduce op that has one (for the elastic
/// group and the callers that take no bitwise op).
inline dpkit::reduce_op to_dpkit(const c10d::ReduceOp& op, int rank) {
  const reduction r = to_reduction(op, rank);
  if (r.bitwise)
    throw dpkit::invalid_argument(at_rank(rank) + "reduce op " + r.name + " not supported here");
  return r.op;
}

inline bool is_complex_tensor(const at::Tensor& t) { return c10::isComplexType(t.scalar_type()); }
inline bool is_integral(const at::Tensor& t) { return c10::isIntegralType(t.scalar_type(), /*includeBool=*/true); }
inline std::size_t nbytes(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()) * t.element_size(); }

/// Calls f(dpkit::tensor_view<T>) with the view a reduction with `r` runs
/// on: bool as uint8 (Gloo's rule: a sum of bools is their byte sum),
/// complex64/128 as the float/double pairs of torch.view_as_real (SUM and
/// AVG only, as torch.distributed allows). `t` must be a checked dense,
/// contiguous CPU tensor.
/// @throws dpkit::invalid_argument naming the dtype and the op otherwise.
template <class F>
void visit_reduce(const at::Tensor& t, const reduction& r, int rank, F&& f) {
  if (t.scalar_type() == at::kBool) {
    f(dpkit::tensor_view<std::uint8_t>{static_cast<std::uint8_t*>(t.data_ptr()), static_cast<std::size_t>(t.numel())});
    return;
  }
  if (is_complex_tensor(t)) {
    if (r.op != dpkit::reduce_op::sum && r.op != dpkit::reduce_op::avg)
      throw dpkit::invalid_argument(at_rank(rank) + "reduce op " + r.name + " is not defined on complex tensors (" +
                                    dpkit::detail::torch_describe(t) + "): SUM or AVG");
    dpkit::visit_torch_tensor(at::view_as_real(t), f);
    return;
  }
  dpkit::visit_torch_tensor(t, f);
}

/// Calls f(dpkit::tensor_view<T>) with the view a collective that moves data
/// without reducing it runs on: t's element type where dpkit has it, else
/// its bytes (bool, complex, int16, float8, ...: any dtype moves).
template <class F>
void visit_move(const at::Tensor& t, F&& f) {
  if (dpkit::torch_element_type(t.scalar_type())) {
    dpkit::visit_torch_tensor(t, f);
    return;
  }
  f(dpkit::tensor_view<std::uint8_t>{static_cast<std::uint8_t*>(t.data_ptr()), nbytes(t)});
}

/// Views of `ts` (dense, contiguous CPU tensors) as blocks of T for the list
/// forms of dpkit::gather and dpkit::scatter: T is what visit_move gives the
/// operation's own tensor (its element type, or bytes for dtypes dpkit does
/// not reduce), so each view holds nbytes / sizeof(T) elements.
template <class T>
std::vector<dpkit::tensor_view<T>> blocks_of(const std::vector<at::Tensor>& ts) {
  std::vector<dpkit::tensor_view<T>> vs;
  vs.reserve(ts.size());
  for (const auto& t : ts) vs.push_back({static_cast<T*>(t.data_ptr()), nbytes(t) / sizeof(T)});
  return vs;
}

/// A contiguous flat (1-d) tensor of `ts` concatenated (each reshaped to
/// 1-d): a new tensor, or ts[0]'s flat view when there is only one.
inline at::Tensor flat_cat(const std::vector<at::Tensor>& ts) {
  if (ts.size() == 1) return ts[0].reshape({-1});
  std::vector<at::Tensor> parts;
  parts.reserve(ts.size());
  for (const auto& t : ts) parts.push_back(t.reshape({-1}));
  return at::cat(parts);
}

/// Copies consecutive slices of flat 1-d tensor `flat` into `ts` (each as
/// many elements as it holds), starting at element `offset`.
inline void flat_split(const at::Tensor& flat, const std::vector<at::Tensor>& ts, std::int64_t offset = 0) {
  for (const auto& t : ts) {
    t.view({-1}).copy_(flat.narrow(0, offset, t.numel()));
    offset += t.numel();
  }
}

} // namespace dpkit_dist
