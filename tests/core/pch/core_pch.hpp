// The precompiled header of test_core (tests/core/meson.build): meson
// compiles it once for the executable and force-includes it in each of its
// eight files, which otherwise parsed these headers each.
#include <dpkit/dpkit.hpp>

#include <doctest/doctest.h>
