// dpkit._dist_ext: the collectives every rank of the group takes part in
// with a result on every rank: all-reduce (dense; bitwise ops; sparse, as
// Gloo: all-gathered indices and values, summed), broadcast, reduce,
// all-gather, reduce-scatter (each with its list, flat and coalesced
// forms), barrier, and torch's coalescing manager. Each runs dpkit's
// dispatcher (the algorithm the tuning table picks for the transport) on
// the group's worker.
#pragma once

#include "process_group.hpp"

namespace dpkit_dist {

// ---- all-reduce ----

/// BAND, BOR, BXOR (integer and bool tensors, as Gloo): every rank's tensor
/// all-gathered, then folded in rank order on every rank.
template <class C>
void process_group_dpkit::bitwise_allreduce(C& c, const at::Tensor& t, const reduction& r,
                                            const dpkit::collective_options& o) {
  const auto n = static_cast<std::int64_t>(getSize());
  at::Tensor all = at::empty({n, t.numel()}, t.options());
  visit_move(t.reshape({-1}), [&](auto v) {
    using T = std::remove_pointer_t<decltype(v.ptr)>;
    dpkit::allgather(c, v, dpkit::tensor_view<T>{reinterpret_cast<T*>(all.data_ptr()), v.count * static_cast<std::size_t>(n)},
                     dpkit::algorithm::automatic, o);
  });
  at::Tensor acc = all[0].clone();
  for (std::int64_t k = 1; k < n; ++k) {
    if (r.bitwise == '&') acc.bitwise_and_(all[k]);
    else if (r.bitwise == '|') acc.bitwise_or_(all[k]);
    else acc.bitwise_xor_(all[k]);
  }
  t.view({-1}).copy_(acc);
}

/// A sparse COO tensor summed over the group, as Gloo does it: coalesced,
/// its dimensions (9 int64 per rank: up to 4 sparse and 4 dense sizes, nnz)
/// all-gathered and compared, then the indices and values all-gathered
/// (padded to the largest nnz) and summed into a coalesced sparse tensor
/// that replaces t's contents on every rank.
template <class C>
void process_group_dpkit::sparse_allreduce(C& c, const at::Tensor& t, const dpkit::collective_options& o) {
  at::AutoDispatchBelowAutograd no_autograd;
  const int n = getSize();
  const auto un = static_cast<std::size_t>(n);
  at::Tensor input = t.coalesce();
  const std::int64_t sparse_dim = input.sparse_dim(), dense_dim = input.dense_dim();
  if (sparse_dim > 4 || dense_dim > 4)
    throw dpkit::invalid_argument(me() + "all_reduce of a sparse tensor with " + std::to_string(sparse_dim) +
                                  " sparse and " + std::to_string(dense_dim) + " dense dimensions (at most 4 each, as Gloo)");
  std::vector<std::int64_t> meta(9 * un, 0), mine(9, 0);
  for (std::int64_t i = 0; i < sparse_dim; ++i) mine[static_cast<std::size_t>(i)] = input.size(i);
  for (std::int64_t i = 0; i < dense_dim; ++i) mine[static_cast<std::size_t>(4 + i)] = input.size(sparse_dim + i);
  mine[8] = input._nnz();
  dpkit::allgather(c, mine, meta, dpkit::algorithm::automatic, o);
  std::int64_t max_nnz = 0;
  for (int p = 0; p < n; ++p) {
    const auto* m = meta.data() + 9 * static_cast<std::size_t>(p);
    if (!std::equal(m, m + 8, mine.data()))
      throw dpkit::invalid_argument(me() + "all_reduce of sparse tensors: rank " + std::to_string(p) +
                                    "'s tensor has other dimensions than this rank's " +
                                    dpkit::detail::torch_describe(t) + " (sparse dimensions do not match)");
    max_nnz = std::max(max_nnz, m[8]);
  }
  const std::int64_t dense_numel = sparse_dim == 0 ? input.numel() : input.values().numel() / std::max<std::int64_t>(1, input._nnz());
  // indices: [sparse_dim, nnz] int64 per rank, padded to max_nnz
  at::Tensor idx = at::zeros({sparse_dim, max_nnz}, at::kLong);
  idx.narrow(1, 0, input._nnz()).copy_(input.indices());
  at::Tensor all_idx = at::empty({n, sparse_dim, max_nnz}, at::kLong);
  dpkit::allgather(c, dpkit::torch_tensor_view<std::int64_t>(idx.reshape({-1})),
                   dpkit::torch_tensor_view<std::int64_t>(all_idx.reshape({-1})), dpkit::algorithm::automatic, o);
  // values: [nnz, dense sizes...] per rank, padded to max_nnz
  std::vector<std::int64_t> vshape = {max_nnz};
  for (std::int64_t i = 0; i < dense_dim; ++i) vshape.push_back(input.size(sparse_dim + i));
  at::Tensor val = at::zeros(vshape, input.values().options());
  val.narrow(0, 0, input._nnz()).copy_(input.values());
  std::vector<std::int64_t> all_vshape = vshape;
  all_vshape.insert(all_vshape.begin(), n);
  at::Tensor all_val = at::empty(all_vshape, val.options());
  const reduction sum{dpkit::reduce_op::sum, 0, "SUM"};
  visit_reduce(val.reshape({-1}), sum, getRank(), [&](auto v) {
    using T = std::remove_pointer_t<decltype(v.ptr)>;
    dpkit::allgather(c, v,
                     dpkit::tensor_view<T>{reinterpret_cast<T*>(all_val.data_ptr()), v.count * un},
                     dpkit::algorithm::automatic, o);
  });
  (void)dense_numel;
  at::Tensor out;
  for (int p = 0; p < n; ++p) {
    const std::int64_t nnz = meta[9 * static_cast<std::size_t>(p) + 8];
    at::Tensor part = at::sparse_coo_tensor(all_idx[p].narrow(1, 0, nnz), all_val[p].narrow(0, 0, nnz), input.sizes(),
                                            input.options());
    out = p == 0 ? part : out + part;
  }
  t.copy_(out.coalesce());
}

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::allreduce_sparse_impl(std::vector<at::Tensor>& tensors,
                                                                               const c10d::AllreduceOptions& opts) {
  if (tensors.size() != 1)
    throw dpkit::invalid_argument(me() + "all_reduce takes one tensor, got " + std::to_string(tensors.size()));
  const at::Tensor t = tensors[0];
  check_cpu(t, "all_reduce");
  if (opts.reduceOp.op_ != c10d::ReduceOp::SUM)
    throw dpkit::invalid_argument(me() + "all_reduce of sparse tensors takes SUM only (as Gloo), got " +
                                  to_reduction(opts.reduceOp, getRank()).name);
  return submit(c10d::OpType::ALLREDUCE, {t}, nbytes(t._values()), timeout_of(opts.timeout),
                [this, t](auto& c, const dpkit::collective_options& o) { sparse_allreduce(c, t, o); });
}

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::allreduce(std::vector<at::Tensor>& tensors,
                                                                   const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) return allreduce_sparse_impl(tensors, opts);
  const at::Tensor t = single(tensors, "all_reduce");
  const reduction r = to_reduction(opts.reduceOp, getRank());
  if (r.bitwise && !is_integral(t))
    throw dpkit::invalid_argument(me() + "Cannot use ReduceOp." + r.name + " with non-integral dtype (" +
                                  dpkit::detail::torch_describe(t) + ")");
  return submit(c10d::OpType::ALLREDUCE, {t}, nbytes(t), timeout_of(opts.timeout),
                [this, t, r](auto& c, const dpkit::collective_options& o) {
                  if (r.bitwise) return bitwise_allreduce(c, t, r, o);
                  visit_reduce(t, r, getRank(), [&](auto v) { dpkit::allreduce(c, v, v, r.op, {}, o); });
                });
}

