/// @file token_budget_sampler.hpp
/// @brief Dynamic (token-budget) batches for distributed training: FunASR's
/// CustomDistributedBufferDynamicBatchSampler (the seed document), done right.
/// Design section 5, "Samplers"; guide: docs/data.md.
#pragma once

#include <dpkit/core/cpus.hpp>
#include <dpkit/core/errors.hpp>
#include <dpkit/data/distributed_sampler.hpp>
#include <dpkit/data/lengths.hpp>
#include <dpkit/data/permutation.hpp>

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <concepts>
#include <cstdint>
#include <functional>
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

/// Which permutation shuffles the samples before buffering.
enum class sample_shuffle {
  /// torch.randperm(N, manual_seed(seed + epoch)), bit for bit (dpkit::torch_randperm):
  /// the seed's order. Materializes the permutation: 4 bytes per sample (8 above
  /// 2^32) and one serial O(N) pass per epoch, about as long as torch.randperm.
  torch_randperm,
  /// dpkit::feistel reset to (N, seed + epoch) (version feistel::version): O(1)
  /// memory, evaluated per buffer on all plan threads. Use it at scale (1e8+
  /// samples). A different order than torch's, hence different batches.
  feistel,
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
  /// Samples are sorted by length inside buffers of sort_size * world_size
  /// (sort_size alone when `elastic`).
  std::uint64_t sort_size = 1024;
  /// Shuffle samples before buffering (with `shuffle_with`, seed + epoch).
  bool shuffle = true;
  /// Which permutation shuffles the samples (ignored without `shuffle`).
  sample_shuffle shuffle_with = sample_shuffle::torch_randperm;
  /// Shuffle the order of the batches per epoch: the order of the steps (groups
  /// of world_size consecutive plan batches), or of the plan batches themselves
  /// when `elastic`.
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
  /// World-size-independent global batch sequence (docs/data.md, "Elastic
  /// determinism"): buffers are sort_size samples (not sort_size * world_size)
  /// and the epoch is one fixed sequence of global batches, of which rank r of
  /// W runs global position start + step * W + r. A run checkpointed at global
  /// offset o on W ranks resumes on any W' with set_epoch(epoch, o).
  bool elastic = false;
  /// Threads that build the plan (count batches per buffer); 0 = the CPUs the
  /// calling thread may run on (dpkit::usable_cpu_count(), its affinity
  /// mask), at most 16. Each uses 1.5 MiB of scratch while planning. The plan
  /// does not depend on it.
  unsigned threads = 0;
};

namespace detail {

/// The greedy packing of one sorted buffer (the seed's loop, count = batch
/// size): add(l) appends a sample of budget length l (non-decreasing within a
/// buffer), closing the open batch first while the budget or max_batch_size
/// would be exceeded; finish() closes the last batch whole. `on_close(k)` is
/// called with the size of every closed batch, in order.
struct batch_packer {
  std::uint64_t max_tokens;
  std::uint64_t max_batch_size;
  std::uint64_t multiple;
  std::uint64_t count = 0;   // samples in the open batch
  std::uint64_t max_len = 0; // their largest budget length

  template <class OnClose>
  void add(std::uint64_t l, OnClose&& on_close) {
    while (count > 0 && (std::max(max_len, l) * (count + 1) > max_tokens || count >= max_batch_size)) {
      std::uint64_t keep = count;
      if (multiple > 1 && count >= multiple) keep = std::max(multiple * (count / multiple), count % multiple);
      on_close(keep);
      count -= keep;
      // lengths are non-decreasing: the remaining samples are the last added,
      // whose maximum is the last one, i.e. max_len
      if (count == 0) max_len = 0;
    }
    ++count;
    max_len = std::max(max_len, l);
  }

  /// add(l) `c` times; without batch_size_multiple in O(1) + one call per
  /// closed batch: a batch whose largest length is l holds
  /// cap = min(max_batch_size, max_tokens / l) samples, so the run fills the
  /// open batch up to cap and then closes a batch every cap samples.
  template <class OnClose>
  void add_run(std::uint64_t l, std::uint64_t c, OnClose&& on_close) {
    if (multiple > 1 || c < 4) {
      for (; c > 0; --c) add(l, on_close);
      return;
    }
    const std::uint64_t cap = l == 0 ? max_batch_size : std::min(max_batch_size, max_tokens / l); // >= 1: l <= limit <= max_tokens
    add(l, on_close);                                                                              // closes the open batch if l does not fit
    --c;
    const std::uint64_t total = count + c; // samples from the open batch on, all fitting cap once max_len = l
    const std::uint64_t full = (total - 1) / cap;
    for (std::uint64_t k = 0; k < full; ++k) on_close(cap);
    count = total - full * cap;
  }

