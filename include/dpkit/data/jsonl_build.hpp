/// @file jsonl_build.hpp
/// @brief Building a JSONL line index: options, the threaded one-pass
/// builder and the crash-safe write (docs/data.md "Building an index").
#pragma once

#include <dpkit/core/cpus.hpp>
#include <dpkit/core/errors.hpp>
#include <dpkit/data/detail/hash.hpp>
#include <dpkit/data/detail/newline_scan.hpp>
#include <dpkit/data/detail/posix_file.hpp>
#include <dpkit/data/jsonl_format.hpp>
#include <dpkit/data/mapped_file.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dpkit {

/// Extracts one u32 value (e.g. a token count) from one line. Called with the
/// line without its newline and trailing '\\r'. Throws (any std::exception) to
/// reject the line; the builder rethrows a dpkit::format_error naming the file
/// and the 1-based line number with the exception's message.
using line_value_extractor = std::function<std::uint32_t(std::string_view line)>;

/// Extracts the u32 values of a run of consecutive whole lines at once (e.g.
/// with one simdjson document-stream parse instead of one parse per line).
/// `text` holds the lines' bytes, each line's '\\n' included (the last line
/// may lack it at the end of the file); `starts[i]` is the offset in `text` of
/// line i; `out[i]` receives its value (out.size() == starts.size()). Returns
/// false to decline the run (a line it cannot handle, e.g. invalid): the
/// builder then calls the per-line extractor on each line of the run, which
/// rejects the bad line with its own message. Must give each line the value
/// the per-line extractor gives it.
using batch_value_extractor =
    std::function<bool(std::string_view text, std::span<const std::uint64_t> starts, std::span<std::uint32_t> out)>;

/// An optional per-line u32 column (e.g. lengths in tokens from a JSON field).
struct length_column_spec {
  /// Column name stored in the index (at most 15 bytes), e.g. "num_tokens".
  std::string name;
  /// Makes one extractor per build thread (extractors may keep parser state).
  std::function<line_value_extractor()> make_extractor;
  /// Optional: makes one batch extractor per build thread, used (when blank
  /// lines are kept) on runs of about column_batch_bytes of lines, with
  /// make_extractor's extractor as the fallback for declined runs.
  std::function<batch_value_extractor()> make_batch_extractor;
};

/// Progress callback: (bytes of the source processed, total bytes of the
/// source). Called from the thread that called build_jsonl_index, at least
/// every `progress_interval_bytes` of that thread's share and once at the end.
/// Return false to cancel the build.
using build_progress = std::function<bool(std::uint64_t bytes_done, std::uint64_t bytes_total)>;

/// Options of build_jsonl_index.
struct jsonl_index_build_options {
  /// Keep (default) or skip blank lines.
  blank_line_policy blank_lines = blank_line_policy::keep;
  /// Worker threads; 0 = the CPUs the calling thread may run on
  /// (dpkit::usable_cpu_count(): its affinity mask, which mpirun's binding or
  /// taskset may make smaller than the machine). Each thread gets a
  /// contiguous byte range of at least 1 MiB.
  unsigned threads = 0;
  /// Optional u32 column filled by an extractor (see jsonl_length_column.hpp).
  std::optional<length_column_spec> length_column;
  /// Optional progress callback; returning false cancels.
  build_progress progress;
  /// Cancels the build when stop is requested.
  std::stop_token stop;
  /// Granularity of progress reports and cancellation checks, in bytes.
  std::uint64_t progress_interval_bytes = std::uint64_t{4} << 20;
  /// fsync the index before renaming it into place and its directory after
  /// (default): after a power loss the index is the old one or the new one.
  /// false skips both (scratch files, tmpfs, benchmarks): the rename stays
  /// atomic for running processes, and an index damaged by a power loss is
  /// refused at open by its size and checksums.
  bool sync = true;
};

/// What build_jsonl_index wrote.
struct jsonl_index_build_result {
  std::filesystem::path index_path; ///< The index file written.
  std::uint64_t lines = 0;          ///< Lines in the index (kept lines).
  std::uint64_t source_lines = 0;   ///< Lines in the source file.
  std::uint64_t source_bytes = 0;   ///< Size of the source in bytes.
  std::uint64_t index_bytes = 0;    ///< Size of the index file in bytes.
};

