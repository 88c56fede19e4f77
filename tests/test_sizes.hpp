// World sizes of the threaded tests (inproc ranks are threads), trimmed under
// DPKIT_TEST_QUICK=1, which scripts/test.sh --tsan sets: ThreadSanitizer runs
// every code path and interleaving of these suites with up to `quick_max`
// ranks, while the larger worlds (9-16 threads: the same paths, many times
// slower under TSan) are left to the release and ASan runs, which keep every
// size. Without the variable the full list is returned.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <vector>

namespace test_sizes {

/// True when DPKIT_TEST_QUICK is set to something other than "" or "0".
inline bool quick() {
  static const bool q = [] {
    const char* e = std::getenv("DPKIT_TEST_QUICK");
    return e != nullptr && *e != '\0' && !(e[0] == '0' && e[1] == '\0');
  }();
  return q;
}

/// `all`, less the sizes above quick_max under DPKIT_TEST_QUICK.
template <class Range>
std::vector<int> worlds(const Range& all, int quick_max = 8) {
  std::vector<int> out;
  for (int n : all)
    if (!quick() || n <= quick_max) out.push_back(n);
  return out;
}
inline std::vector<int> worlds(std::initializer_list<int> all, int quick_max = 8) {
  return worlds<std::initializer_list<int>>(all, quick_max);
}

} // namespace test_sizes