#if TORCH_VERSION_MAJOR >= 2
inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                                          const c10d::AllreduceOptions& opts) {
  return allreduce_sparse_impl(tensors, opts);
}
#endif

/// The tensors as one flat tensor, all-reduced in one collective, then
/// copied back (Gloo's allreduce_coalesced): same dtype required.
inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                             const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) throw dpkit::invalid_argument(me() + "all_reduce_coalesced of no tensors");
  for (const auto& t : tensors) check_dense(t, "all_reduce_coalesced");
  check_same_dtype(tensors, tensors[0], "all_reduce_coalesced");
  const reduction r = to_reduction(opts.reduceOp, getRank());
  if (r.bitwise && !is_integral(tensors[0]))
    throw dpkit::invalid_argument(me() + "Cannot use ReduceOp." + r.name + " with non-integral dtype (" +
                                  dpkit::detail::torch_describe(tensors[0]) + ")");
  std::vector<at::Tensor> ts = tensors;
  std::size_t n = 0;
  for (const auto& t : ts) n += nbytes(t);
  return submit(c10d::OpType::ALLREDUCE_COALESCED, ts, n, timeout_of(opts.timeout),
                [this, ts, r](auto& c, const dpkit::collective_options& o) {
                  at::Tensor flat = flat_cat(ts);
                  if (r.bitwise) bitwise_allreduce(c, flat, r, o);
                  else visit_reduce(flat, r, getRank(), [&](auto v) { dpkit::allreduce(c, v, v, r.op, {}, o); });
                  if (ts.size() > 1) flat_split(flat, ts);
                });
}

