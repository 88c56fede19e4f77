/// @file jsonl_length_column.hpp
/// @brief A JSONL index length column taken from a JSON field (e.g.
/// "num_tokens"), parsed with simdjson. Requires simdjson
/// (`dependency('simdjson')`); jsonl_index.hpp itself does not.
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/jsonl_index.hpp>
#include <dpkit/data/lengths.hpp>

#include <simdjson.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpkit {

/// What to do with a line that has no such field (the line must still be a
/// valid JSON object).
enum class missing_field_policy {
  error,         ///< Reject the line: dpkit::format_error naming the line (default).
  default_value, ///< Use json_length_column_options::default_value.
  skip,          ///< Keep the line (line numbers stay file line numbers) with length
                 ///< dpkit::missing_length; token_budget_batch_sampler leaves it out.
};

/// Options of json_length_column.
struct json_length_column_options {
  /// Behaviour for a line without the field.
  missing_field_policy missing = missing_field_policy::error;
  /// Value used for missing fields under missing_field_policy::default_value.
  std::uint32_t default_value = 0;
};

/// A length column whose value for each line is the unsigned integer JSON field
/// `field` (a top-level key of the line's object), parsed and fully validated
/// with simdjson's DOM parser. Each line is copied into a padded per-thread
/// buffer first (the mapping has no SIMDJSON_PADDING after the line).
///
/// A line that is not valid JSON, not an object, whose field is not an integer
/// in [0, 2^32 - 1), or (with missing_field_policy::error) lacks the field, makes
/// build_jsonl_index throw dpkit::format_error naming the file and the 1-based
/// line number.
/// @param field the JSON key, at most 15 bytes (it is also the column's name).
inline length_column_spec json_length_column(std::string field, json_length_column_options options = {}) {
  length_column_spec spec;
  spec.name = field;
  spec.make_extractor = [field = std::move(field), options]() -> line_value_extractor {
    struct state {
      simdjson::dom::parser parser;
      std::vector<char> buffer;
    };
    auto st = std::make_shared<state>();
    return [st, field, options](std::string_view line) -> std::uint32_t {
      if (st->buffer.size() < line.size() + simdjson::SIMDJSON_PADDING) st->buffer.resize(line.size() * 2 + simdjson::SIMDJSON_PADDING);
      if (!line.empty()) std::memcpy(st->buffer.data(), line.data(), line.size());
      std::memset(st->buffer.data() + line.size(), 0, simdjson::SIMDJSON_PADDING);
      simdjson::dom::element doc;
      if (auto err = st->parser.parse(st->buffer.data(), line.size(), false).get(doc))
        throw format_error(std::string("not valid JSON: ") + simdjson::error_message(err));
      simdjson::dom::object obj;
      if (doc.get_object().get(obj)) throw format_error("not a JSON object");
      simdjson::dom::element value;
      if (obj.at_key(field).get(value)) {
        if (options.missing == missing_field_policy::default_value) return options.default_value;
        if (options.missing == missing_field_policy::skip) return missing_length;
        throw format_error("no field \"" + field + "\"");
      }
      std::uint64_t v = 0;
      if (value.get_uint64().get(v))
        throw format_error("field \"" + field + "\" is not an unsigned integer: " + simdjson::to_string(value));
      if (v >= missing_length)
        throw format_error("field \"" + field + "\" = " + std::to_string(v) +
                           " does not fit in u32 (0xFFFFFFFF is reserved for a missing length)");
      return static_cast<std::uint32_t>(v);
    };
  };
  // the same values for runs of lines from one document-stream parse
  // (simdjson's parse_many: one stage 1 over the run, full DOM validation of
  // every document): about 3x fewer ns per short line than a parse per line.
  // Each document must start on its own line (blank lines, a document over
  // two lines or two on one make the run decline, and the per-line extractor
  // reports the line); anything else this does not accept as the per-line
  // extractor would (invalid JSON, not an object, a bad or, under
  // missing_field_policy::error, missing field) declines the run too.
  spec.make_batch_extractor = [field = spec.name, options]() -> batch_value_extractor {
    struct state {
      simdjson::dom::parser parser;
      std::vector<char> buffer;
    };
    auto st = std::make_shared<state>();
    st->parser.threaded = false; // no stage-1 thread of its own inside a build thread
    return [st, field, options](std::string_view text, std::span<const std::uint64_t> starts, std::span<std::uint32_t> out) {
      if (text.empty() || starts.empty()) return starts.empty();
      if (st->buffer.size() < text.size() + simdjson::SIMDJSON_PADDING) st->buffer.resize(text.size() * 2 + simdjson::SIMDJSON_PADDING);
      std::memcpy(st->buffer.data(), text.data(), text.size());
      std::memset(st->buffer.data() + text.size(), 0, simdjson::SIMDJSON_PADDING);
      simdjson::dom::document_stream stream;
      const std::size_t batch = std::max<std::size_t>(text.size(), simdjson::dom::MINIMAL_BATCH_SIZE);
      if (st->parser.parse_many(st->buffer.data(), text.size(), batch).get(stream)) return false;
      std::size_t i = 0;
      for (auto it = stream.begin(); it != stream.end(); ++it, ++i) {
        // document i lies within line i: starts after its start, ends before its '\\n'
        // the document's error first: source() of a document that failed
        // indexes simdjson's structural array at -1 (a read far out of bounds)
        simdjson::dom::element doc;
        simdjson::dom::object obj;
        if ((*it).get(doc) || doc.get_object().get(obj)) return false;
        const std::size_t at = it.current_index();
        const std::size_t line_end = i + 1 < starts.size() ? starts[i + 1] - 1 : text.size();
        if (i >= starts.size() || at < starts[i] || at + it.source().size() > line_end) return false;
        simdjson::dom::element value;
        if (obj.at_key(field).get(value)) {
          if (options.missing == missing_field_policy::default_value) out[i] = options.default_value;
          else if (options.missing == missing_field_policy::skip) out[i] = missing_length;
          else return false;
          continue;
        }
        std::uint64_t v = 0;
        if (value.get_uint64().get(v) || v >= missing_length) return false;
        out[i] = static_cast<std::uint32_t>(v);
      }
      return i == starts.size() && stream.truncated_bytes() == 0;
    };
  };
  return spec;
}

} // namespace dpkit
