// jsonl_index_perf: JSONL index build throughput next to `wc -l` and a plain
// memchr loop on the same (page-cached) file, and random line access latency.
//
//   jsonl_index_perf --generate 2G /tmp/big.jsonl     # write a synthetic file, then measure it
//   jsonl_index_perf FILE [--threads N] [--field num_tokens] [-r 3] [--lookups 1000000]
//
// GB/s is 1e9 bytes/s; each timing is the best of -r runs after one warm-up read;
// "cpu (s)" is the lowest user + system CPU time of those runs (wc -l: of the
// child), a second view on a shared machine where wall time includes waiting
// for a core; "x wc -l" is wc -l's wall time over the row's.
#include <dpkit/data.hpp>
#include <dpkit/data/jsonl_length_column.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

/// CPU seconds (user + system) of this process and its waited-for children.
double cpu_seconds() {
  double t = 0;
  for (const int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    rusage r{};
    ::getrusage(who, &r);
    t += static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
  }
  return t;
}

/// Lowest CPU time of the runs of the last best_of (a second view on a shared,
/// noisy machine where wall time includes waiting for a core).
double last_best_cpu = 0;

/// Best wall time of `repeat` runs of f (and the best CPU time in last_best_cpu).
double best_of(int repeat, const std::function<void()>& f) {
  double best = 1e300;
  last_best_cpu = 1e300;
  for (int i = 0; i < repeat; ++i) {
    const double c = cpu_seconds();
    const auto t = clock_type::now();
    f();
    best = std::min(best, seconds_since(t));
    last_best_cpu = std::min(last_best_cpu, cpu_seconds() - c);
  }
  return best;
}

/// Parses "2G", "512M", "100k", "12345" (binary units).
std::uint64_t parse_size(const std::string& s) {
  std::size_t pos = 0;
  const double v = std::stod(s, &pos);
  double mult = 1;
  if (pos < s.size()) {
    switch (s[pos]) {
    case 'k': case 'K': mult = 1024.0; break;
    case 'm': case 'M': mult = 1024.0 * 1024; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; break;
    case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; break;
    default: throw dpkit::invalid_argument("--generate: bad size '" + s + "' (use e.g. 2G, 512M)");
    }
  }
  return static_cast<std::uint64_t>(v * mult);
}

/// Writes about `bytes` of synthetic JSONL ({"id","text","num_tokens"}, log-normal lengths, median ~400 B).
void generate(const std::filesystem::path& path, std::uint64_t bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw dpkit::error("cannot create '" + path.string() + "': " + std::strerror(errno));
  std::mt19937_64 rng(12345);
  std::lognormal_distribution<double> len(std::log(350.0), 0.8);
  static const char* words[] = {"data", "parallel", "training", "gradient", "bucket", "ring", "tree", "rank", "epoch",
                                "sampler", "token", "budget", "index", "offset", "package", "library", "the", "a", "of", "and"};
  std::string buf, text;
  std::uint64_t written = 0, id = 0;
  while (written < bytes) {
    const auto target = static_cast<std::size_t>(std::clamp(len(rng), 20.0, 200000.0));
    text.clear();
    while (text.size() < target) {
      text += words[rng() % 20];
      text += ' ';
    }
    buf += "{\"id\": " + std::to_string(id++) + ", \"text\": \"" + text + "\", \"num_tokens\": " + std::to_string(target / 5 + 1) + "}\n";
    if (buf.size() > (8u << 20)) {
      std::fwrite(buf.data(), 1, buf.size(), f);
      written += buf.size();
      buf.clear();
    }
  }
  std::fwrite(buf.data(), 1, buf.size(), f);
  std::fclose(f);
}

