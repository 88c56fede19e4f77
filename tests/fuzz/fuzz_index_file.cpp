// libFuzzer harness: arbitrary bytes as a JSONL index file, opened against a
// fixed small source, then every reader call (operator[], at, offset,
// source_line, lengths, jsonl_dataset, verify_jsonl_index), with and without
// checksum verification. Each call must either work or throw a dpkit error
// (format_error, stale_index_error, invalid_argument, error); a crash, an
// out-of-bounds read (ASan) or any other exception is a finding.
//
// The first input byte selects fix-ups so the fuzzer gets past the header:
//   bit 0: write the magic, version 2 and a header size for 0-2 columns;
//   bit 1: write the source's size, mtime, fingerprint, device, inode, ctime;
//   bit 2: recompute the body checksum;  bit 3: recompute the header checksum.
// With all four set, only the offsets and columns are the fuzzer's: the case
// of a damaged index whose checksums are valid.
#include "fuzz_common.hpp"

#include <dpkit/data.hpp>

#include <cstring>
#include <string>

#include <sys/stat.h>

namespace {

const std::string source_text = "{\"n\": 1}\n\n{\"n\": 22}\r\n  \n{\"n\": 333}\n\n\n{\"n\": 4444}";

struct fixture {
  std::filesystem::path source, index;
  struct stat st {};
};

const fixture& fx() {
  static const fixture f = [] {
    fixture x;
    x.source = fuzz::scratch() / "source.jsonl";
    x.index = fuzz::scratch() / "source.jsonl.idx";
    fuzz::write_file(x.source, source_text);
    if (::stat(x.source.c_str(), &x.st) != 0) std::abort();
    return x;
  }();
  return f;
}

void put_u32(std::string& b, std::size_t at, std::uint32_t v) { std::memcpy(b.data() + at, &v, 4); }
void put_u64(std::string& b, std::size_t at, std::uint64_t v) { std::memcpy(b.data() + at, &v, 8); }
std::uint32_t get_u32(const std::string& b, std::size_t at) {
  std::uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}

/// Runs f; a dpkit error is an accepted answer, anything else escapes.
template <class F>
void tolerate(F&& f) {
  try {
    f();
  } catch (const dpkit::error&) {          // format_error, stale_index_error, build_cancelled, I/O
  } catch (const dpkit::invalid_argument&) { // index out of range
  }
}

void exercise(const dpkit::jsonl_index& idx) {
  volatile unsigned sink = 0;
  const std::uint64_t n = idx.size();
  static const bool verbose = std::getenv("DPKIT_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "opened: %llu lines\n", static_cast<unsigned long long>(n));
  for (std::uint64_t k = 0; k <= n && k < 100000; ++k) tolerate([&] { sink = sink + static_cast<unsigned>(idx.offset(k)); });
  for (std::uint64_t k = 0; k < n && k < 100000; ++k) {
    tolerate([&] {
      const std::string_view line = idx[k];
      const char* b = idx.source().data();
      if (line.data() < b || line.data() + line.size() > b + idx.source().size()) fuzz::fail("line outside the source");
      for (const char c : line) sink = sink + static_cast<unsigned char>(c);
    });
    tolerate([&] { (void)idx.at(k); });
    tolerate([&] { sink = sink + static_cast<unsigned>(idx.source_line(k)); });
    if (idx.has_lengths()) sink = sink + idx.lengths()[k];
  }
  tolerate([&] { (void)idx.at(n); });
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const fixture& f = fx();
  const std::uint8_t mode = data[0];
  std::string b(reinterpret_cast<const char*>(data + 1), size - 1);
  if (b.size() >= 128) {
    if (mode & 1) {
      std::memcpy(b.data(), "DPKJSONL", 8);
      put_u32(b, 8, 2);
      const std::uint32_t ncols = get_u32(b, 64) % 3;
      put_u32(b, 64, ncols);
      put_u32(b, 12, 128 + 32 * ncols);
    }
    if (mode & 2) {
      put_u64(b, 24, source_text.size());
      put_u64(b, 32, static_cast<std::uint64_t>(f.st.st_mtim.tv_sec) * 1'000'000'000 + static_cast<std::uint64_t>(f.st.st_mtim.tv_nsec));
      put_u64(b, 40, dpkit::detail::source_fingerprint(source_text));
      put_u64(b, 88, static_cast<std::uint64_t>(f.st.st_dev));
      put_u64(b, 96, static_cast<std::uint64_t>(f.st.st_ino));
      put_u64(b, 104, static_cast<std::uint64_t>(f.st.st_ctim.tv_sec) * 1'000'000'000 + static_cast<std::uint64_t>(f.st.st_ctim.tv_nsec));
    }
    const std::uint32_t h = get_u32(b, 12);
    if ((mode & 4) && h <= b.size()) put_u64(b, 72, dpkit::detail::hash_bytes(b.data() + h, b.size() - h, dpkit::detail::body_checksum_seed));
    if ((mode & 8) && h <= b.size()) {
      put_u64(b, 80, 0);
      put_u64(b, 80, dpkit::detail::hash_bytes(b.data(), h, dpkit::detail::header_checksum_seed));
    }
  }
  fuzz::write_file(f.index, b);
  for (const bool verify : {true, false}) {
    dpkit::jsonl_index_open_options o;
    o.verify_checksum = verify;
    o.check_content_if_moved = (mode & 16) != 0;
    tolerate([&] { exercise(dpkit::jsonl_index::open(f.source, o)); });
    tolerate([&] {
      const dpkit::jsonl_dataset ds({f.source}, o);
      for (std::uint64_t g = 0; g < ds.size() && g < 100000; ++g) tolerate([&] { (void)ds[g]; });
    });
  }
  tolerate([&] { (void)dpkit::verify_jsonl_index(f.source); });
  return 0;
}
