/// @file token_budget_sampler.hpp
/// @brief Dynamic (token-budget) batches for distributed training: FunASR's
/// CustomDistributedBufferDynamicBatchSampler (the seed document), done right.
/// Design section 5, "Samplers"; guide: docs/data.md.
#pragma once

#include <dpkit/core/errors.hpp>
#include <dpkit/data/distributed_sampler.hpp>
#include <dpkit/data/lengths.hpp>
#include <dpkit/data/permutation.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <numeric>
#include <ranges>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dpkit {

/// What a batch budget counts (the seed's batch_type).
enum class batch_type {
  tokens,   ///< max_len_in_batch * batch_size <= max_tokens ("token").
  examples, ///< batch_size <= max_tokens, every sample counts 1 ("example").
};

/// What to do with a sample longer than the per-sample limit.
enum class oversize_policy {
  skip,     ///< Leave it out of the epoch (the seed's behaviour; counted by skipped()).
  truncate, ///< Keep it, accounted at the limit; the loader must cut it to sample_limit() tokens.
  error,    ///< Throw dpkit::invalid_argument naming the sample and its length.
};

/// How every rank gets the same number of batches.
enum class rank_balance {
  pad,  ///< Append deterministically chosen duplicate batches (the seed pads too, with random.choices).
  drop, ///< Drop the last total_batches() % world_size batches of the plan.
};

/// Options of token_budget_batch_sampler. Defaults follow the seed where it has
/// one (sort_size 1024, batch_size_sample_max 200, max_token_length 2048).
struct token_budget_options {
  /// Budget of one batch: tokens (max length x count, padding included) for
  /// batch_type::tokens, samples for batch_type::examples (the seed's batch_size).
  std::uint64_t max_tokens = 4096;
  /// What max_tokens counts.
  batch_type type = batch_type::tokens;
  /// At most this many samples per batch (the seed's batch_size_sample_max).
  std::uint64_t max_batch_size = 200;
  /// Per-sample limit in tokens (the seed's max_token_length). With
  /// batch_type::tokens the effective limit is min(max_sample_tokens, max_tokens),
  /// so that no batch can exceed the budget.
  std::uint64_t max_sample_tokens = 2048;
  /// Samples over the limit: skip, truncate or error.
  oversize_policy oversize = oversize_policy::skip;
  /// Samples are sorted by length inside buffers of sort_size * world_size.
  std::uint64_t sort_size = 1024;
  /// Shuffle samples with torch.randperm(seed + epoch) before buffering.
  bool shuffle = true;
  /// Shuffle the order of the steps (groups of world_size batches) per epoch.
  bool shuffle_batches = true;
  /// Base seed; epoch e uses seed + e.
  std::uint64_t seed = 0;
  /// Equalize batch counts across ranks by padding or dropping.
  rank_balance balance = rank_balance::pad;
  /// fairseq's required_batch_size_multiple: a full batch of c samples is cut to
  /// max(m * (c / m), c % m) and the rest starts the next batch. 1 = off.
  std::uint64_t batch_size_multiple = 1;
  /// Which torch.randperm the shuffle reproduces for n >= 214,748,364.
  torch_compat compat = torch_compat::since_2_7;
};

