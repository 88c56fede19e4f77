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
  return spec;
}

} // namespace dpkit