std::uint64_t memchr_count(const dpkit::mapped_file& m) {
  std::uint64_t n = 0;
  const char* p = m.data();
  const char* end = p + m.size();
  while (p < end) {
    const void* q = std::memchr(p, '\n', static_cast<std::size_t>(end - p));
    if (!q) break;
    ++n;
    p = static_cast<const char*>(q) + 1;
  }
  return n;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"jsonl_index_perf: JSONL index build GB/s vs wc -l and memchr; random access ns/line"};
  std::string file, gen_size, field;
  unsigned threads = 0;
  int repeat = 3;
  std::uint64_t lookups = 1'000'000;
  app.add_option("FILE", file, "JSONL file (written first with --generate)")->required();
  app.add_option("--generate", gen_size, "write a synthetic JSONL of this size to FILE first (e.g. 2G)");
  app.add_option("--threads", threads, "build threads for the threaded run (0 = all cores)");
  app.add_option("--field", field, "also time a build with this JSON length column (simdjson)");
  app.add_option("-r,--repeat", repeat, "runs per timing (best is reported)")->default_val(3);
  app.add_option("--lookups", lookups, "random line lookups")->default_val(1000000);
  CLI11_PARSE(app, argc, argv);
  try {
    if (!gen_size.empty()) {
      const auto t = clock_type::now();
      generate(file, parse_size(gen_size));
      std::printf("# generated %s: %llu bytes in %.2f s\n", file.c_str(),
                  static_cast<unsigned long long>(std::filesystem::file_size(file)), seconds_since(t));
    }
    const unsigned hw = threads ? threads : std::max(1u, std::thread::hardware_concurrency());
    std::uint64_t lines = 0;
    double t_memchr = 0, c_memchr = 0;
    std::uint64_t size = 0;
    {
      const dpkit::mapped_file m(file, dpkit::access_advice::sequential);
      size = m.size();
      lines = memchr_count(m); // warm the page cache
      t_memchr = best_of(repeat, [&] { lines = memchr_count(m); });
      c_memchr = last_best_cpu;
    }
    const std::string cmd = "wc -l < '" + file + "' > /dev/null";
    const double t_wc = best_of(repeat, [&] {
      if (std::system(cmd.c_str()) != 0) throw dpkit::error("wc -l failed");
    });
    const auto idx_path = dpkit::default_index_path(file);
    dpkit::jsonl_index_build_options o1;
    o1.threads = 1;
    const double c_wc = last_best_cpu;
    const double t_b1 = best_of(repeat, [&] { dpkit::build_jsonl_index(file, idx_path, o1); });
    const double c_b1 = last_best_cpu;
    dpkit::jsonl_index_build_options on;
    on.threads = hw;
    const double t_bn = best_of(repeat, [&] { dpkit::build_jsonl_index(file, idx_path, on); });
    const double c_bn = last_best_cpu;
    dpkit::jsonl_index_build_options o1n = o1, onn = on; // without fsync: the scan and write alone
    o1n.sync = onn.sync = false;
    const double t_b1n = best_of(repeat, [&] { dpkit::build_jsonl_index(file, idx_path, o1n); });
    const double c_b1n = last_best_cpu;
    const double t_bnn = best_of(repeat, [&] { dpkit::build_jsonl_index(file, idx_path, onn); });
    const double c_bnn = last_best_cpu;
    double t_field = 0;
    if (!field.empty()) {
      dpkit::jsonl_index_build_options of;
      of.threads = hw;
      of.length_column = dpkit::json_length_column(field);
      t_field = best_of(1, [&] { dpkit::build_jsonl_index(file, idx_path, of); });
    }
    const auto idx_bytes = std::filesystem::file_size(idx_path);
    const auto gbs = [&](double t) { return static_cast<double>(size) / t / 1e9; };
    std::printf("# file %s: %llu bytes, %llu lines, %u hardware threads\n", file.c_str(), static_cast<unsigned long long>(size),
                static_cast<unsigned long long>(lines), std::thread::hardware_concurrency());
    std::printf("%-36s %10s %10s %10s %12s\n", "# pass (warm page cache)", "time (s)", "GB/s", "cpu (s)", "x wc -l");
    const auto row = [&](const std::string& name, double t, double c) {
      std::printf("%-36s %10.3f %10.2f %10.3f %12.2f\n", name.c_str(), t, gbs(t), c, t_wc / t);
    };
    row("memchr loop (1 thread)", t_memchr, c_memchr);
    row("wc -l", t_wc, c_wc);
    row("build_jsonl_index (1 thread)", t_b1, c_b1);
    row("build_jsonl_index (" + std::to_string(hw) + " threads)", t_bn, c_bn);
    row("  no fsync (1 thread)", t_b1n, c_b1n);
    row("  no fsync (" + std::to_string(hw) + " threads)", t_bnn, c_bnn);
    if (!field.empty())
      std::printf("%-36s %10.3f %10.2f\n", ("  + column " + field + " (" + std::to_string(hw) + " threads)").c_str(), t_field, gbs(t_field));
    // random access on the plain index
    dpkit::build_jsonl_index(file, idx_path, on);
    const auto idx_plain_bytes = std::filesystem::file_size(idx_path);
    const auto t_open = clock_type::now();
    const auto idx = dpkit::jsonl_index::open(file);
    const double open_s = seconds_since(t_open);
    // staleness checks at open (size, mtime, head/tail fingerprint, device,
    // inode, ctime: O(1)) vs the content check used only when the source's
    // identity changed and the caller asked for it (one read of the source)
    dpkit::jsonl_index_open_options fast;
    fast.verify_checksum = false;
    const double open_fast_s = best_of(repeat, [&] { (void)dpkit::jsonl_index::open(file, fast); });
    const double content_s = best_of(repeat, [&] { (void)dpkit::detail::source_content_hash(idx.source().view()); });
    std::printf("# open: %.6f s without body checksum (%.2f%% of the 1-thread build), %.3f s with it (%.1f%%); content check "
                "when the source moved: %.3f s (%.0f%%)\n",
                open_fast_s, 100 * open_fast_s / t_b1, open_s, 100 * open_s / t_b1, content_s, 100 * content_s / t_b1);
    std::mt19937_64 rng(7);
    std::vector<std::uint64_t> ks(lookups);
    for (auto& k : ks) k = idx.size() ? rng() % idx.size() : 0;
    std::uint64_t sink = 0;
    const double t_rand = idx.size() ? best_of(repeat, [&] {
      for (auto k : ks) {
        const auto line = idx[k];
        sink += line.size() + static_cast<unsigned char>(line.empty() ? 0 : line[0]);
      }
    })
                                     : 0;
    std::printf("# index: %llu bytes (%.2f bytes/line; %.2f with the u32 column), open with checksum %.3f s\n",
                static_cast<unsigned long long>(idx_plain_bytes), static_cast<double>(idx_plain_bytes) / static_cast<double>(lines ? lines : 1),
                field.empty() ? 0.0 : static_cast<double>(idx_bytes) / static_cast<double>(lines ? lines : 1), open_s);
    std::printf("# random access: %llu lookups (offset + first byte), %.1f ns/line (sink %llu)\n",
                static_cast<unsigned long long>(lookups), t_rand / static_cast<double>(lookups ? lookups : 1) * 1e9,
                static_cast<unsigned long long>(sink % 10));
    std::filesystem::remove(idx_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "jsonl_index_perf: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
