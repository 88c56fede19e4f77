// Tests of dpkit/data/mapped_file.hpp, jsonl_index.hpp, jsonl_length_column.hpp.
#include "data_test_util.hpp"

#include <dpkit/data.hpp>
#include <dpkit/data/jsonl_length_column.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <sstream>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using data_test::tmp_dir;

namespace {

std::map<std::string, std::string> read_offset_vectors() {
  std::map<std::string, std::string> kv;
  std::ifstream f(data_test::vectors("debian_offsets.txt"));
  REQUIRE(f.good());
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.find(' ');
    kv[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return kv;
}

std::uint64_t u64(const std::string& s) { return std::stoull(s); }

/// Builds then opens; compares against the independent reference split.
void check_against_reference(const std::string& name, const std::string& content, unsigned threads) {
  const fs::path src = tmp_dir() / name;
  data_test::write_file(src, content);
  dpkit::jsonl_index_build_options o;
  o.threads = threads;
  o.progress_interval_bytes = 4096;
  const auto res = dpkit::build_jsonl_index(src, o);
  const auto ref = data_test::split_lines(content);
  CHECK(res.lines == ref.lines.size());
  CHECK(res.index_path == dpkit::default_index_path(src));
  const auto idx = dpkit::jsonl_index::open(src);
  REQUIRE(idx.size() == ref.lines.size());
  for (std::uint64_t k = 0; k < idx.size(); ++k) {
    CHECK(idx.offset(k) == ref.offsets[k]);
    CHECK(idx[k] == ref.lines[k]);
    CHECK(idx.source_line(k) == k);
  }
  CHECK(idx.offset(idx.size()) == content.size());
  CHECK_NOTHROW(dpkit::verify_jsonl_index(src));
}

} // namespace

TEST_CASE("mapped_file: errors name the path and errno; empty files; move") {
  const fs::path missing = tmp_dir() / "no-such-file.jsonl";
  fs::remove(missing);
  try {
    dpkit::mapped_file m(missing);
    FAIL("expected dpkit::error");
  } catch (const dpkit::error& e) {
    const std::string msg = e.what();
    CHECK(msg.find(missing.string()) != std::string::npos);
    CHECK(msg.find("No such file") != std::string::npos);
    CHECK(msg.find("errno 2") != std::string::npos);
  }
  const fs::path empty = tmp_dir() / "empty.bin";
  data_test::write_file(empty, "");
  dpkit::mapped_file e(empty);
  CHECK(e.empty());
  CHECK(e.view().empty());
  const fs::path some = tmp_dir() / "some.bin";
  data_test::write_file(some, "hello\n");
  dpkit::mapped_file a(some, dpkit::access_advice::sequential);
  dpkit::mapped_file b(std::move(a));
  CHECK(b.view() == "hello\n");
  CHECK(a.empty());
  a = std::move(b);
  CHECK(a.view() == "hello\n");
  a.advise(dpkit::access_advice::random);
  const fs::path dir = tmp_dir();
  CHECK_THROWS_WITH_AS(dpkit::mapped_file{dir}, doctest::Contains("is a directory, not a regular file"),
                       dpkit::invalid_argument);
}

TEST_CASE("jsonl_index: offsets equal Python's on the real corpus (1 and 4 threads, num_tokens column)") {
  const auto kv = read_offset_vectors();
  const fs::path idxp = tmp_dir() / "debian.idx";
  for (unsigned threads : {1u, 4u}) {
    CAPTURE(threads);
    dpkit::jsonl_index_build_options o;
    o.threads = threads;
    o.length_column = dpkit::json_length_column("num_tokens");
    const auto res = dpkit::build_jsonl_index(data_test::corpus(), idxp, o);
    CHECK(res.lines == u64(kv.at("lines")));
    CHECK(res.source_bytes == u64(kv.at("size")));
    dpkit::jsonl_index_open_options oo;
    oo.index_path = idxp;
    const auto idx = dpkit::jsonl_index::open(data_test::corpus(), oo);
    REQUIRE(idx.size() == u64(kv.at("lines")));
    std::uint64_t sum = 0, wsum = 0, bytes = 0;
    for (std::uint64_t k = 0; k < idx.size(); ++k) {
      sum += idx.offset(k);
      wsum += (k + 1) * idx.offset(k);
      bytes += idx[k].size();
    }
    CHECK(sum == u64(kv.at("offset_sum")));
    CHECK(wsum == u64(kv.at("offset_weighted_sum")));
    CHECK(bytes == u64(kv.at("line_bytes")));
    std::istringstream first(kv.at("first"));
    std::uint64_t v = 0, k = 0;
    while (first >> v) CHECK(idx.offset(k++) == v);
    CHECK(k == 100);
    std::istringstream every(kv.at("every1000"));
    std::string pair;
    int checked = 0;
    while (every >> pair) {
      const auto c = pair.find(':');
      CHECK(idx.offset(u64(pair.substr(0, c))) == u64(pair.substr(c + 1)));
      ++checked;
    }
    CHECK(checked == 64);
    // the num_tokens column equals the JSON values (data README: sum 5,887,733, max 20,524)
    REQUIRE(idx.has_lengths());
    CHECK(idx.length_column_name() == "num_tokens");
    std::uint64_t tsum = 0, tmax = 0, twsum = 0;
    for (std::uint64_t i = 0; i < idx.lengths().size(); ++i) {
      tsum += idx.lengths()[i];
      tmax = std::max<std::uint64_t>(tmax, idx.lengths()[i]);
      twsum += (i + 1) * idx.lengths()[i];
    }
    CHECK(tsum == 5887733);
    CHECK(tmax == 20524);
    CHECK(tsum == u64(kv.at("num_tokens_sum")));
    CHECK(twsum == u64(kv.at("num_tokens_weighted_sum")));
    CHECK(idx[0].front() == '{');
    CHECK(idx[0].back() == '}');
    dpkit::jsonl_index_verify_options vo;
    vo.index_path = idxp;
    vo.length_column = dpkit::json_length_column("num_tokens");
    CHECK(dpkit::verify_jsonl_index(data_test::corpus(), vo) == idx.size());
  }
}

TEST_CASE("jsonl_index: edge files") {
  for (unsigned threads : {1u, 3u}) {
    CAPTURE(threads);
    check_against_reference("edge-empty.jsonl", "", threads);
    check_against_reference("edge-one-no-newline.jsonl", "{\"a\":1}", threads);
    check_against_reference("edge-only-newline.jsonl", "\n", threads);
    check_against_reference("edge-crlf.jsonl", "{\"a\":1}\r\n{\"b\":2}\r\n\r\nlast\r", threads);
    check_against_reference("edge-blank.jsonl", "\n\n{\"a\":1}\n\n  \n{\"b\":2}\n\n", threads);
    check_against_reference("edge-utf8.jsonl", "{\"t\":\"d\xc3\xa9j\xc3\xa0 vu \xe6\xbc\xa2\xe5\xad\x97 \xf0\x9f\x98\x80\"}\n\xe2\x82\xac\n", threads);
    std::string big = "{\"text\":\"" + std::string(10u << 20, 'x') + "\"}\nsmall\n" + std::string(3u << 20, 'y');
    check_against_reference("edge-10mb-line.jsonl", big, threads);
  }
  // a CRLF line keeps its content, loses only the trailing \r
  const fs::path src = tmp_dir() / "edge-crlf.jsonl";
  const auto idx = dpkit::jsonl_index::open(src);
  REQUIRE(idx.size() == 4);
  CHECK(idx[0] == "{\"a\":1}");
  CHECK(idx[2].empty());
  CHECK(idx[3] == "last");
  CHECK_THROWS_AS((void)idx.at(4), dpkit::invalid_argument);
}

TEST_CASE("jsonl_index: skipping blank lines keeps source line numbers") {
  const std::string content = "\n{\"n\":1}\n  \n\r\n{\"n\":2}\r\n\n{\"n\":3}";
  const fs::path src = tmp_dir() / "skip-blank.jsonl";
  data_test::write_file(src, content);
  for (unsigned threads : {1u, 2u}) {
    dpkit::jsonl_index_build_options o;
    o.threads = threads;
    o.blank_lines = dpkit::blank_line_policy::skip;
    o.length_column = dpkit::json_length_column("n");
    const auto res = dpkit::build_jsonl_index(src, o);
    CHECK(res.lines == 3);
    CHECK(res.source_lines == 7);
    const auto idx = dpkit::jsonl_index::open(src);
    REQUIRE(idx.size() == 3);
    CHECK(idx.blank_lines_skipped());
    CHECK(idx[0] == "{\"n\":1}");
    CHECK(idx[1] == "{\"n\":2}");
    CHECK(idx[2] == "{\"n\":3}");
    CHECK(idx.source_line(0) == 1);
    CHECK(idx.source_line(1) == 4);
    CHECK(idx.source_line(2) == 6);
    CHECK(idx.offset(1) == content.find("{\"n\":2}"));
    CHECK(idx.lengths()[2] == 3);
    CHECK(idx.source_line_count() == 7);
    CHECK_NOTHROW(dpkit::verify_jsonl_index(src));
  }
}

TEST_CASE("jsonl_index: damaged or stale indexes are refused with format_error") {
  const fs::path src = tmp_dir() / "damage.jsonl";
  std::string content;
  for (int i = 0; i < 2000; ++i) content += "{\"num_tokens\": " + std::to_string(i % 97) + ", \"text\": \"line " + std::to_string(i) + "\"}\n";
  data_test::write_file(src, content);
  dpkit::jsonl_index_build_options o;
  o.length_column = dpkit::json_length_column("num_tokens");
  dpkit::build_jsonl_index(src, o);
  const fs::path idxp = dpkit::default_index_path(src);
  const std::string good = data_test::read_file(idxp);
  REQUIRE_NOTHROW((void)dpkit::jsonl_index::open(src));

  const auto expect_refused = [&](const std::string& bytes, const char* what) {
    CAPTURE(what);
    data_test::write_file(idxp, bytes);
    try {
      (void)dpkit::jsonl_index::open(src);
      FAIL("index accepted: " << what);
    } catch (const dpkit::format_error& e) {
      CHECK(std::string(e.what()).find(idxp.string()) != std::string::npos);
      MESSAGE(e.what());
    }
  };
  expect_refused(good.substr(0, good.size() - 8), "truncated by 8 bytes");
  expect_refused(good.substr(0, 50), "truncated inside the header");
  expect_refused("", "empty");
  {
    std::string b = good;
    b[0] = 'X';
    expect_refused(b, "bad magic");
  }
  {
    std::string b = good;
    b[8] = 3;
    expect_refused(b, "unknown version");
  }
  for (std::size_t pos : {std::size_t{20}, std::size_t{50}, std::size_t{100}, good.size() / 2, good.size() - 3}) {
    std::string b = good;
    b[pos] = static_cast<char>(b[pos] ^ 0x10);
    expect_refused(b, "flipped byte");
  }
  {
    std::string b = good + std::string(8, '\0');
    expect_refused(b, "trailing bytes");
  }
  data_test::write_file(idxp, good);
  REQUIRE_NOTHROW((void)dpkit::jsonl_index::open(src));

  // stale: same size, one byte changed in the head
  std::string changed = content;
  changed[20] = '9';
  data_test::write_file(src, changed);
  CHECK_THROWS_AS((void)dpkit::jsonl_index::open(src), dpkit::stale_index_error);
  CHECK_THROWS_AS((void)dpkit::jsonl_index::open(src), dpkit::format_error);
  try {
    (void)dpkit::jsonl_index::open(src);
  } catch (const dpkit::format_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("stale") != std::string::npos);
    CHECK(msg.find(src.string()) != std::string::npos);
    MESSAGE(msg);
  }
  // stale: appended line (size differs)
  data_test::write_file(src, content + "{\"num_tokens\": 1}\n");
  try {
    (void)dpkit::jsonl_index::open(src);
    FAIL("stale index accepted");
  } catch (const dpkit::stale_index_error& e) {
    CHECK(std::string(e.what()).find("size") != std::string::npos);
  }
  // rebuild_if_stale rebuilds (with the build options) and opens
  dpkit::jsonl_index_open_options oo;
  oo.rebuild_if_stale = true;
  oo.build = o;
  const auto idx = dpkit::jsonl_index::open(src, oo);
  CHECK(idx.size() == 2001);
  CHECK(idx.lengths()[2000] == 1);
  // missing index + rebuild_if_stale builds it
  fs::remove(idxp);
  CHECK(dpkit::jsonl_index::open(src, oo).size() == 2001);
  // an index without the wanted column is rebuilt with it
  dpkit::build_jsonl_index(src);
  CHECK(!dpkit::jsonl_index::open(src).has_lengths());
  CHECK(dpkit::jsonl_index::open(src, oo).has_lengths());
  fs::remove(idxp);
  CHECK_THROWS_AS((void)dpkit::jsonl_index::open(src), dpkit::error);
  CHECK(data_test::count_files_containing(tmp_dir(), "damage.jsonl.idx.tmp") == 0);
}