// ---- broadcast, reduce ----

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::broadcast(std::vector<at::Tensor>& tensors,
                                                                   const c10d::BroadcastOptions& opts) {
  const at::Tensor t = single(tensors, "broadcast");
  const int root = check_root(opts.rootRank, "broadcast");
  return submit(c10d::OpType::BROADCAST, {t}, nbytes(t), timeout_of(opts.timeout),
                [t, root](auto& c, const dpkit::collective_options& o) {
                  visit_move(t, [&](auto v) { dpkit::broadcast(c, v, root, dpkit::algorithm::automatic, o); });
                });
}

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::reduce(std::vector<at::Tensor>& tensors,
                                                                const c10d::ReduceOptions& opts) {
  const at::Tensor t = single(tensors, "reduce");
  const int root = check_root(opts.rootRank, "reduce");
  const reduction r = to_reduction(opts.reduceOp, getRank());
  if (r.bitwise && !is_integral(t))
    throw dpkit::invalid_argument(me() + "Cannot use ReduceOp." + r.name + " with non-integral dtype (" +
                                  dpkit::detail::torch_describe(t) + ")");
  return submit(c10d::OpType::REDUCE, {t}, nbytes(t), timeout_of(opts.timeout),
                [this, t, root, r](auto& c, const dpkit::collective_options& o) {
                  if (r.bitwise) { // every rank folds; root keeps the result
                    at::Tensor copy = t.clone();
                    bitwise_allreduce(c, copy, r, o);
                    if (getRank() == root) t.copy_(copy);
                    return;
                  }
                  visit_reduce(t, r, getRank(),
                               [&](auto v) { dpkit::reduce(c, v, v, r.op, root, dpkit::algorithm::automatic, o); });
                });
}

// ---- all-gather ----

namespace detail_coll {
/// dpkit::allgather of flat `in` into flat `out` (world size x in's
/// elements), typed where dpkit has the dtype, else as bytes.
template <class C>
void gather_flat(C& c, const at::Tensor& in, const at::Tensor& out, const dpkit::collective_options& o) {
  visit_move(in, [&](auto v) {
    using T = std::remove_pointer_t<decltype(v.ptr)>;
    dpkit::allgather(c, v, dpkit::tensor_view<T>{reinterpret_cast<T*>(out.data_ptr()), nbytes(out) / sizeof(T)},
                     dpkit::algorithm::automatic, o);
  });
}
/// dpkit::reduce_scatter of flat `in` (world size x out's elements) into
/// flat `out`.
template <class C>
void scatter_flat(C& c, const at::Tensor& in, const at::Tensor& out, const reduction& r, int rank,
                  const dpkit::collective_options& o) {
  visit_reduce(in, r, rank, [&](auto v) {
    using T = std::remove_pointer_t<decltype(v.ptr)>;
    dpkit::reduce_scatter(c, v, dpkit::tensor_view<T>{reinterpret_cast<T*>(out.data_ptr()), nbytes(out) / sizeof(T)},
                          r.op, dpkit::algorithm::automatic, o);
  });
}
} // namespace detail_coll

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const c10d::AllgatherOptions& opts) {
  const at::Tensor in = single(inputs, "all_gather");
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize())
    throw dpkit::invalid_argument(me() + "all_gather wants one list of " + std::to_string(getSize()) +
                                  " output tensors, got " +
                                  (outputs.size() == 1 ? std::to_string(outputs[0].size()) + " tensors"
                                                       : std::to_string(outputs.size()) + " lists"));
  std::vector<at::Tensor> outs = outputs[0];
  for (const auto& o : outs) {
    check_dense(o, "all_gather output");
    if (o.numel() != in.numel() || o.scalar_type() != in.scalar_type())
      throw dpkit::invalid_argument(me() + "all_gather output " + dpkit::detail::torch_describe(o) +
                                    " differs from the input " + dpkit::detail::torch_describe(in));
  }
  return submit(c10d::OpType::ALLGATHER, outs, nbytes(in) * outs.size(), timeout_of(opts.timeout),
                [in, outs](auto& c, const dpkit::collective_options& o) {
                  at::Tensor flat = at::empty({static_cast<std::int64_t>(outs.size()) * in.numel()}, in.options());
                  detail_coll::gather_flat(c, in, flat, o);
                  flat_split(flat, outs);
                });
}

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                         const c10d::AllgatherOptions& opts) {
  check_dense(output, "all_gather_into_tensor output");
  check_dense(input, "all_gather_into_tensor input");
  if (output.numel() != input.numel() * getSize() || output.scalar_type() != input.scalar_type())
    throw dpkit::invalid_argument(me() + "all_gather_into_tensor: output " + dpkit::detail::torch_describe(output) +
                                  " is not world size (" + std::to_string(getSize()) + ") x input " +
                                  dpkit::detail::torch_describe(input));
  const at::Tensor in = input, out = output;
  return submit(c10d::OpType::_ALLGATHER_BASE, {out}, nbytes(out), timeout_of(opts.timeout),
                [in, out](auto& c, const dpkit::collective_options& o) { detail_coll::gather_flat(c, in, out, o); });
}

