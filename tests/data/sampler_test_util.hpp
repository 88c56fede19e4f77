// Helpers shared by the sampler tests (test_token_budget.cpp,
// test_sampler_scale.cpp): synthetic lengths and the real corpus indexed with
// its num_tokens length column.
#pragma once

#include "data_test_util.hpp"

#include <dpkit/data/jsonl_index.hpp>
#include <dpkit/data/jsonl_length_column.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace sampler_test {

/// n lengths drawn from lognormal(4.5, 1) (median ~90 tokens, long tail), capped at 1e6.
inline std::vector<std::uint32_t> synthetic_lengths(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::lognormal_distribution<double> d(4.5, 1.0);
  std::vector<std::uint32_t> v(n);
  for (auto& x : v) x = static_cast<std::uint32_t>(std::min(1e6, d(g)));
  return v;
}

/// The real corpus with an index carrying its num_tokens column (63,956
/// lines), built under the test directory as `name` and removed afterwards.
class corpus_index {
public:
  explicit corpus_index(const std::string& name) : path_(data_test::tmp_dir() / name) {
    dpkit::jsonl_index_build_options bo;
    bo.length_column = dpkit::json_length_column("num_tokens");
    dpkit::build_jsonl_index(data_test::corpus(), path_, bo);
    dpkit::jsonl_index_open_options oo;
    oo.index_path = path_;
    index_ = dpkit::jsonl_index::open(data_test::corpus(), oo);
  }
  corpus_index(const corpus_index&) = delete;
  corpus_index& operator=(const corpus_index&) = delete;
  ~corpus_index() {
    index_.reset();
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  /// The length column (u32 per line).
  [[nodiscard]] std::span<const std::uint32_t> lengths() const { return index_->lengths(); }

private:
  std::filesystem::path path_;
  std::optional<dpkit::jsonl_index> index_;
};

} // namespace sampler_test
