// Shared by the libFuzzer harnesses under tests/fuzz/: a per-process scratch
// directory, file writing, the independent line-split reference, and a main()
// that replays corpus files when built without libFuzzer (the regression test
// run by `meson test --suite data`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace fuzz {

/// Scratch directory of this process (under DPKIT_TEST_TMPDIR or /tmp).
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    const char* env = std::getenv("DPKIT_TEST_TMPDIR");
    std::filesystem::path p = env ? env : "/tmp";
    p /= "dpkit-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(p);
    return p;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) std::abort();
}

/// Independent reference: the offset of every line (a line ends at '\n'; a
/// last line without '\n' counts) and the line without '\n' and one '\r'.
struct ref_line {
  std::uint64_t offset;
  std::string_view text;
};
inline std::vector<ref_line> split_lines(std::string_view d) {
  std::vector<ref_line> r;
  std::size_t pos = 0;
  while (pos < d.size()) {
    const std::size_t nl = d.find('\n', pos);
    const std::size_t end = nl == std::string_view::npos ? d.size() : nl;
    std::string_view line = d.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    r.push_back({pos, line});
    pos = nl == std::string_view::npos ? d.size() : nl + 1;
  }
  return r;
}

/// Stops the process (a finding) with a message.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz: %s\n", what.c_str());
  std::abort();
}

} // namespace fuzz

#ifdef DPKIT_FUZZ_STANDALONE
/// Replays every file of the directories (or files) given on the command line.
int main(int argc, char** argv) {
  std::size_t n = 0;
  for (int a = 1; a < argc; ++a) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(argv[a])) {
      for (const auto& e : std::filesystem::directory_iterator(argv[a]))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.emplace_back(argv[a]);
    }
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
      ++n;
    }
  }
  std::filesystem::remove_all(fuzz::scratch());
  std::printf("replayed %zu inputs\n", n);
  return n > 0 ? 0 : 1;
}
#endif
