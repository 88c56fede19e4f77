// scale_perf: the seed's dataset end to end at its scale (2e8 lines). Generates
// (or reuses) an N-line JSONL file with a length field, then times, each phase
// in its own forked process so that its peak RSS is its own:
//   wc -l              the file, as a subprocess (the speed reference of the index build)
//   index build        dpkit::build_jsonl_index with the num_tokens length column (-t threads)
//   index write floor  writing as many bytes as the index has to a new file beside it (1 MiB
//                      pwrites, then fsync as the build does): what no index build can beat
//   torch.randperm(N)  dpkit::torch_randperm_fill into int64 (torch's C++ equivalent; the sampler's reference)
//   rank               what one rank does: open the index (mapped, checksum not read), plan one
//                      epoch of the token-budget sampler (sample_shuffle::feistel, all cores),
//                      read --batches random batches' lines through the index
// and prints time, ratio, peak RSS (getrusage of the child; VmHWM after each
// step of the rank) and bytes per line.
//
//   scale_perf [-n 2e8] [-t 1] [--dir /tmp] [--batches 4000] [--world 1] [--rank 0]
//              [--max-tokens 4096] [--plan-threads 0] [--mapped-reads] [--torch-plan] [--keep-index]
#include <dpkit/data.hpp>
#include <dpkit/data/jsonl_length_column.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <stdexcept>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

/// VmHWM of this process in MiB (peak resident set so far), from /proc/self/status.
double vm_hwm_mib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
  return -1;
}

/// kB value of a /proc/self/status field ("RssAnon:", "RssFile:"), in MiB.
double status_mib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::size_t len = std::strlen(field);
  while (std::getline(in, line))
    if (line.compare(0, len, field) == 0) return std::strtod(line.c_str() + len, nullptr) / 1024.0;
  return -1;
}

/// User + system CPU seconds of this process so far (all threads).
double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/// Length of line i of the generated file: mostly 20..275 tokens, 1 in 64 up to ~4300.
std::uint32_t line_length(std::uint64_t i) {
  const std::uint64_t r = dpkit::detail::sampler_mix64(i + 0x5eed);
  return static_cast<std::uint32_t>(20 + (r & 255) + (((r >> 8) & 63) == 0 ? (r >> 16) % 4000 : 0));
}

unsigned digits(std::uint32_t v) {
  unsigned d = 1;
  while (v >= 10) {
    v /= 10;
    ++d;
  }
  return d;
}

/// Bytes of the generated file: each line is {"num_tokens":L}\n.
std::uint64_t expected_bytes(std::uint64_t n) {
  std::uint64_t b = 0;
  for (std::uint64_t i = 0; i < n; ++i) b += 16 + digits(line_length(i));
  return b;
}

/// Throws unless `p` is absent or a regular file (never overwrite a device, fifo, directory, ...).
void require_regular_or_absent(const fs::path& p) {
  std::error_code ec;
  const auto st = fs::symlink_status(p, ec);
  if (ec || !fs::exists(st)) return;
  if (!fs::is_regular_file(st)) throw std::runtime_error("scale_perf: '" + p.string() + "' exists and is not a regular file; refusing to overwrite it");
}

/// Writes the N-line file to a temporary name and renames it into place (never half-written).
void generate(const fs::path& path, std::uint64_t n) {
  const fs::path tmp = path.string() + ".tmp";
  require_regular_or_absent(tmp);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error("scale_perf: cannot create '" + tmp.string() + "': " + std::strerror(errno));
  std::vector<char> buf(std::size_t{16} << 20);
  std::size_t used = 0;
  bool ok = true;
  for (std::uint64_t i = 0; i < n && ok; ++i) {
    if (used + 32 > buf.size()) {
      ok = std::fwrite(buf.data(), 1, used, f) == used;
      used = 0;
    }
    std::memcpy(buf.data() + used, "{\"num_tokens\":", 14);
    used += 14;
    const std::uint32_t len = line_length(i);
    const unsigned d = digits(len);
    std::uint32_t v = len;
    for (unsigned k = 0; k < d; ++k) {
      buf[used + d - 1 - k] = static_cast<char>('0' + v % 10);
      v /= 10;
    }
    used += d;
    buf[used++] = '}';
    buf[used++] = '\n';
  }
  ok = ok && std::fwrite(buf.data(), 1, used, f) == used;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    fs::remove(tmp);
    throw std::runtime_error("scale_perf: writing '" + tmp.string() + "' failed (disk full?)");
  }
  fs::rename(tmp, path);
}

/// What a forked phase sends back through its pipe.
struct phase_result {
  double seconds = 0;
  double value[12] = {};
  char error[200] = {0};
};