namespace detail {

/// Bytes a build stream buffers before writing them out (spill_file::append).
inline constexpr std::size_t spill_buffer_bytes = std::size_t{1} << 20;

/// Creates an unnamed temporary file in `dir` (O_TMPFILE; where the file system
/// has none, a named one unlinked at once), so it disappears with its
/// descriptor whatever happens to the process.
/// @throws dpkit::error naming the directory and errno.
inline fd_guard unnamed_temp_file(const std::filesystem::path& dir) {
#ifdef O_TMPFILE
  fd_guard fd(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (fd.get() >= 0) return fd;
#endif
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    char name[64];
    std::snprintf(name, sizeof name, ".dpkit-spill.%ld.%08x", static_cast<long>(::getpid()), static_cast<unsigned>(rd()));
    const std::filesystem::path p = dir / name;
    fd_guard f(::open(p.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (f.get() >= 0) {
      ::unlink(p.c_str());
      return f;
    }
    if (errno != EEXIST) break;
  }
  throw error(errno_message("build_jsonl_index: cannot create a temporary file in", dir, errno));
}

/// An append-only byte stream written with pwrite(2) at increasing positions of
/// a file (its own unnamed temporary file, or the index being written, from a
/// given position), through a spill_buffer_bytes buffer, optionally hashed in
/// order as it is written. Keeps a build's memory bounded whatever the number
/// of lines: the offsets and columns go to disk (the page cache) as they are
/// produced instead of being held in memory until the end.
class spill_file {
public:
  spill_file() = default;
  /// A stream in a new unnamed temporary file in `dir`.
  explicit spill_file(const std::filesystem::path& dir) : own_(unnamed_temp_file(dir)), fd_(own_.get()), path_(dir) {}
  /// A stream into `fd` (not owned) from byte `pos`, hashed into `hash` if not null.
  spill_file(int fd, std::uint64_t pos, const std::filesystem::path& path, hash_stream* hash)
      : fd_(fd), start_(pos), path_(path), hash_(hash) {}

  [[nodiscard]] bool open() const noexcept { return fd_ >= 0; }
  /// Bytes appended so far.
  [[nodiscard]] std::uint64_t bytes() const noexcept { return written_ + buf_.size(); }

  /// Appends n bytes. @throws dpkit::error on a write error (errno text).
  void append(const void* p, std::size_t n) {
    if (buf_.capacity() < spill_buffer_bytes) buf_.reserve(spill_buffer_bytes);
    if (buf_.size() + n > spill_buffer_bytes) flush();
    if (n >= spill_buffer_bytes) {
      put(p, n);
      return;
    }
    const auto* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
  }

  /// Writes the buffer out. @throws dpkit::error on a write error.
  void flush() {
    if (buf_.empty()) return;
    put(buf_.data(), buf_.size());
    buf_.clear();
  }

  /// Calls f(const char* data, std::size_t n) on the stream's bytes in order,
  /// read back in spill_buffer_bytes pieces (after flush()).
  /// @throws dpkit::error on a read error or a short file.
  template <class F>
  void read_back(F&& f) const {
    std::vector<char> piece(spill_buffer_bytes);
    for (std::uint64_t at = 0; at < written_;) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), written_ - at));
      const ssize_t r = ::pread(fd_, piece.data(), want, static_cast<off_t>(start_ + at));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) throw error(errno_message("build_jsonl_index: cannot read back a temporary file in", path_, r < 0 ? errno : EIO));
      f(static_cast<const char*>(piece.data()), static_cast<std::size_t>(r));
      at += static_cast<std::uint64_t>(r);
    }
  }

private:
  void put(const void* p, std::size_t n) {
    if (hash_) hash_->update(p, n);
    const auto* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, c, std::min<std::size_t>(n, std::size_t{1} << 30), static_cast<off_t>(start_ + written_));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw error(errno_message("build_jsonl_index: cannot write", path_, errno));
      c += w;
      n -= static_cast<std::size_t>(w);
      written_ += static_cast<std::uint64_t>(w);
    }
  }

  fd_guard own_{-1};
  int fd_ = -1;
  std::uint64_t start_ = 0, written_ = 0;
  std::filesystem::path path_;
  hash_stream* hash_ = nullptr;
  std::vector<char> buf_;
};

