/// @file tensor.hpp
/// @brief `at::Tensor` as a dpkit tensor: runtime element-type dispatch over
/// f32, f64, f16, bf16, i32, i64, i8 and u8, host (CPU) and CUDA memory
/// spaces, and in-place collectives on torch tensors, so that dpkit's
/// collectives take the tensors a libtorch program already has (guide:
/// docs/torch-ddp.md). Needs libtorch (Debian libtorch-dev, Meson feature
/// `torch`); never included by dpkit/dpkit.hpp.
///
/// An at::Tensor's element type is a runtime property, so it cannot specialize
/// dpkit::tensor_traits directly. `visit_torch_tensor(t, f)` checks the tensor
/// and calls `f(dpkit::tensor_view<T>)` with the matching dpkit element type T,
/// so every typed dpkit collective takes a torch tensor:
///
/// @code
/// at::Tensor t = torch::ones({4, 8});
/// dpkit::visit_torch_tensor(t, [&](auto v) { dpkit::allreduce(comm, v, dpkit::reduce_op::sum); });
/// dpkit::torch_allreduce(comm, t, dpkit::reduce_op::avg);       // the same, in one call
/// @endcode
///
/// A non-contiguous tensor (a transpose, a strided slice) is rejected with
/// dpkit::invalid_argument: reducing its storage as if it were contiguous
/// would silently mix up elements.
#pragma once

