/// @file distributed_sampler.hpp
/// @brief torch.utils.data.DistributedSampler with pluggable permutation
/// engines (docs/design.md "Data"; docs/data.md "Samplers").
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/permutation.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace dpkit {

/// Options of distributed_sampler; defaults are torch's.
struct distributed_sampler_options {
  bool shuffle = true;    ///< Permute the indices each epoch (torch: shuffle=True).
  std::uint64_t seed = 0; ///< Base seed; epoch e uses seed + e (torch: seed=0).
  bool drop_last = false; ///< Truncate to a multiple of world_size instead of padding.
  /// Evaluation mode: every sample exactly once over all ranks, no padding and
  /// no dropping (torch pads with duplicates, pytorch/pytorch#25162). Rank r
  /// takes positions r, r + W, ... < N (strided, as torch without its pads), so
  /// ranks differ by at most one sample: num_samples() is ceil((N - r) / W).
  /// Excludes drop_last.
  bool exactly_once = false;
};

namespace detail {

/// Throws dpkit::invalid_argument if world_size == 0 or rank >= world_size.
inline void check_rank(const char* who, std::uint64_t world_size, std::uint64_t rank) {
  if (world_size == 0)
    throw invalid_argument(std::string(who) + ": world_size 0 (rank " + std::to_string(rank) + "); world_size must be >= 1");
  if (rank >= world_size)
    throw invalid_argument(std::string(who) + ": rank " + std::to_string(rank) + " >= world_size " + std::to_string(world_size));
}

} // namespace detail

/// The indices one rank reads in one epoch; matches
/// torch.utils.data.DistributedSampler (torch/utils/data/distributed.py).
///
/// With N = dataset size, W = world size and start = 0:
/// - num_samples = N / W (integer division) with drop_last, else ceil(N / W)
///   (torch: ceil((N - W) / W) when drop_last and N % W != 0, which is the same);
///   total_size = num_samples * W;
/// - the epoch's list is perm = Engine reset to (N, seed + epoch) if shuffle,
///   else 0..N-1; without drop_last it is padded to total_size with its head,
///   repeated as often as needed; with drop_last it is truncated to total_size;
/// - rank r takes list[r : total_size : W], so (*this)[k] = perm[(r + k W) % N].
///
/// Global positions (docs/data.md, "Elastic determinism"): position p of the
/// epoch is perm[p % N], whatever the world size; rank r's k-th sample is
/// position start + r + k W. set_epoch(epoch, start) resumes at global offset
/// `start` (the samples all ranks consumed: offset_after(k) after k samples per
/// rank), on any world size: the sequence of positions < N goes on unchanged,
/// only the padding or dropping at the very end depends on W (the schedule ends
/// at start + ceil((N - start) / W) W positions, or floor with drop_last).
///
/// exactly_once (evaluation): positions < N only, so every sample is read once
/// over all ranks; rank r reads ceil((N - start - r) / W) samples (0 if
/// negative), which differ by at most one across ranks. Reduce metrics as
/// (sum, count) pairs (docs/data.md, "Evaluation without duplicates").
///
/// With the default engine `torch_randperm` the indices equal torch's for the
/// same N, W, rank, seed, epoch, shuffle and drop_last (torch < 2.7 for
/// N >= 214,748,364 needs torch_randperm(torch_compat::before_2_7)); it
/// materializes the permutation once per epoch (O(N) time and memory, shared
/// by nothing else). With `feistel` a permutation costs O(1) memory and
/// (*this)[k] is O(1): any position can be resumed without replay.
/// set_epoch is not thread-safe; const members are.
template <permutation_engine Engine = torch_randperm>
class distributed_sampler {
public:
  /// A sampler of `dataset_size` samples for `rank` of `world_size`, at epoch 0.
  /// @throws dpkit::invalid_argument naming the value and rank if
  ///         world_size == 0, rank >= world_size, or exactly_once with drop_last.
  distributed_sampler(std::uint64_t dataset_size, std::uint64_t world_size, std::uint64_t rank,
                      distributed_sampler_options options = {}, Engine engine = Engine())
      : n_(dataset_size), world_(world_size), rank_(rank), opt_(options), engine_(std::move(engine)) {
    detail::check_rank("distributed_sampler", world_size, rank);
    if (opt_.exactly_once && opt_.drop_last)
      throw invalid_argument("distributed_sampler: exactly_once and drop_last are exclusive (rank " + std::to_string(rank) + ")");
    set_epoch(0);
  }

  /// Selects the epoch (torch: sampler.set_epoch(epoch)); re-seeds the engine
  /// with seed + epoch when shuffling (O(N) for torch_randperm, O(1) for
  /// feistel; skipped when the epoch is unchanged), and starts at global
  /// position `start` (see the class comment).
  /// @throws dpkit::invalid_argument naming start, N and the rank if start > N.
  void set_epoch(std::uint64_t epoch, std::uint64_t start = 0) {
    if (start > n_)
      throw invalid_argument("distributed_sampler: start " + std::to_string(start) + " > dataset size " + std::to_string(n_) +
                             " (rank " + std::to_string(rank_) + ")");
    if (!seeded_ || epoch != epoch_) {
      seeded_ = false;
      epoch_ = epoch;
      if (opt_.shuffle) engine_.reset(n_, opt_.seed + epoch);
      seeded_ = true;
    }
    start_ = start;
    num_samples_ = num_samples(rank_);
  }

  /// The current epoch.
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  /// Global position at which this epoch's reading starts (set_epoch's start).
  [[nodiscard]] std::uint64_t start() const noexcept { return start_; }
  /// Samples this rank reads from start() to the end of the epoch (torch:
  /// num_samples, len(sampler)).
  [[nodiscard]] std::uint64_t num_samples() const noexcept { return num_samples_; }
  /// Samples `rank` reads from start() (differs across ranks only with
  /// exactly_once, by at most one). Precondition: rank < world_size().
  [[nodiscard]] std::uint64_t num_samples(std::uint64_t rank) const noexcept {
    const std::uint64_t rest = n_ - start_;
    if (opt_.exactly_once) return rest > rank ? (rest - rank + world_ - 1) / world_ : 0;
    return opt_.drop_last ? rest / world_ : (rest + world_ - 1) / world_;
  }
  /// The largest num_samples(rank) over the ranks (rank 0's): the loop length
  /// for code that must run the same number of steps on every rank.
  [[nodiscard]] std::uint64_t max_num_samples() const noexcept { return num_samples(0); }
  /// Same as num_samples().
  [[nodiscard]] std::uint64_t size() const noexcept { return num_samples_; }
  /// Positions all ranks read from start(): num_samples() * world_size()
  /// (torch: total_size), or N - start() with exactly_once.
  [[nodiscard]] std::uint64_t total_size() const noexcept {
    return opt_.exactly_once ? n_ - start_ : num_samples_ * world_;
  }
  /// Global offset after every rank read k samples: start() + k * world_size()
  /// (capped at N with exactly_once). Save it with the epoch to resume, on any
  /// world size, with set_epoch(epoch, offset).
  [[nodiscard]] std::uint64_t offset_after(std::uint64_t k) const noexcept {
    const std::uint64_t p = start_ + k * world_;
    return opt_.exactly_once ? std::min(p, n_) : p;
  }
  /// Dataset size N.
  [[nodiscard]] std::uint64_t dataset_size() const noexcept { return n_; }
  /// World size W.
  [[nodiscard]] std::uint64_t world_size() const noexcept { return world_; }
  /// This rank.
  [[nodiscard]] std::uint64_t rank() const noexcept { return rank_; }
  /// Options.
  [[nodiscard]] const distributed_sampler_options& options() const noexcept { return opt_; }
  /// The permutation engine.
  [[nodiscard]] const Engine& engine() const noexcept { return engine_; }

  /// This rank's k-th dataset index of the epoch. Precondition: k < size().
  [[nodiscard]] std::uint64_t operator[](std::uint64_t k) const noexcept {
    std::uint64_t p = start_ + rank_ + k * world_;
    if (p >= n_) p %= n_; // padding repeats the head of the list
    return opt_.shuffle ? static_cast<std::uint64_t>(engine_[p]) : p;
  }

  /// This rank's k-th index, checked.
  /// @throws dpkit::invalid_argument naming k, size() and the rank if k >= size().
  [[nodiscard]] std::uint64_t at(std::uint64_t k) const {
    if (k >= num_samples_)
      throw invalid_argument("distributed_sampler: position " + std::to_string(k) + " >= num_samples " +
                             std::to_string(num_samples_) + " (rank " + std::to_string(rank_) + ")");
    return (*this)[k];
  }

  /// Random-access iterator over this rank's indices (yields std::uint64_t).
  class iterator {
  public:
    using iterator_category = std::random_access_iterator_tag;
    using value_type = std::uint64_t;
    using difference_type = std::ptrdiff_t;
    using reference = std::uint64_t;
    using pointer = void;
    iterator() = default;
    iterator(const distributed_sampler* s, std::uint64_t k) noexcept : s_(s), k_(k) {}
    reference operator*() const noexcept { return (*s_)[k_]; }
    reference operator[](difference_type d) const noexcept { return (*s_)[k_ + static_cast<std::uint64_t>(d)]; }
    iterator& operator++() noexcept { ++k_; return *this; }
    iterator operator++(int) noexcept { auto t = *this; ++k_; return t; }
    iterator& operator--() noexcept { --k_; return *this; }
    iterator operator--(int) noexcept { auto t = *this; --k_; return t; }
    iterator& operator+=(difference_type d) noexcept { k_ += static_cast<std::uint64_t>(d); return *this; }
    iterator& operator-=(difference_type d) noexcept { k_ -= static_cast<std::uint64_t>(d); return *this; }
    friend iterator operator+(iterator i, difference_type d) noexcept { return i += d; }
    friend iterator operator+(difference_type d, iterator i) noexcept { return i += d; }
    friend iterator operator-(iterator i, difference_type d) noexcept { return i -= d; }
    friend difference_type operator-(const iterator& a, const iterator& b) noexcept {
      return static_cast<difference_type>(a.k_) - static_cast<difference_type>(b.k_);
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept { return a.k_ == b.k_; }
    friend auto operator<=>(const iterator& a, const iterator& b) noexcept { return a.k_ <=> b.k_; }

  private:
    const distributed_sampler* s_ = nullptr;
    std::uint64_t k_ = 0;
  };

  /// Iterator at position 0.
  [[nodiscard]] iterator begin() const noexcept { return iterator(this, 0); }
  /// Iterator at position k (resume mid-epoch in O(1)). Precondition: k <= size().
  [[nodiscard]] iterator begin_at(std::uint64_t k) const noexcept { return iterator(this, k); }
  /// Iterator past the last position.
  [[nodiscard]] iterator end() const noexcept { return iterator(this, num_samples_); }

  /// All of this rank's indices for the epoch (torch: list(iter(sampler))).
  [[nodiscard]] std::vector<std::uint64_t> indices() const {
    std::vector<std::uint64_t> v;
    v.reserve(num_samples_);
    for (std::uint64_t k = 0; k < num_samples_; ++k) v.push_back((*this)[k]);
    return v;
  }

private:
  std::uint64_t n_;
  std::uint64_t world_;
  std::uint64_t rank_;
  distributed_sampler_options opt_;
  Engine engine_;
  std::uint64_t num_samples_ = 0;
  std::uint64_t epoch_ = 0;
  std::uint64_t start_ = 0;
  bool seeded_ = false;
};

} // namespace dpkit
