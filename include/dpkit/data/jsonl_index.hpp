/// @file jsonl_index.hpp
/// @brief Line index over a memory-mapped JSONL file: build, write, open,
/// verify; and a dataset of several shards with global line numbers.
///
/// Design section 5. The on-disk format is documented byte by byte in
/// docs/jsonl-index-format.md; the default index path is the source path with
/// ".idx" appended. This header depends only on the standard library and POSIX;
/// a length column taken from a JSON field is provided by
/// dpkit/data/jsonl_length_column.hpp (simdjson) through length_column_spec.
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/detail/hash.hpp>
#include <dpkit/data/mapped_file.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
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
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dpkit {

static_assert(std::endian::native == std::endian::little,
              "dpkit's JSONL index maps little-endian u64/u32 arrays directly; big-endian hosts are not supported");

/// A JSONL index build was cancelled (progress callback returned false, or the
/// stop token was triggered). No index file and no temporary file are left
/// behind. Derives dpkit::error.
class build_cancelled : public error {
public:
  using error::error;
};

/// An index file is well-formed but describes another version of its source
/// (size, modification time or head/tail fingerprint differ). The message names
/// both files and what differs. Derives dpkit::format_error.
class stale_index_error : public format_error {
public:
  using format_error::format_error;
};

/// What the index does with blank lines (empty, or only ASCII whitespace
/// ' ', '\\t', '\\r', '\\f', '\\v').
enum class blank_line_policy {
  keep, ///< Every line of the file is a line of the index (default).
  skip, ///< Blank lines are left out: index line k is the k-th non-blank line;
        ///< jsonl_index::source_line(k) gives its line number in the file.
};

/// Extracts one u32 value (e.g. a token count) from one line. Called with the
/// line without its newline and trailing '\\r'. Throws (any std::exception) to
/// reject the line; the builder rethrows a dpkit::format_error naming the file
/// and the 1-based line number with the exception's message.
using line_value_extractor = std::function<std::uint32_t(std::string_view line)>;

/// An optional per-line u32 column (e.g. lengths in tokens from a JSON field).
struct length_column_spec {
  /// Column name stored in the index (at most 15 bytes), e.g. "num_tokens".
  std::string name;
  /// Makes one extractor per build thread (extractors may keep parser state).
  std::function<line_value_extractor()> make_extractor;
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
  /// Worker threads; 0 = std::thread::hardware_concurrency(). Each thread gets a
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
};

/// What build_jsonl_index wrote.
struct jsonl_index_build_result {
  std::filesystem::path index_path; ///< The index file written.
  std::uint64_t lines = 0;          ///< Lines in the index (kept lines).
  std::uint64_t source_lines = 0;   ///< Lines in the source file.
  std::uint64_t source_bytes = 0;   ///< Size of the source in bytes.
  std::uint64_t index_bytes = 0;    ///< Size of the index file in bytes.
};

/// The default index path of a source: the source path with ".idx" appended
/// ("data/train.jsonl" -> "data/train.jsonl.idx").
inline std::filesystem::path default_index_path(const std::filesystem::path& source) {
  std::filesystem::path p = source;
  p += ".idx";
  return p;
}

namespace detail::data {

inline constexpr std::array<char, 8> index_magic = {'D', 'P', 'K', 'J', 'S', 'O', 'N', 'L'};
inline constexpr std::uint32_t index_version = 1;
inline constexpr std::size_t index_fixed_header_bytes = 96;
inline constexpr std::size_t index_column_descriptor_bytes = 32;
inline constexpr std::uint64_t flag_blank_lines_skipped = 1;
inline constexpr std::uint32_t column_u32_values = 1;   // u32 per index line (lengths)
inline constexpr std::uint32_t column_u64_source_line = 2; // u64 source line number per index line
inline constexpr std::size_t fingerprint_window = 4096;
inline constexpr std::uint64_t header_checksum_seed = 0x6470'6b69'7468'6472ULL;
inline constexpr std::uint64_t body_checksum_seed = 0x6470'6b69'7462'6f64ULL;

/// Fingerprint of a source: hash of its first and last 4 KiB (windows overlap
/// for small files), seeded with its size.
inline std::uint64_t source_fingerprint(std::string_view bytes) noexcept {
  const std::size_t n = bytes.size();
  const std::size_t w = std::min(n, fingerprint_window);
  const std::uint64_t h = hash_bytes(bytes.data(), w, n);
  return hash_bytes(bytes.data() + (n - w), w, h);
}

inline void put_u32(unsigned char* p, std::uint32_t v) noexcept { std::memcpy(p, &v, 4); }
inline void put_u64(unsigned char* p, std::uint64_t v) noexcept { std::memcpy(p, &v, 8); }
inline std::uint32_t get_u32(const unsigned char* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline std::uint64_t get_u64(const unsigned char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline bool is_blank(const char* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') return false;
  }
  return true;
}

/// One column descriptor as stored in the header.
struct column_descriptor {
  std::string name;
  std::uint32_t type = 0;
  std::uint64_t offset = 0; // bytes from the start of the index file
};

/// The decoded header of an index file.
struct index_header {
  std::uint32_t version = index_version;
  std::uint32_t header_bytes = 0;
  std::uint64_t flags = 0;
  std::uint64_t source_size = 0;
  std::int64_t source_mtime_ns = 0;
  std::uint64_t source_fingerprint = 0;
  std::uint64_t lines = 0;
  std::uint64_t source_lines = 0;
  std::uint64_t body_checksum = 0;
  std::vector<column_descriptor> columns;

  [[nodiscard]] static std::uint64_t column_bytes(std::uint32_t type, std::uint64_t lines) noexcept {
    const std::uint64_t raw = type == column_u32_values ? lines * 4 : lines * 8;
    return (raw + 7) / 8 * 8;
  }
};

/// Serializes a header (checksum included) into header_bytes bytes.
inline std::vector<unsigned char> encode_header(const index_header& h) {
  std::vector<unsigned char> b(h.header_bytes, 0);
  std::memcpy(b.data(), index_magic.data(), 8);
  put_u32(&b[8], h.version);
  put_u32(&b[12], h.header_bytes);
  put_u64(&b[16], h.flags);
  put_u64(&b[24], h.source_size);
  put_u64(&b[32], static_cast<std::uint64_t>(h.source_mtime_ns));
  put_u64(&b[40], h.source_fingerprint);
  put_u64(&b[48], h.lines);
  put_u64(&b[56], h.source_lines);
  put_u32(&b[64], static_cast<std::uint32_t>(h.columns.size()));
  put_u32(&b[68], 0);
  put_u64(&b[72], h.body_checksum);
  // [80, 88): header checksum, filled last; [88, 96): reserved (0)
  for (std::size_t c = 0; c < h.columns.size(); ++c) {
    unsigned char* d = &b[index_fixed_header_bytes + c * index_column_descriptor_bytes];
    std::memcpy(d, h.columns[c].name.data(), h.columns[c].name.size());
    put_u32(d + 16, h.columns[c].type);
    put_u32(d + 20, 0);
    put_u64(d + 24, h.columns[c].offset);
  }
  put_u64(&b[80], hash_bytes(b.data(), b.size(), header_checksum_seed));
  return b;
}

/// Throws format_error "<what>: '<path>': <detail>".
[[noreturn]] inline void throw_format(const std::filesystem::path& path, const std::string& detail) {
  throw format_error("jsonl_index: '" + path.string() + "': " + detail);
}

/// Decodes and checks a header: size, magic, version, header checksum, layout
/// (file size implied by line count and columns). Does not look at the source.
inline index_header decode_header(const std::filesystem::path& path, std::string_view file) {
  const auto* b = reinterpret_cast<const unsigned char*>(file.data());
  if (file.size() < index_fixed_header_bytes)
    throw_format(path, "truncated: " + std::to_string(file.size()) + " bytes, the header alone needs " +
                           std::to_string(index_fixed_header_bytes));
  if (std::memcmp(b, index_magic.data(), 8) != 0) throw_format(path, "bad magic: not a dpkit JSONL index");
  index_header h;
  h.version = get_u32(b + 8);
  if (h.version != index_version)
    throw_format(path, "version " + std::to_string(h.version) + ", this dpkit reads version " + std::to_string(index_version));
  h.header_bytes = get_u32(b + 12);
  const std::uint32_t ncols = get_u32(b + 64);
  if (ncols > 64 || h.header_bytes != index_fixed_header_bytes + ncols * index_column_descriptor_bytes)
    throw_format(path, "damaged header: header size " + std::to_string(h.header_bytes) + " with " + std::to_string(ncols) +
                           " columns");
  if (file.size() < h.header_bytes)
    throw_format(path, "truncated: " + std::to_string(file.size()) + " bytes, header needs " + std::to_string(h.header_bytes));
  {
    std::vector<unsigned char> copy(b, b + h.header_bytes);
    put_u64(&copy[80], 0);
    const std::uint64_t want = get_u64(b + 80);
    if (hash_bytes(copy.data(), copy.size(), header_checksum_seed) != want)
      throw_format(path, "damaged header: header checksum mismatch");
  }
  h.flags = get_u64(b + 16);
  h.source_size = get_u64(b + 24);
  h.source_mtime_ns = static_cast<std::int64_t>(get_u64(b + 32));
  h.source_fingerprint = get_u64(b + 40);
  h.lines = get_u64(b + 48);
  h.source_lines = get_u64(b + 56);
  h.body_checksum = get_u64(b + 72);
  if (h.lines > h.source_lines || h.lines >= (std::uint64_t{1} << 60))
    throw_format(path, "damaged header: line count " + std::to_string(h.lines));
  std::uint64_t expect = h.header_bytes + (h.lines + 1) * 8;
  for (std::uint32_t c = 0; c < ncols; ++c) {
    const unsigned char* d = b + index_fixed_header_bytes + c * index_column_descriptor_bytes;
    column_descriptor col;
    col.name.assign(reinterpret_cast<const char*>(d), strnlen(reinterpret_cast<const char*>(d), 16));
    col.type = get_u32(d + 16);
    col.offset = get_u64(d + 24);
    if (col.type != column_u32_values && col.type != column_u64_source_line)
      throw_format(path, "unknown column type " + std::to_string(col.type) + " for column '" + col.name + "'");
    if (col.offset != expect)
      throw_format(path, "damaged header: column '" + col.name + "' at offset " + std::to_string(col.offset) + ", expected " +
                             std::to_string(expect));
    expect += index_header::column_bytes(col.type, h.lines);
    h.columns.push_back(std::move(col));
  }
  if (file.size() != expect)
    throw_format(path, "size " + std::to_string(file.size()) + " bytes, the header implies " + std::to_string(expect) +
                           " (truncated or trailing bytes)");
  return h;
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

inline void write_all(int fd, const void* data, std::size_t n, const std::filesystem::path& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw error(errno_message("jsonl_index: cannot write", path, errno));
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

/// Output of one build worker (one contiguous byte range of the source).
struct build_part {
  std::vector<std::uint64_t> starts;       // byte offset of each kept line
  std::vector<std::uint64_t> source_lines; // local source line number of each kept line (skip mode)
  std::vector<std::uint32_t> values;       // length column
  std::uint64_t source_line_count = 0;     // lines starting in this range
  bool failed = false;
  std::uint64_t error_line = 0; // local source line number of the rejected line
  std::string error_message;
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

/// Scans the lines that start in [begin, end) of `data` (size `size`).
inline void build_range(const char* data, std::uint64_t size, std::uint64_t begin, std::uint64_t end, unsigned worker,
                        const jsonl_index_build_options& opt, build_shared& shared, build_part& out,
                        const std::function<void()>& report) {
  const bool skip = opt.blank_lines == blank_line_policy::skip;
  line_value_extractor extract;
  if (opt.length_column) extract = opt.length_column->make_extractor();
  std::uint64_t s = begin;
  if (begin > 0 && data[begin - 1] != '\n') {
    const void* p = begin < end ? std::memchr(data + begin, '\n', end - begin) : nullptr;
    s = p ? static_cast<std::uint64_t>(static_cast<const char*>(p) - data) + 1 : end;
  }
  const std::uint64_t interval = std::max<std::uint64_t>(opt.progress_interval_bytes, 4096);
  std::uint64_t reported = begin;
  if (!(skip || extract)) {
    // plain offsets: the hot loop is memchr only
    while (s < end) {
      const std::uint64_t limit = std::min(end, s + interval);
      while (s < limit) {
        out.starts.push_back(s);
        const void* p = std::memchr(data + s, '\n', size - s);
        s = p ? static_cast<std::uint64_t>(static_cast<const char*>(p) - data) + 1 : size;
      }
      const std::uint64_t now = std::min(s, end);
      shared.bytes_done.fetch_add(now - reported, std::memory_order_relaxed);
      reported = now;
      if (stop_now(shared, opt.stop, worker)) return;
      if (report) report();
    }
    out.source_line_count = out.starts.size();
    return;
  }
  while (s < end) {
    const void* p = std::memchr(data + s, '\n', size - s);
    const std::uint64_t e = p ? static_cast<std::uint64_t>(static_cast<const char*>(p) - data) : size;
    const std::uint64_t local = out.source_line_count++;
    if (!(skip && is_blank(data + s, e - s))) {
      out.starts.push_back(s);
      if (skip) out.source_lines.push_back(local);
      if (extract) {
        std::string_view line(data + s, e - s);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        try {
          out.values.push_back(extract(line));
        } catch (const std::exception& ex) {
          out.failed = true;
          out.error_line = local;
          out.error_message = ex.what();
          unsigned cur = shared.first_failed.load();
          while (worker < cur && !shared.first_failed.compare_exchange_weak(cur, worker)) {
          }
          return;
        }
      }
    }
    s = e + 1;
    if (s - reported >= interval || s >= end) {
      const std::uint64_t now = std::min(s, end);
      shared.bytes_done.fetch_add(now - reported, std::memory_order_relaxed);
      reported = now;
      if (stop_now(shared, opt.stop, worker)) return;
      if (report) report();
    }
  }
}

} // namespace detail::data

/// Builds the line index of `source` and writes it to `index_path`.
///
/// One pass over the mapping (memchr per line), split into contiguous byte
/// ranges over `options.threads` threads; per-range offsets are concatenated in
/// order. The index is written to a temporary file in the same directory
/// ("<index>.tmp.<pid>.<random>"), fsync'ed and renamed over `index_path`
/// (then the directory is fsync'ed), so readers never see a partial index.
///
/// A line is the bytes up to (not including) '\\n'; a last line without '\\n'
/// counts; an empty file has 0 lines.
/// @throws build_cancelled if the progress callback returns false or the stop
///         token fires (no index and no temporary file are left behind).
/// @throws dpkit::format_error naming the source and the 1-based line number
///         if the length-column extractor rejects a line.
/// @throws dpkit::error (with errno text) on I/O errors;
///         dpkit::invalid_argument for a column name longer than 15 bytes.
inline jsonl_index_build_result build_jsonl_index(const std::filesystem::path& source, const std::filesystem::path& index_path,
                                                  const jsonl_index_build_options& options = {}) {
  namespace dd = detail::data;
  if (options.length_column && (options.length_column->name.empty() || options.length_column->name.size() > 15))
    throw invalid_argument("build_jsonl_index: column name '" + options.length_column->name + "' must have 1 to 15 bytes");
  if (options.length_column && !options.length_column->make_extractor)
    throw invalid_argument("build_jsonl_index: column '" + options.length_column->name + "' has no extractor");
  const mapped_file src(source, access_advice::sequential);
  const std::uint64_t size = src.size();
  unsigned threads = options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::clamp<std::uint64_t>(size >> 20, 1, threads));

  dd::build_shared shared;
  std::vector<dd::build_part> parts(threads);
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
        dd::build_range(src.data(), size, size * t / threads, size * (t + 1) / threads, t, options, shared, parts[t], {});
        shared.finished.fetch_add(1);
      });
    dd::build_range(src.data(), size, 0, size / threads, 0, options, shared, parts[0], report_fn);
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
    lines += parts[t].starts.size();
    source_lines += parts[t].source_line_count;
  }

  dd::index_header h;
  h.flags = options.blank_lines == blank_line_policy::skip ? dd::flag_blank_lines_skipped : 0;
  h.source_size = size;
  h.source_mtime_ns = src.mtime_ns();
  h.source_fingerprint = dd::source_fingerprint(src.view());
  h.lines = lines;
  h.source_lines = source_lines;
  const std::size_t ncols = (options.blank_lines == blank_line_policy::skip ? 1 : 0) + (options.length_column ? 1 : 0);
  h.header_bytes = static_cast<std::uint32_t>(dd::index_fixed_header_bytes + ncols * dd::index_column_descriptor_bytes);
  std::uint64_t at = h.header_bytes + (lines + 1) * 8;
  if (options.blank_lines == blank_line_policy::skip) {
    h.columns.push_back({"source_line", dd::column_u64_source_line, at});
    at += dd::index_header::column_bytes(dd::column_u64_source_line, lines);
  }
  if (options.length_column) {
    h.columns.push_back({options.length_column->name, dd::column_u32_values, at});
    at += dd::index_header::column_bytes(dd::column_u32_values, lines);
  }
  const std::uint64_t total = at;

  // temporary file next to the target
  std::filesystem::path tmp = index_path;
  {
    std::random_device rd;
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%08x", static_cast<long>(::getpid()), static_cast<unsigned>(rd()));
    tmp += suffix;
  }
  dd::fd_guard fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw error(dd::errno_message("build_jsonl_index: cannot create", tmp, errno));
  dd::unlink_guard remove_tmp(tmp);
  {
    std::vector<unsigned char> placeholder(h.header_bytes, 0);
    dd::write_all(fd.get(), placeholder.data(), placeholder.size(), tmp);
    for (const auto& p : parts) dd::write_all(fd.get(), p.starts.data(), p.starts.size() * 8, tmp);
    dd::write_all(fd.get(), &size, 8, tmp);
    if (options.blank_lines == blank_line_policy::skip) {
      std::uint64_t base = 0;
      for (auto& p : parts) {
        for (auto& v : p.source_lines) v += base;
        base += p.source_line_count;
        dd::write_all(fd.get(), p.source_lines.data(), p.source_lines.size() * 8, tmp);
      }
    }
    if (options.length_column) {
      for (const auto& p : parts) dd::write_all(fd.get(), p.values.data(), p.values.size() * 4, tmp);
      if (lines % 2) {
        const std::uint32_t pad = 0;
        dd::write_all(fd.get(), &pad, 4, tmp);
      }
    }
  }
  parts.clear();
  parts.shrink_to_fit();
  {
    const mapped_file written(tmp, access_advice::sequential);
    if (written.size() != total)
      throw error("build_jsonl_index: '" + tmp.string() + "' has " + std::to_string(written.size()) + " bytes, expected " +
                  std::to_string(total));
    h.body_checksum = dd::hash_bytes(written.data() + h.header_bytes, total - h.header_bytes, dd::body_checksum_seed);
  }
  const std::vector<unsigned char> header = dd::encode_header(h);
  if (::pwrite(fd.get(), header.data(), header.size(), 0) != static_cast<ssize_t>(header.size()))
    throw error(dd::errno_message("build_jsonl_index: cannot write header of", tmp, errno));
  if (::fsync(fd.get()) != 0) throw error(dd::errno_message("build_jsonl_index: cannot fsync", tmp, errno));
  if (::close(fd.release()) != 0) throw error(dd::errno_message("build_jsonl_index: cannot close", tmp, errno));
  if (options.stop.stop_requested())
    throw build_cancelled("build_jsonl_index: cancelled before renaming the index of '" + source.string() + "'; no index written");
  if (::rename(tmp.c_str(), index_path.c_str()) != 0)
    throw error(dd::errno_message("build_jsonl_index: cannot rename temporary index to", index_path, errno));
  remove_tmp.release();
  {
    std::filesystem::path dir = index_path.parent_path();
    if (dir.empty()) dir = ".";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  return {index_path, lines, source_lines, size, total};
}

/// build_jsonl_index(source, default_index_path(source), options).
inline jsonl_index_build_result build_jsonl_index(const std::filesystem::path& source, const jsonl_index_build_options& options = {}) {
  return build_jsonl_index(source, default_index_path(source), options);
}

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
};

/// A JSONL file with its line index, both memory-mapped read-only.
///
/// Lines are std::string_views into the source mapping, without the '\\n' and
/// without a trailing '\\r'; they stay valid as long as the jsonl_index object
/// (or the object it was moved into) lives. Move-only. Thread-safe for
/// concurrent reads.
class jsonl_index {
public:
  /// Opens `source` and its index, checking the index header, layout and
  /// checksums, and that the source is unchanged (size, mtime in ns, fingerprint
  /// of its first and last 4 KiB).
  /// @throws dpkit::format_error naming the index file and what is wrong
  ///         (truncated, bad magic, version, checksum, layout);
  ///         dpkit::stale_index_error (a format_error) naming both files and
  ///         what differs when the source changed (unless rebuild_if_stale);
  ///         dpkit::error when a file cannot be opened (errno text).
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
  /// k < size(). O(1) with blank lines kept; with blank lines skipped the end
  /// of the line is found with memchr (O(line length)).
  [[nodiscard]] std::string_view operator[](std::uint64_t k) const noexcept {
    const char* base = source_.data();
    const std::uint64_t b = offsets_[k];
    std::uint64_t e = offsets_[k + 1];
    if (skipped_blank_) {
      const void* p = std::memchr(base + b, '\n', e - b);
      if (p) e = static_cast<std::uint64_t>(static_cast<const char*>(p) - base);
    } else if (e > b && base[e - 1] == '\n') {
      --e;
    }
    if (e > b && base[e - 1] == '\r') --e;
    return {base + b, e - b};
  }

  /// Line `k`, checked. @throws dpkit::invalid_argument naming k and size().
  [[nodiscard]] std::string_view at(std::uint64_t k) const {
    check(k, "at");
    return (*this)[k];
  }

  /// Byte offset of line `k` in the source (k <= size(); offset(size()) is the
  /// source size). @throws dpkit::invalid_argument if k > size().
  [[nodiscard]] std::uint64_t offset(std::uint64_t k) const {
    if (k > header_.lines)
      throw invalid_argument("jsonl_index::offset: line " + std::to_string(k) + " > size " + std::to_string(header_.lines) +
                             " of '" + index_path_.string() + "'");
    return offsets_[k];
  }

  /// The n + 1 offsets (u64 bytes; the last is the source size).
  [[nodiscard]] std::span<const std::uint64_t> offsets() const noexcept { return {offsets_, header_.lines + 1}; }

  /// 0-based line number in the source file of index line `k` (equals k unless
  /// blank lines were skipped). @throws dpkit::invalid_argument if k >= size().
  [[nodiscard]] std::uint64_t source_line(std::uint64_t k) const {
    check(k, "source_line");
    return source_lines_ ? source_lines_[k] : k;
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
    namespace dd = detail::data;
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

  void check(std::uint64_t k, const char* what) const {
    if (k >= header_.lines)
      throw invalid_argument(std::string("jsonl_index::") + what + ": line " + std::to_string(k) + " >= size " +
                             std::to_string(header_.lines) + " of '" + index_path_.string() + "'");
  }

  std::filesystem::path index_path_;
  mapped_file index_;
  mapped_file source_;
  detail::data::index_header header_;
  const std::uint64_t* offsets_ = nullptr;
  const std::uint64_t* source_lines_ = nullptr;
  const std::uint32_t* lengths_ = nullptr;
  std::string length_name_;
  bool skipped_blank_ = false;
};

/// Options of verify_jsonl_index.
struct jsonl_index_verify_options {
  /// Index file; empty = default_index_path(source).
  std::filesystem::path index_path;
  /// If set, every value of the length column is extracted again and compared.
  std::optional<length_column_spec> length_column;
};

/// Fully verifies an index against its source: everything jsonl_index::open
/// checks (with checksums), then a fresh scan of the source comparing every
/// offset, the source line numbers, the line counts and (optionally) every
/// value of the length column.
/// @returns the number of index lines.
/// @throws dpkit::format_error / stale_index_error naming the file and the
///         first difference (line number, expected and found values).
inline std::uint64_t verify_jsonl_index(const std::filesystem::path& source, const jsonl_index_verify_options& options = {}) {
  jsonl_index_open_options o;
  o.index_path = options.index_path;
  const jsonl_index idx = jsonl_index::open(source, o);
  const std::string_view data = idx.source().view();
  const auto fail = [&](const std::string& what) {
    throw format_error("verify_jsonl_index: '" + idx.index_path().string() + "': " + what);
  };
  line_value_extractor extract;
  if (options.length_column && idx.has_lengths()) extract = options.length_column->make_extractor();
  std::uint64_t k = 0, line = 0, s = 0;
  while (s < data.size()) {
    const std::size_t nl = data.find('\n', s);
    const std::uint64_t e = nl == std::string_view::npos ? data.size() : nl;
    const bool blank = idx.blank_lines_skipped() && detail::data::is_blank(data.data() + s, e - s);
    if (!blank) {
      if (k >= idx.size()) fail("source has more than " + std::to_string(idx.size()) + " lines");
      if (idx.offsets()[k] != s)
        fail("line " + std::to_string(k) + " at byte " + std::to_string(idx.offsets()[k]) + ", source has it at " + std::to_string(s));
      if (idx.source_line(k) != line)
        fail("line " + std::to_string(k) + " is source line " + std::to_string(idx.source_line(k)) + ", expected " + std::to_string(line));
      if (extract) {
        std::string_view l = data.substr(s, e - s);
        if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
        std::uint32_t v = 0;
        try {
          v = extract(l);
        } catch (const std::exception& ex) {
          fail("source line " + std::to_string(line + 1) + ": " + ex.what());
        }
        if (v != idx.lengths()[k])
          fail("column '" + idx.length_column_name() + "' line " + std::to_string(k) + " is " + std::to_string(idx.lengths()[k]) +
               ", source has " + std::to_string(v));
      }
      ++k;
    }
    ++line;
    s = e + 1;
  }
  if (k != idx.size()) fail("index has " + std::to_string(idx.size()) + " lines, source has " + std::to_string(k));
  if (line != idx.source_line_count())
    fail("index counts " + std::to_string(idx.source_line_count()) + " source lines, source has " + std::to_string(line));
  return k;
}

/// Several JSONL shards (each with its own index) as one dataset with global
/// line numbers: global line g is line g - prefix[s] of shard s, shards in the
/// order given.
class jsonl_dataset {
public:
  /// Where a global line lives.
  struct location {
    std::size_t shard = 0;  ///< shard number (order of construction)
    std::uint64_t line = 0; ///< line number inside the shard
  };

  /// An empty dataset.
  jsonl_dataset() = default;

  /// Takes ownership of opened shards.
  explicit jsonl_dataset(std::vector<jsonl_index> shards) : shards_(std::move(shards)) { rebuild_prefix(); }

  /// Opens every shard with `options` (index_path must be empty: each shard
  /// uses its default index path). @throws as jsonl_index::open;
  /// dpkit::invalid_argument if options.index_path is set.
  jsonl_dataset(const std::vector<std::filesystem::path>& sources, const jsonl_index_open_options& options = {}) {
    if (!options.index_path.empty() && sources.size() != 1)
      throw invalid_argument("jsonl_dataset: index_path '" + options.index_path.string() + "' given for " +
                             std::to_string(sources.size()) + " shards");
    shards_.reserve(sources.size());
    for (const auto& s : sources) shards_.push_back(jsonl_index::open(s, options));
    rebuild_prefix();
  }

  /// Total number of lines over all shards.
  [[nodiscard]] std::uint64_t size() const noexcept { return prefix_.back(); }
  /// Number of shards.
  [[nodiscard]] std::size_t shard_count() const noexcept { return shards_.size(); }
  /// Shard `s`. Precondition: s < shard_count().
  [[nodiscard]] const jsonl_index& shard(std::size_t s) const noexcept { return shards_[s]; }
  /// First global line number of each shard, plus size() at the end.
  [[nodiscard]] std::span<const std::uint64_t> prefix() const noexcept { return prefix_; }

  /// Shard and local line of global line `g` (binary search, O(log shards)).
  /// @throws dpkit::invalid_argument naming g and size() if g >= size().
  [[nodiscard]] location locate(std::uint64_t g) const {
    if (g >= size())
      throw invalid_argument("jsonl_dataset: line " + std::to_string(g) + " >= size " + std::to_string(size()));
    const auto it = std::upper_bound(prefix_.begin(), prefix_.end(), g);
    const auto s = static_cast<std::size_t>(it - prefix_.begin()) - 1;
    return {s, g - prefix_[s]};
  }

  /// Global line `g` as a string_view (see jsonl_index::operator[]).
  /// @throws dpkit::invalid_argument if g >= size().
  [[nodiscard]] std::string_view operator[](std::uint64_t g) const {
    const location l = locate(g);
    return shards_[l.shard][l.line];
  }

  /// Length-column value of global line `g`.
  /// @throws dpkit::invalid_argument if g >= size() or its shard has no length column.
  [[nodiscard]] std::uint32_t length(std::uint64_t g) const {
    const location l = locate(g);
    if (!shards_[l.shard].has_lengths())
      throw invalid_argument("jsonl_dataset: shard '" + shards_[l.shard].index_path().string() + "' has no length column");
    return shards_[l.shard].lengths()[l.line];
  }

private:
  void rebuild_prefix() {
    prefix_.assign(1, 0);
    for (const auto& s : shards_) prefix_.push_back(prefix_.back() + s.size());
  }

  std::vector<jsonl_index> shards_;
  std::vector<std::uint64_t> prefix_{0};
};

} // namespace dpkit
