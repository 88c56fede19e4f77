// dpkit._core: the data path of dpkit for Python (pybind11). The memory-mapped
// JSONL index (dpkit/data/jsonl_index.hpp), torch's DistributedSampler
// (dpkit/data/distributed_sampler.hpp) and the token-budget batch sampler
// (dpkit/data/token_budget_sampler.hpp), with dpkit's exceptions as Python
// exception classes. The Python classes users see (dpkit.JsonlDataset,
// dpkit.DistributedSampler, dpkit.TokenBudgetBatchSampler) wrap these in
// python/dpkit/; docs/python.md is the guide.
//
// Every call that may run long (building an index, planning an epoch of 2e8
// samples, reading a line) runs without the GIL; a progress callback takes it
// back to call Python, and a pending signal (Ctrl-C) cancels a build.
#include <dpkit/core/errors.hpp>
#include <dpkit/data/distributed_sampler.hpp>
#include <dpkit/data/jsonl_index.hpp>
#include <dpkit/data/jsonl_length_column.hpp>
#include <dpkit/data/token_budget_sampler.hpp>

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// ---- JSONL index ----

/// One JSONL dataset (one or more shards) opened with its indices.
class jsonl_source {
public:
  jsonl_source(const std::vector<std::filesystem::path>& paths, std::optional<std::filesystem::path> index_path,
               std::optional<std::string> length_field, bool build, unsigned threads, bool verify_checksum,
               std::optional<py::function> progress)
  {
    if (paths.empty()) throw dpkit::invalid_argument("JsonlDataset: no path given");
    dpkit::jsonl_index_open_options o;
    if (index_path) {
      if (paths.size() != 1)
        throw dpkit::invalid_argument("JsonlDataset: index_path '" + index_path->string() + "' given for " +
                                      std::to_string(paths.size()) + " shards");
      o.index_path = *index_path;
    }
    o.rebuild_if_stale = build;
    o.verify_checksum = verify_checksum;
    o.build.threads = threads;
    if (length_field) o.build.length_column = dpkit::json_length_column(*length_field);
    std::size_t shard = 0;
    // A Python exception in the callback (or Ctrl-C) cancels the build (the
    // callback returns false: no index is written) and is raised again here;
    // it never unwinds through the build's threads.
    std::shared_ptr<py::error_already_set> raised;
    if (progress) {
      py::function f = *progress;
      o.build.progress = [f, &shard, &raised](std::uint64_t done, std::uint64_t total) {
        py::gil_scoped_acquire gil;
        try {
          if (PyErr_CheckSignals() != 0) throw py::error_already_set();
          const py::object r = f(shard, done, total);
          return r.is_none() || py::cast<bool>(py::bool_(r)); // False cancels
        } catch (py::error_already_set& e) {
          raised = std::make_shared<py::error_already_set>(std::move(e));
          return false;
        }
      };
    }
    std::vector<dpkit::jsonl_index> shards;
    shards.reserve(paths.size());
    try {
      py::gil_scoped_release nogil;
      for (shard = 0; shard < paths.size(); ++shard) {
        shards.push_back(dpkit::jsonl_index::open(paths[shard], o));
        if (length_field && shards.back().length_column_name() != *length_field)
          throw dpkit::format_error("JsonlDataset: index '" + shards.back().index_path().string() + "' has column '" +
                                    shards.back().length_column_name() + "', not '" + *length_field +
                                    "' (open with build=True to rebuild it)");
      }
    } catch (const dpkit::build_cancelled&) {
      if (raised) throw *raised;
      throw;
    }
    data_ = dpkit::jsonl_dataset(std::move(shards));
  }

  std::uint64_t size() const noexcept { return data_.size(); }

  /// Line `g` read with pread (the resident set stays flat however many lines
  /// are read; jsonl_index::read_line).
  py::bytes line(std::int64_t g) const {
    const auto l = locate(g);
    std::string out;
    {
      py::gil_scoped_release nogil;
      data_.shard(l.shard).read_line(l.line, out);
    }
    return py::bytes(out);
  }

