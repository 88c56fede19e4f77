/// @file jsonl_reader.hpp
/// @brief Opening a JSONL file with its line index (jsonl_index): header,
/// staleness and checksum checks, O(1) line access (docs/data.md "Opening and
/// reading").
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/detail/hash.hpp>
#include <dpkit/data/detail/posix_file.hpp>
#include <dpkit/data/jsonl_build.hpp>
#include <dpkit/data/jsonl_format.hpp>
#include <dpkit/data/mapped_file.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace dpkit {

/// Options of jsonl_index::open.
struct jsonl_index_open_options {
  /// Index file; empty = default_index_path(source).
  std::filesystem::path index_path;
  /// Build the index (with `build`) when it is missing, stale, or lacks the
  /// length column `build` asks for, instead of throwing. A damaged index is
  /// still refused.
  bool rebuild_if_stale = false;
  /// Options used when (re)building.
  jsonl_index_build_options build;
  /// Check the checksum of the offsets and columns (reads the whole index once;
  /// turn off for O(1) opening of very large indexes).
  bool verify_checksum = true;
  /// madvise hint for the source mapping (random access by default).
  access_advice source_advice = access_advice::random;
  /// When the source's identity (st_dev, st_ino, st_ctim) differs from the one
  /// recorded at build time while its size and mtime match (copied with its
  /// mtime, restored from a backup, or modified in place with the mtime put
  /// back): false (default) refuses the index as stale at O(1) cost; true
  /// compares the source's content hash instead (one read of the whole source,
  /// about the cost of a rebuild) and accepts the index if it matches.
  bool check_content_if_moved = false;
};

/// A JSONL file with its line index, both memory-mapped read-only.
///
/// Lines are std::string_views into the source mapping, without the '\\n' and
/// without a trailing '\\r'; they stay valid as long as the jsonl_index object
/// (or the object it was moved into) lives. Move-only. Thread-safe for
/// concurrent reads.
class jsonl_index {
  struct pread_files; // read_line's file descriptors (below)

public:
  /// Opens `source` and its index, checking the index header, layout and
  /// checksums, and that the source is unchanged: size, mtime (ns), the
  /// fingerprint of its first and last 4 KiB, and its identity (device, inode,
  /// ctime in ns; see check_content_if_moved). O(1) in the source's size; the
  /// body checksum reads the index once (verify_checksum).
  /// @throws dpkit::format_error naming the index file and what is wrong
  ///         (truncated, bad magic, version, checksum, layout);
  ///         dpkit::stale_index_error (a format_error) naming both files and
  ///         what differs when the source changed (unless rebuild_if_stale);
  ///         dpkit::invalid_argument naming the path and its type when the
  ///         source or the index is not a regular file (a FIFO, a directory,
  ///         a device: refused without opening it, so never a wait for a
  ///         writer); dpkit::error when a file cannot be opened (errno text).
  [[nodiscard]] static jsonl_index open(const std::filesystem::path& source, const jsonl_index_open_options& options = {}) {
    const std::filesystem::path ipath = options.index_path.empty() ? default_index_path(source) : options.index_path;
    if (options.rebuild_if_stale) {
      std::error_code ec;
      if (!std::filesystem::exists(ipath, ec)) build_jsonl_index(source, ipath, options.build);
      try {
        jsonl_index idx(source, ipath, options);
        if (!options.build.length_column || idx.length_column_name() == options.build.length_column->name) return idx;
      } catch (const stale_index_error&) {
      }
      build_jsonl_index(source, ipath, options.build); // stale, or lacks the wanted column
    }
    return jsonl_index(source, ipath, options);
  }

  jsonl_index(jsonl_index&&) noexcept = default;
  jsonl_index& operator=(jsonl_index&&) noexcept = default;
  jsonl_index(const jsonl_index&) = delete;
  jsonl_index& operator=(const jsonl_index&) = delete;
  ~jsonl_index() = default;

