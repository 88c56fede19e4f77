/// @file extern_templates.hpp
/// @brief Compile dpkit's collective algorithms once per program instead of
/// once per translation unit: explicit instantiation declarations
/// (`extern template`) and definitions of the per-element-type algorithm
/// bodies for the host transports (inproc, MPI, Gloo).
///
/// Every translation unit that calls a collective on a transport compiles the
/// whole algorithm stack below it (ring, tree, shared memory, hierarchical)
/// for each element type it uses: with the header-only library that is most
/// of a collective-calling TU's compile time (tests/core/test_tensor.cpp at
/// -O3, GCC 12: 25.7 s, 11.0 s with the declarations below). A program with
/// many such TUs (dpkit's own tests and benchmarks; an engine with many
/// files) can instead
///  1. compile every TU with `-DDPKIT_EXTERN_TEMPLATES`: each transport header
///     (transport/inproc.hpp, mpi.hpp, gloo.hpp) then ends by declaring the
///     algorithm bodies for that transport and every dpkit element type
///     `extern template`, and the TU stops instantiating them;
///  2. add one TU per transport (or several, by family) that defines them:
///     @code
///     #include <dpkit/dpkit.hpp>
///     #include <dpkit/extern_templates.hpp>
///     DPKIT_INSTANTIATE_COLLECTIVES(, ::dpkit::inproc)   // empty first argument: definitions
///     @endcode
///     (the project's own: instantiations/, one static library per transport).
///
/// This is the pattern of Asio's ASIO_SEPARATE_COMPILATION and libstdc++'s
/// extern templates of std::string: the behaviour is the same either way
/// (the bodies are the same inline templates, compiled with the same flags;
/// a TU without the macro, or a type or transport not listed, instantiates
/// implicitly as before, and the linker keeps one copy). Every TU of a
/// program must see the same dpkit headers and flags, as the one-definition
/// rule already requires of a header-only library.
///
/// What is covered: the *_raw bodies of all-reduce, reduce, broadcast,
/// all-gather and reduce-scatter (ring, tree, shm, hierarchical), the
/// typed layer below the tensor-typed entry points. Gather, scatter and
/// all-to-all (small, and parameterised on callables) are not.
#pragma once

#include "collectives.hpp"

#include <cstddef>
#include <cstdint>

// One family of algorithm bodies for transport C and element type T; KW is
// `extern` (declarations) or empty (definitions).
#define DPKIT_INSTANTIATE_ALLREDUCE_FOR(KW, C, T)                                                                  \
  KW template void ::dpkit::detail::allreduce_ring_raw<C, T>(                                                    \
      C&, const ::dpkit::detail::op_context&, const T*, T*, std::size_t, ::dpkit::reduce_op,                      \
      const ::dpkit::collective_options&, const ::dpkit::detail::local_ops<T>&);                                   \
  KW template void ::dpkit::detail::tree_raw<C, T>(C&, const ::dpkit::detail::op_context&, const T*, T*,          \
                                                   std::size_t, ::dpkit::reduce_op, int, ::dpkit::detail::tree_mode, \
                                                   const ::dpkit::collective_options&,                             \
                                                   const ::dpkit::detail::local_ops<T>&);                          \
  KW template void ::dpkit::detail::allreduce_shm_raw<C, T>(                                                     \
      C&, const ::dpkit::detail::op_context&, ::dpkit::detail::shm_segment&, const T*, T*, std::size_t,            \
      ::dpkit::reduce_op, const ::dpkit::collective_options&, ::dpkit::detail::shm_mode);                          \
  KW template void ::dpkit::detail::allreduce_hierarchical_raw<C, T>(                                            \
      C&, const ::dpkit::detail::op_context&, const T*, T*, std::size_t, ::dpkit::reduce_op, ::dpkit::memory_space, \
      const ::dpkit::collective_options&, const ::dpkit::allreduce_policy&, const ::dpkit::detail::local_ops<T>&);

#define DPKIT_INSTANTIATE_REDUCE_FOR(KW, C, T)                                                                     \
  KW template void ::dpkit::detail::reduce_scatter_ring_raw<C, T>(                                               \
      C&, const ::dpkit::detail::op_context&, const T*, T*, std::size_t, ::dpkit::reduce_op,                      \
      const ::dpkit::collective_options&, const ::dpkit::detail::local_ops<T>&);                                   \
  KW template void ::dpkit::detail::reduce_scatter_shm_raw<C, T>(                                                \
      C&, const ::dpkit::detail::op_context&, ::dpkit::detail::shm_segment&, const T*, T*, std::size_t,            \
      ::dpkit::reduce_op, const ::dpkit::collective_options&);                                                     \
  KW template void ::dpkit::detail::reduce_scatter_hierarchical_raw<C, T>(                                       \
      C&, const ::dpkit::detail::op_context&, const T*, T*, std::size_t, ::dpkit::reduce_op, ::dpkit::memory_space, \
      const ::dpkit::collective_options&, const ::dpkit::detail::local_ops<T>&);                                   \
  KW template void ::dpkit::detail::reduce_shm_raw<C, T>(C&, const ::dpkit::detail::op_context&,                  \
                                                         ::dpkit::detail::shm_segment&, const T*, T*, std::size_t, \
                                                         ::dpkit::reduce_op, int, const ::dpkit::collective_options&);

