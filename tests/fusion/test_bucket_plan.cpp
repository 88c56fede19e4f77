// plan_buckets / plan_buckets_from_order against hand-computed assignments
// (torch DDP compute_bucket_assignment_by_size semantics), and the model file
// parser on the real models and on malformed input.
#include "fusion_test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <sstream>

using dpkit::element_type;
using dpkit::param_info;

namespace {
constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;
param_info f32(std::size_t bytes) { return {bytes, element_type::f32, dpkit::memory_space::host}; }
param_info bf(std::size_t bytes) { return {bytes, element_type::bf16, dpkit::memory_space::host}; }
std::vector<std::vector<std::size_t>> indices(const dpkit::bucket_plan& p) {
  std::vector<std::vector<std::size_t>> v;
  for (const auto& b : p.buckets) v.push_back(b.params);
  return v;
}
} // namespace

TEST_CASE("plan_buckets: first bucket 1 MiB, cap 25 MiB, oversized parameter alone, reverse order") {
  const std::vector<param_info> ps{f32(600 * KiB), f32(300 * KiB), f32(200 * KiB), f32(40 * MiB), f32(10 * MiB),
                                   f32(10 * MiB),  f32(10 * MiB),  f32(512 * KiB), f32(700 * KiB)};
  const auto plan = dpkit::plan_buckets(ps);
  using V = std::vector<std::vector<std::size_t>>;
  CHECK(indices(plan) == V{{8, 7}, {6, 5, 4}, {3}, {2, 1, 0}});
  REQUIRE(plan.size() == 4);
  CHECK(plan.buckets[0].limit_bytes == 1 * MiB);
  CHECK(plan.buckets[0].bytes == 1212 * KiB);
  CHECK(plan.buckets[1].limit_bytes == 25 * MiB);
  CHECK(plan.buckets[1].bytes == 30 * MiB);
  CHECK(plan.buckets[2].bytes == 40 * MiB);
  CHECK(plan.buckets[3].bytes == 1100 * KiB);
  CHECK(plan.buckets[3].limit_bytes == 25 * MiB);
  CHECK(plan.total_bytes() == 70 * MiB + 2312 * KiB);
}

TEST_CASE("plan_buckets: a bucket closes when it reaches the limit exactly (>=, as torch)") {
  const std::vector<param_info> ps{f32(4), f32(512 * KiB), f32(512 * KiB)};
  using V = std::vector<std::vector<std::size_t>>;
  CHECK(indices(dpkit::plan_buckets(ps)) == V{{2, 1}, {0}});
  const std::vector<param_info> qs{f32(4), f32(512 * KiB), f32(512 * KiB - 4)};
  CHECK(indices(dpkit::plan_buckets(qs)) == V{{2, 1, 0}});
}

TEST_CASE("plan_buckets: one element type per bucket, each type walks its own limits") {
  const std::vector<param_info> ps{f32(800 * KiB), bf(600 * KiB), f32(300 * KiB), bf(500 * KiB), f32(100 * KiB)};
  const auto plan = dpkit::plan_buckets(ps);
  using V = std::vector<std::vector<std::size_t>>;
  CHECK(indices(plan) == V{{3, 1}, {4, 2, 0}});
  CHECK(plan.buckets[0].type == element_type::bf16);
  CHECK(plan.buckets[1].type == element_type::f32);
  CHECK(plan.buckets[0].limit_bytes == 1 * MiB);
  CHECK(plan.buckets[1].limit_bytes == 1 * MiB);
  // Memory space splits buckets too.
  std::vector<param_info> qs{f32(4), f32(4), f32(4)};
  qs[1].space = dpkit::memory_space::device;
  CHECK(indices(dpkit::plan_buckets(qs)) == V{{1}, {2, 0}});
}

TEST_CASE("plan_buckets: custom policy, empty input, zero-byte parameters") {
  const dpkit::bucket_policy pol{100, 250};
  const std::vector<param_info> ps{f32(40), f32(40), f32(40), f32(40), f32(40), f32(40), f32(40), f32(40)};
  using V = std::vector<std::vector<std::size_t>>;
  CHECK(indices(dpkit::plan_buckets(ps, pol)) == V{{7, 6, 5}, {4, 3, 2, 1, 0}});
  CHECK(dpkit::plan_buckets(std::vector<param_info>{}).empty());
  CHECK(indices(dpkit::plan_buckets(std::vector<param_info>{f32(0), f32(0)})) == V{{1, 0}});
}