  /// Number of lines in the index (kept lines).
  [[nodiscard]] std::uint64_t size() const noexcept { return header_.lines; }
  /// True if the index has no lines.
  [[nodiscard]] bool empty() const noexcept { return header_.lines == 0; }

  /// Line `k` (0-based) without '\\n' and trailing '\\r'. Precondition:
  /// k < size(). The offsets are checked on every access in O(1), whatever the
  /// checksums said, so that a damaged index never reads outside the source
  /// and never hands out part of a line: offsets[k] < offsets[k+1] <= source
  /// size, and both at the start of the file, right after a '\\n', or (the
  /// second) at its end. With blank lines skipped the line ends at the first
  /// '\\n' (memchr, as always) and only blank lines may follow it before
  /// offsets[k+1]. That these are the offsets of line k (and not of other whole
  /// lines) rests on the checksums; verify_jsonl_index checks every offset.
  /// @throws dpkit::format_error naming the index file, k and the bad offsets.
  [[nodiscard]] std::string_view operator[](std::uint64_t k) const {
    const char* base = source_.data();
    const std::uint64_t size = source_.size();
    const std::uint64_t b = offsets_[k];
    const std::uint64_t next = offsets_[k + 1];
    if (b >= next || next > size) damaged(k, b, next, "offsets out of order or past the end of the source");
    if ((b > 0 && base[b - 1] != '\n') || (next < size && base[next - 1] != '\n'))
      damaged(k, b, next, "offset not at the start of a line");
    std::uint64_t e = next;
    if (skipped_blank_) {
      const void* p = std::memchr(base + b, '\n', next - b);
      if (p) e = static_cast<std::uint64_t>(static_cast<const char*>(p) - base);
      if (e + 1 < next && !detail::is_blank(base + e + 1, next - e - 1, true))
        damaged(k, b, next, "a non-blank line between two offsets");
    } else if (base[e - 1] == '\n') {
      --e;
    }
    if (e > b && base[e - 1] == '\r') --e;
    return {base + b, e - b};
  }

  /// Drops the pages of the source and index mappings from this process's
  /// resident set (mapped_file::release): e.g. after planning from lengths().
  /// Thread-safe; lines and spans already returned stay valid.
  void release_pages() const noexcept {
    source_.release();
    index_.release();
  }

  /// Line `k` copied into `out` (resized to the line's bytes, without '\\n'
  /// and a trailing '\\r'; the same bytes as at(k)) with pread(2) from the
  /// index and source files instead of through their mappings, with the same
  /// checks as operator[]. Random reads through a mapping add every page they
  /// fault to the resident set, and the kernel maps up to a large folio (64
  /// KiB to 2 MiB, by file system and kernel) around each fault, so reading
  /// random lines of a file larger than memory through operator[] makes the
  /// RSS approach the file's size (page cache, reclaimable, but it is what
  /// RSS limits see); read_line's RSS is `out`. Two pread calls per line (about
  /// a microsecond each on a warm page cache). The files are opened on the
  /// first call (two descriptors per index; the mappings have none) and must
  /// still be the files opened (same device and inode), except that an index
  /// replaced by an identical one (same size and header bytes: the same
  /// source, lines, columns and body checksum) is read: several ranks that
  /// find an index missing build it at once and the last rename wins, so the
  /// path of the index a rank opened may name another rank's equal build by
  /// its first read_line (this once failed a 2-rank training run with a
  /// stale_index_error). Thread-safe with a
  /// `out` per thread.
  /// @throws dpkit::invalid_argument naming k and size() if k >= size();
  ///         dpkit::format_error as operator[] for a damaged index;
  ///         dpkit::stale_index_error if the source or index path now names
  ///         another file (other than an identical index); dpkit::error on an I/O error (errno text).
  void read_line(std::uint64_t k, std::string& out) const {
    check(k, "read_line");
    pread_files& f = open_files();
    std::uint64_t off[2];
    const auto at = static_cast<std::uint64_t>(reinterpret_cast<const char*>(offsets_ + k) - index_.data());
    pread_exact(f.index.get(), off, sizeof off, at, index_path_);
    const std::uint64_t b = off[0], next = off[1], size = source_.size();
    if (b >= next || next > size) damaged(k, b, next, "offsets out of order or past the end of the source");
    const std::uint64_t from = b > 0 ? b - 1 : 0; // the byte before the line must be '\n'
    out.resize(static_cast<std::size_t>(next - from));
    pread_exact(f.source.get(), out.data(), out.size(), from, source_.path());
    if ((b > 0 && out.front() != '\n') || (next < size && out.back() != '\n')) damaged(k, b, next, "offset not at the start of a line");
    std::size_t e = out.size();
    const std::size_t lb = static_cast<std::size_t>(b - from);
    if (skipped_blank_) {
      const void* p = std::memchr(out.data() + lb, '\n', e - lb);
      if (p) e = static_cast<std::size_t>(static_cast<const char*>(p) - out.data());
      if (e + 1 < out.size() && !detail::is_blank(out.data() + e + 1, out.size() - e - 1, true))
        damaged(k, b, next, "a non-blank line between two offsets");
    } else if (out[e - 1] == '\n') {
      --e;
    }
    if (e > lb && out[e - 1] == '\r') --e;
    out.resize(e);
    out.erase(0, lb);
  }