  /// Lines `gs`, read under one release of the GIL.
  py::list lines(const std::vector<std::int64_t>& gs) const {
    std::vector<std::string> out(gs.size());
    std::vector<dpkit::jsonl_dataset::location> locs;
    locs.reserve(gs.size());
    for (const auto g : gs) locs.push_back(locate(g));
    {
      py::gil_scoped_release nogil;
      for (std::size_t i = 0; i < locs.size(); ++i) data_.shard(locs[i].shard).read_line(locs[i].line, out[i]);
    }
    py::list r(gs.size());
    for (std::size_t i = 0; i < out.size(); ++i) r[i] = py::bytes(out[i]);
    return r;
  }

  std::uint32_t length(std::int64_t g) const {
    const auto l = locate(g);
    return data_.length(data_.prefix()[l.shard] + l.line);
  }

  bool has_lengths() const noexcept {
    if (data_.shard_count() == 0) return false;
    for (std::size_t s = 0; s < data_.shard_count(); ++s)
      if (!data_.shard(s).has_lengths()) return false;
    return true;
  }

  /// Every line's length as one u32 vector (copied: the shards' columns are
  /// separate mappings).
  std::vector<std::uint32_t> all_lengths() const {
    if (!has_lengths()) throw dpkit::invalid_argument("JsonlDataset: no length column (open with length_field=...)");
    std::vector<std::uint32_t> v;
    v.reserve(data_.size());
    for (std::size_t s = 0; s < data_.shard_count(); ++s) {
      const auto l = data_.shard(s).lengths();
      v.insert(v.end(), l.begin(), l.end());
    }
    return v;
  }

  std::vector<std::string> index_paths() const {
    std::vector<std::string> v;
    for (std::size_t s = 0; s < data_.shard_count(); ++s) v.push_back(data_.shard(s).index_path().string());
    return v;
  }

  const dpkit::jsonl_dataset& dataset() const noexcept { return data_; }

private:
  dpkit::jsonl_dataset::location locate(std::int64_t g) const {
    const auto n = static_cast<std::int64_t>(data_.size());
    if (g < 0) g += n; // Python's negative indices
    if (g < 0 || g >= n)
      throw py::index_error("JsonlDataset: index " + std::to_string(g < 0 ? g - n : g) + " out of range for " +
                            std::to_string(n) + " lines");
    return data_.locate(static_cast<std::uint64_t>(g));
  }

  dpkit::jsonl_dataset data_;
};

// ---- distributed sampler ----

dpkit::torch_compat parse_compat(const std::string& s) {
  if (s == "since_2_7") return dpkit::torch_compat::since_2_7;
  if (s == "before_2_7") return dpkit::torch_compat::before_2_7;
  throw dpkit::invalid_argument("torch_compat '" + s + "': expected 'since_2_7' or 'before_2_7'");
}

/// distributed_sampler over either permutation engine.
class sampler {
public:
  sampler(std::uint64_t n, std::int64_t world_size, std::int64_t rank, bool shuffle, std::uint64_t seed, bool drop_last,
          bool exactly_once, const std::string& engine, const std::string& compat, unsigned rounds) {
    if (world_size <= 0)
      throw dpkit::invalid_argument("DistributedSampler: num_replicas " + std::to_string(world_size) + " (rank " +
                                    std::to_string(rank) + "); must be >= 1");
    if (rank < 0 || rank >= world_size)
      throw dpkit::invalid_argument("DistributedSampler: rank " + std::to_string(rank) + " not in [0, " +
                                    std::to_string(world_size) + ")");
    const dpkit::distributed_sampler_options o{.shuffle = shuffle, .seed = seed, .drop_last = drop_last, .exactly_once = exactly_once};
    const auto w = static_cast<std::uint64_t>(world_size), r = static_cast<std::uint64_t>(rank);
    py::gil_scoped_release nogil; // epoch 0's permutation: O(n)
    if (engine == "torch")
      t_.emplace(n, w, r, o, dpkit::torch_randperm(parse_compat(compat)));
    else if (engine == "feistel")
      f_.emplace(n, w, r, o, dpkit::feistel(rounds));
    else
      throw dpkit::invalid_argument("DistributedSampler: engine '" + engine + "': expected 'torch' or 'feistel'");
  }

  template <class F>
  decltype(auto) visit(F&& f) {
    if (t_) return f(*t_);
    return f(*f_);
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    if (t_) return f(*t_);
    return f(*f_);
  }