/// Output of one build worker (one contiguous, chunk-aligned byte range):
/// streams of its kept lines' offsets (u64), source line numbers (u64, skip
/// mode; local to the range) and length-column values (u32).
struct build_part {
  spill_file starts, source_lines, values;
  u64_buffer staged;                   // offsets not yet appended to `starts`
  std::uint64_t lines = 0;             // kept lines starting in this range
  std::uint64_t source_line_count = 0; // lines starting in this range
  bool failed = false;
  std::uint64_t error_line = 0; // local source line number of the rejected line
  std::string error_message;

  /// Moves the staged offsets to `starts` (when at least `min` are staged).
  void spill(std::size_t min = 0) {
    if (staged.size() < std::max<std::size_t>(min, 1)) return;
    starts.append(staged.data(), staged.size() * 8);
    staged.clear();
  }
};

/// Shared state of one build.
struct build_shared {
  std::atomic<std::uint64_t> bytes_done{0};
  std::atomic<bool> cancelled{false};
  std::atomic<unsigned> first_failed{~0u};
  std::atomic<unsigned> finished{0};
};

inline bool stop_now(build_shared& shared, const std::stop_token& stop, unsigned worker) {
  if (stop.stop_requested()) shared.cancelled.store(true, std::memory_order_relaxed);
  return shared.cancelled.load(std::memory_order_relaxed) || shared.first_failed.load(std::memory_order_relaxed) < worker;
}

/// Bytes the fast path scans (and hashes) between progress/cancellation checks:
/// small enough to stay in L2 between the newline scan and the content hash.
inline constexpr std::uint64_t build_step_bytes = std::uint64_t{64} << 10;
static_assert(content_chunk_bytes % build_step_bytes == 0 && build_step_bytes % 64 == 0);

/// Bytes of whole lines handed to a batch_value_extractor at once.
inline constexpr std::uint64_t column_batch_bytes = std::uint64_t{1} << 20;

/// A build thread drops the source pages it has scanned from its resident set
/// (mapped_file::release) every this many bytes.
inline constexpr std::uint64_t release_behind_bytes = std::uint64_t{8} << 20;

/// Content hash of the chunks of [begin, end) (chunk-aligned begin), fed in
/// steps while the range is scanned, so the source is read once.
class chunk_hasher {
public:
  chunk_hasher(const char* data, std::uint64_t begin, std::uint64_t end, std::uint64_t* hashes) noexcept
      : data_(data), pos_(begin), end_(end), hashes_(hashes), st_(begin / content_chunk_bytes) {}

  /// Hashes [pos, limit) (limit a multiple of 64 or end).
  void advance(std::uint64_t limit) noexcept {
    while (pos_ < limit) {
      const std::uint64_t chunk = pos_ / content_chunk_bytes;
      const std::uint64_t chunk_end = std::min(end_, (chunk + 1) * content_chunk_bytes);
      const std::uint64_t stop = std::min(limit, chunk_end);
      const auto* p = reinterpret_cast<const unsigned char*>(data_ + pos_);
      const std::uint64_t n = stop - pos_;
      st_.blocks(p, static_cast<std::size_t>(n / 64));
      pos_ += n / 64 * 64;
      if (stop == chunk_end) {
        hashes_[chunk] = st_.finish(p + n / 64 * 64, static_cast<std::size_t>(n % 64));
        pos_ = chunk_end;
        st_ = content_hasher(chunk + 1);
      } else if (n % 64) {
        break; // limit not 64-aligned inside a chunk: the rest goes with the next call
      }
    }
  }

private:
  const char* data_;
  std::uint64_t pos_, end_;
  std::uint64_t* hashes_;
  content_hasher st_;
};