struct phase_report {
  phase_result r;
  double peak_mib = 0; // ru_maxrss of the child
  double cpu = 0;      // user + system seconds of the child
};

/// Runs `body` in a forked child; returns its result and peak RSS.
phase_report run_forked(const std::function<void(phase_result&)>& body) {
  int fd[2];
  if (::pipe(fd) != 0) throw std::runtime_error("scale_perf: pipe failed");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("scale_perf: fork failed");
  if (pid == 0) {
    ::close(fd[0]);
    phase_result r;
    try {
      body(r);
    } catch (const std::exception& e) {
      std::snprintf(r.error, sizeof r.error, "%s", e.what());
    }
    const ssize_t w = ::write(fd[1], &r, sizeof r);
    std::fflush(nullptr);
    ::_exit(w == static_cast<ssize_t>(sizeof r) ? 0 : 1);
  }
  ::close(fd[1]);
  phase_report rep;
  const ssize_t got = ::read(fd[0], &rep.r, sizeof rep.r);
  ::close(fd[0]);
  int status = 0;
  rusage ru{};
  ::wait4(pid, &status, 0, &ru);
  if (got != static_cast<ssize_t>(sizeof rep.r) || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("scale_perf: a phase died (killed for memory?)");
  if (rep.r.error[0] != 0) throw std::runtime_error(rep.r.error);
  rep.peak_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;
  rep.cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  return rep;
}

void row(const char* phase, double seconds, double cpu, const std::string& ratio, double peak_mib, const std::string& note) {
  std::printf("| %-34s | %9.2f | %9.2f | %-26s | %9.0f | %s\n", phase, seconds, cpu, ratio.c_str(), peak_mib, note.c_str());
  std::fflush(stdout);
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"scale_perf: N-line JSONL end to end (generate, wc -l, index, randperm, token-budget plan, random batches)"};
  double n_d = 2e8;
  unsigned threads = 1;
  std::string dir = "/tmp";
  std::uint64_t batches = 4000, world = 1, rank = 0, max_tokens = 4096;
  unsigned plan_threads = 0;
  bool mapped_reads = false;
  bool torch_plan = false, keep_index = false, reuse_index = false;
  app.add_option("-n,--lines", n_d, "lines of the generated JSONL (e.g. 2e8, 2e6)")->default_val(2e8);
  app.add_option("-t,--threads", threads, "index build threads")->default_val(1);
  app.add_option("--dir", dir, "directory of the generated file and its index")->default_val("/tmp");
  app.add_option("--batches", batches, "random batches the rank reads")->default_val(4000);
  app.add_option("--world", world, "world size of the sampler")->default_val(1);
  app.add_option("--rank", rank, "rank measured")->default_val(0);
  app.add_option("--max-tokens", max_tokens, "token budget per batch")->default_val(4096);
  app.add_option("--plan-threads", plan_threads, "sampler plan threads (0 = all cores)")->default_val(0);
  app.add_flag("--mapped-reads", mapped_reads, "read the batches' lines through the mapping (operator[]) instead of read_line (pread)");
  app.add_flag("--torch-plan", torch_plan, "also plan with sample_shuffle::torch_randperm (the seed's order)");
  app.add_flag("--keep-index", keep_index, "keep the index file afterwards");
  app.add_flag("--reuse-index", reuse_index, "do not rebuild an existing index (kept by --keep-index); implies --keep-index");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto n = static_cast<std::uint64_t>(n_d);
    if (n == 0) throw std::runtime_error("scale_perf: -n must be >= 1");
    const fs::path file = fs::path(dir) / ("dpkit_scale_" + std::to_string(n) + ".jsonl");
    const fs::path index = file.string() + ".idx";
    require_regular_or_absent(file);
    require_regular_or_absent(index);

    std::printf("# scale_perf: %llu lines, index threads %u, plan threads %s, world %llu rank %llu, max_tokens %llu, %u hardware threads\n",
                static_cast<unsigned long long>(n), threads, plan_threads ? std::to_string(plan_threads).c_str() : "all",
                static_cast<unsigned long long>(world), static_cast<unsigned long long>(rank),
                static_cast<unsigned long long>(max_tokens), std::thread::hardware_concurrency());
    std::printf("# time: wall seconds; cpu: user + system seconds of all threads (the machine may be shared: compare cpu too)\n");
    std::printf("| %-34s | %9s | %9s | %-26s | %9s | %s\n", "phase", "time (s)", "cpu (s)", "ratio (wall; cpu)", "peak MiB", "notes");
    std::printf("|%s|%s|%s|%s|%s|%s\n", std::string(36, '-').c_str(), std::string(11, '-').c_str(), std::string(11, '-').c_str(),
                std::string(28, '-').c_str(), std::string(11, '-').c_str(), "------");

    // 1. the file
    const std::uint64_t want = expected_bytes(n);
    std::error_code ec;
    if (fs::is_regular_file(file, ec) && fs::file_size(file) == want) {
      row("generate (reused)", 0, 0, "", 0, file.string() + ", " + std::to_string(want) + " bytes");
    } else {
      const auto g = run_forked([&](phase_result& r) {
        const auto t0 = clock_type::now();
        generate(file, n);
        r.seconds = seconds_since(t0);
      });
      row("generate", g.r.seconds, g.cpu, "", g.peak_mib, file.string() + ", " + std::to_string(want) + " bytes");
    }
    const double bytes_per_line = static_cast<double>(want) / static_cast<double>(n);

    // 2. wc -l (twice: the first warms the page cache, the second is reported)
    const std::string cmd = "wc -l < '" + file.string() + "' > /dev/null";
    double t_wc = 0, cpu_wc = 0;
    for (int k = 0; k < 2; ++k) {
      rusage before{}, after{};
      ::getrusage(RUSAGE_CHILDREN, &before);
      const auto t0 = clock_type::now();
      if (std::system(cmd.c_str()) != 0) throw std::runtime_error("scale_perf: wc -l failed");
      t_wc = seconds_since(t0);
      ::getrusage(RUSAGE_CHILDREN, &after);
      const auto secs = [](const rusage& r) {
        return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
      };
      cpu_wc = secs(after) - secs(before);
    }
    row("wc -l (subprocess, warm cache)", t_wc, cpu_wc, "1.00x", 0, fmt("%.2f GB/s", static_cast<double>(want) / t_wc / 1e9));

    // 3. index build with the length column
    if (reuse_index) keep_index = true;
    if (reuse_index && fs::is_regular_file(index, ec)) {
      row("index build (reused)", 0, 0, "", 0, index.string());
    } else {
    const auto b = run_forked([&](phase_result& r) {
      dpkit::jsonl_index_build_options o;
      o.threads = threads;
      o.length_column = dpkit::json_length_column("num_tokens");
      const auto t0 = clock_type::now();
      const auto res = dpkit::build_jsonl_index(file, index, o);
      r.seconds = seconds_since(t0);
      r.value[0] = static_cast<double>(res.index_bytes);
      r.value[1] = static_cast<double>(res.lines);
    });
    if (static_cast<std::uint64_t>(b.r.value[1]) != n) throw std::runtime_error("scale_perf: the index has the wrong line count");
    row(("index build (-t " + std::to_string(threads) + ")").c_str(), b.r.seconds, b.cpu,
        fmt("%.2fx wc -l speed", t_wc / b.r.seconds) + fmt("; %.2fx", cpu_wc / b.cpu),
        b.peak_mib, fmt("index %.2f B/line", b.r.value[0] / static_cast<double>(n)) + fmt(", source %.2f B/line", bytes_per_line));
    }

    // 3b. the floor of any build of this index: writing its bytes (the
    // offsets and the column; 12 bytes per line against the source's ~19)
    // to a new unnamed file beside it, and fsync as the build does
    {
      const std::uint64_t index_bytes = fs::is_regular_file(index, ec) ? fs::file_size(index) : 12 * n;
      const auto w = run_forked([&](phase_result& r) {
        const fs::path dir = fs::absolute(index).parent_path();
        const int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
        if (fd < 0) throw std::runtime_error("scale_perf: cannot create an unnamed file in " + dir.string());
        std::vector<char> block(std::size_t{1} << 20, 'Z');
        const auto t0 = clock_type::now();
        for (std::uint64_t at = 0; at < index_bytes;) {
          const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(block.size(), index_bytes - at));
          const ssize_t wr = ::pwrite(fd, block.data(), k, static_cast<off_t>(at));
          if (wr <= 0) throw std::runtime_error("scale_perf: write failed in " + dir.string());
          at += static_cast<std::uint64_t>(wr);
        }
        r.value[0] = seconds_since(t0);
        ::fsync(fd);
        r.seconds = seconds_since(t0);
        ::close(fd);
      });
      row("index write floor (same bytes)", w.r.seconds, w.cpu, fmt("%.2fx wc -l speed", t_wc / w.r.seconds), w.peak_mib,
          fmt("%.2f GB: ", static_cast<double>(index_bytes) / 1e9) + fmt("pwrite %.2f s", w.r.value[0]) +
              fmt(" + fsync %.2f s", w.r.seconds - w.r.value[0]));
    }

    // 4. torch.randperm(N) (dpkit's bit-exact engine, int64 like torch's tensor)
    const auto p = run_forked([&](phase_result& r) {
      const auto t0 = clock_type::now();
      std::vector<std::int64_t> perm(n);
      dpkit::torch_randperm_fill(std::span<std::int64_t>(perm), 1);
      r.seconds = seconds_since(t0);
      r.value[0] = static_cast<double>(perm[n / 2]);
    });
    row("torch.randperm(N) (torch_randperm)", p.r.seconds, p.cpu, "1.00x", p.peak_mib, "the seed's shuffle, one serial pass");

    // 5. one rank: open, plan, random batches
    const auto run_rank = [&](dpkit::sample_shuffle shuffle) {
      return run_forked([&](phase_result& r) {
        const auto t0 = clock_type::now();
        const double c0 = cpu_seconds();
        dpkit::jsonl_index_open_options oo;
        oo.index_path = index;
        oo.verify_checksum = false; // O(1) open: mapped, not read
        const auto idx = dpkit::jsonl_index::open(file, oo);
        r.value[0] = seconds_since(t0);
        r.value[1] = vm_hwm_mib();
        r.value[6] = cpu_seconds() - c0;
        dpkit::token_budget_options o;
        o.max_tokens = max_tokens;
        o.shuffle_with = shuffle;
        o.threads = plan_threads;
        const auto t1 = clock_type::now();
        const double c1 = cpu_seconds();
        dpkit::token_budget_batch_sampler s(idx.lengths(), world, rank, o);
        r.value[2] = seconds_since(t1);
        r.value[3] = vm_hwm_mib();
        r.value[7] = cpu_seconds() - c1;
        r.value[8] = status_mib("RssAnon:");
        r.value[9] = status_mib("RssFile:");
        std::mt19937_64 rng(7);
        const auto t2 = clock_type::now();
        const double c2 = cpu_seconds();
        std::uint64_t lines = 0, sink = 0;
        std::string buf;
        for (std::uint64_t k = 0; k < batches && s.num_batches() > 0; ++k) {
          for (const std::uint64_t i : s.batch(rng() % s.num_batches())) {
            std::string_view line;
            if (mapped_reads) {
              line = idx[i];
            } else {
              idx.read_line(i, buf);
              line = buf;
            }
            sink += static_cast<unsigned char>(line[line.size() / 2]);
            ++lines;
          }
        }
        r.value[4] = seconds_since(t2);
        r.value[10] = cpu_seconds() - c2;
        r.value[11] = status_mib("RssAnon:");
        r.value[5] = static_cast<double>(lines);
        volatile std::uint64_t keep = sink; // the reads are not optimized away
        (void)keep;
        r.seconds = seconds_since(t0);
        std::printf("|   (plan: %llu batches, %llu per rank, %llu skipped; %llu lines read)\n",
                    static_cast<unsigned long long>(s.total_batches()), static_cast<unsigned long long>(s.num_batches()),
                    static_cast<unsigned long long>(s.skipped()), static_cast<unsigned long long>(lines));
      });
    };
    const auto rk = run_rank(dpkit::sample_shuffle::feistel);
    const auto plan_ratio = [&](const phase_report& x) {
      return fmt("%.3fx randperm", x.r.value[2] / p.r.seconds) + fmt("; %.3fx", x.r.value[7] / p.cpu);
    };
    row("rank: open index (mapped)", rk.r.value[0], rk.r.value[6], "", rk.r.value[1], "checksum not read (O(1) open)");
    row("rank: plan epoch (feistel order)", rk.r.value[2], rk.r.value[7], plan_ratio(rk), rk.r.value[3],
        fmt("%.2f B/line peak", rk.r.value[3] * 1048576.0 / static_cast<double>(n)) +
            fmt("; after: RssAnon %.0f MiB", rk.r.value[8]) + fmt(", RssFile %.0f MiB (mapped index)", rk.r.value[9]));
    row(("rank: read " + std::to_string(batches) + " random batches" + (mapped_reads ? " (mapped)" : " (pread)")).c_str(), rk.r.value[4], rk.r.value[10], "", rk.peak_mib,
        fmt("%.1f us/batch", rk.r.value[4] / static_cast<double>(std::max<std::uint64_t>(batches, 1)) * 1e6) +
            fmt(", %.0f lines", rk.r.value[5]) + fmt("; after: RssAnon %.0f MiB", rk.r.value[11]));
    row("rank: whole run", rk.r.seconds, rk.cpu, "", rk.peak_mib,
        fmt("peak RSS %.2f B/line (lengths column: 4)", rk.peak_mib * 1048576.0 / static_cast<double>(n)));
    if (torch_plan) {
      const auto rt = run_rank(dpkit::sample_shuffle::torch_randperm);
      row("rank: plan epoch (torch order)", rt.r.value[2], rt.r.value[7], plan_ratio(rt), rt.r.value[3],
          "the seed's order: randperm + counts");
    }
    if (!keep_index) fs::remove(index);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
