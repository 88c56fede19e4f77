// Tests of the benchmark harness's pure parts (suite 'bench'): the -I
// statistics, nccl-tests' row format, -R's set counts and pool sizes, the size
// sweep, the algorithm table and the JSON layout, each against values worked
// out by hand in the comments.
#include "bench.hpp"
#include "bench_floor.hpp"

#include <doctest/doctest.h>

#if __has_include(<simdjson.h>)
#include <simdjson.h>
#define BENCH_TEST_SIMDJSON 1
#endif

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace db = dpkit_bench;

namespace {

/// What f(FILE*) prints.
template <class F>
std::string printed(F&& f) {
  std::FILE* t = std::tmpfile();
  REQUIRE(t != nullptr);
  f(t);
  std::fflush(t);
  std::rewind(t);
  std::string s;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, t)) > 0) s.append(buf, n);
  std::fclose(t);
  return s;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

db::half_result half(double t, double alg, double bus, std::int64_t wrong) {
  db::half_result h;
  h.time_us = t;
  h.algbw = alg;
  h.busbw = bus;
  h.wrong = wrong;
  return h;
}

/// An all-reduce row of 8 bytes (2 floats, sum, root -1).
db::row_result row8(std::string algorithm, db::half_result oop, db::half_result ip) {
  db::row_result r;
  r.algorithm = std::move(algorithm);
  r.bytes = 8;
  r.count = 2;
  r.type = "float";
  r.redop = "sum";
  r.root = -1;
  r.oop = oop;
  r.ip = ip;
  return r;
}

/// What allreduce_perf's parser makes of `args`; `code` gets the exit code when it stops.
std::optional<db::options> try_parse(std::vector<std::string> args, int& code) {
  args.insert(args.begin(), "allreduce_perf");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return db::parse_options(static_cast<int>(argv.size()), argv.data(), db::collective::allreduce, code);
}

/// The options allreduce_perf parses from `args` (which must be valid).
db::options parse(std::vector<std::string> args) {
  int code = -1;
  const auto o = try_parse(std::move(args), code);
  REQUIRE(o.has_value());
  return *o;
}

} // namespace

