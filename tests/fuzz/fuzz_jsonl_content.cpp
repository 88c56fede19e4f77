// libFuzzer harness: arbitrary bytes as JSONL content. Builds the index with 1
// and 2 threads (blank lines kept and skipped; with a num_tokens length
// column), compares every offset and line against an independent split, reads
// every line and runs verify_jsonl_index. Building without a column must
// always succeed; with the column only dpkit::format_error (a bad line) may be
// thrown. Anything else (crash, ASan/UBSan report, other exception, a wrong
// offset) is a finding.
//
// The first input byte selects: bits 0 and 7 both set: repeat the content past
// 1 MiB + 1 byte so the 2-thread build really splits (at 1 MiB; slow, so kept
// to a quarter of the inputs); bit 1: also skip blank lines.
#include "fuzz_common.hpp"

#include <dpkit/data.hpp>
#include <dpkit/data/jsonl_length_column.hpp>

#include <string>

namespace {

bool blank(std::string_view s) {
  for (const char c : s)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') return false;
  return true;
}

void check_index(const std::filesystem::path& src, const std::vector<fuzz::ref_line>& ref, bool skip) {
  const auto idx = dpkit::jsonl_index::open(src);
  std::uint64_t k = 0;
  for (std::uint64_t line = 0; line < ref.size(); ++line) {
    if (skip && blank(ref[line].text)) continue;
    if (k >= idx.size()) fuzz::fail("index has too few lines");
    if (idx.offset(k) != ref[line].offset) fuzz::fail("offset of line " + std::to_string(k) + " differs");
    if (idx[k] != ref[line].text) fuzz::fail("text of line " + std::to_string(k) + " differs");
    if (idx.source_line(k) != line) fuzz::fail("source line of line " + std::to_string(k) + " differs");
    ++k;
  }
  if (k != idx.size()) fuzz::fail("index has " + std::to_string(idx.size()) + " lines, reference " + std::to_string(k));
  if (idx.source_line_count() != ref.size()) fuzz::fail("source line count differs");
  if (dpkit::verify_jsonl_index(src) != k) fuzz::fail("verify_jsonl_index disagrees");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  std::string content(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((mode & 0x81) == 0x81 && !content.empty()) {
    const std::string unit = content;
    while (content.size() <= (std::size_t{1} << 20)) content += unit;
  }
  const auto src = fuzz::scratch() / "content.jsonl";
  fuzz::write_file(src, content);
  const auto ref = fuzz::split_lines(content);
  for (const unsigned threads : {1u, 2u}) {
    for (const bool skip : {false, true}) {
      if (skip && !(mode & 2)) continue;
      dpkit::jsonl_index_build_options o;
      o.threads = threads;
      o.sync = threads == 1; // both paths; fsync is slow and adds nothing to what is checked
      o.blank_lines = skip ? dpkit::blank_line_policy::skip : dpkit::blank_line_policy::keep;
      dpkit::build_jsonl_index(src, o);
      check_index(src, ref, skip);
      o.length_column = dpkit::json_length_column("num_tokens", {dpkit::missing_field_policy::skip, 0});
      try {
        const auto r = dpkit::build_jsonl_index(src, o);
        const auto idx = dpkit::jsonl_index::open(src);
        if (!idx.has_lengths() || idx.lengths().size() != r.lines) fuzz::fail("length column size");
        check_index(src, ref, skip);
      } catch (const dpkit::format_error&) {
        // a line that is not a JSON object, or a bad num_tokens: expected
      }
    }
  }
  return 0;
}
