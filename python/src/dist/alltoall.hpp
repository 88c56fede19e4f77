// dpkit._dist_ext: all-to-all, the exchange of a mixture of experts' token
// dispatch: all_to_all_single (one tensor, rows split evenly or by split
// sizes) and all_to_all (a list of tensors, one per rank, of any sizes).
// Gloo's alltoall and alltoallv semantics; dpkit::alltoall /
// dpkit::alltoallv move the data (pairwise, each block straight to its
// rank). Split sizes the ranks disagree on fail the receiving rank with an
// error naming both counts (and its peers with peer_error), never a
// truncated or padded result.
#pragma once

#include "process_group.hpp"

namespace dpkit_dist {

namespace detail_a2a {
/// Element counts of a split of dim 0 (rows) of `t` into world size parts:
/// `splits` (rows per rank) when given, else equal parts.
/// @throws dpkit::invalid_argument naming the sizes and the rank.
inline std::vector<std::size_t> element_counts(const at::Tensor& t, const std::vector<std::int64_t>& splits, int size,
                                               const std::string& me, const char* which) {
  const std::int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const std::int64_t row = rows == 0 ? 0 : t.numel() / rows;
  std::vector<std::size_t> counts(static_cast<std::size_t>(size));
  if (splits.empty()) {
    if (rows % size != 0)
      throw dpkit::invalid_argument(me + "all_to_all_single: the " + which + "'s " + std::to_string(rows) +
                                    " rows do not split evenly over " + std::to_string(size) + " ranks (pass split sizes)");
    for (auto& c : counts) c = static_cast<std::size_t>(rows / size * row);
    return counts;
  }
  if (static_cast<int>(splits.size()) != size)
    throw dpkit::invalid_argument(me + "all_to_all_single: " + std::to_string(splits.size()) + " " + which +
                                  " split sizes for " + std::to_string(size) + " ranks");
  std::int64_t sum = 0;
  for (std::size_t p = 0; p < splits.size(); ++p) {
    if (splits[p] < 0)
      throw dpkit::invalid_argument(me + "all_to_all_single: " + which + " split size " + std::to_string(splits[p]) +
                                    " for rank " + std::to_string(p) + " is negative");
    sum += splits[p];
    counts[p] = static_cast<std::size_t>(splits[p] * row);
  }
  if (sum != rows)
    throw dpkit::invalid_argument(me + "all_to_all_single: " + which + " split sizes sum to " + std::to_string(sum) +
                                  " rows but the " + which + " has " + std::to_string(rows));
  return counts;
}

/// dpkit::alltoallv of flat `in` into flat `out` with element counts.
template <class C>
void exchange(C& c, const at::Tensor& in, const std::vector<std::size_t>& send, const at::Tensor& out,
              const std::vector<std::size_t>& recv, const dpkit::collective_options& o) {
  const bool typed = dpkit::torch_element_type(in.scalar_type()).has_value();
  const std::size_t scale = typed ? 1 : in.element_size(); // elements, or bytes of a dtype dpkit moves as bytes
  std::vector<std::size_t> s = send, r = recv;
  for (auto& x : s) x *= scale;
  for (auto& x : r) x *= scale;
  visit_move(in, [&](auto v) {
    using T = std::remove_pointer_t<decltype(v.ptr)>;
    dpkit::alltoallv(c, v, s, dpkit::tensor_view<T>{reinterpret_cast<T*>(out.data_ptr()), nbytes(out) / sizeof(T)}, r, o);
  });
}
} // namespace detail_a2a

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                       std::vector<int64_t>& output_splits,
                                                                       std::vector<int64_t>& input_splits,
                                                                       const c10d::AllToAllOptions& opts) {
  check_dense(input, "all_to_all_single input");
  check_dense(output, "all_to_all_single output");
  if (input.scalar_type() != output.scalar_type())
    throw dpkit::invalid_argument(me() + "all_to_all_single: input " + dpkit::detail::torch_describe(input) +
                                  " and output " + dpkit::detail::torch_describe(output) + " differ in dtype");
  const auto send = detail_a2a::element_counts(input, input_splits, getSize(), me(), "input");
  const auto recv = detail_a2a::element_counts(output, output_splits, getSize(), me(), "output");
  const at::Tensor in = input, out = output;
  return submit(c10d::OpType::ALLTOALL_BASE, {out}, nbytes(in), timeout_of(opts.timeout),
                [in, out, send, recv](auto& c, const dpkit::collective_options& o) {
                  detail_a2a::exchange(c, in, send, out, recv, o);
                });
}

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::alltoall(std::vector<at::Tensor>& outputs,
                                                                  std::vector<at::Tensor>& inputs,
                                                                  const c10d::AllToAllOptions& opts) {
  if (static_cast<int>(inputs.size()) != getSize() || static_cast<int>(outputs.size()) != getSize())
    throw dpkit::invalid_argument(me() + "all_to_all wants one input and one output tensor per rank (" +
                                  std::to_string(getSize()) + "), got " + std::to_string(inputs.size()) + " and " +
                                  std::to_string(outputs.size()));
  for (const auto& t : inputs) check_dense(t, "all_to_all input");
  for (const auto& t : outputs) check_dense(t, "all_to_all output");
  check_same_dtype(inputs, inputs[0], "all_to_all");
  check_same_dtype(outputs, inputs[0], "all_to_all");
  std::vector<std::size_t> send, recv;
  for (const auto& t : inputs) send.push_back(static_cast<std::size_t>(t.numel()));
  for (const auto& t : outputs) recv.push_back(static_cast<std::size_t>(t.numel()));
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  std::size_t n = 0;
  for (const auto& t : ins) n += nbytes(t);
  return submit(c10d::OpType::ALLTOALL, outs, n, timeout_of(opts.timeout),
                [ins, outs, send, recv](auto& c, const dpkit::collective_options& o) {
                  const at::Tensor flat_in = flat_cat(ins).contiguous();
                  std::int64_t total = 0;
                  for (const auto& t : outs) total += t.numel();
                  at::Tensor flat_out = at::empty({total}, flat_in.options());
                  detail_a2a::exchange(c, flat_in, send, flat_out, recv, o);
                  flat_split(flat_out, outs);
                });
}

} // namespace dpkit_dist