  template <class OnClose>
  void finish(OnClose&& on_close) {
    if (count > 0) on_close(count); // the last batch of a buffer is emitted whole (as fairseq's last batch)
    count = max_len = 0;
  }
};

/// Lengths over this bound are sorted by comparison instead of counting.
inline constexpr std::uint64_t counting_sort_max_key = std::uint64_t{1} << 16;

/// Samples per block of the plan's gather (bounded: the plan's memory does not
/// grow with N): 24 bytes each, so 1.5 MiB per plan thread, which stays in the
/// core's L2 cache. Measured on 2e8 samples (docs/data.md, "At scale"): blocks
/// of 2^20 (24 MiB per thread, more than the L3 with two threads) planned in
/// 2.4-2.9 s on 2 threads, 2^15-2^17 in 1.6-1.8 s.
inline constexpr std::uint64_t block_samples = std::uint64_t{1} << 16;

/// Plan threads when token_budget_options::threads is 0: all hardware threads,
/// at most this many (the plan is memory-bound; more threads add scratch, not speed).
inline constexpr unsigned max_default_plan_threads = 16;

/// The plan's gather sorts a block's indices into 2^gather_bucket_bits buckets
/// by their top bits before reading their lengths (with 2^8 to 2^10 buckets
/// the scatter's write streams stay in L1/L2; 2^12 was slower).
inline constexpr unsigned gather_bucket_bits = 9;

} // namespace detail

