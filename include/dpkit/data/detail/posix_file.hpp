/// @file posix_file.hpp
/// @brief Internal: POSIX file helpers shared by mapped_file.hpp and the JSONL
/// index builder (errno messages, stat times, RAII descriptors, full writes).
/// Never include directly.
#pragma once

#include <dpkit/core/errors.hpp>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

namespace dpkit::detail {

/// Formats "<what> '<path>': <strerror(err)> (errno <err>)".
inline std::string errno_message(std::string_view what, const std::filesystem::path& path, int err) {
  std::string msg(what);
  msg += " '";
  msg += path.string();
  msg += "': ";
  msg += std::strerror(err);
  msg += " (errno ";
  msg += std::to_string(err);
  msg += ')';
  return msg;
}

/// Modification time of a stat result in nanoseconds since the Unix epoch.
inline std::int64_t mtime_ns(const struct stat& st) noexcept {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + static_cast<std::int64_t>(st.st_mtim.tv_nsec);
}

/// Deletes a file on scope exit unless released (temporary index files).
class unlink_guard {
public:
  explicit unlink_guard(std::filesystem::path p) : path_(std::move(p)) {}
  unlink_guard(const unlink_guard&) = delete;
  unlink_guard& operator=(const unlink_guard&) = delete;
  ~unlink_guard() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  void release() noexcept { path_.clear(); }

private:
  std::filesystem::path path_;
};

/// Closes a file descriptor on scope exit.
class fd_guard {
public:
  explicit fd_guard(int fd) noexcept : fd_(fd) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

private:
  int fd_;
};

/// Writes all `n` bytes of `data` to `fd` (retrying short writes and EINTR).
/// @throws dpkit::error "<what> '<path>': <strerror> (errno N)" on failure.
inline void write_all(int fd, const void* data, std::size_t n, const std::filesystem::path& path,
                      std::string_view what = "jsonl_index: cannot write") {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw error(errno_message(what, path, errno));
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

} // namespace dpkit::detail
