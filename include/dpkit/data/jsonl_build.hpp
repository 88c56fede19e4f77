/// @file jsonl_build.hpp
/// @brief Building a JSONL line index: options, the threaded one-pass
/// builder and the crash-safe write (docs/data.md "Building an index").
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/detail/hash.hpp>
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
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dpkit {

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

namespace detail {

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

} // namespace detail

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
  namespace dd = detail;
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

} // namespace dpkit
