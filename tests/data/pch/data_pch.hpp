// The precompiled header of test_data (tests/data/meson.build): meson
// compiles it once for the executable and force-includes it in each of its
// six files, which otherwise parsed these headers each.
#include "../sampler_test_util.hpp"

#include <dpkit/data.hpp>

#include <doctest/doctest.h>
