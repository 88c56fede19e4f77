// The JSONL index on the unhappy path: damaged offsets whatever the
// checksums say, a source changed with its size and mtime restored, an index
// path that is not a regular file, a FIFO as the source or index to read, a
// build killed with SIGKILL.
#include "data_test_util.hpp"

#include <dpkit/data.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef DPKIT_TEST_OLD_API // compiling these tests against dpkit before the split (to show they fail there)
#define DPKIT_TEST_HASH dpkit::detail::data::hash_bytes
#else
#define DPKIT_TEST_HASH dpkit::detail::hash_bytes
#endif

namespace fs = std::filesystem;
using data_test::tmp_dir;

namespace {

std::uint64_t get_u64(const std::string& b, std::size_t at) {
  std::uint64_t v = 0;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
void put_u64(std::string& b, std::size_t at, std::uint64_t v) { std::memcpy(b.data() + at, &v, 8); }
std::uint32_t header_size(const std::string& b) {
  std::uint32_t v = 0;
  std::memcpy(&v, b.data() + 12, 4);
  return v;
}

/// Recomputes the body and header checksums of an index image (format doc:
/// body checksum at [72, 80), header checksum at [80, 88)), so a damaged body
/// looks intact to the checksums.
std::string reseal(std::string b) {
  const std::uint32_t h = header_size(b);
  put_u64(b, 72, DPKIT_TEST_HASH(b.data() + h, b.size() - h, 0x6470'6b69'7462'6f64ULL));
  put_u64(b, 80, 0);
  put_u64(b, 80, DPKIT_TEST_HASH(b.data(), h, 0x6470'6b69'7468'6472ULL));
  return b;
}

/// An empty scratch directory tmp_dir() / name.
fs::path fresh_dir(const char* name) {
  const fs::path dir = tmp_dir() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// Reads every line the way users and the CLI's get/stats/dataset do.
void read_everything(const dpkit::jsonl_index& idx) {
  for (std::uint64_t k = 0; k <= idx.size(); ++k) (void)idx.offset(k);
  volatile unsigned sink = 0;
  for (std::uint64_t k = 0; k < idx.size(); ++k) {
    const std::string_view line = idx[k];
    for (const char c : line) sink = sink + static_cast<unsigned char>(c); // read every byte handed out
    CHECK(idx.at(k) == line);
    (void)idx.source_line(k);
  }
}

/// Expects open + read_everything to throw format_error naming the index file
/// (and, where given, the line number and the bad offset), never to crash or
/// hand out a line that is not one whole line of the source.
void expect_damaged(const fs::path& src, const fs::path& idxp, const std::string& image, bool verify_checksum,
                    const std::string& must_mention) {
  data_test::write_file(idxp, image);
  dpkit::jsonl_index_open_options o;
  o.verify_checksum = verify_checksum;
  try {
    const auto idx = dpkit::jsonl_index::open(src, o);
    read_everything(idx);
    const dpkit::jsonl_dataset ds({src}, o);
    for (std::uint64_t g = 0; g < ds.size(); ++g) (void)ds[g];
    FAIL("damaged index accepted");
  } catch (const dpkit::format_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find(idxp.string()) != std::string::npos);
    CHECK(msg.find(must_mention) != std::string::npos);
    MESSAGE(msg);
  }
}

} // namespace

TEST_CASE("jsonl_index hardening: damaged offsets are refused, with valid checksums or checksums off") {
  const fs::path src = tmp_dir() / "damaged-offsets.jsonl";
  std::string content;
  for (int i = 0; i < 200; ++i) content += "{\"id\": " + std::to_string(i) + ", \"text\": \"line number " + std::to_string(i) + "\"}\n";
  data_test::write_file(src, content);
  const auto ref = data_test::split_lines(content);
  for (const auto policy : {dpkit::blank_line_policy::keep, dpkit::blank_line_policy::skip}) {
    CAPTURE(static_cast<int>(policy));
    dpkit::jsonl_index_build_options bo;
    bo.blank_lines = policy;
    dpkit::build_jsonl_index(src, bo);
    const fs::path idxp = dpkit::default_index_path(src);
    const std::string good = data_test::read_file(idxp);
    {
      const auto idx = dpkit::jsonl_index::open(src);
      REQUIRE(idx.size() == 200);
      for (std::uint64_t k = 0; k < idx.size(); ++k) REQUIRE(idx[k] == ref.lines[k]);
    }
    const std::size_t off0 = header_size(good); // offsets[0]
    const auto at = [&](std::uint64_t k) { return off0 + 8 * k; };
    const std::uint64_t k = 57;
    struct mutation {
      const char* what;
      std::uint64_t slot;
      std::uint64_t value;
    };
    const std::vector<mutation> cases = {
        {"past the end", k, content.size() + 1000},
        {"huge", k, std::uint64_t{1} << 62},
        {"not a line start", k, get_u64(good, at(k)) + 3},
        {"out of order", k, get_u64(good, at(k + 1)) + 1},
        {"empty range", k, get_u64(good, at(k + 1))},
        {"two lines joined", k + 1, get_u64(good, at(k + 2))},
        {"last line past the end", 199, content.size() + 1},
        {"zero in the middle", k, 0},
    };
    for (const auto& m : cases) {
      CAPTURE(m.what);
      std::string b = good;
      put_u64(b, at(m.slot), m.value);
      expect_damaged(src, idxp, reseal(b), true, "damaged");  // checksums valid
      expect_damaged(src, idxp, b, false, "damaged");         // checksum verification off
    }
    // the message names the line and the offset
    {
      std::string b = good;
      put_u64(b, at(k), content.size() + 1000);
      expect_damaged(src, idxp, reseal(b), true, "line 57 has offset " + std::to_string(content.size() + 1000));
    }
    if (policy == dpkit::blank_line_policy::skip) {
      // the source_line column (after the n + 1 offsets) out of range
      std::string b = good;
      put_u64(b, at(201) + 8 * k, 1u << 20);
      expect_damaged(src, idxp, reseal(b), true, "source line number");
    }
    data_test::write_file(idxp, good);
  }
}

TEST_CASE("jsonl_index hardening: one byte changed in the middle with size and mtime restored is stale at open") {
  const fs::path src = tmp_dir() / "touch-r.jsonl";
  std::string content;
  for (int i = 0; content.size() < (3u << 20); ++i) content += "{\"id\": " + std::to_string(i) + ", \"text\": \"some text here\"}\n";
  data_test::write_file(src, content);
  dpkit::build_jsonl_index(src);
  REQUIRE_NOTHROW((void)dpkit::jsonl_index::open(src));
  struct stat before {};
  REQUIRE(::stat(src.c_str(), &before) == 0);
  // one byte in the middle, written in place (same inode), far from head and tail
  const std::size_t mid = content.size() / 2;
  const char x = content[mid] == '7' ? '8' : '7';
  {
    const int fd = ::open(src.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, &x, 1, static_cast<off_t>(mid)) == 1);
    ::close(fd);
  }
  const struct timespec times[2] = {before.st_atim, before.st_mtim}; // touch -r
  REQUIRE(::utimensat(AT_FDCWD, src.c_str(), times, 0) == 0);
  struct stat after {};
  REQUIRE(::stat(src.c_str(), &after) == 0);
  REQUIRE(after.st_size == before.st_size);
  REQUIRE(after.st_mtim.tv_sec == before.st_mtim.tv_sec);
  REQUIRE(after.st_mtim.tv_nsec == before.st_mtim.tv_nsec);
  CHECK_THROWS_AS((void)dpkit::jsonl_index::open(src), dpkit::stale_index_error);
  try {
    (void)dpkit::jsonl_index::open(src);
  } catch (const dpkit::stale_index_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find(src.string()) != std::string::npos);
    CHECK(msg.find("stale") != std::string::npos);
    MESSAGE(msg);
  }
#ifndef DPKIT_TEST_OLD_API
  // the content check also finds the change
  dpkit::jsonl_index_open_options cc;
  cc.check_content_if_moved = true;
  CHECK_THROWS_AS((void)dpkit::jsonl_index::open(src, cc), dpkit::stale_index_error);
  // a byte-identical copy with the same mtime (new inode: cp -p, restore) is
  // stale by default and accepted by the content check
  data_test::write_file(src, content);
  REQUIRE(::utimensat(AT_FDCWD, src.c_str(), times, 0) == 0);
  dpkit::build_jsonl_index(src);
  const fs::path copy = tmp_dir() / "touch-r.jsonl.copy";
  fs::copy_file(src, copy, fs::copy_options::overwrite_existing);
  REQUIRE(::utimensat(AT_FDCWD, copy.c_str(), times, 0) == 0);
  fs::rename(copy, src);
  CHECK_THROWS_AS((void)dpkit::jsonl_index::open(src), dpkit::stale_index_error);
  const auto idx = dpkit::jsonl_index::open(src, cc);
  CHECK(idx.size() == data_test::split_lines(content).lines.size());
  // rebuild_if_stale rebuilds such an index
  dpkit::jsonl_index_open_options rb;
  rb.rebuild_if_stale = true;
  CHECK(dpkit::jsonl_index::open(src, rb).size() == idx.size());
  CHECK_NOTHROW((void)dpkit::jsonl_index::open(src));
#endif
}

namespace {

struct node_state {
  mode_t mode;
  dev_t rdev;
  ino_t ino;
};
node_state lstat_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return {st.st_mode, st.st_rdev, st.st_ino};
}

/// build_jsonl_index(src, target) must throw before reading anything and leave
/// the target as it was (mode, device number, inode) with no temporaries.
void expect_target_refused(const fs::path& src, const fs::path& target) {
  CAPTURE(target);
  const node_state before = lstat_of(target);
  int progress_calls = 0;
  dpkit::jsonl_index_build_options o;
  o.progress = [&](std::uint64_t, std::uint64_t) {
    ++progress_calls;
    return true;
  };
  try {
    dpkit::build_jsonl_index(src, target, o);
    FAIL("an index was written over a non-regular file");
  } catch (const dpkit::invalid_argument& e) {
    CHECK(std::string(e.what()).find(target.string()) != std::string::npos);
    MESSAGE(std::string(e.what()));
  } catch (const std::exception& e) {
    FAIL("wrong exception: " << e.what());
  }
  CHECK(progress_calls == 0);
  const node_state after = lstat_of(target);
  CHECK(after.mode == before.mode);
  CHECK(after.rdev == before.rdev);
  CHECK(after.ino == before.ino);
  CHECK(data_test::count_files_containing(target.parent_path(), target.filename().string() + ".tmp") == 0);
}

} // namespace

TEST_CASE("jsonl_index hardening: an index path that is not a regular file is refused untouched") {
  const fs::path dir = fresh_dir("targets");
  const fs::path src = dir / "src.jsonl";
  data_test::write_file(src, "{\"a\": 1}\n{\"a\": 2}\n");
  const fs::path fifo = dir / "fifo.idx";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  expect_target_refused(src, fifo);
  const fs::path link = dir / "link-to-fifo.idx";
  fs::create_symlink(fifo, link);
  expect_target_refused(src, link);
  const fs::path subdir = dir / "dir.idx";
  fs::create_directories(subdir);
  expect_target_refused(src, subdir);
  const fs::path dev = dir / "null-device.idx"; // a character device like /dev/null (needs root)
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0)
    expect_target_refused(src, dev);
  else
    MESSAGE("mknod not permitted: character-device case covered by /dev/null only");
  // a regular file is still replaced
  const fs::path reg = dir / "regular.idx";
  data_test::write_file(reg, "old");
  CHECK(dpkit::build_jsonl_index(src, reg).lines == 2);
  fs::remove_all(dir);
}

namespace {

/// Runs `open` (which must not block: it opens something that is or leads to
/// the FIFO `fifo`) on another thread and returns "<type>: <what>" of the
/// exception it throws ("no exception" if none). If it has not returned
/// within 10 s it is blocked in open(2) waiting for a writer: the check fails,
/// and the FIFO is opened for writing to release it, so a regression fails
/// instead of hanging the suite (std::abort if even that does not help).
std::string open_within_deadline(const fs::path& fifo, const std::function<void()>& open) {
  auto task = std::async(std::launch::async, [&]() -> std::string {
    try {
      open();
      return "no exception";
    } catch (const dpkit::invalid_argument& e) {
      return std::string("invalid_argument: ") + e.what();
    } catch (const std::exception& e) {
      return std::string("other: ") + e.what();
    }
  });
  if (task.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return task.get();
  FAIL_CHECK("still blocked after 10 s: open(2) of the FIFO '" << fifo.string() << "' waits for a writer");
  for (int i = 0; i < 100 && task.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready; ++i) {
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC); // succeeds once the reader waits
    if (w >= 0) ::close(w);
  }
  if (task.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    std::fprintf(stderr, "the open of '%s' could not be released; aborting\n", fifo.c_str());
    std::abort();
  }
  return "blocked: " + task.get();
}

/// Expects `open` to throw dpkit::invalid_argument naming `named` as a FIFO,
/// without blocking.
void expect_fifo_refused(const fs::path& fifo, const fs::path& named, const std::function<void()>& open) {
  const std::string got = open_within_deadline(fifo, open);
  CAPTURE(got);
  CHECK(got.rfind("invalid_argument: ", 0) == 0);
  CHECK(got.find("'" + named.string() + "' is a FIFO, not a regular file") != std::string::npos);
}

} // namespace

TEST_CASE("jsonl_index hardening: a FIFO as the source or the index to read is refused at once, never waited on") {
  const fs::path dir = fresh_dir("fifos");
  const fs::path src = dir / "src.jsonl";
  data_test::write_file(src, "{\"a\": 1}\n{\"a\": 2}\n");
  const fs::path idx = dir / "src.jsonl.idx";
  REQUIRE(dpkit::build_jsonl_index(src, idx).lines == 2);
  const fs::path fifo = dir / "fifo.jsonl";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  const fs::path link = dir / "link-to-fifo.jsonl";
  fs::create_symlink(fifo, link);

  SUBCASE("mapped_file") {
    expect_fifo_refused(fifo, fifo, [&] { dpkit::mapped_file m(fifo); });
    expect_fifo_refused(fifo, link, [&] { dpkit::mapped_file m(link); });
  }
  SUBCASE("the source of jsonl_index::open, its index regular") {
    dpkit::jsonl_index_open_options o;
    o.index_path = idx;
    expect_fifo_refused(fifo, fifo, [&] { (void)dpkit::jsonl_index::open(fifo, o); });
    expect_fifo_refused(fifo, link, [&] { (void)dpkit::jsonl_index::open(link, o); });
  }
  SUBCASE("the index of jsonl_index::open, given or by default, also with rebuild_if_stale") {
    dpkit::jsonl_index_open_options o;
    o.index_path = fifo;
    expect_fifo_refused(fifo, fifo, [&] { (void)dpkit::jsonl_index::open(src, o); });
    o.rebuild_if_stale = true; // a FIFO index is neither read nor replaced
    expect_fifo_refused(fifo, fifo, [&] { (void)dpkit::jsonl_index::open(src, o); });
    const fs::path src2 = dir / "other.jsonl";
    data_test::write_file(src2, "{\"a\": 3}\n");
    const fs::path default_idx = dpkit::default_index_path(src2);
    REQUIRE(::mkfifo(default_idx.c_str(), 0644) == 0);
    expect_fifo_refused(default_idx, default_idx, [&] { (void)dpkit::jsonl_index::open(src2); });
    CHECK(S_ISFIFO(lstat_of(default_idx).mode));
  }
  SUBCASE("the source of build_jsonl_index and verify_jsonl_index") {
    expect_fifo_refused(fifo, fifo, [&] { (void)dpkit::build_jsonl_index(fifo, dir / "built.idx"); });
    CHECK_FALSE(fs::exists(dir / "built.idx"));
    dpkit::jsonl_index_verify_options v;
    v.index_path = idx;
    expect_fifo_refused(fifo, fifo, [&] { (void)dpkit::verify_jsonl_index(fifo, v); });
    v.index_path = fifo;
    expect_fifo_refused(fifo, fifo, [&] { (void)dpkit::verify_jsonl_index(src, v); });
  }
  SUBCASE("read_line after the source was replaced by a FIFO") {
    const auto opened = dpkit::jsonl_index::open(src);
    const fs::path moved = dir / "src.moved";
    fs::rename(src, moved);
    REQUIRE(::mkfifo(src.c_str(), 0644) == 0);
    std::string line;
    const std::string got = open_within_deadline(src, [&] { opened.read_line(0, line); });
    CAPTURE(got);
    CHECK(got.find("is another file than the one opened") != std::string::npos);
    fs::remove(src);
    fs::rename(moved, src);
  }
  fs::remove_all(dir);
}

TEST_CASE("jsonl_index hardening: read_line reads an index replaced by an identical build, refuses another") {
  // Two ranks that find an index missing both build it and rename it into
  // place; the first rank's first read_line then finds the path naming the
  // second rank's (equal) file. That once failed a 2-rank training run with a
  // stale_index_error; an index built with other options is still refused.
  const fs::path dir = fresh_dir("replaced-index");
  const fs::path src = dir / "src.jsonl";
  data_test::write_file(src, "{\"n\": 1}\n\n{\"n\": 22}\n{\"n\": 333}");
  const fs::path idx = dpkit::default_index_path(src);
  (void)dpkit::build_jsonl_index(src, idx);
  std::string line;
  SUBCASE("an identical build renamed over it: the lines of the index opened") {
    const auto opened = dpkit::jsonl_index::open(src);
    (void)dpkit::build_jsonl_index(src, dir / "again.idx");
    fs::rename(dir / "again.idx", idx);
    opened.read_line(3, line);
    CHECK(line == "{\"n\": 333}");
    opened.read_line(1, line);
    CHECK(line.empty());
  }
  SUBCASE("an index with other columns renamed over it: stale") {
    const auto opened = dpkit::jsonl_index::open(src);
    dpkit::jsonl_index_build_options o;
    o.blank_lines = dpkit::blank_line_policy::skip;
    (void)dpkit::build_jsonl_index(src, dir / "other.idx", o);
    fs::rename(dir / "other.idx", idx);
    CHECK_THROWS_AS(opened.read_line(0, line), dpkit::stale_index_error);
  }
  fs::remove_all(dir);
}

TEST_CASE("jsonl_index hardening: /dev/null as the index path is left alone") {
  // Never run this against a build without the target check: it replaced
  // /dev/null.
  if (!fs::exists("/dev/null")) return;
  const fs::path src = tmp_dir() / "devnull-src.jsonl";
  data_test::write_file(src, "{\"a\": 1}\n");
  expect_target_refused(src, "/dev/null");
  CHECK(S_ISCHR(lstat_of("/dev/null").mode));
  CHECK(lstat_of("/dev/null").rdev == makedev(1, 3));
}

TEST_CASE("jsonl_index hardening: a build killed with SIGKILL leaves no temporary file") {
  const fs::path dir = fresh_dir("killed");
  const fs::path src = dir / "big.jsonl";
  {
    // 24 M short lines (72 MB): the index is 192 MB, so writing it takes a while
    std::string block;
    for (int i = 0; i < 4096; ++i) block += "{}\n";
    std::FILE* f = std::fopen(src.c_str(), "wb");
    REQUIRE(f);
    for (int i = 0; i < 2000; ++i) std::fwrite(block.data(), 1, block.size(), f);
    std::fclose(f);
  }
  int killed_mid_build = 0;
  for (const int delay_ms : {0, 2, 10, 40, 120}) {
    CAPTURE(delay_ms);
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::close(fds[0]);
      dpkit::jsonl_index_build_options o;
      o.threads = 1;
      o.progress = [&](std::uint64_t done, std::uint64_t total) {
        if (done == total) {
          const char c = 'x'; // scan done: the write phase starts now
          (void)::write(fds[1], &c, 1);
        }
        return true;
      };
      try {
        dpkit::build_jsonl_index(src, o);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    ::close(fds[1]);
    char c = 0;
    REQUIRE(::read(fds[0], &c, 1) == 1);
    ::close(fds[0]);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(child, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    if (WIFSIGNALED(status)) ++killed_mid_build;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      CHECK_MESSAGE((name == "big.jsonl" || name == "big.jsonl.idx"), "left behind: " << name);
    }
    fs::remove(dpkit::default_index_path(src));
  }
  MESSAGE("killed mid-build " << killed_mid_build << " of 5 times");
  CHECK(killed_mid_build >= 1);
  fs::remove_all(dir);
}

TEST_CASE("jsonl_index hardening: named temporaries of dead builds are removed, live ones kept") {
  const fs::path dir = fresh_dir("stale-temps");
  const fs::path src = dir / "s.jsonl";
  data_test::write_file(src, "{}\n{}\n");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child); // now a dead pid
  const fs::path dead = dir / ("s.jsonl.idx.tmp." + std::to_string(child) + ".0badf00d");
  const fs::path live = dir / "s.jsonl.idx.tmp.1.0badf00d"; // pid 1 is alive
  const fs::path other = dir / ("other.idx.tmp." + std::to_string(child) + ".0badf00d");
  for (const auto& p : {dead, live, other}) data_test::write_file(p, "partial");
  dpkit::build_jsonl_index(src);
  CHECK(!fs::exists(dead));
  CHECK(fs::exists(live));
  CHECK(fs::exists(other));
  fs::remove_all(dir);
}
