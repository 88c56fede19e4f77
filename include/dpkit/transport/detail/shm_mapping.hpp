// dpkit internals: a POSIX shared-memory object mapped into this process
// (shm_open + mmap), the memory of a node's shared segment
// (shm_segment.hpp). One process creates it under a fresh name, its peers
// open the name, and the creator unlinks it once every peer has it mapped: a
// process killed after that leaves nothing in /dev/shm, and tearing a mapping
// down (munmap) never waits for another process, alive or dead, unlike an
// MPI-3 shared window, whose MPI_Win_free (and MPI_Finalize, which frees
// leftover windows) synchronizes every rank. Not for users.
#pragma once

#include "../../core/errors.hpp"

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dpkit::detail {

/// A mapping of a POSIX shared-memory object (read-write, shared). Move-only;
/// the destructor unmaps (the object itself is removed by unlink()).
class shm_mapping {
public:
  shm_mapping() = default;
  shm_mapping(shm_mapping&& o) noexcept : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  shm_mapping& operator=(shm_mapping&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  shm_mapping(const shm_mapping&) = delete;
  shm_mapping& operator=(const shm_mapping&) = delete;
  ~shm_mapping() { reset(); }

  /// Creates the object `name` ("/dpkit-...", see unique_name) of `bytes`
  /// bytes (> 0), exclusively (never opens or truncates an existing one),
  /// mode 0600, with every page reserved (posix_fallocate: a full /dev/shm
  /// is an error here, not a SIGBUS at the first touch), zero-filled, and
  /// maps it.
  /// @throws dpkit::error naming the object, the size and the system's reason
  ///         (the object is unlinked again on failure).
  static shm_mapping create(const std::string& name, std::size_t bytes) {
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) fail("create", name, bytes, errno);
    if (const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      fail("reserve", name, bytes, rc);
    }
    return map(fd, name, bytes, true);
  }
  /// Opens the object `name` another process created with `bytes` bytes and
  /// maps it.
  /// @throws dpkit::error when it is missing, not a regular object of
  ///         exactly `bytes` bytes (someone else's), or cannot be mapped.
  static shm_mapping open(const std::string& name, std::size_t bytes) {
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) fail("open", name, bytes, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::size_t>(st.st_size) != bytes) {
      ::close(fd);
      throw error("shared memory '" + name + "': expected a segment of " + std::to_string(bytes) + " bytes, found " +
                  (S_ISREG(st.st_mode) ? std::to_string(st.st_size) + " bytes" : std::string("another kind of file")) +
                  " (not dpkit's)");
    }
    return map(fd, name, bytes, false);
  }
  /// Removes the name (mappings stay valid until unmapped). Never throws.
  static void unlink(const std::string& name) noexcept { ::shm_unlink(name.c_str()); }
  /// A name no other live object has: "/dpkit-<tag>-<pid>-<64 random bits>".
  static std::string unique_name(const std::string& tag) {
    std::random_device rd;
    const std::uint64_t r = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
                            static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(r));
    return "/dpkit-" + tag + "-" + std::to_string(::getpid()) + "-" + hex;
  }

  /// The mapped bytes (nullptr when empty).
  std::byte* data() const noexcept { return data_; }
  /// Their count.
  std::size_t size() const noexcept { return bytes_; }

private:
  static shm_mapping map(int fd, const std::string& name, std::size_t bytes, bool created) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      if (created) ::shm_unlink(name.c_str());
      fail("map", name, bytes, e);
    }
    shm_mapping m;
    m.data_ = static_cast<std::byte*>(p);
    m.bytes_ = bytes;
    return m;
  }
  [[noreturn]] static void fail(const char* what, const std::string& name, std::size_t bytes, int err) {
    throw error(std::string("shared memory '") + name + "': cannot " + what + " a segment of " + std::to_string(bytes) +
                " bytes: " + std::strerror(err) +
                (err == ENOSPC || err == ENOMEM ? " (/dev/shm is full or too small: set DPKIT_SHM_BYTES lower, or 0 "
                                                  "for no shared segment)"
                                                : ""));
  }
  void reset() noexcept {
    if (data_) ::munmap(data_, bytes_);
    data_ = nullptr;
    bytes_ = 0;
  }

  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

} // namespace dpkit::detail
