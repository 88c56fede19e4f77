// The tuning table (collectives/tuning.hpp) and the cost model
// (cost_model.hpp): the file format parsed against hand-written tables,
// every malformed field refused with its line number, str() and parse()
// round trips, save() atomic and refusing to replace a file that is not a
// tuning file, the first matching available rule winning over later ones
// and over the built-in rules, explain naming the rule and its line; the
// model's formulas against hand computations.
#include <dpkit/dpkit.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

using dpkit::algorithm;

namespace {
std::string read(const std::string& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
} // namespace

TEST_CASE("tuning file: rules, ranges, sizes, links and comments parse as written") {
  const auto t = dpkit::tuning_table::parse(
      "# made by hand\n"
      "dpkit-tuning 1\n"
      "\n"
      "allreduce 4 2 2 0 64K hier   # us: hier 41.2 ring 88.0\n"
      "allreduce 4- * 3-8 64K 1M ring\n"
      "allreduce * 1 * 1M inf shm\n"
      "allreduce 2-3 1 2 0 8 shm1\n"
      "link inter 21.5 0.5\n"
      "fragment inter 60K\n",
      "t.txt");
  REQUIRE(t.rules.size() == 4);
  const auto& r = t.rules[0];
  CHECK(r.ranks_min == 4);
  CHECK(r.ranks_max == 4);
  CHECK(r.nodes_min == 2);
  CHECK(r.local_max == 2);
  CHECK(r.min_bytes == 0);
  CHECK(r.max_bytes == 65536);
  CHECK(r.algo == algorithm::hierarchical);
  CHECK(r.line == 4);
  CHECK(r.comment == "us: hier 41.2 ring 88.0");
  CHECK(t.rules[1].ranks_max == INT_MAX);
  CHECK(t.rules[1].local_min == 3);
  CHECK(t.rules[1].local_max == 8);
  CHECK(t.rules[1].max_bytes == (1u << 20));
  CHECK(t.rules[2].max_bytes == std::numeric_limits<std::size_t>::max());
  CHECK(t.rules[2].shm_by_size);
  CHECK(t.rules[3].algo == algorithm::shm_one_shot);
  CHECK(t.inter.valid);
  CHECK(t.inter.alpha_us == 21.5);
  CHECK_FALSE(t.intra.valid);
  CHECK(t.inter_fragment_bytes == std::optional<std::size_t>(61440));
  CHECK_FALSE(dpkit::tuning_table::builtin().inter_fragment_bytes.has_value());
  CHECK(t.header == std::vector<std::string>{"made by hand"});
  // str() and parse() round trip
  CHECK(dpkit::tuning_table::parse(t.str(), "again") == t);
  CHECK(dpkit::tuning_table::parse(dpkit::tuning_table::builtin().str(), "b") == dpkit::tuning_table::builtin());
}

TEST_CASE("tuning file: every malformed line is a format_error naming the file and line") {
  struct bad {
    const char* text;
    const char* says;
  };
  for (const auto& b : {bad{"", "empty"}, bad{"allreduce * * * 0 inf ring\n", "version line"},
                        bad{"dpkit-tuning 2\n", "version 2"},
                        bad{"dpkit-tuning 1\nbroadcast * * * 0 inf tree\n", ":2: unknown collective 'broadcast'"},
                        bad{"dpkit-tuning 1\nallreduce * * * 0 inf\n", ":2: expected"},
                        bad{"dpkit-tuning 1\nallreduce * * * 0 inf warp\n", "unknown algorithm 'warp'"},
                        bad{"dpkit-tuning 1\nallreduce * * * 0 inf automatic\n", "not automatic"},
                        bad{"dpkit-tuning 1\nallreduce 0 * * 0 inf ring\n", "ranks '0'"},
                        bad{"dpkit-tuning 1\nallreduce 4-2 * * 0 inf ring\n", "is empty"},
                        bad{"dpkit-tuning 1\nallreduce x * * 0 inf ring\n", "ranks 'x' is not a number"},
                        bad{"dpkit-tuning 1\n\nallreduce * * * 64X inf ring\n", ":3: from_bytes '64X'"},
                        bad{"dpkit-tuning 1\nallreduce * * * 1M 1K ring\n", "is not below"},
                        bad{"dpkit-tuning 1\nallreduce * * * 99999999999999999G inf ring\n", "overflows"},
                        bad{"dpkit-tuning 1\nlink intra -1 0.5\n", "alpha '-1'"},
                        bad{"dpkit-tuning 1\nlink wan 1 0.5\n", "link intra|inter"},
                        bad{"dpkit-tuning 1\nfragment intra 4096\n", "expected 'fragment inter BYTES'"},
                        bad{"dpkit-tuning 1\nfragment inter\n", "expected 'fragment inter BYTES'"},
                        bad{"dpkit-tuning 1\nfragment inter 2G\n", "fragment '2G' is out of range"},
                        bad{"dpkit-tuning 1\nfragment inter inf\n", "is out of range"},
                        bad{"dpkit-tuning 1\nfragment inter 100\n", "fragment '100' is out of range"},
                        bad{"dpkit-tuning 1\nfragment inter -5\n", "fragment '-5'"}}) {
    CAPTURE(b.text);
    try {
      (void)dpkit::tuning_table::parse(b.text, "f.txt");
      FAIL("accepted");
    } catch (const dpkit::format_error& e) {
      CHECK(std::string(e.what()).find("f.txt") != std::string::npos);
      CHECK(std::string(e.what()).find(b.says) != std::string::npos);
    }
  }
  CHECK_THROWS_AS((void)dpkit::tuning_table::load("/nonexistent/dpkit.tuning"), dpkit::error);
}

TEST_CASE("tuning: the first matching rule the transport can run wins; else the built-in rules") {
  const auto t = dpkit::tuning_table::parse("dpkit-tuning 1\n"
                                            "allreduce 4 2 2 0 1K native\n"
                                            "allreduce 4 2 2 0 64K ring\n"
                                            "allreduce 4 2 2 64K inf hier\n"
                                            "allreduce 3 1 3 0 inf shm\n",
                                            "t");
  const dpkit::tuning_key k{4, 2, 2};
  const dpkit::tuning_availability all{true, true, true}, no_native{false, true, false};
  CHECK(dpkit::choose_tuned(k, 8, all, &t).algo == algorithm::native);
  CHECK(dpkit::choose_tuned(k, 8, no_native, &t).algo == algorithm::ring); // native passed over
  CHECK(dpkit::choose_tuned(k, 65535, all, &t).algo == algorithm::ring);
  CHECK(dpkit::choose_tuned(k, 65536, all, &t).algo == algorithm::hierarchical);
  CHECK(dpkit::choose_tuned(k, 65536, all, &t).rule->line == 4);
  // hier not available (e.g. one rank per node): nothing in t matches, built-in decides
  const auto c = dpkit::choose_tuned(k, 1 << 20, {true, false, true}, &t);
  CHECK(c.algo == algorithm::ring);
  CHECK(c.origin == "built-in");
  // a key the file does not have: built-in (one node of 2: shm one-shot)
  CHECK(dpkit::choose_tuned({2, 1, 2}, 8, all, &t).algo == algorithm::shm_one_shot);
  // "shm" resolves by size with the built-in threshold (3 ranks: 64 KiB)
  CHECK(dpkit::choose_tuned({3, 1, 3}, 100, all, &t).algo == algorithm::shm_one_shot);
  CHECK(dpkit::choose_tuned({3, 1, 3}, 1 << 20, all, &t).algo == algorithm::shm_two_shot);
  // the policy masks what it may not use
  dpkit::allreduce_policy p;
  p.tuning = &t;
  CHECK(p.choose(8, k, all) == algorithm::native);
  p.use_native = false;
  CHECK(p.choose(8, k, all) == algorithm::ring);
  // explain names the rule, its file and line, and its comment
  const auto t2 = dpkit::tuning_table::parse("dpkit-tuning 1\nallreduce 4 2 2 0 inf hier  # us: hier 41 ring 88\n", "c.txt");
  const std::string e = dpkit::explain_tuned(k, 65536, no_native, &t2);
  CHECK(e.find(": hier, by rule 'allreduce 4 2 2 0 inf hier' (c.txt:2; us: hier 41 ring 88)") != std::string::npos);
  CHECK(e.find("65536 bytes on 4 ranks (2 nodes, up to 2 per node") != std::string::npos);
}

TEST_CASE("tuning: save writes atomically and never replaces a file that is not a tuning file") {
  const auto dir = std::filesystem::temp_directory_path() / ("dpkit_tuning_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "t.txt").string();
  auto t = dpkit::tuning_table::parse("dpkit-tuning 1\nallreduce 4 2 2 0 inf hier\n", "x");
  t.inter = {20.0, 0.5, true};
  t.save(path);
  CHECK(dpkit::tuning_table::load(path) == t);
  t.rules[0].algo = algorithm::ring;
  t.save(path); // replacing a tuning file is fine
  CHECK(dpkit::tuning_table::load(path).rules[0].algo == algorithm::ring);
  const std::string other = (dir / "notes.txt").string();
  { std::ofstream(other) << "my notes\n"; }
  CHECK_THROWS_WITH_AS(t.save(other), doctest::Contains("not a dpkit tuning file"), dpkit::error);
  CHECK(read(other) == "my notes\n");
  CHECK_THROWS_AS(t.save((dir / "no" / "such" / "dir.txt").string()), dpkit::error);
  // no temporary left behind
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  CHECK(files == 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE("cost model: ring, tree, shm, hier against hand-computed alpha-beta sums") {
  dpkit::cost_model m;
  m.intra = {1.0, 0.1, true};   // 1 us, 10 GB/s
  m.inter = {20.0, 4.0, true};  // 20 us, 250 MB/s
  m.reduce_ns_per_byte = 0.0;
  m.hier_chunk_bytes = 4u << 20;
  const std::size_t S = 4u << 20; // one chunk
  // ring over 2 nodes x 2: 6 steps of S/4 over the inter-node link
  CHECK(*m.allreduce_us(algorithm::ring, S, 2, 2) == doctest::Approx(6 * (20.0 + S / 4.0 * 4e-3)));
  // tree over 4 ranks: 2 x 2 latencies, 2 S through the link
  CHECK(*m.allreduce_us(algorithm::tree, S, 2, 2) == doctest::Approx(4 * 20.0 + 2 * S * 4e-3));
  // tree over 3 nodes x 2: node 0 (ranks 0, 1) has three edges leaving it (0-2, 1-3, 1-4): 3 S through its link
  CHECK(*m.allreduce_us(algorithm::tree, S, 3, 2) == doctest::Approx(2 * 3 * 20.0 + 3 * S * 4e-3));
  // tree over 2 nodes x 1: one edge, S each way
  CHECK(*m.allreduce_us(algorithm::tree, S, 2, 1) == doctest::Approx(2 * 20.0 + 1 * S * 4e-3));
  // the edges of allreduce_tree's heap (children 2v+1, 2v+2) crossing the busiest node, counted by hand
  CHECK(dpkit::cost_model::tree_crossing_edges(1, 1) == 0);
  CHECK(dpkit::cost_model::tree_crossing_edges(8, 8) == 0);  // one node
  CHECK(dpkit::cost_model::tree_crossing_edges(2, 1) == 1);
  CHECK(dpkit::cost_model::tree_crossing_edges(4, 1) == 2);  // rank 1: parent 0, child 3
  CHECK(dpkit::cost_model::tree_crossing_edges(5, 1) == 3);  // rank 1: parent 0, children 3 and 4
  CHECK(dpkit::cost_model::tree_crossing_edges(4, 2) == 2);  // {0,1}: 0-2, 1-3
  CHECK(dpkit::cost_model::tree_crossing_edges(6, 2) == 3);  // {0,1}: 0-2, 1-3, 1-4; {2,3}: 0-2, 1-3, 2-5
  CHECK(dpkit::cost_model::tree_crossing_edges(6, 3) == 3);  // {0,1,2}: 1-3, 1-4, 2-5
  CHECK(dpkit::cost_model::tree_crossing_edges(5, 2) == 3);  // {0,1}: 0-2, 1-3, 1-4
  // hier: shm2 halves inside (2 intra latencies, 2 x S/2 copied), ring between 2 nodes moves S through the link
  const double local = 2 * 1.0 + 2 * 0.5 * S * 0.1e-3;
  const double cross_ring = 2 * 20.0 + 1.0 * S * 4e-3;
  const double cross_tree = 2 * 20.0 + 1.0 * S * 4e-3; // one edge between the two nodes
  CHECK(*m.allreduce_us(algorithm::hierarchical, S, 2, 2) == doctest::Approx(local + std::min(cross_ring, cross_tree)));
  // two chunks cost twice one
  CHECK(*m.allreduce_us(algorithm::hierarchical, 2 * S, 2, 2) == doctest::Approx(2 * (local + cross_ring)));
  // small path (<= 2 KiB): one shm step reading L-1 peers, then log2(N)
  // swaps each carrying the L local ranks' copies: 2 x 2 and 4 x 2 at 1 KiB
  CHECK(*m.allreduce_us(algorithm::hierarchical, 1024, 2, 2) ==
        doctest::Approx(1.0 + 1024 * 0.1e-3 + 1 * (20.0 + 2 * 1024 * 4e-3)));
  CHECK(*m.allreduce_us(algorithm::hierarchical, 1024, 4, 2) ==
        doctest::Approx(1.0 + 1024 * 0.1e-3 + 2 * (20.0 + 2 * 1024 * 4e-3)));
  // one node: shm applies, hier does not; across nodes the reverse
  CHECK(m.allreduce_us(algorithm::shm_one_shot, 1024, 1, 4).has_value());
  CHECK_FALSE(m.allreduce_us(algorithm::hierarchical, 1024, 1, 4).has_value());
  CHECK_FALSE(m.allreduce_us(algorithm::shm_two_shot, 1024, 2, 2).has_value());
  CHECK_FALSE(m.allreduce_us(algorithm::native, 1024, 2, 2).has_value());
  // hierarchical beats the flat ring at large sizes on a slow network where
  // it moves less through each node's link: 2x2, S against the ring's 1.5 S
  const std::size_t big = 64u << 20;
  CHECK(*m.allreduce_us(algorithm::hierarchical, big, 2, 2) * 1.3 < *m.allreduce_us(algorithm::ring, big, 2, 2));
  // at 64 x 8 both move about 2 S through each node's link: the hierarchy
  // wins on latency (126 steps between nodes against 1022) at small sizes,
  // and is level with the ring (within 10%) at large ones
  CHECK(*m.allreduce_us(algorithm::hierarchical, 8192, 64, 8) * 10 < *m.allreduce_us(algorithm::ring, 8192, 64, 8));
  CHECK(*m.allreduce_us(algorithm::hierarchical, big, 64, 8) ==
        doctest::Approx(*m.allreduce_us(algorithm::ring, big, 64, 8)).epsilon(0.10));
  // the flat tree over 64 nodes of 8 (block placement) sends many tree
  // edges through one node's link: far slower than the ring at large sizes
  CHECK(dpkit::cost_model::tree_crossing_edges(512, 8) > 8);
  CHECK(*m.allreduce_us(algorithm::tree, big, 64, 8) > 4 * *m.allreduce_us(algorithm::ring, big, 64, 8));
}