/// Deterministic dynamic batching across ranks.
///
/// Epoch plan (a pure function of the lengths, world size, seed, epoch and
/// options, identical on every rank, so ranks never communicate):
/// 1. order = torch.randperm(N, manual_seed(seed + epoch)) (or 0..N-1);
/// 2. for each buffer of sort_size * world_size consecutive entries of order:
///    stable sort by length (Python's sorted(key=len), as the seed);
///    apply the oversize policy; then walk the buffer adding sample i to the
///    open batch while max(max_len, len_i) * (count + 1) <= max_tokens and
///    count < max_batch_size (len_i = 1 for batch_type::examples), otherwise
///    closing the batch first (with batch_size_multiple applied). A batch never
///    spans two buffers and is never empty;
/// 3. batches are numbered in plan order 0..B-1; slot g of the padded schedule
///    is batch g (g < B) or a duplicate (pad) chosen by a keyed permutation of
///    seed + epoch; with rank_balance::drop the schedule is cut to a multiple
///    of world_size instead;
/// 4. step s of rank r is slot (step_order[s] * world_size + r), where
///    step_order is a keyed Feistel permutation of the steps when
///    shuffle_batches, else the identity. As in the seed, consecutive plan
///    batches (similar lengths, from one sorted buffer) go to different ranks
///    at the same step, so ranks stay balanced.
///
/// Storage is flat: the kept sample indices (8 bytes each) in plan order and
/// B + 1 batch offsets. Building an epoch's plan costs O(N log(buffer)) time and
/// reads every length once; after that batch(step) is O(1), so resuming at
/// step k costs nothing more than the plan (no replay of steps 0..k-1).
///
/// Differences from the seed: its `count` starts at 1 (at most
/// batch_size_sample_max - 1 samples) and it can emit an empty batch when the
/// first sample of a buffer exceeds the budget; it seeds with the epoch only;
/// it pads with Python's random module; it never shuffles batch order.
class token_budget_batch_sampler {
public:
  /// Batches over N = ranges::size(lengths) samples whose lengths are
  /// lengths[i] (any integer random-access range, e.g. jsonl_index::lengths()).
  /// The range is referenced, not copied: it must outlive the sampler.
  /// Builds the plan of epoch 0.
  /// @throws dpkit::invalid_argument for world_size == 0, rank >= world_size,
  ///         a zero max_tokens / max_batch_size / sort_size / batch_size_multiple,
  ///         or (oversize_policy::error) a sample over the limit.
  template <std::ranges::random_access_range R>
    requires std::integral<std::ranges::range_value_t<R>>
  token_budget_batch_sampler(const R& lengths, std::uint64_t world_size, std::uint64_t rank, token_budget_options options = {})
      : token_budget_batch_sampler(
            static_cast<std::uint64_t>(std::ranges::size(lengths)),
            [it = std::ranges::begin(lengths)](std::uint64_t i) {
              return static_cast<std::uint64_t>(it[static_cast<std::ranges::range_difference_t<R>>(i)]);
            },
            world_size, rank, options) {}

  /// Batches over `dataset_size` samples whose length in tokens is
  /// length(i) (callable with std::uint64_t, returning an integer).
  /// @throws as the range constructor.
  template <class F>
    requires std::invocable<const F&, std::uint64_t>
  token_budget_batch_sampler(std::uint64_t dataset_size, F length, std::uint64_t world_size, std::uint64_t rank,
                             token_budget_options options = {})
      : n_(dataset_size), world_(world_size), rank_(rank), opt_(options),
        length_([f = std::move(length)](std::uint64_t i) { return static_cast<std::uint64_t>(f(i)); }) {
    detail::data::check_rank("token_budget_batch_sampler", world_size, rank);
    const auto positive = [&](std::uint64_t v, const char* name) {
      if (v == 0)
        throw invalid_argument(std::string("token_budget_batch_sampler: ") + name + " 0 must be >= 1 (rank " +
                               std::to_string(rank) + ")");
    };
    positive(opt_.max_tokens, "max_tokens");
    positive(opt_.max_batch_size, "max_batch_size");
    positive(opt_.sort_size, "sort_size");
    positive(opt_.batch_size_multiple, "batch_size_multiple");
    set_epoch(0);
  }

  /// Builds the plan of `epoch` (O(N log buffer) time; see the class comment).
  /// @throws dpkit::invalid_argument with oversize_policy::error.
  void set_epoch(std::uint64_t epoch) {
    epoch_ = epoch;
    build_plan();
  }

