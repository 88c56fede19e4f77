// A test's stand-in for a full /dev/shm: caps this process's file size
// (RLIMIT_FSIZE) for the guard's lifetime, with SIGXFSZ ignored, so creating
// or growing a file or a POSIX shared-memory object past the cap fails with
// EFBIG (posix_fallocate), as a /dev/shm too small fails with ENOSPC.
// Process-wide: hold it only while no other thread of the test writes files.
#pragma once

#include <csignal>
#include <sys/resource.h>

namespace test_fs {

class file_size_limit {
public:
  /// Caps files at `bytes` bytes until destruction (the soft limit; the hard
  /// limit is left as it is, so the old soft limit can be restored).
  explicit file_size_limit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit r = old_;
    r.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  ~file_size_limit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  file_size_limit(const file_size_limit&) = delete;
  file_size_limit& operator=(const file_size_limit&) = delete;

private:
  rlimit old_{};
  void (*old_handler_)(int) = SIG_DFL;
};

} // namespace test_fs