  /// Line `k`, checked. @throws dpkit::invalid_argument naming k and size();
  /// dpkit::format_error as operator[] for a damaged index.
  [[nodiscard]] std::string_view at(std::uint64_t k) const {
    check(k, "at");
    return (*this)[k];
  }

  /// Byte offset of line `k` in the source (k <= size(); offset(size()) is the
  /// source size). @throws dpkit::invalid_argument if k > size();
  /// dpkit::format_error if the stored offset is past the end of the source or
  /// not at the start of a line (a damaged index).
  [[nodiscard]] std::uint64_t offset(std::uint64_t k) const {
    if (k > header_.lines)
      throw invalid_argument("jsonl_index::offset: line " + std::to_string(k) + " > size " + std::to_string(header_.lines) +
                             " of '" + index_path_.string() + "'");
    const std::uint64_t b = offsets_[k];
    const std::uint64_t size = source_.size();
    if (b > size || (b == size ? k != header_.lines : (b > 0 && source_.data()[b - 1] != '\n')))
      damaged(k, b, k < header_.lines ? offsets_[k + 1] : b, "offset past the end of the source or not at the start of a line");
    return b;
  }

  /// The n + 1 offsets as stored (u64 bytes; the last is the source size).
  /// Raw and unchecked beyond the first and last: use operator[] / offset(k)
  /// (checked) to read lines.
  [[nodiscard]] std::span<const std::uint64_t> offsets() const noexcept { return {offsets_, header_.lines + 1}; }

  /// 0-based line number in the source file of index line `k` (equals k unless
  /// blank lines were skipped). @throws dpkit::invalid_argument if k >= size();
  /// dpkit::format_error if the stored number is below k or not below
  /// source_line_count() (a damaged index).
  [[nodiscard]] std::uint64_t source_line(std::uint64_t k) const {
    check(k, "source_line");
    if (!source_lines_) return k;
    const std::uint64_t v = source_lines_[k];
    if (v < k || v >= header_.source_lines)
      detail::throw_format(index_path_, "damaged: line " + std::to_string(k) + " has source line number " + std::to_string(v) +
                                            " (source has " + std::to_string(header_.source_lines) + " lines); rebuild it");
    return v;
  }

  /// True if the index has a u32 length column.
  [[nodiscard]] bool has_lengths() const noexcept { return lengths_ != nullptr; }
  /// Name of the length column (e.g. "num_tokens"), empty if none.
  [[nodiscard]] const std::string& length_column_name() const noexcept { return length_name_; }
  /// The length column, one u32 per index line (empty span if none).
  [[nodiscard]] std::span<const std::uint32_t> lengths() const noexcept {
    return lengths_ ? std::span<const std::uint32_t>(lengths_, header_.lines) : std::span<const std::uint32_t>();
  }