/// Scans the lines that start in [begin, end) of `data` (size `size`) and
/// hashes the content chunks of [begin, end) into `chunk_hashes`. `begin` is a
/// multiple of content_chunk_bytes.
inline void build_range(const mapped_file& src, std::uint64_t begin, std::uint64_t end, unsigned worker,
                        const jsonl_index_build_options& opt, build_shared& shared, build_part& out,
                        std::uint64_t* chunk_hashes, const std::function<void()>& report) {
  const char* data = src.data();
  const std::uint64_t size = src.size();
  // the source pages already scanned leave the resident set every
  // release_behind_bytes (they stay in the page cache): the build's RSS is its
  // offsets, not the source
  std::uint64_t released = begin;
  const auto release_behind = [&](std::uint64_t now) {
    if (now - released < release_behind_bytes) return;
    src.release(static_cast<std::size_t>(released), static_cast<std::size_t>(now - released));
    released = now;
  };
  const bool skip = opt.blank_lines == blank_line_policy::skip;
  line_value_extractor extract;
  if (opt.length_column) extract = opt.length_column->make_extractor();
  chunk_hasher hasher(data, begin, end, chunk_hashes);
  const std::uint64_t interval = std::max<std::uint64_t>(opt.progress_interval_bytes, 4096);
  std::uint64_t reported = begin;
  const auto progress = [&](std::uint64_t now) {
    if (now - reported < interval && now < end) return false;
    shared.bytes_done.fetch_add(now - reported, std::memory_order_relaxed);
    reported = now;
    if (stop_now(shared, opt.stop, worker)) return true;
    if (report) report();
    return false;
  };
  if (!(skip || extract)) {
    // plain offsets: a vectorized newline scan over each step, then the content
    // hash of the same (cache-hot) step. A line starts at 0 and after each '\n'
    // at i with i + 1 in [begin, end), i.e. for newlines in [begin - 1, end - 1).
    if (begin == 0 && end > 0) out.staged.push_back(0);
    for (std::uint64_t x = begin; x < end;) {
      const std::uint64_t y = std::min(end, x + build_step_bytes);
      const std::uint64_t lo = x == 0 ? 0 : x - 1;
      const std::size_t before = out.staged.size();
      newline_starts(data + lo, static_cast<std::size_t>(y - 1 - lo), lo, out.staged);
      out.lines += out.staged.size() - before;
      out.spill(spill_buffer_bytes / 8);
      hasher.advance(y);
      x = y;
      release_behind(x);
      if (progress(x)) return;
    }
    out.lines += begin == 0 && end > 0 ? 1 : 0;
    out.spill();
    out.starts.flush();
    out.source_line_count = out.lines;
    return;
  }
  std::uint64_t s = begin;
  if (begin > 0 && data[begin - 1] != '\n') {
    const void* p = begin < end ? std::memchr(data + begin, '\n', end - begin) : nullptr;
    s = p ? static_cast<std::uint64_t>(static_cast<const char*>(p) - data) + 1 : end;
  }
  // the per-line extractor on line [b, e) (local source line `local`); false
  // when it rejected the line (recorded in `out`, the build fails)
  const auto extract_line = [&](std::uint64_t b, std::uint64_t e, std::uint64_t local) {
    std::string_view line(data + b, e - b);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    try {
      const std::uint32_t v = extract(line);
      out.values.append(&v, 4);
      return true;
    } catch (const std::exception& ex) {
      out.failed = true;
      out.error_line = local;
      out.error_message = ex.what();
      unsigned cur = shared.first_failed.load();
      while (worker < cur && !shared.first_failed.compare_exchange_weak(cur, worker)) {
      }
      return false;
    }
  };
  if (extract && !skip && opt.length_column->make_batch_extractor) {
    // runs of about column_batch_bytes of whole lines through the batch
    // extractor; a declined run goes line by line through extract_line
    const batch_value_extractor batch = opt.length_column->make_batch_extractor();
    u64_buffer rel; // starts of the run's lines, relative to s
    std::vector<std::uint32_t> vals;
    while (s < end) {
      // the lines that start in [s, limit): s and one after every '\n' in
      // [s, limit - 1), found by the vectorized scan (a memchr per line cost
      // a fifth of the column build at 19 bytes per line); the run's text
      // ends after the last of them
      rel.clear();
      const std::uint64_t limit = std::min(end, s + column_batch_bytes);
      rel.push_back(0);
      if (limit - 1 > s) newline_starts(data + s, static_cast<std::size_t>(limit - 1 - s), 0, rel);
      const std::uint64_t last = s + rel.data()[rel.size() - 1];
      const void* nl = std::memchr(data + last, '\n', size - last);
      const std::uint64_t t = nl ? static_cast<std::uint64_t>(static_cast<const char*>(nl) - data) + 1 : size + 1;
      const std::uint64_t text_end = std::min(t, size);
      vals.resize(rel.size());
      if (batch(std::string_view(data + s, text_end - s), std::span<const std::uint64_t>(rel.data(), rel.size()), vals)) {
        out.values.append(vals.data(), vals.size() * 4);
      } else {
        for (std::size_t i = 0; i < rel.size(); ++i) {
          const std::uint64_t b = s + rel.data()[i];
          const std::uint64_t e = i + 1 < rel.size() ? s + rel.data()[i + 1] - 1 : (t > size ? size : t - 1);
          if (!extract_line(b, e, out.source_line_count + i)) return;
        }
      }
      for (std::size_t i = 0; i < rel.size(); ++i) out.staged.push_back(s + rel.data()[i]);
      out.spill(spill_buffer_bytes / 8);
      out.lines += rel.size();
      out.source_line_count += rel.size();
      s = t;
      hasher.advance(std::min(s, end) / 64 * 64);
      release_behind(std::min(s, end) / 64 * 64);
      if (progress(std::min(s, end))) return;
    }
    s = end; // the tail below: hash and report the rest of the range
  }
  while (s < end) {
    const void* p = std::memchr(data + s, '\n', size - s);
    const std::uint64_t e = p ? static_cast<std::uint64_t>(static_cast<const char*>(p) - data) : size;
    const std::uint64_t local = out.source_line_count++;
    if (!(skip && is_blank(data + s, e - s))) {
      out.staged.push_back(s);
      ++out.lines;
      out.spill(spill_buffer_bytes / 8);
      if (skip) out.source_lines.append(&local, 8);
      if (extract && !extract_line(s, e, local)) return;
    }
    s = e + 1;
    if (s - reported >= interval || s >= end) {
      hasher.advance(std::min(s, end) / 64 * 64);
      release_behind(std::min(s, end) / 64 * 64);
      if (progress(std::min(s, end))) return;
    }
  }
  hasher.advance(end);
  if (reported < end) shared.bytes_done.fetch_add(end - reported, std::memory_order_relaxed);
  out.spill();
  out.starts.flush();
  out.source_lines.flush();
  out.values.flush();
}

