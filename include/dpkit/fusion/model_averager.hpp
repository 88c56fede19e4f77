/// @file model_averager.hpp
/// @brief Periodic model averaging: every `period` optimizer steps the
/// parameters of every rank are replaced by their average over all ranks,
/// the infrequent half of a two-speed sync (gradients averaged inside each
/// node every step with reducer_options::node_local, parameters averaged
/// across nodes every k steps). Semantics of torch's
/// torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager
/// used with post-local SGD (PostLocalSGDState with an intra-node subgroup):
/// the step counter starts at 0 and the parameters are averaged after the
/// optimizer step of every step s with s >= warmup_steps and
/// (s - warmup_steps) % period == 0; optimizer states stay local.
///
/// The average is one all-reduce (avg) per element type of the parameters,
/// fused into a flat buffer, over the whole transport: across nodes the
/// automatic policy runs it hierarchically (inside each node through the
/// shared segment, between nodes once per node), so the network carries
/// each parameter 2(N-1)/N times per averaging for N nodes, whatever the
/// number of ranks per node. Every rank ends with bitwise-identical
/// parameters.
#pragma once

#include "../collectives.hpp"
#include "gradient_reducer.hpp"

#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace dpkit {

/// Averages parameters over every rank every `period` steps (see the file
/// comment). One object per rank; calls are collective (every rank calls
/// average_parameters after every optimizer step).
template <transport C>
class periodic_model_averager {
public:
  /// @param period average every this many steps (>= 1; 1: after every step).
  /// @param warmup_steps steps before the first averaging (>= 0; torch's
  ///        warmup_steps).
  /// @param policy, options the all-reduce's algorithm policy and options.
  /// @throws dpkit::invalid_argument if period < 1 or warmup_steps < 0.
  periodic_model_averager(C& comm, int period, int warmup_steps = 0, const allreduce_policy& policy = {},
                          const collective_options& options = {})
      : comm_(comm), period_(period), warmup_(warmup_steps), policy_(policy), opts_(options) {
    if (period < 1)
      throw invalid_argument("periodic_model_averager: rank " + std::to_string(comm.rank()) + ": period must be >= 1, got " +
                             std::to_string(period));
    if (warmup_steps < 0)
      throw invalid_argument("periodic_model_averager: rank " + std::to_string(comm.rank()) +
                             ": warmup_steps must be >= 0, got " + std::to_string(warmup_steps));
  }

  /// True when the current step (before average_parameters counts it) is an
  /// averaging step.
  bool due() const noexcept { return step_ >= warmup_ && (step_ - warmup_) % period_ == 0; }
  /// Steps counted so far (calls of average_parameters).
  long long step() const noexcept { return step_; }
  /// Averagings done so far.
  long long averaged() const noexcept { return averaged_; }

  /// Call after every optimizer step: when due(), replaces every tensor of
  /// `params` (host memory, any element types) by its average over all
  /// ranks; then counts the step. Returns whether it averaged.
  /// @throws dpkit::invalid_argument for a device-memory tensor; what the
  ///         all-reduce throws (timeout_error, mismatch_error when ranks pass
  ///         different parameter lists, ...).
  bool average_parameters(std::span<const gradient_ref> params) {
    const bool now = due();
    ++step_;
    if (!now) return false;
    // one flat buffer per element type, in the order of params
    std::map<element_type, std::size_t> bytes;
    for (const auto& p : params) {
      if (p.space != memory_space::host)
        throw invalid_argument("periodic_model_averager: rank " + std::to_string(comm_.rank()) +
                               ": a parameter is in device memory (host tensors only)");
      bytes[p.type] += p.bytes();
    }
    for (const auto& entry : bytes) { // no structured binding: clang 14 cannot capture one
      const element_type type = entry.first;
      const std::size_t total = entry.second;
      auto& buf = flat_[type];
      buf.resize(total);
      std::size_t off = 0;
      for (const auto& p : params)
        if (p.type == type && p.bytes()) {
          std::memcpy(buf.data() + off, p.data, p.bytes());
          off += p.bytes();
        }
      visit_element_type(type, [&](auto z) {
        using T = decltype(z);
        tensor_view<T> v{reinterpret_cast<T*>(buf.data()), total / sizeof(T), memory_space::host};
        allreduce(comm_, v, v, reduce_op::avg, policy_, opts_);
      });
      off = 0;
      for (const auto& p : params)
        if (p.type == type && p.bytes()) {
          std::memcpy(p.data, buf.data() + off, p.bytes());
          off += p.bytes();
        }
    }
    ++averaged_;
    return true;
  }

private:
  C& comm_;
  int period_, warmup_;
  allreduce_policy policy_;
  collective_options opts_;
  long long step_ = 0, averaged_ = 0;
  std::map<element_type, std::vector<std::byte>> flat_;
};

} // namespace dpkit