TEST_CASE("plan_buckets_from_order: rebuild follows the observed ready order") {
  const dpkit::bucket_policy pol{100, 250};
  const std::vector<param_info> ps{f32(40), f32(80), f32(40), f32(400), f32(40), f32(40)};
  const std::vector<std::size_t> order{0, 2, 4, 1, 3, 5};
  const auto plan = dpkit::plan_buckets_from_order(ps, order, pol);
  using V = std::vector<std::vector<std::size_t>>;
  CHECK(indices(plan) == V{{0, 2, 4}, {1, 3}, {5}});
  CHECK(plan != dpkit::plan_buckets(ps, pol));
  // The reverse registration order reproduces plan_buckets.
  const std::vector<std::size_t> rev{5, 4, 3, 2, 1, 0};
  CHECK(dpkit::plan_buckets_from_order(ps, rev, pol) == dpkit::plan_buckets(ps, pol));
  CHECK(dpkit::plan_buckets_from_order(ps, rev, pol).fingerprint() == dpkit::plan_buckets(ps, pol).fingerprint());
  CHECK(plan.fingerprint() != dpkit::plan_buckets(ps, pol).fingerprint());
}

TEST_CASE("plan_buckets_from_order: leftover buckets are ordered by when they complete") {
  const dpkit::bucket_policy pol{1000, 1000};
  // bf16 bucket completes at position 1, f32 leftover at position 2.
  const std::vector<param_info> ps{f32(4), bf(2), f32(4)};
  const std::vector<std::size_t> order{0, 1, 2};
  using V = std::vector<std::vector<std::size_t>>;
  CHECK(indices(dpkit::plan_buckets_from_order(ps, order, pol)) == V{{1}, {0, 2}});
}

TEST_CASE("plan_buckets: errors name the parameter") {
  const std::vector<param_info> ps{f32(8), f32(6)};
  CHECK_THROWS_WITH_AS(dpkit::plan_buckets(ps), doctest::Contains("parameter 1 has 6 bytes"), dpkit::invalid_argument);
  const std::vector<param_info> qs{f32(8), f32(8), f32(8)};
  const std::vector<std::size_t> dup{0, 1, 1}, oob{0, 1, 3}, shortv{0, 1};
  CHECK_THROWS_WITH_AS(dpkit::plan_buckets_from_order(qs, dup, {}), doctest::Contains("parameter 1 twice"),
                       dpkit::invalid_argument);
  CHECK_THROWS_WITH_AS(dpkit::plan_buckets_from_order(qs, oob, {}), doctest::Contains("parameter 3"),
                       dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::plan_buckets_from_order(qs, shortv, {}), dpkit::invalid_argument);
}

TEST_CASE("bucket_plan and bucket_policy compare and print") {
  const std::vector<param_info> ps{f32(40), f32(40), f32(40), bf(10)};
  const auto a = dpkit::plan_buckets(ps, {100, 250});
  auto b = a;
  CHECK(a == b);
  b.buckets[0].limit_bytes = 7;
  CHECK(a != b);
  std::ostringstream os;
  os << a;
  CHECK(os.str() == "bucket_plan{2 buckets, 130 bytes\n  [0] bfloat16 host 10 bytes (limit 100) params {3}\n"
                    "  [1] float host 120 bytes (limit 100) params {2..0}\n}");
  std::ostringstream pp;
  pp << dpkit::bucket_policy{};
  CHECK(pp.str() == "bucket_policy{first_bucket_bytes=1048576, bucket_cap_bytes=26214400}");
  CHECK(dpkit::bucket_policy{} == dpkit::bucket_policy{1 << 20, 25 << 20});
}

TEST_CASE("plan_buckets on the real models: invariants of torch's assignment") {
  for (const std::string name : {"gpt2-124m", "bert-base-uncased", "llama-2-7b"}) {
    CAPTURE(name);
    const auto spec = dpkit::load_model_spec(fusion_test::model_path(name));
    const auto ps = spec.param_infos();
    const auto plan = dpkit::plan_buckets(ps);
    std::multiset<std::size_t> seen;
    std::size_t prev_max = ps.size();
    for (std::size_t k = 0; k < plan.size(); ++k) {
      const auto& b = plan.buckets[k];
      CHECK(!b.params.empty());
      CHECK(b.limit_bytes == (k == 0 ? MiB : 25 * MiB));
      std::size_t sum = 0;
      for (auto i : b.params) {
        seen.insert(i);
        CHECK(ps[i].type == b.type);
        sum += ps[i].bytes;
      }
      CHECK(sum == b.bytes);
      // Under the limit before its last parameter; at or over it after (except the last bucket).
      CHECK(b.bytes - ps[b.params.back()].bytes < b.limit_bytes);
      if (k + 1 < plan.size()) CHECK(b.bytes >= b.limit_bytes);
      // Reverse registration order: indices strictly decrease within and across buckets.
      CHECK(std::is_sorted(b.params.rbegin(), b.params.rend()));
      CHECK(b.params.front() < prev_max);
      prev_max = b.params.back();
    }
    CHECK(seen.size() == ps.size());
    CHECK(std::set<std::size_t>(seen.begin(), seen.end()).size() == ps.size());
    MESSAGE(name << ": " << plan.size() << " buckets");
  }
}