/// Every rank's list of inputs, flattened into one all-gather, into the
/// ranks' lists of outputs (Gloo's allgather_coalesced): output_lists[r]
/// holds rank r's inputs, shapes as this rank's inputs; one dtype.
inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  if (inputs.empty()) throw dpkit::invalid_argument(me() + "all_gather_coalesced of no tensors");
  for (const auto& t : inputs) check_dense(t, "all_gather_coalesced input");
  check_same_dtype(inputs, inputs[0], "all_gather_coalesced");
  if (static_cast<int>(outputs.size()) != getSize())
    throw dpkit::invalid_argument(me() + "all_gather_coalesced wants " + std::to_string(getSize()) +
                                  " output lists (one per rank), got " + std::to_string(outputs.size()));
  std::vector<at::Tensor> outs;
  for (const auto& list : outputs) {
    if (list.size() != inputs.size())
      throw dpkit::invalid_argument(me() + "all_gather_coalesced: an output list has " + std::to_string(list.size()) +
                                    " tensors, the input list " + std::to_string(inputs.size()));
    for (std::size_t i = 0; i < list.size(); ++i) {
      check_dense(list[i], "all_gather_coalesced output");
      if (list[i].numel() != inputs[i].numel() || list[i].scalar_type() != inputs[i].scalar_type())
        throw dpkit::invalid_argument(me() + "all_gather_coalesced: output " + dpkit::detail::torch_describe(list[i]) +
                                      " differs from input " + dpkit::detail::torch_describe(inputs[i]));
      outs.push_back(list[i]);
    }
  }
  const std::vector<at::Tensor> ins = inputs;
  std::size_t n = 0;
  for (const auto& t : outs) n += nbytes(t);
  return submit(c10d::OpType::ALLGATHER_COALESCED, outs, n, timeout_of(opts.timeout),
                [ins, outs](auto& c, const dpkit::collective_options& o) {
                  const at::Tensor flat_in = flat_cat(ins);
                  at::Tensor flat = at::empty({static_cast<std::int64_t>(outs.size() / ins.size()) * flat_in.numel()},
                                              flat_in.options());
                  detail_coll::gather_flat(c, flat_in.contiguous(), flat, o);
                  flat_split(flat, outs); // rank-major: rank r's inputs in order
                });
}

