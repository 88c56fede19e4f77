// Tests of the samplers at scale: the token-budget plan that keeps
// per-buffer counts and re-derives batches equals dpkit 0.1's plan (which
// stored every index; kept below as the reference) batch for batch; the plan
// does not depend on the number of plan threads; elastic resume (4 -> 2 ranks)
// continues the same global sequence; distributed_sampler's evaluation mode
// reads every sample exactly once; feistel's bulk fill equals its lookups.
#include "sampler_test_util.hpp"

#include <dpkit/data/distributed_sampler.hpp>
#include <dpkit/data/jsonl_index.hpp>
#include <dpkit/data/jsonl_length_column.hpp>
#include <dpkit/data/permutation.hpp>
#include <dpkit/data/token_budget_sampler.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using batches_t = std::vector<std::vector<std::uint64_t>>;

/// dpkit 0.1's plan (token_budget_sampler.hpp at d9f2f11, build_plan), with
/// the sample order and the buffer size as inputs: every buffer stable-sorted
/// by length, the oversize policy, the greedy walk with batch_size_multiple.
struct reference_plan {
  batches_t batches;
  std::uint64_t skipped = 0, truncated = 0;
};

template <class Lengths>
reference_plan plan_v01(const Lengths& lengths, const std::vector<std::uint64_t>& order, std::uint64_t buffer,
                        const dpkit::token_budget_options& opt, std::uint64_t rank, std::uint64_t epoch) {
  reference_plan out;
  const std::uint64_t n = order.size();
  const std::uint64_t limit =
      opt.type == dpkit::batch_type::tokens ? std::min(opt.max_sample_tokens, opt.max_tokens) : opt.max_sample_tokens;
  const std::uint64_t mult = opt.batch_size_multiple;
  for (std::uint64_t b = 0; b < n; b += buffer) {
    const std::uint64_t e = std::min(n, b + buffer);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> buf;
    for (std::uint64_t i = b; i < e; ++i) buf.emplace_back(static_cast<std::uint64_t>(lengths[order[i]]), order[i]);
    std::stable_sort(buf.begin(), buf.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<std::uint64_t> open, eff; // open batch (indices, budget lengths)
    std::uint64_t max_len = 0;
    const auto close = [&](bool full) {
      std::uint64_t keep = open.size();
      if (full && mult > 1 && keep >= mult) keep = std::max(mult * (keep / mult), keep % mult);
      out.batches.emplace_back(open.begin(), open.begin() + static_cast<std::ptrdiff_t>(keep));
      open.erase(open.begin(), open.begin() + static_cast<std::ptrdiff_t>(keep));
      eff.erase(eff.begin(), eff.begin() + static_cast<std::ptrdiff_t>(keep));
      max_len = 0;
      for (auto l : eff) max_len = std::max(max_len, l);
    };
    for (const auto& [len, idx] : buf) {
      std::uint64_t l = len;
      if (len == dpkit::missing_length) {
        ++out.skipped;
        continue;
      }
      if (l > limit) {
        if (opt.oversize == dpkit::oversize_policy::skip) {
          ++out.skipped;
          continue;
        }
        if (opt.oversize == dpkit::oversize_policy::error)
          throw dpkit::invalid_argument("token_budget_batch_sampler: sample " + std::to_string(idx) + " has length " +
                                        std::to_string(len) + " > limit " + std::to_string(limit) + " (rank " +
                                        std::to_string(rank) + ", epoch " + std::to_string(epoch) + ")");
        ++out.truncated;
        l = limit;
      }
      if (opt.type == dpkit::batch_type::examples) l = 1;
      while (!open.empty() && (std::max(max_len, l) * (open.size() + 1) > opt.max_tokens || open.size() >= opt.max_batch_size))
        close(true);
      open.push_back(idx);
      eff.push_back(l);
      max_len = std::max(max_len, l);
    }
    if (!open.empty()) close(false);
  }
  return out;
}

/// The epoch's sample order as documented: torch.randperm, feistel or identity.
std::vector<std::uint64_t> sample_order(std::uint64_t n, const dpkit::token_budget_options& opt, std::uint64_t epoch) {
  std::vector<std::uint64_t> order(n);
  if (!opt.shuffle) {
    std::iota(order.begin(), order.end(), std::uint64_t{0});
  } else if (opt.shuffle_with == dpkit::sample_shuffle::feistel) {
    dpkit::feistel f;
    f.reset(n, opt.seed + epoch);
    for (std::uint64_t k = 0; k < n; ++k) order[k] = f[k];
  } else {
    const auto t = dpkit::torch_randperm_vector(n, opt.seed + epoch, opt.compat);
    for (std::uint64_t k = 0; k < n; ++k) order[k] = static_cast<std::uint64_t>(t[k]);
  }
  return order;
}

/// Plan batch at global position p, from the documented schedule (class
/// comment of token_budget_batch_sampler, steps 3 and 4).
std::uint64_t reference_batch_at(std::uint64_t p, std::uint64_t total, std::uint64_t positions, std::uint64_t world,
                                 const dpkit::token_budget_options& opt, std::uint64_t epoch) {
  const std::uint64_t key = dpkit::detail::sampler_mix64(opt.seed + epoch);
  dpkit::feistel pick, order;
  pick.reset(total, key ^ 0x7061645f62617463ULL);
  std::uint64_t slot = p;
  if (opt.elastic) {
    order.reset(total, key ^ 0x676c6f62616c6f72ULL);
    if (p < total) return opt.shuffle_batches ? order[p] : p;
  } else {
    order.reset(positions / world, key ^ 0x737465705f6f7264ULL);
    slot = (opt.shuffle_batches ? order[p / world] : p / world) * world + p % world;
    if (slot < total) return slot;
  }
  return pick[(slot - total) % total];
}

/// Compares the sampler (every rank's view) with the reference plan and schedule.
template <class Lengths>
void check_against_v01(const Lengths& lengths, std::uint64_t world, dpkit::token_budget_options opt, std::uint64_t epoch) {
  const std::uint64_t n = std::size(lengths);
  const std::uint64_t buffer = opt.elastic ? opt.sort_size : opt.sort_size * world;
  const auto ref = plan_v01(lengths, sample_order(n, opt, epoch), buffer, opt, 0, epoch);
  dpkit::token_budget_batch_sampler s(lengths, world, world - 1, opt);
  s.set_epoch(epoch);
  REQUIRE(s.total_batches() == ref.batches.size());
  CHECK(s.skipped() == ref.skipped);
  CHECK(s.truncated() == ref.truncated);
  std::uint64_t kept = 0;
  for (std::uint64_t b = 0; b < ref.batches.size(); ++b) {
    REQUIRE(s.plan_batch(b) == ref.batches[b]);
    kept += ref.batches[b].size();
  }
  CHECK(s.kept_samples() == kept);
  const std::uint64_t total = ref.batches.size();
  const std::uint64_t positions =
      opt.balance == dpkit::rank_balance::drop ? total / world * world : (total + world - 1) / world * world;
  REQUIRE(s.global_positions() == positions);
  REQUIRE(s.num_batches() == positions / world);
  for (std::uint64_t step = 0; step < s.num_batches(); ++step)
    for (std::uint64_t r = 0; r < world; ++r) {
      const std::uint64_t p = step * world + r;
      REQUIRE(s.batch_id(step, r) == reference_batch_at(p, total, positions, world, opt, epoch));
      if (r == world - 1) REQUIRE(s.batch(step) == ref.batches[s.batch_id(step, r)]);
    }
}

} // namespace