/// Deterministic dynamic batching across ranks.
///
/// Epoch plan (a pure function of the lengths, world size, seed, epoch and
/// options, identical on every rank, so ranks never communicate):
/// 1. order = torch.randperm(N, manual_seed(seed + epoch)) (or feistel(N,
///    seed + epoch) with sample_shuffle::feistel, or 0..N-1 without shuffle);
/// 2. for each buffer of S = sort_size * world_size (sort_size when elastic)
///    consecutive entries of order: stable sort by length (Python's
///    sorted(key=len), as the seed); apply the oversize policy; then walk the
///    buffer adding sample i to the open batch while
///    max(max_len, len_i) * (count + 1) <= max_tokens and
///    count < max_batch_size (len_i = 1 for batch_type::examples), otherwise
///    closing the batch first (with batch_size_multiple applied). A batch never
///    spans two buffers and is never empty. Plan batches are numbered
///    0..B-1 in buffer order;
/// 3. global positions: slot g of the padded schedule is batch g (g < B) or a
///    duplicate (pad) pick[(g - B) mod B], pick a keyed Feistel permutation of
///    B for seed + epoch; with rank_balance::drop the schedule is cut to a
///    multiple of world_size instead;
/// 4. not elastic: step s of rank r is slot (step_order[s] * W + r), where
///    step_order is a keyed Feistel permutation of the steps when
///    shuffle_batches, else the identity. As in the seed, consecutive plan
///    batches (similar lengths, from one sorted buffer) go to different ranks
///    at the same step, so ranks stay balanced.
///    elastic: global position p < B is plan batch batch_order[p]
///    (batch_order a keyed Feistel permutation of B when shuffle_batches), and
///    rank r runs position start + step * W + r; positions >= B are pads.
///
/// Storage: set_epoch counts the batches of every buffer once, on
/// options.threads threads, with a counting sort of the buffer's lengths; it
/// keeps one 8-byte prefix sum per buffer (N / S + 1 values) plus, with
/// sample_shuffle::torch_randperm, the permutation (4 bytes per sample). A
/// batch is re-derived from its buffer when asked for (O(S) work: S lengths,
/// a counting sort, the walk; the last buffer is cached), so batch(step) costs
/// O(S + log(N / S)) and resuming at step k costs nothing more than the plan
/// (no replay of steps 0..k-1). The batches are the same as dpkit 0.1's, which
/// stored every index (8 bytes per sample); the schedule (step order, pads)
/// uses dpkit::feistel, version 2 since dpkit 0.2.
///
/// Differences from the seed: its `count` starts at 1 (at most
/// batch_size_sample_max - 1 samples) and it can emit an empty batch when the
/// first sample of a buffer exceeds the budget; it seeds with the epoch only;
/// it pads with Python's random module; it never shuffles batch order.
///
/// Thread safety: set_epoch is not thread-safe; const members are (the cache of
/// the last derived buffer is guarded by a mutex).
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
      : token_budget_batch_sampler(static_cast<std::uint64_t>(std::ranges::size(lengths)), range_gather(lengths), world_size, rank,
                                   options, 0) {}

  /// Batches over `dataset_size` samples whose length in tokens is
  /// length(i) (callable with std::uint64_t, returning an integer; called from
  /// several plan threads at once, so it must be safe to call concurrently).
  /// @throws as the range constructor, and what `length` throws.
  template <class F>
    requires std::invocable<const F&, std::uint64_t>
  token_budget_batch_sampler(std::uint64_t dataset_size, F length, std::uint64_t world_size, std::uint64_t rank,
                             token_budget_options options = {})
      : token_budget_batch_sampler(
            dataset_size,
            [f = std::move(length)](std::span<const std::uint64_t> keys, unsigned shift, std::span<std::uint64_t> out) {
              const std::uint64_t mask = (std::uint64_t{1} << shift) - 1;
              for (const std::uint64_t key : keys) out[key & mask] = static_cast<std::uint64_t>(f(key >> shift));
            },
            world_size, rank, options, 0) {}

  /// Builds the plan of `epoch` (see the class comment) and starts the schedule
  /// at global position `start` (0 = the beginning of the epoch; a checkpoint
  /// saves offset_after(steps done)). Re-planning is skipped when only `start`
  /// changes.
  /// @throws dpkit::invalid_argument with oversize_policy::error, if start >
  ///         the schedule's positions, or (not elastic) if start is not a
  ///         multiple of world_size.
  void set_epoch(std::uint64_t epoch, std::uint64_t start = 0) {
    if (!planned_ || epoch != epoch_) {
      planned_ = false;
      epoch_ = epoch;
      build_plan();
      planned_ = true;
    }
    set_start(start);
  }

  /// Current epoch.
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  /// Global position of this epoch at which step 0 starts (set_epoch's start).
  [[nodiscard]] std::uint64_t start() const noexcept { return start_; }
  /// Batches per rank from start() to the end of the epoch (the same on every rank).
  [[nodiscard]] std::uint64_t num_batches() const noexcept { return (positions_ - start_) / world_; }
  /// Same as num_batches().
  [[nodiscard]] std::uint64_t size() const noexcept { return num_batches(); }
  /// Batches of the plan before padding / dropping (all ranks together).
  [[nodiscard]] std::uint64_t total_batches() const noexcept { return prefix_.back(); }
  /// Global positions of the schedule: total_batches() plus pads, or cut to a
  /// multiple of the world size (rank_balance::drop), counted from 0 (not from start()).
  [[nodiscard]] std::uint64_t global_positions() const noexcept { return positions_; }
  /// Global position that `rank` runs at `step`: start() + step * world_size() + rank.
  [[nodiscard]] std::uint64_t global_position(std::uint64_t step, std::uint64_t rank) const noexcept {
    return start_ + step * world_ + rank;
  }
  /// Global offset after steps 0..steps-1 ran on every rank: start() + steps *
  /// world_size(). Save it with the epoch in a checkpoint; with `elastic`, a run
  /// on any world size resumes with set_epoch(epoch, offset).
  [[nodiscard]] std::uint64_t offset_after(std::uint64_t steps) const noexcept { return start_ + steps * world_; }
  /// Samples kept this epoch (each appears in exactly one plan batch).
  [[nodiscard]] std::uint64_t kept_samples() const noexcept { return kept_; }
  /// Samples skipped this epoch: over the limit (oversize_policy::skip), or
  /// with length dpkit::missing_length (under every policy).
  [[nodiscard]] std::uint64_t skipped() const noexcept { return skipped_; }
  /// Samples kept but over the limit (oversize_policy::truncate) this epoch.
  [[nodiscard]] std::uint64_t truncated() const noexcept { return truncated_; }
  /// Per-sample limit in tokens actually applied.
  [[nodiscard]] std::uint64_t sample_limit() const noexcept {
    return opt_.type == batch_type::tokens ? std::min(opt_.max_sample_tokens, opt_.max_tokens) : opt_.max_sample_tokens;
  }
  /// Samples per sort buffer: sort_size * world_size, or sort_size when elastic.
  [[nodiscard]] std::uint64_t buffer_size() const noexcept { return buffer_; }
  /// Dataset size N.
  [[nodiscard]] std::uint64_t dataset_size() const noexcept { return n_; }
  /// World size.
  [[nodiscard]] std::uint64_t world_size() const noexcept { return world_; }
  /// This rank.
  [[nodiscard]] std::uint64_t rank() const noexcept { return rank_; }
  /// Options.
  [[nodiscard]] const token_budget_options& options() const noexcept { return opt_; }

  /// Plan batch `b` (b < total_batches()): its sample indices, sorted by
  /// length. O(buffer_size()) unless b's buffer was the last one derived.
  [[nodiscard]] std::vector<std::uint64_t> plan_batch(std::uint64_t b) const {
    const auto q = static_cast<std::uint64_t>(std::upper_bound(prefix_.begin(), prefix_.end(), b) - prefix_.begin()) - 1;
    const std::lock_guard<std::mutex> lock(cache_.mutex);
    if (cache_.buffer != q) {
      cache_.buffer = ~std::uint64_t{0};
      derive_buffer(q, cache_.indices, cache_.bounds);
      cache_.buffer = q;
    }
    const std::uint64_t j = b - prefix_[q];
    return {cache_.indices.begin() + static_cast<std::ptrdiff_t>(cache_.bounds[j]),
            cache_.indices.begin() + static_cast<std::ptrdiff_t>(cache_.bounds[j + 1])};
  }

  /// Plan batch at global position p (p < global_positions()). O(1).
  [[nodiscard]] std::uint64_t batch_at_position(std::uint64_t p) const noexcept {
    const std::uint64_t b = total_batches();
    std::uint64_t slot = p;
    if (opt_.elastic) {
      if (p < b) return opt_.shuffle_batches ? batch_order_[p] : p;
    } else {
      const std::uint64_t s = p / world_;
      slot = (opt_.shuffle_batches ? order_[s] : s) * world_ + p % world_;
      if (slot < b) return slot;
    }
    return pick_[(slot - b) % b];
  }

  /// True if global position p is a padding duplicate.
  [[nodiscard]] bool is_padding_position(std::uint64_t p) const noexcept {
    if (opt_.elastic) return p >= total_batches();
    const std::uint64_t s = p / world_;
    return (opt_.shuffle_batches ? order_[s] : s) * world_ + p % world_ >= total_batches();
  }

  /// Plan batch number that `rank` runs at `step` (step < num_batches(),
  /// rank < world_size()). O(1).
  [[nodiscard]] std::uint64_t batch_id(std::uint64_t step, std::uint64_t rank) const noexcept {
    return batch_at_position(global_position(step, rank));
  }

  /// True if `rank`'s batch at `step` is a padding duplicate.
  [[nodiscard]] bool is_padding(std::uint64_t step, std::uint64_t rank) const noexcept {
    return is_padding_position(global_position(step, rank));
  }
  /// True if this rank's batch at `step` is a padding duplicate.
  [[nodiscard]] bool is_padding(std::uint64_t step) const noexcept { return is_padding(step, rank_); }

  /// This rank's batch at `step` (dataset indices, sorted by length); resuming
  /// at step k is just starting the loop at k. Precondition: step < num_batches().
  [[nodiscard]] std::vector<std::uint64_t> batch(std::uint64_t step) const { return batch(step, rank_); }
  /// `rank`'s batch at `step`. Preconditions: step < num_batches(), rank < world_size().
  [[nodiscard]] std::vector<std::uint64_t> batch(std::uint64_t step, std::uint64_t rank) const {
    return plan_batch(batch_id(step, rank));
  }

  /// This rank's batch at `step`, checked.
  /// @throws dpkit::invalid_argument naming step, num_batches() and the rank.
  [[nodiscard]] std::vector<std::uint64_t> at(std::uint64_t step) const {
    if (step >= num_batches())
      throw invalid_argument("token_budget_batch_sampler: step " + std::to_string(step) + " >= num_batches " +
                             std::to_string(num_batches()) + " (rank " + std::to_string(rank_) + ")");
    return batch(step);
  }

  /// Length used for budgeting of sample i (after truncation; 1 for examples).
  [[nodiscard]] std::uint64_t budget_length(std::uint64_t i) const {
    if (opt_.type == batch_type::examples) return 1;
    std::uint64_t len = 0;
    gather_(std::span<const std::uint64_t>(&i, 1), 0, std::span<std::uint64_t>(&len, 1));
    return std::min(len, sample_limit());
  }

