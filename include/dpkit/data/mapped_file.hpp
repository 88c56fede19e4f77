/// @file mapped_file.hpp
/// @brief RAII read-only memory mapping of a whole file (POSIX mmap).
///
/// Used by the JSONL index (docs/data.md) to read data and index files at
/// memory speed without copying them. Depends only on the standard library and
/// POSIX.
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/detail/posix_file.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dpkit {

/// Access-pattern hint passed to madvise(2) for a mapping.
enum class access_advice {
  normal,     ///< MADV_NORMAL: the kernel's default read-ahead.
  sequential, ///< MADV_SEQUENTIAL: one front-to-back pass (index builds, scans).
  random,     ///< MADV_RANDOM: random access by line (training-time reads).
  willneed,   ///< MADV_WILLNEED: start reading the pages in now.
};

namespace detail {

/// Maps dpkit::access_advice to the MADV_* constant.
inline int madvise_flag(access_advice advice) noexcept {
  switch (advice) {
  case access_advice::sequential: return MADV_SEQUENTIAL;
  case access_advice::random: return MADV_RANDOM;
  case access_advice::willneed: return MADV_WILLNEED;
  case access_advice::normal: break;
  }
  return MADV_NORMAL;
}

} // namespace detail

/// A read-only, private mapping of a whole file.
///
/// Move-only; the mapping is released by the destructor. An empty file is
/// allowed: data() is then nullptr and size() is 0. The file's size and
/// modification time, status-change time, device and inode are captured (fstat) when it is opened. Bytes are valid
/// only while the file is not truncated by another process (as with any mmap).
class mapped_file {
public:
  /// An empty object mapping nothing.
  mapped_file() noexcept = default;

  /// Opens and maps `path` read-only. Never blocks in open(2): a FIFO (or any
  /// other file that is not a regular file) is refused before it is opened.
  /// @param path   file to map (any size, including 0 bytes); symbolic links
  ///               are followed.
  /// @param advice madvise(2) hint applied to the whole mapping.
  /// @throws dpkit::invalid_argument "mapped_file: 'P' is a FIFO, not a regular
  ///         file" (or a directory, a character device, ...);
  ///         dpkit::error naming the path and errno (strerror) if the file
  ///         cannot be opened, stat'ed or mapped.
  explicit mapped_file(const std::filesystem::path& path, access_advice advice = access_advice::normal) : path_(path) {
    struct stat st {};
    const detail::fd_guard fd = detail::open_regular_file(path, "mapped_file", st);
    size_ = static_cast<std::size_t>(st.st_size);
    mtime_ns_ = detail::mtime_ns(st);
    ctime_ns_ = detail::ctime_ns(st);
    device_ = static_cast<std::uint64_t>(st.st_dev);
    inode_ = static_cast<std::uint64_t>(st.st_ino);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        size_ = 0;
        throw error(detail::errno_message("mapped_file: cannot mmap", path, err));
      }
      data_ = static_cast<const char*>(p);
    }
    // fd closes at the end of the constructor; the mapping keeps its own reference to the file
    advise(advice);
  }

  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;

  /// Takes over `other`'s mapping; `other` becomes empty.
  mapped_file(mapped_file&& other) noexcept
      : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
        mtime_ns_(std::exchange(other.mtime_ns_, 0)), ctime_ns_(std::exchange(other.ctime_ns_, 0)),
        device_(std::exchange(other.device_, 0)), inode_(std::exchange(other.inode_, 0)) {}

  /// Releases this mapping and takes over `other`'s; `other` becomes empty.
  mapped_file& operator=(mapped_file&& other) noexcept {
    if (this != &other) {
      unmap();
      path_ = std::move(other.path_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      mtime_ns_ = std::exchange(other.mtime_ns_, 0);
      ctime_ns_ = std::exchange(other.ctime_ns_, 0);
      device_ = std::exchange(other.device_, 0);
      inode_ = std::exchange(other.inode_, 0);
    }
    return *this;
  }

  /// Unmaps the file.
  ~mapped_file() { unmap(); }

  /// First byte of the mapping (nullptr for an empty file).
  [[nodiscard]] const char* data() const noexcept { return data_; }
  /// Mapping as bytes (nullptr for an empty file).
  [[nodiscard]] const std::byte* bytes() const noexcept { return reinterpret_cast<const std::byte*>(data_); }
  /// Size of the file in bytes when it was opened.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// True for an empty file (or a default-constructed object).
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  /// The whole file as characters.
  [[nodiscard]] std::string_view view() const noexcept { return data_ ? std::string_view(data_, size_) : std::string_view(); }
  /// The path the file was opened with.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// Modification time of the file when it was opened, ns since the Unix epoch.
  [[nodiscard]] std::int64_t mtime_ns() const noexcept { return mtime_ns_; }
  /// Status-change time (st_ctim) when it was opened, ns since the Unix epoch.
  [[nodiscard]] std::int64_t ctime_ns() const noexcept { return ctime_ns_; }
  /// st_dev of the file when it was opened.
  [[nodiscard]] std::uint64_t device() const noexcept { return device_; }
  /// st_ino of the file when it was opened.
  [[nodiscard]] std::uint64_t inode() const noexcept { return inode_; }

  /// Applies an madvise(2) hint to the whole mapping. Hints are advisory:
  /// failures are ignored. No-op for an empty file.
  void advise(access_advice advice) const noexcept { advise(0, size_, advice); }

  /// Applies an madvise(2) hint to bytes [offset, offset + length) (clamped to
  /// the file; the start is rounded down to a page). Failures are ignored.
  void advise(std::size_t offset, std::size_t length, access_advice advice) const noexcept {
    if (!data_ || offset >= size_) return;
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t start = offset - offset % page;
    const std::size_t end = (length > size_ - offset) ? size_ : offset + length;
    ::madvise(const_cast<char*>(data_) + start, end - start, detail::madvise_flag(advice));
  }

  /// Drops this process's mapping of the pages of bytes [offset, offset +
  /// length) (madvise MADV_DONTNEED; the start is rounded down, the end up, to
  /// a page; clamped to the file), so they stop counting in its resident set.
  /// The data stays valid: the mapping is read-only and never written, so a
  /// later access maps the same bytes again from the page cache (a minor
  /// fault) or the file. Use it to bound the RSS of a scan or of random reads
  /// over a file larger than the memory budget. Failures are ignored.
  void release(std::size_t offset, std::size_t length) const noexcept {
    if (!data_ || offset >= size_ || length == 0) return;
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t start = offset - offset % page;
    std::size_t end = (length > size_ - offset) ? size_ : offset + length;
    end = (end + page - 1) / page * page;
    ::madvise(const_cast<char*>(data_) + start, end - start, MADV_DONTNEED);
  }

  /// release(0, size()): drops every page of the mapping from the resident set.
  void release() const noexcept { release(0, size_); }

private:
  void unmap() noexcept {
    if (data_) ::munmap(const_cast<char*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }

  std::filesystem::path path_;
  const char* data_ = nullptr;
  std::size_t size_ = 0;
  std::int64_t mtime_ns_ = 0;
  std::int64_t ctime_ns_ = 0;
  std::uint64_t device_ = 0;
  std::uint64_t inode_ = 0;
};

} // namespace dpkit
