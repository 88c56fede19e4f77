// The precompiled header of test_collectives (tests/collectives/meson.build):
// what every file of the suite includes first. Meson compiles it once for the
// executable and force-includes it in each of its files; parsing these
// headers was about 8 s of each file's compile (GCC 12), in the release,
// ASan and TSan builds.
#include "../common.hpp"

#include <dpkit/dpkit.hpp>

#include <doctest/doctest.h>
