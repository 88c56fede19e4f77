// Tests of dpkit/data/token_budget_sampler.hpp.
#include "sampler_test_util.hpp"

#include <dpkit/data/jsonl_index.hpp>
#include <dpkit/data/jsonl_length_column.hpp>
#include <dpkit/data/token_budget_sampler.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace {

/// Checks the sampler's invariants over all ranks of one epoch.
template <class Lengths>
void check_invariants(const Lengths& lengths, std::uint64_t world, const dpkit::token_budget_options& opt, std::uint64_t epoch) {
  const std::uint64_t n = std::size(lengths);
  std::vector<dpkit::token_budget_batch_sampler> ranks;
  for (std::uint64_t r = 0; r < world; ++r) {
    ranks.emplace_back(lengths, world, r, opt);
    ranks.back().set_epoch(epoch);
  }
  const auto& s0 = ranks[0];
  const std::uint64_t limit = s0.sample_limit();
  // equal batch counts across ranks
  for (const auto& s : ranks) REQUIRE(s.num_batches() == s0.num_batches());
  // plan: no empty batch, none over budget, every kept sample exactly once
  std::vector<int> seen(n, 0);
  std::uint64_t over = 0;
  for (std::uint64_t i = 0; i < n; ++i) over += lengths[i] > limit;
  for (std::uint64_t b = 0; b < s0.total_batches(); ++b) {
    const auto batch = s0.plan_batch(b);
    REQUIRE(!batch.empty());
    REQUIRE(batch.size() <= opt.max_batch_size);
    std::uint64_t max_len = 0;
    for (auto i : batch) {
      REQUIRE(i < n);
      ++seen[i];
      max_len = std::max(max_len, s0.budget_length(i));
    }
    REQUIRE(max_len * batch.size() <= opt.max_tokens);
  }
  for (std::uint64_t i = 0; i < n; ++i) {
    const bool kept = lengths[i] <= limit || opt.oversize == dpkit::oversize_policy::truncate;
    REQUIRE(seen[i] == (kept ? 1 : 0));
  }
  if (opt.oversize == dpkit::oversize_policy::skip) CHECK(s0.skipped() == over);
  if (opt.oversize == dpkit::oversize_policy::truncate) CHECK(s0.truncated() == over);
  CHECK(s0.kept_samples() + s0.skipped() == n);
  // schedule: every plan batch runs once (plus padding), ranks agree on the plan
  std::vector<int> runs(s0.total_batches(), 0);
  std::uint64_t pads = 0;
  for (std::uint64_t step = 0; step < s0.num_batches(); ++step)
    for (std::uint64_t r = 0; r < world; ++r) {
      const auto& s = ranks[r];
      REQUIRE(s.batch_id(step, r) == s0.batch_id(step, r));
      const auto batch = s.batch(step);
      REQUIRE(!batch.empty());
      REQUIRE(batch == s0.batch(step, r));
      if (s.is_padding(step))
        ++pads;
      else
        ++runs[s.batch_id(step, r)];
    }
  if (opt.balance == dpkit::rank_balance::pad) {
    for (auto c : runs) REQUIRE(c == 1);
    CHECK(pads == s0.num_batches() * world - s0.total_batches());
    CHECK(pads < world);
  } else {
    CHECK(pads == 0);
    CHECK(s0.num_batches() == s0.total_batches() / world);
  }
}

} // namespace

TEST_CASE("token_budget_batch_sampler: invariants on synthetic lengths") {
  const auto lengths = sampler_test::synthetic_lengths(20000, 1);
  for (std::uint64_t world : {1ull, 2ull, 3ull, 8ull}) {
    for (auto balance : {dpkit::rank_balance::pad, dpkit::rank_balance::drop}) {
      CAPTURE(world);
      dpkit::token_budget_options o;
      o.max_tokens = 4096;
      o.max_sample_tokens = 1024;
      o.sort_size = 256;
      o.balance = balance;
      check_invariants(lengths, world, o, 0);
      check_invariants(lengths, world, o, 3);
      o.oversize = dpkit::oversize_policy::truncate;
      check_invariants(lengths, world, o, 1);
      o.type = dpkit::batch_type::examples;
      o.max_tokens = 16;
      o.oversize = dpkit::oversize_policy::skip;
      check_invariants(lengths, world, o, 2);
      o = {};
      o.shuffle = false;
      o.shuffle_batches = false;
      o.max_batch_size = 7;
      check_invariants(lengths, world, o, 0);
    }
  }
}