#include "../collectives/allreduce.hpp"
#include "../collectives/broadcast_tree.hpp"
#include "../core/element.hpp"
#include "../core/errors.hpp"
#include "../core/options.hpp"
#include "../core/reduce_op.hpp"
#include "../core/tensor.hpp"

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace dpkit {

/// The dpkit element type of torch scalar type `s`, or std::nullopt for a
/// type dpkit does not reduce (bool, complex, quantized, ...). kHalf is f16
/// (IEEE binary16), kBFloat16 is bf16; both have dpkit's 2-byte layout.
inline std::optional<element_type> torch_element_type(c10::ScalarType s) noexcept {
  switch (s) {
  case c10::ScalarType::Float: return element_type::f32;
  case c10::ScalarType::Double: return element_type::f64;
  case c10::ScalarType::Half: return element_type::f16;
  case c10::ScalarType::BFloat16: return element_type::bf16;
  case c10::ScalarType::Int: return element_type::i32;
  case c10::ScalarType::Long: return element_type::i64;
  case c10::ScalarType::Char: return element_type::i8;
  case c10::ScalarType::Byte: return element_type::u8;
  default: return std::nullopt;
  }
}

/// The torch scalar type of dpkit element type `t`.
/// @throws dpkit::invalid_argument for u32 and u64 (torch 1.13 has no
///         unsigned 32/64-bit tensors).
inline c10::ScalarType torch_scalar_type(element_type t) {
  switch (t) {
  case element_type::f32: return c10::ScalarType::Float;
  case element_type::f64: return c10::ScalarType::Double;
  case element_type::f16: return c10::ScalarType::Half;
  case element_type::bf16: return c10::ScalarType::BFloat16;
  case element_type::i32: return c10::ScalarType::Int;
  case element_type::i64: return c10::ScalarType::Long;
  case element_type::i8: return c10::ScalarType::Char;
  case element_type::u8: return c10::ScalarType::Byte;
  default: break;
  }
  throw invalid_argument("torch_scalar_type: element type " + std::string(element_type_name(t)) +
                         " has no torch scalar type");
}

/// The dpkit memory space of tensor t: device for a CUDA tensor, host for a
/// CPU tensor.
/// @throws dpkit::invalid_argument for other devices (MPS, XLA, meta, ...).
inline memory_space torch_memory_space(const at::Tensor& t) {
  if (t.device().is_cpu()) return memory_space::host;
  if (t.device().is_cuda()) return memory_space::device;
  throw invalid_argument("torch tensor on device '" + t.device().str() +
                         "': dpkit moves CPU (host) and CUDA (device) tensors only");
}

namespace detail {
inline std::string torch_describe(const at::Tensor& t) {
  std::string s = std::string(c10::toString(t.scalar_type())) + " tensor of shape [";
  for (std::int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "] on " + t.device().str();
}
} // namespace detail

/// Checks tensor t and returns its dpkit element type: defined, a supported
/// scalar type, contiguous, on the CPU or a CUDA device. `what` prefixes the
/// error message (e.g. the calling function and rank).
/// @throws dpkit::invalid_argument naming the problem and the tensor's dtype,
///         shape and device.
inline element_type check_torch_tensor(const at::Tensor& t, std::string_view what = "torch tensor") {
  if (!t.defined()) throw invalid_argument(std::string(what) + ": undefined tensor");
  const auto e = torch_element_type(t.scalar_type());
  if (!e)
    throw invalid_argument(std::string(what) + ": " + detail::torch_describe(t) +
                           ": element type not supported (f32, f64, f16, bf16, i32, i64, i8, u8)");
  if (!t.is_contiguous())
    throw invalid_argument(std::string(what) + ": " + detail::torch_describe(t) +
                           " is not contiguous; call .contiguous() first (reducing its storage in place would mix "
                           "up elements)");
  (void)torch_memory_space(t);
  if (t.is_sparse() || t.is_quantized())
    throw invalid_argument(std::string(what) + ": " + detail::torch_describe(t) + ": sparse and quantized tensors "
                           "are not supported");
  return *e;
}

/// Tensor t as a typed dpkit::tensor_view<T> (no copy; T must be t's element
/// type: float, double, dpkit::f16, dpkit::bf16, std::int32_t, std::int64_t,
/// std::int8_t or std::uint8_t). The view aliases t's storage: keep t alive.
/// @throws dpkit::invalid_argument as check_torch_tensor, or if T is not t's
///         element type.
template <element T>
tensor_view<T> torch_tensor_view(const at::Tensor& t) {
  const element_type e = check_torch_tensor(t, "torch_tensor_view");
  if (e != element_type_of_v<T>)
    throw invalid_argument("torch_tensor_view: " + detail::torch_describe(t) + " requested as " +
                           std::string(element_type_name(element_type_of_v<T>)));
  return {static_cast<T*>(t.data_ptr()), static_cast<std::size_t>(t.numel()), torch_memory_space(t)};
}

/// Calls f(dpkit::tensor_view<T>) with T the dpkit element type of tensor t
/// (runtime dispatch) and returns what f returns. f must accept a view of
/// every supported element type (a generic lambda).
/// @throws dpkit::invalid_argument as check_torch_tensor; whatever f throws.
template <class F>
decltype(auto) visit_torch_tensor(const at::Tensor& t, F&& f) {
  const element_type e = check_torch_tensor(t, "visit_torch_tensor");
  return visit_element_type(e, [&](auto zero) -> decltype(auto) {
    using T = decltype(zero);
    return f(tensor_view<T>{static_cast<T*>(t.data_ptr()), static_cast<std::size_t>(t.numel()),
                            torch_memory_space(t)});
  });
}

/// All-reduces tensor t in place with op over comm (every rank passes a
/// tensor of the same dtype and element count). The transport must accept
/// t's memory space (dpkit::mpi and dpkit::inproc: host; nccl: device).
/// @throws dpkit::invalid_argument as check_torch_tensor; the collective's
///         errors (mismatch_error, timeout_error, ...).
template <transport C>
void torch_allreduce(C& comm, const at::Tensor& t, reduce_op op = reduce_op::sum, const allreduce_policy& policy = {},
                     const collective_options& o = {}) {
  visit_torch_tensor(t, [&](auto v) { allreduce(comm, v, v, op, policy, o); });
}

/// Broadcasts tensor t in place from rank `root` over comm.
/// @throws as torch_allreduce.
template <transport C>
void torch_broadcast(C& comm, const at::Tensor& t, int root = 0, const collective_options& o = {}) {
  visit_torch_tensor(t, [&](auto v) { broadcast_tree(comm, v, v, root, o); });
}

} // namespace dpkit
