/// @file jsonl_verify.hpp
/// @brief Full verification of a JSONL index against its source: a fresh scan
/// comparing every offset, source line number and length-column value.
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/jsonl_build.hpp>
#include <dpkit/data/jsonl_format.hpp>
#include <dpkit/data/jsonl_reader.hpp>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace dpkit {

/// Options of verify_jsonl_index.
struct jsonl_index_verify_options {
  /// Index file; empty = default_index_path(source).
  std::filesystem::path index_path;
  /// If set, every value of the length column is extracted again and compared.
  std::optional<length_column_spec> length_column;
  /// As jsonl_index_open_options::check_content_if_moved.
  bool check_content_if_moved = false;
};

/// Fully verifies an index against its source: everything jsonl_index::open
/// checks (with checksums), then a fresh scan of the source comparing every
/// offset, the source line numbers, the line counts and (optionally) every
/// value of the length column.
/// @returns the number of index lines.
/// @throws dpkit::format_error / stale_index_error naming the file and the
///         first difference (line number, expected and found values);
///         dpkit::invalid_argument when the source or the index is not a
///         regular file (as jsonl_index::open).
inline std::uint64_t verify_jsonl_index(const std::filesystem::path& source, const jsonl_index_verify_options& options = {}) {
  jsonl_index_open_options o;
  o.index_path = options.index_path;
  o.check_content_if_moved = options.check_content_if_moved;
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
    const bool blank = idx.blank_lines_skipped() && detail::is_blank(data.data() + s, e - s);
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

} // namespace dpkit