TEST_CASE("token_budget_batch_sampler: samples over the budget never make a batch over budget or empty") {
  // lengths between max_tokens and max_sample_tokens: the seed emits an empty batch here
  const std::vector<std::uint32_t> lengths = {5000, 10, 20, 3000, 4097, 1, 4096, 0};
  dpkit::token_budget_options o;
  o.max_tokens = 4096;
  o.max_sample_tokens = 8192;
  check_invariants(lengths, 2, o, 0);
  dpkit::token_budget_batch_sampler s(lengths, 1, 0, o);
  CHECK(s.skipped() == 2);
  CHECK(s.sample_limit() == 4096);
  o.oversize = dpkit::oversize_policy::error;
  try {
    dpkit::token_budget_batch_sampler e(lengths, 1, 0, o);
    FAIL("no error");
  } catch (const dpkit::invalid_argument& e) {
    CHECK(std::string(e.what()).find("length 4097 > limit 4096") != std::string::npos);
  }
  // all samples skipped: zero batches on every rank
  const std::vector<std::uint32_t> huge = {9000, 9001};
  o.oversize = dpkit::oversize_policy::skip;
  dpkit::token_budget_batch_sampler z(huge, 4, 3, o);
  CHECK(z.num_batches() == 0);
  CHECK(z.kept_samples() == 0);
  // empty dataset
  const std::vector<std::uint32_t> none;
  CHECK(dpkit::token_budget_batch_sampler(none, 2, 1).num_batches() == 0);
  // validation
  CHECK_THROWS_AS(dpkit::token_budget_batch_sampler(lengths, 0, 0), dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::token_budget_batch_sampler(lengths, 2, 2), dpkit::invalid_argument);
  o.max_tokens = 0;
  CHECK_THROWS_AS(dpkit::token_budget_batch_sampler(lengths, 2, 0, o), dpkit::invalid_argument);
}

TEST_CASE("token_budget_batch_sampler: resume at step k equals the tail of a full run; epochs differ") {
  const auto lengths = sampler_test::synthetic_lengths(5000, 7);
  const dpkit::token_budget_options o{.max_tokens = 2048, .sort_size = 64, .seed = 11};
  for (std::uint64_t rank = 0; rank < 4; ++rank) {
    dpkit::token_budget_batch_sampler full(lengths, 4, rank, o);
    full.set_epoch(3);
    std::vector<std::vector<std::uint64_t>> run;
    for (std::uint64_t s = 0; s < full.num_batches(); ++s) run.push_back(full.batch(s));
    // a fresh sampler (e.g. after a restart) resumes at step k
    const std::uint64_t k = full.num_batches() / 3;
    dpkit::token_budget_batch_sampler resumed(lengths, 4, rank, o);
    resumed.set_epoch(3);
    for (std::uint64_t s = k; s < resumed.num_batches(); ++s) {
      REQUIRE(resumed.at(s) == run[s]);
    }
    CHECK_THROWS_AS((void)resumed.at(resumed.num_batches()), dpkit::invalid_argument);
    resumed.set_epoch(4);
    bool differs = resumed.num_batches() != run.size();
    for (std::uint64_t s = 0; !differs && s < run.size(); ++s)
      differs = resumed.batch(s) != run[s];
    CHECK(differs);
  }
}