  /// Current epoch.
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  /// Batches per rank this epoch (the same on every rank).
  [[nodiscard]] std::uint64_t num_batches() const noexcept { return steps_; }
  /// Same as num_batches().
  [[nodiscard]] std::uint64_t size() const noexcept { return steps_; }
  /// Batches of the plan before padding / dropping (all ranks together).
  [[nodiscard]] std::uint64_t total_batches() const noexcept { return offsets_.size() - 1; }
  /// Samples kept this epoch (each appears in exactly one plan batch).
  [[nodiscard]] std::uint64_t kept_samples() const noexcept { return offsets_.back(); }
  /// Samples skipped this epoch: over the limit (oversize_policy::skip), or
  /// with length dpkit::missing_length (under every policy).
  [[nodiscard]] std::uint64_t skipped() const noexcept { return skipped_; }
  /// Samples kept but over the limit (oversize_policy::truncate) this epoch.
  [[nodiscard]] std::uint64_t truncated() const noexcept { return truncated_; }
  /// Per-sample limit in tokens actually applied.
  [[nodiscard]] std::uint64_t sample_limit() const noexcept {
    return opt_.type == batch_type::tokens ? std::min(opt_.max_sample_tokens, opt_.max_tokens) : opt_.max_sample_tokens;
  }
  /// Dataset size N.
  [[nodiscard]] std::uint64_t dataset_size() const noexcept { return n_; }
  /// World size.
  [[nodiscard]] std::uint64_t world_size() const noexcept { return world_; }
  /// This rank.
  [[nodiscard]] std::uint64_t rank() const noexcept { return rank_; }
  /// Options.
  [[nodiscard]] const token_budget_options& options() const noexcept { return opt_; }

  /// Plan batch `b` (b < total_batches()): its sample indices, sorted by length.
  [[nodiscard]] std::span<const std::uint64_t> plan_batch(std::uint64_t b) const noexcept {
    return {indices_.data() + offsets_[b], static_cast<std::size_t>(offsets_[b + 1] - offsets_[b])};
  }

  /// Plan batch number that `rank` runs at `step` (step < num_batches(),
  /// rank < world_size()). O(1).
  [[nodiscard]] std::uint64_t batch_id(std::uint64_t step, std::uint64_t rank) const noexcept {
    const std::uint64_t slot = slot_of(step, rank);
    return slot < total_batches() ? slot : pads_[slot - total_batches()];
  }

  /// True if `rank`'s batch at `step` is a padding duplicate.
  [[nodiscard]] bool is_padding(std::uint64_t step, std::uint64_t rank) const noexcept {
    return slot_of(step, rank) >= total_batches();
  }
  /// True if this rank's batch at `step` is a padding duplicate.
  [[nodiscard]] bool is_padding(std::uint64_t step) const noexcept { return is_padding(step, rank_); }

  /// This rank's batch at `step` (dataset indices). O(1), so resuming at step k
  /// is just starting the loop at k. Precondition: step < num_batches().
  [[nodiscard]] std::span<const std::uint64_t> batch(std::uint64_t step) const noexcept { return batch(step, rank_); }
  /// `rank`'s batch at `step`. Preconditions: step < num_batches(), rank < world_size().
  [[nodiscard]] std::span<const std::uint64_t> batch(std::uint64_t step, std::uint64_t rank) const noexcept {
    return plan_batch(batch_id(step, rank));
  }

  /// This rank's batch at `step`, checked.
  /// @throws dpkit::invalid_argument naming step, num_batches() and the rank.
  [[nodiscard]] std::span<const std::uint64_t> at(std::uint64_t step) const {
    if (step >= steps_)
      throw invalid_argument("token_budget_batch_sampler: step " + std::to_string(step) + " >= num_batches " +
                             std::to_string(steps_) + " (rank " + std::to_string(rank_) + ")");
    return batch(step);
  }

  /// Length used for budgeting of sample i (after truncation; 1 for examples).
  [[nodiscard]] std::uint64_t budget_length(std::uint64_t i) const {
    if (opt_.type == batch_type::examples) return 1;
    return std::min(length_(i), sample_limit());
  }

private:
  [[nodiscard]] std::uint64_t slot_of(std::uint64_t step, std::uint64_t rank) const noexcept {
    const std::uint64_t s = opt_.shuffle_batches ? step_order_[step] : step;
    return s * world_ + rank;
  }