  void set_epoch(std::uint64_t epoch, std::uint64_t start) {
    py::gil_scoped_release nogil;
    visit([&](auto& s) { s.set_epoch(epoch, start); });
  }

private:
  std::optional<dpkit::distributed_sampler<dpkit::torch_randperm>> t_;
  std::optional<dpkit::distributed_sampler<dpkit::feistel>> f_;
};

// ---- token-budget batch sampler ----

/// The lengths the sampler plans from: a JsonlDataset's column or a copy of
/// the caller's sequence; kept alive with the sampler.
class token_sampler {
public:
  token_sampler(std::vector<std::uint32_t> lengths, std::int64_t world_size, std::int64_t rank, dpkit::token_budget_options o)
      : lengths_(std::make_shared<std::vector<std::uint32_t>>(std::move(lengths))) {
    check(world_size, rank);
    py::gil_scoped_release nogil;
    s_.emplace(*lengths_, static_cast<std::uint64_t>(world_size), static_cast<std::uint64_t>(rank), o);
  }
  token_sampler(std::shared_ptr<const jsonl_source> src, std::int64_t world_size, std::int64_t rank, dpkit::token_budget_options o)
      : src_(std::move(src)) {
    check(world_size, rank);
    if (!src_->has_lengths()) throw dpkit::invalid_argument("TokenBudgetBatchSampler: the dataset has no length column");
    const dpkit::jsonl_dataset* d = &src_->dataset();
    py::gil_scoped_release nogil;
    if (d->shard_count() == 1)
      s_.emplace(d->shard(0).lengths(), static_cast<std::uint64_t>(world_size), static_cast<std::uint64_t>(rank), o);
    else
      s_.emplace(d->size(), [d](std::uint64_t i) { return d->length(i); }, static_cast<std::uint64_t>(world_size),
                 static_cast<std::uint64_t>(rank), o);
  }
  dpkit::token_budget_batch_sampler& get() { return *s_; }
  const dpkit::token_budget_batch_sampler& get() const { return *s_; }

private:
  static void check(std::int64_t world_size, std::int64_t rank) {
    if (world_size <= 0)
      throw dpkit::invalid_argument("TokenBudgetBatchSampler: num_replicas " + std::to_string(world_size) + " (rank " +
                                    std::to_string(rank) + "); must be >= 1");
    if (rank < 0 || rank >= world_size)
      throw dpkit::invalid_argument("TokenBudgetBatchSampler: rank " + std::to_string(rank) + " not in [0, " +
                                    std::to_string(world_size) + ")");
  }
  std::shared_ptr<std::vector<std::uint32_t>> lengths_;
  std::shared_ptr<const jsonl_source> src_;
  std::optional<dpkit::token_budget_batch_sampler> s_;
};