TEST_CASE("jsonl_index: a cancelled build leaves no index and no temporary file") {
  const fs::path dir = tmp_dir() / "cancel";
  fs::create_directories(dir);
  const fs::path idxp = dir / "corpus.idx";
  fs::remove(idxp);
  for (unsigned threads : {1u, 4u}) {
    CAPTURE(threads);
    dpkit::jsonl_index_build_options o;
    o.threads = threads;
    o.progress_interval_bytes = 64 << 10;
    o.length_column = dpkit::json_length_column("num_tokens");
    std::uint64_t calls = 0, last_done = 0, total_seen = 0;
    o.progress = [&](std::uint64_t done, std::uint64_t total) {
      ++calls;
      last_done = done;
      total_seen = total;
      return done < total / 3; // cancel a third of the way through
    };
    CHECK_THROWS_AS(dpkit::build_jsonl_index(data_test::corpus(), idxp, o), dpkit::build_cancelled);
    CHECK(calls >= 2);
    CHECK(last_done >= total_seen / 3);
    CHECK(last_done < total_seen);
    CHECK(!fs::exists(idxp));
    CHECK(data_test::count_files_containing(dir, ".tmp") == 0);
    CHECK(fs::is_empty(dir));
  }
  // stop token
  std::stop_source stop;
  dpkit::jsonl_index_build_options o;
  o.threads = 2;
  o.progress_interval_bytes = 64 << 10;
  o.stop = stop.get_token();
  o.progress = [&](std::uint64_t done, std::uint64_t total) {
    if (done > total / 4) stop.request_stop();
    return true;
  };
  CHECK_THROWS_AS(dpkit::build_jsonl_index(data_test::corpus(), idxp, o), dpkit::build_cancelled);
  CHECK(fs::is_empty(dir));
  // an uncancelled build reports progress up to the total
  o = {};
  o.progress_interval_bytes = 1 << 20;
  std::uint64_t final_done = 0;
  o.progress = [&](std::uint64_t done, std::uint64_t total) {
    CHECK(done <= total);
    final_done = done;
    return true;
  };
  dpkit::build_jsonl_index(data_test::corpus(), idxp, o);
  CHECK(final_done == fs::file_size(data_test::corpus()));
  CHECK(fs::exists(idxp));
  fs::remove(idxp);
}

