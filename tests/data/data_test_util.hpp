// Helpers shared by the data-area tests (tests/data/). The test runs with the
// project root as its working directory; temporary files go under
// DPKIT_TEST_TMPDIR (the meson build directory), never the source tree.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace data_test {

/// Scratch directory under the build dir (created on first use).
inline std::filesystem::path tmp_dir() {
  const char* env = std::getenv("DPKIT_TEST_TMPDIR");
  std::filesystem::path p = env ? std::filesystem::path(env) : std::filesystem::temp_directory_path();
  p /= "dpkit_data_test";
  std::filesystem::create_directories(p);
  return p;
}

/// The real corpus (data/debian-descriptions.jsonl.xz, decompressed by the
/// build): DPKIT_CORPUS as set by meson test, else build/data/ from the root.
inline std::filesystem::path corpus() {
  const char* env = std::getenv("DPKIT_CORPUS");
  return env ? std::filesystem::path(env) : std::filesystem::path("build") / "data" / "debian-descriptions.jsonl";
}

/// Committed test vectors.
inline std::filesystem::path vectors(const char* name) { return std::filesystem::path("tests") / "data" / "vectors" / name; }

inline void write_file(const std::filesystem::path& p, std::string_view content) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(content.data(), static_cast<std::streamsize>(content.size()));
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

/// Independent reference: lines of `data` split at '\n' (a last line without
/// '\n' counts), each without '\n' and one trailing '\r'; offsets of each line.
struct ref_lines {
  std::vector<std::uint64_t> offsets;
  std::vector<std::string> lines;
};
inline ref_lines split_lines(const std::string& data) {
  ref_lines r;
  std::size_t pos = 0;
  while (pos < data.size()) {
    std::size_t nl = data.find('\n', pos);
    std::size_t end = nl == std::string::npos ? data.size() : nl;
    std::string line = data.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    r.offsets.push_back(pos);
    r.lines.push_back(line);
    pos = nl == std::string::npos ? data.size() : nl + 1;
  }
  return r;
}

/// Number of files in `dir` whose name contains `part`.
inline int count_files_containing(const std::filesystem::path& dir, std::string_view part) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find(part) != std::string::npos) ++n;
  return n;
}

} // namespace data_test
