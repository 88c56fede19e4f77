/// @file cpus.hpp
/// @brief The CPUs the calling thread may run on: what a pool of worker
/// threads should be sized to.
///
/// `std::thread::hardware_concurrency()` counts the CPUs the machine has
/// online. A process may run on fewer: `mpirun` binds each rank to a core
/// (Open MPI's default for 2 ranks or fewer) or a socket, `taskset`,
/// `numactl`, Slurm's `--cpu-bind` and a cgroup cpuset restrict it too. A
/// pool sized to the machine then puts several threads on each allowed CPU,
/// and every parallel region waits for threads that are not running.
/// These functions read the calling thread's affinity mask instead
/// (sched_getaffinity(2); a thread inherits its creator's mask, so in a
/// process nobody re-binds it is the process's). A CPU quota (cgroup v2
/// `cpu.max`) limits time, not CPUs, and is not seen here.
#pragma once

#include <algorithm>
#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace dpkit {

/// The CPU numbers in the calling thread's affinity mask, in increasing
/// order (sched_getaffinity(0, ...), with a mask grown until the kernel's
/// fits). Empty where the mask cannot be read (not Linux, or the call
/// failed). Never throws.
inline std::vector<int> usable_cpus() noexcept {
  std::vector<int> out;
#if defined(__linux__)
  for (int n = 1024; n <= (1 << 20); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(static_cast<std::size_t>(n));
    if (!set) return out;
    const std::size_t bytes = CPU_ALLOC_SIZE(static_cast<std::size_t>(n));
    CPU_ZERO_S(bytes, set);
    if (::sched_getaffinity(0, bytes, set) == 0) {
      try {
        for (int c = 0; c < n; ++c)
          if (CPU_ISSET_S(static_cast<std::size_t>(c), bytes, set)) out.push_back(c);
      } catch (...) {
        out.clear();
      }
      CPU_FREE(set);
      return out;
    }
    const int err = errno;
    CPU_FREE(set);
    if (err != EINVAL) return out; // EINVAL: the kernel's mask is larger than n bits
  }
#endif
  return out;
}

/// How many CPUs the calling thread may run on: the size of its affinity
/// mask (see usable_cpus()), at least 1; where the mask cannot be read,
/// std::thread::hardware_concurrency() (at least 1). The default size of
/// dpkit's own worker pools (index builds, sampler plans) and of libtorch's
/// thread pools in dpkit/torch/threads.hpp. Never throws.
inline unsigned usable_cpu_count() noexcept {
  const std::size_t n = usable_cpus().size();
  if (n > 0) return static_cast<unsigned>(n);
  return std::max(1u, std::thread::hardware_concurrency());
}

/// `cpus` as a short list of ranges, e.g. "0-3,8,10-11" ("none" when
/// empty): for messages.
inline std::string cpu_list_string(const std::vector<int>& cpus) {
  if (cpus.empty()) return "none";
  std::string s;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(cpus[i]);
    if (j > i) s += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return s;
}

} // namespace dpkit