/// Refuses an index path that exists and is not a regular file (a device, FIFO,
/// directory, socket or symbolic link), before any work and without touching it.
/// @throws dpkit::invalid_argument naming the path and what it is;
///         dpkit::error if it cannot be stat'ed for another reason than ENOENT.
inline void check_index_target(const std::filesystem::path& target) {
  struct stat st {};
  if (::lstat(target.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw error(errno_message("build_jsonl_index: cannot stat index path", target, errno));
  }
  if (S_ISREG(st.st_mode)) return;
  std::string what = std::string("a ") + file_type_name(st.st_mode);
  if (S_ISLNK(st.st_mode)) {
    struct stat to {};
    what += ::stat(target.c_str(), &to) == 0 ? std::string(" to a ") + file_type_name(to.st_mode) : std::string(" (dangling)");
  }
  throw invalid_argument("build_jsonl_index: index path '" + target.string() + "' exists and is " + what +
                         ", not a regular file; refusing to replace it (give another --index path)");
}

/// Prefix of the named temporaries of `index_path`: "<index>.tmp.".
inline std::string temp_prefix(const std::filesystem::path& index_path) { return index_path.filename().string() + ".tmp."; }

/// Removes "<index>.tmp.<pid>.<random>" files left in `dir` by builds whose
/// process is gone (a crash between linking and renaming, or a build on a file
/// system without O_TMPFILE). Temporaries of live processes are left alone.
inline void remove_dead_temporaries(const std::filesystem::path& dir, const std::filesystem::path& index_path) {
  const std::string prefix = temp_prefix(index_path);
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), e; !ec && it != e; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    char* after = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &after, 10);
    if (pid <= 0 || !after || *after != '.' || pid == static_cast<long>(::getpid())) continue;
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::unlink(it->path().c_str());
  }
}

