/// @file distributed_sampler.hpp
/// @brief torch.utils.data.DistributedSampler with pluggable permutation
/// engines (design section 5, "Samplers").
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/permutation.hpp>

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
};

namespace detail::data {

/// Throws dpkit::invalid_argument if world_size == 0 or rank >= world_size.
inline void check_rank(const char* who, std::uint64_t world_size, std::uint64_t rank) {
  if (world_size == 0)
    throw invalid_argument(std::string(who) + ": world_size 0 (rank " + std::to_string(rank) + "); world_size must be >= 1");
  if (rank >= world_size)
    throw invalid_argument(std::string(who) + ": rank " + std::to_string(rank) + " >= world_size " + std::to_string(world_size));
}

} // namespace detail::data

/// The indices one rank reads in one epoch; matches
/// torch.utils.data.DistributedSampler (torch/utils/data/distributed.py).
///
/// With N = dataset size and W = world size:
/// - num_samples = N / W (integer division) with drop_last, else ceil(N / W)
///   (torch: ceil((N - W) / W) when drop_last and N % W != 0, which is the same);
///   total_size = num_samples * W;
/// - the epoch's list is perm = Engine reset to (N, seed + epoch) if shuffle,
///   else 0..N-1; without drop_last it is padded to total_size with its head,
///   repeated as often as needed; with drop_last it is truncated to total_size;
/// - rank r takes list[r : total_size : W], so (*this)[k] = perm[(r + k W) % N].
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
  ///         world_size == 0 or rank >= world_size.
  distributed_sampler(std::uint64_t dataset_size, std::uint64_t world_size, std::uint64_t rank,
                      distributed_sampler_options options = {}, Engine engine = Engine())
      : n_(dataset_size), world_(world_size), rank_(rank), opt_(options), engine_(std::move(engine)) {
    detail::data::check_rank("distributed_sampler", world_size, rank);
    num_samples_ = opt_.drop_last ? n_ / world_ : (n_ + world_ - 1) / world_;
    set_epoch(0);
  }

  /// Selects the epoch (torch: sampler.set_epoch(epoch)); re-seeds the engine
  /// with seed + epoch when shuffling (O(N) for torch_randperm, O(1) for feistel).
  void set_epoch(std::uint64_t epoch) {
    epoch_ = epoch;
    if (opt_.shuffle) engine_.reset(n_, opt_.seed + epoch);
  }

  /// The current epoch.
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  /// Samples this rank reads per epoch (torch: num_samples, len(sampler)).
  [[nodiscard]] std::uint64_t num_samples() const noexcept { return num_samples_; }
  /// Same as num_samples().
  [[nodiscard]] std::uint64_t size() const noexcept { return num_samples_; }
  /// num_samples() * world_size() (torch: total_size).
  [[nodiscard]] std::uint64_t total_size() const noexcept { return num_samples_ * world_; }
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
    std::uint64_t p = rank_ + k * world_;
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
};

} // namespace dpkit
