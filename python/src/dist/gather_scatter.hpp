// dpkit._dist_ext: the rooted collectives that move data to or from one
// rank without reducing it: gather (every rank's tensor into root's list;
// torch's gather and gather_object) and scatter (root's list, one tensor to
// each rank; scatter and scatter_object_list). ProcessGroupGloo's
// semantics; dpkit::gather / dpkit::scatter's list forms move the data (one
// message per rank, straight from or into root's own tensors: no staging).
#pragma once

#include "process_group.hpp"

namespace dpkit_dist {

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::GatherOptions& opts) {
  const at::Tensor in = single(inputs, "gather");
  const int root = check_root(opts.rootRank, "gather");
  std::vector<at::Tensor> outs;
  if (getRank() == root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize())
      throw dpkit::invalid_argument(me() + "gather: root " + std::to_string(root) + " wants one list of " +
                                    std::to_string(getSize()) + " output tensors, got " +
                                    (outputs.size() == 1 ? std::to_string(outputs[0].size()) + " tensors"
                                                         : std::to_string(outputs.size()) + " lists"));
    outs = outputs[0];
    for (const auto& o : outs) {
      check_dense(o, "gather output");
      if (o.numel() != in.numel() || o.scalar_type() != in.scalar_type())
        throw dpkit::invalid_argument(me() + "gather output " + dpkit::detail::torch_describe(o) +
                                      " differs from the input " + dpkit::detail::torch_describe(in));
    }
  } else if (!outputs.empty() && !(outputs.size() == 1 && outputs[0].empty())) {
    throw dpkit::invalid_argument(me() + "gather: only root " + std::to_string(root) +
                                  " passes output tensors (this rank passed " + std::to_string(outputs.size()) +
                                  " lists)");
  }
  return submit(c10d::OpType::GATHER, outs, nbytes(in) * static_cast<std::size_t>(getSize()), timeout_of(opts.timeout),
                [in, outs, root](auto& c, const dpkit::collective_options& o) {
                  visit_move(in, [&](auto v) {
                    using T = std::remove_pointer_t<decltype(v.ptr)>;
                    dpkit::gather(c, v, blocks_of<T>(outs), root, o); // straight into root's tensors
                  });
                });
}

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ScatterOptions& opts) {
  const at::Tensor out = single(outputs, "scatter");
  const int root = check_root(opts.rootRank, "scatter");
  std::vector<at::Tensor> ins;
  if (getRank() == root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize())
      throw dpkit::invalid_argument(me() + "scatter: root " + std::to_string(root) + " wants one list of " +
                                    std::to_string(getSize()) + " input tensors, got " +
                                    (inputs.size() == 1 ? std::to_string(inputs[0].size()) + " tensors"
                                                        : std::to_string(inputs.size()) + " lists"));
    ins = inputs[0];
    for (const auto& i : ins) {
      check_dense(i, "scatter input");
      if (i.numel() != out.numel() || i.scalar_type() != out.scalar_type())
        throw dpkit::invalid_argument(me() + "scatter input " + dpkit::detail::torch_describe(i) +
                                      " differs from the output " + dpkit::detail::torch_describe(out));
    }
  } else if (!inputs.empty() && !(inputs.size() == 1 && inputs[0].empty())) {
    throw dpkit::invalid_argument(me() + "scatter: only root " + std::to_string(root) +
                                  " passes input tensors (this rank passed " + std::to_string(inputs.size()) + " lists)");
  }
  return submit(c10d::OpType::SCATTER, {out}, nbytes(out) * static_cast<std::size_t>(getSize()), timeout_of(opts.timeout),
                [ins, out, root](auto& c, const dpkit::collective_options& o) {
                  visit_move(out, [&](auto v) {
                    using T = std::remove_pointer_t<decltype(v.ptr)>;
                    dpkit::scatter(c, blocks_of<T>(ins), v, root, o); // each block sent from where it lies
                  });
                });
}

} // namespace dpkit_dist
