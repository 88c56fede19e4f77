// dpkit._dist_ext: dpkit::elastic_group for dpkit.elastic (a membership
// that survives a node's death), beside the torch backend.
#pragma once

#include "common.hpp"

namespace dpkit_dist {

/// dpkit::elastic_group for Python (dpkit.elastic.ElasticGroup): one
/// process's membership, and collectives of torch CPU tensors over the
/// current generation's transport, run on the calling thread (the GIL
/// released) with `step_timeout` as their deadline. Not thread-safe: one
/// Python thread uses it (the group's heartbeat thread is its own).
class elastic_core {
public:
  elastic_core(const std::string& url, std::int64_t id, const dpkit::elastic_options& o,
               std::chrono::milliseconds step_timeout)
      : step_timeout_(step_timeout) {
    if (step_timeout.count() <= 0)
      throw dpkit::invalid_argument("ElasticGroup: id " + std::to_string(id) + ": step_timeout must be > 0, got " +
                                    std::to_string(step_timeout.count()) + " ms");
    group_ = std::make_unique<dpkit::elastic_group>(url, id, o);
    first_generation_ = group_->generation();
  }
  dpkit::elastic_group& group() {
    if (!group_) throw dpkit::communicator_error("ElasticGroup: closed");
    return *group_;
  }
  /// The generation this process first became a member in (0: it started
  /// with the job, so it holds the job's initial training state).
  std::uint64_t first_generation() const noexcept { return first_generation_; }
  void close() { group_.reset(); }
  dpkit::collective_options options() const {
    dpkit::collective_options o;
    o.timeout = step_timeout_;
    return o;
  }
  void allreduce(const at::Tensor& t, const std::string& op) {
    dpkit::reduce_op r;
    if (op == "sum") r = dpkit::reduce_op::sum;
    else if (op == "avg") r = dpkit::reduce_op::avg;
    else if (op == "min") r = dpkit::reduce_op::min;
    else if (op == "max") r = dpkit::reduce_op::max;
    else if (op == "prod") r = dpkit::reduce_op::prod;
    else
      throw dpkit::invalid_argument("ElasticGroup.all_reduce: rank " + std::to_string(group().rank()) + ": op '" + op +
                                    "' is not one of sum, avg, min, max, prod");
    dpkit::torch_allreduce(group().transport(), t, r, {}, options());
  }
  void broadcast(const at::Tensor& t, int root) { dpkit::torch_broadcast(group().transport(), t, root, options()); }
  void barrier() { dpkit::barrier(group().transport(), options()); }

private:
  std::unique_ptr<dpkit::elastic_group> group_;
  std::chrono::milliseconds step_timeout_;
  std::uint64_t first_generation_ = 0;
};

} // namespace dpkit_dist