TEST_CASE("token_budget_batch_sampler equals dpkit 0.1's plan batch for batch (synthetic lengths)") {
  auto lengths = sampler_test::synthetic_lengths(12000, 21);
  lengths[17] = dpkit::missing_length; // a line without a length
  lengths[5000] = dpkit::missing_length;
  using dpkit::batch_type, dpkit::oversize_policy, dpkit::rank_balance;
  struct config {
    dpkit::token_budget_options options;
    std::uint64_t epoch;
  };
  // max_sample_tokens over 2^16 takes the comparison-sort path instead of the counting sort
  const std::vector<config> configs = {
      {{.max_tokens = 4096, .max_sample_tokens = 1024, .sort_size = 96, .seed = 5}, 0},
      {{.max_tokens = 4096, .max_sample_tokens = 1024, .sort_size = 96, .seed = 5}, 2},
      {{.max_sample_tokens = 1024, .oversize = oversize_policy::truncate, .sort_size = 96, .balance = rank_balance::drop}, 1},
      {{.max_batch_size = 37, .oversize = oversize_policy::truncate, .sort_size = 96, .batch_size_multiple = 8}, 1},
      {{.max_tokens = 16, .type = batch_type::examples, .max_sample_tokens = 100000, .sort_size = 96}, 3},
      {{.max_batch_size = 7, .shuffle = false, .shuffle_batches = false}, 0},
      {{.max_batch_size = 7, .sort_size = 333, .shuffle_batches = false, .elastic = true}, 4},
      {{.max_tokens = 200000, .max_sample_tokens = 70000, .oversize = oversize_policy::truncate, .sort_size = 333, .elastic = true}, 4},
  };
  for (std::uint64_t world : {1ull, 2ull, 3ull, 8ull})
    for (auto order : {dpkit::sample_shuffle::torch_randperm, dpkit::sample_shuffle::feistel})
      for (std::size_t c = 0; c < configs.size(); ++c) {
        CAPTURE(world);
        CAPTURE(c);
        auto o = configs[c].options;
        o.shuffle_with = order;
        check_against_v01(lengths, world, o, configs[c].epoch);
      }
  // uint64 lengths from a callable, some above 2^32 (sorted after missing ones)
  std::vector<std::uint64_t> wide(3000);
  std::mt19937_64 g(3);
  for (auto& x : wide) x = (g() % 16 == 0) ? (std::uint64_t{1} << 33) + g() % 5 : g() % 3000;
  wide[10] = dpkit::missing_length;
  dpkit::token_budget_options o;
  o.oversize = dpkit::oversize_policy::truncate;
  o.sort_size = 50;
  check_against_v01(wide, 2, o, 0);
}

