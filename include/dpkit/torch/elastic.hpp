/// @file elastic.hpp
/// @brief DDP over an elastic group (docs/elastic.md, "Healing, exactly-once
/// data and DDP"): after every (re)formation of a generation, the member
/// that holds the training state (the lowest rank with one: rank 0 unless
/// rank 0 is a new process) broadcasts it bitwise to all members — the
/// module's parameters and buffers, the optimizer's state, and the progress
/// (step, epoch, global sample offset) — so a step that some members applied
/// and others discarded is settled by one state, and a joining process starts
/// from the same parameters. The caller re-derives its sampler view from the
/// progress for the new (world size, rank) (token_budget_batch_sampler with
/// `elastic`: set_epoch(epoch, offset)), so the epoch's global batch sequence
/// goes on with no batch lost or repeated. Meson features `torch` and `gloo`;
/// never included by dpkit.hpp.
///
/// @code
/// dpkit::elastic_group group("file:///shared/job7", my_id, eo);
/// torch::optim::Adam opt(model->parameters(), 1e-3);
/// dpkit::elastic_ddp_options o;
/// o.on_heal = [&](const dpkit::elastic_heal& h) {  // after every formation
///   sampler.emplace(lengths, h.world_size, h.rank, elastic_sampler_options);
///   sampler->set_epoch(h.progress.epoch, h.progress.offset);
/// };
/// dpkit::elastic_ddp trainer(group, model, opt, o);
/// while (...) {
///   auto batch = sampler->batch((trainer.progress().offset - sampler->start()) / group.size());
///   trainer.step([&] { opt.zero_grad(); loss_fn(model, batch).backward(); },
///                [&](auto& ddp, const dpkit::ddp_step_result&) { opt.step(); });
/// }
/// @endcode
#pragma once

#include "../collectives/allreduce_ring.hpp"
#include "../collectives/broadcast.hpp"
#include "../elastic/group.hpp"
#include "distributed_data_parallel.hpp"

#include <torch/torch.h>

#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace dpkit {

/// Where training stands: the part of the training state that is not
/// tensors. Every member holds the same after a heal (a regular aggregate).
struct elastic_progress {
  /// Optimizer steps applied since the start of the job (all epochs).
  std::int64_t step = 0;
  /// Current epoch of the sampler.
  std::uint64_t epoch = 0;
  /// Global position in the epoch's batch sequence where the next step
  /// starts (token_budget_batch_sampler::offset_after; advances by the world
  /// size per applied step).
  std::uint64_t offset = 0;
  friend bool operator==(const elastic_progress&, const elastic_progress&) = default;
};

/// What elastic_ddp_options::on_heal is told after a formation.
struct elastic_heal {
  std::uint64_t generation = 0; ///< elastic_group::generation()
  int world_size = 0;           ///< members of the generation
  int rank = 0;                 ///< this process's rank in it
  int source = 0;               ///< rank whose state every member now holds
  elastic_progress progress;    ///< the progress broadcast by `source`
  std::uint64_t checksum = 0;   ///< module_checksum() after the broadcast
};

/// Options of elastic_ddp.
struct elastic_ddp_options {
  /// Options of the distributed_data_parallel made for every generation.
  ddp_options ddp{};
  /// Limit of each collective of a heal (the state's broadcast).
  collective_options collective{};
  /// admit_joiners() after every this many applied steps (>= 1).
  int admit_every = 1;
  /// Called after every successful heal (every member, every generation,
  /// including the first): re-derive the sampler view here. May throw
  /// (then the heal counts as failed only if it throws dpkit::error).
  std::function<void(const elastic_heal&)> on_heal;
};

/// 64-bit FNV-1a over the bytes of every parameter and buffer of `m`
/// (named_parameters, then named_buffers: registration order, recursive).
/// Equal on two processes exactly when their tensors are bitwise equal
/// (short of a hash collision). Tensors are read on the CPU.
inline std::uint64_t module_checksum(const torch::nn::Module& m) {
  std::uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](const at::Tensor& t0) {
    const at::Tensor t = t0.detach().to(at::kCPU).contiguous();
    const auto* p = static_cast<const unsigned char*>(t.data_ptr());
    const std::size_t n = t.nbytes();
    for (std::size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 1099511628211ull;
    }
  };
  for (const auto& p : m.parameters(/*recurse=*/true)) mix(p);
  for (const auto& b : m.buffers(/*recurse=*/true)) mix(b);
  return h;
}

