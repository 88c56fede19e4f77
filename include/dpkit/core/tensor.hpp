/// @file tensor.hpp
/// @brief The `tensor` concept, the `tensor_traits` customization point,
/// `as_span` and memory spaces (docs/design.md, "Tensors"; docs/concepts.md).
///
/// A tensor is a contiguous run of elements of one dpkit element type in one
/// memory space. Satisfied out of the box by contiguous sized ranges and by any
/// type with `data()` and `size()` (std::vector<float>, std::span<bf16>,
/// std::array<int, 4>, ...), all in host memory. Any other type plugs in by
/// specializing `dpkit::tensor_traits`:
///
/// @code
/// struct my_tensor { float* data_ptr(); std::int64_t numel() const; bool on_gpu; };
/// template <> struct dpkit::tensor_traits<my_tensor> {
///   using value_type = float;
///   static float* data(my_tensor& t) { return t.data_ptr(); }
///   static std::size_t size(const my_tensor& t) { return static_cast<std::size_t>(t.numel()); }
///   // optional; host if absent:
///   static dpkit::memory_space space(const my_tensor& t) {
///     return t.on_gpu ? dpkit::memory_space::device : dpkit::memory_space::host; }
/// };
/// @endcode
///
/// A traits specialization may instead declare `static constexpr memory_space
/// memory = ...;` when the space is known at compile time; then a transport that
/// cannot move that space is rejected at compile time.
#pragma once

#include "element.hpp"
#include "errors.hpp"

#include <concepts>
#include <cstddef>
#include <iterator>
#include <optional>
#include <ostream>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>