/// The index being written: an unnamed O_TMPFILE in the target's directory
/// (nothing to clean up if the process dies), linked under a temporary name and
/// renamed over the target only when complete. Falls back to a named temporary
/// ("<index>.tmp.<pid>.<random>", removed on failure, and by the next build if
/// the process was killed) where the file system has no O_TMPFILE.
class index_temp_file {
public:
  index_temp_file(const std::filesystem::path& index_path) : target_(index_path) {
    dir_ = index_path.parent_path();
    if (dir_.empty()) dir_ = ".";
    remove_dead_temporaries(dir_, index_path);
    named_ = index_path;
    std::random_device rd;
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%08x", static_cast<long>(::getpid()), static_cast<unsigned>(rd()));
    named_ += suffix;
#ifdef O_TMPFILE
    fd_ = fd_guard(::open(dir_.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644));
#endif
    if (fd_.get() < 0) {
      fd_ = fd_guard(::open(named_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (fd_.get() < 0) throw error(errno_message("build_jsonl_index: cannot create", named_, errno));
      linked_ = true;
    }
  }
  index_temp_file(const index_temp_file&) = delete;
  index_temp_file& operator=(const index_temp_file&) = delete;
  ~index_temp_file() {
    if (linked_) ::unlink(named_.c_str());
  }

  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  [[nodiscard]] const std::filesystem::path& name() const noexcept { return named_; }

  /// fsyncs (if `sync`), closes, links (O_TMPFILE) and renames the file over
  /// the target, after checking again that the target is not (now) a
  /// non-regular file; then fsyncs the directory (if `sync`).
  void publish(bool sync) {
    if (sync && ::fsync(fd_.get()) != 0) throw error(errno_message("build_jsonl_index: cannot fsync", named_, errno));
    if (!linked_) {
      const std::string proc = "/proc/self/fd/" + std::to_string(fd_.get());
      if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, named_.c_str(), AT_SYMLINK_FOLLOW) != 0 &&
          ::linkat(fd_.get(), "", AT_FDCWD, named_.c_str(), AT_EMPTY_PATH) != 0)
        throw error(errno_message("build_jsonl_index: cannot link the temporary index as", named_, errno));
      linked_ = true;
    }
    if (::close(fd_.release()) != 0) throw error(errno_message("build_jsonl_index: cannot close", named_, errno));
    check_index_target(target_);
    if (::rename(named_.c_str(), target_.c_str()) != 0)
      throw error(errno_message("build_jsonl_index: cannot rename temporary index to", target_, errno));
    linked_ = false;
    if (!sync) return;
    const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

private:
  std::filesystem::path target_, dir_, named_;
  fd_guard fd_{-1};
  bool linked_ = false; // named_ exists and is ours to remove
};

} // namespace detail