TEST_CASE("token_budget_batch_sampler equals dpkit 0.1's plan batch for batch (real corpus lengths)") {
  const sampler_test::corpus_index idx("scale-debian.idx");
  const auto lengths = idx.lengths();
  REQUIRE(lengths.size() == 63956);
  for (std::uint64_t world : {1ull, 4ull}) {
    dpkit::token_budget_options o; // the seed's defaults
    o.max_tokens = 4096;
    check_against_v01(lengths, world, o, 0);
    check_against_v01(lengths, world, o, 7);
    o.shuffle_with = dpkit::sample_shuffle::feistel;
    o.batch_size_multiple = 8;
    check_against_v01(lengths, world, o, 1);
    o.elastic = true;
    check_against_v01(lengths, world, o, 1);
  }
}

TEST_CASE("token_budget_batch_sampler: the plan does not depend on the plan threads; errors name the first sample in plan order") {
  auto lengths = sampler_test::synthetic_lengths(60000, 8);
  dpkit::token_budget_options o;
  o.sort_size = 32;
  o.shuffle_with = dpkit::sample_shuffle::feistel;
  o.threads = 1;
  const dpkit::token_budget_batch_sampler one(lengths, 2, 0, o);
  for (unsigned t : {2u, 3u, 8u}) {
    o.threads = t;
    const dpkit::token_budget_batch_sampler many(lengths, 2, 0, o);
    REQUIRE(many.total_batches() == one.total_batches());
    CHECK(many.skipped() == one.skipped());
    for (std::uint64_t b = 0; b < one.total_batches(); b += 97) REQUIRE(many.plan_batch(b) == one.plan_batch(b));
  }
  // oversize_policy::error: with samples over the limit in many buffers, on 8
  // threads, the error is the one the sequential reference meets first
  o.oversize = dpkit::oversize_policy::error;
  o.max_sample_tokens = 400; // lognormal(4.5, 1): about 6% over
  std::string want;
  try {
    (void)plan_v01(lengths, sample_order(lengths.size(), o, 0), o.sort_size * 2, o, 1, 0);
  } catch (const dpkit::invalid_argument& e) {
    want = e.what();
  }
  REQUIRE(!want.empty());
  try {
    dpkit::token_budget_batch_sampler e(lengths, 2, 1, o);
    FAIL("no error");
  } catch (const dpkit::invalid_argument& e) {
    CHECK(std::string(e.what()) == want);
  }
}

