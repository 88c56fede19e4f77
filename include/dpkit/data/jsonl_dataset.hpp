/// @file jsonl_dataset.hpp
/// @brief Several JSONL shards, each with its own index, as one dataset with
/// global line numbers.
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/jsonl_reader.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpkit {

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
  /// @throws dpkit::invalid_argument if g >= size(); dpkit::format_error if
  ///         its shard's index is damaged (offsets checked on every access).
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