/// Builds the line index of `source` and writes it to `index_path`.
///
/// One pass over the mapping, split into contiguous 1 MiB-aligned byte ranges
/// over `options.threads` threads: a vectorized newline scan (AVX-512BW / AVX2
/// where the CPU has them, memchr otherwise; memchr per line with blank-line
/// skipping or a length column) and, in the same pass, the content hash of the
/// source (docs/jsonl-index-format.md). Memory is O(threads), not O(lines):
/// range 0's offsets are written into the index as they are found, the other
/// ranges' offsets and the columns into unnamed temporary files in the index's
/// directory (up to the index's size again on disk while building), appended
/// in order at the end; scanned source pages leave the resident set every
/// 8 MiB. The index is written to an unnamed temporary file (O_TMPFILE) in the
/// target's directory, fsync'ed, linked and renamed over `index_path` (then the
/// directory is fsync'ed), so readers never see a partial index and a killed
/// build leaves nothing behind.
///
/// A line is the bytes up to (not including) '\\n'; a last line without '\\n'
/// counts; an empty file has 0 lines.
/// @throws dpkit::invalid_argument, before reading anything, if `index_path`
///         exists and is not a regular file (device, FIFO, directory, socket,
///         symbolic link): it is never replaced; also for a column name longer
///         than 15 bytes, and when `source` is not a regular file (a FIFO is
///         refused without opening it: never a wait for a writer).
/// @throws build_cancelled if the progress callback returns false or the stop
///         token fires (no index and no temporary file are left behind).
/// @throws dpkit::format_error naming the source and the 1-based line number
///         if the length-column extractor rejects a line.
/// @throws dpkit::error (with errno text) on I/O errors.
inline jsonl_index_build_result build_jsonl_index(const std::filesystem::path& source, const std::filesystem::path& index_path,
                                                  const jsonl_index_build_options& options = {}) {
  namespace dd = detail;
  dd::check_index_target(index_path);
  if (options.length_column && (options.length_column->name.empty() || options.length_column->name.size() > 15))
    throw invalid_argument("build_jsonl_index: column name '" + options.length_column->name + "' must have 1 to 15 bytes");
  if (options.length_column && !options.length_column->make_extractor)
    throw invalid_argument("build_jsonl_index: column '" + options.length_column->name + "' has no extractor");
  const mapped_file src(source, access_advice::sequential);
  const std::uint64_t size = src.size();
  const std::uint64_t chunks = (size + dd::content_chunk_bytes - 1) / dd::content_chunk_bytes;
  unsigned threads = options.threads ? options.threads : usable_cpu_count();
  threads = static_cast<unsigned>(std::clamp<std::uint64_t>(chunks, 1, threads));
  const auto range_begin = [&](unsigned t) { return std::min(size, chunks * t / threads * dd::content_chunk_bytes); };

  const bool skip = options.blank_lines == blank_line_policy::skip;
  const std::size_t ncols = (skip ? 1 : 0) + (options.length_column ? 1 : 0);
  const auto header_bytes = static_cast<std::uint32_t>(dd::index_fixed_header_bytes + ncols * dd::index_column_descriptor_bytes);

  // the index is written while the source is scanned: range 0's offsets go
  // straight into it (hashed as they go), the other ranges' offsets and the
  // columns into unnamed temporary files beside it, appended at the end
  dd::index_temp_file tmp(index_path);
  dd::hash_stream body(dd::body_checksum_seed);
  const std::filesystem::path dir = index_path.parent_path().empty() ? std::filesystem::path(".") : index_path.parent_path();
  dd::build_shared shared;
  std::vector<dd::build_part> parts(threads);
  for (unsigned t = 0; t < threads; ++t) {
    parts[t].starts = t == 0 ? dd::spill_file(tmp.fd(), header_bytes, tmp.name(), &body) : dd::spill_file(dir);
    if (skip) parts[t].source_lines = dd::spill_file(dir);
    if (options.length_column) parts[t].values = dd::spill_file(dir);
  }
  std::vector<std::uint64_t> chunk_hashes(chunks);
  std::uint64_t last_done = ~std::uint64_t{0};
  const auto report = [&]() {
    if (!options.progress) return;
    const std::uint64_t done = shared.bytes_done.load(std::memory_order_relaxed);
    if (done == last_done) return;
    last_done = done;
    if (!options.progress(done, size)) shared.cancelled.store(true);
  };
  const std::function<void()> report_fn = report;
  {
    std::vector<std::jthread> workers;
    workers.reserve(threads - 1);
    for (unsigned t = 1; t < threads; ++t)
      workers.emplace_back([&, t] {
        dd::build_range(src, range_begin(t), range_begin(t + 1), t, options, shared, parts[t], chunk_hashes.data(), {});
        shared.finished.fetch_add(1);
      });
    dd::build_range(src, 0, range_begin(1), 0, options, shared, parts[0], chunk_hashes.data(), report_fn);
    while (shared.finished.load() < threads - 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      report();
    }
  } // joins
  if (!shared.cancelled.load()) report(); // final report (bytes_done == size)
  if (options.stop.stop_requested()) shared.cancelled.store(true);
  if (shared.cancelled.load())
    throw build_cancelled("build_jsonl_index: cancelled after " + std::to_string(shared.bytes_done.load()) + " of " +
                          std::to_string(size) + " bytes of '" + source.string() + "'; no index written");
  std::uint64_t lines = 0, source_lines = 0;
  for (unsigned t = 0; t < threads; ++t) {
    if (parts[t].failed)
      throw format_error("build_jsonl_index: '" + source.string() + "' line " + std::to_string(source_lines + parts[t].error_line + 1) +
                         ": " + parts[t].error_message);
    lines += parts[t].lines;
    source_lines += parts[t].source_line_count;
  }

  dd::index_header h;
  h.flags = skip ? dd::flag_blank_lines_skipped : 0;
  h.source_size = size;
  h.source_mtime_ns = src.mtime_ns();
  h.source_fingerprint = dd::source_fingerprint(src.view());
  h.source_device = src.device();
  h.source_inode = src.inode();
  h.source_ctime_ns = src.ctime_ns();
  h.source_content_hash = dd::content_hash_combine(chunk_hashes.data(), chunk_hashes.size(), size);
  h.lines = lines;
  h.source_lines = source_lines;
  h.header_bytes = header_bytes;
  std::uint64_t at = h.header_bytes + (lines + 1) * 8;
  if (skip) {
    h.columns.push_back({"source_line", dd::column_u64_source_line, at});
    at += dd::index_header::column_bytes(dd::column_u64_source_line, lines);
  }
  if (options.length_column) {
    h.columns.push_back({options.length_column->name, dd::column_u32_values, at});
    at += dd::index_header::column_bytes(dd::column_u32_values, lines);
  }
  const std::uint64_t total = at;

  // the rest of the body after range 0's offsets, appended (and hashed) in order
  dd::spill_file rest(tmp.fd(), header_bytes + parts[0].starts.bytes(), tmp.name(), &body);
  for (unsigned t = 1; t < threads; ++t) parts[t].starts.read_back([&](const char* p, std::size_t n) { rest.append(p, n); });
  rest.append(&size, 8);
  if (skip) {
    std::uint64_t base = 0;
    for (unsigned t = 0; t < threads; ++t) {
      parts[t].source_lines.read_back([&](const char* p, std::size_t n) {
        for (std::size_t k = 0; k + 8 <= n; k += 8) {
          std::uint64_t v;
          std::memcpy(&v, p + k, 8);
          v += base;
          rest.append(&v, 8);
        }
      });
      base += parts[t].source_line_count;
    }
  }
  if (options.length_column) {
    for (unsigned t = 0; t < threads; ++t) parts[t].values.read_back([&](const char* p, std::size_t n) { rest.append(p, n); });
    if (lines % 2) {
      const std::uint32_t pad = 0;
      rest.append(&pad, 4);
    }
  }
  rest.flush();
  const std::uint64_t written = header_bytes + parts[0].starts.bytes() + rest.bytes();
  parts.clear();
  parts.shrink_to_fit();
  if (written != total)
    throw error("build_jsonl_index: wrote " + std::to_string(written) + " bytes to '" + tmp.name().string() + "', expected " +
                std::to_string(total));
  h.body_checksum = body.finish();
  const std::vector<unsigned char> header = dd::encode_header(h);
  if (::pwrite(tmp.fd(), header.data(), header.size(), 0) != static_cast<ssize_t>(header.size()))
    throw error(dd::errno_message("build_jsonl_index: cannot write header of", tmp.name(), errno));
  if (options.stop.stop_requested())
    throw build_cancelled("build_jsonl_index: cancelled before renaming the index of '" + source.string() + "'; no index written");
  tmp.publish(options.sync);
  return {index_path, lines, source_lines, size, total};
}

/// build_jsonl_index(source, default_index_path(source), options).
inline jsonl_index_build_result build_jsonl_index(const std::filesystem::path& source, const jsonl_index_build_options& options = {}) {
  return build_jsonl_index(source, default_index_path(source), options);
}

} // namespace dpkit