TEST_CASE("jsonl_length_column: invalid JSON / missing field name the line; default policy") {
  const fs::path src = tmp_dir() / "bad-json.jsonl";
  const fs::path idxp = dpkit::default_index_path(src);
  fs::remove(idxp);
  const auto expect_line_error = [&](const std::string& content, const std::string& line_text, dpkit::jsonl_index_build_options o) {
    data_test::write_file(src, content);
    o.length_column = dpkit::json_length_column("num_tokens");
    try {
      dpkit::build_jsonl_index(src, o);
      FAIL("accepted: " << content);
    } catch (const dpkit::format_error& e) {
      const std::string msg = e.what();
      CHECK(msg.find(line_text) != std::string::npos);
      CHECK(msg.find(src.string()) != std::string::npos);
      MESSAGE(msg);
    }
    CHECK(!fs::exists(idxp));
  };
  dpkit::jsonl_index_build_options one;
  one.threads = 1;
  expect_line_error("{\"num_tokens\": 1}\n{\"num_tokens\": 2}\n{\"num_tokens\": 3,,}\n", "line 3:", one);
  expect_line_error("{\"num_tokens\": 1}\n{\"other\": 2}\n", "line 2:", one);
  expect_line_error("{\"num_tokens\": -4}\n", "line 1:", one);
  expect_line_error("{\"num_tokens\": 1.5}\n", "line 1:", one);
  expect_line_error("{\"num_tokens\": 4294967296}\n", "line 1:", one);
  expect_line_error("{\"num_tokens\": 4294967295}\n", "line 1:", one); // reserved: dpkit::missing_length
  expect_line_error("[1, 2]\n", "line 1:", one);
  expect_line_error("{\"num_tokens\": 1, \"x\": [}\n", "line 1:", one);
  {
    // threaded: the first bad line in file order is reported
    std::string content;
    for (int i = 0; i < 300000; ++i) content += i == 150001 || i == 250000 ? "oops\n" : "{\"num_tokens\": 7}\n";
    dpkit::jsonl_index_build_options o;
    o.threads = 4;
    expect_line_error(content, "line 150002:", o);
  }
  data_test::write_file(src, "{\"num_tokens\": 5}\n{\"other\": 2}\n\n");
  dpkit::jsonl_index_build_options o;
  o.length_column = dpkit::json_length_column("num_tokens", {dpkit::missing_field_policy::default_value, 42});
  o.blank_lines = dpkit::blank_line_policy::skip;
  dpkit::build_jsonl_index(src, o);
  const auto idx = dpkit::jsonl_index::open(src);
  REQUIRE(idx.size() == 2);
  CHECK(idx.lengths()[0] == 5);
  CHECK(idx.lengths()[1] == 42);
  {
    // skip: the line stays (line numbers = file lines) with no length, and
    // the token-budget sampler leaves it out
    data_test::write_file(src, "{\"num_tokens\": 5}\n{\"other\": 2}\n{\"num_tokens\": 7}\n");
    dpkit::jsonl_index_build_options so;
    so.length_column = dpkit::json_length_column("num_tokens", {dpkit::missing_field_policy::skip, 0});
    dpkit::build_jsonl_index(src, so);
    const auto sidx = dpkit::jsonl_index::open(src);
    REQUIRE(sidx.size() == 3);
    CHECK(sidx.lengths()[0] == 5);
    CHECK(sidx.lengths()[1] == dpkit::missing_length);
    CHECK(sidx.lengths()[2] == 7);
    const std::vector<std::uint32_t> lens(sidx.lengths().begin(), sidx.lengths().end());
    dpkit::token_budget_options to;
    to.max_tokens = 100;
    for (auto policy : {dpkit::oversize_policy::skip, dpkit::oversize_policy::truncate}) {
      to.oversize = policy;
      const dpkit::token_budget_batch_sampler tb(lens, 1, 0, to);
      std::vector<std::uint64_t> got;
      for (std::uint64_t b = 0; b < tb.total_batches(); ++b)
        for (auto i : tb.plan_batch(b)) got.push_back(i);
      std::sort(got.begin(), got.end());
      CHECK(got == std::vector<std::uint64_t>{0, 2});
      CHECK(tb.skipped() == 1);
    }
  }
  dpkit::jsonl_index_build_options long_name;
  long_name.length_column = dpkit::json_length_column("this_name_is_too_long");
  CHECK_THROWS_AS(dpkit::build_jsonl_index(src, long_name), dpkit::invalid_argument);
}