dpkit::token_budget_options make_token_options(py::dict kw) {
  dpkit::token_budget_options o;
  for (const auto& item : kw) {
    const auto k = py::cast<std::string>(item.first);
    const py::handle v = item.second;
    if (k == "max_tokens") o.max_tokens = py::cast<std::uint64_t>(v);
    else if (k == "batch_type") {
      const auto t = py::cast<std::string>(v);
      if (t == "token" || t == "tokens") o.type = dpkit::batch_type::tokens;
      else if (t == "example" || t == "examples") o.type = dpkit::batch_type::examples;
      else throw dpkit::invalid_argument("TokenBudgetBatchSampler: batch_type '" + t + "': expected 'token' or 'example'");
    } else if (k == "max_batch_size") o.max_batch_size = py::cast<std::uint64_t>(v);
    else if (k == "max_sample_tokens") o.max_sample_tokens = py::cast<std::uint64_t>(v);
    else if (k == "oversize") {
      const auto t = py::cast<std::string>(v);
      if (t == "skip") o.oversize = dpkit::oversize_policy::skip;
      else if (t == "truncate") o.oversize = dpkit::oversize_policy::truncate;
      else if (t == "error") o.oversize = dpkit::oversize_policy::error;
      else throw dpkit::invalid_argument("TokenBudgetBatchSampler: oversize '" + t + "': expected skip, truncate or error");
    } else if (k == "sort_size") o.sort_size = py::cast<std::uint64_t>(v);
    else if (k == "shuffle") o.shuffle = py::cast<bool>(v);
    else if (k == "shuffle_with") {
      const auto t = py::cast<std::string>(v);
      if (t == "torch") o.shuffle_with = dpkit::sample_shuffle::torch_randperm;
      else if (t == "feistel") o.shuffle_with = dpkit::sample_shuffle::feistel;
      else throw dpkit::invalid_argument("TokenBudgetBatchSampler: shuffle_with '" + t + "': expected 'torch' or 'feistel'");
    } else if (k == "shuffle_batches") o.shuffle_batches = py::cast<bool>(v);
    else if (k == "seed") o.seed = py::cast<std::uint64_t>(v);
    else if (k == "balance") {
      const auto t = py::cast<std::string>(v);
      if (t == "pad") o.balance = dpkit::rank_balance::pad;
      else if (t == "drop") o.balance = dpkit::rank_balance::drop;
      else throw dpkit::invalid_argument("TokenBudgetBatchSampler: balance '" + t + "': expected 'pad' or 'drop'");
    } else if (k == "batch_size_multiple") o.batch_size_multiple = py::cast<std::uint64_t>(v);
    else if (k == "torch_compat") o.compat = parse_compat(py::cast<std::string>(v));
    else if (k == "elastic") o.elastic = py::cast<bool>(v);
    else if (k == "threads") o.threads = py::cast<unsigned>(v);
    else throw dpkit::invalid_argument("TokenBudgetBatchSampler: unknown option '" + k + "'");
  }
  return o;
}

} // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "dpkit's C++ data path: JSONL index, samplers (see the dpkit package for the documented classes)";

  // Exceptions: dpkit.Error (RuntimeError) and its kinds; invalid arguments
  // are ValueError. pybind11 tries the translators newest first, so each
  // kind is registered after its base.
  const auto error_type = py::register_exception<dpkit::error>(m, "Error", PyExc_RuntimeError);
  const auto format_type = py::register_exception<dpkit::format_error>(m, "FormatError", error_type);
  py::register_exception<dpkit::stale_index_error>(m, "StaleIndexError", format_type);
  py::register_exception<dpkit::timeout_error>(m, "TimeoutError", error_type);
  py::register_exception<dpkit::mismatch_error>(m, "MismatchError", error_type);
  py::register_exception<dpkit::communicator_error>(m, "CommunicatorError", error_type);
  py::register_exception<dpkit::peer_error>(m, "PeerError", error_type);
  py::register_exception<dpkit::build_cancelled>(m, "BuildCancelled", error_type);
  py::register_exception<dpkit::invalid_argument>(m, "InvalidArgument", PyExc_ValueError);

  py::class_<jsonl_source, std::shared_ptr<jsonl_source>>(m, "JsonlIndex")
      .def(py::init<const std::vector<std::filesystem::path>&, std::optional<std::filesystem::path>, std::optional<std::string>,
                    bool, unsigned, bool, std::optional<py::function>>(),
           py::arg("paths"), py::arg("index_path") = py::none(), py::arg("length_field") = py::none(), py::arg("build") = true,
           py::arg("threads") = 0, py::arg("verify_checksum") = true, py::arg("progress") = py::none())
      .def("__len__", &jsonl_source::size)
      .def("line", &jsonl_source::line, py::arg("index"))
      .def("lines", &jsonl_source::lines, py::arg("indices"))
      .def("length", &jsonl_source::length, py::arg("index"))
      .def_property_readonly("has_lengths", &jsonl_source::has_lengths)
      .def("lengths", &jsonl_source::all_lengths)
      .def_property_readonly("index_paths", &jsonl_source::index_paths);

  py::class_<sampler>(m, "DistributedSampler")
      .def(py::init<std::uint64_t, std::int64_t, std::int64_t, bool, std::uint64_t, bool, bool, const std::string&,
                    const std::string&, unsigned>(),
           py::arg("dataset_size"), py::arg("num_replicas"), py::arg("rank"), py::arg("shuffle") = true, py::arg("seed") = 0,
           py::arg("drop_last") = false, py::arg("exactly_once") = false, py::arg("engine") = "torch",
           py::arg("torch_compat") = "since_2_7", py::arg("rounds") = 4)
      .def("set_epoch", &sampler::set_epoch, py::arg("epoch"), py::arg("start") = 0)
      .def_property_readonly("epoch", [](const sampler& s) { return s.visit([](const auto& x) -> std::uint64_t {
        return x.epoch(); }); })
      .def_property_readonly("start", [](const sampler& s) { return s.visit([](const auto& x) -> std::uint64_t {
        return x.start(); }); })
      .def("__len__", [](const sampler& s) { return s.visit([](const auto& x) -> std::uint64_t {
        return x.num_samples(); }); })
      .def("offset_after", [](const sampler& s, std::uint64_t k) { return s.visit([k](const auto& x) -> std::uint64_t {
        return x.offset_after(k); }); },
           py::arg("samples"))
      .def("__getitem__", [](const sampler& s, std::int64_t k) { return s.visit([k](const auto& x) -> std::uint64_t {
        {
          const auto n = static_cast<std::int64_t>(x.num_samples());
          if (k < -n || k >= n) throw py::index_error("DistributedSampler: position " + std::to_string(k) + " out of range for " +
                                                      std::to_string(n) + " samples (rank " + std::to_string(x.rank()) + ")");
          return x[static_cast<std::uint64_t>(k < 0 ? k + n : k)];
        } }); })
      // a block of positions [begin, end) as a list: iteration from Python in
      // blocks costs one call per block instead of one per sample
      .def("block", [](const sampler& s, std::uint64_t begin, std::uint64_t end) { return s.visit([&](const auto& x) {
        std::vector<std::uint64_t> v;
        {
          end = std::min<std::uint64_t>(end, x.num_samples());
          for (std::uint64_t k = begin; k < end; ++k) v.push_back(x[k]);
        }
        return v; }); }, py::arg("begin"), py::arg("end"));

  py::class_<token_sampler>(m, "TokenBudgetBatchSampler")
      .def(py::init([](std::vector<std::uint32_t> lengths, std::int64_t w, std::int64_t r, py::kwargs kw) {
             return std::make_unique<token_sampler>(std::move(lengths), w, r, make_token_options(kw));
           }), py::arg("lengths"), py::arg("num_replicas"), py::arg("rank"))
      .def(py::init([](std::shared_ptr<jsonl_source> src, std::int64_t w, std::int64_t r, py::kwargs kw) {
             return std::make_unique<token_sampler>(std::move(src), w, r, make_token_options(kw));
           }), py::arg("dataset"), py::arg("num_replicas"), py::arg("rank"))
      .def("set_epoch", [](token_sampler& s, std::uint64_t e, std::uint64_t start) {
             py::gil_scoped_release nogil;
             s.get().set_epoch(e, start);
           }, py::arg("epoch"), py::arg("start") = 0)
      .def_property_readonly("epoch", [](const token_sampler& s) { return s.get().epoch(); })
      .def_property_readonly("start", [](const token_sampler& s) { return s.get().start(); })
      .def("__len__", [](const token_sampler& s) { return s.get().num_batches(); })
      .def_property_readonly("total_batches", [](const token_sampler& s) { return s.get().total_batches(); })
      .def_property_readonly("kept_samples", [](const token_sampler& s) { return s.get().kept_samples(); })
      .def_property_readonly("skipped", [](const token_sampler& s) { return s.get().skipped(); })
      .def_property_readonly("truncated", [](const token_sampler& s) { return s.get().truncated(); })
      .def_property_readonly("sample_limit", [](const token_sampler& s) { return s.get().sample_limit(); })
      .def("offset_after", [](const token_sampler& s, std::uint64_t steps) { return s.get().offset_after(steps); }, py::arg("steps"))
      .def("batch", [](const token_sampler& s, std::uint64_t step) {
             if (step >= s.get().num_batches())
               throw py::index_error("TokenBudgetBatchSampler: step " + std::to_string(step) + " >= num_batches " +
                                     std::to_string(s.get().num_batches()) + " (rank " + std::to_string(s.get().rank()) + ")");
             py::gil_scoped_release nogil;
             return s.get().batch(step);
           }, py::arg("step"))
      .def("plan_batch", [](const token_sampler& s, std::uint64_t b) {
             if (b >= s.get().total_batches())
               throw py::index_error("TokenBudgetBatchSampler: plan batch " + std::to_string(b) + " >= total_batches " +
                                     std::to_string(s.get().total_batches()));
             py::gil_scoped_release nogil;
             return s.get().plan_batch(b);
           }, py::arg("batch"))
      .def("is_padding", [](const token_sampler& s, std::uint64_t step) { return s.get().is_padding(step); }, py::arg("step"));
}