TEST_CASE("model_spec: the real model files parse to their published sizes") {
  const auto g = dpkit::load_model_spec(fusion_test::model_path("gpt2-124m"));
  CHECK(g.params.size() == 148);
  CHECK(g.total_numel() == 124439808u);
  CHECK(g.total_bytes() == 4u * 124439808u);
  CHECK(g.params[0].name == "wte.weight");
  CHECK(g.params[0].shape == std::vector<std::size_t>{50257, 768});
  const auto b = dpkit::load_model_spec(fusion_test::model_path("bert-base-uncased"));
  CHECK(b.params.size() == 199);
  CHECK(b.total_numel() == 109482240u);
  const auto l = dpkit::load_model_spec(fusion_test::model_path("llama-2-7b"));
  CHECK(l.params.size() == 291);
  CHECK(l.total_numel() == 6738415616u);
  CHECK(l.params[0].type == element_type::bf16);
  CHECK(l.total_bytes() == 2u * 6738415616u);
}

TEST_CASE("model_spec: parser accepts comments, CRLF, scalars, torch names") {
  const auto s = dpkit::parse_model_spec("# header\n\na\t2x3\tfloat32\r\nb\t\ttorch.bfloat16\nc\t()\thalf\nd\t0x5\tint64",
                                         "m.tsv");
  REQUIRE(s.params.size() == 4);
  CHECK(s.params[0].numel == 6);
  CHECK(s.params[0].bytes == 24);
  CHECK(s.params[1].numel == 1);
  CHECK(s.params[1].type == element_type::bf16);
  CHECK(s.params[2].type == element_type::f16);
  CHECK(s.params[3].numel == 0);
  CHECK(s.params[3].bytes == 0);
  CHECK(s.names() == std::vector<std::string>{"a", "b", "c", "d"});
}

TEST_CASE("model_spec: malformed lines are format_errors naming file and line") {
  CHECK_THROWS_WITH_AS(dpkit::parse_model_spec("# h\na\t3\tfloat32\nb\t3\tcomplex64\n", "m.tsv"),
                       doctest::Contains("m.tsv:3: unknown dtype 'complex64'"), dpkit::format_error);
  CHECK_THROWS_WITH_AS(dpkit::parse_model_spec("a\t3x\tfloat32\n", "m.tsv"), doctest::Contains("m.tsv:1: malformed shape"),
                       dpkit::format_error);
  CHECK_THROWS_WITH_AS(dpkit::parse_model_spec("a\t3xq\tfloat32\n", "m.tsv"), doctest::Contains("m.tsv:1:"),
                       dpkit::format_error);
  CHECK_THROWS_WITH_AS(dpkit::parse_model_spec("\n\na 3 float32\n", "m.tsv"), doctest::Contains("m.tsv:3: expected 3"),
                       dpkit::format_error);
  CHECK_THROWS_WITH_AS(dpkit::parse_model_spec("a\t3\tfloat32\tx\n", "m.tsv"), doctest::Contains("m.tsv:1:"),
                       dpkit::format_error);
  CHECK_THROWS_WITH_AS(dpkit::parse_model_spec("\t3\tfloat32\n", "m.tsv"), doctest::Contains("m.tsv:1: empty"),
                       dpkit::format_error);
  CHECK_THROWS_WITH_AS(dpkit::parse_model_spec("a\t99999999999x99999999999x99999999999\tfloat32\n", "m.tsv"),
                       doctest::Contains("overflows"), dpkit::format_error);
  CHECK_THROWS_WITH_AS(dpkit::load_model_spec("/nonexistent/model.tsv"), doctest::Contains("/nonexistent/model.tsv"),
                       dpkit::format_error);
}