/// Broadcasts a byte string from `root`: its length (u64), then its bytes.
/// On other ranks `bytes` is resized and overwritten. Collective.
/// @throws as dpkit::broadcast (dpkit::error subclasses on a failed peer or
///         deadline), dpkit::invalid_argument for a bad root.
template <transport C>
void broadcast_bytes(C& comm, std::vector<std::uint8_t>& bytes, int root, const collective_options& o = {}) {
  std::uint64_t n = bytes.size();
  dpkit::broadcast(comm, std::span<std::uint64_t>(&n, 1), root, algorithm::tree, o);
  bytes.resize(static_cast<std::size_t>(n));
  dpkit::broadcast(comm, std::span<std::uint8_t>(bytes.data(), bytes.size()), root, algorithm::tree, o);
}

/// Serializes the training state with torch's archive format (bitwise:
/// tensors are stored as their bytes): the module (parameters, buffers),
/// the optimizer (param groups and per-parameter state) and `p`.
inline std::vector<std::uint8_t> save_training_state(const torch::nn::Module& m, const torch::optim::Optimizer& opt,
                                                     const elastic_progress& p) {
  torch::serialize::OutputArchive ar;
  m.save(ar);
  torch::serialize::OutputArchive opt_ar;
  opt.save(opt_ar);
  ar.write("optimizer", opt_ar);
  ar.write("dpkit_step", torch::tensor(p.step, torch::kLong));
  ar.write("dpkit_epoch", torch::tensor(static_cast<std::int64_t>(p.epoch), torch::kLong));
  ar.write("dpkit_offset", torch::tensor(static_cast<std::int64_t>(p.offset), torch::kLong));
  std::ostringstream os;
  ar.save_to(os);
  const std::string s = os.str();
  return {s.begin(), s.end()};
}