TEST_CASE("jsonl_dataset: shards with global line numbers") {
  const fs::path a = tmp_dir() / "shard-a.jsonl", b = tmp_dir() / "shard-b.jsonl", c = tmp_dir() / "shard-c.jsonl";
  data_test::write_file(a, "{\"n\":1}\n{\"n\":2}\n");
  data_test::write_file(b, "");
  data_test::write_file(c, "{\"n\":3}\n{\"n\":4}\n{\"n\":5}");
  dpkit::jsonl_index_open_options oo;
  oo.rebuild_if_stale = true;
  oo.build.length_column = dpkit::json_length_column("n");
  const dpkit::jsonl_dataset ds({a, b, c}, oo);
  REQUIRE(ds.size() == 5);
  CHECK(ds.shard_count() == 3);
  for (std::uint64_t g = 0; g < 5; ++g) {
    CHECK(ds[g] == "{\"n\":" + std::to_string(g + 1) + "}");
    CHECK(ds.length(g) == g + 1);
  }
  CHECK(ds.locate(2).shard == 2);
  CHECK(ds.locate(2).line == 0);
  CHECK_THROWS_AS((void)ds[5], dpkit::invalid_argument);
}

TEST_CASE("jsonl_index: offsets and columns longer than the build's spill buffers (1-3 threads), read_line") {
  // 700k lines: each range's offsets, source lines and values pass through
  // several 1 MiB spill buffers and temporary files. Reference: the line
  // starts found by a plain loop over the bytes.
  std::string content;
  std::vector<std::uint64_t> starts, kept_lines;
  std::vector<std::uint32_t> values;
  std::uint64_t line = 0;
  for (std::uint32_t i = 0; i < 700000; ++i, ++line) {
    if (i % 7 == 3) {
      content += i % 2 ? "\n" : "  \r\n"; // blank lines (skipped)
      continue;
    }
    starts.push_back(content.size());
    kept_lines.push_back(line);
    values.push_back(i * 13 % 1000);
    content += "{\"n\":" + std::to_string(values.back()) + "}" + (i % 5 == 0 ? "\r\n" : "\n");
  }
  content += "{\"n\":9}"; // no trailing newline
  starts.push_back(content.size() - 7);
  kept_lines.push_back(line);
  values.push_back(9);
  const fs::path src = tmp_dir() / "spill.jsonl";
  data_test::write_file(src, content);
  for (unsigned threads : {1u, 2u, 3u}) {
    CAPTURE(threads);
    dpkit::jsonl_index_build_options o;
    o.threads = threads;
    o.blank_lines = dpkit::blank_line_policy::skip;
    o.length_column = dpkit::json_length_column("n");
    const auto res = dpkit::build_jsonl_index(src, o);
    REQUIRE(res.lines == starts.size());
    CHECK(res.source_lines == line + 1);
    const auto idx = dpkit::jsonl_index::open(src);
    REQUIRE(idx.size() == starts.size());
    std::string buf;
    for (std::uint64_t k = 0; k < idx.size(); ++k) {
      REQUIRE(idx.offset(k) == starts[k]);
      REQUIRE(idx.source_line(k) == kept_lines[k]);
      REQUIRE(idx.lengths()[k] == values[k]);
      if (k % 997 == 0 || k + 1 == idx.size()) {
        idx.read_line(k, buf);
        REQUIRE(buf == idx[k]);
        REQUIRE(buf == "{\"n\":" + std::to_string(values[k]) + "}");
      }
    }
    CHECK_NOTHROW(dpkit::verify_jsonl_index(src));
    // without blank-line skipping and the column: the plain scan's spills
    dpkit::jsonl_index_build_options plain;
    plain.threads = threads;
    const auto r2 = dpkit::build_jsonl_index(src, plain);
    CHECK(r2.lines == line + 1);
    const auto idx2 = dpkit::jsonl_index::open(src);
    std::uint64_t expect = 0, k = 0;
    for (std::uint64_t b = 0; b <= content.size(); ++b) {
      if (b == content.size() || content[b] == '\n') {
        REQUIRE(idx2.offset(k) == expect);
        ++k;
        expect = b + 1;
      }
    }
    CHECK(k == idx2.size());
    idx2.read_line(3, buf); // line 3 is empty
    CHECK(buf.empty());
    idx2.read_line(10, buf); // line 10 is "  \r\n"
    CHECK(buf == "  ");
    CHECK(idx2[10] == "  ");
    idx2.read_line(idx2.size() - 1, buf);
    CHECK(buf == "{\"n\":9}");
    CHECK_THROWS_AS(idx2.read_line(idx2.size(), buf), dpkit::invalid_argument);
  }
}

