/// @file jsonl_index.hpp
/// @brief Line index over a memory-mapped JSONL file: build, write, open,
/// verify; and a dataset of several shards with global line numbers.
///
/// Umbrella of the JSONL index headers (docs/data.md):
/// - jsonl_format.hpp  : the on-disk format (docs/jsonl-index-format.md) and
///                       default_index_path (the source path + ".idx");
/// - jsonl_build.hpp   : build_jsonl_index and its options;
/// - jsonl_reader.hpp  : jsonl_index (open, checks, line access);
/// - jsonl_verify.hpp  : verify_jsonl_index (full rescan);
/// - jsonl_dataset.hpp : jsonl_dataset (shards, global line numbers).
/// Errors (format_error, stale_index_error, build_cancelled) are in
/// dpkit/core/errors.hpp. These headers depend only on the standard library and
/// POSIX; a length column taken from a JSON field is provided by
/// dpkit/data/jsonl_length_column.hpp (simdjson) through length_column_spec.
#pragma once

#include <dpkit/data/jsonl_build.hpp>
#include <dpkit/data/jsonl_dataset.hpp>
#include <dpkit/data/jsonl_format.hpp>
#include <dpkit/data/jsonl_reader.hpp>
#include <dpkit/data/jsonl_verify.hpp>
#include <dpkit/data/mapped_file.hpp>