/// Loads what save_training_state wrote into `m` (parameters and buffers in
/// place: the tensors the optimizer holds stay the same), `opt` (its state
/// is cleared first, so state the writer did not have does not survive) and
/// `p`.
/// @throws dpkit::format_error when the bytes are not such a state or do not
///         fit the module/optimizer.
inline void load_training_state(const std::vector<std::uint8_t>& bytes, torch::nn::Module& m,
                                torch::optim::Optimizer& opt, elastic_progress& p) {
  try {
    torch::serialize::InputArchive ar;
    ar.load_from(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    m.load(ar);
    torch::serialize::InputArchive opt_ar;
    ar.read("optimizer", opt_ar);
    opt.state().clear();
    opt.load(opt_ar);
    torch::Tensor s, e, o;
    ar.read("dpkit_step", s);
    ar.read("dpkit_epoch", e);
    ar.read("dpkit_offset", o);
    p.step = s.item<std::int64_t>();
    p.epoch = static_cast<std::uint64_t>(e.item<std::int64_t>());
    p.offset = static_cast<std::uint64_t>(o.item<std::int64_t>());
  } catch (const c10::Error& err) {
    throw format_error(std::string("load_training_state: ") + std::to_string(bytes.size()) +
                       " bytes are not a training state of this module and optimizer: " + err.what_without_backtrace());
  }
}

/// Data-parallel training over an elastic_group: a distributed_data_parallel
/// per generation, healed after every formation, with steps that a failure
/// discards. Not copyable or movable. The group, module and optimizer must
/// outlive it; one thread drives it.
///
/// State and its source: a process whose first generation is 0 starts with
/// the job's initial state (every such process built the same module from
/// the same seed); a process admitted later has none until its first heal.
/// A heal picks the lowest rank holding a state (a min all-reduce) and
/// broadcasts that state (save_training_state, broadcast_bytes) to all.
/// Holders may differ by one step (a member whose all-reduce finished applied
/// the step, one whose all-reduce threw did not); the source's state is the
/// one that counts, and its progress says which steps did.
class elastic_ddp {
public:
  /// Heals the group's current generation (as after every formation):
  /// collective of the generation's members.
  /// @throws dpkit::invalid_argument for admit_every < 1;
  ///         dpkit::error when no member holds a state (every process that
  ///         had one is gone); dpkit::format_error when the broadcast state
  ///         does not fit the module or optimizer; as elastic_group::rebuild()
  ///         (a heal that fails otherwise rebuilds and heals again).
  elastic_ddp(elastic_group& group, std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& opt,
              elastic_ddp_options o = {})
      : group_(group), module_(std::move(module)), opt_(opt), o_(std::move(o)), has_state_(group.generation() == 0) {
    if (o_.admit_every < 1)
      throw invalid_argument("elastic_ddp: id " + std::to_string(group.id()) + ": admit_every must be >= 1, got " +
                             std::to_string(o_.admit_every));
    recover(false);
  }
  elastic_ddp(const elastic_ddp&) = delete;
  elastic_ddp& operator=(const elastic_ddp&) = delete;

  /// The progress every member agrees on since the last heal, advanced by
  /// each applied step.
  const elastic_progress& progress() const noexcept { return p_; }
  /// Starts the next epoch at offset 0 (every member at the same step: the
  /// epoch's length is the same for all of them).
  void next_epoch() noexcept {
    ++p_.epoch;
    p_.offset = 0;
  }
  /// The current generation's distributed_data_parallel (valid until the
  /// next step that fails or admits a process).
  distributed_data_parallel<gloo_transport>& ddp() { return *ddp_; }
  /// The last heal.
  const elastic_heal& last_heal() const noexcept { return heal_; }

  /// One training step. `compute()` runs forward and backward (zero the
  /// gradients first; the buckets' all-reduces start in backward); then
  /// finish() waits for the averaged gradients and `apply(ddp, result)`
  /// updates the model (optimizer step, clipping); progress advances (step
  /// + 1, offset + world size) and every admit_every steps admit_joiners()
  /// runs. Returns true when the step was applied here, false when it was
  /// discarded: a dpkit::error in compute() or finish() (from a collective:
  /// peer_error, timeout_error, communicator_error, ...; compute must not
  /// throw dpkit::error for reasons a rebuild cannot fix) drops this
  /// generation's DDP, rebuilds the group and heals it (a step applied here
  /// but not at the heal's source is overwritten by the heal). A failing
  /// admit_joiners() rebuilds and heals the same way (true is returned:
  /// the step was applied here; the heal decides whether it counts).
  /// @throws what compute or apply throw other than dpkit::error; as
  ///         elastic_group::rebuild() (no generation forms in time).
  template <class Compute, class Apply>
  bool step(Compute&& compute, Apply&& apply) {
    try {
      compute();
      const ddp_step_result r = ddp_->finish();
      apply(*ddp_, r);
    } catch (const error&) {
      recover(true);
      return false;
    }
    ++p_.step;
    p_.offset += static_cast<std::uint64_t>(group_.size());
    if (p_.step % o_.admit_every == 0) {
      try {
        if (group_.admit_joiners()) recover(false);
      } catch (const error&) {
        recover(true);
      }
    }
    return true;
  }

private:
  // After a formation (and, with `failed`, after a collective of the current
  // generation threw: rebuild first): heal until one heal succeeds.
  void recover(bool failed) {
    ddp_.reset(); // refers to the transport that rebuild() closes
    if (failed) group_.rebuild();
    for (;;) {
      try {
        heal();
        ddp_ = std::make_unique<distributed_data_parallel<gloo_transport>>(module_, group_.transport(), o_.ddp);
        return;
      } catch (const invalid_argument&) {
        throw;
      } catch (const format_error&) {
        throw; // a state that does not fit: rebuilding cannot help
      } catch (const error&) {
        if (no_state_) throw; // nobody can heal this group: another generation would not either
        ddp_.reset();
        group_.rebuild();
      }
    }
  }

  void heal() {
    gloo_transport& comm = group_.transport();
    const int rank = group_.rank();
    std::int32_t src = has_state_ ? rank : INT32_MAX;
    allreduce_ring(comm, std::span<std::int32_t>(&src, 1), reduce_op::min, o_.collective);
    no_state_ = src == INT32_MAX;
    if (no_state_)
      throw error("elastic_ddp: id " + std::to_string(group_.id()) + ", generation " +
                  std::to_string(group_.generation()) + ": no member holds the training state (every process that "
                  "had one is gone)");
    std::vector<std::uint8_t> bytes;
    if (rank == src) bytes = save_training_state(*module_, opt_, p_);
    broadcast_bytes(comm, bytes, src, o_.collective);
    if (rank != src) load_training_state(bytes, *module_, opt_, p_);
    has_state_ = true;
    heal_.generation = group_.generation();
    heal_.world_size = group_.size();
    heal_.rank = rank;
    heal_.source = src;
    heal_.progress = p_;
    heal_.checksum = module_checksum(*module_);
    if (o_.on_heal) o_.on_heal(heal_);
  }

  elastic_group& group_;
  std::shared_ptr<torch::nn::Module> module_;
  torch::optim::Optimizer& opt_;
  elastic_ddp_options o_;
  bool has_state_;
  bool no_state_ = false;
  elastic_progress p_{};
  elastic_heal heal_{};
  std::unique_ptr<distributed_data_parallel<gloo_transport>> ddp_;
};

} // namespace dpkit
