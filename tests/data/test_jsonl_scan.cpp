// The JSONL index builder's vectorized kernels against their portable
// versions: the newline scan (memchr / AVX2 / AVX-512BW) and the content-hash
// stripes (scalar / AVX2), on random bytes at every alignment and length.
#include <dpkit/data/detail/content_hash.hpp>
#include <dpkit/data/detail/newline_scan.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace {

/// Independent reference: base + i + 1 for every '\n' at p[i].
std::vector<std::uint64_t> reference_starts(const char* p, std::size_t n, std::uint64_t base) {
  std::vector<std::uint64_t> r;
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] == '\n') r.push_back(base + i + 1);
  return r;
}

std::vector<char> random_text(std::size_t n, unsigned newline_every, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<char> v(n);
  for (auto& c : v) c = rng() % newline_every == 0 ? '\n' : static_cast<char>('a' + rng() % 26);
  return v;
}

} // namespace

TEST_CASE("newline scan: every kernel equals the reference") {
  for (const unsigned every : {1u, 2u, 7u, 64u, 1000u}) {
    const auto text = random_text(5000, every, every);
    for (std::size_t start : {0u, 1u, 31u, 63u}) {
      for (std::size_t n : {0u, 1u, 63u, 64u, 65u, 127u, 128u, 1000u, 4900u}) {
        CAPTURE(every);
        CAPTURE(start);
        CAPTURE(n);
        const auto ref = reference_starts(text.data() + start, n, 1000 + start);
        std::vector<std::uint64_t> out(n + 8);
        auto* e = dpkit::detail::newline_starts_memchr(text.data() + start, n, 1000 + start, out.data());
        CHECK(std::vector<std::uint64_t>(out.data(), e) == ref);
#ifdef DPKIT_NEWLINE_SCAN_X86
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2")) {
          e = dpkit::detail::newline_starts_avx2(text.data() + start, n, 1000 + start, out.data());
          CHECK(std::vector<std::uint64_t>(out.data(), e) == ref);
        }
        if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("bmi2")) {
          e = dpkit::detail::newline_starts_avx512(text.data() + start, n, 1000 + start, out.data());
          CHECK(std::vector<std::uint64_t>(out.data(), e) == ref);
        }
#endif
        dpkit::detail::u64_buffer buf;
        buf.push_back(7);
        dpkit::detail::newline_starts(text.data() + start, n, 1000 + start, buf);
        REQUIRE(buf.size() == ref.size() + 1);
        CHECK(std::vector<std::uint64_t>(buf.data() + 1, buf.data() + buf.size()) == ref);
      }
    }
  }
}

TEST_CASE("content hash: AVX2 stripes equal the scalar ones; any changed byte changes the hash") {
  const auto text = random_text(4096 + 64, 50, 9);
  const auto* u = reinterpret_cast<const unsigned char*>(text.data());
#ifdef DPKIT_CONTENT_HASH_X86
  if (__builtin_cpu_supports("avx2"))
    for (std::size_t stripes : {0u, 1u, 2u, 63u, 64u}) {
      std::uint64_t a[8], b[8];
      for (unsigned j = 0; j < 8; ++j) a[j] = b[j] = dpkit::detail::content_keys[j] ^ 3;
      dpkit::detail::content_stripes_scalar(a, u + 5, stripes, 11);
      dpkit::detail::content_stripes_avx2(b, u + 5, stripes, 11);
      for (unsigned j = 0; j < 8; ++j) CHECK(a[j] == b[j]);
    }
#endif
  std::vector<char> copy = text;
  const std::uint64_t h = dpkit::detail::content_chunk_hash(copy.data(), copy.size(), 0);
  CHECK(dpkit::detail::content_chunk_hash(copy.data(), copy.size(), 1) != h); // chunk number is hashed
  for (std::size_t pos = 0; pos < copy.size(); pos += 37) {
    copy[pos] ^= 1;
    CHECK(dpkit::detail::content_chunk_hash(copy.data(), copy.size(), 0) != h);
    copy[pos] ^= 1;
  }
  // two 64-byte stripes swapped
  std::swap_ranges(copy.begin(), copy.begin() + 64, copy.begin() + 64);
  CHECK(dpkit::detail::content_chunk_hash(copy.data(), copy.size(), 0) != h);
}
