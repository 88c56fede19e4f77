// The precompiled header of test_collectives (tests/collectives/meson.build):
// what every file of the suite includes first. Meson compiles it once for the
// executable and force-includes it in each of its files, 1-5 s less for
// each (GCC 12; benchmarks/results/2026-12-03-ci-time-cuts.md).
#include "../common.hpp"

#include <dpkit/dpkit.hpp>

#include <doctest/doctest.h>
