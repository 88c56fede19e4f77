/// @file posix_file.hpp
/// @brief Internal: POSIX file helpers shared by mapped_file.hpp and the JSONL
/// index builder (errno messages, stat times, file type names, an RAII
/// descriptor, opening a regular file without blocking, full writes).
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

#include <fcntl.h>
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

/// Status-change time (st_ctim) of a stat result in nanoseconds since the Unix
/// epoch. Unlike mtime it cannot be set by utimensat/touch: any write,
/// chmod, rename or utime call moves it to "now".
inline std::int64_t ctime_ns(const struct stat& st) noexcept {
  return static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + static_cast<std::int64_t>(st.st_ctim.tv_nsec);
}

/// "regular file", "directory", "FIFO", "character device", ... for messages.
inline const char* file_type_name(mode_t mode) noexcept {
  if (S_ISREG(mode)) return "regular file";
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISLNK(mode)) return "symbolic link";
  return "special file";
}

/// Closes a file descriptor on scope exit.
class fd_guard {
public:
  explicit fd_guard(int fd) noexcept : fd_(fd) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  fd_guard(fd_guard&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  fd_guard& operator=(fd_guard&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

private:
  int fd_;
};

/// Clears O_NONBLOCK on `fd` (opened with it so that its open(2) could not
/// wait for a FIFO's writer): reads of the regular file behind it then block
/// as usual. Best effort: never throws.
inline void clear_nonblock(int fd) noexcept {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

/// Opens `path` read-only as a regular file without ever blocking: a FIFO
/// (whose open(2) waits for a writer), a device, a socket or a directory is
/// refused before it is opened (stat), and the open itself uses O_NONBLOCK,
/// so a path replaced by a FIFO in between cannot block either (O_NONBLOCK is
/// cleared once fstat shows a regular file). Symbolic links are followed.
/// @param path what to open.
/// @param what message prefix naming the caller, e.g. "mapped_file".
/// @param st   receives the file's fstat(2).
/// @returns the open descriptor (O_RDONLY | O_CLOEXEC).
/// @throws dpkit::invalid_argument "<what>: '<path>' is a FIFO, not a regular
///         file" (or a directory, character device, ...);
///         dpkit::error "<what>: cannot open '<path>': <strerror> (errno N)"
///         when it cannot be opened or stat'ed.
inline fd_guard open_regular_file(const std::filesystem::path& path, std::string_view what, struct stat& st) {
  const auto refuse = [&](mode_t mode) {
    throw invalid_argument(std::string(what) + ": '" + path.string() + "' is a " + file_type_name(mode) +
                           ", not a regular file");
  };
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) refuse(st.st_mode);
  fd_guard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) throw error(errno_message(std::string(what) + ": cannot open", path, errno));
  if (::fstat(fd.get(), &st) != 0) throw error(errno_message(std::string(what) + ": cannot stat", path, errno));
  if (!S_ISREG(st.st_mode)) refuse(st.st_mode);
  clear_nonblock(fd.get());
  return fd;
}

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
