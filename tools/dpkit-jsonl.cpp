// dpkit-jsonl: build, check and inspect JSONL line indices; preview token-budget
// batches. Subcommands: index, verify, stats, get, batches (see --help and
// docs/data.md).
#include <dpkit/data.hpp>
#include <dpkit/data/jsonl_length_column.hpp>

#include <CLI/CLI.hpp>

#include "run_main.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

/// Progress bar on stderr when it is a terminal.
dpkit::build_progress make_progress_bar(const std::string& label) {
  if (!::isatty(STDERR_FILENO)) return {};
  const auto start = std::chrono::steady_clock::now();
  return [label, start](std::uint64_t done, std::uint64_t total) {
    const double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int width = 30;
    const int fill = static_cast<int>(frac * width);
    std::fprintf(stderr, "\r%s [%s%s] %5.1f%% %8.1f MB/s", label.c_str(), std::string(static_cast<std::size_t>(fill), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - fill), '.').c_str(), 100.0 * frac,
                 secs > 0 ? static_cast<double>(done) / secs / 1e6 : 0.0);
    if (done == total) std::fputc('\n', stderr);
    std::fflush(stderr);
    return true;
  };
}

std::uint64_t percentile(const std::vector<std::uint64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  // nearest rank
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

/// Set by --check-content: a source that moved (new inode or ctime, same size
/// and mtime) is compared by content hash instead of refused as stale.
bool check_content = false;

dpkit::jsonl_index open_index(const std::string& file, const std::string& index) {
  dpkit::jsonl_index_open_options o;
  o.index_path = index;
  o.check_content_if_moved = check_content;
  return dpkit::jsonl_index::open(file, o);
}

int jsonl_main(int argc, char** argv) {
  CLI::App app{"dpkit-jsonl: line indices for JSONL files (index, verify, stats, get, batches)"};
  app.require_subcommand(1);
  std::string file, index_path;

  auto* index = app.add_subcommand("index", "build FILE's index (default path FILE.idx)");
  std::string field;
  unsigned threads = 0;
  bool skip_blank = false;
  std::optional<std::uint32_t> missing_default;
  index->add_option("FILE", file, "JSONL file")->required()->check(CLI::ExistingFile);
  index->add_option("--field", field, "JSON field of a u32 length column, e.g. num_tokens");
  index->add_option("--threads", threads, "build threads (0 = all cores)");
  index->add_flag("--skip-blank", skip_blank, "leave blank lines out of the index");
  index->add_option("--missing-default", missing_default, "value for lines without --field (default: error)");
  bool skip_missing = false;
  index->add_flag("--skip-missing", skip_missing,
                  "keep lines without --field with no length; token-budget batches leave them out")
      ->excludes("--missing-default");

  auto* verify = app.add_subcommand("verify", "check FILE's index against FILE (offsets, counts, length column)");
  verify->add_option("FILE", file, "JSONL file")->required()->check(CLI::ExistingFile);
  verify->add_option("--index", index_path, "index path (default FILE.idx)");

  auto* stats = app.add_subcommand("stats", "lines, bytes and length percentiles");
  stats->add_option("FILE", file, "JSONL file")->required()->check(CLI::ExistingFile);
  stats->add_option("--index", index_path, "index path (default FILE.idx)");

  auto* get = app.add_subcommand("get", "print line N (0-based)");
  std::uint64_t line_no = 0;
  get->add_option("FILE", file, "JSONL file")->required()->check(CLI::ExistingFile);
  get->add_option("N", line_no, "line number (0-based)")->required();
  get->add_option("--index", index_path, "index path (default FILE.idx)");

  auto* batches = app.add_subcommand("batches", "token-budget batches of one rank from the length column");
  dpkit::token_budget_options tb;
  std::uint64_t world = 1, rank = 0, epoch = 0;
  bool no_shuffle = false, drop = false;
  batches->add_option("FILE", file, "JSONL file")->required()->check(CLI::ExistingFile);
  batches->add_option("--index", index_path, "index path (default FILE.idx)");
  batches->add_option("--max-tokens", tb.max_tokens, "token budget per batch (max_len x count)")->required();
  batches->add_option("--world", world, "world size")->required();
  batches->add_option("--rank", rank, "rank")->required();
  batches->add_option("--epoch", epoch, "epoch")->default_val(0);
  batches->add_option("--seed", tb.seed, "seed")->default_val(0);
  batches->add_option("--max-sample-tokens", tb.max_sample_tokens, "per-sample limit (longer samples are skipped)")->default_val(2048);
  batches->add_option("--max-batch-size", tb.max_batch_size, "at most this many samples per batch")->default_val(200);
  batches->add_option("--sort-size", tb.sort_size, "sort buffer = sort-size x world")->default_val(1024);
  batches->add_option("--batch-size-multiple", tb.batch_size_multiple, "fairseq's required_batch_size_multiple")->default_val(1);
  batches->add_flag("--no-shuffle", no_shuffle, "keep file order (and batch order)");
  batches->add_flag("--drop", drop, "drop tail batches instead of padding ranks");

  for (auto* sub : {verify, stats, get, batches})
    sub->add_flag("--check-content", check_content,
                  "if FILE was copied or restored (new inode/ctime, same size and mtime), compare its content hash "
                  "(one read of FILE) instead of refusing the index as stale");
  index->add_option("--index", index_path, "index path (default FILE.idx); an existing path must be a regular file")
      ->expected(1);

  CLI11_PARSE(app, argc, argv);

  {
    if (*index) {
      dpkit::jsonl_index_build_options o;
      o.threads = threads;
      o.blank_lines = skip_blank ? dpkit::blank_line_policy::skip : dpkit::blank_line_policy::keep;
      if (!field.empty()) {
        dpkit::json_length_column_options jo;
        if (missing_default) {
          jo.missing = dpkit::missing_field_policy::default_value;
          jo.default_value = *missing_default;
        } else if (skip_missing) {
          jo.missing = dpkit::missing_field_policy::skip;
        }
        o.length_column = dpkit::json_length_column(field, jo);
      }
      o.progress = make_progress_bar("indexing " + file);
      const auto start = std::chrono::steady_clock::now();
      const auto r = index_path.empty() ? dpkit::build_jsonl_index(file, o) : dpkit::build_jsonl_index(file, index_path, o);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%s: %llu lines, %llu bytes, index %s (%llu bytes, %.2f bytes/line), %.3f s, %.2f GB/s%s%s\n", file.c_str(),
                  static_cast<unsigned long long>(r.lines), static_cast<unsigned long long>(r.source_bytes), r.index_path.c_str(),
                  static_cast<unsigned long long>(r.index_bytes),
                  r.lines ? static_cast<double>(r.index_bytes) / static_cast<double>(r.lines) : 0.0, secs,
                  static_cast<double>(r.source_bytes) / secs / 1e9, field.empty() ? "" : ", column ", field.c_str());
    } else if (*verify) {
      dpkit::jsonl_index_verify_options vo;
      vo.index_path = index_path;
      const auto idx = open_index(file, index_path);
      if (idx.has_lengths()) vo.length_column = dpkit::json_length_column(idx.length_column_name());
      vo.check_content_if_moved = check_content;
      const std::uint64_t n = dpkit::verify_jsonl_index(file, vo);
      std::printf("%s: OK, %llu lines%s%s\n", idx.index_path().c_str(), static_cast<unsigned long long>(n),
                  idx.has_lengths() ? ", column re-parsed: " : "", idx.length_column_name().c_str());
    } else if (*stats) {
      const auto idx = open_index(file, index_path);
      std::vector<std::uint64_t> v(idx.size());
      std::uint64_t sum = 0;
      for (std::uint64_t k = 0; k < idx.size(); ++k) {
        v[k] = idx.has_lengths() ? idx.lengths()[k] : idx[k].size();
        sum += v[k];
      }
      std::sort(v.begin(), v.end());
      std::printf("file          %s\nindex         %s (%zu bytes)\nlines         %llu\nsource lines  %llu\nbytes         %zu\n",
                  file.c_str(), idx.index_path().c_str(), idx.index_file().size(), static_cast<unsigned long long>(idx.size()),
                  static_cast<unsigned long long>(idx.source_line_count()), idx.source().size());
      const std::string what = idx.has_lengths() ? "column " + idx.length_column_name() : std::string("line bytes");
      std::printf("lengths       %s\nsum           %llu\nmin           %llu\np50           %llu\np90           %llu\np99           %llu\nmax           %llu\n",
                  what.c_str(), static_cast<unsigned long long>(sum), static_cast<unsigned long long>(v.empty() ? 0 : v.front()),
                  static_cast<unsigned long long>(percentile(v, 0.50)), static_cast<unsigned long long>(percentile(v, 0.90)),
                  static_cast<unsigned long long>(percentile(v, 0.99)), static_cast<unsigned long long>(v.empty() ? 0 : v.back()));
    } else if (*get) {
      const auto idx = open_index(file, index_path);
      const std::string_view line = idx.at(line_no);
      std::fwrite(line.data(), 1, line.size(), stdout);
      std::fputc('\n', stdout);
    } else if (*batches) {
      const auto idx = open_index(file, index_path);
      if (!idx.has_lengths())
        throw dpkit::invalid_argument("batches: index '" + idx.index_path().string() +
                                      "' has no length column; build it with: dpkit-jsonl index " + file + " --field num_tokens");
      tb.shuffle = tb.shuffle_batches = !no_shuffle;
      tb.balance = drop ? dpkit::rank_balance::drop : dpkit::rank_balance::pad;
      const auto lengths = idx.lengths();
      dpkit::token_budget_batch_sampler s(lengths, world, rank, tb);
      s.set_epoch(epoch);
      std::uint64_t real = 0, padded = 0, samples = 0, pads = 0, max_batch = 0;
      for (std::uint64_t k = 0; k < s.num_batches(); ++k) {
        const auto b = s.batch(k);
        std::uint64_t max_len = 0;
        for (auto i : b) {
          real += s.budget_length(i);
          max_len = std::max(max_len, s.budget_length(i));
        }
        padded += max_len * b.size();
        samples += b.size();
        pads += s.is_padding(k);
        max_batch = std::max<std::uint64_t>(max_batch, b.size());
      }
      std::printf("rank %llu of %llu, epoch %llu, max_tokens %llu\n", static_cast<unsigned long long>(rank),
                  static_cast<unsigned long long>(world), static_cast<unsigned long long>(epoch),
                  static_cast<unsigned long long>(tb.max_tokens));
      std::printf("batches             %llu (per rank; plan %llu over all ranks, %llu padding batches on this rank)\n",
                  static_cast<unsigned long long>(s.num_batches()), static_cast<unsigned long long>(s.total_batches()),
                  static_cast<unsigned long long>(pads));
      std::printf("samples             %llu on this rank (%llu kept, %llu skipped over %llu tokens, all ranks)\n",
                  static_cast<unsigned long long>(samples), static_cast<unsigned long long>(s.kept_samples()),
                  static_cast<unsigned long long>(s.skipped()), static_cast<unsigned long long>(s.sample_limit()));
      std::printf("mean batch size     %.2f (max %llu)\n", s.num_batches() ? static_cast<double>(samples) / static_cast<double>(s.num_batches()) : 0.0,
                  static_cast<unsigned long long>(max_batch));
      std::printf("padding efficiency  %.4f (real tokens %llu / sum(max_len x count) %llu)\n",
                  padded ? static_cast<double>(real) / static_cast<double>(padded) : 0.0, static_cast<unsigned long long>(real),
                  static_cast<unsigned long long>(padded));
    }
  }
  return 0;
}

} // namespace

// An error prints "dpkit-jsonl: <what>" ("dpkit-jsonl: rank R: <what>" under
// mpirun) and exits 1 (examples/run_main.hpp).
int main(int argc, char** argv) {
  return dpkit_programs::run_main("dpkit-jsonl", [&] { return jsonl_main(argc, argv); });
}