#if TORCH_VERSION_MAJOR >= 2
/// all_gather_into_tensor of several (output, input) pairs in one
/// all-gather: the inputs concatenated per rank, the result cut into the
/// outputs (rank r's piece of output i at r * input i's elements).
inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  if (outputs.size() != inputs.size() || inputs.empty())
    throw dpkit::invalid_argument(me() + "all_gather_into_tensor_coalesced: " + std::to_string(outputs.size()) +
                                  " outputs for " + std::to_string(inputs.size()) + " inputs");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_dense(inputs[i], "all_gather_into_tensor_coalesced input");
    check_dense(outputs[i], "all_gather_into_tensor_coalesced output");
    if (outputs[i].numel() != inputs[i].numel() * getSize() || outputs[i].scalar_type() != inputs[i].scalar_type())
      throw dpkit::invalid_argument(me() + "all_gather_into_tensor_coalesced: output " +
                                    dpkit::detail::torch_describe(outputs[i]) + " is not world size x input " +
                                    dpkit::detail::torch_describe(inputs[i]));
  }
  check_same_dtype(inputs, inputs[0], "all_gather_into_tensor_coalesced");
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  std::size_t n = 0;
  for (const auto& t : outs) n += nbytes(t);
  return submit(c10d::OpType::COALESCED, outs, n, timeout_of(opts.timeout),
                [this, ins, outs](auto& c, const dpkit::collective_options& o) {
                  const at::Tensor flat_in = flat_cat(ins);
                  const std::int64_t k = flat_in.numel(), ranks = getSize();
                  at::Tensor flat = at::empty({ranks * k}, flat_in.options());
                  detail_coll::gather_flat(c, flat_in.contiguous(), flat, o);
                  for (std::int64_t r = 0; r < ranks; ++r) {
                    std::int64_t at = r * k;
                    for (const auto& out : outs) {
                      const std::int64_t m = out.numel() / ranks;
                      out.view({-1}).narrow(0, r * m, m).copy_(flat.narrow(0, at, m));
                      at += m;
                    }
                  }
                });
}
#endif

// ---- reduce-scatter ----

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                                        const c10d::ReduceScatterOptions& opts) {
  const at::Tensor out = single(outputs, "reduce_scatter");
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize())
    throw dpkit::invalid_argument(me() + "reduce_scatter wants one list of " + std::to_string(getSize()) +
                                  " input tensors");
  for (const auto& i : inputs[0]) {
    check_dense(i, "reduce_scatter input");
    if (i.numel() != out.numel() || i.scalar_type() != out.scalar_type())
      throw dpkit::invalid_argument(me() + "reduce_scatter input " + dpkit::detail::torch_describe(i) +
                                    " differs from the output " + dpkit::detail::torch_describe(out));
  }
  const std::vector<at::Tensor> ins = inputs[0];
  const reduction r = to_reduction(opts.reduceOp, getRank());
  if (r.bitwise && !is_integral(out))
    throw dpkit::invalid_argument(me() + "Cannot use ReduceOp." + r.name + " with non-integral dtype (" +
                                  dpkit::detail::torch_describe(out) + ")");
  return submit(c10d::OpType::REDUCE_SCATTER, {out}, nbytes(out) * ins.size(), timeout_of(opts.timeout),
                [this, ins, out, r](auto& c, const dpkit::collective_options& o) {
                  at::Tensor flat = flat_cat(ins).contiguous();
                  if (r.bitwise) {
                    bitwise_allreduce(c, flat, r, o);
                    out.view({-1}).copy_(flat.narrow(0, getRank() * out.numel(), out.numel()));
                    return;
                  }
                  detail_coll::scatter_flat(c, flat, out, r, getRank(), o);
                });
}

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                              const c10d::ReduceScatterOptions& opts) {
  check_dense(output, "reduce_scatter_tensor output");
  check_dense(input, "reduce_scatter_tensor input");
  if (input.numel() != output.numel() * getSize() || input.scalar_type() != output.scalar_type())
    throw dpkit::invalid_argument(me() + "reduce_scatter_tensor: input " + dpkit::detail::torch_describe(input) +
                                  " is not world size (" + std::to_string(getSize()) + ") x output " +
                                  dpkit::detail::torch_describe(output));
  const at::Tensor in = input, out = output;
  const reduction r = to_reduction(opts.reduceOp, getRank());
  if (r.bitwise && !is_integral(out))
    throw dpkit::invalid_argument(me() + "Cannot use ReduceOp." + r.name + " with non-integral dtype (" +
                                  dpkit::detail::torch_describe(out) + ")");
  return submit(c10d::OpType::_REDUCE_SCATTER_BASE, {out}, nbytes(in), timeout_of(opts.timeout),
                [this, in, out, r](auto& c, const dpkit::collective_options& o) {
                  if (r.bitwise) {
                    at::Tensor flat = in.reshape({-1}).clone();
                    bitwise_allreduce(c, flat, r, o);
                    out.view({-1}).copy_(flat.narrow(0, getRank() * out.numel(), out.numel()));
                    return;
                  }
                  detail_coll::scatter_flat(c, in, out, r, getRank(), o);
                });
}