TEST_CASE("token_budget_batch_sampler elastic: 4 ranks to 2 continues the same global batch sequence") {
  const auto lengths = sampler_test::synthetic_lengths(20000, 4);
  for (auto balance : {dpkit::rank_balance::pad, dpkit::rank_balance::drop}) {
    dpkit::token_budget_options o;
    o.elastic = true;
    o.sort_size = 200;
    o.seed = 9;
    o.balance = balance;
    o.shuffle_with = dpkit::sample_shuffle::feistel;
    const std::uint64_t epoch = 2;
    // the global sequence does not depend on the world size
    std::vector<std::uint64_t> global;
    {
      dpkit::token_budget_batch_sampler s(lengths, 1, 0, o);
      s.set_epoch(epoch);
      for (std::uint64_t p = 0; p < s.total_batches(); ++p) global.push_back(s.batch_at_position(p));
    }
    for (std::uint64_t w : {2ull, 3ull, 4ull, 8ull}) {
      dpkit::token_budget_batch_sampler s(lengths, w, w - 1, o);
      s.set_epoch(epoch);
      REQUIRE(s.total_batches() == global.size());
      for (std::uint64_t p = 0; p < global.size(); ++p) REQUIRE(s.batch_at_position(p) == global[p]);
    }
    // run 5 global steps on 4 ranks, checkpoint, resume on 2 ranks
    std::vector<std::uint64_t> consumed; // plan batches in global order, real (not padding) only
    std::uint64_t offset = 0;
    {
      std::vector<dpkit::token_budget_batch_sampler> ranks;
      for (std::uint64_t r = 0; r < 4; ++r) ranks.emplace_back(lengths, 4, r, o).set_epoch(epoch);
      const std::uint64_t k = 5;
      for (std::uint64_t step = 0; step < k; ++step)
        for (std::uint64_t r = 0; r < 4; ++r) {
          REQUIRE(!ranks[r].is_padding(step));
          consumed.push_back(ranks[r].batch_id(step, r));
        }
      offset = ranks[0].offset_after(k);
      CHECK(offset == 20);
    }
    {
      std::vector<dpkit::token_budget_batch_sampler> ranks;
      for (std::uint64_t r = 0; r < 2; ++r) ranks.emplace_back(lengths, 2, r, o).set_epoch(epoch, offset);
      REQUIRE(ranks[0].num_batches() == ranks[1].num_batches());
      for (std::uint64_t step = 0; step < ranks[0].num_batches(); ++step)
        for (std::uint64_t r = 0; r < 2; ++r) {
          REQUIRE(ranks[r].global_position(step, r) == offset + step * 2 + r);
          if (!ranks[r].is_padding(step)) consumed.push_back(ranks[r].batch_id(step, r));
        }
    }
    // the same sequence as a single run, no batch repeated or skipped (drop: the tail cut to a multiple of 2)
    const std::uint64_t expected = balance == dpkit::rank_balance::pad ? global.size() : 20 + (global.size() - 20) / 2 * 2;
    REQUIRE(consumed.size() == expected);
    for (std::uint64_t p = 0; p < consumed.size(); ++p) REQUIRE(consumed[p] == global[p]);
  }
  // start validation
  dpkit::token_budget_options o;
  o.elastic = true;
  dpkit::token_budget_batch_sampler s(lengths, 4, 0, o);
  CHECK_THROWS_AS(s.set_epoch(0, s.total_batches() + 1), dpkit::invalid_argument);
  s.set_epoch(0, s.total_batches());
  CHECK(s.num_batches() == 0);
  o.elastic = false;
  dpkit::token_budget_batch_sampler ne(lengths, 4, 0, o);
  CHECK_THROWS_AS(ne.set_epoch(0, 6), dpkit::invalid_argument); // not a multiple of the world size
  const auto b3 = ne.batch(3);
  ne.set_epoch(0, 8);
  CHECK(ne.batch(1) == b3);
}

TEST_CASE("distributed_sampler exactly_once: every sample once, ranks differ by at most one") {
  for (std::uint64_t n : {0ull, 1ull, 2ull, 3ull, 5ull, 7ull, 13ull, 97ull, 1000ull}) {
    for (std::uint64_t w = 1; w <= 8; ++w) {
      for (bool feistel : {false, true}) {
        CAPTURE(n);
        CAPTURE(w);
        std::vector<int> seen(n, 0);
        std::uint64_t lo = ~0ull, hi = 0;
        for (std::uint64_t r = 0; r < w; ++r) {
          const dpkit::distributed_sampler_options opt{.shuffle = true, .seed = 4, .exactly_once = true};
          std::vector<std::uint64_t> got;
          std::uint64_t count = 0;
          if (feistel) {
            dpkit::distributed_sampler<dpkit::feistel> s(n, w, r, opt);
            s.set_epoch(3);
            got = s.indices();
            count = s.num_samples();
            for (std::uint64_t q = 0; q < w; ++q) CHECK(s.num_samples(q) == (n > q ? (n - q + w - 1) / w : 0));
            CHECK(s.max_num_samples() == (n + w - 1) / w);
          } else {
            dpkit::distributed_sampler<> s(n, w, r, opt);
            s.set_epoch(3);
            got = s.indices();
            count = s.num_samples();
            // the strided split of torch's list without its padding
            dpkit::distributed_sampler<> torch_like(n, w, r, {.shuffle = true, .seed = 4});
            torch_like.set_epoch(3);
            for (std::uint64_t k = 0; k < got.size(); ++k) REQUIRE(got[k] == torch_like[k]);
          }
          REQUIRE(got.size() == count);
          lo = std::min(lo, count);
          hi = std::max(hi, count);
          for (auto i : got) {
            REQUIRE(i < n);
            ++seen[i];
          }
        }
        CHECK(hi - lo <= 1);
        for (std::uint64_t i = 0; i < n; ++i) REQUIRE(seen[i] == 1);
      }
    }
  }
  CHECK_THROWS_AS(dpkit::distributed_sampler<>(10, 2, 0, {.drop_last = true, .exactly_once = true}), dpkit::invalid_argument);
}

