// torch_lm_model.hpp: the small decoder-only transformer of examples/torch_lm.cpp
// and the two file formats it shares with scripts/torch_ddp_reference.py
// (which defines the identical model in Python). Used by the example and by
// tests/torch.
//
// Model (GPT-style, pre-LayerNorm): token and position embeddings, `layers`
// blocks of causal multi-head self-attention (one qkv Linear, an output
// projection) and a 4x GELU MLP, a final LayerNorm and an untied output
// Linear without bias. Parameter names (as named_parameters()):
// tok.weight, pos.weight, blocks.<i>.{ln1,qkv,proj,ln2,fc1,fc2}.{weight,bias},
// lnf.{weight,bias}, head.weight.
//
// Files (little-endian):
//   weights: "DPKW0001", u64 count, then per tensor: u64 name length, name,
//            u64 ndim, i64 dims[ndim], f32 data[numel].
//   batches: "DPKB0001", u64 steps, then per step: u64 rows, u64 cols,
//            i32 tokens[rows * cols] (row-major; -1 pads). A row is
//            <bos> pieces... <eos>; inputs are columns [0, cols-1), targets
//            [1, cols) with -1 ignored.
#pragma once

#include <dpkit/core/errors.hpp>

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace torch_lm {

/// Model size.
struct lm_config {
  std::int64_t vocab = 8000;   ///< tokens
  std::int64_t d_model = 128;  ///< width
  std::int64_t heads = 4;      ///< attention heads (d_model % heads == 0)
  std::int64_t layers = 2;     ///< blocks
  std::int64_t max_len = 130;  ///< positions (longest input row)
};

/// One pre-LN transformer block with causal self-attention.
struct block_impl : torch::nn::Module {
  block_impl(std::int64_t d, std::int64_t h)
      : heads(h), ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        qkv(register_module("qkv", torch::nn::Linear(d, 3 * d))), proj(register_module("proj", torch::nn::Linear(d, d))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc1(register_module("fc1", torch::nn::Linear(d, 4 * d))), fc2(register_module("fc2", torch::nn::Linear(4 * d, d))) {}

  /// x: [B, T, d] float; mask: [T, T] bool, true above the diagonal.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2), hd = C / heads;
    auto q_k_v = qkv(ln1(x)).view({B, T, 3, heads, hd}).permute({2, 0, 3, 1, 4});
    auto q = q_k_v[0], k = q_k_v[1], v = q_k_v[2];
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    att = torch::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
    auto h1 = x + proj(y);
    return h1 + fc2(torch::gelu(fc1(ln2(h1))));
  }

  std::int64_t heads;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE_IMPL(block, block_impl);

/// The language model.
struct lm_impl : torch::nn::Module {
  explicit lm_impl(const lm_config& c)
      : cfg(c), tok(register_module("tok", torch::nn::Embedding(c.vocab, c.d_model))),
        pos(register_module("pos", torch::nn::Embedding(c.max_len, c.d_model))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        lnf(register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})))),
        head(register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)))) {
    for (std::int64_t i = 0; i < c.layers; ++i) blocks->push_back(block(c.d_model, c.heads));
  }

  /// idx: [B, T] int64 token ids (T <= max_len) -> logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& idx) {
    const auto T = idx.size(1);
    auto x = tok(idx) + pos(torch::arange(T, torch::kLong));
    auto mask = torch::ones({T, T}, torch::kBool).triu(1);
    for (const auto& b : *blocks) x = b->as<block_impl>()->forward(x, mask);
    return head(lnf(x));
  }

  lm_config cfg;
  torch::nn::Embedding tok, pos;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm lnf;
  torch::nn::Linear head;
};
TORCH_MODULE_IMPL(lm, lm_impl);

/// Mean cross entropy of the next-token prediction over the non-pad targets
/// of `rows` ([B, L] int32/int64, -1 pads).
inline torch::Tensor lm_loss(lm& model, const torch::Tensor& rows) {
  auto r = rows.to(torch::kLong);
  const auto L = r.size(1);
  auto inputs = r.slice(1, 0, L - 1).clamp_min(0);
  auto targets = r.slice(1, 1, L).masked_fill(r.slice(1, 1, L) < 0, -100);
  auto logits = model->forward(inputs);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}), targets.reshape({-1}),
                                              torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
}

namespace detail {
inline void put_u64(std::ofstream& f, std::uint64_t v) { f.write(reinterpret_cast<const char*>(&v), 8); }
inline std::uint64_t get_u64(std::ifstream& f, const std::string& path) {
  std::uint64_t v = 0;
  if (!f.read(reinterpret_cast<char*>(&v), 8)) throw dpkit::format_error(path + ": truncated file");
  return v;
}
inline void expect_magic(std::ifstream& f, const char* magic, const std::string& path) {
  char m[8] = {};
  if (!f.read(m, 8) || std::string(m, 8) != magic)
    throw dpkit::format_error(path + ": not a " + std::string(magic, 4) + " file (bad magic)");
}
} // namespace detail

