/// @file dpkit.hpp
/// @brief Umbrella header: core, host transports (inproc; mpi when <mpi.h> is
/// on the include path, unless DPKIT_NO_MPI is defined), collectives, fusion
/// and data.
///
/// CUDA/NCCL headers are never included from here: include
/// <dpkit/transport/nccl.hpp> and <dpkit/cuda/...> explicitly.
#pragma once

#include "core/async.hpp"
#include "core/element.hpp"
#include "core/errors.hpp"
#include "core/options.hpp"
#include "core/reduce_op.hpp"
#include "core/tensor.hpp"
#include "transport/concept.hpp"
#include "transport/inproc.hpp"
#include "collectives.hpp"

#if !defined(DPKIT_NO_MPI) && (defined(DPKIT_WITH_MPI) || __has_include(<mpi.h>))
#include "transport/mpi.hpp"
#endif

#if __has_include("fusion/gradient_reducer.hpp")
#include "fusion/gradient_reducer.hpp"
#include "fusion/model_averager.hpp"
#endif
#if __has_include("data.hpp")
#include "data.hpp"
#endif