TEST_CASE("distributed_sampler: resume on 2 ranks at the offset of 4 continues the same global sequence") {
  const std::uint64_t n = 1009; // prime
  for (bool exact : {false, true}) {
    const dpkit::distributed_sampler_options opt{.shuffle = true, .seed = 1, .exactly_once = exact};
    dpkit::distributed_sampler<> one(n, 1, 0, opt);
    one.set_epoch(5);
    std::vector<std::uint64_t> consumed;
    const std::uint64_t per_rank = 37; // samples each of 4 ranks read before the checkpoint
    std::uint64_t offset = 0;
    for (std::uint64_t r = 0; r < 4; ++r) {
      dpkit::distributed_sampler<> s(n, 4, r, opt);
      s.set_epoch(5);
      offset = s.offset_after(per_rank);
    }
    // the positions consumed on 4 ranks are exactly 0..offset-1
    std::vector<std::uint64_t> by_position(n, ~0ull);
    for (std::uint64_t r = 0; r < 4; ++r) {
      dpkit::distributed_sampler<> s(n, 4, r, opt);
      s.set_epoch(5);
      for (std::uint64_t k = 0; k < per_rank; ++k) by_position[r + 4 * k] = s[k];
    }
    for (std::uint64_t r = 0; r < 2; ++r) {
      dpkit::distributed_sampler<> s(n, 2, r, opt);
      s.set_epoch(5, offset);
      for (std::uint64_t k = 0; k < s.size(); ++k) {
        const std::uint64_t p = offset + r + 2 * k;
        if (p < n) by_position[p] = s[k];
      }
      if (exact) CHECK(s.num_samples() == (n - offset - r + 1) / 2);
    }
    for (std::uint64_t p = 0; p < n; ++p) REQUIRE(by_position[p] == one[p]);
  }
  dpkit::distributed_sampler<> s(10, 2, 0);
  CHECK_THROWS_AS(s.set_epoch(0, 11), dpkit::invalid_argument);
}

TEST_CASE("feistel: fill equals lookups; bijective around the domain edges") {
  for (std::uint64_t n : {2ull, 3ull, 4ull, 5ull, 63ull, 64ull, 65ull, 1023ull, 1024ull, 1025ull, 4095ull, 65535ull, 65537ull}) {
    for (std::uint64_t seed : {0ull, 7ull}) {
      dpkit::feistel f;
      f.reset(n, seed);
      std::vector<std::uint64_t> all(n);
      f.fill(0, all);
      std::vector<char> seen(n, 0);
      for (std::uint64_t k = 0; k < n; ++k) {
        REQUIRE(all[k] == f[k]);
        REQUIRE(all[k] < n);
        REQUIRE(!seen[all[k]]);
        seen[all[k]] = 1;
      }
    }
  }
  dpkit::feistel big;
  big.reset((std::uint64_t{1} << 32) + 3, 1);
  std::vector<std::uint64_t> part(1000);
  big.fill((std::uint64_t{1} << 32) - 500, part);
  for (std::uint64_t j = 0; j < part.size(); ++j) REQUIRE(part[j] == big[(std::uint64_t{1} << 32) - 500 + j]);
  // the 8-lane fill (AVX-512 CPUs) against lookups: starts not a multiple of
  // 8, lengths with a scalar tail, the seed's scale, and n near 2^64 (widest
  // halves: B = 2^32)
  for (const std::uint64_t n : {std::uint64_t{200000000}, std::uint64_t{1} << 40, ~std::uint64_t{0} - 12345, (std::uint64_t{1} << 63) + 1}) {
    for (const unsigned rounds : {4u, 3u}) {
      dpkit::feistel f(rounds);
      f.reset(n, 42);
      for (const std::uint64_t first : {std::uint64_t{0}, std::uint64_t{3}, n / 2 + 5, n - 1003}) {
        std::vector<std::uint64_t> got(1003);
        f.fill(first, got);
        for (std::uint64_t j = 0; j < got.size(); ++j) {
          REQUIRE(got[j] == f[first + j]);
          REQUIRE(got[j] < n);
        }
      }
    }
  }
  CHECK(dpkit::feistel::version == 2);
}