  /// Number of lines in the source file (including skipped blank lines).
  [[nodiscard]] std::uint64_t source_line_count() const noexcept { return header_.source_lines; }
  /// True if blank lines were skipped when the index was built.
  [[nodiscard]] bool blank_lines_skipped() const noexcept { return skipped_blank_; }
  /// The source mapping.
  [[nodiscard]] const mapped_file& source() const noexcept { return source_; }
  /// The index mapping.
  [[nodiscard]] const mapped_file& index_file() const noexcept { return index_; }
  /// Path of the index file.
  [[nodiscard]] const std::filesystem::path& index_path() const noexcept { return index_path_; }

private:
  jsonl_index(const std::filesystem::path& source, const std::filesystem::path& ipath, const jsonl_index_open_options& options)
      : index_path_(ipath) {
    namespace dd = detail;
    index_ = mapped_file(ipath, access_advice::normal);
    header_ = dd::decode_header(ipath, index_.view());
    source_ = mapped_file(source, options.source_advice);
    std::string diff;
    if (source_.size() != header_.source_size)
      diff = "source size " + std::to_string(source_.size()) + " bytes, index built for " + std::to_string(header_.source_size);
    else if (source_.mtime_ns() != header_.source_mtime_ns)
      diff = "source mtime " + std::to_string(source_.mtime_ns()) + " ns, index built for " + std::to_string(header_.source_mtime_ns);
    else if (dd::source_fingerprint(source_.view()) != header_.source_fingerprint)
      diff = "source head/tail fingerprint differs";
    else if (source_.device() != header_.source_device || source_.inode() != header_.source_inode ||
             source_.ctime_ns() != header_.source_ctime_ns) {
      const std::string what = "source identity changed (device:inode " + std::to_string(source_.device()) + ":" +
                               std::to_string(source_.inode()) + ", ctime " + std::to_string(source_.ctime_ns()) +
                               " ns; index built for " + std::to_string(header_.source_device) + ":" +
                               std::to_string(header_.source_inode) + ", ctime " + std::to_string(header_.source_ctime_ns) +
                               " ns): modified in place, replaced, copied or restored";
      if (!options.check_content_if_moved)
        diff = what + " (open with check_content_if_moved, dpkit-jsonl --check-content, to compare its content instead)";
      else if (dd::source_content_hash(source_.view()) != header_.source_content_hash)
        diff = what + ", and its content hash differs";
    }
    if (!diff.empty())
      throw stale_index_error("jsonl_index: '" + ipath.string() + "' is stale for '" + source.string() + "': " + diff +
                              "; rebuild it (dpkit-jsonl index, or rebuild_if_stale)");
    if (options.verify_checksum &&
        dd::hash_bytes(index_.data() + header_.header_bytes, index_.size() - header_.header_bytes, dd::body_checksum_seed) !=
            header_.body_checksum)
      dd::throw_format(ipath, "damaged: checksum of offsets/columns mismatch");
    offsets_ = reinterpret_cast<const std::uint64_t*>(index_.data() + header_.header_bytes);
    skipped_blank_ = (header_.flags & dd::flag_blank_lines_skipped) != 0;
    if (offsets_[header_.lines] != header_.source_size || (header_.lines > 0 && !skipped_blank_ && offsets_[0] != 0))
      dd::throw_format(ipath, "damaged: first/last offset do not match the source");
    for (const auto& c : header_.columns) {
      if (c.type == dd::column_u64_source_line) source_lines_ = reinterpret_cast<const std::uint64_t*>(index_.data() + c.offset);
      if (c.type == dd::column_u32_values && !lengths_) {
        lengths_ = reinterpret_cast<const std::uint32_t*>(index_.data() + c.offset);
        length_name_ = c.name;
      }
    }
  }