private:
  /// gather(keys, shift, out): out[key & (2^shift - 1)] = length of sample
  /// key >> shift, for every key (a sample index and an output slot packed in
  /// one word, so that the caller can order the reads by index).
  using gather_fn = std::function<void(std::span<const std::uint64_t>, unsigned, std::span<std::uint64_t>)>;

  /// gather_fn over a random-access range, prefetching ahead on contiguous ones.
  template <class R>
  static gather_fn range_gather(const R& lengths) {
    return [it = std::ranges::begin(lengths)](std::span<const std::uint64_t> keys, unsigned shift, std::span<std::uint64_t> out) {
      using diff = std::ranges::range_difference_t<R>;
      constexpr std::size_t ahead = 32;
      const std::uint64_t mask = (std::uint64_t{1} << shift) - 1;
      for (std::size_t k = 0; k < keys.size(); ++k) {
        if constexpr (std::contiguous_iterator<decltype(it)>)
          if (k + ahead < keys.size()) __builtin_prefetch(std::to_address(it) + (keys[k + ahead] >> shift));
        out[keys[k] & mask] = static_cast<std::uint64_t>(it[static_cast<diff>(keys[k] >> shift)]);
      }
    };
  }

  /// out[j] = length of sample idx[j] (j < out.size()); `keys` is scratch.
  void gather_lengths(std::span<const std::uint64_t> idx, std::span<std::uint64_t> out, std::vector<std::uint64_t>& keys) const {
    const std::size_t m = idx.size();
    const unsigned pbits = m <= 1 ? 0u : static_cast<unsigned>(std::bit_width(m - 1));
    if (n_ > 0 && static_cast<unsigned>(std::bit_width(n_ - 1)) + pbits > 64) { // no room to pack: one by one
      for (std::size_t j = 0; j < m; ++j) gather_(idx.subspan(j, 1), 0, out.subspan(j, 1));
      return;
    }
    keys.resize(m);
    for (std::size_t j = 0; j < m; ++j) keys[j] = idx[j] << pbits | j;
    gather_(keys, pbits, out);
  }

  token_budget_batch_sampler(std::uint64_t n, gather_fn gather, std::uint64_t world_size, std::uint64_t rank,
                             token_budget_options options, int /*tag*/)
      : n_(n), world_(world_size), rank_(rank), opt_(options), gather_(std::move(gather)) {
    detail::check_rank("token_budget_batch_sampler", world_size, rank);
    const auto positive = [&](std::uint64_t v, const char* name) {
      if (v == 0)
        throw invalid_argument(std::string("token_budget_batch_sampler: ") + name + " 0 must be >= 1 (rank " +
                               std::to_string(rank) + ")");
    };
    positive(opt_.max_tokens, "max_tokens");
    positive(opt_.max_batch_size, "max_batch_size");
    positive(opt_.sort_size, "sort_size");
    positive(opt_.batch_size_multiple, "batch_size_multiple");
    buffer_ = opt_.elastic ? opt_.sort_size : opt_.sort_size * world_;
    if (opt_.shuffle && opt_.shuffle_with == sample_shuffle::torch_randperm) perm_ = torch_randperm(opt_.compat);
    set_epoch(0);
  }

  /// Per-thread scratch of one buffer.
  struct scratch {
    std::vector<std::uint64_t> idx;  // dataset indices, in order
    std::vector<std::uint64_t> len;  // their lengths
    std::vector<std::uint32_t> hist; // counting-sort buckets
  };

  /// Per-thread scratch of a block of buffers (plan building).
  struct block_scratch {
    std::vector<std::uint64_t> a;    // indices in position order
    std::vector<std::uint64_t> b;    // (index, position) keys in bucket order
    std::vector<std::uint64_t> len;  // lengths in position order
    std::vector<std::uint32_t> buckets; // gather buckets
    std::vector<std::uint32_t> hist; // budget-length histogram (zero between buffers)
  };

  /// Fills s.idx / s.len with buffer q's samples in shuffled order.
  void load_buffer(std::uint64_t q, scratch& s) const {
    const std::uint64_t b = q * buffer_, m = std::min(n_, b + buffer_) - b;
    s.idx.resize(m);
    s.len.resize(m);
    if (!opt_.shuffle) {
      for (std::uint64_t j = 0; j < m; ++j) s.idx[j] = b + j;
    } else if (opt_.shuffle_with == sample_shuffle::feistel) {
      order_shuffle_.fill(b, s.idx);
    } else {
      for (std::uint64_t j = 0; j < m; ++j) s.idx[j] = perm_[b + j];
    }
    std::vector<std::uint64_t> keys;
    gather_lengths(s.idx, s.len, keys);
  }

  /// Effective (budget) length of a sample of length len, or none (skipped);
  /// `oversize` is set when len is over the limit and kept or refused.
  struct effective {
    std::uint64_t len;
    bool kept;
    bool over;
  };
  [[nodiscard]] effective effective_length(std::uint64_t len, std::uint64_t limit) const noexcept {
    if (len == missing_length) return {0, false, false};
    bool over = false;
    if (len > limit) {
      if (opt_.oversize == oversize_policy::skip) return {0, false, false};
      over = true;
      len = limit;
    }
    return {opt_.type == batch_type::examples ? 1 : len, true, over};
  }

  /// Per-buffer result of the counting pass.
  struct buffer_count {
    std::uint64_t batches = 0, kept = 0, skipped = 0, truncated = 0;
    bool refused = false; // oversize_policy::error hit
  };

  /// Lengths of the samples at positions [p0, p0 + out.size()) of the epoch's
  /// order into `out`, read in nearly increasing index order: the indices,
  /// packed with their position, are bucketed by their top
  /// gather_bucket_bits bits (one counting-sort pass) before the gather, so
  /// that a block of random samples costs nearly streaming reads rather than a
  /// TLB and cache miss each, and each length lands at its position. Memory:
  /// 24 bytes per position of the block.
  void load_block(std::uint64_t p0, std::span<std::uint64_t> out, block_scratch& s) const {
    const std::size_t m = out.size();
    s.a.resize(m);
    if (!opt_.shuffle) {
      for (std::size_t j = 0; j < m; ++j) s.a[j] = p0 + j;
      gather_lengths(s.a, out, s.b);
      return;
    }
    if (opt_.shuffle_with == sample_shuffle::feistel)
      order_shuffle_.fill(p0, s.a);
    else
      for (std::size_t j = 0; j < m; ++j) s.a[j] = perm_[p0 + j];
    const unsigned bits = static_cast<unsigned>(std::bit_width(n_ - 1));
    const unsigned pbits = m <= 1 ? 0u : static_cast<unsigned>(std::bit_width(m - 1));
    if (bits + pbits > 64) {
      gather_lengths(s.a, out, s.b);
      return;
    }
    const unsigned shift = bits > detail::gather_bucket_bits ? bits - detail::gather_bucket_bits : 0;
    s.buckets.assign((std::size_t{1} << detail::gather_bucket_bits) + 1, 0);
    for (std::size_t j = 0; j < m; ++j) ++s.buckets[(s.a[j] >> shift) + 1];
    for (std::size_t v = 1; v < s.buckets.size(); ++v) s.buckets[v] += s.buckets[v - 1];
    s.b.resize(m);
    for (std::size_t j = 0; j < m; ++j) s.b[s.buckets[s.a[j] >> shift]++] = s.a[j] << pbits | j;
    gather_(s.b, pbits, out);
  }

  /// Counts the batches of one buffer whose lengths (in order) are `lens`,
  /// without ordering its samples: budget lengths go to a histogram (or, over
  /// counting_sort_max_key, a sorted vector) walked in increasing order, which
  /// gives the same batch sizes as the stable sort because the packing only
  /// sees lengths. Overwrites `lens` on the sorted path.
  buffer_count count_buffer(std::span<std::uint64_t> lens, std::vector<std::uint32_t>& hist) const {
    buffer_count c;
    const std::uint64_t limit = sample_limit();
    detail::batch_packer pack{opt_.max_tokens, opt_.max_batch_size, opt_.batch_size_multiple};
    const auto closed = [&](std::uint64_t) { ++c.batches; };
    const std::uint64_t top = opt_.type == batch_type::examples ? 1 : limit;
    const bool counting = top <= detail::counting_sort_max_key;
    if (counting && hist.size() != top + 1) hist.assign(static_cast<std::size_t>(top) + 1, 0); // all zero between calls
    std::uint64_t lo = top, hi = 0;
    std::size_t w = 0;
    const bool examples = opt_.type == batch_type::examples;
    for (const std::uint64_t len : lens) {
      if (counting && len <= limit) [[likely]] { // the common case, branch-light
        const std::uint64_t e = examples ? 1 : len;
        ++hist[e];
        lo = std::min(lo, e);
        hi = std::max(hi, e);
        continue;
      }
      const auto e = effective_length(len, limit);
      if (!e.kept) {
        ++c.skipped;
        continue;
      }
      c.refused |= e.over && opt_.oversize == oversize_policy::error;
      c.truncated += e.over;
      if (counting) {
        ++hist[e.len];
        lo = std::min(lo, e.len);
        hi = std::max(hi, e.len);
      } else {
        lens[w++] = e.len;
      }
    }
    if (counting) {
      for (std::uint64_t v = lo; v <= hi && lo <= hi; ++v) {
        if (hist[v] != 0) pack.add_run(v, hist[v], closed);
        hist[v] = 0;
      }
    } else {
      std::sort(lens.begin(), lens.begin() + static_cast<std::ptrdiff_t>(w));
      for (std::size_t j = 0; j < w; ++j) pack.add(lens[j], closed);
    }
    pack.finish(closed);
    c.kept = lens.size() - c.skipped;
    return c;
  }

  /// Buffer q's kept samples in plan order (stable by length, the seed's
  /// sorted(key=len)) into `indices`, and its batches as offsets into it
  /// (`bounds`, batches + 1 values). Applies the oversize policy exactly as the
  /// plan does (throws for oversize_policy::error).
  void derive_buffer(std::uint64_t q, std::vector<std::uint64_t>& indices, std::vector<std::uint64_t>& bounds) const {
    scratch s;
    load_buffer(q, s);
    const std::uint64_t m = s.idx.size(), limit = sample_limit();
    // stable order of positions by length: counting sort on min(len, limit + 1),
    // then the (rare) bucket of longer samples stable-sorted by their length
    std::vector<std::uint32_t> order(m);
    if (limit < detail::counting_sort_max_key) {
      std::vector<std::uint32_t> start(static_cast<std::size_t>(limit) + 3, 0);
      for (std::uint64_t j = 0; j < m; ++j) ++start[std::min(s.len[j], limit + 1) + 1];
      for (std::size_t v = 1; v < start.size(); ++v) start[v] += start[v - 1];
      const std::uint32_t over_begin = start[limit + 1];
      for (std::uint64_t j = 0; j < m; ++j) order[start[std::min(s.len[j], limit + 1)]++] = static_cast<std::uint32_t>(j);
      std::stable_sort(order.begin() + over_begin, order.end(), [&](std::uint32_t x, std::uint32_t y) { return s.len[x] < s.len[y]; });
    } else {
      for (std::uint64_t j = 0; j < m; ++j) order[j] = static_cast<std::uint32_t>(j);
      std::stable_sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) { return s.len[x] < s.len[y]; });
    }
    indices.clear();
    bounds.assign(1, 0);
    detail::batch_packer pack{opt_.max_tokens, opt_.max_batch_size, opt_.batch_size_multiple};
    const auto closed = [&](std::uint64_t keep) { bounds.push_back(bounds.back() + keep); };
    for (const std::uint32_t j : order) {
      const auto e = effective_length(s.len[j], limit);
      if (!e.kept) continue;
      if (e.over && opt_.oversize == oversize_policy::error)
        throw invalid_argument("token_budget_batch_sampler: sample " + std::to_string(s.idx[j]) + " has length " +
                               std::to_string(s.len[j]) + " > limit " + std::to_string(limit) + " (rank " +
                               std::to_string(rank_) + ", epoch " + std::to_string(epoch_) + ")");
      pack.add(e.len, closed);
      indices.push_back(s.idx[j]);
    }
    pack.finish(closed);
  }

  void build_plan() {
    cache_.buffer = ~std::uint64_t{0};
    const std::uint64_t key = detail::sampler_mix64(opt_.seed + epoch_);
    if (opt_.shuffle) {
      if (opt_.shuffle_with == sample_shuffle::feistel)
        order_shuffle_.reset(n_, opt_.seed + epoch_);
      else
        perm_.reset(n_, opt_.seed + epoch_);
    }
    // count the batches of every buffer, buffers split in contiguous chunks
    // over the threads (chunk boundaries do not change the result)
    const std::uint64_t nbuf = (n_ + buffer_ - 1) / buffer_;
    std::vector<std::uint64_t> counts(nbuf + 1, 0);
    unsigned threads = opt_.threads != 0 ? opt_.threads
                                         : std::clamp(usable_cpu_count(), 1u, detail::max_default_plan_threads);
    threads = static_cast<unsigned>(std::max<std::uint64_t>(1, std::min<std::uint64_t>(threads, nbuf / 16)));
    struct totals {
      std::uint64_t kept = 0, skipped = 0, truncated = 0;
      std::uint64_t refused = ~std::uint64_t{0}; // first buffer with a refused sample
      std::exception_ptr error;
    };
    std::vector<totals> part(threads);
    const auto work = [&](unsigned t) {
      try {
        block_scratch s;
        const std::uint64_t q0 = nbuf * t / threads, q1 = nbuf * (t + 1) / threads;
        const std::uint64_t per_block = std::max<std::uint64_t>(1, detail::block_samples / buffer_);
        for (std::uint64_t g = q0; g < q1; g += per_block) {
          const std::uint64_t g1 = std::min(q1, g + per_block);
          const std::uint64_t p0 = g * buffer_, p1 = std::min(n_, g1 * buffer_);
          s.len.resize(p1 - p0);
          load_block(p0, s.len, s);
          for (std::uint64_t q = g; q < g1; ++q) {
            const std::uint64_t b = q * buffer_ - p0, e = std::min(p1 - p0, b + buffer_);
            const buffer_count c = count_buffer(std::span<std::uint64_t>(s.len.data() + b, e - b), s.hist);
            counts[q + 1] = c.batches;
            part[t].kept += c.kept;
            part[t].skipped += c.skipped;
            part[t].truncated += c.truncated;
            if (c.refused) {
              part[t].refused = q;
              return;
            }
          }
        }
      } catch (...) {
        part[t].error = std::current_exception();
      }
    };
    if (threads == 1) {
      work(0);
    } else {
      std::vector<std::thread> pool;
      pool.reserve(threads - 1);
      for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work, t);
      work(0);
      for (auto& th : pool) th.join();
    }
    kept_ = skipped_ = truncated_ = 0;
    for (const auto& p : part) {
      if (p.error) std::rethrow_exception(p.error);
      if (p.refused != ~std::uint64_t{0}) {
        std::vector<std::uint64_t> i, b;
        derive_buffer(p.refused, i, b); // throws the error of the first refused sample in plan order
      }
      kept_ += p.kept;
      skipped_ += p.skipped;
      truncated_ += p.truncated;
    }
    for (std::uint64_t q = 0; q < nbuf; ++q) counts[q + 1] += counts[q];
    prefix_ = std::move(counts);
    const std::uint64_t total = prefix_.back();
    pick_.reset(total, key ^ 0x7061645f62617463ULL);
    if (opt_.elastic) {
      batch_order_.reset(total, key ^ 0x676c6f62616c6f72ULL);
    } else {
      positions_ = opt_.balance == rank_balance::drop ? total / world_ * world_ : (total + world_ - 1) / world_ * world_;
      order_.reset(positions_ / world_, key ^ 0x737465705f6f7264ULL);
    }
  }

  void set_start(std::uint64_t start) {
    const std::uint64_t total = total_batches();
    if (opt_.elastic) {
      if (start > total)
        throw invalid_argument("token_budget_batch_sampler: start " + std::to_string(start) + " > total_batches " +
                               std::to_string(total) + " (rank " + std::to_string(rank_) + ", epoch " + std::to_string(epoch_) + ")");
      const std::uint64_t rest = total - start;
      positions_ = start + (opt_.balance == rank_balance::drop ? rest / world_ : (rest + world_ - 1) / world_) * world_;
    } else if (start % world_ != 0 || start > positions_) {
      throw invalid_argument("token_budget_batch_sampler: start " + std::to_string(start) +
                             " must be a multiple of world_size " + std::to_string(world_) + " and <= " +
                             std::to_string(positions_) + " without elastic (rank " + std::to_string(rank_) + ")");
    }
    start_ = start;
  }

  std::uint64_t n_;
  std::uint64_t world_;
  std::uint64_t rank_;
  token_budget_options opt_;
  gather_fn gather_;
  std::uint64_t epoch_ = 0;
  std::uint64_t start_ = 0;
  std::uint64_t buffer_ = 1;
  bool planned_ = false;
  torch_randperm perm_;         // sample order (sample_shuffle::torch_randperm)
  feistel order_shuffle_;       // sample order (sample_shuffle::feistel)
  feistel order_;               // step order (not elastic)
  std::vector<std::uint64_t> prefix_{0}; // prefix_[q] = plan batches in buffers < q
  feistel pick_;                // pad choice
  feistel batch_order_;         // global batch order (elastic)
  std::uint64_t positions_ = 0; // schedule length (global positions)
  std::uint64_t skipped_ = 0;
  std::uint64_t truncated_ = 0;
  std::uint64_t kept_ = 0;
  /// The last derived buffer. Copies start empty (the mutex is not copyable).
  struct buffer_cache {
    buffer_cache() = default;
    buffer_cache(const buffer_cache&) noexcept {}
    buffer_cache& operator=(const buffer_cache&) noexcept {
      buffer = ~std::uint64_t{0};
      return *this;
    }
    ~buffer_cache() = default;
    std::mutex mutex;
    std::uint64_t buffer = ~std::uint64_t{0};
    std::vector<std::uint64_t> indices;
    std::vector<std::uint64_t> bounds;
  };
  mutable buffer_cache cache_;
};

} // namespace dpkit