  void build_plan() {
    skipped_ = truncated_ = 0;
    indices_.assign(n_, 0);
    if (opt_.shuffle)
      torch_randperm_fill(std::span<std::uint64_t>(indices_), opt_.seed + epoch_, opt_.compat);
    else
      std::iota(indices_.begin(), indices_.end(), std::uint64_t{0});
    offsets_.assign(1, 0);
    const std::uint64_t limit = sample_limit();
    const std::uint64_t buffer = opt_.sort_size * world_;
    const std::uint64_t mult = opt_.batch_size_multiple;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> buf; // (length, index)
    std::uint64_t w = 0;                                        // write position in indices_
    for (std::uint64_t b = 0; b < n_; b += buffer) {
      const std::uint64_t e = std::min(n_, b + buffer);
      buf.clear();
      for (std::uint64_t i = b; i < e; ++i) buf.emplace_back(length_(indices_[i]), indices_[i]);
      std::stable_sort(buf.begin(), buf.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      std::uint64_t start = w, count = 0, max_len = 0;
      const auto close = [&](bool full) {
        std::uint64_t keep = count;
        if (full && mult > 1 && count >= mult) keep = std::max(mult * (count / mult), count % mult);
        offsets_.push_back(start + keep);
        start += keep;
        count -= keep;
        max_len = 0;
        for (std::uint64_t j = start; j < start + count; ++j) max_len = std::max(max_len, eff_[j - batch_base_]);
      };
      batch_base_ = w;
      eff_.clear();
      for (const auto& [len, idx] : buf) {
        std::uint64_t l = len;
        if (len == missing_length) { // no length (missing_field_policy::skip): always left out
          ++skipped_;
          continue;
        }
        if (l > limit) {
          if (opt_.oversize == oversize_policy::skip) {
            ++skipped_;
            continue;
          }
          if (opt_.oversize == oversize_policy::error)
            throw invalid_argument("token_budget_batch_sampler: sample " + std::to_string(idx) + " has length " +
                                   std::to_string(len) + " > limit " + std::to_string(limit) + " (rank " +
                                   std::to_string(rank_) + ", epoch " + std::to_string(epoch_) + ")");
          ++truncated_;
          l = limit;
        }
        if (opt_.type == batch_type::examples) l = 1;
        while (count > 0 && (std::max(max_len, l) * (count + 1) > opt_.max_tokens || count >= opt_.max_batch_size)) close(true);
        indices_[w++] = idx;
        eff_.push_back(l);
        ++count;
        max_len = std::max(max_len, l);
      }
      if (count > 0) close(false); // the last batch of a buffer is emitted whole (as fairseq's last batch)
    }
    indices_.resize(w);
    eff_.clear();
    eff_.shrink_to_fit();
    const std::uint64_t total = offsets_.size() - 1;
    pads_.clear();
    std::uint64_t slots = total;
    if (opt_.balance == rank_balance::drop) {
      slots = total / world_ * world_;
    } else if (total > 0) {
      slots = (total + world_ - 1) / world_ * world_;
      feistel pick;
      pick.reset(total, detail::data::mix64(opt_.seed + epoch_) ^ 0x7061645f62617463ULL);
      for (std::uint64_t j = 0; total + j < slots; ++j) pads_.push_back(pick[j % total]);
    }
    steps_ = slots / world_;
    step_order_.clear();
    if (opt_.shuffle_batches && steps_ > 0) {
      feistel order;
      order.reset(steps_, detail::data::mix64(opt_.seed + epoch_) ^ 0x737465705f6f7264ULL);
      step_order_.resize(steps_);
      for (std::uint64_t s = 0; s < steps_; ++s) step_order_[s] = order[s];
    }
  }

  std::uint64_t n_;
  std::uint64_t world_;
  std::uint64_t rank_;
  token_budget_options opt_;
  std::function<std::uint64_t(std::uint64_t)> length_;
  std::uint64_t epoch_ = 0;
  std::vector<std::uint64_t> indices_;
  std::vector<std::uint64_t> offsets_{0};
  std::vector<std::uint64_t> pads_;
  std::vector<std::uint64_t> step_order_;
  std::vector<std::uint64_t> eff_; // budget lengths of the current buffer (plan building only)
  std::uint64_t batch_base_ = 0;
  std::uint64_t steps_ = 0;
  std::uint64_t skipped_ = 0;
  std::uint64_t truncated_ = 0;
};

} // namespace dpkit