TEST_SUITE("bench") {

TEST_CASE("summarize_iterations: min, max, nearest-rank p99, population cv, -K skip") {
  // {10 | 1 2 3 4}, skip 1: min 1, max 4; p99 = ceil(0.99 x 4) = 4th smallest = 4;
  // mean 2.5, variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25, sd 1.1180340, cv 44.72136 %.
  const std::vector<double> v{10, 3, 1, 4, 2};
  const auto s = db::summarize_iterations(v, 1);
  CHECK(s.samples == 4);
  CHECK(s.min == 1.0);
  CHECK(s.max == 4.0);
  CHECK(s.p99 == 4.0);
  CHECK(s.cv == doctest::Approx(44.72136).epsilon(1e-6));
  // Without the skip the 10 counts: max 10.
  CHECK(db::summarize_iterations(v, 0).max == 10.0);

  // 1..100: p99 = ceil(99.0) = 99th smallest = 99 (not the maximum).
  std::vector<double> h;
  for (int i = 100; i >= 1; --i) h.push_back(i);
  const auto s100 = db::summarize_iterations(h, 0);
  CHECK(s100.p99 == 99.0);
  CHECK(s100.min == 1.0);
  CHECK(s100.max == 100.0);
  // mean 50.5, population variance (100^2 - 1) / 12 = 833.25, sd 28.866070, cv 57.160535 %.
  CHECK(s100.cv == doctest::Approx(57.160535).epsilon(1e-6));

  // One sample: p99 is that sample, cv 0; all skipped: zeros; mean 0: cv 0.
  const std::vector<double> one{7.5};
  CHECK(db::summarize_iterations(one, 0).p99 == 7.5);
  CHECK(db::summarize_iterations(one, 0).cv == 0.0);
  const auto none = db::summarize_iterations(v, 5);
  CHECK(none.samples == 0);
  CHECK(none.max == 0.0);
  const std::vector<double> zeros{0, 0, 0};
  CHECK(db::summarize_iterations(zeros, 0).cv == 0.0);
}

TEST_CASE("format_time: nccl-tests' 2 / 1 / 0 decimals at 100 us and 10 ms") {
  CHECK(db::format_time(1.234) == "   1.23");
  CHECK(db::format_time(99.994) == "  99.99");
  CHECK(db::format_time(123.26) == "  123.3");
  CHECK(db::format_time(9999.94) == " 9999.9");
  CHECK(db::format_time(12345.6) == "  12346");
}

TEST_CASE("row format: preamble and halves as nccl-tests prints them") {
  const db::row_result r = row8("ring", half(6.21, 0.00129, 0.00129, 0), half(6.02, 0.00133, 0.00133, -1)); // -c 0: N/A
  const auto s = printed([&](std::FILE* f) {
    db::print_row_preamble(f, r);
    db::print_half(f, r.oop);
    db::print_half(f, r.ip);
  });
  // "%12li  %12li  %8s  %6s  %6s" then "  %7s  %6.2f  %6.2f  %5g" / "%5s" N/A.
  CHECK(s == "           8             2     float     sum      -1     6.21    0.00    0.00      0"
             "     6.02    0.00    0.00    N/A");

  db::half_result st = half(1.5, 2.0, 2.0, 3);
  st.has_stats = true;
  st.stats.min = 1.25;
  st.stats.max = 250.0;
  st.stats.p99 = 12000.4;
  st.stats.cv = 12.5;
  const auto h = printed([&](std::FILE* f) { db::print_half(f, st); });
  CHECK(h == "     1.50    2.00    2.00      3     1.25    250.0    12000   12.50");
}

TEST_CASE("table header: the plain one is nccl-tests' verbatim; -I's columns line up with the rows") {
  const auto plain = lines_of(printed([](std::FILE* f) { db::print_table_header(f, false); }));
  REQUIRE(plain.size() == 3);
  CHECK(plain[0] == "#                                                              out-of-place                       "
                    "in-place          ");
  CHECK(plain[1] == "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
                    "algbw   busbw #wrong");
  // 52 columns of preamble + 2 x 32 per half.
  for (const auto& l : plain) CHECK(l.size() == 116);

  const auto wide = lines_of(printed([](std::FILE* f) { db::print_table_header(f, true); }));
  REQUIRE(wide.size() == 3);
  db::row_result r;
  r.type = "float";
  r.redop = "sum";
  r.oop.has_stats = r.ip.has_stats = true;
  const auto row = printed([&](std::FILE* f) {
    db::print_row_preamble(f, r);
    db::print_half(f, r.oop);
    db::print_half(f, r.ip);
  });
  // 52 + 2 x (32 + 35) = 186, header and row alike; "i_cv%" ends where the cv value ends.
  CHECK(row.size() == 186);
  for (const auto& l : wide) CHECK(l.size() == 186);
  CHECK(wide[1].find("i_cv%") + 5 == 52 + 67);
  CHECK(wide[0].find("out-of-place") == 52 + 27);
}

TEST_CASE("-R: set stride, set counts and pool sizes") {
  CHECK(db::set_stride(0) == 64);
  CHECK(db::set_stride(8) == 64);
  CHECK(db::set_stride(100) == 128);
  CHECK(db::set_stride(4095) == 4096);
  CHECK(db::set_stride(4097) == 8192);
  const std::size_t llc = 32u << 20;
  CHECK(db::rotation_sets(8, 0, false, llc) == 1);
  CHECK(db::rotation_sets(8, 1, false, llc) == 1);
  CHECK(db::rotation_sets(8, 4, false, llc) == 4);
  CHECK(db::rotation_sets(8, 0, true, llc) == (64u << 20) / 64);      // 1048576 lines
  CHECK(db::rotation_sets(5000, 0, true, llc) == (64u << 20) / 8192); // stride 8192: 8192 sets
  CHECK(db::rotation_sets(1u << 20, 0, true, llc) == 64);
  CHECK(db::rotation_sets(256u << 20, 0, true, llc) == 1); // one buffer already spans 8 x the cache
  CHECK(db::pool_bytes(256u << 20, 0, false, llc) == (256u << 20));
  CHECK(db::pool_bytes(1u << 20, 4, false, llc) == (4u << 20));
  CHECK(db::pool_bytes(1u << 20, 0, true, llc) == (65u << 20)); // 2 x 32 MiB + one 1 MiB stride
  // Every size of a sweep fits the pool, for fixed and automatic rotation.
  for (std::size_t e : {std::size_t{8}, std::size_t{100000}, std::size_t{1} << 20, std::size_t{96} << 20}) {
    for (int fixed : {0, 3}) {
      const bool aut = fixed == 0;
      const std::size_t pool = db::pool_bytes(e, static_cast<std::size_t>(fixed), aut, llc);
      for (std::size_t s = 1; s <= e; s = s * 3 + 1)
        CHECK(db::rotation_sets(s, static_cast<std::size_t>(fixed), aut, llc) * db::set_stride(s) <= pool);
      CHECK(db::rotation_sets(e, static_cast<std::size_t>(fixed), aut, llc) * db::set_stride(e) <= pool);
      if (aut)
        CHECK(db::rotation_sets(e, 0, true, llc) * db::set_stride(e) >= 2 * llc); // the sets exceed the cache
    }
  }
}

TEST_CASE("sizes_of: nccl-tests' -b/-e/-f/-i sweep") {
  CHECK(db::sizes_of(parse({"-b", "8", "-e", "64", "-f", "2"})) == std::vector<std::size_t>{8, 16, 32, 64});
  CHECK(db::sizes_of(parse({"-b", "8", "-e", "100", "-f", "4"})) == std::vector<std::size_t>{8, 32});
  CHECK(db::sizes_of(parse({"-b", "0", "-e", "4", "-f", "2"})) == std::vector<std::size_t>{0, 1, 2, 4});
  CHECK(db::sizes_of(parse({"-b", "10", "-e", "25", "-i", "10"})) == std::vector<std::size_t>{10, 20});
  CHECK(db::sizes_of(parse({"-b", "1K", "-e", "1K", "-i", "0"})) == std::vector<std::size_t>{1024});
}

TEST_CASE("parse_options: -R, -I, -K and what they refuse") {
  const auto a = parse({"-R", "auto", "-I", "1", "-K", "3"});
  CHECK(a.rotate_auto);
  CHECK(a.iter_stats == 1);
  CHECK(a.iter_skip == 3);
  const auto n = parse({"-R", "4"});
  CHECK_FALSE(n.rotate_auto);
  CHECK(n.rotate == 4);
  CHECK(parse({}).rotate == 0);
  auto refused = [](std::vector<std::string> args) {
    int code = 0;
    return !try_parse(std::move(args), code).has_value() && code == 1;
  };
  CHECK(refused({"-R", "x"}));
  CHECK(refused({"-R", "-2"}));
  CHECK(refused({"-I", "2"}));
  CHECK(refused({"-I", "1", "-K", "20"})); // skips all 20 iterations
  CHECK(refused({"-g", "2"}));
  CHECK(refused({"--memory", "device"}));
}

TEST_CASE("collective facts and the algorithm table") {
  CHECK(db::busbw_factor(db::collective::allreduce, 4) == 1.5);
  CHECK(db::busbw_factor(db::collective::allgather, 4) == 0.75);
  CHECK(db::busbw_factor(db::collective::reduce_scatter, 2) == 0.5);
  CHECK(db::busbw_factor(db::collective::broadcast, 8) == 1.0);
  const auto ag = db::counts_for(db::collective::allgather, 10, 3);
  CHECK(ag.send == 3);
  CHECK(ag.recv == 9);
  CHECK(ag.param == 3);
  const auto rs = db::counts_for(db::collective::reduce_scatter, 10, 3);
  CHECK(rs.send == 9);
  CHECK(rs.recv == 3);
  CHECK(rs.param == 3);
  CHECK(db::inplace_result_offset(db::collective::reduce_scatter, 2, 5) == 10);
  CHECK(db::inplace_result_offset(db::collective::allgather, 2, 5) == 0);

  auto labels = [](db::collective k, bool all_only = false) {
    std::string s;
    for (const auto& e : db::algorithm_table)
      if ((e.collectives & db::bit(k)) && (!all_only || e.in_all)) s += std::string(e.label) + " ";
    return s;
  };
  CHECK(labels(db::collective::allreduce) == "ring tree shm shm1 shm2 hier native auto ");
  CHECK(labels(db::collective::allreduce, true) == "ring tree shm hier native auto ");
  CHECK(labels(db::collective::reduce_scatter) == "ring shm hier native auto ");
  CHECK(labels(db::collective::allgather) == "ring shm hier native auto ");
  CHECK(labels(db::collective::broadcast) == "tree shm hier native auto ");
  CHECK(labels(db::collective::reduce) == "tree shm native auto ");
  CHECK(db::transport_has<dpkit::inproc>(db::transport_need::several_nodes)); // inproc knows its (virtual) nodes
  CHECK(db::algorithm_label(dpkit::algorithm::automatic) == "auto");
  CHECK(db::transport_has<dpkit::inproc>(db::transport_need::nothing));
  CHECK_FALSE(db::transport_has<dpkit::inproc>(db::transport_need::native_collectives));
}

TEST_CASE("JSON: nccl-tests 2.19 keys, null for unchecked and non-finite values") {
  db::half_result h = half(6.21, 0.5, 1.0, 0);
  CHECK(db::detail::json_half(h) == R"j({"time":6.21,"alg_bw":0.5,"bus_bw":1,"nwrong":0})j");
  h.wrong = -1;
  h.time_us = std::numeric_limits<double>::quiet_NaN();
  h.has_stats = true;
  h.stats.min = 1;
  h.stats.max = 2;
  h.stats.p99 = 2;
  h.stats.cv = 12.5;
  CHECK(db::detail::json_half(h) ==
        R"j({"time":null,"alg_bw":0.5,"bus_bw":1,"nwrong":null,"i_min":1,"i_max":2,"i_p99":2,"i_cv":12.5})j");
  CHECK(db::detail::json_escape("a\"b\\c\n") == R"j("a\"b\\c\n")j");

  db::options o = parse({"-b", "8", "-e", "64", "-f", "2"});
  o.argv = {"allreduce_perf", "-b", "8"};
  db::run_info info;
  info.program = "allreduce_perf";
  info.collective = "allreduce";
  info.nranks = 2;
  info.busbw_factor = 1;
  info.ranks = {{0, 11, "h"}, {1, 12, "h"}};
  info.start_time = "S";
  info.end_time = "E";
  info.opts = &o;
  const db::row_result r = row8("ring", half(1, 2, 3, 0), half(4, 5, 6, 0));
  const std::string path =
      (std::filesystem::temp_directory_path() / ("dpkit_bench_test_" + std::to_string(getpid()) + ".json")).string();
  REQUIRE(db::write_json(path, info, {r}, {{"ring", 0, 4.5}}));
  std::ifstream in(path);
  const std::string j((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path.c_str());
  CHECK(j.rfind(R"j({"version":)j", 0) == 0);
  CHECK(j.find(R"j("start_time":"S","args":"allreduce_perf -b 8","env":{)j") != std::string::npos);
  CHECK(j.find(R"j("nccl_version":null)j") != std::string::npos);
  CHECK(j.find(R"j({"rank":1,"group":0,"pid":12,"hostname":"h","device":-1,"device_hex":"0x00","device_info":"host memory (MPI rank)"})j") !=
        std::string::npos);
  CHECK(j.find(R"j({"size":8,"count":2,"type":"float","redop":"sum","root":-1,"actual_iterations":20,"experiment_name":"ring","out_of_place":{"time":1,"alg_bw":2,"bus_bw":3,"nwrong":0},"in_place":{"time":4,"alg_bw":5,"bus_bw":6,"nwrong":0},"algorithm":"ring"})j") !=
        std::string::npos);
  CHECK(j.find(R"j("config":{"nthreads":1,"ngpus":1,"minimum_bytes":8,"maximum_bytes":64,"step_factor":2,"warmup_iters":1,"iterations":20,"aggregated_iterations":1,"validation":1,"graph":0})j") !=
        std::string::npos);
  CHECK(j.find(R"j("end_time":"E")j") != std::string::npos);
  CHECK(j.find(R"j("tables":[{"algorithm":"ring","out_of_bounds":0,"avg_bus_bw":4.5}])j") != std::string::npos);
#if defined(BENCH_TEST_SIMDJSON)
  // A JSON parser reads it back, with the top-level keys nccl-tests 2.19 writes.
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.parse(j).get(doc) == simdjson::SUCCESS);
  for (const char* key : {"version", "start_time", "args", "env", "nccl_version", "ranks", "results", "config", "end_time"})
    CHECK_MESSAGE(doc[key].error() == simdjson::SUCCESS, key);
  CHECK(doc["results"].at(0)["out_of_place"]["bus_bw"].get_double().value() == 3.0);
  CHECK(doc["ranks"].get_array().size() == 2);
#endif
}

} // TEST_SUITE