  [[noreturn]] void damaged(std::uint64_t k, std::uint64_t b, std::uint64_t next, const char* why) const {
    detail::throw_format(index_path_, "damaged: line " + std::to_string(k) + " has offset " + std::to_string(b) + ", next offset " +
                                          std::to_string(next) + " (source '" + source_.path().string() + "' has " +
                                          std::to_string(source_.size()) + " bytes): " + why + "; rebuild it");
  }

  pread_files& open_files() const {
    pread_files& f = *files_;
    std::call_once(f.once, [&] {
      const auto open_same = [&](const mapped_file& m, detail::fd_guard& fd) {
        // O_NONBLOCK: the path may have been replaced by a FIFO since, whose
        // open would wait for a writer; the identity check below refuses it.
        fd = detail::fd_guard(::open(m.path().c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
        struct stat st {};
        if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) {
          f.error = detail::errno_message("jsonl_index::read_line: cannot open", m.path(), errno);
          return false;
        }
        const bool same = S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_dev) == m.device() &&
                          static_cast<std::uint64_t>(st.st_ino) == m.inode();
        if (!same && !(&m == &index_ && S_ISREG(st.st_mode) && same_index_bytes(fd.get(), st))) {
          f.error = "jsonl_index::read_line: '" + m.path().string() + "' is another file than the one opened (replaced since); reopen the index";
          f.stale = true;
          return false;
        }
        detail::clear_nonblock(fd.get());
        return true;
      };
      if (open_same(source_, f.source)) open_same(index_, f.index);
    });
    if (!f.error.empty()) {
      if (f.stale) throw stale_index_error(f.error);
      throw error(f.error);
    }
    return f;
  }

  /// True if the regular file `fd` (stat `st`) is an index equal to the one
  /// mapped: the same size and the same header bytes. The header holds the
  /// source's identity and content hash, the line count, the columns and the
  /// body's checksum (and its own), and builds are deterministic, so this is
  /// the same index rebuilt: what several ranks that find the index missing
  /// and build it at once leave behind, the last rename winning.
  [[nodiscard]] bool same_index_bytes(int fd, const struct stat& st) const {
    const std::size_t n = header_.header_bytes;
    if (static_cast<std::uint64_t>(st.st_size) != index_.size() || n == 0 || n > index_.size()) return false;
    std::vector<unsigned char> head(n);
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, head.data() + got, n - got, static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      got += static_cast<std::size_t>(r);
    }
    return std::memcmp(head.data(), index_.data(), n) == 0;
  }

  static void pread_exact(int fd, void* buf, std::size_t n, std::uint64_t at, const std::filesystem::path& path) {
    auto* p = static_cast<char*>(buf);
    while (n > 0) {
      const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(at));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw error(detail::errno_message("jsonl_index::read_line: cannot read", path, errno));
      if (r == 0) detail::throw_format(path, "read_line: the file ended early (truncated since it was opened)");
      p += r;
      n -= static_cast<std::size_t>(r);
      at += static_cast<std::uint64_t>(r);
    }
  }

  void check(std::uint64_t k, const char* what) const {
    if (k >= header_.lines)
      throw invalid_argument(std::string("jsonl_index::") + what + ": line " + std::to_string(k) + " >= size " +
                             std::to_string(header_.lines) + " of '" + index_path_.string() + "'");
  }

  std::filesystem::path index_path_;
  mapped_file index_;
  mapped_file source_;
  detail::index_header header_;
  const std::uint64_t* offsets_ = nullptr;
  const std::uint64_t* source_lines_ = nullptr;
  const std::uint32_t* lengths_ = nullptr;
  std::string length_name_;
  bool skipped_blank_ = false;

  /// The files read_line reads with pread(2): opened on first use, checked to
  /// be the files mapped at open (device and inode).
  struct pread_files {
    std::once_flag once;
    detail::fd_guard source{-1}, index{-1};
    std::string error; // why opening failed (then every read_line throws it)
    bool stale = false; // ... because a path names another file now
  };
  std::unique_ptr<pread_files> files_ = std::make_unique<pread_files>();
};

} // namespace dpkit
