/// @file model_spec.hpp
/// @brief Parser for model parameter lists (`models/*.tsv`): one parameter a
/// line, `name<TAB>shape<TAB>dtype`, in the order the model registers its
/// parameters (the order DDP reverses to build buckets).
///
/// Format: UTF-8 text; lines starting with `#` and blank lines are ignored;
/// a trailing `\r` is ignored. `shape` is dimensions joined by `x`
/// (`50257x768`, `768`); an empty shape or `()` is a scalar (one element).
/// `dtype` is a torch dtype name: float32/float, float64/double,
/// float16/half, bfloat16, int8, uint8, int32/int, int64/long, uint32, uint64
/// (an optional `torch.` prefix is accepted).
#pragma once

#include "../core/element.hpp"
#include "../core/errors.hpp"
#include "bucket_plan.hpp"

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace dpkit {

/// One parameter of a model file.
struct model_param {
  std::string name;                  ///< e.g. "h.0.attn.c_attn.weight"
  std::vector<std::size_t> shape;    ///< dimensions; empty for a scalar
  element_type type = element_type::f32; ///< element type
  std::size_t numel = 0;             ///< product of shape (1 for a scalar), elements
  std::size_t bytes = 0;             ///< numel * element_size(type)
  friend bool operator==(const model_param&, const model_param&) = default;
};

/// A parsed model file: parameters in registration order.
struct model_spec {
  std::string source;              ///< file name (or the name given to parse_model_spec)
  std::vector<model_param> params; ///< registration order

  /// Total number of elements over all parameters.
  std::size_t total_numel() const noexcept {
    std::size_t s = 0;
    for (const auto& p : params) s += p.numel;
    return s;
  }
  /// Total size of all parameters (and so of all gradients) in bytes.
  std::size_t total_bytes() const noexcept {
    std::size_t s = 0;
    for (const auto& p : params) s += p.bytes;
    return s;
  }
  /// The planner's view: (bytes, type, host) per parameter, registration order.
  std::vector<param_info> param_infos() const {
    std::vector<param_info> v;
    v.reserve(params.size());
    for (const auto& p : params) v.push_back({p.bytes, p.type, memory_space::host});
    return v;
  }
  /// Parameter names, registration order.
  std::vector<std::string> names() const {
    std::vector<std::string> v;
    v.reserve(params.size());
    for (const auto& p : params) v.push_back(p.name);
    return v;
  }
};

/// Maps a torch dtype name ("float32", "bfloat16", "torch.float16", "half",
/// ...) to an element_type. Returns false if the name is unknown.
inline bool parse_torch_dtype(std::string_view s, element_type& out) noexcept {
  if (s.starts_with("torch.")) s.remove_prefix(6);
  struct entry { std::string_view name; element_type t; };
  static constexpr entry table[] = {
      {"float32", element_type::f32}, {"float", element_type::f32},   {"float64", element_type::f64},
      {"double", element_type::f64},  {"float16", element_type::f16}, {"half", element_type::f16},
      {"bfloat16", element_type::bf16}, {"int8", element_type::i8},   {"uint8", element_type::u8},
      {"int32", element_type::i32},   {"int", element_type::i32},     {"uint32", element_type::u32},
      {"int64", element_type::i64},   {"long", element_type::i64},    {"uint64", element_type::u64},
  };
  for (const auto& e : table)
    if (e.name == s) {
      out = e.t;
      return true;
    }
  return false;
}

/// Parses the text of a model file.
/// @param text    the whole file content.
/// @param source  the file name used in error messages.
/// @throws dpkit::format_error "SOURCE:LINE: ..." for a line without exactly
///         three tab-separated fields, an empty name, a malformed or
///         overflowing shape, or an unknown dtype.
inline model_spec parse_model_spec(std::string_view text, std::string_view source = "<string>") {
  model_spec spec;
  spec.source = std::string(source);
  std::size_t line_no = 0;
  auto fail = [&](const std::string& msg) -> void {
    throw format_error(std::string(source) + ":" + std::to_string(line_no) + ": " + msg);
  };
  while (!text.empty()) {
    ++line_no;
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    std::string_view f[3];
    int nf = 0;
    for (;;) {
      const auto tab = line.find('\t');
      if (nf == 3) {
        fail("expected 3 tab-separated fields (name, shape, dtype), found more");
      }
      f[nf++] = line.substr(0, tab);
      if (tab == std::string_view::npos) break;
      line.remove_prefix(tab + 1);
    }
    if (nf != 3) fail("expected 3 tab-separated fields (name, shape, dtype), found " + std::to_string(nf));
    model_param p;
    p.name = std::string(f[0]);
    if (p.name.empty()) fail("empty parameter name");
    std::string_view shape = f[1];
    std::size_t numel = 1;
    if (!(shape.empty() || shape == "()")) {
      for (;;) {
        const auto x = shape.find('x');
        const std::string_view d = shape.substr(0, x);
        std::size_t v = 0;
        const auto [ptr, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
        if (d.empty() || ec != std::errc{} || ptr != d.data() + d.size())
          fail("malformed shape '" + std::string(f[1]) + "' (expected dimensions joined by 'x', e.g. 768x3072)");
        if (v != 0 && numel > std::numeric_limits<std::size_t>::max() / v)
          fail("shape '" + std::string(f[1]) + "' overflows");
        numel *= v;
        p.shape.push_back(v);
        if (x == std::string_view::npos) break;
        shape.remove_prefix(x + 1);
      }
    }
    if (!parse_torch_dtype(f[2], p.type))
      fail("unknown dtype '" + std::string(f[2]) +
           "' (expected float32, float16, bfloat16, float64, int8, uint8, int32, int64, ...)");
    p.numel = numel;
    if (numel > std::numeric_limits<std::size_t>::max() / element_size(p.type)) fail("parameter size overflows");
    p.bytes = numel * element_size(p.type);
    spec.params.push_back(std::move(p));
  }
  return spec;
}

/// Reads and parses a model file (see parse_model_spec).
/// @throws dpkit::format_error naming the file if it cannot be opened or read,
///         or "FILE:LINE: ..." for a malformed line.
inline model_spec load_model_spec(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw format_error(path + ": cannot open model file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw format_error(path + ": read error");
  return parse_model_spec(ss.str(), path);
}

} // namespace dpkit