/// Writes the model's parameters (named_parameters order, f32) to `path`.
inline void save_weights(torch::nn::Module& m, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw dpkit::error("cannot write " + path);
  auto params = m.named_parameters(true);
  f.write("DPKW0001", 8);
  detail::put_u64(f, params.size());
  for (const auto& it : params) {
    auto t = it.value().detach().to(torch::kFloat).contiguous();
    detail::put_u64(f, it.key().size());
    f.write(it.key().data(), static_cast<std::streamsize>(it.key().size()));
    detail::put_u64(f, static_cast<std::uint64_t>(t.dim()));
    for (auto d : t.sizes()) detail::put_u64(f, static_cast<std::uint64_t>(d));
    f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * 4));
  }
  if (!f.flush()) throw dpkit::error("write error on " + path);
}

/// Loads parameters written by save_weights (or the Python script) into m.
/// @throws dpkit::format_error for a damaged file, a missing or unknown
///         name, or a shape that differs from the model's.
inline void load_weights(torch::nn::Module& m, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw dpkit::error("cannot open " + path);
  detail::expect_magic(f, "DPKW0001", path);
  auto params = m.named_parameters(true);
  const auto n = detail::get_u64(f, path);
  if (n != params.size())
    throw dpkit::format_error(path + ": " + std::to_string(n) + " tensors, the model has " + std::to_string(params.size()));
  torch::NoGradGuard ng;
  for (std::uint64_t k = 0; k < n; ++k) {
    const auto len = detail::get_u64(f, path);
    if (len > 4096) throw dpkit::format_error(path + ": tensor name of " + std::to_string(len) + " bytes");
    std::string name(len, '\0');
    if (!f.read(name.data(), static_cast<std::streamsize>(len))) throw dpkit::format_error(path + ": truncated file");
    auto* p = params.find(name);
    if (!p) throw dpkit::format_error(path + ": unknown parameter '" + name + "'");
    const auto nd = detail::get_u64(f, path);
    if (nd != static_cast<std::uint64_t>(p->dim()))
      throw dpkit::format_error(path + ": '" + name + "' has " + std::to_string(nd) + " dims, the model " +
                                std::to_string(p->dim()));
    for (std::int64_t d = 0; d < p->dim(); ++d)
      if (detail::get_u64(f, path) != static_cast<std::uint64_t>(p->size(d)))
        throw dpkit::format_error(path + ": '" + name + "' has a different shape than the model's");
    auto t = torch::empty(p->sizes(), torch::kFloat);
    if (!f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * 4)))
      throw dpkit::format_error(path + ": truncated file");
    p->copy_(t);
  }
}

/// Appends token batches to a file; the step count is written by close().
class batch_writer {
public:
  explicit batch_writer(std::string path) : path_(std::move(path)), f_(path_ + ".tmp", std::ios::binary | std::ios::trunc) {
    if (!f_) throw dpkit::error("cannot write " + path_ + ".tmp");
    f_.write("DPKB0001", 8);
    detail::put_u64(f_, 0);
  }
  /// rows: [B, L] int32.
  void add(const torch::Tensor& rows) {
    auto r = rows.to(torch::kInt).contiguous();
    detail::put_u64(f_, static_cast<std::uint64_t>(r.size(0)));
    detail::put_u64(f_, static_cast<std::uint64_t>(r.size(1)));
    f_.write(static_cast<const char*>(r.data_ptr()), static_cast<std::streamsize>(r.numel() * 4));
    ++steps_;
  }
  /// Writes the step count and renames the file into place.
  void close() {
    f_.seekp(8);
    detail::put_u64(f_, steps_);
    f_.close();
    if (!f_) throw dpkit::error("write error on " + path_ + ".tmp");
    if (std::rename((path_ + ".tmp").c_str(), path_.c_str()) != 0) throw dpkit::error("cannot rename to " + path_);
  }

private:
  std::string path_;
  std::ofstream f_;
  std::uint64_t steps_ = 0;
};

/// Reads all batches of a batch file.
/// @throws dpkit::format_error for a damaged file.
inline std::vector<torch::Tensor> read_batches(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw dpkit::error("cannot open " + path);
  detail::expect_magic(f, "DPKB0001", path);
  const auto steps = detail::get_u64(f, path);
  std::vector<torch::Tensor> out;
  for (std::uint64_t s = 0; s < steps; ++s) {
    const auto b = detail::get_u64(f, path), l = detail::get_u64(f, path);
    if (b == 0 || l < 2 || b > (1u << 20) || l > (1u << 20))
      throw dpkit::format_error(path + ": step " + std::to_string(s) + " has a " + std::to_string(b) + " x " +
                                std::to_string(l) + " batch");
    auto t = torch::empty({static_cast<std::int64_t>(b), static_cast<std::int64_t>(l)}, torch::kInt);
    if (!f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * 4)))
      throw dpkit::format_error(path + ": truncated at step " + std::to_string(s));
    out.push_back(t);
  }
  return out;
}

} // namespace torch_lm
