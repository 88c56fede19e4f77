// One family of dpkit's collective algorithm bodies for one transport, for
// every element type: the definitions that the project's programs, compiled
// with -DDPKIT_EXTERN_TEMPLATES, declare extern (include/dpkit/extern_templates.hpp).
// meson.build compiles this file once per (transport, family), with
//   DPKIT_INST_FAMILY     DPKIT_INSTANTIATE_ALLREDUCE, _REDUCE or _MOVEMENT
//   DPKIT_INST_MPI / DPKIT_INST_GLOO   the transport (default dpkit::inproc).
// It includes what a program does (the umbrella header, then the transport),
// so that every name the bodies look up resolves as it does there.
#include <dpkit/dpkit.hpp>
#if defined(DPKIT_INST_MPI)
#include <dpkit/transport/mpi.hpp>
#define DPKIT_INST_TRANSPORT ::dpkit::mpi
#elif defined(DPKIT_INST_GLOO)
#include <dpkit/transport/gloo.hpp>
#define DPKIT_INST_TRANSPORT ::dpkit::gloo_transport
#else
#define DPKIT_INST_TRANSPORT ::dpkit::inproc
#endif
#include <dpkit/extern_templates.hpp>

#ifndef DPKIT_INST_FAMILY
#error "instantiate.cpp: define DPKIT_INST_FAMILY (instantiations/meson.build does)"
#endif
#ifdef DPKIT_EXTERN_TEMPLATES
#error "instantiate.cpp defines what -DDPKIT_EXTERN_TEMPLATES declares extern: compile it without"
#endif

DPKIT_INST_FAMILY(, DPKIT_INST_TRANSPORT)