#define DPKIT_INSTANTIATE_MOVEMENT_FOR(KW, C, T)                                                                   \
  KW template void ::dpkit::detail::allgather_ring_raw<C, T>(C&, const ::dpkit::detail::op_context&, const T*, T*, \
                                                             std::size_t, const ::dpkit::collective_options&,       \
                                                             const ::dpkit::detail::local_ops<T>&);                 \
  KW template void ::dpkit::detail::allgather_shm_raw<C, T>(C&, const ::dpkit::detail::op_context&,               \
                                                            ::dpkit::detail::shm_segment&, const T*, T*,            \
                                                            std::size_t, const ::dpkit::collective_options&);       \
  KW template void ::dpkit::detail::allgather_hierarchical_raw<C, T>(                                            \
      C&, const ::dpkit::detail::op_context&, const T*, T*, std::size_t, ::dpkit::memory_space,                    \
      const ::dpkit::collective_options&, const ::dpkit::detail::local_ops<T>&);                                   \
  KW template void ::dpkit::detail::broadcast_shm_raw<C, T>(C&, const ::dpkit::detail::op_context&,               \
                                                            ::dpkit::detail::shm_segment&, const T*, T*,            \
                                                            std::size_t, int, const ::dpkit::collective_options&);  \
  KW template void ::dpkit::detail::broadcast_hierarchical_raw<C, T>(C&, const ::dpkit::detail::op_context&, T*,  \
                                                                     std::size_t, int, ::dpkit::memory_space,       \
                                                                     const ::dpkit::collective_options&);

/// Expands FAMILY(KW, C, T) for every dpkit element type T (core/element.hpp):
/// float, double, f16, bf16, int8, uint8, int32, uint32, int64, uint64.
#define DPKIT_FOR_EACH_ELEMENT_TYPE(FAMILY, KW, C)                                                                 \
  FAMILY(KW, C, float)                                                                                             \
  FAMILY(KW, C, double)                                                                                            \
  FAMILY(KW, C, ::dpkit::f16)                                                                                      \
  FAMILY(KW, C, ::dpkit::bf16)                                                                                     \
  FAMILY(KW, C, std::int8_t)                                                                                       \
  FAMILY(KW, C, std::uint8_t)                                                                                      \
  FAMILY(KW, C, std::int32_t)                                                                                      \
  FAMILY(KW, C, std::uint32_t)                                                                                     \
  FAMILY(KW, C, std::int64_t)                                                                                      \
  FAMILY(KW, C, std::uint64_t)

/// The all-reduce bodies (ring, tree, shm, hierarchical; the tree also serves
/// reduce and broadcast) of transport C for every element type: KW `extern`
/// declares them, empty KW defines them (one TU of the program).
#define DPKIT_INSTANTIATE_ALLREDUCE(KW, C) DPKIT_FOR_EACH_ELEMENT_TYPE(DPKIT_INSTANTIATE_ALLREDUCE_FOR, KW, C)
/// Reduce-scatter (ring, shm, hierarchical) and reduce (shm) bodies; as above.
#define DPKIT_INSTANTIATE_REDUCE(KW, C) DPKIT_FOR_EACH_ELEMENT_TYPE(DPKIT_INSTANTIATE_REDUCE_FOR, KW, C)
/// All-gather (ring, shm, hierarchical) and broadcast (shm, hierarchical) bodies; as above.
#define DPKIT_INSTANTIATE_MOVEMENT(KW, C) DPKIT_FOR_EACH_ELEMENT_TYPE(DPKIT_INSTANTIATE_MOVEMENT_FOR, KW, C)
/// All three families of transport C.
#define DPKIT_INSTANTIATE_COLLECTIVES(KW, C)                                                                       \
  DPKIT_INSTANTIATE_ALLREDUCE(KW, C)                                                                               \
  DPKIT_INSTANTIATE_REDUCE(KW, C)                                                                                  \
  DPKIT_INSTANTIATE_MOVEMENT(KW, C)