#if TORCH_VERSION_MAJOR >= 2
/// reduce_scatter_tensor of several (output, input) pairs in one
/// reduce-scatter: the inputs' blocks of rank r laid out together, block
/// r of the result cut into the outputs.
inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (outputs.size() != inputs.size() || inputs.empty())
    throw dpkit::invalid_argument(me() + "reduce_scatter_tensor_coalesced: " + std::to_string(outputs.size()) +
                                  " outputs for " + std::to_string(inputs.size()) + " inputs");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_dense(inputs[i], "reduce_scatter_tensor_coalesced input");
    check_dense(outputs[i], "reduce_scatter_tensor_coalesced output");
    if (inputs[i].numel() != outputs[i].numel() * getSize() || outputs[i].scalar_type() != inputs[i].scalar_type())
      throw dpkit::invalid_argument(me() + "reduce_scatter_tensor_coalesced: input " +
                                    dpkit::detail::torch_describe(inputs[i]) + " is not world size x output " +
                                    dpkit::detail::torch_describe(outputs[i]));
  }
  check_same_dtype(inputs, inputs[0], "reduce_scatter_tensor_coalesced");
  const reduction r = to_reduction(opts.reduceOp, getRank());
  if (r.bitwise)
    throw dpkit::invalid_argument(me() + "reduce_scatter_tensor_coalesced: ReduceOp." + r.name +
                                  " not supported (SUM, AVG, PRODUCT, MIN, MAX)");
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  std::size_t n = 0;
  for (const auto& t : ins) n += nbytes(t);
  return submit(c10d::OpType::COALESCED, outs, n, timeout_of(opts.timeout),
                [this, ins, outs, r](auto& c, const dpkit::collective_options& o) {
                  const std::int64_t ranks = getSize();
                  std::vector<at::Tensor> blocks; // rank-major: rank 0's block of every input, then rank 1's, ...
                  for (std::int64_t k = 0; k < ranks; ++k)
                    for (const auto& in : ins) {
                      const std::int64_t m = in.numel() / ranks;
                      blocks.push_back(in.reshape({-1}).narrow(0, k * m, m));
                    }
                  at::Tensor flat = at::cat(blocks);
                  std::int64_t k = 0;
                  for (const auto& out : outs) k += out.numel();
                  at::Tensor mine = at::empty({k}, flat.options());
                  detail_coll::scatter_flat(c, flat, mine, r, getRank(), o);
                  flat_split(mine, outs);
                });
}

/// torch's coalescing manager (the MPI and NCCL style of
/// `_coalescing_manager`): the collectives issued between the two calls run
/// as they come (the group's worker keeps their order); endCoalescing's
/// Work completes when all of them have, with the first one's error.
inline void process_group_dpkit::startCoalescing() {
  const std::lock_guard lk(mu_);
  if (coalescing_)
    throw dpkit::invalid_argument(me() + "startCoalescing: the group is coalescing already (endCoalescing first)");
  coalescing_ = true;
  coalesced_.clear();
}

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  {
    const std::lock_guard lk(mu_);
    if (!coalescing_) throw dpkit::invalid_argument(me() + "endCoalescing without startCoalescing");
    coalescing_ = false;
    futures.swap(coalesced_);
  }
  return submit(c10d::OpType::COALESCED, {}, 0, timeout_of(std::chrono::milliseconds(0)),
                [futures](auto&, const dpkit::collective_options&) {
                  // the worker ran every earlier collective before this one
                  for (const auto& f : futures)
                    if (f->hasError()) std::rethrow_exception(f->exception_ptr());
                });
}
#endif

// ---- barrier ----

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::barrier(const c10d::BarrierOptions& opts) {
  return submit(c10d::OpType::BARRIER, {}, 0, timeout_of(opts.timeout),
                [](auto& c, const dpkit::collective_options& o) { dpkit::barrier(c, o); });
}

} // namespace dpkit_dist