TEST_CASE("jsonl_index: the batched length column over many runs (lines across run boundaries, one longer than a run)") {
  // No blank lines and no skipping: the build hands runs of about
  // column_batch_bytes (1 MiB) of whole lines to simdjson's document stream.
  // Lines of 13 to ~600 bytes put line starts on every side of the run
  // boundaries, one line of 1.5 MiB is longer than a run, and the last line
  // has no newline. Reference: the line starts found by a plain loop over the
  // bytes and the values written.
  std::string content;
  std::vector<std::uint64_t> starts;
  std::vector<std::uint32_t> values;
  for (std::uint32_t i = 0; i < 40000; ++i) {
    starts.push_back(content.size());
    values.push_back(i * 7919u % 100003u);
    const std::string n = std::to_string(values.back());
    const std::string eol = i % 11 == 0 ? "\r\n" : "\n";
    std::string pad(i * 37u % 600u, 'x');
    if (i == 20000) pad.assign(std::size_t{3} << 19, 'y'); // 1.5 MiB: a run on its own
    // a line that ends exactly before a MiB boundary where one fits, so that
    // the next starts on the boundary of two build threads' ranges
    const std::size_t to_boundary = ((content.size() >> 20) + 1 << 20) - content.size();
    const std::size_t fixed = 15 + n.size() + eol.size(); // {"pad":"",  "n":N}  eol
    if (i != 20000 && to_boundary >= fixed && to_boundary - fixed <= 600) pad.assign(to_boundary - fixed, 'z');
    content += "{\"pad\":\"" + pad + "\",\"n\":" + n + "}" + eol;
  }
  content.pop_back(); // the last line ("...}" after i % 11 != 0) has no newline
  REQUIRE(content.size() > (std::size_t{12} << 20));
  const fs::path src = tmp_dir() / "column-runs.jsonl";
  data_test::write_file(src, content);
  std::vector<std::uint64_t> ref;
  for (std::uint64_t b = 0; b < content.size(); ++b)
    if (b == 0 || content[b - 1] == '\n') ref.push_back(b);
  REQUIRE(ref == starts);
  std::size_t on_boundary = 0;
  for (const auto b : starts) on_boundary += b > 0 && b % (std::size_t{1} << 20) == 0;
  REQUIRE(on_boundary >= 8);
  for (unsigned threads : {1u, 2u, 3u}) {
    CAPTURE(threads);
    dpkit::jsonl_index_build_options o;
    o.threads = threads;
    o.length_column = dpkit::json_length_column("n");
    const auto res = dpkit::build_jsonl_index(src, o);
    REQUIRE(res.lines == starts.size());
    const auto idx = dpkit::jsonl_index::open(src);
    REQUIRE(idx.size() == starts.size());
    for (std::uint64_t k = 0; k < idx.size(); ++k) {
      REQUIRE(idx.offset(k) == starts[k]);
      REQUIRE(idx.lengths()[k] == values[k]);
    }
    CHECK(idx[idx.size() - 1].back() == '}');
  }
}