// ---- bench_floor.hpp: the memory floor's model ----

TEST_CASE("floor model: each algorithm's traffic per rank and the node's floor") {
  using dpkit_bench::floor_algo;
  const double S = 1 << 20;
  // n = 4, slice S/4: the table of bench_floor.hpp
  auto t = dpkit_bench::traffic_of(floor_algo::one_shot, 4, S);
  CHECK(t.copy_bytes == S);
  CHECK(t.reduce_bytes == 3 * S);
  t = dpkit_bench::traffic_of(floor_algo::two_shot, 4, S);
  CHECK(t.copy_bytes == 2 * 0.75 * S + 0.25 * S);
  CHECK(t.reduce_bytes == 0.75 * S);
  t = dpkit_bench::traffic_of(floor_algo::direct, 4, S);
  CHECK((t.copy_bytes == 0.75 * S && t.reduce_bytes == 0.75 * S));
  t = dpkit_bench::traffic_of(floor_algo::ring, 4, S);
  CHECK((t.copy_bytes == 1.5 * S && t.reduce_bytes == 0.75 * S));
  t = dpkit_bench::traffic_of(floor_algo::ring, 1, S); // one rank: a copy, nothing to reduce
  CHECK((t.copy_bytes == S && t.reduce_bytes == 0));
  const dpkit_bench::memory_rates r{2e9, 1e9, 4e9};
  CHECK(dpkit_bench::uncached_seconds(floor_algo::direct, 4, S, r) == doctest::Approx(0.75 * S / 2e9 + 0.75 * S / 1e9));
  CHECK(dpkit_bench::stream_floor_seconds(S, r) == doctest::Approx(S / 4e9));
  // direct moves least; without it, ring beats two-shot at these rates
  CHECK(dpkit_bench::best_uncached(4, S, r).algo == floor_algo::direct);
  CHECK(dpkit_bench::best_uncached(4, S, r, false).algo == floor_algo::ring);
}