namespace dpkit {

/// Where a tensor's elements live. `device` is CUDA device memory.
enum class memory_space : std::uint8_t { host, device };

/// "host" or "device".
inline constexpr std::string_view memory_space_name(memory_space s) noexcept {
  return s == memory_space::host ? "host" : "device";
}
/// Prints memory_space_name(s).
inline std::ostream& operator<<(std::ostream& os, memory_space s) { return os << memory_space_name(s); }

/// Customization point: specialize for a user tensor type T (without cv/ref)
/// with `value_type`, `static value_type* data(T&)`, `static std::size_t
/// size(const T&)` (elements) and optionally `static memory_space space(const
/// T&)` or `static constexpr memory_space memory`. The primary template is
/// empty (T is not a tensor) unless T has member `data()` and `size()` whose
/// pointee is a dpkit element type, in which case it is host memory.
template <class T>
struct tensor_traits {};

namespace detail {
/// True for types that declare a compile-time element stride other than 1
/// (Eigen expressions' InnerStrideAtCompileTime, e.g. a row of a fixed-size
/// column-major matrix): such a view is not contiguous, so it is no tensor.
template <class T>
constexpr bool statically_strided() {
  if constexpr (requires { T::InnerStrideAtCompileTime; })
    return T::InnerStrideAtCompileTime != 1 && T::InnerStrideAtCompileTime != -1; // -1: Eigen::Dynamic
  else return false;
}
/// Runtime contiguity of views that describe their layout: Eigen-style
/// innerStride()/outerStride() (a vector's elements must be adjacent, a
/// matrix's columns or rows back to back) or an is_contiguous() member (as
/// at::Tensor). Types without such members are contiguous by the concept.
template <class T>
bool runtime_contiguous(const T& t) {
  if constexpr (requires { t.is_contiguous(); }) {
    if (!t.is_contiguous()) return false;
  }
  if constexpr (requires { t.innerStride(); t.outerStride(); t.innerSize(); t.outerSize(); }) {
    if (t.size() > 1 && t.innerStride() != 1 && t.innerSize() > 1) return false;
    if (t.outerSize() > 1 && t.innerSize() > 0 && t.outerStride() != t.innerSize()) return false;
  } else if constexpr (requires { t.innerStride(); }) {
    if (t.size() > 1 && t.innerStride() != 1) return false;
  }
  return true;
}
} // namespace detail

/// Default traits for contiguous containers/views with data() and size().
/// Views that declare a compile-time stride other than 1 are excluded (not a
/// tensor: a compile error at the call); views whose stride is a runtime
/// property are checked by dpkit::as_span and the collectives
/// (dpkit::invalid_argument), never reduced element by element as if
/// contiguous.
template <class T>
  requires requires(T& t) {
    { t.data() } -> std::convertible_to<const volatile void*>;
    { t.size() } -> std::convertible_to<std::size_t>;
  } && is_element_v<std::remove_pointer_t<decltype(std::declval<T&>().data())>> && (!detail::statically_strided<T>())
struct tensor_traits<T> {
  using value_type = std::remove_pointer_t<decltype(std::declval<T&>().data())>;
  static constexpr memory_space memory = memory_space::host;
  /// t.data(); const-correct: a const container yields a pointer to const.
  template <class U>
  static auto data(U& t) noexcept -> decltype(t.data()) { return t.data(); }
  static std::size_t size(const T& t) noexcept { return static_cast<std::size_t>(t.size()); }
};

/// Default traits for C arrays of elements.
template <class E, std::size_t N>
  requires is_element_v<E>
struct tensor_traits<E[N]> {
  using value_type = E;
  static constexpr memory_space memory = memory_space::host;
  static E* data(E (&t)[N]) noexcept { return t; }
  static const E* data(const E (&t)[N]) noexcept { return t; }
  static std::size_t size(const E (&)[N]) noexcept { return N; }
};

namespace detail {
template <class T>
using traits_of = tensor_traits<std::remove_cvref_t<T>>;
template <class T>
using bare_t = std::remove_cvref_t<T>;
} // namespace detail

/// Concept: T (any cv/ref) is a tensor: its traits give a pointer to a dpkit
/// element type and an element count.
template <class T>
concept tensor = requires(detail::bare_t<T>& t) {
  typename detail::traits_of<T>::value_type;
  requires element<typename detail::traits_of<T>::value_type>;
  { detail::traits_of<T>::data(t) } -> std::convertible_to<const volatile typename detail::traits_of<T>::value_type*>;
  { detail::traits_of<T>::size(t) } -> std::convertible_to<std::size_t>;
};

/// Element type of a tensor (without const).
template <tensor T>
using tensor_value_t = std::remove_cv_t<typename detail::traits_of<T>::value_type>;

/// The memory space a tensor type is known to live in at compile time, or
/// std::nullopt when it is a runtime property (traits with `space(const T&)`).
template <tensor T>
inline constexpr std::optional<memory_space> static_memory_space_v = [] () -> std::optional<memory_space> {
  using Tr = detail::traits_of<T>;
  if constexpr (requires { Tr::memory; }) return Tr::memory;
  else if constexpr (requires(const detail::bare_t<T>& t) { Tr::space(t); }) return std::nullopt;
  else return memory_space::host;
}();

/// The memory space of tensor t (runtime). Host unless the traits say otherwise.
template <tensor T>
memory_space space_of(const T& t) {
  using Tr = detail::traits_of<T>;
  if constexpr (requires { Tr::space(t); }) return Tr::space(t);
  else if constexpr (requires { Tr::memory; }) return Tr::memory;
  else return memory_space::host;
}

/// Number of elements of tensor t.
template <tensor T>
std::size_t size_of(const T& t) {
  return static_cast<std::size_t>(detail::traits_of<T>::size(t));
}

/// A std::span over tensor t's elements. The element constness follows the
/// traits: a const std::vector gives span<const E>, a (const) view such as
/// std::span<E> or tensor_view<E> gives span<E>; traits whose data() takes
/// only a non-const reference give span<const E> for a const tensor. The
/// span's memory is in space_of(t); do not dereference a device span on the
/// host.
/// @throws dpkit::invalid_argument if t describes a non-contiguous layout
/// (a strided view: Eigen innerStride/outerStride, is_contiguous() false).
template <tensor T>
auto as_span(T&& t) {
  using Tr = detail::traits_of<T>;
  using R = std::remove_reference_t<T>;
  if (!detail::runtime_contiguous(t))
    throw invalid_argument("dpkit: tensor is a strided (non-contiguous) view; pass a contiguous copy");
  const std::size_t n = static_cast<std::size_t>(Tr::size(t));
  if constexpr (requires(R& r) { Tr::data(r); }) {
    auto* p = Tr::data(t);
    return std::span<std::remove_pointer_t<decltype(p)>>(p, n);
  } else {
    const auto* p = Tr::data(const_cast<detail::bare_t<T>&>(t));
    return std::span<std::remove_pointer_t<decltype(p)>>(p, n);
  }
}

/// A non-owning tensor view: pointer, element count and memory space. Itself
/// a tensor; handy to pass a device pointer or a slice of a larger buffer.
template <element E>
struct tensor_view {
  E* ptr = nullptr;            ///< first element
  std::size_t count = 0;       ///< elements
  memory_space where = memory_space::host; ///< where ptr points
  E* data() const noexcept { return ptr; }
  std::size_t size() const noexcept { return count; }
};

/// tensor_view's traits: runtime memory space.
template <element E>
struct tensor_traits<tensor_view<E>> {
  using value_type = E;
  static E* data(const tensor_view<E>& t) noexcept { return t.ptr; }
  static std::size_t size(const tensor_view<E>& t) noexcept { return t.count; }
  static memory_space space(const tensor_view<E>& t) noexcept { return t.where; }
};

/// Concept: R is a list of tensors, one block per rank (a random-access
/// range whose elements are tensors, itself not a tensor): the list forms of
/// gather and scatter take one (torch.distributed.gather's gather_list,
/// scatter's scatter_list), e.g. std::vector<std::vector<float>> or
/// std::vector<dpkit::tensor_view<float>>.
template <class R>
concept tensor_list = std::ranges::random_access_range<R> && tensor<std::ranges::range_reference_t<R>> && !tensor<R>;

} // namespace dpkit