TEST_CASE("token_budget_batch_sampler: batch_size_multiple (fairseq)") {
  const auto lengths = sampler_test::synthetic_lengths(10000, 3);
  dpkit::token_budget_options o{.max_tokens = 3000, .sort_size = 512, .batch_size_multiple = 8};
  check_invariants(lengths, 2, o, 0);
  dpkit::token_budget_batch_sampler s(lengths, 2, 0, o);
  const std::uint64_t buffers = (lengths.size() + 1023) / 1024;
  std::uint64_t not_multiple = 0;
  for (std::uint64_t b = 0; b < s.total_batches(); ++b) not_multiple += s.plan_batch(b).size() % 8 != 0 && s.plan_batch(b).size() > 8;
  CHECK(not_multiple <= buffers); // only the last batch of a buffer may be cut short
  // with no multiple, batches are bigger on average or equal
  o.batch_size_multiple = 1;
  dpkit::token_budget_batch_sampler plain(lengths, 2, 0, o);
  CHECK(plain.total_batches() <= s.total_batches());
}

TEST_CASE("token_budget_batch_sampler: greedy packing equals a direct reference (no shuffle)") {
  const auto lengths = sampler_test::synthetic_lengths(3000, 5);
  dpkit::token_budget_options o;
  o.max_tokens = 2000;
  o.max_sample_tokens = 1500;
  o.sort_size = 100;
  o.shuffle = false;
  o.shuffle_batches = false;
  o.max_batch_size = 30;
  const std::uint64_t world = 3;
  dpkit::token_budget_batch_sampler s(lengths, world, 1, o);
  // reference: the seed's loop with count = len(batch)
  std::vector<std::vector<std::uint64_t>> ref;
  for (std::uint64_t b = 0; b < lengths.size(); b += o.sort_size * world) {
    std::vector<std::uint64_t> buf;
    for (std::uint64_t i = b; i < std::min<std::uint64_t>(lengths.size(), b + o.sort_size * world); ++i) buf.push_back(i);
    std::stable_sort(buf.begin(), buf.end(), [&](auto x, auto y) { return lengths[x] < lengths[y]; });
    std::vector<std::uint64_t> batch;
    std::uint64_t max_len = 0;
    for (auto idx : buf) {
      if (lengths[idx] > o.max_sample_tokens) continue;
      const std::uint64_t l = lengths[idx];
      if (std::max(max_len, l) * (batch.size() + 1) <= o.max_tokens && batch.size() < o.max_batch_size) {
        batch.push_back(idx);
        max_len = std::max(max_len, l);
      } else {
        ref.push_back(batch);
        batch = {idx};
        max_len = l;
      }
    }
    if (!batch.empty()) ref.push_back(batch);
  }
  REQUIRE(s.total_batches() == ref.size());
  for (std::uint64_t b = 0; b < ref.size(); ++b) {
    REQUIRE(s.plan_batch(b) == ref[b]);
  }
  // round-robin like the seed: step k of rank r is plan batch k * world + r
  for (std::uint64_t step = 0; step + 1 < s.num_batches(); ++step) CHECK(s.batch_id(step, 1) == step * world + 1);
}

TEST_CASE("token_budget_batch_sampler: real corpus lengths (num_tokens column)") {
  const sampler_test::corpus_index idx("tb-debian.idx");
  const auto lengths = idx.lengths();
  REQUIRE(lengths.size() == 63956);
  dpkit::token_budget_options o;
  o.max_tokens = 4096;
  check_invariants(lengths, 4, o, 0);
  dpkit::token_budget_batch_sampler s(lengths, 4, 0, o);
  // p99 is 327 tokens: only a small tail is over 2048
  CHECK(s.skipped() > 0);
  CHECK(s.skipped() < 200);
  CHECK(s.num_batches() > 100);
  // callable lengths give the same plan
  dpkit::token_budget_batch_sampler c(lengths.size(), [&](std::uint64_t i) { return lengths[i]; }, 4, 0, o);
  REQUIRE(c.num_batches() == s.num_batches());
  for (std::uint64_t k = 0; k < s.num_batches(); ++k) REQUIRE(c.batch_id(k, 0) == s.batch_id(k, 0));
}