TEST_CASE("jsonl_index::read_line: a replaced source is refused, not read") {
  const fs::path src = tmp_dir() / "read-line-replaced.jsonl";
  data_test::write_file(src, "{\"a\":1}\n{\"a\":2}\n");
  dpkit::build_jsonl_index(src);
  const auto idx = dpkit::jsonl_index::open(src);
  // replaced by another file of the same size after open: the mapping still
  // has the old bytes, the path names new ones
  const fs::path other = tmp_dir() / "read-line-other.jsonl";
  data_test::write_file(other, "{\"b\":3}\n{\"b\":4}\n");
  fs::rename(other, src);
  std::string buf;
  CHECK_THROWS_AS(idx.read_line(0, buf), dpkit::stale_index_error);
  CHECK(idx[0] == "{\"a\":1}"); // the mapping is the file opened
}

TEST_CASE("json_length_column: the batch extractor (document streams) gives the per-line extractor's values and errors") {
  // the same file built with and without make_batch_extractor: same column,
  // or the same error on the same line
  const fs::path src = tmp_dir() / "batch-vs-line.jsonl";
  const fs::path idxp = tmp_dir() / "batch-vs-line.idx";
  const auto build = [&](const std::string& content, bool batch, dpkit::missing_field_policy missing, unsigned threads) {
    data_test::write_file(src, content);
    dpkit::jsonl_index_build_options o;
    o.threads = threads;
    o.length_column = dpkit::json_length_column("n", {missing, 77});
    if (!batch) o.length_column->make_batch_extractor = nullptr;
    std::string result;
    try {
      dpkit::build_jsonl_index(src, idxp, o);
      dpkit::jsonl_index_open_options oo;
      oo.index_path = idxp;
      const auto idx = dpkit::jsonl_index::open(src, oo);
      for (const std::uint32_t v : idx.lengths()) result += std::to_string(v) + ",";
    } catch (const dpkit::format_error& e) {
      const std::string msg = e.what();
      result = "error at" + msg.substr(msg.find(" line "), msg.find(':', msg.find(" line ")) - msg.find(" line "));
    }
    return result;
  };
  std::string big; // > 1 MiB: several runs, a bad line deep inside one
  for (int i = 0; i < 120000; ++i) big += "{\"n\": " + std::to_string(i % 300) + ", \"t\": \"x\\ny\"}\n";
  std::string big_bad = big;
  big_bad.insert(big_bad.find('\n', 1500000) + 1, "{\"n\":\n5} {\"n\": 6}\n");
  const std::vector<std::string> files = {
      "{\"n\":1}\n{\"n\":2}\n{\"n\":3}",                // no trailing newline
      "{\"n\":1}\r\n  {\"n\":2}  \r\n{ \"n\" : 3 }\n", // CRLF, spaces
      "{\"n\":1}\n\n{\"n\":3}\n",                       // a blank line (kept: an error)
      "{\"n\":1}\n{\"n\":\n2}\n",                       // a document over two lines
      "{\"n\":\n2} {\"n\":3}\n{\"n\":4}\n",             // ... followed by another on its second line
      "{\"n\":1} {\"n\":2}\n",                          // two documents on one line
      "{\"n\":1}\n[1]\n",                                // not an object
      "{\"n\":1}\n{\"m\":2}\n{\"n\":3}\n",              // a missing field
      "{\"n\":1}\n{\"n\":-2}\n",                         // not unsigned
      "{\"n\":1}\n{\"n\":4294967295}\n",                 // reserved value
      "{\"n\":1}\n{\"n\":2,}\n",                         // invalid JSON
      "{\"n\":1}\n{\"n\":2} x\n",                        // trailing garbage
      "{\"n\":1}\n{\"n\":\"2\"}\n",                      // a string
      "{\"x\":{\"n\":5},\"n\":6}\n",                     // nested key of the same name
      std::string("{\"n\0\":1}  \r\n", 12),                 // a NUL in a key: the first document fails (fuzz finding)
      std::string("{\"n\":1}\n{\"a\0\":2}\n{\"n\":3}\n", 25), // ... a later one
      big,
      big_bad,
  };
  for (const auto& content : files) {
    for (const auto missing : {dpkit::missing_field_policy::error, dpkit::missing_field_policy::default_value,
                               dpkit::missing_field_policy::skip}) {
      for (unsigned threads : {1u, 2u}) {
        CAPTURE(content.substr(0, 40));
        CAPTURE(static_cast<int>(missing));
        CAPTURE(threads);
        const std::string line = build(content, false, missing, threads);
        const std::string batched = build(content, true, missing, threads);
        CHECK(batched == line);
      }
    }
  }
  CHECK(build(files[0], true, dpkit::missing_field_policy::error, 1) == "1,2,3,");
  CHECK(build(files[4], true, dpkit::missing_field_policy::error, 1) == "error at line 1");
  CHECK(build(files[7], true, dpkit::missing_field_policy::default_value, 1) == "1,77,3,");
  CHECK(build(big_bad, true, dpkit::missing_field_policy::error, 2).rfind("error at line ", 0) == 0);
}
