/// @file jsonl_format.hpp
/// @brief The JSONL index file format (docs/jsonl-index-format.md): blank-line
/// policy, default index path, header layout, encoding and decoding with
/// checks. Used by the builder (jsonl_build.hpp) and the reader
/// (jsonl_reader.hpp); include dpkit/data/jsonl_index.hpp instead.
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/detail/content_hash.hpp>
#include <dpkit/data/detail/hash.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpkit {

static_assert(std::endian::native == std::endian::little,
              "dpkit's JSONL index maps little-endian u64/u32 arrays directly; big-endian hosts are not supported");

/// What the index does with blank lines (empty, or only ASCII whitespace
/// ' ', '\\t', '\\r', '\\f', '\\v').
enum class blank_line_policy {
  keep, ///< Every line of the file is a line of the index (default).
  skip, ///< Blank lines are left out: index line k is the k-th non-blank line;
        ///< jsonl_index::source_line(k) gives its line number in the file.
};

/// The default index path of a source: the source path with ".idx" appended
/// ("data/train.jsonl" -> "data/train.jsonl.idx").
inline std::filesystem::path default_index_path(const std::filesystem::path& source) {
  std::filesystem::path p = source;
  p += ".idx";
  return p;
}

namespace detail {

inline constexpr std::array<char, 8> index_magic = {'D', 'P', 'K', 'J', 'S', 'O', 'N', 'L'};
inline constexpr std::uint32_t index_version = 2;
inline constexpr std::size_t index_fixed_header_bytes = 128;
inline constexpr std::size_t index_column_descriptor_bytes = 32;
inline constexpr std::uint64_t flag_blank_lines_skipped = 1;
inline constexpr std::uint32_t column_u32_values = 1;   // u32 per index line (lengths)
inline constexpr std::uint32_t column_u64_source_line = 2; // u64 source line number per index line
inline constexpr std::size_t fingerprint_window = 4096;
inline constexpr std::uint64_t header_checksum_seed = 0x6470'6b69'7468'6472ULL;
inline constexpr std::uint64_t body_checksum_seed = 0x6470'6b69'7462'6f64ULL;
inline constexpr std::uint64_t content_hash_seed = 0x6470'6b69'7463'6e74ULL;
/// Granularity of the source content hash (format constant, 1 MiB).
inline constexpr std::uint64_t content_chunk_bytes = std::uint64_t{1} << 20;

/// The source content hash from its chunk hashes (in chunk order):
/// hash_bytes(chunk hashes as u64 LE, seed = content_hash_seed ^ source size).
inline std::uint64_t content_hash_combine(const std::uint64_t* chunk_hashes, std::size_t chunks, std::uint64_t size) noexcept {
  return hash_bytes(chunk_hashes, chunks * 8, content_hash_seed ^ size);
}

/// The content hash of a whole source (one read; used at open when the
/// source's identity changed and the caller asked for a content check).
inline std::uint64_t source_content_hash(std::string_view bytes) {
  const std::uint64_t n = bytes.size();
  std::vector<std::uint64_t> h((n + content_chunk_bytes - 1) / content_chunk_bytes);
  for (std::uint64_t i = 0; i < h.size(); ++i) {
    const std::uint64_t b = i * content_chunk_bytes;
    h[i] = content_chunk_hash(bytes.data() + b, static_cast<std::size_t>(std::min(content_chunk_bytes, n - b)), i);
  }
  return content_hash_combine(h.data(), h.size(), n);
}

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

/// True if [p, p + n) is a blank line: only ' ', '\\t', '\\r', '\\f', '\\v'
/// (and, with `newlines`, '\\n': a run of blank lines).
inline bool is_blank(const char* p, std::size_t n, bool newlines = false) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v' && !(newlines && c == '\n')) return false;
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
  std::uint64_t source_device = 0;    // st_dev
  std::uint64_t source_inode = 0;     // st_ino
  std::int64_t source_ctime_ns = 0;   // st_ctim
  std::uint64_t source_content_hash = 0;
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
  // [80, 88): header checksum, filled last
  put_u64(&b[88], h.source_device);
  put_u64(&b[96], h.source_inode);
  put_u64(&b[104], static_cast<std::uint64_t>(h.source_ctime_ns));
  put_u64(&b[112], h.source_content_hash);
  // [120, 128): reserved (0)
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
  if (file.size() < 12)
    throw_format(path, "truncated: " + std::to_string(file.size()) + " bytes, the header alone needs " +
                           std::to_string(index_fixed_header_bytes));
  if (std::memcmp(b, index_magic.data(), 8) != 0) throw_format(path, "bad magic: not a dpkit JSONL index");
  index_header h;
  h.version = get_u32(b + 8);
  if (h.version == 1)
    throw stale_index_error("jsonl_index: '" + path.string() +
                            "': version 1 (dpkit 0.1) has no source identity or content hash; rebuild it (dpkit-jsonl index, "
                            "or rebuild_if_stale)");
  if (h.version != index_version)
    throw_format(path, "version " + std::to_string(h.version) + ", this dpkit reads version " + std::to_string(index_version));
  if (file.size() < index_fixed_header_bytes)
    throw_format(path, "truncated: " + std::to_string(file.size()) + " bytes, the header alone needs " +
                           std::to_string(index_fixed_header_bytes));
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
  h.source_device = get_u64(b + 88);
  h.source_inode = get_u64(b + 96);
  h.source_ctime_ns = static_cast<std::int64_t>(get_u64(b + 104));
  h.source_content_hash = get_u64(b + 112);
  // bounded by the file before any arithmetic on it, so the layout sum below cannot wrap
  if (h.lines > h.source_lines || h.lines >= (file.size() - h.header_bytes) / 8)
    throw_format(path, "damaged header: line count " + std::to_string(h.lines) + " does not fit in " + std::to_string(file.size()) +
                           " bytes");
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

} // namespace detail

} // namespace dpkit
